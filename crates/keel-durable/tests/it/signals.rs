//! Sleep and signal waits: signal before wait, deadlines on the database clock,
//! duplicates, ended instances, the unconsumed-signal limit.

use crate::common::*;
use keel_durable::{DurableError, RunStatus, SignalOutcome, SignalReceipt, WaitKind};
use serde_json::json;
use uuid::Uuid;

fn received(v: serde_json::Value) -> serde_json::Value {
    serde_json::to_value(SignalOutcome::Received(v)).unwrap()
}

#[tokio::test]
async fn durable_sleep_waits_on_a_timer_then_continues() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, Some(150)), opts())
        .await
        .unwrap();
    let st = until(&engine, s.instance_id, "timer wait", |s| s.wait.is_some()).await;
    let wait = st.wait.unwrap();
    assert_eq!(wait.kind, WaitKind::Timer);
    assert!(wait.deadline.is_some());
    // The probe is idle while only a future timer is queued, and lists it as deferred.
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.deferred.iter().any(|c| c.kind == "timer"));
    let st = until(&engine, s.instance_id, "signal wait", |s| {
        s.wait.as_ref().is_some_and(|w| w.kind == WaitKind::Signal)
    })
    .await;
    assert_eq!(st.status, RunStatus::Waiting);
    assert_eq!(st.wait.unwrap().name.as_deref(), Some("go"));
    engine
        .signal(s.instance_id, "go", "1", &json!({"ok": true}))
        .await
        .unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(received(json!({"ok": true}))));
    ex.shutdown().await;
}

#[tokio::test]
async fn signal_recorded_before_the_wait_is_kept_and_applied() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let s = engine
        .start::<Waiter>("w", &waiter("go", Some(60_000), None), opts())
        .await
        .unwrap();
    // No executor yet: the signal is recorded before the body reaches its wait.
    engine
        .signal(s.instance_id, "go", "a", &"first")
        .await
        .unwrap();
    engine
        .signal(s.instance_id, "go", "b", &"second")
        .await
        .unwrap();
    engine
        .signal(s.instance_id, "other", "c", &"noise")
        .await
        .unwrap();
    let ex = spawn(&engine);
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(received(json!("first"))), "earliest wins");
    let consumed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_signal WHERE consumed_seq IS NOT NULL")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(consumed, 1);
    ex.shutdown().await;
}

async fn wait_deadline(engine: &keel_durable::Engine, id: Uuid) -> chrono::DateTime<chrono::Utc> {
    let st = until(engine, id, "signal wait", |s| {
        s.wait.as_ref().is_some_and(|w| w.kind == WaitKind::Signal)
    })
    .await;
    st.wait.unwrap().deadline.unwrap()
}

async fn until_db_clock_passes(pool: &sqlx::PgPool, t: chrono::DateTime<chrono::Utc>) {
    loop {
        let passed: bool = sqlx::query_scalar("SELECT now() > $1")
            .bind(t)
            .fetch_one(pool)
            .await
            .unwrap();
        if passed {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn deadline_fires_first_then_signal_is_refused_as_ended() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", Some(100), None), opts())
        .await
        .unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("expired")));
    let err = engine
        .signal(s.instance_id, "go", "late", &1)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InstanceEnded {
            status: RunStatus::Completed,
            ..
        }
    ));
    ex.shutdown().await;
}

#[tokio::test]
async fn signal_recorded_before_the_deadline_wins_even_when_the_executor_is_late() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", Some(300), None), opts())
        .await
        .unwrap();
    let deadline = wait_deadline(&engine, s.instance_id).await;
    ex.shutdown().await;
    // Recorded before the deadline, while no executor runs.
    engine
        .signal(s.instance_id, "go", "1", &"in time")
        .await
        .unwrap();
    until_db_clock_passes(db.pool(), deadline).await;
    let ex = spawn(&engine);
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(received(json!("in time"))));
    ex.shutdown().await;
}

#[tokio::test]
async fn signal_recorded_after_the_deadline_loses_even_when_the_executor_is_late() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", Some(200), None), opts())
        .await
        .unwrap();
    let deadline = wait_deadline(&engine, s.instance_id).await;
    ex.shutdown().await;
    until_db_clock_passes(db.pool(), deadline).await;
    // The timer has not run (no executor): the signal is accepted but recorded late.
    engine
        .signal(s.instance_id, "go", "1", &"too late")
        .await
        .unwrap();
    let ex = spawn(&engine);
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("expired")));
    ex.shutdown().await;
}

#[tokio::test]
async fn duplicate_signal_is_recorded_once() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    assert_eq!(
        engine
            .signal(s.instance_id, "go", "same", &1)
            .await
            .unwrap(),
        SignalReceipt::Recorded
    );
    assert_eq!(
        engine
            .signal(s.instance_id, "go", "same", &2)
            .await
            .unwrap(),
        SignalReceipt::Duplicate
    );
    let (signals, commands): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM durable_signal), (SELECT count(*) FROM durable_command WHERE kind = 'signal')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!((signals, commands), (1, 1));
    let ex = spawn(&engine);
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(received(json!(1))));
    // A duplicate after the end is still a duplicate (reported before the ended check).
    assert_eq!(
        engine
            .signal(s.instance_id, "go", "same", &1)
            .await
            .unwrap(),
        SignalReceipt::Duplicate
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn signal_to_unknown_and_cancelled_instances_is_refused() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let missing = Uuid::new_v4();
    assert!(matches!(
        engine.signal(missing, "go", "k", &1).await,
        Err(DurableError::InstanceNotFound(id)) if id == missing
    ));
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    engine.cancel(s.instance_id).await.unwrap();
    assert!(matches!(
        engine.signal(s.instance_id, "go", "k", &1).await,
        Err(DurableError::InstanceEnded {
            status: RunStatus::Cancelled,
            ..
        })
    ));
}

#[tokio::test]
async fn unconsumed_signal_limit() {
    let db = database().await;
    let mut config = fast_config();
    config.max_open_signals = 3;
    let engine = engine(db.pool(), config);
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    for k in ["1", "2", "3"] {
        engine.signal(s.instance_id, "other", k, &k).await.unwrap();
    }
    let err = engine
        .signal(s.instance_id, "go", "4", &4)
        .await
        .unwrap_err();
    assert!(matches!(err, DurableError::SignalLimit { limit: 3, .. }));
    // Consuming one frees a slot: cancel nothing, run the body with a wait for "other".
    let s2 = engine
        .start::<Waiter>("w2", &waiter("other", None, None), opts())
        .await
        .unwrap();
    assert_ne!(s2.instance_id, s.instance_id);
    let count: i32 = sqlx::query_scalar("SELECT open_signals FROM durable_instance WHERE id = $1")
        .bind(s.instance_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(count, 3);
    // The refused signal wrote nothing.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_signal WHERE dedupe_key = '4'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn consuming_a_signal_frees_its_slot() {
    let db = database().await;
    let mut config = fast_config();
    config.max_open_signals = 1;
    let engine = engine(db.pool(), config);
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    engine.signal(s.instance_id, "go", "1", &1).await.unwrap();
    until_status(&engine, s.instance_id, RunStatus::Completed).await;
    let count: i32 = sqlx::query_scalar("SELECT open_signals FROM durable_instance WHERE id = $1")
        .bind(s.instance_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(count, 0);
    ex.shutdown().await;
}
