//! Cancel and retry semantics, suspension and recovery, dead letters.

use crate::common::*;
use keel_durable::{CancelOutcome, DurableError, RunStatus};
use serde_json::json;

#[tokio::test]
async fn cancel_of_a_waiting_instance_is_immediate() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", Some(60_000), None), opts())
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Waiting).await;
    assert_eq!(
        engine.cancel(s.instance_id).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let st = engine.status(s.instance_id).await.unwrap();
    assert_eq!(st.status, RunStatus::Cancelled);
    assert!(st.ended_at.is_some());
    // Its timer is settled, not left to fire.
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.deferred.is_empty());
    assert!(matches!(
        engine.cancel(s.instance_id).await,
        Err(DurableError::InstanceEnded { .. })
    ));
    assert!(matches!(
        engine.retry(s.instance_id).await,
        Err(DurableError::InstanceEnded { .. })
    ));
    ex.shutdown().await;
}

#[tokio::test]
async fn cancel_of_a_running_instance_stops_at_the_next_step_boundary() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Gated>("g", &"g".to_owned(), opts())
        .await
        .unwrap();
    until_db(
        db.pool(),
        "step b running",
        "SELECT EXISTS (SELECT 1 FROM effect WHERE key = 'g-b')",
    )
    .await;
    assert_eq!(
        engine.cancel(s.instance_id).await.unwrap(),
        CancelOutcome::Requested
    );
    assert_eq!(
        engine.status(s.instance_id).await.unwrap().status,
        RunStatus::Running
    );
    set_flag(db.pool(), "gate-g", "open").await;
    let st = until_status(&engine, s.instance_id, RunStatus::Cancelled).await;
    assert!(st.output.is_none());
    assert_eq!(effect(db.pool(), "g-b").await, 1);
    assert_eq!(effect(db.pool(), "g-c").await, 0, "stopped before step c");
    assert_eq!(
        journal_len(db.pool(), s.instance_id).await,
        2,
        "step b's result was kept"
    );
    engine.await_idle(TIMEOUT).await.unwrap();
    let outcomes: Vec<(String, String)> = sqlx::query_as(
        "SELECT kind, outcome FROM durable_command WHERE instance_id = $1 ORDER BY id",
    )
    .bind(s.instance_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        outcomes,
        vec![
            ("start".to_owned(), "cancelled".to_owned()),
            ("cancel".to_owned(), "instance_cancelled".to_owned())
        ]
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn retry_is_refused_unless_failed_or_suspended() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Waiting).await;
    assert!(matches!(
        engine.retry(s.instance_id).await,
        Err(DurableError::NotRetryable {
            status: RunStatus::Waiting,
            ..
        })
    ));
    let c = engine
        .start::<Counter>(
            "c",
            &CounterInput {
                tag: "c".into(),
                steps: 1,
            },
            opts(),
        )
        .await
        .unwrap();
    until_status(&engine, c.instance_id, RunStatus::Completed).await;
    assert!(matches!(
        engine.retry(c.instance_id).await,
        Err(DurableError::InstanceEnded {
            status: RunStatus::Completed,
            ..
        })
    ));
    assert!(matches!(
        engine.cancel(c.instance_id).await,
        Err(DurableError::InstanceEnded {
            status: RunStatus::Completed,
            ..
        })
    ));
    ex.shutdown().await;
}

#[tokio::test]
async fn failed_instance_can_be_cancelled() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine.start::<Fails>("f", &1, opts()).await.unwrap();
    until_status(&engine, s.instance_id, RunStatus::Failed).await;
    assert_eq!(
        engine.cancel(s.instance_id).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        engine.status(s.instance_id).await.unwrap().status,
        RunStatus::Cancelled
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn suspended_instance_recovers_automatically_when_the_dependency_returns() {
    let db = database().await;
    let mut config = fast_config();
    config.step_attempts = 2;
    let engine = engine(db.pool(), config);
    let ex = spawn(&engine);
    let s = engine
        .start::<Dependency>("d", &"d".to_owned(), opts())
        .await
        .unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Suspended).await;
    let err = st.error.unwrap();
    assert_eq!(err.code, "DEP_DOWN");
    assert!(err.retryable);
    assert_eq!(
        journal_len(db.pool(), s.instance_id).await,
        0,
        "nothing journaled"
    );
    // Recovery attempts keep running with backoff while the dependency is down.
    until_db(
        db.pool(),
        "two recoveries",
        "SELECT count(*) >= 2 FROM durable_command WHERE kind = 'retry' AND state = 'done'",
    )
    .await;
    set_flag(db.pool(), "dep", "up").await;
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("answer")));
    assert!(st.error.is_none());
    let recovery: i32 =
        sqlx::query_scalar("SELECT recovery_attempts FROM durable_instance WHERE id = $1")
            .bind(s.instance_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(recovery, 0);
    ex.shutdown().await;
}

#[tokio::test]
async fn manual_retry_of_a_suspended_instance() {
    let db = database().await;
    let mut config = fast_config();
    config.step_attempts = 1;
    config.recovery_backoff = keel_durable::Backoff {
        base: std::time::Duration::from_secs(3600),
        cap: std::time::Duration::from_secs(3600),
    };
    let engine = engine(db.pool(), config);
    let ex = spawn(&engine);
    let s = engine
        .start::<Dependency>("d", &"d".to_owned(), opts())
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Suspended).await;
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert_eq!(report.deferred.len(), 1, "the recovery is scheduled");
    set_flag(db.pool(), "dep", "up").await;
    engine.retry(s.instance_id).await.unwrap();
    until_status(&engine, s.instance_id, RunStatus::Completed).await;
    // The scheduled recovery was settled with the instance.
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.deferred.is_empty());
    ex.shutdown().await;
}

