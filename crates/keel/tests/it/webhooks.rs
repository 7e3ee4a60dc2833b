//! Webhook delivery survives a runner killed mid-delivery (issue 21): the `keel`
//! binary's runner role as a process against a real PostgreSQL and a real HTTP
//! receiver in the test, which holds one delivery open and fails the first attempt of
//! some events. The runner is killed (SIGKILL, no shutdown path) while the held
//! delivery is open, events are written while no runner runs, and a new runner
//! delivers everything: every event arrives (at least once), repeats carry the same
//! `webhook-id` and body, and per operation no event is sent before the previous one
//! was acknowledged.

use crate::common::keel;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use keel_store::testing::TestDatabase;
use keel_webhooks::{EndpointInput, NewEvent, UrlPolicy, WebhookConfig, Webhooks, emit_in};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use uuid::Uuid;

const TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone)]
enum Entry {
    Request { id: String, body: String },
    Ack { id: String },
}

#[derive(Default)]
struct Inner {
    log: Vec<Entry>,
    seen: HashMap<String, u32>,
    held: bool,
}

/// The receiver: the very first request is held open (never answered; `held` is
/// notified); the first request of every event whose id starts with a digit below 8
/// gets 500; every other request 200.
#[derive(Clone)]
struct Receiver {
    inner: Arc<Mutex<Inner>>,
    held: Arc<Notify>,
}

