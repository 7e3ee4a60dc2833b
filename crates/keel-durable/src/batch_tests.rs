//! Tests of the batched (group-commit) writes against a real database: a row whose
//! lease token is stale is refused while the others of its batch commit; a row that
//! fails does not fail its neighbours; no write is lost or duplicated under concurrency.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use keel_store::testing::TestDatabase;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::batch::{BatchOp, Combiner, Held};
use crate::context::{JournalOp, JournalValue, JournalWrite};
use crate::executor::{SettleOp, SettleRow};

/// An instance of `w` holding a live lease with `token`, and its running START.
async fn leased(pool: &PgPool, token: Uuid) -> (Uuid, i64) {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO durable_instance (id, workflow, idempotency_key, input, status, lease_token, lease_expires_at)
         VALUES ($1, 'w', $1::text, '{}', 'running', $2, now() + interval '1 minute')",
    )
    .bind(id)
    .bind(token)
    .execute(pool)
    .await
    .unwrap();
    let command: i64 = sqlx::query_scalar(
        "INSERT INTO durable_command (instance_id, kind, max_attempts, state, attempt)
         VALUES ($1, 'start', 5, 'running', 1) RETURNING id",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    (id, command)
}

/// A pending instance of `w` with a queued START.
async fn queued(pool: &PgPool) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO durable_instance (id, workflow, idempotency_key, input) VALUES ($1, 'w', $1::text, '{}')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, 'start', 5)",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

fn step(instance_id: Uuid, token: Uuid, seq: i32, renew: bool) -> JournalWrite {
    JournalWrite {
        instance_id,
        token,
        seq,
        kind: "step",
        name: format!("s{seq}"),
        value: JournalValue::Result(json!({ "ok": seq }).to_string()),
        renew,
        progress: renew.then(|| json!({ "at": seq }).to_string()),
    }
}

fn held(pool: &PgPool) -> Held {
    Held::new(pool.clone())
}

