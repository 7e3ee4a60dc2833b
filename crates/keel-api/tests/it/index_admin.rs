//! Issue 32 §2 and §7 through the API: Platform Status measures a stopped indexer's lag
//! against the chain head it reads from the node itself and shows the chain red; it
//! lists failing and breaker-open webhook endpoints by id; `POST
//! /v1/chains/{chain}/index/reindex` clears a degraded chain's marker and reads say
//! `indexRebuilding` until the indexer rebuilt it. Real PostgreSQL, real Anvil.

use crate::common::{Env, assert_problem};
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::keel_abi::bindings::AssetToken;
use anvil_tests::{TestChain, confirm, deploy_asset_with_feed, deploy_keel};
use axum::http::{Method, StatusCode};
use keel_api::ApiConfig;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::{IndexError, ScopeEntry, ScopeKind, TipConfig, TipIngest, scope};
use keel_units::ChainId;
use keel_workflows::{Scope, Scopes};
use serde_json::{Value, json};
use std::sync::Arc;
use uuid::Uuid;

async fn admin_key(env: &Env) -> String {
    let pool = env.db.pool().clone();
    let org = keel_workflows::tenancy::organization_by_name(&pool, "org-a")
        .await
        .unwrap();
    keel_workflows::tenancy::create_api_key_with_scopes(
        &pool,
        org,
        "operator",
        Scopes::NONE.with(Scope::Admin).with(Scope::Read),
    )
    .await
    .unwrap()
    .token
}

fn node(chain: &TestChain) -> Arc<UpstreamPool> {
    Arc::new(
        UpstreamPool::new(
            ChainId(chain.chain_id()),
            UpstreamConfig::new(vec![chain.endpoint().to_string()]),
        )
        .unwrap(),
    )
}

async fn catch_up(ingest: &TipIngest) -> u64 {
    for _ in 0..100 {
        let out = ingest.round().await.unwrap();
        if out.tip == Some(out.head) {
            return out.head;
        }
    }
    panic!("ingest did not catch up")
}

