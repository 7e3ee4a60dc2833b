//! keel-webhooks against a real PostgreSQL (a fresh database per test) and a real HTTP
//! receiver in the test process ([`receiver`]).

mod delivery;
mod endpoints;
mod receiver;
mod retention;

use keel_store::testing::TestDatabase;
use keel_webhooks::{
    Dispatcher, EndpointInput, NewEvent, UrlPolicy, WebhookConfig, Webhooks, emit_in,
};
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub(crate) const TIMEOUT: Duration = Duration::from_secs(60);

/// Local-testing settings: http and loopback allowed, short timeouts and retries, a
/// lease of about one second, a breaker that does not open.
pub(crate) fn test_config() -> WebhookConfig {
    WebhookConfig {
        policy: UrlPolicy {
            allow_http: true,
            allow_private: true,
        },
        request_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        retry_initial: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        window: Duration::from_secs(3600),
        breaker_threshold: 1000,
        lease_margin: Duration::ZERO,
        ..WebhookConfig::default()
    }
}

pub(crate) async fn database() -> TestDatabase {
    TestDatabase::create().await.expect("test database")
}

/// A running dispatcher.
pub(crate) struct Running {
    token: CancellationToken,
    handle: JoinHandle<keel_service::Exit>,
}

impl Running {
    pub(crate) fn start(pool: &PgPool, config: WebhookConfig) -> Self {
        let d = Dispatcher::new(pool.clone(), config, Duration::from_millis(100)).unwrap();
        let token = CancellationToken::new();
        let handle = tokio::spawn(keel_service::run(
            d,
            keel_service::ServiceConfig::new(Duration::from_millis(50)),
            token.clone(),
        ));
        Self { token, handle }
    }

    pub(crate) async fn stop(self) {
        self.token.cancel();
        let _ = self.handle.await;
    }

    /// Aborts the task mid-flight (its attempts are dropped with their connections).
    pub(crate) async fn abort(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }
}

/// An endpoint of `org` subscribed to everything; returns (id, secret).
pub(crate) async fn endpoint(pool: &PgPool, org: Uuid, url: &str) -> (Uuid, String) {
    let (e, secret) = Webhooks::new(pool.clone(), test_config())
        .create(
            org,
            &EndpointInput {
                url: Some(url.to_owned()),
                event_types: Some(vec!["*".into()]),
                ..EndpointInput::default()
            },
        )
        .await
        .unwrap();
    (e.id, secret)
}

/// Emits one event in its own transaction (committed).
pub(crate) async fn emit(pool: &PgPool, org: Uuid, ty: &'static str, op: Option<Uuid>, n: u32) {
    let mut tx = pool.begin().await.unwrap();
    let data = json!({"n": n});
    emit_in(
        &mut tx,
        &NewEvent {
            organization_id: org,
            event_type: ty,
            operation_id: op,
            data: &data,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// Waits until every event is dispatch-settled (a database probe).
pub(crate) async fn until_settled(pool: &PgPool) {
    until(
        pool,
        "every event dispatch-settled",
        "SELECT NOT EXISTS (SELECT 1 FROM webhook_event WHERE dispatch_settled_at IS NULL)",
    )
    .await;
}

/// Waits until `sql` (one boolean) is true.
pub(crate) async fn until(pool: &PgPool, what: &str, sql: &'static str) {
    keel_store::testing::until_sql(pool, what, TIMEOUT, sql).await;
}

/// Event ids by operation, in write order, and each event's operation.
pub(crate) async fn events(pool: &PgPool) -> Vec<(String, Option<Uuid>, String)> {
    sqlx::query_as::<_, (Uuid, Option<Uuid>, String)>(
        "SELECT id, operation_id, event_type FROM webhook_event ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(id, op, t)| (id.to_string(), op, t))
    .collect()
}