async fn journal(pool: &PgPool, id: Uuid) -> Vec<(i32, String, Value)> {
    sqlx::query_as(
        "SELECT seq, name, result FROM durable_journal WHERE instance_id = $1 ORDER BY seq",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_journal_batch_refuses_the_row_with_a_stale_token_and_commits_the_others() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let (a, _) = leased(pool, t1).await;
    let (b, _) = leased(pool, t2).await;
    let (c, _) = leased(pool, t3).await;
    let op = JournalOp { lease_secs: 30.0 };
    let mut h = held(pool);
    // Row 2 carries a token the instance no longer holds; rows 1 (renewing: an update)
    // and 3 (share lock only) hold theirs. The batch also carries a clock and a deadline.
    let mut now = step(c, t3, 0, false);
    now.value = JournalValue::Now;
    let mut sleep = step(a, t1, 1, false);
    sleep.kind = "sleep";
    sleep.name = String::new();
    sleep.value = JournalValue::Deadline {
        secs: Some(0.0),
        at: None,
    };
    let answers = op
        .run(
            &mut h,
            vec![step(a, t1, 0, true), step(b, Uuid::new_v4(), 0, false), now],
        )
        .await;
    assert_eq!(answers.len(), 3);
    let first = answers[0]
        .as_ref()
        .unwrap()
        .as_ref()
        .expect("row 1 written");
    assert_eq!(first.result, json!({ "ok": 0 }));
    assert!(
        answers[1].as_ref().unwrap().is_none(),
        "the stale row is fenced out"
    );
    let third = answers[2]
        .as_ref()
        .unwrap()
        .as_ref()
        .expect("row 3 written");
    assert!(third.result["ok"].is_string(), "the database clock");
    assert_eq!(journal(pool, a).await.len(), 1);
    assert!(
        journal(pool, b).await.is_empty(),
        "nothing written for the stale row"
    );
    assert_eq!(journal(pool, c).await.len(), 1);
    // The renewing row wrote its progress; the other rows left their instance alone.
    let progress: Option<Value> =
        sqlx::query_scalar("SELECT progress FROM durable_instance WHERE id = $1")
            .bind(a)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(progress, Some(json!({ "at": 0 })));
    // A deadline entry returns its time and dueness.
    let answers = op.run(&mut h, vec![sleep]).await;
    let w = answers[0].as_ref().unwrap().as_ref().expect("written");
    assert!(w.due && w.deadline.is_some());
    assert_eq!(journal(pool, a).await.len(), 2);
}

#[tokio::test]
async fn a_journal_row_that_fails_does_not_fail_its_batch() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let (a, _) = leased(pool, t1).await;
    let (b, _) = leased(pool, t2).await;
    let (c, _) = leased(pool, t3).await;
    // b's position 0 is taken: its write violates the journal's primary key, which
    // rolls the batch statement back; each row is then written on its own.
    sqlx::query("INSERT INTO durable_journal (instance_id, seq, kind, name, result) VALUES ($1, 0, 'step', 'x', '{}')")
        .bind(b)
        .execute(pool)
        .await
        .unwrap();
    let op = JournalOp { lease_secs: 30.0 };
    let answers = op
        .run(
            &mut held(pool),
            vec![
                step(a, t1, 0, false),
                step(b, t2, 0, false),
                step(c, t3, 0, true),
            ],
        )
        .await;
    assert!(matches!(answers[0], Ok(Some(_))));
    assert!(answers[1].is_err(), "the failing row gets its own error");
    assert!(matches!(answers[2], Ok(Some(_))));
    for id in [a, c] {
        assert_eq!(journal(pool, id).await.len(), 1, "written exactly once");
    }
    assert_eq!(journal(pool, b).await, vec![(0, "x".to_owned(), json!({}))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_journal_writes_through_the_combiner_are_written_once_each() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool().clone();
    let combiner = Combiner::new(JournalOp { lease_secs: 30.0 }, pool.clone(), 64, 1 << 20, 1);
    let mut tasks = tokio::task::JoinSet::new();
    let mut expect = HashMap::new();
    for i in 0..40 {
        let token = Uuid::new_v4();
        let (id, _) = leased(&pool, token).await;
        // Every fourth writer has lost its lease: all its writes are refused.
        let stale = i % 4 == 0;
        expect.insert(id, if stale { 0 } else { 5 });
        let combiner = combiner.clone();
        tasks.spawn(async move {
            let token = if stale { Uuid::new_v4() } else { token };
            for seq in 0..5 {
                // Journal before continue: the next write is made only after this one
                // was answered (committed or refused).
                let answer = combiner
                    .submit(step(id, token, seq, seq % 2 == 0))
                    .await
                    .expect("answered");
                match answer {
                    Ok(Some(w)) => assert_eq!(w.result, json!({ "ok": seq })),
                    Ok(None) => {
                        assert!(stale, "a live token was refused");
                        return;
                    }
                    Err(e) => panic!("write failed: {e}"),
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    for (id, n) in expect {
        let rows = journal(&pool, id).await;
        assert_eq!(rows.len(), n, "no write lost or duplicated");
        assert!(rows.iter().enumerate().all(|(i, r)| r.0 == i as i32));
    }
}

fn completed(instance_id: Uuid, token: Uuid, command_id: i64, next: bool) -> SettleRow {
    SettleRow {
        instance_id,
        workflow: String::new(),
        token,
        status: crate::status::RunStatus::Completed,
        output: Some("1".to_owned()),
        error_code: None,
        error_retryable: None,
        error_message: None,
        error_detail: None,
        wait: None,
        progress: None,
        outcome: crate::executor::Outcome::Completed,
        command_id,
        history: crate::history::SettleHistory {
            entries: "[]".to_owned(),
            state: None,
            journal: 0,
        },
        wake_tag: None,
        recovery_secs: 1.0,
        max_attempts: 5,
        timer_at: None,
        next: next.then(|| {
            Arc::new(crate::version::ClaimSet {
                names: vec!["w".to_owned()],
                min: vec![1],
                max: vec![1],
            })
        }),
    }
}

#[tokio::test]
async fn a_segment_settle_batch_refuses_the_stale_row_and_claims_next_commands_for_the_others() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let (a, ca) = leased(pool, t1).await;
    let (b, cb) = leased(pool, t2).await;
    let (c, cc) = leased(pool, t3).await;
    let q1 = queued(pool).await;
    let q2 = queued(pool).await;
    let op = SettleOp {
        lease_secs: 30.0,
        hook: Default::default(),
    };
    let before = Instant::now();
    let answers = op
        .run(
            &mut held(pool),
            vec![
                completed(a, t1, ca, true),
                completed(b, Uuid::new_v4(), cb, true),
                completed(c, t3, cc, false),
            ],
        )
        .await;
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    assert!(answers[0].settled && !answers[1].settled && answers[2].settled);
    let states: Vec<(Uuid, String, Option<String>)> = sqlx::query_as(
        "SELECT i.id, i.status, c.state FROM durable_instance i
           LEFT JOIN durable_command c ON c.instance_id = i.id WHERE i.id = ANY($1)",
    )
    .bind(vec![a, b, c])
    .fetch_all(pool)
    .await
    .unwrap();
    for (id, status, state) in states {
        if id == b {
            assert_eq!(
                (status.as_str(), state.as_deref()),
                ("running", Some("running")),
                "the fenced-out segment settle changed nothing"
            );
        } else {
            assert_eq!(
                (status.as_str(), state.as_deref()),
                ("completed", Some("done"))
            );
        }
    }
    // Both rows that asked for a next command got one (the fenced-out slot is free
    // too), in queue order; row 3 did not ask.
    let (n1, at1) = answers[0].next.as_ref().expect("a next command");
    let (n2, _) = answers[1].next.as_ref().expect("a next command");
    assert!(answers[2].next.is_none());
    assert!(*at1 >= before);
    assert_eq!((n1.instance_id, n2.instance_id), (q1, q2));
    for n in [n1, n2] {
        let token: Option<Uuid> =
            sqlx::query_scalar("SELECT lease_token FROM durable_instance WHERE id = $1")
                .bind(n.instance_id)
                .fetch_one(pool)
                .await
                .unwrap();
        assert_eq!(token, n.lease_token, "the claim's lease is committed");
        assert_eq!((n.kind.as_str(), n.attempt), ("start", 1));
    }
}

/// A transition hook that fails (not a database error) whenever its transitions include
/// `refuse`, and records the others' instance ids in `event_log`.
struct RefuseOne {
    refuse: Uuid,
}

impl crate::TransitionHook for RefuseOne {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        transitions: &'c [crate::Transition],
    ) -> crate::HookFuture<'c> {
        Box::pin(async move {
            if transitions.iter().any(|t| t.instance_id == self.refuse) {
                return Err(crate::TransitionHookError::Other(
                    "refused by the test".into(),
                ));
            }
            for t in transitions {
                sqlx::query("INSERT INTO event_log (tag, what) VALUES ($1, 'hooked')")
                    .bind(t.instance_id.to_string())
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        })
    }
}

/// A hook failure for one row of a batch of segment settles is counted and does not
/// fail the batch: each row is settled again on its own (with the hook), so only the
/// refused instance's settle fails (and changes nothing), with or without claims.
#[test]
fn a_failing_transition_hook_fails_only_its_own_row_of_the_batch_and_is_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let db = TestDatabase::create().await.unwrap();
                let pool = db.pool();
                sqlx::query("CREATE TABLE IF NOT EXISTS event_log (id bigserial PRIMARY KEY, tag text, what text)")
                    .execute(pool)
                    .await
                    .unwrap();
                for claim in [false, true] {
                    let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
                    let (a, ca) = leased(pool, t1).await;
                    let (b, cb) = leased(pool, t2).await;
                    let (c, cc) = leased(pool, t3).await;
                    let slot = crate::hook::HookSlot::default();
                    let _ = slot.set(Arc::new(RefuseOne { refuse: b }));
                    let op = SettleOp {
                        lease_secs: 30.0,
                        hook: slot,
                    };
                    let answers = op
                        .run(
                            &mut held(pool),
                            vec![
                                completed(a, t1, ca, claim),
                                completed(b, t2, cb, claim),
                                completed(c, t3, cc, claim),
                            ],
                        )
                        .await;
                    assert!(answers[0].as_ref().unwrap().settled, "claim={claim}");
                    assert!(
                        matches!(answers[1], Err(crate::DurableError::TransitionHook(_))),
                        "claim={claim}: {:?}",
                        answers[1]
                    );
                    assert!(answers[2].as_ref().unwrap().settled, "claim={claim}");
                    let states: Vec<(Uuid, String)> = sqlx::query_as(
                        "SELECT id, status FROM durable_instance WHERE id = ANY($1)",
                    )
                    .bind(vec![a, b, c])
                    .fetch_all(pool)
                    .await
                    .unwrap();
                    for (id, status) in states {
                        let want = if id == b { "running" } else { "completed" };
                        assert_eq!(status, want, "claim={claim}");
                    }
                    let hooked: Vec<String> = sqlx::query_scalar(
                        "SELECT tag FROM event_log WHERE tag = ANY($1) ORDER BY id",
                    )
                    .bind(vec![a.to_string(), b.to_string(), c.to_string()])
                    .fetch_all(pool)
                    .await
                    .unwrap();
                    assert_eq!(hooked, [a.to_string(), c.to_string()], "claim={claim}");
                }
            });
    });
    let failures: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let DebugValue::Counter(n) = value else {
                return None;
            };
            (key.name() == "keel_durable_transition_hook_failures_total").then(|| {
                let labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (labels.join(","), n)
            })
        })
        .collect();
    // Per pass: the batch, then the refused row alone (the claiming pass: the batch
    // with its claim, then the refused row alone).
    assert_eq!(failures, [("kind=other".to_owned(), 4)]);
}
