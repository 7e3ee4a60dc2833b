//! Throughput benchmark of `keel-durable` (issue 3, "Benchmark"); run it with
//! `scripts/bench-durable`, or `cargo bench -p keel-durable --bench keel-durable-bench --
//! --workflows 2000 --executors 2`.
//!
//! The workload: N instances of `bench.noop` (3 journaled no-op steps and a zero-length
//! durable sleep) on a fresh database `keel_bench_<uuid>` on the local PostgreSQL, run by
//! 1 or 2 executor **processes** (this executable again, in `--executor-only` mode). The
//! parent starts the instances from S concurrent starter tasks and polls the count of
//! completed instances until all are done (bounded by `--timeout-secs`), then reads:
//!
//! - throughput window: first `created_at` to last `ended_at` of the instances (database
//!   clock); workflows/s = N / window, steps/s = 3 N / window (the sleep is not a step);
//! - latency per instance: `ended_at - created_at` (start committed → completion settled);
//! - `pg_stat_database.xact_commit` delta of the bench database per workflow (every
//!   transaction, read-only ones included: with autocommit statements this is the number of
//!   statements, i.e. round trips that reach the executor of PostgreSQL), the XID delta
//!   (write transactions, cluster-wide) and the `pg_stat_wal` delta (WAL records, bytes and
//!   fsyncs; cluster-wide, so other load on the server shows up there).
//!
//! The last line is `RESULT key=value ...` for the runner script. Without `--bench` (which
//! `cargo bench` passes) or `--executor-only` the program only prints how to run it, so a
//! `cargo test --benches` stays cheap.

use std::str::FromStr;
use std::time::{Duration, Instant};

use clap::Parser;
use keel_durable::{
    Engine, EngineConfig, ExecutorConfig, StartOptions, StepError, Workflow, WorkflowContext,
    WorkflowFailure,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Keel durable-engine benchmark.
#[derive(Debug, Parser)]
struct Args {
    /// Workflow instances to run.
    #[arg(long, default_value_t = 2000)]
    workflows: u64,
    /// Executor processes (1 or 2).
    #[arg(long, default_value_t = 1)]
    executors: u32,
    /// Concurrent segments per executor process. A segment holds no connection while it
    /// waits (its writes go through the group-commit flushers), so this bounds the
    /// workflows in flight, not the connections.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Pooled connections per executor process (default 10: the production pool,
    /// `database.maxConnections`, and DBOS's default).
    #[arg(long)]
    max_connections: Option<u32>,
    /// Concurrent starter tasks in the parent.
    #[arg(long, default_value_t = 8)]
    start_concurrency: u64,
    /// Executor poll interval in milliseconds (the fallback to LISTEN/NOTIFY).
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// PostgreSQL URL: the admin database (parent) or the bench database (--executor-only).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// Give up waiting for completion after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Diagnostic: start all instances before the executors run, and measure from the
    /// executors' spawn to the last completion (executor throughput alone; the latency then
    /// includes the queueing behind the pre-started backlog).
    #[arg(long)]
    prestart: bool,
    /// Diagnostic: pools without sqlx's `test_before_acquire` ping (one round trip saved per
    /// statement; `keel_store::connect` keeps the default, on).
    #[arg(long)]
    no_ping: bool,
    /// Diagnostic: `ALTER DATABASE <bench db> SET log_min_duration_statement = <ms>`, so the
    /// server log gets every statement of the run at least that slow with its server time
    /// (0: all of them), and `auto_explain` logs the plan of any statement slower than
    /// max(ms, 20).
    #[arg(long, value_name = "MS")]
    log_statements: Option<u64>,
    /// Diagnostic: `ALTER DATABASE <bench db> SET plan_cache_mode = force_custom_plan`: every
    /// execution of a prepared statement is planned with its parameters and the current
    /// statistics (no cached generic plan for the claim).
    #[arg(long)]
    custom_plans: bool,
    /// Run only an executor on --database-url until stdin closes (the child mode).
    #[arg(long)]
    executor_only: bool,
    /// Passed by `cargo bench`; required to run the benchmark itself.
    #[arg(long)]
    bench: bool,
}

/// Pooled connections per executor process unless `--max-connections` says otherwise.
const DEFAULT_EXECUTOR_CONNECTIONS: u32 = 10;

/// The benchmark workflow: three journaled no-op steps and a zero-length durable sleep.
struct Noop;

impl Workflow for Noop {
    const NAME: &'static str = "bench.noop";
    type Input = u64;
    type Output = u64;
    type Error = String;

    async fn run(&self, ctx: &mut WorkflowContext, n: u64) -> Result<u64, WorkflowFailure<String>> {
        for name in ["s1", "s2", "s3"] {
            ctx.step(name, || async { Ok::<u64, StepError<String>>(0) })
                .await?
                .map_err(WorkflowFailure::Failed)?;
        }
        ctx.sleep(Duration::ZERO).await?;
        Ok(n)
    }
}

/// A pool like `keel_store::connect`'s (sqlx defaults: a ping before every acquire),
/// or without the ping.
async fn pool(url: &str, max_connections: u32, ping: bool) -> Result<PgPool, BoxError> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(ping)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(PgConnectOptions::from_str(url)?)
        .await?)
}

