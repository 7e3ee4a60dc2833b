//! Platform Status (issue 22): `GET /v1/status` and the `/status` page over a stack
//! with a stuck operation (no runner: its workflow never starts), a lagging index (the
//! real tip ingest, a few blocks per round, on a real Anvil chain 40 blocks ahead) and
//! an overdue scheduled job (registered, never run). The page is loaded in a real
//! headless Chromium (`/usr/bin/chromium`, or `KEEL_CHROMIUM`): it signs in through
//! the page's own login form, the rendered DOM is asserted (`--dump-dom`) and a
//! screenshot saved under `target/status-page/`.

use crate::common::{Env, TEMPLATE};
use alloy::providers::ext::AnvilApi;
use anvil_tests::TestChain;
use axum::http::{Method, StatusCode};
use keel_api::ApiConfig;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::{TipConfig, TipIngest};
use keel_units::ChainId;
use keel_workflows::ops::status::StatusQuery;
use keel_workflows::{Scope, Scopes};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// The stack: the API (pending threshold 0 s, so the operation that no runner starts
/// is over it at once), an admin key, one accepted operation, an index 40 - 5 blocks
/// behind the observed head, and an overdue job.
struct Stack {
    env: Env,
    admin: String,
    /// A key with `read` only.
    reader: String,
    operation: String,
    _chain: TestChain,
}

