//! Workflow versioning: instances pinned to the version they started with, runners that
//! claim only the versions they can run, journaled patch gates, typed determinism
//! failures, retirement refusal, and a crash in the middle of an upgrade.
//!
//! Every variant below is one release of the same workflow `test.ship`: step `a`, a wait
//! for signal `go`, step `c`. Release 2 inserts step `b` after `a` behind the gate
//! `add-b` (changed since version 2) and adds an optional field to `a`'s result shape.

use std::time::Duration;

use crate::common::*;
use keel_durable::{
    DeterminismDetail, DurableError, Engine, EngineConfig, ExecutorConfig, ExecutorHandle,
    PinnedVersion, RunStatus, SignalOutcome, StepError, VersionGateDetail, VersionWait, Workflow,
    WorkflowContext, WorkflowFailure,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const NAME: &str = "test.ship";

/// The result shape of step `a` as release 1 writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuoteV1 {
    amount: String,
}

/// Release 2's shape: one more field, optional, so release 1's journal still decodes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuoteV2 {
    amount: String,
    #[serde(default)]
    memo: Option<String>,
}

/// Logs `{step}@{label}` for `tag` (who ran which step), and bumps `{tag}-{step}`.
async fn log_step(pool: &PgPool, tag: &str, step: &str, label: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO event_log (tag, what) VALUES ($1, $2)")
        .bind(tag)
        .bind(format!("{step}@{label}"))
        .execute(pool)
        .await?;
    bump(pool, &format!("{tag}-{step}")).await?;
    Ok(())
}

fn transient<E>(_: sqlx::Error) -> StepError<E> {
    StepError::transient("DB")
}

