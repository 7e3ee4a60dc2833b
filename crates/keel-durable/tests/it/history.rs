//! The decision log (issue 23): entries written in the segment's transaction, with
//! actors, patches that reproduce the stored state, redaction before writing, and no
//! entry of a segment lost to a SIGKILL.

use crate::common::*;
use keel_durable::{
    Actor, ActorKind, Engine, HistoryEntry, RunStatus, StartOptions, StepError, WaitKind, Workflow,
    WorkflowContext, WorkflowFailure,
};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

/// Sets progress (with a personal reference and a secret), runs a step, waits for the
/// signal `approval`, then completes with an output holding the personal reference.
struct Audited;

impl Workflow for Audited {
    const NAME: &'static str = "test.audited";
    const HISTORY_REDACT: &'static [&'static str] = &["/recipientRef"];
    type Input = Value;
    type Output = Value;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: Value,
    ) -> Result<Value, WorkflowFailure<String>> {
        let who = input["recipientRef"].clone();
        ctx.set_progress(
            json!({ "stage": "checking", "recipientRef": who, "amount": "1.000000000000000001" }),
        );
        ctx.step("check", || async { Ok::<_, StepError<String>>(1) })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        ctx.set_progress(
            json!({ "stage": "approving", "recipientRef": who, "amount": "1.000000000000000001" }),
        );
        let _: keel_durable::SignalOutcome<Value> = ctx.wait_signal("approval", None).await?;
        ctx.step("enqueue w", || async { Ok::<_, StepError<String>>(2) })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        Ok(json!({ "recipientRef": who, "done": true }))
    }
}

fn history_engine(pool: &PgPool) -> Engine {
    Engine::new(pool.clone(), fast_config())
        .expect("engine")
        .register(Audited)
        .register(Fails)
}

async fn all_entries(engine: &Engine, id: Uuid) -> Vec<HistoryEntry> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = engine.history(id, after, 3).await.expect("history");
        out.extend(page.entries);
        match page.next_after {
            Some(a) => after = a,
            None => return out,
        }
    }
}

fn kinds(entries: &[HistoryEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.kind.as_str()).collect()
}

/// The stored projection as the history logs it (before redaction).
async fn stored_state(engine: &Engine, id: Uuid) -> Value {
    let s = engine.status(id).await.expect("status");
    let mut m = serde_json::Map::new();
    m.insert("status".into(), json!(s.status.as_str()));
    if let Some(p) = s.progress {
        m.insert("progress".into(), p);
    }
    if let Some(o) = s.output {
        m.insert("output".into(), o);
    }
    Value::Object(m)
}

