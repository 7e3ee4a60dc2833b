//! The Platform API's inbound custody webhook route (`POST
//! /v1/custody/webhooks/fireblocks`) receiving the simulator's signed webhooks v2: a
//! verified event wakes the queue's read of the provider (polling alone would take a
//! minute here), a forged one is refused with `401 CUSTODY_WEBHOOK_UNVERIFIED`, and a
//! replayed or duplicated event changes nothing on chain.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use alloy::primitives::U256;
use anvil_tests::TestChain;
use keel_api::custody::CustodyWebhooks;
use keel_api::{ApiState, router};
use keel_custody::webhook::SIGNATURE_HEADER;
use keel_custody::{WebhookVerifier, WebhookVerifierConfig};
use keel_durable::{Engine, EngineConfig};
use keel_store::testing::TestDatabase;
use keel_txq::SettlementVerdict;
use keel_workflows::Ops;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::harness::{Sim, VAULT, sent_count};
use crate::queue::{
    DEADLINE, assert_confirmed, call, deploy_counter, effects, pool, queue_with, sender_config,
};

/// Serves the Platform API (with the custody webhook route) on a loopback port.
async fn serve_api(db: &TestDatabase, jwks_url: String) -> String {
    let pool = db.pool().clone();
    let verifier = Arc::new(WebhookVerifier::new(WebhookVerifierConfig::new(jwks_url)).unwrap());
    let engine = Engine::new(pool.clone(), EngineConfig::default()).unwrap();
    let state = ApiState::new(
        Ops::new(pool.clone(), engine),
        Arc::new(AtomicBool::new(true)),
    )
    .with_custody_webhooks(CustodyWebhooks::new(verifier));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    format!("http://{addr}/v1/custody/webhooks/fireblocks")
}

#[tokio::test]
async fn verified_webhooks_wake_the_queue_forged_ones_are_refused_and_replays_change_nothing() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let counter = deploy_counter(&chain).await;
    let hook = serve_api(&db, format!("{}/.well-known/jwks.json", sim.base)).await;
    sim.admin("/admin/webhooks", json!({"url": hook})).await;
    // Webhooks duplicated: each delivery is sent twice.
    sim.admin("/admin/faults/webhooks", json!({"mode": "duplicate"}))
        .await;

    // Polling alone would read the provider once a minute.
    let mut config = sender_config(vault);
    config.poll_interval_ms = 60_000;
    config.max_poll_interval_ms = 60_000;
    let queue = Arc::new(queue_with(
        db.pool().clone(),
        pool(&chain),
        Arc::new(sim.provider()),
        &config,
    ));
    let stop = CancellationToken::new();
    let (q, s) = (queue.clone(), stop.clone());
    tokio::spawn(async move { q.run(s).await });

    sim.admin(
        "/admin/faults/transaction",
        json!({"behavior": "require_approval"}),
    )
    .await;
    let id = queue
        .enqueue(&call(vault, counter, "mint-hook"))
        .await
        .unwrap();
    let start = Instant::now();
    let pid = loop {
        if let Some(v) = queue.status(id).await.unwrap().custody
            && v.awaiting_approval
        {
            break v.provider_tx_id.unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no wake-up by webhook"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    sim.admin(&format!("/admin/transactions/{pid}/approve"), json!({}))
        .await;
    let verdict = tokio::time::timeout(
        Duration::from_secs(30),
        queue.await_verdict(id, Duration::from_millis(50)),
    )
    .await
    .expect("settled through webhook wake-ups, well before the next poll")
    .unwrap();
    assert_confirmed(&verdict);
    assert_eq!(effects(&chain, counter).await, U256::from(1));

    // A forged signature: 401 with the typed code.
    let http = reqwest::Client::new();
    let forged = http
        .post(&hook)
        .header(SIGNATURE_HEADER, "eyJhbGciOiJSUzUxMiIsImtpZCI6IngifQ..c2lnbmF0dXJl")
        .header("content-type", "application/json")
        .body(r#"{"id":"e1","eventType":"transaction.status.updated","eventVersion":1,"resourceId":"x","createdAt":1,"data":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let problem: Value = forged.json().await.unwrap();
    assert_eq!(problem["code"], "CUSTODY_WEBHOOK_UNVERIFIED");
    let unsigned = http.post(&hook).body("{}").send().await.unwrap();
    assert_eq!(unsigned.status(), 401);

    // A resend of an old event (the same signed bytes): acknowledged, nothing changes.
    let events = sim.admin_get("/admin/webhooks/events").await;
    let first = events.as_array().unwrap().first().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    sim.admin("/admin/webhooks/resend", json!({"eventId": first}))
        .await;
    let status = queue.status(id).await.unwrap();
    assert!(matches!(
        status.verdict,
        Some(SettlementVerdict::Confirmed { .. })
    ));
    assert_eq!(effects(&chain, counter).await, U256::from(1));
    assert_eq!(sent_count(&chain, vault).await, 1);
    assert!(start.elapsed() < DEADLINE);
    stop.cancel();
}
