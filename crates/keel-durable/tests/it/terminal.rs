//! `Engine::await_terminal`: wakes on the terminal-state notification (completed,
//! failed, cancelled), returns `None` at its timeout, and shares one listener.

use crate::common::*;
use keel_durable::{DurableError, RunStatus};
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// Backends of this test's database listening on the terminal channel.
async fn listeners(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE 'LISTEN \"keel_durable_terminal\"%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn until_listeners(pool: &PgPool, n: i64) {
    keel_store::testing::until(&format!("{n} listener(s)"), TIMEOUT, || async {
        listeners(pool).await == n
    })
    .await;
}

async fn signal_wait(engine: &keel_durable::Engine, id: Uuid) {
    until(engine, id, "signal wait", |s| s.wait.is_some()).await;
}

/// Starts a `Waiter` on the signal `go` and returns once it waits for it.
async fn waiting_instance(engine: &keel_durable::Engine) -> keel_durable::Started {
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    signal_wait(engine, s.instance_id).await;
    s
}

/// `await_terminal(id, WAIT)` on its own task.
fn spawn_waiter(
    engine: &keel_durable::Engine,
    id: Uuid,
) -> tokio::task::JoinHandle<Result<Option<keel_durable::InstanceStatus>, DurableError>> {
    let engine = engine.clone();
    tokio::spawn(async move { engine.await_terminal(id, WAIT).await })
}

#[tokio::test]
async fn a_waiter_wakes_when_its_instance_completes() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = waiting_instance(&engine).await;
    let waiter = spawn_waiter(&engine, s.instance_id);
    until_listeners(db.pool(), 1).await;
    engine
        .signal(s.instance_id, "go", "1", &json!(true))
        .await
        .unwrap();
    let st = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("terminal before the timeout");
    assert_eq!(st.status, RunStatus::Completed);
    assert_eq!(st.id, s.instance_id);
    // Terminal already: returns at once, also with a zero timeout.
    let again = engine
        .await_terminal(s.instance_id, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(again.map(|s| s.status), Some(RunStatus::Completed));
    ex.shutdown().await;
}

#[tokio::test]
async fn a_waiter_wakes_when_its_instance_fails_or_is_cancelled() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let failing = engine.start::<Fails>("f", &3, opts()).await.unwrap();
    let cancelled = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    let wait = |id| {
        let engine = engine.clone();
        tokio::spawn(async move { engine.await_terminal(id, WAIT).await })
    };
    let w_failed = wait(failing.instance_id);
    let w_cancelled = wait(cancelled.instance_id);
    until_listeners(db.pool(), 1).await;
    // No executor yet: both are pending; the cancel ends one at once (the engine's own
    // path, not a segment settle).
    engine.cancel(cancelled.instance_id).await.unwrap();
    let ex = spawn(&engine);
    let st = w_failed
        .await
        .unwrap()
        .unwrap()
        .expect("failed before the timeout");
    assert_eq!(st.status, RunStatus::Failed);
    assert_eq!(
        st.error.as_ref().map(|e| e.code.as_str()),
        Some("WORKFLOW_FAILED")
    );
    let st = w_cancelled
        .await
        .unwrap()
        .unwrap()
        .expect("cancelled before the timeout");
    assert_eq!(st.status, RunStatus::Cancelled);
    ex.shutdown().await;
}

#[tokio::test]
async fn a_timeout_returns_none_and_an_unknown_instance_is_an_error() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = waiting_instance(&engine).await;
    let none = engine
        .await_terminal(s.instance_id, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(none.is_none());
    assert!(
        engine
            .await_terminal(s.instance_id, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    let unknown = Uuid::new_v4();
    assert!(matches!(
        engine.await_terminal(unknown, WAIT).await,
        Err(DurableError::InstanceNotFound(id)) if id == unknown
    ));
    ex.shutdown().await;
}

#[tokio::test]
async fn many_concurrent_waiters_share_one_listener() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let mut ids = Vec::new();
    for i in 0..8 {
        let s = engine
            .start::<Waiter>(&format!("w{i}"), &waiter("go", None, None), opts())
            .await
            .unwrap();
        ids.push(s.instance_id);
    }
    for id in &ids {
        signal_wait(&engine, *id).await;
    }
    // Four waiters per instance, from clones of the engine.
    let mut waiters = Vec::new();
    for id in &ids {
        for _ in 0..4 {
            let engine = engine.clone();
            let id = *id;
            waiters.push((
                id,
                tokio::spawn(async move { engine.await_terminal(id, WAIT).await }),
            ));
        }
    }
    until_listeners(db.pool(), 1).await;
    for id in &ids {
        engine.signal(*id, "go", "1", &json!(1)).await.unwrap();
    }
    for (id, w) in waiters {
        let st = w
            .await
            .unwrap()
            .unwrap()
            .expect("terminal before the timeout");
        assert_eq!((st.id, st.status), (id, RunStatus::Completed));
    }
    assert_eq!(listeners(db.pool()).await, 1);
    ex.shutdown().await;
}

#[tokio::test]
async fn a_waiter_survives_a_dropped_listen_connection() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = waiting_instance(&engine).await;
    let waiter = spawn_waiter(&engine, s.instance_id);
    until_listeners(db.pool(), 1).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE 'LISTEN \"keel_durable_terminal\"%') t",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(killed, 1);
    engine
        .signal(s.instance_id, "go", "1", &json!(true))
        .await
        .unwrap();
    let st = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("terminal before the timeout");
    assert_eq!(st.status, RunStatus::Completed);
    // The listener came back.
    until_listeners(db.pool(), 1).await;
    ex.shutdown().await;
}

#[tokio::test]
async fn only_instances_someone_waited_on_notify() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener
        .listen(keel_durable::TERMINAL_CHANNEL)
        .await
        .unwrap();
    let ex = spawn(&engine);
    // Nobody waits on this one: it ends without a notification.
    let quiet = engine.start::<Fails>("quiet", &1, opts()).await.unwrap();
    until_status(&engine, quiet.instance_id, RunStatus::Failed).await;
    let watched = waiting_instance(&engine).await;
    let waiter = spawn_waiter(&engine, watched.instance_id);
    until_db(
        db.pool(),
        "the mark",
        "SELECT bool_or(terminal_watched) FROM durable_instance",
    )
    .await;
    engine
        .signal(watched.instance_id, "go", "1", &json!(true))
        .await
        .unwrap();
    let st = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("terminal before the timeout");
    assert_eq!(st.status, RunStatus::Completed);
    // Notifications arrive in commit order: had the first instance notified, its id
    // would come first.
    let first = listener.recv().await.unwrap();
    assert_eq!(first.payload(), watched.instance_id.to_string());
    ex.shutdown().await;
}
