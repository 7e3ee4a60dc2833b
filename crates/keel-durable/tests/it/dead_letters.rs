//! Issue 32 §11, "dead-lettered starts that still completed": how a command exhausts its
//! attempts, and that a dead letter never leaves an accepted instance unstarted.
//!
//! Two ways spent a START's attempts in the kill test (10 kill -9s of the runner during
//! 500 concurrent starts): every claim spends one, so each crash at the dangerous point
//! (inside the body, before its settle) costs one; and every segment released on a
//! transient database failure (a 10-connection pool timing out under the burst after a
//! restart) cost one too, at a 200 ms backoff, so a few seconds of pool pressure
//! dead-lettered a START. The dead letter then left the instance as it was: when the
//! body had already queued its transaction, the verdict's SIGNAL completed it later
//! (what the kill test saw), and when it had not, nothing would ever run it.
//!
//! Now a transient database failure gives the attempt back, and a dead letter fails
//! its open instance `ATTEMPTS_EXHAUSTED` (retryable) in the claim that dead-letters
//! it, so no instance is left without a command that runs it.

use crate::common::*;
use keel_durable::{Engine, RunStatus};
use uuid::Uuid;

/// Instances that are open (not ended, not failed) but have nothing that would run
/// them: no queued or running command, no live lease, and not waiting for a signal or
/// timer (an accepted instance left unstarted, or stranded mid-way).
async fn stranded(pool: &sqlx::PgPool) -> Vec<Uuid> {
    sqlx::query_scalar(
        "SELECT i.id FROM durable_instance i
          WHERE i.status IN ('pending', 'running', 'suspended')
            AND (i.lease_expires_at IS NULL OR i.lease_expires_at <= now())
            AND NOT EXISTS (SELECT 1 FROM durable_command c
                             WHERE c.instance_id = i.id AND c.state IN ('queued', 'running'))",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The journal write of step `s0` fails with a serialization failure (SQLSTATE 40001, a
/// transient database error) for the first 8 statements that try it.
async fn fail_step_s0_writes(pool: &sqlx::PgPool) {
    for ddl in [
        "CREATE SEQUENCE journal_fail",
        "CREATE FUNCTION journal_fail() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.name = 's0' AND nextval('journal_fail') <= 8 THEN
                 RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
             END IF;
             RETURN NEW;
         END $$",
        "CREATE TRIGGER journal_fail BEFORE INSERT ON durable_journal
             FOR EACH ROW EXECUTE FUNCTION journal_fail()",
    ] {
        sqlx::query(ddl).execute(pool).await.unwrap();
    }
}

/// A START whose segments are released on transient database failures more often than
/// its attempts allow is not dead-lettered: each release gives the attempt back, and
/// the instance completes once the database answers. Before the fix the third claim
/// dead-lettered the START (2 attempts) and left the instance `running` with no
/// command.
#[tokio::test]
async fn transient_database_failures_do_not_spend_a_start_s_attempts() {
    let db = database().await;
    let pool = db.pool();
    fail_step_s0_writes(pool).await;
    let mut config = fast_config();
    config.command_max_attempts = 2;
    let engine = engine(pool, config);
    let ex = spawn(&engine);
    let s = engine
        .start::<Counter>(
            "flaky",
            &CounterInput {
                tag: "flaky".to_owned(),
                steps: 2,
            },
            opts(),
        )
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Completed).await;
    // The body ran once per released segment (its step is at-least-once): more
    // segments than attempts.
    assert!(effect(pool, "flaky-0").await >= 3, "the failures happened");
    let (state, attempt): (String, i32) =
        sqlx::query_as("SELECT state, attempt FROM durable_command WHERE kind = 'start'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(state, "done");
    assert!(attempt <= 2, "attempt {attempt}");
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_command WHERE state = 'dead'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(dead, 0);
    ex.shutdown().await;
}

/// An executor process SIGKILLed inside the first step of a START (its effect done,
/// its result not journaled) more often than the START's attempts allow: the claim
/// that finds the attempts spent dead-letters the START and fails the instance
/// `ATTEMPTS_EXHAUSTED`, retryable, in the same statement — it is never left open
/// with nothing to run it (before the fix it stayed `running`, with no command, for
/// ever). A retry resumes it and it completes; another instance, run by the last
/// worker, completes untouched.
#[tokio::test]
async fn a_start_dead_lettered_by_crashes_fails_its_instance_and_a_retry_completes_it() {
    let db = database().await;
    let pool = db.pool();
    let mut config = fast_config();
    config.command_max_attempts = 2;
    // The test records and reads; the worker processes execute.
    let engine = Engine::new(pool.clone(), config).unwrap();
    set_flag(pool, "hold-s0-x", "hold").await;
    let x = engine
        .start_json("test.crash", "x", "\"x\"", opts())
        .await
        .unwrap()
        .instance_id;
    // Two claims, each killed at the dangerous point.
    for kill in 1..=2 {
        let w = Worker::start(db.url());
        until_flag(pool, "at-hold-s0-x").await;
        assert_eq!(effect(pool, "x-s0").await, kill);
        drop(w);
        sqlx::query("DELETE FROM flag WHERE key = 'at-hold-s0-x'")
            .execute(pool)
            .await
            .unwrap();
    }
    // Another instance, run only by the next worker (never killed mid-segment).
    let y = engine
        .start_json("test.crash", "y", "\"y\"", opts())
        .await
        .unwrap()
        .instance_id;
    // The next claim (after the lease lapsed) finds the attempts spent.
    let w = Worker::start(db.url());
    let failed = until_status(&engine, x, RunStatus::Failed).await;
    let error = failed.error.expect("an error");
    assert_eq!(error.code, "ATTEMPTS_EXHAUSTED");
    assert!(error.retryable);
    let report = engine.idle_report().await.unwrap();
    assert!(
        report
            .dead
            .iter()
            .any(|d| d.instance_id == x && d.kind == "start"),
        "{report:?}"
    );
    assert_eq!(stranded(pool).await, Vec::<Uuid>::new());
    // The other instance ran meanwhile, up to its wait for the signal.
    until(&engine, y, "y waits for go", |s| {
        s.status == RunStatus::Waiting
    })
    .await;
    // A retry resumes the failed one from its journal.
    set_flag(pool, "hold-s0-x", "release").await;
    engine.retry(x).await.unwrap();
    until(&engine, x, "x waits for go", |s| {
        s.status == RunStatus::Waiting
    })
    .await;
    for id in [x, y] {
        engine.signal(id, "go", "go", &true).await.unwrap();
        until_status(&engine, id, RunStatus::Completed).await;
    }
    drop(w);
    // At-least-once steps: s0 ran in each killed claim and once more after the retry;
    // every later step once.
    assert_eq!(effect(pool, "x-s0").await, 3);
    assert_eq!(effect(pool, "x-s1").await, 1);
    assert_eq!(effect(pool, "x-s2").await, 1);
    assert_eq!(effect(pool, "y-s0").await, 1);
    assert_eq!(stranded(pool).await, Vec::<Uuid>::new());
}
