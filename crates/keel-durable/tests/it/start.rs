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