fn index_chain(status: &Value, chain: u64) -> &Value {
    status["index"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["chainId"].as_str() == Some(chain.to_string().as_str()))
        .unwrap_or_else(|| panic!("chain {chain} missing: {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_stopped_indexers_lag_against_the_node_head_in_red() {
    let mut env = Env::new().await;
    let admin = admin_key(&env).await;
    let chain = TestChain::start().await.unwrap();
    let id = chain.chain_id();
    env.serve_chain_heads(ApiConfig::default(), vec![node(&chain)]);
    let head = {
        let ingest = TipIngest::take_ownership(
            env.db.pool().clone(),
            node(&chain),
            TipConfig {
                start_block: Some(0),
                ..TipConfig::new(12)
            },
            "status-lag",
        )
        .await
        .unwrap();
        catch_up(&ingest).await
    }; // the indexer stops
    let live = env.get(&admin, "/v1/status").await;
    assert_eq!(live.status, StatusCode::OK, "{:?}", live.body);
    let c = index_chain(&live.body, id);
    assert_eq!(c["lagBlocks"], 0, "{c}");
    assert_eq!(c["red"], false, "{c}");
    assert_eq!(c["ownerLive"], true, "{c}");

    // The chain moves 100 blocks; nobody ingests them.
    chain.provider().anvil_mine(Some(100), None).await.unwrap();
    let a = env.get(&admin, "/v1/status").await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let c = index_chain(&a.body, id);
    assert_eq!(c["tip"], head, "{c}");
    assert_eq!(c["nodeHead"], head + 100, "{c}");
    assert_eq!(c["headSource"], "node", "{c}");
    assert_eq!(c["lagBlocks"], 100, "{c}");
    assert_eq!(c["red"], true, "{c}");
    assert!(
        c["redReasons"]
            .as_array()
            .unwrap()
            .contains(&json!("lagging")),
        "{c}"
    );

    // The page shows it red too.
    let auth = format!("Bearer {admin}");
    let page = env
        .send_unchecked(Method::GET, "/status", &[("authorization", &auth)], None)
        .await;
    assert_eq!(page.status, StatusCode::OK);
    let html = String::from_utf8(page.raw).unwrap();
    assert!(html.contains("red: lagging"), "{html}");
    assert!(html.contains("100 blocks"), "{html}");

    // An owner observation older than the staleness bound: no live owner, red.
    env.serve_chain_heads(
        ApiConfig {
            index_status: keel_api::IndexStatusConfig {
                stale_after: std::time::Duration::ZERO,
                ..keel_api::IndexStatusConfig::default()
            },
            ..ApiConfig::default()
        },
        vec![],
    );
    let a = env.get(&admin, "/v1/status").await;
    let c = index_chain(&a.body, id);
    assert_eq!(c["ownerLive"], false, "{c}");
    assert_eq!(c["stale"], true, "{c}");
    assert_eq!(c["headSource"], "owner", "{c}");
    assert_eq!(c["red"], true, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_failing_and_breaker_open_webhook_endpoints_by_id() {
    let env = Env::new().await;
    let admin = admin_key(&env).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let a = env
            .post(
                &admin,
                "/v1/webhook-endpoints",
                None,
                &json!({"url": format!("http://127.0.0.1:9/hook-{i}"), "eventTypes": ["*"]}),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
        ids.push(
            a.body["endpoint"]["id"]
                .as_str()
                .unwrap()
                .parse::<Uuid>()
                .unwrap(),
        );
    }
    // The delivery worker's record of a failing endpoint and of a tripped breaker.
    sqlx::query(
        "UPDATE webhook_endpoint SET failing_since = now() - interval '10 minutes',
                consecutive_failures = 4 WHERE id = $1",
    )
    .bind(ids[0])
    .execute(env.db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE webhook_endpoint SET failing_since = now() - interval '1 hour',
                consecutive_failures = 12, breaker_open_until = now() + interval '5 minutes'
          WHERE id = $1",
    )
    .bind(ids[1])
    .execute(env.db.pool())
    .await
    .unwrap();
    let a = env.get(&admin, "/v1/status").await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let w = &a.body["webhooks"];
    assert_eq!(
        (w["failing"].clone(), w["breakerOpen"].clone()),
        (json!(1), json!(1)),
        "{w}"
    );
    let listed: Vec<(String, bool, u64)> = w["unhealthyEndpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_owned(),
                e["breakerOpen"].as_bool().unwrap(),
                e["consecutiveFailures"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            (ids[1].to_string(), true, 12),
            (ids[0].to_string(), false, 4)
        ],
        "{w}"
    );
    let auth = format!("Bearer {admin}");
    let page = env
        .send_unchecked(Method::GET, "/status", &[("authorization", &auth)], None)
        .await;
    let html = String::from_utf8(page.raw).unwrap();
    assert!(html.contains(&ids[0].to_string()), "{html}");
    assert!(html.contains(&ids[1].to_string()), "{html}");
    assert!(
        !html.contains(&ids[2].to_string()),
        "a healthy endpoint is not listed"
    );
}

/// A degraded chain (a reorg of 5 blocks under Anvil's `--slots-in-an-epoch 1`
/// finality, head − 2) re-indexed through the API: reads said `indexDegraded`, then
/// `indexRebuilding` until an indexer rebuilt the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reindex_route_clears_a_degraded_chain_and_reads_say_rebuilding() {
    let env = Env::new().await;
    let admin = admin_key(&env).await;
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await
        .unwrap();
    let deployed = deploy_keel(&chain).await.unwrap();
    let asset = deploy_asset_with_feed(&chain, &deployed, "RIDX")
        .await
        .unwrap();
    let p = chain.provider();
    confirm(&AssetToken::new(asset.token, p.clone()).unpause())
        .await
        .unwrap();
    anvil_tests::set_staleness_bound(p, deployed.price_resolver, asset.feed, 3_600)
        .await
        .unwrap();
    anvil_tests::submit_observation(p, asset.feed, 200_000_000_000)
        .await
        .unwrap();
    let pool = env.db.pool().clone();
    let chain_id = ChainId(chain.chain_id());
    scope::add_scope(
        &pool,
        chain_id,
        &ScopeEntry {
            address: asset.token,
            kind: ScopeKind::AssetToken,
            organization: None,
            from_block: 0,
        },
    )
    .await
    .unwrap();
    let a0 = chain.accounts()[0];
    confirm(&AssetToken::new(asset.token, p.clone()).mint(a0, alloy::primitives::U256::from(5)))
        .await
        .unwrap();
    p.anvil_mine(Some(5), None).await.unwrap();
    let config = TipConfig {
        start_block: Some(0),
        hash_window: 3,
        ..TipConfig::new(3)
    };
    let ingest = TipIngest::take_ownership(pool.clone(), node(&chain), config.clone(), "api")
        .await
        .unwrap();
    catch_up(&ingest).await;
    let body = json!({
        "name": "Reindex", "symbol": "RIDX", "decimals": 18,
        "templateId": crate::common::TEMPLATE, "initialPrice": "1"
    });
    let a = env
        .post(&env.key_a, "/v1/assets", Some("reindex-1"), &body)
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    let id: Uuid = a.body["assetId"].as_str().unwrap().parse().unwrap();
    keel_workflows::store::asset_addresses_set(
        &pool,
        id,
        asset.token.as_slice(),
        asset.feed.as_slice(),
        a0.as_slice(),
    )
    .await
    .unwrap();
    p.anvil_reorg(ReorgOptions {
        depth: 5,
        tx_block_pairs: vec![],
    })
    .await
    .unwrap();
    let err = ingest.round().await.unwrap_err();
    assert!(matches!(err, IndexError::ReorgTooDeep { .. }), "{err}");
    let balance = format!("/v1/assets/{id}/balances/{a0}");
    let b = env.get(&env.key_a, &balance).await;
    assert_eq!(b.status, StatusCode::OK, "{:?}", b.body);
    assert_eq!(
        (
            b.body["indexDegraded"].clone(),
            b.body["indexRebuilding"].clone()
        ),
        (json!(true), json!(false))
    );
    // A read-after-write wait on the degraded chain says it is degraded and what the
    // operator must do (issue 32 §2), not `INDEX_BEHIND`.
    let waited = env
        .get(
            &env.key_a,
            &format!("{balance}?minBlock=1000000&waitSeconds=0"),
        )
        .await;
    assert_problem(
        &waited,
        503,
        "INDEX_DEGRADED",
        "minBlock on a degraded chain",
    );
    assert!(
        waited.body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("keel index reindex"),
        "{:?}",
        waited.body
    );
    let status = env.get(&admin, "/v1/status").await;
    let c = index_chain(&status.body, chain_id.get());
    let route = format!("/v1/chains/{}/index/reindex", chain_id.get());
    assert_eq!(c["reindexUrl"], route.as_str(), "{c}");
    assert!(
        c["redReasons"]
            .as_array()
            .unwrap()
            .contains(&json!("degraded")),
        "{c}"
    );

    // Refused without the admin scope, for an unknown chain, and for a bad body.
    let reader = keel_workflows::tenancy::create_api_key_with_scopes(
        &pool,
        keel_workflows::tenancy::organization_by_name(&pool, "org-a")
            .await
            .unwrap(),
        "reader",
        Scopes::NONE.with(Scope::Read),
    )
    .await
    .unwrap()
    .token;
    let forbidden = env.post(&reader, &route, None, &json!({})).await;
    assert_problem(&forbidden, 403, "INSUFFICIENT_SCOPE", "read key");
    let unknown = env
        .post(&admin, "/v1/chains/999999/index/reindex", None, &json!({}))
        .await;
    assert_problem(&unknown, 404, "NOT_FOUND", "unknown chain");
    let bad = env
        .post(&admin, &route, None, &json!({"fromBlock": -1}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{:?}", bad.body);

    let done = env.post(&admin, &route, None, &json!({})).await;
    assert_eq!(done.status, StatusCode::ACCEPTED, "{:?}", done.body);
    assert_eq!(done.body["wasDegraded"], true, "{:?}", done.body);
    assert_eq!(done.body["fromBlock"], 0, "{:?}", done.body);
    let b = env.get(&env.key_a, &balance).await;
    assert_eq!(
        (
            b.body["indexDegraded"].clone(),
            b.body["indexRebuilding"].clone()
        ),
        (json!(false), json!(true)),
        "{:?}",
        b.body
    );

    // An indexer rebuilds the chain (here one owner's rounds from block 0); the marker
    // clears and the balance equals the chain's.
    let rebuild = TipIngest::take_ownership(pool.clone(), node(&chain), config, "rebuild")
        .await
        .unwrap();
    catch_up(&rebuild).await;
    let b = env.get(&env.key_a, &balance).await;
    assert_eq!(
        (
            b.body["indexDegraded"].clone(),
            b.body["indexRebuilding"].clone()
        ),
        (json!(false), json!(false)),
        "{:?}",
        b.body
    );
    let on_chain: alloy::primitives::U256 = AssetToken::new(asset.token, p.clone())
        .balanceOf(a0)
        .call()
        .await
        .unwrap();
    assert_eq!(
        b.body["balanceBaseUnits"],
        on_chain.to_string(),
        "{:?}",
        b.body
    );
}
