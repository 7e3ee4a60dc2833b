//! Several executors on one database: leases, fencing, wake-ups.

use std::time::Duration;

use crate::common::*;
use keel_durable::{ExecutorConfig, RunStatus};
use serde_json::json;

#[tokio::test]
async fn two_executors_never_run_segments_of_one_instance_concurrently() {
    let db = database().await;
    let engine_a = engine(db.pool(), fast_config());
    let engine_b = engine(db.pool(), fast_config());
    let a = spawn(&engine_a);
    let b = spawn(&engine_b);
    let mut ids = Vec::new();
    for i in 0..12 {
        let tag = format!("x{i}");
        ids.push(
            engine_a
                .start::<Exclusive>(&tag, &tag, opts())
                .await
                .unwrap()
                .instance_id,
        );
    }
    // Signals race the segments: many commands per instance, claimed by both executors.
    for round in 0..3 {
        for id in &ids {
            engine_b
                .signal(*id, &format!("ping{round}"), &format!("r{round}"), &round)
                .await
                .unwrap();
        }
    }
    for id in &ids {
        let st = until_status(&engine_a, *id, RunStatus::Completed).await;
        assert_eq!(st.output, Some(json!(3)));
    }
    let violations: i64 = sqlx::query_scalar("SELECT count(*) FROM violation")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(violations, 0, "two segments of one instance overlapped");
    // Both executors did work.
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_stalled_executor_whose_lease_lapsed_is_fenced_out_when_it_wakes() {
    let db = database().await;
    let mut config = fast_config();
    config.lease = Duration::from_secs(1);
    // Executor A stalls: it stops renewing (as a paused process would) and its step hangs.
    let engine_a = engine(db.pool(), config.clone());
    let stalled = engine_a
        .spawn_executor(ExecutorConfig {
            renew_leases: false,
            ..executor_config()
        })
        .unwrap();
    let s = engine_a
        .start::<Stall>("s", &"s".to_owned(), opts())
        .await
        .unwrap();
    until_db(
        db.pool(),
        "A runs step slow",
        "SELECT EXISTS (SELECT 1 FROM effect WHERE key = 's-slow')",
    )
    .await;
    // B claims once A's lease has lapsed, runs the step again and completes the instance.
    let engine_b = engine(db.pool(), config);
    let b = spawn(&engine_b);
    let st = until_status(&engine_b, s.instance_id, RunStatus::Completed).await;
    assert_eq!(
        st.output,
        Some(json!(2)),
        "B's run of the step is the journaled one"
    );
    // A wakes up late: its journal write is fenced and changes nothing.
    set_flag(db.pool(), "release", "yes").await;
    stalled.shutdown().await;
    let journal: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT name, result FROM durable_journal WHERE instance_id = $1 ORDER BY seq",
    )
    .bind(s.instance_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        journal,
        vec![
            ("slow".to_owned(), json!({ "ok": 2 })),
            ("after".to_owned(), json!({ "ok": 1 }))
        ]
    );
    assert_eq!(effect(db.pool(), "s-slow").await, 2);
    assert_eq!(
        effect(db.pool(), "s-after").await,
        1,
        "A never ran the next step"
    );
    let st = engine_b.status(s.instance_id).await.unwrap();
    assert_eq!(st.status, RunStatus::Completed);
    assert_eq!(st.output, Some(json!(2)));
    b.shutdown().await;
}