#[tokio::test]
async fn command_is_dead_lettered_after_max_attempts() {
    let db = database().await;
    let mut config = fast_config();
    config.command_max_attempts = 3;
    let engine = engine(db.pool(), config);
    let ex = spawn(&engine);
    let s = engine.start::<Panics>("p", &(), opts()).await.unwrap();
    // Released attempts wait out a backoff (deferred, not runnable): wait for the dead
    // letter itself, then the probe lists it.
    until_db(
        db.pool(),
        "dead letter",
        "SELECT EXISTS (SELECT 1 FROM durable_command WHERE state = 'dead')",
    )
    .await;
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.deferred.is_empty());
    assert_eq!(report.dead.len(), 1);
    let dead = &report.dead[0];
    assert_eq!(dead.instance_id, s.instance_id);
    assert_eq!(dead.kind, "start");
    assert_eq!(
        dead.attempt, 3,
        "three attempts ran; the next claim dead-lettered it"
    );
    assert_eq!(dead.last_error.as_deref(), Some("PANICKED"));
    // Issue 32 §11: the dead letter does not strand the instance: the claim that
    // dead-lettered its START failed it, typed and retryable.
    let st = engine.status(s.instance_id).await.unwrap();
    assert_eq!(st.status, RunStatus::Failed, "{st:?}");
    let error = st.error.expect("an error");
    assert_eq!(error.code, "ATTEMPTS_EXHAUSTED");
    assert!(error.retryable);
    assert_eq!(
        error.detail,
        Some(serde_json::json!({"command": "start", "attempts": 3}))
    );
    ex.shutdown().await;
}

/// The ended-instance table of the crate docs, command by command.
#[tokio::test]
async fn commands_meeting_ended_or_failed_instances() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let completed = engine
        .start::<Counter>(
            "c",
            &CounterInput {
                tag: "c".into(),
                steps: 1,
            },
            opts(),
        )
        .await
        .unwrap()
        .instance_id;
    let failed = engine
        .start::<Fails>("f", &1, opts())
        .await
        .unwrap()
        .instance_id;
    let cancelled = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap()
        .instance_id;
    until_status(&engine, completed, RunStatus::Completed).await;
    until_status(&engine, failed, RunStatus::Failed).await;
    until_status(&engine, cancelled, RunStatus::Waiting).await;
    engine.cancel(cancelled).await.unwrap();
    ex.shutdown().await;
    // Record every kind against each instance directly (the API refuses most of them).
    for id in [completed, failed, cancelled] {
        for kind in ["start", "signal", "timer", "retry", "cancel"] {
            sqlx::query(
                "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, $2, 3)",
            )
            .bind(id)
            .bind(kind)
            .execute(db.pool())
            .await
            .unwrap();
        }
    }
    let ex = spawn(&engine);
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.dead.is_empty());
    let pool = db.pool().clone();
    let last5 = |id| {
        let pool = pool.clone();
        async move {
            let mut v: Vec<String> = sqlx::query_scalar(
                "SELECT kind || ':' || outcome FROM durable_command WHERE instance_id = $1
              ORDER BY id DESC LIMIT 5",
            )
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
            v.reverse();
            v
        }
    };
    assert_eq!(
        last5(completed).await,
        [
            "start:stale",
            "signal:rejected",
            "timer:stale",
            "retry:stale",
            "cancel:stale"
        ]
    );
    assert_eq!(
        last5(cancelled).await,
        [
            "start:cancelled",
            "signal:cancelled",
            "timer:cancelled",
            "retry:cancelled",
            "cancel:cancelled"
        ]
    );
    assert_eq!(
        last5(failed).await,
        [
            "start:stale",
            "signal:parked",
            "timer:stale",
            "retry:stale",
            "cancel:cancelled"
        ]
    );
    assert_eq!(
        engine.status(failed).await.unwrap().status,
        RunStatus::Cancelled
    );
    assert_eq!(
        engine.status(completed).await.unwrap().status,
        RunStatus::Completed
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn purge_deletes_old_settled_commands_and_ended_instances_in_batches() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let mut ids = Vec::new();
    for i in 0..3 {
        let tag = format!("p{i}");
        ids.push(
            engine
                .start::<Counter>(
                    &tag,
                    &CounterInput {
                        tag: tag.clone(),
                        steps: 1,
                    },
                    opts(),
                )
                .await
                .unwrap()
                .instance_id,
        );
    }
    let live = engine
        .start::<Waiter>("live", &waiter("go", None, None), opts())
        .await
        .unwrap()
        .instance_id;
    for id in &ids {
        until_status(&engine, *id, RunStatus::Completed).await;
    }
    until_status(&engine, live, RunStatus::Waiting).await;
    // Nothing is old enough under a one-hour window.
    let none = engine
        .purge(std::time::Duration::from_secs(3600), 100)
        .await
        .unwrap();
    assert_eq!((none.commands, none.instances), (0, 0));
    let first = engine.purge(std::time::Duration::ZERO, 2).await.unwrap();
    assert_eq!((first.commands, first.instances), (2, 2));
    let second = engine.purge(std::time::Duration::ZERO, 100).await.unwrap();
    assert_eq!(second.instances, 1);
    assert!(
        engine.status(live).await.is_ok(),
        "a waiting instance is kept"
    );
    for id in &ids {
        assert!(matches!(
            engine.status(*id).await,
            Err(DurableError::InstanceNotFound(_))
        ));
    }
    ex.shutdown().await;
}