/// The child: an executor on the bench database until stdin closes.
async fn executor_only(args: &Args) -> Result<(), BoxError> {
    let max = args.max_connections.unwrap_or(DEFAULT_EXECUTOR_CONNECTIONS);
    let pool = pool(&args.database_url, max, !args.no_ping).await?;
    let engine = Engine::new(pool.clone(), EngineConfig::default())?.register(Noop);
    let executor = engine.spawn_executor(ExecutorConfig {
        concurrency: args.concurrency,
        poll_interval: Duration::from_millis(args.poll_ms),
        ..ExecutorConfig::default()
    })?;
    println!("ready");
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    executor.shutdown().await;
    pool.close().await;
    Ok(())
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    xact_commit: f64,
    xid: f64,
    wal_records: f64,
    wal_bytes: f64,
    wal_sync: f64,
}

async fn stats(admin: &mut PgConnection, db: &str) -> Result<Stats, BoxError> {
    let (xact_commit,): (i64,) =
        sqlx::query_as("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
            .bind(db)
            .fetch_one(&mut *admin)
            .await?;
    let (wal_records, wal_bytes, wal_sync): (i64, f64, i64) =
        sqlx::query_as("SELECT wal_records, wal_bytes::float8, wal_sync FROM pg_stat_wal")
            .fetch_one(&mut *admin)
            .await?;
    let (xid,): (i64,) =
        sqlx::query_as("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8")
            .fetch_one(&mut *admin)
            .await?;
    Ok(Stats {
        xact_commit: xact_commit as f64,
        xid: xid as f64,
        wal_records: wal_records as f64,
        wal_bytes,
        wal_sync: wal_sync as f64,
    })
}

/// CPU time (user + system) of a process in milliseconds, from `/proc` (Linux; 0 when
/// unreadable). Clock ticks are 100 per second on Linux.
fn cpu_ms(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // After "pid (comm)": state is field 3, utime 14, stime 15.
    (field(11) + field(12)) * 10.0
}

/// CPU milliseconds of the server backends connected to `db`, by pid.
async fn backend_cpu(
    admin: &mut PgConnection,
    db: &str,
) -> Result<std::collections::HashMap<i32, f64>, BoxError> {
    let pids: Vec<i32> = sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1")
        .bind(db)
        .fetch_all(&mut *admin)
        .await?;
    Ok(pids
        .into_iter()
        .map(|p| (p, cpu_ms(u32::try_from(p).unwrap_or(0))))
        .collect())
}

/// CPU milliseconds of this process and the executor children.
fn engine_cpu(children: &[Child]) -> f64 {
    cpu_ms(std::process::id())
        + children
            .iter()
            .filter_map(Child::id)
            .map(cpu_ms)
            .sum::<f64>()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Starts an executor child process on `url` and waits for its `ready` line.
async fn spawn_executor(args: &Args, url: &str) -> Result<Child, BoxError> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--executor-only")
        .arg("--database-url")
        .arg(url)
        .arg("--concurrency")
        .arg(args.concurrency.to_string())
        .arg("--poll-ms")
        .arg(args.poll_ms.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(m) = args.max_connections {
        cmd.arg("--max-connections").arg(m.to_string());
    }
    if args.no_ping {
        cmd.arg("--no-ping");
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
        Ok(Ok(Some(line))) if line == "ready" => Ok(child),
        other => Err(format!("executor child did not start: {other:?}").into()),
    }
}

async fn run(args: &Args, admin: &mut PgConnection, db: &str, url: &str) -> Result<(), BoxError> {
    // Migrate with a pool that is closed before the window: backends flush their
    // statistics at exit, so the counters below start clean.
    let setup = pool(url, 2, true).await?;
    keel_store::migrate(&setup).await?;
    setup.close().await;

    let pool = pool(
        url,
        u32::try_from(args.start_concurrency)?.saturating_add(2),
        !args.no_ping,
    )
    .await?;
    let engine = Engine::new(pool.clone(), EngineConfig::default())?;
    let mut children = Vec::new();
    if !args.prestart {
        for _ in 0..args.executors {
            children.push(spawn_executor(args, url).await?);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let before = stats(admin, db).await?;
    let pg_cpu_before = backend_cpu(admin, db).await?;
    let engine_cpu_before = engine_cpu(&children);

    let wall = Instant::now();
    let mut starters = tokio::task::JoinSet::new();
    for s in 0..args.start_concurrency {
        let engine = engine.clone();
        let (n, k) = (args.workflows, args.start_concurrency);
        starters.spawn(async move {
            let mut i = s;
            while i < n {
                engine
                    .start::<Noop>(&format!("bench-{i}"), &i, StartOptions::default())
                    .await?;
                i += k;
            }
            Ok::<_, keel_durable::DurableError>(())
        });
    }
    while let Some(r) = starters.join_next().await {
        r??;
    }
    let started = wall.elapsed();
    // With --prestart the window opens when the executors are spawned (database clock).
    let mut window_start: Option<f64> = None;
    let mut wall = wall;
    if args.prestart {
        window_start = Some(
            sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
                .fetch_one(&pool)
                .await?,
        );
        wall = Instant::now();
        for _ in 0..args.executors {
            children.push(spawn_executor(args, url).await?);
        }
    }
    let deadline = wall + Duration::from_secs(args.timeout_secs);
    loop {
        let (done, failed): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'completed'),
                    count(*) FILTER (WHERE status IN ('failed', 'suspended', 'cancelled'))
               FROM durable_instance",
        )
        .fetch_one(&pool)
        .await?;
        if failed > 0 {
            return Err(format!("{failed} instances failed or were suspended").into());
        }
        if u64::try_from(done)? >= args.workflows {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "timed out: {done} of {} instances completed",
                args.workflows
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall = wall.elapsed();
    let backends_after = backend_cpu(admin, db).await?;
    let backends = backends_after.len();
    let pg_cpu: f64 = backends_after
        .into_iter()
        .map(|(pid, ms)| ms - pg_cpu_before.get(&pid).copied().unwrap_or(0.0))
        .sum();
    let engine_cpu = engine_cpu(&children) - engine_cpu_before;

    // Stop the executors (stdin closes) and let every backend exit and flush its stats.
    for mut child in children {
        drop(child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
    let (first, last): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM min(created_at))::float8, extract(epoch FROM max(ended_at))::float8
           FROM durable_instance",
    )
    .fetch_one(&pool)
    .await?;
    let mut latencies: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM ended_at - created_at)::float8 * 1000 FROM durable_instance",
    )
    .fetch_all(&pool)
    .await?;
    let journal: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_journal")
        .fetch_one(&pool)
        .await?;
    let commands: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_command")
        .fetch_one(&pool)
        .await?;
    // Commands that needed more than one attempt (infrastructure failures, lapsed leases).
    let retried: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT coalesce(last_error, outcome, state), count(*), max(attempt)
           FROM durable_command WHERE attempt > 1 OR last_error IS NOT NULL GROUP BY 1",
    )
    .fetch_all(&pool)
    .await?;
    for (why, count, attempts) in &retried {
        println!("keel: {count} command(s) retried ({why}), up to {attempts} attempts");
    }
    // Where an instance's start → completion goes (database clock, per instance):
    // queued = created → its first journal entry (the START waits for a slot and is
    // claimed); start segment = first journal entry → the START's settle (the steps and
    // the sleep's deadline entry); timer = the START's settle (the TIMER's creation) →
    // completion (the TIMER waits for a slot, is claimed, replays and settles).
    let phases: Vec<(f64, f64, f64)> = sqlx::query_as(
        "SELECT extract(epoch FROM j.first - i.created_at)::float8 * 1000,
                extract(epoch FROM s.completed_at - j.first)::float8 * 1000,
                extract(epoch FROM i.ended_at - s.completed_at)::float8 * 1000
           FROM durable_instance i
           JOIN durable_command s ON s.instance_id = i.id AND s.kind = 'start'
           JOIN LATERAL (SELECT min(recorded_at) AS first FROM durable_journal
                          WHERE instance_id = i.id) j ON true",
    )
    .fetch_all(&pool)
    .await?;
    let mut cols: [Vec<f64>; 3] = Default::default();
    for (a, b, c) in phases {
        cols[0].push(a);
        cols[1].push(b);
        cols[2].push(c);
    }
    for c in &mut cols {
        c.sort_by(f64::total_cmp);
    }
    println!(
        "keel: phases p50/p99 ms: queued (created -> first journal entry) {:.0}/{:.0}, \
         start segment {:.0}/{:.0}, timer (start settled -> completed) {:.0}/{:.0}",
        percentile(&cols[0], 50.0),
        percentile(&cols[0], 99.0),
        percentile(&cols[1], 50.0),
        percentile(&cols[1], 99.0),
        percentile(&cols[2], 50.0),
        percentile(&cols[2], 99.0)
    );
    // Whether the executors keep pace with the burst: completions while the starts
    // arrive (first → last creation) and after.
    let (burst_s, during, rest_s): (f64, i64, f64) = sqlx::query_as(
        "WITH w AS (SELECT min(created_at) AS a, max(created_at) AS b, max(ended_at) AS e
                      FROM durable_instance)
         SELECT extract(epoch FROM w.b - w.a)::float8,
                (SELECT count(*) FROM durable_instance WHERE ended_at <= w.b),
                extract(epoch FROM w.e - w.b)::float8
           FROM w",
    )
    .fetch_one(&pool)
    .await?;
    println!(
        "keel: starts arrived over {burst_s:.2}s ({:.0}/s); {during} completed meanwhile ({:.0}/s), \
         the other {} in the {rest_s:.2}s after ({:.0}/s)",
        args.workflows as f64 / burst_s.max(1e-3),
        during as f64 / burst_s.max(1e-3),
        args.workflows as i64 - during,
        (args.workflows as i64 - during) as f64 / rest_s.max(1e-3)
    );
    pool.close().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = stats(admin, db).await?;
    latencies.sort_by(f64::total_cmp);

    let n = args.workflows as f64;
    let elapsed = (last - window_start.unwrap_or(first)).max(1e-3);
    let wf_s = n / elapsed;
    let d = |f: fn(&Stats) -> f64| (f(&after) - f(&before)) / n;
    let commits = d(|s| s.xact_commit);
    let xids = d(|s| s.xid);
    let wal_records = d(|s| s.wal_records);
    let wal_bytes = d(|s| s.wal_bytes);
    let wal_sync = d(|s| s.wal_sync);
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    let (pg_cpu, engine_cpu) = (pg_cpu / n, engine_cpu / n);
    println!(
        "keel: CPU per workflow: PostgreSQL backends {pg_cpu:.2} ms, Keel processes {engine_cpu:.2} ms \
         ({:.2} cores busy over the run; {backends} backends connected at the end, the parent's included)",
        (pg_cpu + engine_cpu) * n / 1000.0 / wall.as_secs_f64()
    );
    println!(
        "keel: {} workflows{}, {journal} journal rows, {commands} commands, {} executor process(es) x {} segments, starts took {:.2}s, wall {:.2}s",
        args.workflows,
        [
            (args.prestart, " (pre-started)"),
            (args.no_ping, " (no pool ping)"),
            (args.custom_plans, " (custom plans)"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, what)| *what)
        .collect::<String>(),
        args.executors,
        args.concurrency,
        started.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!(
        "{:<10} {:>5} {:>8} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>8} {:>9} {:>10}",
        "engine",
        "procs",
        "n",
        "elapsed_s",
        "wf/s",
        "steps/s",
        "p50_ms",
        "p99_ms",
        "commits/wf",
        "xids/wf",
        "wal_kB/wf",
        "fsyncs/wf"
    );
    println!(
        "{:<10} {:>5} {:>8} {:>9.2} {:>9.0} {:>10.0} {:>9.1} {:>9.1} {:>10.2} {:>8.2} {:>9.2} {:>10.3}",
        "keel",
        args.executors,
        args.workflows,
        elapsed,
        wf_s,
        3.0 * wf_s,
        p50,
        p99,
        commits,
        xids,
        wal_bytes / 1024.0,
        wal_sync
    );
    println!(
        "RESULT engine=keel procs={} workflows={} elapsed_s={elapsed:.3} wf_per_s={wf_s:.1} \
         steps_per_s={:.1} p50_ms={p50:.1} p99_ms={p99:.1} commits_per_wf={commits:.2} \
         xids_per_wf={xids:.2} wal_records_per_wf={wal_records:.2} wal_bytes_per_wf={wal_bytes:.0} \
         wal_syncs_per_wf={wal_sync:.3} pg_cpu_ms_per_wf={pg_cpu:.2} \
         engine_cpu_ms_per_wf={engine_cpu:.2}",
        args.executors,
        args.workflows,
        3.0 * wf_s
    );
    Ok(())
}

async fn bench(args: &Args) -> Result<(), BoxError> {
    if args.workflows == 0 || args.start_concurrency == 0 || args.concurrency == 0 {
        return Err("--workflows, --concurrency and --start-concurrency must be at least 1".into());
    }
    if !(1..=2).contains(&args.executors) {
        return Err("--executors must be 1 or 2".into());
    }
    let admin_options = PgConnectOptions::from_str(&args.database_url)?;
    // Generated here (a UUID's hex), never input: safe to splice into the DDL.
    let db = format!("keel_bench_{}", uuid::Uuid::new_v4().simple());
    let mut admin = admin_options.connect().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&mut admin)
        .await?;
    let url = admin_options
        .clone()
        .database(&db)
        .to_url_lossy()
        .to_string();
    if args.custom_plans {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {db} SET plan_cache_mode = force_custom_plan"
        )))
        .execute(&mut admin)
        .await?;
    }
    if let Some(ms) = args.log_statements {
        for setting in [
            format!("log_min_duration_statement = {ms}"),
            "session_preload_libraries = 'auto_explain'".to_owned(),
            format!("auto_explain.log_min_duration = {}", ms.max(20)),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "ALTER DATABASE {db} SET {setting}"
            )))
            .execute(&mut admin)
            .await?;
        }
    }
    let outcome = run(args, &mut admin, &db, &url).await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    let _ = admin.close().await;
    outcome
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.executor_only {
        return executor_only(&args).await;
    }
    if !args.bench {
        println!(
            "keel-durable-bench: run it with scripts/bench-durable, or \
             cargo bench -p keel-durable --bench keel-durable-bench -- --workflows N --executors 1|2"
        );
        return Ok(());
    }
    bench(&args).await
}
