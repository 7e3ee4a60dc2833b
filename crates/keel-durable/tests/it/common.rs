//! Test workflows, a side-effect table and probe-based helpers.

use std::time::Duration;

use keel_durable::{
    Backoff, Deadline, Engine, EngineConfig, ExecutorConfig, ExecutorHandle, InstanceStatus,
    RunStatus, SignalOutcome, StepError, Workflow, WorkflowContext, WorkflowFailure,
};
use keel_store::testing::TestDatabase;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) fn fast_config() -> EngineConfig {
    EngineConfig {
        lease: Duration::from_secs(5),
        step_backoff: Backoff {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
        },
        recovery_backoff: Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
        },
        release_backoff: Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
        },
        ..EngineConfig::default()
    }
}

pub(crate) fn executor_config() -> ExecutorConfig {
    ExecutorConfig {
        concurrency: 4,
        poll_interval: Duration::from_millis(500),
        ..ExecutorConfig::default()
    }
}

/// A migrated test database with the side-effect tables.
pub(crate) async fn database() -> TestDatabase {
    let db = TestDatabase::create().await.expect("test database");
    for ddl in [
        "CREATE TABLE effect (key TEXT PRIMARY KEY, n INTEGER NOT NULL)",
        "CREATE TABLE flag (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE event_log (id BIGSERIAL PRIMARY KEY, tag TEXT NOT NULL, what TEXT NOT NULL)",
        "CREATE TABLE inflight (instance TEXT PRIMARY KEY, n INTEGER NOT NULL)",
        "CREATE TABLE violation (id BIGSERIAL PRIMARY KEY, instance TEXT NOT NULL)",
    ] {
        sqlx::query(ddl).execute(db.pool()).await.expect("ddl");
    }
    db
}

/// An engine with every test workflow registered.
pub(crate) fn engine(pool: &PgPool, config: EngineConfig) -> Engine {
    let p = pool.clone();
    Engine::new(pool.clone(), config)
        .expect("engine")
        .register(Counter(p.clone()))
        .register(Gated(p.clone()))
        .register(Nondet(p.clone()))
        .register(Typed(p.clone()))
        .register(Waiter)
        .register(Fails)
        .register(SelfCancel)
        .register(Serial(p.clone()))
        .register(Exclusive(p.clone()))
        .register(Dependency(p.clone()))
        .register(Panics)
        .register(Stall(p.clone()))
        .register(Values)
        .register(Parent)
        .register(NeedsChain(p.clone()))
}

pub(crate) fn spawn(engine: &Engine) -> ExecutorHandle {
    engine.spawn_executor(executor_config()).expect("executor")
}

/// Increments and returns the side-effect counter `key`.
pub(crate) async fn bump(pool: &PgPool, key: &str) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO effect (key, n) VALUES ($1, 1)
         ON CONFLICT (key) DO UPDATE SET n = effect.n + 1 RETURNING n",
    )
    .bind(key)
    .fetch_one(pool)
    .await
}

pub(crate) async fn effect(pool: &PgPool, key: &str) -> i32 {
    sqlx::query_scalar("SELECT n FROM effect WHERE key = $1")
        .bind(key)
        .fetch_optional(pool)
        .await
        .unwrap()
        .unwrap_or(0)
}

pub(crate) async fn set_flag(pool: &PgPool, key: &str, value: &str) {
    sqlx::query(
        "INSERT INTO flag (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = $2",
    )
    .bind(key)
    .bind(value)
    .execute(pool)
    .await
    .unwrap();
}

