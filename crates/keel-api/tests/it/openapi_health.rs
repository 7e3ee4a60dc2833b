//! The committed OpenAPI document, liveness and readiness.

use crate::common::Env;
use axum::http::{Method, StatusCode};
use serde_json::json;
use std::sync::atomic::Ordering;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");

#[tokio::test]
async fn served_openapi_equals_the_committed_document() {
    let env = Env::new().await;
    let a = env.send(Method::GET, "/openapi.json", &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.body["openapi"], json!("3.1.0"));
    let served = String::from_utf8(a.raw).unwrap();
    assert_eq!(served, keel_api::openapi_json());
    if std::env::var_os("KEEL_UPDATE_OPENAPI").is_some() {
        std::fs::write(DOC, &served).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(DOC).unwrap_or_default();
    assert!(
        committed == served,
        "docs/openapi.json differs from the document the API serves; regenerate it with \
         `KEEL_UPDATE_OPENAPI=1 cargo nextest run -p keel-api served_openapi` (or `cargo test \
         -p keel-api --test it served_openapi`) and commit the result"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let env = Env::new().await;
    let h = env.send(Method::GET, "/healthz", &[], None).await;
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.body, json!({"status": "ok"}));
    let r = env.send(Method::GET, "/readyz", &[], None).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body, json!({"status": "ready"}));

    env.ready.store(false, Ordering::Release);
    let r = env.send(Method::GET, "/readyz", &[], None).await;
    crate::common::assert_problem(&r, 503, "NOT_READY", "flag down");
    assert_eq!(r.body["retryable"], json!(true));
    let h = env.send(Method::GET, "/healthz", &[], None).await;
    assert_eq!(h.status, StatusCode::OK);

    // A pending migration makes it unready too.
    env.ready.store(true, Ordering::Release);
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(env.db.pool())
    .await
    .unwrap();
    let r = env.send(Method::GET, "/readyz", &[], None).await;
    crate::common::assert_problem(&r, 503, "NOT_READY", "migration missing");
}