async fn hook(State(r): State<Receiver>, headers: HeaderMap, body: String) -> StatusCode {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let (before, hold) = {
        let mut g = r.inner.lock().unwrap();
        let n = *g.seen.get(&id).unwrap_or(&0);
        g.seen.insert(id.clone(), n + 1);
        g.log.push(Entry::Request {
            id: id.clone(),
            body,
        });
        let hold = !std::mem::replace(&mut g.held, true);
        (n, hold)
    };
    if hold {
        r.held.notify_one();
        std::future::pending::<()>().await;
    }
    let fails = id.chars().next().is_some_and(|c| ('0'..'8').contains(&c));
    if before == 0 && fails {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    r.inner.lock().unwrap().log.push(Entry::Ack { id });
    StatusCode::OK
}

impl Receiver {
    async fn start() -> (Self, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let r = Self {
            inner: Arc::default(),
            held: Arc::new(Notify::new()),
        };
        let app = Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(r.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (r, url)
    }

    fn log(&self) -> Vec<Entry> {
        self.inner.lock().unwrap().log.clone()
    }
}

/// The runner role with short webhook timeouts and leases (2.5 s) and fast retries.
fn runner(db: &TestDatabase) -> Child {
    keel()
        .args(["run", "--role", "runner"])
        .env("KEEL__DATABASE__URL", db.url())
        .env("KEEL__TELEMETRY__METRICSADDRESS", "")
        .env("KEEL__CLUSTER__REFRESHINTERVALMS", "200")
        .env("KEEL__CLUSTER__LIVENESSWINDOWMS", "1000")
        .env("KEEL__WEBHOOKS__ALLOWHTTP", "true")
        .env("KEEL__WEBHOOKS__ALLOWPRIVATEADDRESSES", "true")
        .env("KEEL__WEBHOOKS__REQUESTTIMEOUTMS", "2000")
        .env("KEEL__WEBHOOKS__CONNECTTIMEOUTMS", "500")
        .env("KEEL__WEBHOOKS__LEASEMARGINMS", "0")
        .env("KEEL__WEBHOOKS__RETRYINITIALMS", "100")
        .env("KEEL__WEBHOOKS__RETRYMAXMS", "400")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Writes one event of `op` (committed), as the outbox does in a change's transaction.
async fn emit(pool: &sqlx::PgPool, org: Uuid, op: Uuid, n: usize) {
    let ty = [
        "operation.accepted",
        "operation.submitted",
        "operation.state_changed",
    ][n % 3];
    let ty = keel_webhooks::event::known_type(ty).unwrap();
    let mut tx = pool.begin().await.unwrap();
    let data = json!({"n": n});
    emit_in(
        &mut tx,
        &NewEvent {
            organization_id: org,
            event_type: ty,
            operation_id: Some(op),
            data: &data,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_runner_killed_mid_delivery_loses_no_event_and_keeps_the_order_per_operation() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let (r, url) = Receiver::start().await;
    let org = Uuid::new_v4();
    let policy = WebhookConfig {
        policy: UrlPolicy {
            allow_http: true,
            allow_private: true,
        },
        ..WebhookConfig::default()
    };
    Webhooks::new(pool.clone(), policy)
        .create(
            org,
            &EndpointInput {
                url: Some(url),
                event_types: Some(vec!["*".into()]),
                ..EndpointInput::default()
            },
        )
        .await
        .unwrap();
    let ops: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    for n in 0..3 {
        for op in &ops {
            emit(pool, org, *op, n).await;
        }
    }

    let mut first = runner(&db);
    tokio::time::timeout(TIMEOUT, r.held.notified())
        .await
        .expect("the runner delivered nothing");
    // Mid-delivery: one request is held open at the receiver, others are in flight.
    first.kill().unwrap();
    first.wait().unwrap();
    // Written while no runner runs.
    for n in 3..5 {
        for op in &ops {
            emit(pool, org, *op, n).await;
        }
    }
    let mut second = runner(&db);
    let started = Instant::now();
    loop {
        let (done,): (bool,) = sqlx::query_as(
            "SELECT NOT EXISTS (SELECT 1 FROM webhook_event WHERE dispatch_settled_at IS NULL)",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if done {
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "the second runner did not deliver everything"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = second.kill();
    let _ = second.wait();

    // The events per operation, in write order.
    let events: Vec<(Uuid, Option<Uuid>)> =
        sqlx::query_as("SELECT id, operation_id FROM webhook_event ORDER BY seq")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(events.len(), ops.len() * 5);
    let mut previous: HashMap<String, Option<String>> = HashMap::new();
    let mut last: HashMap<Option<Uuid>, String> = HashMap::new();
    for (id, op) in &events {
        previous.insert(id.to_string(), last.insert(*op, id.to_string()));
    }
    let mut acked: HashSet<String> = HashSet::new();
    let mut bodies: HashMap<String, String> = HashMap::new();
    let mut requests: HashMap<String, u32> = HashMap::new();
    for e in r.log() {
        match e {
            Entry::Request { id, body } => {
                let prev = previous.get(&id).expect("only known events are sent");
                if let Some(p) = prev {
                    assert!(
                        acked.contains(p),
                        "an event was sent before the previous event of its operation was acknowledged"
                    );
                }
                let first = bodies.entry(id.clone()).or_insert_with(|| body.clone());
                assert_eq!(*first, body, "a repeat is the same event");
                *requests.entry(id).or_default() += 1;
            }
            Entry::Ack { id } => {
                acked.insert(id);
            }
        }
    }
    let all: HashSet<String> = previous.keys().cloned().collect();
    assert_eq!(acked, all, "every event arrived");
    let (held_id, _) = r
        .log()
        .into_iter()
        .find_map(|e| match e {
            Entry::Request { id, body } => Some((id, body)),
            Entry::Ack { .. } => None,
        })
        .unwrap();
    assert!(
        requests[&held_id] >= 2,
        "the held delivery was sent again, with the same webhook-id"
    );
    // The events whose first attempt the receiver failed were retried.
    let failed_first: Vec<&String> = all
        .iter()
        .filter(|id| id.chars().next().is_some_and(|c| ('0'..'8').contains(&c)))
        .collect();
    assert!(!failed_first.is_empty());
    for id in failed_first {
        assert!(requests[id] >= 2, "a failed first attempt was retried");
    }
    let (unsucceeded,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_delivery WHERE state <> 'succeeded'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(unsucceeded, 0);
}