pub(crate) async fn flag(pool: &PgPool, key: &str) -> Option<String> {
    sqlx::query_scalar("SELECT value FROM flag WHERE key = $1")
        .bind(key)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Probe-driven wait for a status condition: between looks it waits for the queue to be
/// idle (short polls only while timers are pending).
pub(crate) async fn until(
    engine: &Engine,
    id: Uuid,
    what: &str,
    pred: impl Fn(&InstanceStatus) -> bool,
) -> InstanceStatus {
    keel_store::testing::until(what, TIMEOUT, || async {
        let _ = engine.await_idle(Duration::from_millis(200)).await;
        let s = engine.status(id).await.unwrap();
        if pred(&s) {
            std::ops::ControlFlow::Break(s)
        } else {
            std::ops::ControlFlow::Continue(s)
        }
    })
    .await
}

pub(crate) async fn until_status(engine: &Engine, id: Uuid, status: RunStatus) -> InstanceStatus {
    until(engine, id, status.as_str(), |s| s.status == status).await
}

/// The crash worker: a child process (`keel-durable-crash-worker`) running an executor
/// on the database at `url`, which the test kills with SIGKILL at a dangerous point
/// (a test flag makes it hold there; [`until_flag`] sees it arrive). Killed and reaped
/// on drop too, so a failing test leaves no process behind.
pub(crate) struct Worker(std::process::Child);

impl Worker {
    /// Starts a worker on the database at `url` (output discarded).
    pub(crate) fn start(url: &str) -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_keel-durable-crash-worker"))
            .env("KEEL_DURABLE_CRASH_DB", url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn worker");
        Self(child)
    }

    /// SIGKILL (std's `Child::kill` on Unix) and reap.
    pub(crate) fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `sql` (a database condition, one boolean) until true.
pub(crate) async fn until_db(pool: &PgPool, what: &str, sql: &'static str) {
    keel_store::testing::until_sql(pool, what, TIMEOUT, sql).await;
}

/// Polls until the test flag `key` is set (a worker reached the point it names).
pub(crate) async fn until_flag(pool: &PgPool, key: &str) {
    keel_store::testing::until(key, TIMEOUT, || async { flag(pool, key).await.is_some() }).await;
}

fn infra<E>(_: sqlx::Error) -> StepError<E> {
    StepError::transient("DB")
}

// ---------------------------------------------------------------- workflows

/// `steps` steps, each bumping `{tag}-{i}`; returns the sum of the counters seen.
pub(crate) struct Counter(pub(crate) PgPool);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CounterInput {
    pub(crate) tag: String,
    pub(crate) steps: u32,
}

impl Workflow for Counter {
    const NAME: &'static str = "test.counter";
    type Input = CounterInput;
    type Output = i64;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: CounterInput,
    ) -> Result<i64, WorkflowFailure<String>> {
        let mut sum = 0i64;
        for i in 0..input.steps {
            let key = format!("{}-{i}", input.tag);
            let pool = self.0.clone();
            let n: i32 = ctx
                .step(&format!("s{i}"), || {
                    let pool = pool.clone();
                    let key = key.clone();
                    async move { bump(&pool, &key).await.map_err(infra) }
                })
                .await?
                .map_err(WorkflowFailure::Failed)?;
            sum += i64::from(n);
            ctx.set_progress(serde_json::json!({ "done": i + 1 }));
        }
        Ok(sum)
    }
}

/// Steps a, b, c; b hangs (polling) while flag `gate-{tag}` is not `open`. Each bumps
/// `{tag}-a|b|c` first.
pub(crate) struct Gated(pub(crate) PgPool);

impl Workflow for Gated {
    const NAME: &'static str = "test.gated";
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        for name in ["a", "b", "c"] {
            let pool = self.0.clone();
            let key = format!("{tag}-{name}");
            let gate = format!("gate-{tag}");
            ctx.step(name, || {
                let pool = pool.clone();
                let key = key.clone();
                let gate = gate.clone();
                async move {
                    bump(&pool, &key).await.map_err(infra)?;
                    if name == "b" {
                        while flag(&pool, &gate).await.as_deref() != Some("open") {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    Ok::<_, StepError<String>>(())
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        }
        Ok(tag)
    }
}

/// Non-deterministic on purpose: its first step's name comes from flag `variant`, read
/// outside any step; then it waits for signal `go`.
pub(crate) struct Nondet(pub(crate) PgPool);

impl Workflow for Nondet {
    const NAME: &'static str = "test.nondet";
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        let variant = flag(&self.0, "variant").await.unwrap_or_default();
        let pool = self.0.clone();
        let key = format!("{tag}-first");
        ctx.step(&format!("first-{variant}"), || {
            let pool = pool.clone();
            let key = key.clone();
            async move { bump(&pool, &key).await.map_err(infra) }
        })
        .await?
        .map_err(WorkflowFailure::Failed)?;
        let _: SignalOutcome<Value> = ctx.wait_signal("go", None).await?;
        Ok(variant)
    }
}

/// A step that fails with a typed error, journaled; the body branches on it, then waits
/// for `go` and reports what it saw.
pub(crate) struct Typed(pub(crate) PgPool);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Lookup {
    NotFound { what: String },
}

impl Workflow for Typed {
    const NAME: &'static str = "test.typed";
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        let pool = self.0.clone();
        let key = format!("{tag}-lookup");
        let r: Result<u32, Lookup> = ctx
            .step("lookup", || {
                let pool = pool.clone();
                let key = key.clone();
                async move {
                    bump(&pool, &key).await.map_err(infra)?;
                    Err(StepError::Failed(Lookup::NotFound {
                        what: "system".into(),
                    }))
                }
            })
            .await?;
        let _: SignalOutcome<Value> = ctx.wait_signal("go", None).await?;
        Ok(match r {
            Ok(n) => format!("found {n}"),
            Err(Lookup::NotFound { what }) => format!("missing {what}"),
        })
    }
}

/// Optional sleep, then a signal wait with an optional deadline.
pub(crate) struct Waiter;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WaiterInput {
    pub(crate) signal: String,
    pub(crate) deadline_ms: Option<u64>,
    pub(crate) sleep_ms: Option<u64>,
}

impl Workflow for Waiter {
    const NAME: &'static str = "test.waiter";
    type Input = WaiterInput;
    type Output = SignalOutcome<Value>;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: WaiterInput,
    ) -> Result<SignalOutcome<Value>, WorkflowFailure<String>> {
        if let Some(ms) = input.sleep_ms {
            ctx.sleep(Duration::from_millis(ms)).await?;
        }
        let deadline = input
            .deadline_ms
            .map(|ms| Deadline::After(Duration::from_millis(ms)));
        Ok(ctx.wait_signal(&input.signal, deadline).await?)
    }
}

/// Runs one step, then ends itself `cancelled` (`ctx.cancel_self`).
pub(crate) struct SelfCancel;

impl Workflow for SelfCancel {
    const NAME: &'static str = "test.self_cancel";
    type Input = ();
    type Output = ();
    type Error = String;

    async fn run(&self, ctx: &mut WorkflowContext, _: ()) -> Result<(), WorkflowFailure<String>> {
        let _ = ctx.uuid().await?;
        Err(ctx.cancel_self().into())
    }
}

/// Fails with its typed error.
pub(crate) struct Fails;

impl Workflow for Fails {
    const NAME: &'static str = "test.fails";
    type Input = u32;
    type Output = ();
    type Error = String;

    async fn run(&self, ctx: &mut WorkflowContext, n: u32) -> Result<(), WorkflowFailure<String>> {
        let _ = ctx.uuid().await?;
        Err(WorkflowFailure::Failed(format!("refused {n}")))
    }
}

/// Logs enter, sleeps 150 ms (durable), logs exit.
pub(crate) struct Serial(pub(crate) PgPool);

impl Workflow for Serial {
    const NAME: &'static str = "test.serial";
    type Input = String;
    type Output = ();
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<(), WorkflowFailure<String>> {
        for (i, what) in ["enter", "exit"].into_iter().enumerate() {
            let pool = self.0.clone();
            let tag2 = tag.clone();
            ctx.step(what, || {
                let pool = pool.clone();
                let tag = tag2.clone();
                async move {
                    sqlx::query("INSERT INTO event_log (tag, what) VALUES ($1, $2)")
                        .bind(tag)
                        .bind(what)
                        .execute(&pool)
                        .await
                        .map_err(infra)?;
                    Ok::<_, StepError<String>>(())
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
            if i == 0 {
                ctx.sleep(Duration::from_millis(150)).await?;
            }
        }
        Ok(())
    }
}

/// Detects concurrent segments of one instance: every step marks the instance in
/// flight and records a violation if it already was.
pub(crate) struct Exclusive(pub(crate) PgPool);

impl Workflow for Exclusive {
    const NAME: &'static str = "test.exclusive";
    type Input = String;
    type Output = u32;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<u32, WorkflowFailure<String>> {
        let mut received = 0;
        for i in 0..3 {
            let pool = self.0.clone();
            let tag2 = tag.clone();
            ctx.step(&format!("work{i}"), || {
                let pool = pool.clone();
                let tag = tag2.clone();
                async move {
                    let n: i32 = sqlx::query_scalar(
                        "INSERT INTO inflight (instance, n) VALUES ($1, 1)
                         ON CONFLICT (instance) DO UPDATE SET n = inflight.n + 1 RETURNING n",
                    )
                    .bind(&tag)
                    .fetch_one(&pool)
                    .await
                    .map_err(infra)?;
                    if n != 1 {
                        sqlx::query("INSERT INTO violation (instance) VALUES ($1)")
                            .bind(&tag)
                            .execute(&pool)
                            .await
                            .map_err(infra)?;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    sqlx::query("UPDATE inflight SET n = n - 1 WHERE instance = $1")
                        .bind(&tag)
                        .execute(&pool)
                        .await
                        .map_err(infra)?;
                    Ok::<_, StepError<String>>(())
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
            if let SignalOutcome::Received(_) =
                ctx.wait_signal::<Value>(&format!("ping{i}"), None).await?
            {
                received += 1;
            }
        }
        Ok(received)
    }
}

/// A step that fails transiently while flag `dep` is not `up`.
pub(crate) struct Dependency(pub(crate) PgPool);

impl Workflow for Dependency {
    const NAME: &'static str = "test.dependency";
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        let pool = self.0.clone();
        let key = format!("{tag}-call");
        let v = ctx
            .step("call", || {
                let pool = pool.clone();
                let key = key.clone();
                async move {
                    bump(&pool, &key).await.map_err(infra)?;
                    match flag(&pool, "dep").await.as_deref() {
                        Some("up") => Ok("answer".to_owned()),
                        _ => Err(StepError::transient("DEP_DOWN")),
                    }
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        Ok(v)
    }
}

/// Panics in its step, always.
pub(crate) struct Panics;

impl Workflow for Panics {
    const NAME: &'static str = "test.panics";
    type Input = ();
    type Output = ();
    type Error = String;

    async fn run(&self, ctx: &mut WorkflowContext, _: ()) -> Result<(), WorkflowFailure<String>> {
        ctx.step("boom", || async {
            if std::hint::black_box(true) {
                panic!("deliberate test panic");
            }
            Ok::<(), StepError<String>>(())
        })
        .await?
        .map_err(WorkflowFailure::Failed)?;
        Ok(())
    }
}

/// Step `slow` returns how many times it has run; its first run hangs until flag
/// `release` is `yes`. Then step `after`.
pub(crate) struct Stall(pub(crate) PgPool);

impl Workflow for Stall {
    const NAME: &'static str = "test.stall";
    type Input = String;
    type Output = i32;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<i32, WorkflowFailure<String>> {
        let pool = self.0.clone();
        let key = format!("{tag}-slow");
        let n = ctx
            .step("slow", || {
                let pool = pool.clone();
                let key = key.clone();
                async move {
                    let n = bump(&pool, &key).await.map_err(infra)?;
                    if n == 1 {
                        while flag(&pool, "release").await.as_deref() != Some("yes") {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    Ok::<_, StepError<String>>(n)
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
        let key = format!("{tag}-after");
        let pool = self.0.clone();
        ctx.step("after", || {
            let pool = pool.clone();
            let key = key.clone();
            async move { bump(&pool, &key).await.map_err(infra) }
        })
        .await?
        .map_err(WorkflowFailure::Failed)?;
        Ok(n)
    }
}

/// Step `need` fails with [`StepError::Unavailable`] (`CHAIN_UNAVAILABLE`, wake tag
/// `chain:{tag}`) until flag `up-{tag}` is `yes`, counting each try in `{tag}-tries`;
/// then it completes with the number of tries.
pub(crate) struct NeedsChain(pub(crate) PgPool);

impl Workflow for NeedsChain {
    const NAME: &'static str = "test.needs_chain";
    type Input = String;
    type Output = i32;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<i32, WorkflowFailure<String>> {
        let pool = self.0.clone();
        ctx.step("need", || {
            let (pool, tag) = (pool.clone(), tag.clone());
            async move {
                let n = bump(&pool, &format!("{tag}-tries")).await.map_err(infra)?;
                if flag(&pool, &format!("up-{tag}")).await.as_deref() == Some("yes") {
                    Ok(n)
                } else {
                    Err(StepError::unavailable(
                        "CHAIN_UNAVAILABLE",
                        format!("chain:{tag}"),
                    ))
                }
            }
        })
        .await?
        .map_err(WorkflowFailure::Failed)
    }
}

pub(crate) fn waiter(signal: &str, deadline_ms: Option<u64>, sleep_ms: Option<u64>) -> WaiterInput {
    WaiterInput {
        signal: signal.to_owned(),
        deadline_ms,
        sleep_ms,
    }
}

pub(crate) fn opts() -> keel_durable::StartOptions {
    keel_durable::StartOptions::default()
}

/// Count of journal entries of an instance.
pub(crate) async fn journal_len(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM durable_journal WHERE instance_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Journaled non-deterministic values, returned after a signal (so from the replay).
pub(crate) struct Values;

impl Workflow for Values {
    const NAME: &'static str = "test.values";
    type Input = ();
    type Output = (chrono::DateTime<chrono::Utc>, Uuid, u64);
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        _: (),
    ) -> Result<Self::Output, WorkflowFailure<String>> {
        let now = ctx.now().await?;
        let id = ctx.uuid().await?;
        let r = ctx.random().await?;
        let _: SignalOutcome<Value> = ctx.wait_signal("go", None).await?;
        Ok((now, id, r))
    }
}

/// Starts a child (a Counter, or a Waiter for `go`) and reports how it ended.
pub(crate) struct Parent;

impl Workflow for Parent {
    const NAME: &'static str = "test.parent";
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        mode: String,
    ) -> Result<String, WorkflowFailure<String>> {
        use keel_durable::ChildOutcome;
        if mode == "counter" {
            let child = ctx
                .start_child::<Counter>(
                    "c1",
                    &CounterInput {
                        tag: "child".into(),
                        steps: 2,
                    },
                )
                .await?;
            ctx.set_progress(serde_json::json!({ "child": child.instance_id() }));
            return Ok(match ctx.await_child(child, None).await? {
                ChildOutcome::Completed(sum) => format!("sum {sum}"),
                other => format!("{other:?}"),
            });
        }
        let child = ctx
            .start_child::<Waiter>("w1", &waiter("go", None, None))
            .await?;
        ctx.set_progress(serde_json::json!({ "child": child.instance_id() }));
        Ok(match ctx.await_child(child, None).await? {
            ChildOutcome::Completed(_) => "completed".to_owned(),
            ChildOutcome::Cancelled => "cancelled".to_owned(),
            ChildOutcome::Expired => "expired".to_owned(),
        })
    }
}
