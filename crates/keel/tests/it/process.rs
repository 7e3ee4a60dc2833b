//! The `keel` binary as a process: `migrate`, and `run --role` serving metrics stamped
//! with the deployment id, JSON logs carrying it on every line, and a clean exit on
//! SIGTERM.

use crate::common::{free_port, keel};

use keel_store::testing::TestDatabase;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn migrate_applies_schema() {
    let db = TestDatabase::create().await.unwrap();
    // A second, empty database: `keel migrate` must create the schema there.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {}_m",
        db.name()
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let url = db.url().replace(db.name(), &format!("{}_m", db.name()));
    let out = keel()
        .arg("migrate")
        .env("KEEL__DATABASE__URL", &url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a terminal: no bar, one line on stdout.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("migrating"),
        "a bar was drawn without a terminal"
    );
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM platform_contract")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {}_m WITH (FORCE)",
        db.name()
    )))
    .execute(db.pool())
    .await
    .unwrap();
}

/// `keel migrate` on a terminal (a pseudo-terminal from util-linux `script`) draws a
/// progress bar through every pending migration; a second run has none pending.
#[tokio::test]
async fn migrate_draws_a_progress_bar_on_a_terminal() {
    let db = TestDatabase::create().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {}_p",
        db.name()
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let url = db.url().replace(db.name(), &format!("{}_p", db.name()));
    let known = keel_store::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .count();
    let on_terminal = || {
        let mut cmd = keel();
        let program = cmd.get_program().to_string_lossy().into_owned();
        cmd = Command::new("script");
        for (k, _) in std::env::vars() {
            if k.starts_with("KEEL") {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .args(["-qec", &format!("{program} migrate"), "/dev/null"])
            .env("KEEL__DATABASE__URL", &url)
            .env("TERM", "xterm")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = on_terminal();
    assert!(first.contains("migrating"), "{first}");
    assert!(first.contains(&format!("{known}/{known}")), "{first}");
    assert!(first.contains(&format!("{known} applied")), "{first}");
    assert!(first.contains("database up to date"), "{first}");
    let second = on_terminal();
    assert!(second.contains("0 applied"), "{second}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {}_p WITH (FORCE)",
        db.name()
    )))
    .execute(db.pool())
    .await
    .unwrap();
}

#[test]
fn run_requires_a_role() {
    let out = keel()
        .args(["run"])
        .env("KEEL__TELEMETRY__METRICSADDRESS", "")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no role"));
}

/// A malformed operator key is a startup error naming the variable and its
/// configuration key, never the value (before issue 34 the runner took it for "no
/// key" and served no chain).
#[test]
fn a_malformed_operator_key_stops_the_runner_at_start() {
    let out = keel()
        .args(["run", "--role", "runner"])
        .env("KEEL__TELEMETRY__METRICSADDRESS", "")
        .env("KEEL_OPERATOR_KEY", "0xnot-a-key-7f3a")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("KEEL_OPERATOR_KEY") && stderr.contains("operator.keyEnv"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-a-key-7f3a"), "{stderr}");
}

#[test]
fn invalid_configuration_exits_2_naming_the_key() {
    let out = keel()
        .args(["config", "print"])
        .env("KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS", "10")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("durable.confirmationWatcher.intervalMs")
    );
}

#[tokio::test]
async fn run_serves_metrics_and_stops_on_sigterm() {
    let db = TestDatabase::create().await.unwrap();
    let port = free_port();
    let mut child = keel()
        .args(["run", "--role", "runner"])
        .env("KEEL__DATABASE__URL", db.url())
        .env("KEEL__DEPLOYMENTID", "test-dep-7")
        .env("KEEL__TELEMETRY__LOGFORMAT", "json")
        .env(
            "KEEL__TELEMETRY__METRICSADDRESS",
            format!("127.0.0.1:{port}"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Probe the endpoint until the process reports ready (bounded).
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        if let Ok(resp) = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
        {
            let text = resp.text().await.unwrap();
            if text.contains("keel_ready{") {
                break text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "metrics endpoint never became ready"
        );
        assert!(child.try_wait().unwrap().is_none(), "keel exited early");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.contains("deployment_id=\"test-dep-7\""), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("keel_ready{") && l.ends_with(" 1")),
        "{body}"
    );
    assert!(body.contains("role=\"runner\""), "{body}");
    // The runner owns shards and exports its scheduled job's health (job names are a
    // fixed set, states a fixed set).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let owned = text.lines().any(|l| {
            l.starts_with("keel_cluster_owned_shards{")
                && l.contains("group=\"workflow\"")
                && l.ends_with(" 64")
        });
        let health = text.lines().any(|l| {
            l.starts_with("keel_cluster_cron_job_state{")
                && l.contains("job=\"retention/daily\"")
                && l.ends_with(" 1")
        });
        if owned && health {
            break;
        }
        assert!(Instant::now() < deadline, "cluster metrics missing: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "exit status {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{stderr}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert_eq!(v["deployment_id"], "test-dep-7", "{line}");
    }
    assert!(stderr.contains("SIGTERM received"), "{stderr}");
    assert!(stderr.contains("\"stopped\""), "{stderr}");
}

async fn wait_for<F, Fut>(what: &str, bound: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    loop {
        if check().await {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < bound, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Advisory locks held in the test database by sessions of `group`'s replicas.
async fn advisory_locks(pool: &sqlx::PgPool, group: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.granted
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND a.application_name LIKE 'keel-cluster/' || $1 || '/%'",
    )
    .bind(group)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn all_advisory_locks(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

fn spawn_role(db: &TestDatabase, role: &str, shards: u32) -> std::process::Child {
    keel()
        .args(["run", "--role", role, "--termination-grace-seconds", "10"])
        .env("KEEL__DATABASE__URL", db.url())
        .env("KEEL__TELEMETRY__LOGFORMAT", "json")
        .env("KEEL__TELEMETRY__METRICSADDRESS", "")
        .env("KEEL__API__LISTENADDRESS", "127.0.0.1:0")
        .env("KEEL__DURABLE__SHARDING__SHARDS", shards.to_string())
        .env("KEEL__CLUSTER__REFRESHINTERVALMS", "200")
        .env("KEEL__CLUSTER__LIVENESSWINDOWMS", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn sigterm(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A runner registers in `cluster_replica`, owns every shard (it is alone), runs the
/// retention job's first cycle, and on SIGTERM releases its shards and deregisters
/// before it exits: afterwards no advisory lock and no registry row of it remain.
#[tokio::test]
async fn runner_owns_shards_and_releases_them_on_sigterm() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let mut child = spawn_role(&db, "runner", 8);
    let took = wait_for(
        "the runner owns all 8 shards",
        Duration::from_secs(30),
        || {
            assert!(child.try_wait().unwrap().is_none(), "keel exited early");
            async { advisory_locks(pool, "workflow").await == 8 }
        },
    )
    .await;
    println!("runner: 8 shards locked {took:?} after spawn");
    let (role, group): (String, String) =
        sqlx::query_as("SELECT role, shard_group FROM cluster_replica")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((role.as_str(), group.as_str()), ("runner", "workflow"));
    let shards: i32 = sqlx::query_scalar("SELECT shards FROM cluster_config")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(shards, 8);
    // The retention job is registered and its first (latest due) cycle runs: there is
    // nothing to delete in a fresh database.
    wait_for(
        "the retention cycle ran",
        Duration::from_secs(30),
        || async {
            let done: Option<i64> = sqlx::query_scalar(
            "SELECT items FROM cron_cycle WHERE name = 'retention/daily' AND outcome = 'succeeded'",
        )
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten();
            done == Some(0)
        },
    )
    .await;
    let period: i64 =
        sqlx::query_scalar("SELECT period_ms FROM cron_job WHERE name = 'retention/daily'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(period, 86_400_000);

    let t = Instant::now();
    sigterm(&child);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stop_took = t.elapsed();
    println!("runner: SIGTERM to exit {stop_took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains("shards released"), "{stderr}");
    assert!(
        stop_took < Duration::from_secs(10),
        "stop exceeded the termination grace"
    );
    assert_eq!(all_advisory_locks(pool).await, 0);
    let replicas: i64 = sqlx::query_scalar("SELECT count(*) FROM cluster_replica")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(replicas, 0, "the replica did not deregister");
}

/// An indexer owns shards of its own group; an api process owns nothing.
#[tokio::test]
async fn indexer_owns_its_group_and_api_owns_nothing() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let mut indexer = spawn_role(&db, "indexer", 4);
    let mut api = spawn_role(&db, "api", 4);
    wait_for(
        "the indexer owns all 4 shards",
        Duration::from_secs(30),
        || {
            if let Some(st) = indexer.try_wait().unwrap() {
                let mut e = String::new();
                use std::io::Read;
                indexer
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut e)
                    .unwrap();
                panic!("indexer exited early {st:?}: {e}");
            }
            assert!(api.try_wait().unwrap().is_none(), "api exited early");
            async { advisory_locks(pool, "indexer").await == 4 }
        },
    )
    .await;
    let roles: Vec<String> = sqlx::query_scalar("SELECT role FROM cluster_replica")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(roles, vec!["indexer".to_owned()]);
    assert_eq!(advisory_locks(pool, "workflow").await, 0);
    sigterm(&indexer);
    sigterm(&api);
    assert!(indexer.wait().unwrap().success());
    assert!(api.wait().unwrap().success());
    assert_eq!(all_advisory_locks(pool).await, 0);
}

/// A runner configured with another shard count than the one recorded refuses to start:
/// non-zero exit, a message naming `durable.sharding.shards`, nothing registered.
#[tokio::test]
async fn runner_with_another_shard_count_refuses_to_start() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    sqlx::query("INSERT INTO cluster_config (shards) VALUES (8)")
        .execute(pool)
        .await
        .unwrap();
    let child = spawn_role(&db, "runner", 64);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started despite the mismatch");
    assert!(stderr.contains("durable.sharding.shards"), "{stderr}");
    assert!(stderr.contains("64") && stderr.contains('8'), "{stderr}");
    let replicas: i64 = sqlx::query_scalar("SELECT count(*) FROM cluster_replica")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(replicas, 0);
}
