//! Replay: journaled results are returned without running; the interrupted step runs
//! again; determinism violations fail the instance; typed step errors survive.

use crate::common::*;
use keel_durable::{RunStatus, SignalReceipt};
use serde_json::json;

#[tokio::test]
async fn completes_and_journals_every_step() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Counter>(
            "k1",
            &CounterInput {
                tag: "t".into(),
                steps: 3,
            },
            opts(),
        )
        .await
        .unwrap();
    assert!(s.created);
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!(3)));
    assert_eq!(st.progress, Some(json!({ "done": 3 })));
    assert!(st.ended_at.is_some());
    assert_eq!(journal_len(db.pool(), s.instance_id).await, 3);
    for i in 0..3 {
        assert_eq!(effect(db.pool(), &format!("t-{i}")).await, 1);
    }
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.dead.is_empty() && report.deferred.is_empty());
    ex.shutdown().await;
}

#[tokio::test]
async fn replay_skips_journaled_steps_and_reruns_the_interrupted_one() {
    let db = database().await;
    let mut config = fast_config();
    config.lease = std::time::Duration::from_secs(1);
    let engine = engine(db.pool(), config);
    let first = spawn(&engine);
    let s = engine
        .start::<Gated>("g", &"g".to_owned(), opts())
        .await
        .unwrap();
    // Step b is running (and hangs): kill the executor there.
    until_db(
        db.pool(),
        "step b running",
        "SELECT EXISTS (SELECT 1 FROM effect WHERE key = 'g-b')",
    )
    .await;
    first.abort().await;
    set_flag(db.pool(), "gate-g", "open").await;
    let second = spawn(&engine);
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("g")));
    assert_eq!(
        effect(db.pool(), "g-a").await,
        1,
        "journaled step ran again"
    );
    assert_eq!(
        effect(db.pool(), "g-b").await,
        2,
        "interrupted step runs again"
    );
    assert_eq!(effect(db.pool(), "g-c").await, 1);
    // The START command was claimed twice (the crash spent an attempt).
    let attempts: i32 = sqlx::query_scalar(
        "SELECT attempt FROM durable_command WHERE instance_id = $1 AND kind = 'start'",
    )
    .bind(s.instance_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(attempts, 2);
    second.shutdown().await;
}

#[tokio::test]
async fn determinism_violation_fails_the_instance_and_retry_resumes_after_a_fix() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    set_flag(db.pool(), "variant", "one").await;
    let s = engine
        .start::<Nondet>("n", &"n".to_owned(), opts())
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Waiting).await;
    // The "code" changes: the body now asks for a different first step.
    set_flag(db.pool(), "variant", "two").await;
    assert_eq!(
        engine
            .signal(s.instance_id, "go", "go-1", &json!({}))
            .await
            .unwrap(),
        SignalReceipt::Recorded
    );
    let st = until_status(&engine, s.instance_id, RunStatus::Failed).await;
    let err = st.error.unwrap();
    assert_eq!(err.code, "DETERMINISM_VIOLATION");
    assert!(!err.message.contains("first-"), "message names no value");
    assert_eq!(effect(db.pool(), "n-first").await, 1);
    // Fix the "code" and retry: resumes from the journal, the first step is not re-run,
    // the parked signal is consumed.
    set_flag(db.pool(), "variant", "one").await;
    engine.retry(s.instance_id).await.unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("one")));
    assert!(st.error.is_none());
    assert_eq!(effect(db.pool(), "n-first").await, 1);
    ex.shutdown().await;
}

#[tokio::test]
async fn typed_step_error_is_journaled_and_replayed() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Typed>("t", &"t".to_owned(), opts())
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Waiting).await;
    let stored: serde_json::Value =
        sqlx::query_scalar("SELECT result FROM durable_journal WHERE instance_id = $1 AND seq = 0")
            .bind(s.instance_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        stored,
        json!({ "err": { "NotFound": { "what": "system" } } })
    );
    engine.signal(s.instance_id, "go", "go", &1).await.unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("missing system")));
    assert_eq!(
        effect(db.pool(), "t-lookup").await,
        1,
        "replayed, not re-run"
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn workflow_failure_is_visible_with_code_and_detail() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine.start::<Fails>("f", &7, opts()).await.unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Failed).await;
    let err = st.error.unwrap();
    assert_eq!(err.code, "WORKFLOW_FAILED");
    assert!(!err.retryable);
    assert_eq!(err.detail, Some(json!("refused 7")));
    assert!(!err.message.contains("refused"));
    ex.shutdown().await;
}

#[tokio::test]
async fn now_uuid_and_random_are_journaled() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine.start::<Values>("v", &(), opts()).await.unwrap();
    until_status(&engine, s.instance_id, RunStatus::Waiting).await;
    engine.signal(s.instance_id, "go", "go", &()).await.unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    let journal: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT result -> 'ok' FROM durable_journal WHERE instance_id = $1 AND seq < 3 ORDER BY seq",
    )
    .bind(s.instance_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let (now, id, r): (chrono::DateTime<chrono::Utc>, uuid::Uuid, u64) =
        serde_json::from_value(st.output.unwrap()).unwrap();
    let journaled_now: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(journal[0].clone()).unwrap();
    assert_eq!(now, journaled_now);
    assert_eq!(json!(id), journal[1]);
    assert_eq!(json!(r.to_string()), journal[2]);
    ex.shutdown().await;
}

#[tokio::test]
async fn child_workflow_is_started_once_and_awaited() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Parent>("p", &"counter".to_owned(), opts())
        .await
        .unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("sum 2")));
    let children: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT id, idempotency_key FROM durable_instance WHERE parent_id = $1")
            .bind(s.instance_id)
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].1, format!("{}:c1", s.instance_id));
    assert_eq!(effect(db.pool(), "child-0").await, 1);
    assert_eq!(effect(db.pool(), "child-1").await, 1);
    ex.shutdown().await;
}

#[tokio::test]
async fn cancelled_child_is_reported_to_its_parent() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let s = engine
        .start::<Parent>("p", &"waiter".to_owned(), opts())
        .await
        .unwrap();
    let st = until(&engine, s.instance_id, "child started", |s| {
        s.status == RunStatus::Waiting && s.progress.is_some()
    })
    .await;
    let child: uuid::Uuid = serde_json::from_value(st.progress.unwrap()["child"].clone()).unwrap();
    until_status(&engine, child, RunStatus::Waiting).await;
    engine.cancel(child).await.unwrap();
    let st = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(st.output, Some(json!("cancelled")));
    ex.shutdown().await;
}