async fn plain_step(
    ctx: &mut WorkflowContext,
    pool: &PgPool,
    tag: &str,
    step: &'static str,
    label: &'static str,
) -> Result<(), WorkflowFailure<String>> {
    ctx.step(step, || {
        let (pool, tag) = (pool.clone(), tag.to_owned());
        async move {
            log_step(&pool, &tag, step, label)
                .await
                .map_err(transient)?;
            if step == "b" {
                // Hangs while flag `hold-b` is `yes` (the crash test kills the runner here).
                while flag(&pool, "hold-b").await.as_deref() == Some("yes") {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ok::<_, StepError<String>>(())
        }
    })
    .await?
    .map_err(WorkflowFailure::Failed)
}

/// Release 1.
struct ShipV1 {
    pool: PgPool,
    label: &'static str,
}

impl Workflow for ShipV1 {
    const NAME: &'static str = NAME;
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        let (pool, label) = (self.pool.clone(), self.label);
        let quote: QuoteV1 = ctx
            .step("a", || {
                let (pool, tag) = (pool.clone(), tag.clone());
                async move {
                    log_step(&pool, &tag, "a", label).await.map_err(transient)?;
                    Ok::<_, StepError<String>>(QuoteV1 {
                        amount: "10".into(),
                    })
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        let _: SignalOutcome<Value> = ctx.wait_signal("go", None).await?;
        plain_step(ctx, &self.pool, &tag, "c", label).await?;
        Ok(format!("v1 {}", quote.amount))
    }
}

/// How release 2 treats step `b`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Behind `ctx.changed("add-b", 2)` (the compatible release).
    Changed,
    /// Behind `ctx.version("add-b", 0, 1)` (the Temporal form).
    Version,
    /// Inserted without a gate (the incompatible release).
    None,
}

/// Release 2: versions `min..=2`.
struct ShipV2<const MIN: u32> {
    pool: PgPool,
    label: &'static str,
    gate: Gate,
}

impl<const MIN: u32> Workflow for ShipV2<MIN> {
    const NAME: &'static str = NAME;
    const VERSION: u32 = 2;
    const MIN_VERSION: u32 = MIN;
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        let (pool, label) = (self.pool.clone(), self.label);
        let quote: QuoteV2 = ctx
            .step("a", || {
                let (pool, tag) = (pool.clone(), tag.clone());
                async move {
                    log_step(&pool, &tag, "a", label).await.map_err(transient)?;
                    Ok::<_, StepError<String>>(QuoteV2 {
                        amount: "10".into(),
                        memo: Some("v2".into()),
                    })
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        let with_b = match self.gate {
            Gate::Changed => ctx.changed("add-b", 2).await?,
            Gate::Version => ctx.version("add-b", 0, 1).await? == 1,
            Gate::None => true,
        };
        if with_b {
            plain_step(ctx, &self.pool, &tag, "b", label).await?;
        }
        let _: SignalOutcome<Value> = ctx.wait_signal("go", None).await?;
        plain_step(ctx, &self.pool, &tag, "c", label).await?;
        let path = if with_b { "v2" } else { "v1" };
        Ok(format!(
            "{path} {} {}",
            quote.amount,
            quote.memo.unwrap_or_default()
        ))
    }
}

fn v1(pool: &PgPool, label: &'static str) -> ShipV1 {
    ShipV1 {
        pool: pool.clone(),
        label,
    }
}

fn v2<const MIN: u32>(pool: &PgPool, label: &'static str, gate: Gate) -> ShipV2<MIN> {
    ShipV2 {
        pool: pool.clone(),
        label,
        gate,
    }
}

fn runner(engine: &Engine) -> ExecutorHandle {
    engine
        .spawn_executor(ExecutorConfig {
            concurrency: 4,
            poll_interval: Duration::from_millis(200),
            ..ExecutorConfig::default()
        })
        .expect("executor")
}

fn bare(pool: &PgPool, config: EngineConfig) -> Engine {
    Engine::new(pool.clone(), config).expect("engine")
}

/// The `{step}@{label}` entries logged for `tag`.
async fn ran(pool: &PgPool, tag: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT what FROM event_log WHERE tag = $1 ORDER BY id")
        .bind(tag)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn journal_kinds(pool: &PgPool, id: Uuid) -> Vec<(String, String)> {
    sqlx::query_as("SELECT kind, name FROM durable_journal WHERE instance_id = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap()
}

fn entries(e: &[(&str, &str)]) -> Vec<(String, String)> {
    e.iter()
        .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
        .collect()
}

async fn go(engine: &Engine, id: Uuid) {
    engine.signal(id, "go", "go", &json!({})).await.unwrap();
}

async fn until_waiting(engine: &Engine, id: Uuid) {
    until(engine, id, "the wait for go", |s| {
        s.status == RunStatus::Waiting
    })
    .await;
}

/// The command attempts of an instance, in recording order.
async fn attempts(pool: &PgPool, id: Uuid) -> Vec<(String, String, i32)> {
    sqlx::query_as(
        "SELECT kind, state, attempt FROM durable_command WHERE instance_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn v1_instances_finish_on_the_v1_path_after_an_upgrade_and_new_ones_take_v2() {
    let db = database().await;
    let pool = db.pool();
    let old = bare(pool, fast_config()).register(v1(pool, "r1"));
    let r1 = runner(&old);
    let mut olds = Vec::new();
    for tag in ["old-1", "old-2"] {
        let s = old
            .start::<ShipV1>(tag, &tag.to_owned(), opts())
            .await
            .unwrap();
        until_waiting(&old, s.instance_id).await;
        olds.push((tag, s.instance_id));
    }
    // Release 2 replaces release 1: stop the runner, start one with the gated code.
    r1.shutdown().await;
    for gate in [Gate::Changed, Gate::Version] {
        let label = if gate == Gate::Changed {
            "changed"
        } else {
            "version"
        };
        let new = bare(pool, fast_config()).register(v2::<1>(pool, label, gate));
        let r2 = runner(&new);
        let tag = format!("new-{label}");
        let fresh = new
            .start::<ShipV2<1>>(&tag, &tag.clone(), opts())
            .await
            .unwrap();
        until_waiting(&new, fresh.instance_id).await;
        go(&new, fresh.instance_id).await;
        let done = until_status(&new, fresh.instance_id, RunStatus::Completed).await;
        assert_eq!(done.version, Some(2));
        assert_eq!(done.output, Some(json!("v2 10 v2")));
        assert_eq!(
            ran(pool, &tag).await,
            [
                format!("a@{label}"),
                format!("b@{label}"),
                format!("c@{label}")
            ]
        );
        // The gate's decision is journaled between `a` and `b`.
        assert_eq!(
            journal_kinds(pool, fresh.instance_id).await,
            entries(&[
                ("step", "a"),
                ("version", "add-b"),
                ("step", "b"),
                ("wait", "go"),
                ("signal", "go"),
                ("step", "c"),
            ])
        );
        r2.shutdown().await;
    }
    // The old instances run on release 2 (one with each gate form): both keep the v1 path (no `b`), and release 1's result shape of `a` decodes into
    // release 2's type (the added field is absent: its default).
    for ((tag, id), gate) in olds.iter().zip([Gate::Changed, Gate::Version]) {
        let new = bare(pool, fast_config()).register(v2::<1>(pool, "r2", gate));
        let r2 = runner(&new);
        assert_eq!(new.status(*id).await.unwrap().version, Some(1));
        go(&new, *id).await;
        let done = until_status(&new, *id, RunStatus::Completed).await;
        assert_eq!(done.output, Some(json!("v1 10 ")), "{tag}");
        assert_eq!(ran(pool, tag).await, ["a@r1", "c@r2"], "{tag}");
        assert_eq!(effect(pool, &format!("{tag}-b")).await, 0);
        assert!(
            !journal_kinds(pool, *id)
                .await
                .iter()
                .any(|(k, _)| k == "version"),
            "a gate whose position the instance had passed records nothing"
        );
        r2.shutdown().await;
    }
}

#[tokio::test]
async fn a_gate_reached_for_the_first_time_keeps_an_old_instance_on_its_path_and_old_runners_replay_it()
 {
    // Release 2 puts its gate *after* the wait: a v1 instance waiting there reaches the
    // gate only under release 2. It records "not changed" (the instance is pinned to 1),
    // and release 1 (which has no gate) can still replay that journal.
    struct Late<const V: u32>(PgPool, &'static str);
    impl<const V: u32> Workflow for Late<V> {
        const NAME: &'static str = "test.late";
        const VERSION: u32 = V;
        type Input = String;
        type Output = Vec<bool>;
        type Error = String;
        async fn run(
            &self,
            ctx: &mut WorkflowContext,
            tag: String,
        ) -> Result<Vec<bool>, WorkflowFailure<String>> {
            let mut seen = Vec::new();
            for round in ["one", "two"] {
                let _: SignalOutcome<Value> = ctx.wait_signal(round, None).await?;
                if V >= 2 {
                    let changed = ctx.changed(&format!("extra-{round}"), 2).await?;
                    if changed {
                        plain_step(ctx, &self.0, &tag, "b", self.1).await?;
                    }
                    seen.push(changed);
                }
            }
            Ok(seen)
        }
    }
    let db = database().await;
    let pool = db.pool();
    let old = bare(pool, fast_config()).register(Late::<1>(pool.clone(), "r1"));
    let s = old
        .start::<Late<1>>("late", &"late".to_owned(), opts())
        .await
        .unwrap();
    let r1 = runner(&old);
    until_waiting(&old, s.instance_id).await;
    r1.shutdown().await;
    // Release 2 applies signal `one`: the gate is live, the instance is pinned to 1.
    let new = bare(pool, fast_config()).register(Late::<2>(pool.clone(), "r2"));
    let r2 = runner(&new);
    new.signal(s.instance_id, "one", "one", &json!({}))
        .await
        .unwrap();
    until(&new, s.instance_id, "the wait for two", |st| {
        st.wait.as_ref().and_then(|w| w.name.as_deref()) == Some("two")
    })
    .await;
    r2.shutdown().await;
    assert_eq!(
        journal_kinds(pool, s.instance_id).await,
        entries(&[
            ("wait", "one"),
            ("signal", "one"),
            ("version", "extra-one"),
            ("wait", "two"),
        ])
    );
    // Rolled back to release 1: it steps over the recorded gate and completes.
    let r1 = runner(&old);
    old.signal(s.instance_id, "two", "two", &json!({}))
        .await
        .unwrap();
    let done = until_status(&old, s.instance_id, RunStatus::Completed).await;
    assert_eq!(done.output, Some(json!([])));
    assert_eq!(effect(pool, "late-b").await, 0);
    r1.shutdown().await;
}

#[tokio::test]
async fn an_incompatible_v2_without_a_gate_fails_typed_and_a_fixed_release_retries_it() {
    let db = database().await;
    let pool = db.pool();
    let old = bare(pool, fast_config()).register(v1(pool, "r1"));
    let r1 = runner(&old);
    let s = old
        .start::<ShipV1>("t", &"t".to_owned(), opts())
        .await
        .unwrap();
    until_waiting(&old, s.instance_id).await;
    r1.shutdown().await;

    // Release 2 inserted `b` without a gate: the replay meets the wait where `b` runs.
    let bad = bare(pool, fast_config()).register(v2::<1>(pool, "bad", Gate::None));
    let rb = runner(&bad);
    go(&bad, s.instance_id).await;
    let failed = until_status(&bad, s.instance_id, RunStatus::Failed).await;
    let err = failed.error.expect("error");
    assert_eq!(err.code, "DETERMINISM_VIOLATION");
    assert!(!err.retryable);
    let detail: DeterminismDetail =
        serde_json::from_value(err.detail.expect("typed detail")).unwrap();
    assert_eq!(detail.position, 1);
    assert_eq!(
        (
            detail.journaled.kind.as_str(),
            detail.journaled.name.as_str()
        ),
        ("wait", "go")
    );
    assert_eq!(
        (detail.reached.kind.as_str(), detail.reached.name.as_str()),
        ("step", "b")
    );
    assert_eq!(detail.instance_version, Some(1));
    assert_eq!(detail.code_version, 2);
    assert_eq!(effect(pool, "t-b").await, 0, "the wrong step never ran");
    rb.shutdown().await;

    // The fixed release (the gate) retries it: the retry replays on the recorded
    // version's path and consumes the parked signal.
    let fixed = bare(pool, fast_config()).register(v2::<1>(pool, "fixed", Gate::Changed));
    let rf = runner(&fixed);
    fixed.retry(s.instance_id).await.unwrap();
    let done = until_status(&fixed, s.instance_id, RunStatus::Completed).await;
    assert_eq!(done.output, Some(json!("v1 10 ")));
    assert_eq!(done.version, Some(1));
    assert_eq!(ran(pool, "t").await, ["a@r1", "c@fixed"]);
    rf.shutdown().await;
}

#[tokio::test]
async fn a_retired_gate_variant_fails_the_instance_typed() {
    // Release 3 keeps only the gate's new variant (`version("add-b", 1, 1)`): an
    // instance that recorded the old one fails VERSION_UNSUPPORTED, never runs a path it
    // did not record.
    struct Strict(PgPool);
    impl Workflow for Strict {
        const NAME: &'static str = NAME;
        const VERSION: u32 = 3;
        type Input = String;
        type Output = String;
        type Error = String;
        async fn run(
            &self,
            ctx: &mut WorkflowContext,
            tag: String,
        ) -> Result<String, WorkflowFailure<String>> {
            let _: QuoteV2 = ctx
                .step("a", || async { Err(StepError::transient("NOT_REPLAYED")) })
                .await?
                .map_err(WorkflowFailure::Failed)?;
            let _ = ctx.version("add-b", 1, 1).await?;
            plain_step(ctx, &self.0, &tag, "b", "strict").await?;
            Ok(tag)
        }
    }
    let db = database().await;
    let pool = db.pool();
    let old = bare(pool, fast_config()).register(v1(pool, "r1"));
    let r1 = runner(&old);
    let s = old
        .start::<ShipV1>("s", &"s".to_owned(), opts())
        .await
        .unwrap();
    until_waiting(&old, s.instance_id).await;
    r1.shutdown().await;
    let strict = bare(pool, fast_config()).register(Strict(pool.clone()));
    let r3 = runner(&strict);
    go(&strict, s.instance_id).await;
    let failed = until_status(&strict, s.instance_id, RunStatus::Failed).await;
    let err = failed.error.expect("error");
    assert_eq!(err.code, "VERSION_UNSUPPORTED");
    let detail: VersionGateDetail = serde_json::from_value(err.detail.unwrap()).unwrap();
    assert_eq!(
        detail,
        VersionGateDetail {
            change_id: "add-b".into(),
            recorded: 0,
            min: 1,
            max: 1,
        }
    );
    assert_eq!(effect(pool, "s-b").await, 0);
    r3.shutdown().await;
}

#[tokio::test]
async fn a_v1_only_and_a_v2_only_runner_side_by_side_each_claim_only_their_version() {
    let db = database().await;
    let pool = db.pool();
    let e1 = bare(pool, fast_config()).register(v1(pool, "r1"));
    let e2 = bare(pool, fast_config()).register(v2::<2>(pool, "r2", Gate::Changed));
    let (r1, r2) = (runner(&e1), runner(&e2));
    let mut started = Vec::new();
    for i in 0..6 {
        let tag = format!("one-{i}");
        let s = e1
            .start::<ShipV1>(&tag, &tag.clone(), opts())
            .await
            .unwrap();
        started.push((tag, s.instance_id, 1));
        let tag = format!("two-{i}");
        let s = e2
            .start::<ShipV2<2>>(&tag, &tag.clone(), opts())
            .await
            .unwrap();
        started.push((tag, s.instance_id, 2));
    }
    for (_, id, _) in &started {
        until_waiting(&e1, *id).await;
        go(&e1, *id).await;
    }
    for (tag, id, version) in &started {
        let done = until_status(&e1, *id, RunStatus::Completed).await;
        assert_eq!(done.version, Some(*version));
        let expect: Vec<String> = if *version == 1 {
            vec!["a@r1".into(), "c@r1".into()]
        } else {
            vec!["a@r2".into(), "b@r2".into(), "c@r2".into()]
        };
        assert_eq!(ran(pool, tag).await, expect, "{tag}");
    }
    r1.shutdown().await;
    r2.shutdown().await;
}

#[tokio::test]
async fn an_instance_of_a_version_no_runner_knows_is_deferred_not_failed_and_shown() {
    let db = database().await;
    let pool = db.pool();
    let e1 = bare(pool, fast_config()).register(v1(pool, "r1"));
    let r1 = runner(&e1);
    until_db(
        pool,
        "release 1's runner recorded",
        "SELECT EXISTS (SELECT 1 FROM durable_runner_version WHERE max_version = 1)",
    )
    .await;
    // A node of release 2 records a start before any release-2 runner is up.
    let api2 = bare(pool, fast_config()).register(v2::<2>(pool, "r2", Gate::Changed));
    let s2 = api2
        .start::<ShipV2<2>>("ahead", &"ahead".to_owned(), opts())
        .await
        .unwrap();
    // The v1 runner works meanwhile (it claims and completes its own instance) ...
    let s1 = e1
        .start::<ShipV1>("own", &"own".to_owned(), opts())
        .await
        .unwrap();
    until_waiting(&e1, s1.instance_id).await;
    assert!(!e1.status(s1.instance_id).await.unwrap().awaiting_runner);
    go(&e1, s1.instance_id).await;
    until_status(&e1, s1.instance_id, RunStatus::Completed).await;
    // ... and never claims the v2 one: still pending, no attempt spent, not failed.
    let st = e1.status(s2.instance_id).await.unwrap();
    assert_eq!(st.status, RunStatus::Pending);
    assert_eq!(st.version, Some(2));
    assert!(st.awaiting_runner, "shown as waiting for a runner: {st:?}");
    assert_eq!(
        attempts(pool, s2.instance_id).await,
        [("start".to_owned(), "queued".to_owned(), 0)]
    );
    let waits = e1.version_waits().await.unwrap();
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(
        (
            waits[0].workflow.as_str(),
            waits[0].version,
            waits[0].instances
        ),
        (NAME, Some(2), 1)
    );
    // A runner of release 2 arrives and runs it.
    let r2 = runner(&api2);
    until_db(
        pool,
        "release 2's runner recorded",
        "SELECT EXISTS (SELECT 1 FROM durable_runner_version WHERE max_version = 2)",
    )
    .await;
    assert_eq!(
        api2.version_waits().await.unwrap(),
        Vec::<VersionWait>::new()
    );
    until_waiting(&api2, s2.instance_id).await;
    assert!(!api2.status(s2.instance_id).await.unwrap().awaiting_runner);
    go(&api2, s2.instance_id).await;
    until_status(&api2, s2.instance_id, RunStatus::Completed).await;
    assert_eq!(ran(pool, "ahead").await, ["a@r2", "b@r2", "c@r2"]);
    // A clean shutdown removes the runner's record.
    r2.shutdown().await;
    r1.shutdown().await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_runner_version")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

/// Issue 32 §6: during a rollback, an instance of release 2 that no live runner can run
/// and that never started does not hold its serialization key: the release-1
/// instances of the same key started after it run, in their order (before the fix they
/// queued behind it for as long as the rollback lasted); the status projection does not
/// name it as a blocker. Once a release-2 runner is live it runs, and holds the key
/// again while it runs.
#[tokio::test]
async fn a_deferred_instance_does_not_block_the_older_version_instances_behind_it() {
    let db = database().await;
    let pool = db.pool();
    let keyed = || keel_durable::StartOptions {
        serialization_key: Some("asset-1".to_owned()),
        ..keel_durable::StartOptions::default()
    };
    let e1 = bare(pool, fast_config()).register(v1(pool, "r1"));
    let api2 = bare(pool, fast_config()).register(v2::<2>(pool, "r2", Gate::Changed));
    // Recorded in this order before any runner is up: v1, v2 (deferred), v1, v1.
    let first = e1
        .start::<ShipV1>("first", &"first".to_owned(), keyed())
        .await
        .unwrap();
    let ahead = api2
        .start::<ShipV2<2>>("ahead", &"ahead".to_owned(), keyed())
        .await
        .unwrap();
    let mut after = Vec::new();
    for tag in ["after-1", "after-2"] {
        after.push(
            e1.start::<ShipV1>(tag, &tag.to_owned(), keyed())
                .await
                .unwrap()
                .instance_id,
        );
    }
    let r1 = runner(&e1);
    until_db(
        pool,
        "release 1's runner recorded",
        "SELECT EXISTS (SELECT 1 FROM durable_runner_version WHERE max_version = 1)",
    )
    .await;
    // Every v1 instance runs (each releases the key when it waits for its signal).
    until_waiting(&e1, first.instance_id).await;
    for id in &after {
        until_waiting(&e1, *id).await;
    }
    let st = e1.status(ahead.instance_id).await.unwrap();
    assert_eq!(st.status, RunStatus::Pending);
    assert!(st.awaiting_runner, "{st:?}");
    assert_eq!(
        attempts(pool, ahead.instance_id).await,
        [("start".to_owned(), "queued".to_owned(), 0)],
        "the deferred instance never ran"
    );
    // In start order among those that can run.
    let order: Vec<String> =
        sqlx::query_scalar("SELECT tag FROM event_log WHERE what = 'a@r1' ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(order, ["first", "after-1", "after-2"]);
    // A v1 instance recorded now runs too: the only unfinished instance before it that
    // is not waiting for a signal is the deferred one.
    let late = e1
        .start::<ShipV1>("late", &"late".to_owned(), keyed())
        .await
        .unwrap();
    until_waiting(&e1, late.instance_id).await;
    // A release-2 runner comes back: the deferred instance runs (in its place: no
    // instance of its key is pending before it).
    let r2 = runner(&api2);
    until_waiting(&api2, ahead.instance_id).await;
    for id in [first.instance_id, ahead.instance_id, late.instance_id]
        .into_iter()
        .chain(after.iter().copied())
    {
        go(&e1, id).await;
    }
    for id in [first.instance_id, ahead.instance_id, late.instance_id]
        .into_iter()
        .chain(after.iter().copied())
    {
        until_status(&e1, id, RunStatus::Completed).await;
    }
    assert_eq!(ran(pool, "ahead").await, ["a@r2", "b@r2", "c@r2"]);
    r2.shutdown().await;
    r1.shutdown().await;
}

/// The status projection's `queued_behind` follows the same rule: a pending instance
/// is not shown queued behind a never-started instance deferred by its version (live
/// runners, none knows it), and is shown behind it with no live runner at all and once a
/// runner that knows its version is live.
#[tokio::test]
async fn queued_behind_skips_a_deferred_instance_that_never_started() {
    let db = database().await;
    let pool = db.pool();
    let keyed = || keel_durable::StartOptions {
        serialization_key: Some("asset-2".to_owned()),
        ..keel_durable::StartOptions::default()
    };
    let e1 = bare(pool, fast_config()).register(v1(pool, "r1"));
    let api2 = bare(pool, fast_config()).register(v2::<2>(pool, "r2", Gate::Changed));
    let ahead = api2
        .start::<ShipV2<2>>("ahead", &"ahead".to_owned(), keyed())
        .await
        .unwrap();
    let behind = e1
        .start::<ShipV1>("behind", &"behind".to_owned(), keyed())
        .await
        .unwrap();
    // No runner at all is live: start order is kept (nothing is skipped).
    let st = e1.status(behind.instance_id).await.unwrap();
    assert_eq!(st.queued_behind, Some(ahead.instance_id), "{st:?}");
    // The records of live runners (no executors, so nothing is claimed): a release-1
    // runner only (a rollback): the v2 instance that never started is skipped.
    let runner = |lo: i32, hi: i32| {
        sqlx::query(
            "INSERT INTO durable_runner_version (runner_id, workflow, min_version, max_version)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(Uuid::new_v4())
        .bind(NAME)
        .bind(lo)
        .bind(hi)
        .execute(pool)
    };
    runner(1, 1).await.unwrap();
    let st = e1.status(behind.instance_id).await.unwrap();
    assert_eq!(st.queued_behind, None, "{st:?}");
    assert!(
        e1.status(ahead.instance_id).await.unwrap().version_deferred,
        "deferred by its version"
    );
    // A release-2 runner is live too: the deferred instance holds its key again.
    runner(1, 2).await.unwrap();
    let st = e1.status(behind.instance_id).await.unwrap();
    assert_eq!(st.queued_behind, Some(ahead.instance_id), "{st:?}");
    assert!(!e1.status(ahead.instance_id).await.unwrap().version_deferred);
}

#[tokio::test]
async fn a_start_by_name_on_a_node_without_the_workflow_is_pinned_by_its_first_runner() {
    let db = database().await;
    let pool = db.pool();
    let api = bare(pool, fast_config());
    let s = api
        .start_json(NAME, "by-name", "\"by-name\"", opts())
        .await
        .unwrap();
    let st = api.status(s.instance_id).await.unwrap();
    assert_eq!(st.version, None);
    assert!(st.awaiting_runner);
    let e2 = bare(pool, fast_config()).register(v2::<1>(pool, "r2", Gate::Changed));
    let r2 = runner(&e2);
    until_waiting(&e2, s.instance_id).await;
    assert_eq!(e2.status(s.instance_id).await.unwrap().version, Some(2));
    go(&e2, s.instance_id).await;
    let done = until_status(&e2, s.instance_id, RunStatus::Completed).await;
    assert_eq!(done.output, Some(json!("v2 10 v2")));
    r2.shutdown().await;
}

#[tokio::test]
async fn retiring_a_version_is_refused_while_a_live_instance_is_pinned_to_it() {
    let db = database().await;
    let pool = db.pool();
    let e1 = bare(pool, fast_config()).register(v1(pool, "r1"));
    let r1 = runner(&e1);
    let s = e1
        .start::<ShipV1>("pin", &"pin".to_owned(), opts())
        .await
        .unwrap();
    until_waiting(&e1, s.instance_id).await;
    r1.shutdown().await;
    // Release 2 still replays version 1: nothing to refuse.
    let keeps = bare(pool, fast_config()).register(v2::<1>(pool, "r2", Gate::Changed));
    keeps.check_versions().await.unwrap();
    // A release that retires version 1 is refused, naming the version and the count.
    let retires = bare(pool, fast_config()).register(v2::<2>(pool, "r2", Gate::Changed));
    match retires.check_versions().await {
        Err(DurableError::VersionPinned(pinned)) => assert_eq!(
            pinned,
            [PinnedVersion {
                workflow: NAME.into(),
                version: 1,
                instances: 1,
            }]
        ),
        other => panic!("expected VersionPinned, got {other:?}"),
    }
    // Once the instance has ended, the retirement is accepted.
    e1.cancel(s.instance_id).await.unwrap();
    retires.check_versions().await.unwrap();
}

#[tokio::test]
async fn a_runner_killed_mid_upgrade_is_replaced_and_the_old_runner_never_takes_its_instance() {
    let db = database().await;
    let pool = db.pool();
    let mut config = fast_config();
    config.lease = Duration::from_secs(1);
    let e1 = bare(pool, config.clone()).register(v1(pool, "r1"));
    let old = e1
        .start::<ShipV1>("old", &"old".to_owned(), opts())
        .await
        .unwrap();
    let r1 = runner(&e1);
    until_waiting(&e1, old.instance_id).await;
    // Release 2 arrives beside release 1 (its runner runs only version 2); its new
    // instance journals the gate and then the runner dies inside step `b`.
    set_flag(pool, "hold-b", "yes").await;
    let e2 = bare(pool, config.clone()).register(v2::<2>(pool, "r2", Gate::Changed));
    let r2 = runner(&e2);
    let new = e2
        .start::<ShipV2<2>>("new", &"new".to_owned(), opts())
        .await
        .unwrap();
    until_db(
        pool,
        "step b running",
        "SELECT EXISTS (SELECT 1 FROM effect WHERE key = 'new-b')",
    )
    .await;
    r2.abort().await;
    set_flag(pool, "hold-b", "no").await;
    // The old runner keeps working while the lease lapses, and is given the old
    // instance's signal; the new instance waits for a runner of its version.
    go(&e1, old.instance_id).await;
    until_status(&e1, old.instance_id, RunStatus::Completed).await;
    assert_eq!(ran(pool, "old").await, ["a@r1", "c@r1"]);
    // The rescuer of the live (v1) runner queues the crashed segment's command again
    // once the lease has lapsed; the v1 runner must not claim it.
    until_db(
        pool,
        "the crashed segment's command queued again",
        "SELECT state = 'queued' FROM durable_command c JOIN durable_instance i ON i.id = c.instance_id
          WHERE i.idempotency_key = 'new' AND c.kind = 'start'",
    )
    .await;
    // The v1 runner claims after that (it runs a fresh instance of its own) ...
    let later = e1
        .start::<ShipV1>("later", &"later".to_owned(), opts())
        .await
        .unwrap();
    until_waiting(&e1, later.instance_id).await;
    // ... and has not touched the v2 instance.
    assert_eq!(ran(pool, "new").await, ["a@r2", "b@r2"]);
    let st = e1.status(new.instance_id).await.unwrap();
    assert_eq!((st.status, st.version), (RunStatus::Running, Some(2)));
    // A restarted release-2 runner resumes it: `a` is not run again, the interrupted `b`
    // is, and the journaled gate decision is replayed (one gate entry).
    let r2 = runner(&e2);
    until_waiting(&e2, new.instance_id).await;
    go(&e2, new.instance_id).await;
    let done = until_status(&e2, new.instance_id, RunStatus::Completed).await;
    assert_eq!(done.output, Some(json!("v2 10 v2")));
    assert_eq!(effect(pool, "new-a").await, 1);
    assert_eq!(effect(pool, "new-b").await, 2);
    assert_eq!(ran(pool, "new").await, ["a@r2", "b@r2", "b@r2", "c@r2"]);
    let gates = journal_kinds(pool, new.instance_id)
        .await
        .into_iter()
        .filter(|(k, _)| k == "version")
        .count();
    assert_eq!(gates, 1);
    r1.shutdown().await;
    r2.shutdown().await;
}

#[tokio::test]
async fn binaries_before_versioning_claim_only_version_1() {
    let db = database().await;
    let pool = db.pool();
    let e2 = bare(pool, fast_config()).register(v2::<1>(pool, "r2", Gate::Changed));
    let two = e2
        .start::<ShipV2<1>>("two", &"two".to_owned(), opts())
        .await
        .unwrap();
    let e1 = bare(pool, fast_config()).register(v1(pool, "r1"));
    let one = e1
        .start::<ShipV1>("one", &"one".to_owned(), opts())
        .await
        .unwrap();
    // The claim function as a pre-versioning binary calls it.
    let claimed: Vec<Uuid> =
        sqlx::query_scalar("SELECT instance_id FROM durable_claim(ARRAY['test.ship'], 5, 10)")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(claimed, [one.instance_id]);
    assert_eq!(attempts(pool, two.instance_id).await[0].2, 0);
}

#[test]
fn the_awaiting_runner_gauge_sums_versions_per_workflow_and_zeroes_emptied_ones() {
    use keel_durable::VersionWaitGauge;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let read = || {
        let mut out: Vec<(String, f64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let key = key.key();
                let DebugValue::Gauge(v) = value else {
                    return None;
                };
                (key.name() == "keel_durable_instances_awaiting_runner").then(|| {
                    let labels: Vec<String> = key
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    (labels.join(","), v.into_inner())
                })
            })
            .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    };
    let wait = |workflow: &str, version: Option<u32>, instances: u64| VersionWait {
        workflow: workflow.to_owned(),
        version,
        instances,
        oldest_created_at: chrono::Utc::now(),
    };
    metrics::with_local_recorder(&recorder, || {
        let mut gauge = VersionWaitGauge::new(["w.one"]);
        gauge.export(&[wait("w.two", Some(2), 3), wait("w.two", Some(3), 1)]);
        assert_eq!(
            read(),
            [
                ("workflow=w.one".to_owned(), 0.0),
                ("workflow=w.two".to_owned(), 4.0)
            ]
        );
        gauge.export(&[wait("w.one", None, 2)]);
        assert_eq!(
            read(),
            [
                ("workflow=w.one".to_owned(), 2.0),
                ("workflow=w.two".to_owned(), 0.0)
            ]
        );
    });
}