#[tokio::test]
async fn work_flows_after_the_listen_connection_is_terminated() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    // A poll interval far beyond the test's patience: only notifications can wake it.
    let ex = engine
        .spawn_executor(ExecutorConfig {
            poll_interval: Duration::from_secs(3600),
            ..executor_config()
        })
        .unwrap();
    let listener_pid = || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT max(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let mut pid = None;
    while pid.is_none() {
        pid = listener_pid().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = engine
        .start::<Counter>(
            "one",
            &CounterInput {
                tag: "one".into(),
                steps: 1,
            },
            opts(),
        )
        .await
        .unwrap();
    until_status(&engine, first.instance_id, RunStatus::Completed).await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(killed);
    // Wait for the listener to come back on a new backend.
    loop {
        let now = listener_pid().await;
        if now.is_some() && now != pid {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = engine
        .start::<Counter>(
            "two",
            &CounterInput {
                tag: "two".into(),
                steps: 1,
            },
            opts(),
        )
        .await
        .unwrap();
    engine
        .await_idle(Duration::from_secs(10))
        .await
        .expect("work flowed without waiting for the poll");
    assert_eq!(
        engine.status(second.instance_id).await.unwrap().status,
        RunStatus::Completed
    );
    ex.shutdown().await;
}

/// Once a claim comes back short, the executor stops claiming on every segment end and
/// waits for a notification (issue 25): every kind of new work must still wake it. The
/// poll interval and the lease are far beyond the test's patience, so only notifications
/// (and the next-due timer of a released command) can.
#[tokio::test]
async fn a_drained_executor_is_woken_by_every_kind_of_new_work_without_the_poll() {
    let db = database().await;
    let mut config = fast_config();
    config.command_max_attempts = 3;
    // Nor the lapse of a lease (the next-due query also times the earliest expiry).
    config.lease = Duration::from_secs(3600);
    let engine = engine(db.pool(), config);
    let ex = engine
        .spawn_executor(ExecutorConfig {
            poll_interval: Duration::from_secs(3600),
            ..executor_config()
        })
        .unwrap();
    let counter = |tag: &str| CounterInput {
        tag: tag.to_owned(),
        steps: 2,
    };
    // A backlog (more instances than the 4 slots): settles chain the next commands.
    let mut ids = Vec::new();
    for i in 0..10 {
        let tag = format!("burst{i}");
        ids.push(
            engine
                .start::<Counter>(&tag, &counter(&tag), opts())
                .await
                .unwrap()
                .instance_id,
        );
    }
    for id in &ids {
        until_status(&engine, *id, RunStatus::Completed).await;
    }
    engine
        .await_idle(TIMEOUT)
        .await
        .expect("the backlog drained");
    // Drained: new starts are claimed on their notification.
    let mut later = Vec::new();
    for i in 0..3 {
        let tag = format!("later{i}");
        later.push(
            engine
                .start::<Counter>(&tag, &counter(&tag), opts())
                .await
                .unwrap()
                .instance_id,
        );
    }
    for id in &later {
        until_status(&engine, *id, RunStatus::Completed).await;
    }
    // A signal to a waiting instance, and a timer (its TIMER notifies; the next-due
    // query times its claim).
    let waiting = engine
        .start::<Waiter>(
            "w",
            &WaiterInput {
                signal: "go".into(),
                deadline_ms: None,
                sleep_ms: None,
            },
            opts(),
        )
        .await
        .unwrap();
    let sleeping = engine
        .start::<Waiter>(
            "s",
            &WaiterInput {
                signal: "go".into(),
                deadline_ms: None,
                sleep_ms: Some(50),
            },
            opts(),
        )
        .await
        .unwrap();
    for id in [waiting.instance_id, sleeping.instance_id] {
        until_status(&engine, id, RunStatus::Waiting).await;
        engine
            .await_idle(TIMEOUT)
            .await
            .expect("idle while waiting");
        engine.signal(id, "go", "go-1", &json!(1)).await.unwrap();
        until_status(&engine, id, RunStatus::Completed).await;
    }
    // A released command (a panic) is due again after its backoff, with no notification:
    // the segment's end sends the loop round to its next-due query, which times the
    // claim; the third attempt's release is followed by the dead-lettering claim.
    engine.start::<Panics>("p", &(), opts()).await.unwrap();
    until_db(
        db.pool(),
        "the panicking command dead-lettered after its released attempts",
        "SELECT EXISTS (SELECT 1 FROM durable_command WHERE state = 'dead' AND attempt = 3)",
    )
    .await;
    ex.shutdown().await;
}

#[tokio::test]
async fn shutdown_within_aborts_a_hung_segment_and_another_executor_takes_over() {
    let db = database().await;
    let mut config = fast_config();
    config.lease = Duration::from_secs(1);
    let engine = engine(db.pool(), config);
    let first = spawn(&engine);
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
    assert!(!first.shutdown_within(Duration::from_millis(100)).await);
    set_flag(db.pool(), "gate-g", "open").await;
    let second = spawn(&engine);
    until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(effect(db.pool(), "g-b").await, 2);
    assert!(second.shutdown_within(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn probe_reports_stuck_commands_when_not_idle() {
    let db = database().await;
    let mut config = fast_config();
    config.stuck_after = Duration::ZERO;
    let engine = engine(db.pool(), config);
    let ex = spawn(&engine);
    // No executor runs this workflow: its START stays runnable.
    let s = engine
        .start_json("not.registered", "k", "{}", opts())
        .await
        .unwrap();
    let err = engine
        .await_idle(Duration::from_millis(100))
        .await
        .unwrap_err();
    let keel_durable::DurableError::NotIdle(report) = err else {
        panic!("expected NotIdle");
    };
    assert_eq!(report.runnable, 1);
    assert_eq!(report.stuck.len(), 1);
    assert_eq!(report.stuck[0].instance_id, s.instance_id);
    assert_eq!(report.stuck[0].state, "queued");
    assert_eq!(
        report.to_string(),
        "1 runnable, 0 deferred, 0 dead, 1 stuck"
    );
    ex.shutdown().await;
}

#[tokio::test]
async fn a_journal_write_that_does_not_renew_the_lease_is_still_fenced_by_the_token() {
    let db = database().await;
    let mut config = fast_config();
    // A long lease: the write after step b comes well within a third of it, so it only
    // share-locks the instance row (no renewal) and must still check the token.
    config.lease = Duration::from_secs(60);
    let engine = engine(db.pool(), config);
    let ex = engine
        .spawn_executor(ExecutorConfig {
            renew_leases: false,
            ..executor_config()
        })
        .unwrap();
    let s = engine
        .start::<Gated>("f", &"f".to_owned(), opts())
        .await
        .unwrap();
    until_db(
        db.pool(),
        "step b running",
        "SELECT EXISTS (SELECT 1 FROM effect WHERE key = 'f-b')",
    )
    .await;
    // Another owner takes the instance (what a claim after a lapsed lease does).
    sqlx::query("UPDATE durable_instance SET lease_token = gen_random_uuid() WHERE id = $1")
        .bind(s.instance_id)
        .execute(db.pool())
        .await
        .unwrap();
    set_flag(db.pool(), "gate-f", "open").await;
    // Shutdown waits for the segment: its write of b is fenced and it stops there.
    ex.shutdown().await;
    let journal: Vec<String> =
        sqlx::query_scalar("SELECT name FROM durable_journal WHERE instance_id = $1 ORDER BY seq")
            .bind(s.instance_id)
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        journal,
        vec!["a".to_owned()],
        "the fenced write made nothing"
    );
    assert_eq!(
        effect(db.pool(), "f-c").await,
        0,
        "the segment stopped at b"
    );
    assert_eq!(
        engine.status(s.instance_id).await.unwrap().status,
        RunStatus::Running,
        "the fenced segment did not settle"
    );
}