impl Stack {
    async fn start() -> Self {
        let env = Env::with_config(ApiConfig {
            status: StatusQuery {
                pending_threshold: Duration::ZERO,
                ..StatusQuery::default()
            },
            ..ApiConfig::default()
        })
        .await;
        let pool = env.db.pool().clone();
        let org = keel_workflows::tenancy::organization_by_name(&pool, "org-a")
            .await
            .unwrap();
        let admin = keel_workflows::tenancy::create_api_key_with_scopes(
            &pool,
            org,
            "operator",
            Scopes::NONE.with(Scope::Admin).with(Scope::Read),
        )
        .await
        .unwrap()
        .token;
        let reader = keel_workflows::tenancy::create_api_key_with_scopes(
            &pool,
            org,
            "reader",
            Scopes::NONE.with(Scope::Read),
        )
        .await
        .unwrap()
        .token;

        // A stuck operation: accepted, its workflow pending (no runner here).
        let body = json!({
            "name": "Stuck", "symbol": "STUK", "decimals": 18,
            "templateId": TEMPLATE, "initialPrice": "1"
        });
        let a = env
            .post(&env.key_a, "/v1/assets", Some("status-1"), &body)
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        let operation = a.body["id"].as_str().unwrap().to_owned();

        // A lagging index: the chain is 40 blocks ahead, one round ingests 5.
        let chain = TestChain::start().await.unwrap();
        chain.provider().anvil_mine(Some(40), None).await.unwrap();
        let chain_id = ChainId(chain.chain_id());
        let node = Arc::new(
            UpstreamPool::new(
                chain_id,
                UpstreamConfig::new(vec![chain.endpoint().to_string()]),
            )
            .unwrap(),
        );
        let ingest = TipIngest::take_ownership(
            pool.clone(),
            node,
            TipConfig {
                start_block: Some(0),
                max_blocks_per_round: 5,
                ..TipConfig::new(12)
            },
            "status-test",
        )
        .await
        .unwrap();
        let round = ingest.round().await.unwrap();
        assert_eq!(round.tip, Some(4), "{round:?}");
        assert!(round.head >= 40, "{round:?}");

        // An overdue job: registered with a 1 ms period, never run (overdue after 2 ms).
        keel_cluster::register_job(
            &pool,
            &keel_cluster::CronJob::new(
                "status-test/never-run",
                keel_cluster::Schedule::every(Duration::from_millis(1)),
            ),
        )
        .await
        .unwrap();
        Self {
            env,
            admin,
            reader,
            operation,
            _chain: chain,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_reports_the_stuck_operation_the_lagging_index_and_the_overdue_job() {
    let s = Stack::start().await;
    // A key without the admin scope is refused; the admin key reads it.
    let refused = s.env.get(&s.reader, "/v1/status").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let a = s.env.get(&s.admin, "/v1/status").await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let b = &a.body;
    assert_eq!(b["workflows"]["overPending"], 1, "{b}");
    assert_eq!(
        b["workflows"]["overPendingList"][0]["operationId"], s.operation,
        "{b}"
    );
    assert_eq!(
        b["workflows"]["overPendingList"][0]["operationUrl"],
        format!("/v1/operations/{}", s.operation)
    );
    assert_eq!(b["index"][0]["tip"], 4, "{b}");
    assert!(b["index"][0]["lagBlocks"].as_u64().unwrap() >= 36, "{b}");
    assert_eq!(b["index"][0]["ownerEpoch"], 1, "{b}");
    let job = b["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "status-test/never-run")
        .unwrap();
    assert_eq!(job["verdict"], "overdue", "{b}");
    assert_eq!(b["custody"]["configured"], false);
    // No runner is alive here: the stuck creation waits, visibly, for one that knows
    // version 2 (the version the API pinned it to: asset.create's since the signer
    // pool).
    let waits = b["workflows"]["awaitingRunner"].as_array().unwrap();
    let wait = waits
        .iter()
        .find(|w| w["workflow"] == "asset.create")
        .unwrap_or_else(|| panic!("{b}"));
    assert_eq!(wait["instances"], 1, "{b}");
    assert_eq!(wait["version"], 2, "{b}");
    assert!(wait["oldestCreatedAt"].is_string(), "{b}");
    assert_eq!(b["custody"]["requests"], json!([]), "{b}");
    assert_eq!(b["custody"]["oldestPendingApproval"], json!(null), "{b}");
    // Nothing secret: no token, no key hash column, no payload member.
    let raw = String::from_utf8_lossy(&a.raw);
    assert!(
        !raw.contains(&s.admin) && !raw.contains("keel_sk_"),
        "{raw}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_refuses_without_an_admin_credential() {
    let s = Stack::start().await;
    let a = s
        .env
        .send_unchecked(Method::GET, "/status", &[], None)
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let html = String::from_utf8_lossy(&a.raw);
    assert!(html.contains("action=\"/status/login\""), "{html}");
    assert!(!html.contains("<script"), "{html}");
    let auth = format!("Bearer {}", s.reader);
    let a = s
        .env
        .send_unchecked(Method::GET, "/status", &[("authorization", &auth)], None)
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    // A wrong key at the form: 401, no cookie.
    let a = s
        .env
        .send_unchecked(
            Method::POST,
            "/status/login",
            &[],
            Some((
                "application/x-www-form-urlencoded",
                b"key=keel_nope".to_vec(),
            )),
        )
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.header("set-cookie").is_none());
    // The admin key by bearer header: the page, with its security headers.
    let auth = format!("Bearer {}", s.admin);
    let a = s
        .env
        .send_unchecked(Method::GET, "/status", &[("authorization", &auth)], None)
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.header("content-security-policy")
            .unwrap()
            .starts_with("default-src 'none'")
    );
    assert_eq!(a.header("cache-control"), Some("no-store"));
    let html = String::from_utf8_lossy(&a.raw);
    assert!(
        html.contains("Waiting for a runner that knows their version"),
        "{html}"
    );
    assert!(
        html.contains("<td>asset.create</td><td>2</td><td>1</td>"),
        "{html}"
    );
}

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("KEEL_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        Some(path)
    } else if std::env::var("KEEL_REQUIRE_BROWSER").as_deref() == Ok("1") {
        panic!(
            "headless Chromium not found at {} (scripts/setup installs Debian's `chromium` \
             when KEEL_SETUP_BROWSER=1; scripts/test does)",
            path.display()
        );
    } else {
        eprintln!(
            "skipped: no Chromium at {} (set KEEL_REQUIRE_BROWSER=1 to fail instead)",
            path.display()
        );
        None
    }
}

/// `target/status-page/`, the test's output directory.
fn output_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/status-page")
        .canonicalize()
        .unwrap_or_else(|_| {
            let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/status-page");
            std::fs::create_dir_all(&d).unwrap();
            d.canonicalize().unwrap()
        });
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_headless_chromium() {
    let Some(browser) = chromium() else { return };
    let s = Stack::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();

    // The operator's path in a browser: the page's login form. The test's own page posts
    // the key to it (the only script involved is this page's; Keel's pages have none).
    // It is served from Keel's origin: headless Chromium's virtual time does not wait for
    // a navigation from a `file://` page into a new origin's renderer, and under load it
    // then exited 0 without a screenshot (reproduced with a server answering in 500 ms;
    // a same-origin navigation waits for a server answering in 2 s).
    let login = format!(
        "<!doctype html><html><body onload=\"document.forms[0].submit()\">\
         <form method=\"post\" action=\"/status/login\">\
         <input name=\"key\" value=\"{}\"></form></body></html>",
        s.admin
    );
    let app = s.env.app.clone().route(
        "/test-only/status-login",
        axum::routing::get(move || {
            let login = login.clone();
            async move { axum::response::Html(login) }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let out = output_dir();
    let profiles = out.join("profile");
    let _ = std::fs::remove_dir_all(&profiles);
    let url = format!("http://{addr}/test-only/status-login");
    // A fresh profile per attempt: a Chromium still holding a profile would take the
    // request over and this process would exit at once without output.
    let run = move |extra: Vec<String>| {
        let profiles = profiles.clone();
        let url = url.clone();
        let browser = browser.clone();
        move || {
            let profile = profiles.join(uuid::Uuid::new_v4().to_string());
            let mut cmd = Command::new(&browser);
            cmd.args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1280,2000",
                "--virtual-time-budget=15000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(&extra)
            .arg(&url);
            cmd
        }
    };
    let dom = tokio::task::spawn_blocking({
        let cmd = run(vec!["--dump-dom".into()]);
        let out = out.clone();
        // A run that exits without printing the DOM, or prints the login page it never
        // left (seen under load), is tried again.
        move || {
            bounded_run(cmd, &out, "dom", |r| {
                !r.stdout.is_empty() && !String::from_utf8_lossy(&r.stdout).contains("forms[0]")
            })
        }
    })
    .await
    .unwrap();
    let html = String::from_utf8_lossy(&dom.stdout).into_owned();
    std::fs::write(out.join("status.html"), &html).unwrap();
    assert!(
        dom.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    for needle in [
        "Keel Platform Status",
        "1 over the pending threshold",
        &s.operation,
        "Ledger Index",
        "overdue",
        "status-test/never-run",
        "No approval pending at a provider",
    ] {
        assert!(
            html.contains(needle),
            "the page lacks {needle:?}:\n{html}\nchromium's stderr:\n{}",
            String::from_utf8_lossy(&dom.stderr)
        );
    }
    assert!(
        html.contains(">4<") && html.contains(" blocks, "),
        "no lagging index row:\n{html}"
    );
    assert!(!html.contains(&s.admin), "the page shows the key");

    let shot = out.join("status.png");
    let _ = std::fs::remove_file(&shot);
    let status = tokio::task::spawn_blocking({
        let cmd = run(vec![format!("--screenshot={}", shot.display())]);
        let out = out.clone();
        let shot = shot.clone();
        move || bounded_run(cmd, &out, "screenshot", |_| shot.exists())
    })
    .await
    .unwrap();
    assert!(
        status.status.success(),
        "chromium screenshot failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("status page screenshot: {}", shot.display());
    server.abort();
}

/// What one bounded Chromium run left: its exit status and its output.
struct BrowserRun {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs the command `make` builds (a fresh profile each time) in its own process group
/// with its output in files (a helper process that outlives the browser cannot hold a
/// pipe open), at most `ATTEMPT` per try. A try that does not end in time has its whole
/// group killed and is tried again, up to three times; then the test fails instead of
/// hanging CI (headless Chromium has been seen to never exit under load). A try that
/// exits without leaving what `left` looks for is tried again too; when none left it,
/// the test fails with every try's exit and the end of its stderr.
fn bounded_run(
    make: impl Fn() -> Command,
    dir: &std::path::Path,
    name: &str,
    left: impl Fn(&BrowserRun) -> bool,
) -> BrowserRun {
    use std::os::unix::process::CommandExt;
    const ATTEMPT: Duration = Duration::from_secs(90);
    let tail = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("dbus")).collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    };
    let mut log = Vec::new();
    for attempt in 1..=3 {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let mut cmd = make();
        cmd.process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let mut child = cmd.spawn().unwrap();
        let group = child.id();
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > ATTEMPT {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // Whatever the browser left running in its group goes with it. The group is
        // named after `--`: procps-ng 4.0.2's `kill -KILL -<pgid>` calls kill(-1,
        // SIGKILL), which killed every process of the machine (strace shows it).
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{group}")])
            .status();
        let _ = child.wait();
        match status {
            Some(status) => {
                let run = BrowserRun {
                    status,
                    stdout: std::fs::read(&stdout).unwrap(),
                    stderr: std::fs::read(&stderr).unwrap(),
                };
                if run.status.success() && left(&run) {
                    return run;
                }
                log.push(format!(
                    "attempt {attempt}: exited {status} without its output; stderr ends:\n{}",
                    tail(&run.stderr)
                ));
            }
            None => {
                log.push(format!(
                    "attempt {attempt}: no exit within {ATTEMPT:?}; stderr ends:\n{}",
                    tail(&std::fs::read(&stderr).unwrap_or_default())
                ));
            }
        }
    }
    panic!("chromium never left its {name} output:\n{}", log.join("\n"));
}
