//! Test harness for the crash test (`tests/it/crash.rs`): an executor process that the
//! test SIGKILLs at dangerous points and starts again. Not part of Keel's binary.
//!
//! Environment: `KEEL_DURABLE_CRASH_DB` (PostgreSQL URL of a migrated database with the
//! test tables `effect` and `flag`). Runs `test.crash` instances with a 1 s lease until
//! killed.

use std::time::Duration;

use keel_durable::{
    Engine, EngineConfig, ExecutorConfig, SignalOutcome, StepError, Workflow, WorkflowContext,
    WorkflowFailure,
};
use serde_json::Value;
use sqlx::PgPool;

struct Crash(PgPool);

async fn bump(pool: &PgPool, key: &str) -> Result<i32, StepError<String>> {
    sqlx::query_scalar(
        "INSERT INTO effect (key, n) VALUES ($1, 1)
         ON CONFLICT (key) DO UPDATE SET n = effect.n + 1 RETURNING n",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .map_err(|_| StepError::transient("DB"))
}

async fn flag(pool: &PgPool, key: &str) -> Option<String> {
    sqlx::query_scalar("SELECT value FROM flag WHERE key = $1")
        .bind(key)
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
}

async fn set_flag(pool: &PgPool, key: &str, value: &str) {
    let _ = sqlx::query(
        "INSERT INTO flag (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = $2",
    )
    .bind(key)
    .bind(value)
    .execute(pool)
    .await;
}

/// Holds while flag `key` is `hold`, announcing it with flag `at-{key}`.
async fn hold(pool: &PgPool, key: &str) {
    if flag(pool, key).await.as_deref() == Some("hold") {
        set_flag(pool, &format!("at-{key}"), "yes").await;
        while flag(pool, key).await.as_deref() == Some("hold") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Workflow for Crash {
    const NAME: &'static str = "test.crash";
    type Input = String;
    type Output = String;
    type Error = String;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        tag: String,
    ) -> Result<String, WorkflowFailure<String>> {
        for (i, name) in ["s0", "s1"].into_iter().enumerate() {
            let pool = self.0.clone();
            let key = format!("{tag}-{name}");
            let hold_key = format!("hold-{name}-{tag}");
            ctx.step(name, || {
                let pool = pool.clone();
                let key = key.clone();
                let hold_key = hold_key.clone();
                async move {
                    let n = bump(&pool, &key).await?;
                    // Dangerous point 1: inside the step, its effect done, result not
                    // committed.
                    hold(&pool, &hold_key).await;
                    Ok::<_, StepError<String>>(n)
                }
            })
            .await?
            .map_err(WorkflowFailure::Failed)?;
            if i == 1 {
                // Dangerous point 2: after the commit, before the next step.
                hold(&self.0, &format!("hold-after-s1-{tag}")).await;
            }
        }
        // Dangerous points 3 and 4: while waiting on a timer and on a signal.
        // Long enough that the test sees the timer wait even on a loaded machine.
        ctx.sleep(Duration::from_secs(2)).await?;
        let _: SignalOutcome<Value> = ctx
            .wait_signal(
                "go",
                Some(keel_durable::Deadline::After(Duration::from_secs(3600))),
            )
            .await?;
        let pool = self.0.clone();
        let key = format!("{tag}-s2");
        ctx.step("s2", || {
            let pool = pool.clone();
            let key = key.clone();
            async move { bump(&pool, &key).await }
        })
        .await?
        .map_err(WorkflowFailure::Failed)?;
        Ok(tag)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("KEEL_DURABLE_CRASH_DB")?;
    let pool = keel_store::connect(&keel_store::StoreConfig::new(url)).await?;
    let config = EngineConfig {
        lease: Duration::from_secs(1),
        ..EngineConfig::default()
    };
    let engine = Engine::new(pool.clone(), config)?.register(Crash(pool));
    let executor = engine.spawn_executor(ExecutorConfig {
        concurrency: 4,
        poll_interval: Duration::from_millis(200),
        ..ExecutorConfig::default()
    })?;
    println!("ready");
    tokio::signal::ctrl_c().await?;
    executor.shutdown().await;
    Ok(())
}
