//! Idempotent start and serialization keys.

use crate::common::*;
use keel_durable::{DurableError, RunStatus, StartOptions};

#[tokio::test]
async fn same_key_same_input_returns_the_same_instance() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let input = CounterInput {
        tag: "x".into(),
        steps: 1,
    };
    let a = engine
        .start::<Counter>("key", &input, opts())
        .await
        .unwrap();
    let b = engine
        .start::<Counter>("key", &input, opts())
        .await
        .unwrap();
    assert!(a.created && !b.created);
    assert_eq!(a.instance_id, b.instance_id);
    // Same key, other workflow: a different instance.
    let c = engine.start::<Fails>("key", &1, opts()).await.unwrap();
    assert_ne!(c.instance_id, a.instance_id);
    let starts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_command WHERE kind = 'start'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(starts, 2);
}

#[tokio::test]
async fn same_key_different_input_is_a_conflict() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let a = engine
        .start::<Counter>(
            "key",
            &CounterInput {
                tag: "x".into(),
                steps: 1,
            },
            opts(),
        )
        .await
        .unwrap();
    let err = engine
        .start::<Counter>(
            "key",
            &CounterInput {
                tag: "secret-value".into(),
                steps: 1,
            },
            opts(),
        )
        .await
        .unwrap_err();
    match &err {
        DurableError::IdempotencyConflict { instance_id, .. } => {
            assert_eq!(*instance_id, a.instance_id)
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!err.to_string().contains("secret-value"));
    // JSON text with other key order and spacing is the same input.
    let t1 = engine
        .start_json("raw.wf", "k", r#"{"a": 1, "b": [1, 2]}"#, opts())
        .await
        .unwrap();
    let t2 = engine
        .start_json("raw.wf", "k", r#"{"b":[1,2],"a":1}"#, opts())
        .await
        .unwrap();
    assert_eq!(t1.instance_id, t2.instance_id);
}

#[tokio::test]
async fn reusing_the_key_of_a_failed_instance_returns_its_failure() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let a = engine.start::<Fails>("f", &1, opts()).await.unwrap();
    until_status(&engine, a.instance_id, RunStatus::Failed).await;
    let b = engine.start::<Fails>("f", &1, opts()).await.unwrap();
    assert_eq!(b.instance_id, a.instance_id);
    assert!(!b.created);
    assert_eq!(b.status, RunStatus::Failed);
    engine.await_idle(TIMEOUT).await.unwrap();
    let status = engine.status(a.instance_id).await.unwrap();
    assert_eq!(status.status, RunStatus::Failed, "no fresh attempt");
    ex.shutdown().await;
}

#[tokio::test]
async fn serialization_key_runs_instances_one_at_a_time_in_start_order() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let keyed = || StartOptions {
        serialization_key: Some("sender-1".into()),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for tag in ["a", "b", "c", "d"] {
        ids.push(
            engine
                .start::<Serial>(tag, &tag.to_owned(), keyed())
                .await
                .unwrap()
                .instance_id,
        );
    }
    // Two executors: parallelism is available, the key must still serialize.
    let e1 = spawn(&engine);
    let e2 = spawn(&engine);
    for id in &ids {
        until_status(&engine, *id, RunStatus::Completed).await;
    }
    let log: Vec<(String, String)> = sqlx::query_as("SELECT tag, what FROM event_log ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    let expected: Vec<(String, String)> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|t| {
            [
                (t.to_string(), "enter".to_owned()),
                (t.to_string(), "exit".to_owned()),
            ]
        })
        .collect();
    assert_eq!(log, expected);
    e1.shutdown().await;
    e2.shutdown().await;
}

#[tokio::test]
async fn different_serialization_keys_run_in_parallel() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let mut ids = Vec::new();
    for tag in ["a", "b"] {
        let options = StartOptions {
            serialization_key: Some(format!("key-{tag}")),
            ..Default::default()
        };
        ids.push(
            engine
                .start::<Serial>(tag, &tag.to_owned(), options)
                .await
                .unwrap()
                .instance_id,
        );
    }
    let ex = spawn(&engine);
    for id in &ids {
        until_status(&engine, *id, RunStatus::Completed).await;
    }
    // Both entered before either left: the two instances overlapped.
    let log: Vec<String> = sqlx::query_scalar("SELECT what FROM event_log ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(log, ["enter", "enter", "exit", "exit"]);
    ex.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_starts_combined_into_batches_keep_the_idempotency_rules() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let input = |tag: &str| CounterInput {
        tag: tag.into(),
        steps: 1,
    };
    // A failed instance, whose key returns its failure.
    let failed = engine.start::<Fails>("failed", &7, opts()).await.unwrap();
    let ex = spawn(&engine);
    until_status(&engine, failed.instance_id, RunStatus::Failed).await;
    ex.shutdown().await;
    // Many concurrent starts (combined into multi-row statements): 30 distinct keys,
    // "dup" started 20 times with the same input and 5 times with another, and the
    // failed key again.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let engine = engine.clone();
        let input = input(&format!("k{i}"));
        tasks.spawn(async move {
            (
                "distinct",
                engine
                    .start::<Counter>(&format!("k{i}"), &input, opts())
                    .await,
            )
        });
    }
    for i in 0..25 {
        let engine = engine.clone();
        let input = input(if i % 5 == 4 { "other" } else { "same" });
        let what = if i % 5 == 4 { "dup-other" } else { "dup-same" };
        tasks.spawn(async move { (what, engine.start::<Counter>("dup", &input, opts()).await) });
    }
    {
        let engine = engine.clone();
        tasks.spawn(async move { ("failed", engine.start::<Fails>("failed", &7, opts()).await) });
    }
    let mut created = 0;
    let mut dup_ids = std::collections::HashSet::new();
    let mut conflicts = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            ("distinct", Ok(s)) => {
                assert!(s.created && s.status == RunStatus::Pending);
                created += 1;
            }
            ("failed", Ok(s)) => {
                assert!(!s.created);
                assert_eq!(s.instance_id, failed.instance_id);
                assert_eq!(s.status, RunStatus::Failed, "no fresh attempt");
            }
            (_, Ok(s)) => {
                if s.created {
                    created += 1;
                }
                dup_ids.insert(s.instance_id);
            }
            (_, Err(DurableError::IdempotencyConflict { .. })) => conflicts += 1,
            (what, Err(e)) => panic!("{what}: {e}"),
        }
    }
    assert_eq!(dup_ids.len(), 1, "one instance for the duplicated key");
    assert_eq!(created, 31, "30 distinct keys and one of the duplicates");
    // Whichever input won, the starts with the other one are conflicts.
    let winner_same: bool = sqlx::query_scalar(
        "SELECT input->>'tag' = 'same' FROM durable_instance WHERE idempotency_key = 'dup'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(conflicts, if winner_same { 5 } else { 20 });
    let (instances, starts): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM durable_instance),
                (SELECT count(*) FROM durable_command WHERE kind = 'start')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (instances, starts),
        (32, 32),
        "one instance and one START per key"
    );
}

