//! `keel dev` as a process: one command brings up a fresh database, Anvil, the
//! bootstrap, a demo organization with a key and template, and the three roles; the
//! printed key creates an asset through the printed API URL, `keel ops watch` follows
//! it to completion, the status page answers; SIGTERM stops everything and drops the
//! database.

use crate::common::{free_port, keel};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_dev_brings_up_a_working_stack_and_cleans_up() {
    let port = free_port();
    let logs = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = keel();
    cmd.args(["dev", "--api-address", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(logs.reopen().unwrap()));
    // `keel()` removes every KEEL* variable: pass on where Anvil and the ERC-4337
    // artifacts are when the test's environment names them (a worktree without
    // tools/node_modules).
    for var in ["KEEL_ANVIL", "KEEL_AA_ARTIFACTS"] {
        if let Ok(v) = std::env::var(var) {
            cmd.env(var, v);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    // Read the banner on a blocking thread (bounded by the process: it ends at EOF).
    let banner = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let done = line.trim_start().starts_with("try");
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    });
    let banner = tokio::time::timeout(Duration::from_secs(300), banner)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "keel dev printed no banner:\n{}",
                std::fs::read_to_string(logs.path()).unwrap_or_default()
            )
        })
        .unwrap();
    let field = |name: &str| -> String {
        banner
            .iter()
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(name)
                    .map(|v| v.trim().to_owned())
            })
            .unwrap_or_else(|| {
                panic!(
                    "no `{name}` in the banner {banner:?}\n{}",
                    std::fs::read_to_string(logs.path()).unwrap_or_default()
                )
            })
    };
    let api = field("API  ");
    let key = field("API key");
    let status_url = field("status page");
    let openapi = field("OpenAPI");
    let database = field("database")
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(api, format!("http://127.0.0.1:{port}"));
    assert!(key.starts_with("keel_sk_"), "{key}");

    let http = reqwest::Client::new();
    let r = http.get(&openapi).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(&status_url)
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the printed key opens the status page");

    // The demo template creates an asset; `keel ops watch` follows it to completion.
    let r = http
        .post(format!("{api}/v1/assets"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "dev-1")
        .json(
            &serde_json::json!({"name": "Dev Fund", "symbol": "DEV", "decimals": 6,
               "templateId": "std", "initialPrice": "1"}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status() == 202 || r.status() == 200, "{}", r.status());
    let body: serde_json::Value = r.json().await.unwrap();
    let id = body["id"].as_str().unwrap().to_owned();
    let mut watch = keel();
    watch
        .args([
            "ops",
            "watch",
            &id,
            "--api-url",
            &api,
            "--interval-ms",
            "100",
            "--timeout-seconds",
            "180",
        ])
        .env("KEEL_API_KEY", &key);
    let out = tokio::task::spawn_blocking(move || watch.output().unwrap())
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(logs.path()).unwrap_or_default()
    );
    let logged = std::fs::read_to_string(logs.path()).unwrap_or_default();
    for role in ["[api]", "[runner]", "[indexer]"] {
        assert!(logged.contains(role), "no {role} lines:\n{logged}");
    }

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "keel dev did not stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        exit.success(),
        "{exit:?}\n{}",
        std::fs::read_to_string(logs.path()).unwrap_or_default()
    );
    // The database is gone.
    let admin = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| keel_store::testing::DEFAULT_ADMIN_URL.to_owned());
    let pool = sqlx::PgPool::connect(&admin).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(&database)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "database {database} was not dropped");
}
