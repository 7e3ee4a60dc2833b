//! The typed reads other crates use instead of the engine's tables (`statuses`,
//! `input`) and `signal_in`, a signal recorded inside the caller's transaction.

use crate::common::*;
use keel_durable::{DurableError, RunStatus, SignalOutcome, SignalReceipt, WaitKind};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

async fn signals_and_commands(pool: &PgPool, id: Uuid) -> (i64, i64, i32) {
    let signals: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_signal WHERE instance_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    let commands: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM durable_command WHERE instance_id = $1 AND kind = 'signal'",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    let open: i32 = sqlx::query_scalar("SELECT open_signals FROM durable_instance WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    (signals, commands, open)
}

async fn flags(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM flag")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn statuses_reads_many_instances_in_the_order_asked() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    assert!(engine.statuses(&[]).await.unwrap().is_empty());
    let a = engine.start::<Fails>("a", &1, opts()).await.unwrap();
    let b = engine
        .start::<Waiter>("b", &waiter("go", None, None), opts())
        .await
        .unwrap();
    let ex = spawn(&engine);
    until_status(&engine, a.instance_id, RunStatus::Failed).await;
    until(&engine, b.instance_id, "signal wait", |s| s.wait.is_some()).await;
    let unknown = Uuid::new_v4();
    let got = engine
        .statuses(&[b.instance_id, unknown, a.instance_id, b.instance_id])
        .await
        .unwrap();
    let ids: Vec<Uuid> = got.iter().map(|s| s.id).collect();
    assert_eq!(ids, [b.instance_id, a.instance_id, b.instance_id]);
    // The same projection as `status`, one by one.
    for s in &got {
        assert_eq!(*s, engine.status(s.id).await.unwrap());
    }
    assert_eq!(got[0].status, RunStatus::Waiting);
    assert_eq!(
        got[0].wait.as_ref().map(|w| (w.kind, w.name.as_deref())),
        Some((WaitKind::Signal, Some("go")))
    );
    assert_eq!(got[1].status, RunStatus::Failed);
    assert_eq!(
        got[1].error.as_ref().map(|e| e.code.as_str()),
        Some("WORKFLOW_FAILED")
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn input_returns_the_start_input() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let input = waiter("go", Some(60_000), None);
    let s = engine.start::<Waiter>("w", &input, opts()).await.unwrap();
    assert_eq!(
        engine.input(s.instance_id).await.unwrap(),
        serde_json::to_value(&input).unwrap()
    );
    let unknown = Uuid::new_v4();
    assert!(matches!(
        engine.input(unknown).await,
        Err(DurableError::InstanceNotFound(id)) if id == unknown
    ));
}

#[tokio::test]
async fn signal_in_a_transaction_that_rolls_back_leaves_no_signal_and_no_command() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    until(&engine, s.instance_id, "signal wait", |s| s.wait.is_some()).await;

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO flag (key, value) VALUES ('caller', 'write')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let receipt = engine
        .signal_in(&mut tx, s.instance_id, "go", "k1", &json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!(receipt, SignalReceipt::Recorded);
    tx.rollback().await.unwrap();

    assert_eq!(
        signals_and_commands(db.pool(), s.instance_id).await,
        (0, 0, 0)
    );
    assert_eq!(flags(db.pool()).await, 0);
    engine.await_idle(TIMEOUT).await.unwrap();
    let st = engine.status(s.instance_id).await.unwrap();
    assert_eq!(st.status, RunStatus::Waiting);
    ex.shutdown().await;
}

#[tokio::test]
async fn signal_in_a_committed_transaction_is_consumed_by_the_waiting_workflow() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    until(&engine, s.instance_id, "signal wait", |s| s.wait.is_some()).await;

    let mut tx = db.pool().begin().await.unwrap();
    let first = engine
        .signal_in(&mut tx, s.instance_id, "go", "k1", &json!({"n": 1}))
        .await
        .unwrap();
    // A repeat in the same transaction is a duplicate and writes nothing.
    let again = engine
        .signal_in(&mut tx, s.instance_id, "go", "k1", &json!({"n": 2}))
        .await
        .unwrap();
    assert_eq!(
        (first, again),
        (SignalReceipt::Recorded, SignalReceipt::Duplicate)
    );
    sqlx::query("INSERT INTO flag (key, value) VALUES ('caller', 'write')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(
        st.output,
        Some(serde_json::to_value(SignalOutcome::Received(json!({"n": 1}))).unwrap())
    );
    assert_eq!(flags(db.pool()).await, 1);
    // Consumed: counted once, and taken back by the wait.
    assert_eq!(
        signals_and_commands(db.pool(), s.instance_id).await,
        (1, 1, 0)
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn signal_in_refusals_leave_the_callers_transaction_usable() {
    let db = database().await;
    let mut config = fast_config();
    config.max_open_signals = 1;
    let engine = engine(db.pool(), config);
    let ex = spawn(&engine);
    let done = engine.start::<Fails>("f", &7, opts()).await.unwrap();
    let waiting = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    until_status(&engine, done.instance_id, RunStatus::Failed).await;
    engine.cancel(done.instance_id).await.unwrap();
    until(&engine, waiting.instance_id, "signal wait", |s| {
        s.wait.is_some()
    })
    .await;
    engine
        .signal(waiting.instance_id, "other", "full", &json!(null))
        .await
        .unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    let unknown = Uuid::new_v4();
    let e = engine
        .signal_in(&mut tx, unknown, "go", "k", &json!(1))
        .await
        .unwrap_err();
    assert!(
        matches!(e, DurableError::InstanceNotFound(id) if id == unknown),
        "{e:?}"
    );
    let e = engine
        .signal_in(&mut tx, done.instance_id, "go", "k", &json!(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            DurableError::InstanceEnded {
                status: RunStatus::Cancelled,
                ..
            }
        ),
        "{e:?}"
    );
    let e = engine
        .signal_in(&mut tx, waiting.instance_id, "go", "k", &json!(1))
        .await
        .unwrap_err();
    assert!(
        matches!(e, DurableError::SignalLimit { limit: 1, .. }),
        "{e:?}"
    );
    let e = engine
        .signal_in(&mut tx, waiting.instance_id, "", "k", &json!(1))
        .await
        .unwrap_err();
    assert!(matches!(e, DurableError::InvalidInput(_)), "{e:?}");
    let dup = engine
        .signal_in(&mut tx, waiting.instance_id, "other", "full", &json!(1))
        .await
        .unwrap();
    assert_eq!(dup, SignalReceipt::Duplicate);
    // Still usable: a later statement runs and the commit keeps it.
    sqlx::query("INSERT INTO flag (key, value) VALUES ('caller', 'write')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(flags(db.pool()).await, 1);
    assert_eq!(
        signals_and_commands(db.pool(), waiting.instance_id).await,
        (1, 1, 1)
    );
    ex.shutdown().await;
}