fn keyed(key: &str) -> StartOptions {
    StartOptions {
        serialization_key: Some(key.into()),
        ..Default::default()
    }
}

/// Starts the `Serial` instance `b` behind whatever holds `asset-1`.
async fn serial_behind(engine: &keel_durable::Engine) -> uuid::Uuid {
    engine
        .start::<Serial>("b", &"b".to_owned(), keyed("asset-1"))
        .await
        .unwrap()
        .instance_id
}

/// A business failure releases the key: the next instance of the same key runs (it used
/// to stay `pending` behind the failed one for good).
#[tokio::test]
async fn a_failed_instance_releases_its_serialization_key() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let failed = engine
        .start::<Fails>("f", &1, keyed("asset-1"))
        .await
        .unwrap();
    let next = serial_behind(&engine).await;
    let ex = spawn(&engine);
    until_status(&engine, failed.instance_id, RunStatus::Failed).await;
    until_status(&engine, next, RunStatus::Completed).await;
    ex.shutdown().await;
}

/// A waiting instance (for an approval, a verdict, funding) does not hold the key: the
/// instance behind it runs to completion while it still waits, and it completes itself
/// when its signal arrives.
#[tokio::test]
async fn a_waiting_instance_does_not_block_the_next_of_its_key() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let waiting = engine
        .start::<Waiter>("w", &waiter("approval", None, None), keyed("asset-1"))
        .await
        .unwrap();
    let next = serial_behind(&engine).await;
    let ex = spawn(&engine);
    until_status(&engine, next, RunStatus::Completed).await;
    assert_eq!(
        engine.status(waiting.instance_id).await.unwrap().status,
        RunStatus::Waiting
    );
    engine
        .signal(
            waiting.instance_id,
            "approval",
            "d1",
            &serde_json::json!(true),
        )
        .await
        .unwrap();
    until_status(&engine, waiting.instance_id, RunStatus::Completed).await;
    ex.shutdown().await;
}

/// A suspended instance (a step interrupted by an infrastructure fault) keeps the key;
/// the instance behind it is `pending` and names it as the one it is queued behind, and
/// runs once the suspended one recovers.
#[tokio::test]
async fn a_suspended_instance_holds_its_key_and_is_named_as_the_blocker() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let suspended = engine
        .start::<Dependency>("d", &"d".to_owned(), keyed("asset-1"))
        .await
        .unwrap();
    let behind = serial_behind(&engine).await;
    let ex = spawn(&engine);
    until_status(&engine, suspended.instance_id, RunStatus::Suspended).await;
    let status = engine.status(behind).await.unwrap();
    assert_eq!(status.status, RunStatus::Pending);
    assert_eq!(status.queued_behind, Some(suspended.instance_id));
    let entered: i64 = sqlx::query_scalar("SELECT count(*) FROM event_log WHERE tag = 'b'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        entered, 0,
        "the instance behind a suspended one must not run"
    );
    set_flag(db.pool(), "dep", "up").await;
    until_status(&engine, suspended.instance_id, RunStatus::Completed).await;
    let done = until_status(&engine, behind, RunStatus::Completed).await;
    assert_eq!(done.queued_behind, None);
    ex.shutdown().await;
}

/// `ctx.cancel_self()` ends the instance `cancelled`, and it releases its key.
#[tokio::test]
async fn a_body_can_end_its_instance_cancelled() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let me = engine
        .start::<SelfCancel>("c", &(), keyed("asset-1"))
        .await
        .unwrap();
    let next = serial_behind(&engine).await;
    let ex = spawn(&engine);
    let status = until_status(&engine, me.instance_id, RunStatus::Cancelled).await;
    assert!(status.ended_at.is_some());
    until_status(&engine, next, RunStatus::Completed).await;
    ex.shutdown().await;
}
