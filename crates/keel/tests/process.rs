//! The `keel` binary as a process: `migrate`, and `run --role` serving metrics stamped
//! with the deployment id, JSON logs carrying it on every line, and a clean exit on
//! SIGTERM.

use keel_store::testing::TestDatabase;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn keel() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
    // Start from a clean slate of KEEL_* variables.
    for (k, _) in std::env::vars() {
        if k.starts_with("KEEL") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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