#[tokio::test]
async fn entries_log_commands_and_decisions_with_actors_and_states_that_match_the_projection() {
    let db = database().await;
    let pool = db.pool();
    let engine = history_engine(pool);
    let _ex = spawn(&engine);
    let started = engine
        .start_json(
            Audited::NAME,
            "k1",
            r#"{"recipientRef":"alice@example.com","password":"hunter2","n":1}"#,
            StartOptions {
                actor: Actor::user("user-7"),
                ..StartOptions::default()
            },
        )
        .await
        .unwrap();
    let id = started.instance_id;
    until(&engine, id, "waiting", |s| s.status == RunStatus::Waiting).await;
    engine
        .signal_as(
            id,
            "approval",
            "a1",
            &json!({"ok": true}),
            &Actor::service("key-1"),
        )
        .await
        .unwrap();
    until_status(&engine, id, RunStatus::Completed).await;

    let entries = all_entries(&engine, id).await;
    assert_eq!(
        kinds(&entries),
        [
            "command_received",
            "step_recorded",
            "wait_entered",
            "command_received",
            "signal_applied",
            "transaction_enqueued",
            "completed"
        ]
    );
    let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>(), "no gap");
    // Actors: the start's user on the start and its segment; the signal's key on the
    // signal and the segment that applied it.
    for (i, want) in [
        (0, "user-7"),
        (1, "user-7"),
        (2, "user-7"),
        (3, "key-1"),
        (6, "key-1"),
    ] {
        assert_eq!(entries[i].actor.id(), Some(want), "entry {i}");
    }
    assert_eq!(entries[0].actor.kind(), ActorKind::User);
    assert_eq!(entries[3].actor.kind(), ActorKind::Service);
    assert_eq!(entries[1].detail["name"], "check");
    assert_eq!(entries[1].detail["outcome"], "ok");
    assert!(
        entries[1].detail["durationMs"].is_u64(),
        "{:?}",
        entries[1].detail
    );
    assert_eq!(
        entries[3].detail,
        json!({"command": "signal", "name": "approval"})
    );
    // Baselines at the start and the first segment; patches after.
    assert!(entries[0].baseline && entries[2].baseline);
    assert_eq!(entries[1].patch, Some(json!([])));
    let last = entries.last().unwrap();
    let ops = last
        .patch
        .as_ref()
        .and_then(Value::as_array)
        .expect("a patch");
    assert!(!ops.is_empty());
    for op in ops {
        assert!(
            ["add", "remove", "replace"].contains(&op["op"].as_str().unwrap()),
            "{op}"
        );
    }
    // Redaction: neither the pointer's value nor the denylisted member anywhere.
    let text = serde_json::to_string(&entries).unwrap();
    assert!(!text.contains("alice@example.com"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(entries[0].detail["input"]["n"], 1);
    assert_eq!(entries[0].detail["input"]["password"], "[redacted]");
    // The reconstructed state after the last entry is the stored projection, redacted.
    let mut want = stored_state(&engine, id).await;
    want["progress"]["recipientRef"] = json!("[redacted]");
    want["output"]["recipientRef"] = json!("[redacted]");
    assert_eq!(last.state.as_ref(), Some(&want));
    assert_eq!(
        want["progress"]["amount"], "1.000000000000000001",
        "decimal strings stay strings"
    );
    // Entries are append-only.
    let refused = sqlx::query("UPDATE durable_history SET kind = 'x' WHERE instance_id = $1")
        .bind(id)
        .execute(pool)
        .await;
    assert!(refused.is_err());
}

#[tokio::test]
async fn failure_retry_and_cancel_are_logged_with_their_state_change() {
    let db = database().await;
    let pool = db.pool();
    let engine = history_engine(pool);
    let ex = spawn(&engine);
    let id = engine
        .start::<Fails>("f1", &1, opts())
        .await
        .unwrap()
        .instance_id;
    until_status(&engine, id, RunStatus::Failed).await;
    ex.shutdown().await;
    engine.retry_as(id, &Actor::user("ops-1")).await.unwrap();
    engine.cancel_as(id, &Actor::user("ops-2")).await.unwrap();
    let entries = all_entries(&engine, id).await;
    assert_eq!(
        kinds(&entries),
        ["command_received", "failed", "retry", "cancelled"]
    );
    assert_eq!(entries[1].state.as_ref().unwrap()["status"], "failed");
    assert_eq!(
        entries[1].state.as_ref().unwrap()["error"]["code"],
        "WORKFLOW_FAILED"
    );
    assert_eq!(entries[2].actor.id(), Some("ops-1"));
    assert_eq!(
        entries[2].state.as_ref().unwrap(),
        &json!({"status": "pending"})
    );
    assert_eq!(entries[3].actor.id(), Some("ops-2"));
    assert_eq!(
        entries[3].state.as_ref().unwrap(),
        &json!({"status": "cancelled"})
    );
    assert!(matches!(
        engine.history(Uuid::new_v4(), 0, 10).await,
        Err(keel_durable::DurableError::InstanceNotFound(_))
    ));
}

#[tokio::test]
async fn history_goes_with_its_instance_under_retention() {
    let db = database().await;
    let pool = db.pool();
    let engine = history_engine(pool);
    let id = engine
        .start::<Fails>("r1", &1, opts())
        .await
        .unwrap()
        .instance_id;
    engine.cancel(id).await.unwrap();
    let count = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM durable_history WHERE instance_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(count(pool.clone()).await, 2);
    // Age the instance past the window, then run the retention pass.
    sqlx::query("UPDATE durable_instance SET ended_at = now() - interval '40 days' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    let report =
        keel_durable::Retention::new(pool.clone(), keel_durable::RetentionConfig::default())
            .unwrap()
            .run_once(&tokio_util::sync::CancellationToken::new())
            .await
            .unwrap();
    assert!(report.deleted_instances >= 1, "{report:?}");
    assert_eq!(count(pool.clone()).await, 0);
}

// ---------------------------------------------------------------------------------
// SIGKILL mid-segment (the crash worker, `common::Worker`)
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_segment_killed_mid_way_leaves_no_entry_and_its_steps_are_logged_by_the_rerun() {
    let db = database().await;
    let pool = db.pool();
    let engine = Engine::new(pool.clone(), fast_config()).unwrap();
    set_flag(pool, "hold-after-s1-a", "hold").await;
    let id = engine
        .start_json("test.crash", "a", "\"a\"", opts())
        .await
        .unwrap()
        .instance_id;
    // Killed after s0 and s1 committed, inside the segment (before its settle).
    let w = Worker::start(db.url());
    until_flag(pool, "at-hold-after-s1-a").await;
    assert_eq!(journal_len(pool, id).await, 2);
    drop(w);
    let entries = engine.history(id, 0, 100).await.unwrap().entries;
    assert_eq!(
        kinds(&entries),
        ["command_received"],
        "the lost segment logged nothing"
    );
    set_flag(pool, "hold-after-s1-a", "release").await;

    // The rerun replays s0 and s1 and logs them before its own wait.
    let _w = Worker::start(db.url());
    until(&engine, id, "timer wait", |s| {
        s.status == RunStatus::Waiting && s.wait.as_ref().is_some_and(|w| w.kind == WaitKind::Timer)
    })
    .await;
    let entries = engine.history(id, 0, 100).await.unwrap().entries;
    assert_eq!(
        kinds(&entries),
        [
            "command_received",
            "step_recorded",
            "step_recorded",
            "timer_set",
            "wait_entered"
        ]
    );
    assert_eq!(entries[1].detail["replayed"], true);
    assert_eq!(entries[2].detail["replayed"], true);
    assert!(entries[3].detail.get("replayed").is_none());
    let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(entries[4].state.as_ref().unwrap()["status"], "waiting");
}
