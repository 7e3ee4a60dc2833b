//! Webhook delivery benchmark: `EVENTS` events of `OPERATIONS` operations (written in
//! their own transactions, as state changes write them) delivered by one dispatcher to
//! a local axum receiver answering 200. Reports events/s (first write → last
//! acknowledgement) and p50/p99 of "event written (its `createdAt`) → received".
//!
//! `cargo bench -p keel-webhooks --bench delivery` (needs `DATABASE_URL`).

use axum::Router;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use keel_webhooks::{
    Dispatcher, EndpointInput, NewEvent, UrlPolicy, WebhookConfig, Webhooks, emit_in,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

const EVENTS: usize = 4000;
const OPERATIONS: usize = 400;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = keel_store::testing::TestDatabase::create().await?;
    let pool = db.pool().clone();
    let lags: Arc<Mutex<Vec<f64>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let l = lags.clone();
    let app = Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let l = l.clone();
            async move {
                let now = Utc::now();
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&body)
                    && let Some(t) = v["createdAt"].as_str()
                    && let Ok(t) = t.parse::<DateTime<Utc>>()
                {
                    let lag = (now - t).num_microseconds().unwrap_or(0) as f64 / 1e6;
                    l.lock().map(|mut g| g.push(lag)).ok();
                }
                StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = WebhookConfig {
        policy: UrlPolicy {
            allow_http: true,
            allow_private: true,
        },
        per_endpoint_in_flight: 16,
        total_in_flight: 64,
        ..WebhookConfig::default()
    };
    let org = Uuid::new_v4();
    Webhooks::new(pool.clone(), config)
        .create(
            org,
            &EndpointInput {
                url: Some(format!("http://{addr}/hook")),
                event_types: Some(vec!["*".into()]),
                ..EndpointInput::default()
            },
        )
        .await?;
    let token = tokio_util::sync::CancellationToken::new();
    let dispatcher = Dispatcher::new(pool.clone(), config, Duration::from_millis(50))?;
    let run = tokio::spawn(keel_service::run(
        dispatcher,
        keel_service::ServiceConfig::new(Duration::from_millis(50)),
        token.clone(),
    ));
    let ops: Vec<Uuid> = (0..OPERATIONS).map(|_| Uuid::new_v4()).collect();
    let started = Instant::now();
    // Writers: 8 concurrent "state changes" at a time.
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..8 {
        let (pool, ops) = (pool.clone(), ops.clone());
        writers.spawn(async move {
            for i in (w..EVENTS).step_by(8) {
                let mut tx = pool.begin().await?;
                let data = serde_json::json!({"n": i});
                emit_in(
                    &mut tx,
                    &NewEvent {
                        organization_id: org,
                        event_type: keel_webhooks::event::OPERATION_STATE_CHANGED,
                        operation_id: Some(ops[i % OPERATIONS]),
                        data: &data,
                    },
                )
                .await?;
                tx.commit().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = writers.join_next().await {
        r??;
    }
    loop {
        let (left,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM webhook_event WHERE dispatch_settled_at IS NULL")
                .fetch_one(&pool)
                .await?;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    token.cancel();
    let _ = run.await;
    let mut lags = lags.lock().map(|g| g.clone()).unwrap_or_default();
    lags.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| lags[((lags.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "webhook delivery: {EVENTS} events ({OPERATIONS} operations, 1 endpoint) in {:.2} s = {:.0} events/s; \
         event written -> received: p50 {:.1} ms, p99 {:.1} ms ({} received)",
        elapsed.as_secs_f64(),
        EVENTS as f64 / elapsed.as_secs_f64(),
        pct(0.5) * 1e3,
        pct(0.99) * 1e3,
        lags.len()
    );
    Ok(())
}
