//! The DBOS Transact for Rust peer of `keel-durable-bench` (issue 3, "Benchmark").
//!
//! The same workload as Keel's benchmark: N workflows of 3 checkpointed no-op steps and a
//! zero-length durable sleep, on a fresh database on the local PostgreSQL, started by S
//! concurrent starter tasks. DBOS runs a started workflow at once as a task of the starting
//! process (no separate executor), so this is one process.
//!
//! Figures (same definitions as Keel's):
//! - throughput window: first `created_at` to last `updated_at` of the workflow rows (database
//!   clock, milliseconds in DBOS's schema);
//! - latency per workflow: `updated_at - created_at` of its `SUCCESS` row;
//! - steps/s: 3 steps per workflow (the sleep is counted separately, as in Keel);
//! - commits: `pg_stat_database.xact_commit` delta of the bench database (every transaction,
//!   read-only ones included), WAL: `pg_stat_wal` delta (cluster-wide).
//!
//! Usage: `dbos-peer-bench [--workflows N] [--start-concurrency S] [--max-connections C]
//! [--database-url URL] [--timeout-secs T]`. The URL names the admin database (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); `dbos_bench_<uuid>` is created next to it
//! and dropped at the end.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbos::{Config, DBOS};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    workflows: u64,
    start_concurrency: u64,
    max_connections: u32,
    database_url: String,
    timeout: Duration,
    log_statements: bool,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut a = Args {
        workflows: 2000,
        start_concurrency: 8,
        max_connections: 10,
        database_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned()),
        timeout: Duration::from_secs(300),
        log_statements: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--workflows" => a.workflows = value()?.parse()?,
            "--start-concurrency" => a.start_concurrency = value()?.parse()?,
            "--max-connections" => a.max_connections = value()?.parse()?,
            "--database-url" => a.database_url = value()?,
            "--timeout-secs" => a.timeout = Duration::from_secs(value()?.parse()?),
            // Diagnostic: every statement of the bench database in the server log.
            "--log-statements" => a.log_statements = true,
            "-h" | "--help" => {
                println!(
                    "dbos-peer-bench [--workflows N] [--start-concurrency S] \
                     [--max-connections C] [--database-url URL] [--timeout-secs T] [--log-statements]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if a.workflows == 0 || a.start_concurrency == 0 {
        return Err("--workflows and --start-concurrency must be at least 1".into());
    }
    Ok(a)
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    xact_commit: i64,
    wal_records: i64,
    wal_bytes: f64,
    wal_sync: i64,
    xid: i64,
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
        xact_commit,
        wal_records,
        wal_bytes,
        wal_sync,
        xid,
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

const APP: &str = "keel_peer_bench";
const VERSION: &str = "bench-1";

fn config(url: &str, max_connections: u32, migrate: bool) -> Config {
    Config {
        app_version: Some(VERSION.to_owned()),
        max_connections,
        migrate,
        ..Config::new(APP, url)
    }
}

async fn run(args: &Args, admin: &mut PgConnection, db: &str, url: &str) -> Result<(), BoxError> {
    // Migrate with a first instance and close it, so the measured window starts with every
    // backend's statistics flushed (a backend flushes them at exit).
    let setup = DBOS::new(config(url, 2, true));
    setup.launch().await?;
    setup.shutdown().await;
    drop(setup);

    let dbos = DBOS::new(config(url, args.max_connections, false));
    let workflow = dbos.register_workflow("bench.noop", |n: u64| async move {
        for name in ["s1", "s2", "s3"] {
            dbos::step(name, || async { Ok::<u64, dbos::Error>(0) }).await?;
        }
        dbos::sleep(Duration::ZERO).await?;
        Ok::<u64, dbos::Error>(n)
    })?;
    dbos.launch().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = stats(admin, db).await?;
    let pg_cpu_before = backend_cpu(admin, db).await?;
    let engine_cpu_before = cpu_ms(std::process::id());

    let wall = Instant::now();
    let workflow = Arc::new(workflow);
    let mut starters = tokio::task::JoinSet::new();
    for s in 0..args.start_concurrency {
        let workflow = workflow.clone();
        let (n, k) = (args.workflows, args.start_concurrency);
        starters.spawn(async move {
            let mut handles = Vec::new();
            let mut i = s;
            while i < n {
                handles.push(workflow.start(i).await?);
                i += k;
            }
            Ok::<_, dbos::Error>(handles)
        });
    }
    let mut handles = Vec::new();
    while let Some(r) = starters.join_next().await {
        handles.extend(r??);
    }
    let started = wall.elapsed();
    let deadline = wall + args.timeout;
    for h in handles {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, h.result())
            .await
            .map_err(|_| "timed out waiting for the workflows")??;
    }
    let wall = wall.elapsed();
    let pg_cpu: f64 = backend_cpu(admin, db)
        .await?
        .into_iter()
        .map(|(pid, ms)| ms - pg_cpu_before.get(&pid).copied().unwrap_or(0.0))
        .sum();
    let engine_cpu = cpu_ms(std::process::id()) - engine_cpu_before;
    dbos.shutdown().await;
    drop(dbos);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = stats(admin, db).await?;

    let mut conn = PgConnection::connect(url).await?;
    let (done, first, last): (i64, f64, f64) = sqlx::query_as(
        "SELECT count(*), min(created_at)::float8, max(updated_at)::float8
           FROM dbos.workflow_status WHERE status = 'SUCCESS'",
    )
    .fetch_one(&mut conn)
    .await?;
    let mut latencies: Vec<f64> = sqlx::query_scalar(
        "SELECT (updated_at - created_at)::float8 FROM dbos.workflow_status WHERE status = 'SUCCESS'",
    )
    .fetch_all(&mut conn)
    .await?;
    let steps: i64 = sqlx::query_scalar("SELECT count(*) FROM dbos.operation_outputs")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    if u64::try_from(done)? != args.workflows {
        return Err(format!("{done} of {} workflows succeeded", args.workflows).into());
    }
    latencies.sort_by(f64::total_cmp);

    let n = args.workflows as f64;
    let elapsed = ((last - first) / 1000.0).max(1e-3);
    let wf_s = n / elapsed;
    let d = |f: fn(&Stats) -> f64| (f(&after) - f(&before)) / n;
    let commits = d(|s| s.xact_commit as f64);
    let xids = d(|s| s.xid as f64);
    let wal_records = d(|s| s.wal_records as f64);
    let wal_bytes = d(|s| s.wal_bytes);
    let wal_sync = d(|s| s.wal_sync as f64);
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    let (pg_cpu, engine_cpu) = (pg_cpu / n, engine_cpu / n);
    println!(
        "dbos: CPU per workflow: PostgreSQL backends {pg_cpu:.2} ms, DBOS process {engine_cpu:.2} ms \
         ({:.2} cores busy over the run)",
        (pg_cpu + engine_cpu) * n / 1000.0 / wall.as_secs_f64()
    );
    println!(
        "dbos 0.5.0: {} workflows, {} checkpoint rows, starts took {:.2}s, wall {:.2}s",
        args.workflows,
        steps,
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
        "dbos",
        1,
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
        "RESULT engine=dbos procs=1 workflows={} elapsed_s={elapsed:.3} wf_per_s={wf_s:.1} \
         steps_per_s={:.1} p50_ms={p50:.1} p99_ms={p99:.1} commits_per_wf={commits:.2} \
         xids_per_wf={xids:.2} wal_records_per_wf={wal_records:.2} wal_bytes_per_wf={wal_bytes:.0} \
         wal_syncs_per_wf={wal_sync:.3} pg_cpu_ms_per_wf={pg_cpu:.2} \
         engine_cpu_ms_per_wf={engine_cpu:.2}",
        args.workflows,
        3.0 * wf_s
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let admin_options = PgConnectOptions::from_str(&args.database_url)?;
    let db = format!("dbos_bench_{}", uuid::Uuid::new_v4().simple());
    let mut admin = admin_options.connect().await?;
    // The name is generated here (a UUID's hex), never input.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&mut admin)
        .await?;
    let url = admin_options
        .clone()
        .database(&db)
        .to_url_lossy()
        .to_string();
    if args.log_statements {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {db} SET log_min_duration_statement = 0"
        )))
        .execute(&mut admin)
        .await?;
    }
    let outcome = run(&args, &mut admin, &db, &url).await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    outcome
}
