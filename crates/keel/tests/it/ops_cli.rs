//! `keel ops list|show|watch|retry|approve|reject` as processes against a running
//! stack (the three roles as processes, real PostgreSQL, real Anvil): they talk to the
//! Platform API with an API key, print its machine-readable codes on refusal, and
//! `watch` follows an operation live to its terminal state as its exit code.

use crate::common::keel;
use crate::common::stack::Procs;

use anvil_tests::TestChain;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The full stack ([`Procs`]) with acme's keys (two that operate, one that reads) and
/// template `std` (mints above 100 wait for an approval).
struct Stack {
    procs: Procs,
    key_a: String,
    key_b: String,
    reader: String,
}

impl std::ops::Deref for Stack {
    type Target = Procs;
    fn deref(&self) -> &Procs {
        &self.procs
    }
}

/// What a `keel` command did: exit code, stdout, stderr.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Stack {
    async fn start(chain: TestChain) -> Stack {
        let mut stack = Stack {
            procs: Procs::new(chain, tempfile::tempdir().unwrap(), Vec::new()).await,
            key_a: String::new(),
            key_b: String::new(),
            reader: String::new(),
        };
        stack.bootstrap();
        stack.cli(&["org", "create", "--name", "acme"]);
        stack.key_a = stack.cli(&["api-key", "create", "--org", "acme", "--label", "a"]);
        stack.key_b = stack.cli(&["api-key", "create", "--org", "acme", "--label", "b"]);
        stack.reader = stack.cli(&[
            "api-key", "create", "--org", "acme", "--label", "r", "--scope", "read",
        ]);
        stack.cli(&[
            "template",
            "set",
            "--org",
            "acme",
            "--id",
            "std",
            "--chain",
            "local",
            "--mint-approval-threshold",
            "100",
            "--approval-ttl-seconds",
            "600",
        ]);
        stack.procs.start_roles().await;
        stack
    }

    /// `keel ops <args>` against the stack's API with `key` (given as `KEEL_API_KEY`,
    /// the API URL as `KEEL_API_URL`; no database configuration at all), run to its end
    /// on a blocking thread.
    async fn ops(&self, key: &str, args: &[&str]) -> Out {
        let mut cmd = keel();
        cmd.arg("ops")
            .args(args)
            .env("KEEL_API_URL", &self.api)
            .env("KEEL_API_KEY", key);
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        Out {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `POST path` with the first key, accepted (202, or 200 for a repeat).
    async fn post(&self, path: &str, idem: &str, body: Value) -> Value {
        let (status, body) = self.procs.post(&self.key_a, path, idem, body).await;
        assert!(status == 202 || status == 200, "{status} {body}");
        body
    }

    /// Operation `id` as the first key reads it.
    async fn state(&self, id: &str) -> Value {
        let (status, view) = self
            .procs
            .get(&self.key_a, &format!("/v1/operations/{id}"))
            .await;
        assert_eq!(status, 200, "{view}");
        view
    }

    /// Polls until the operation waits for an approval (probe, 50 ms apart, bounded).
    async fn await_approval_wait(&self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.state(id).await;
            if v["state"] == "waiting" && v["wait"]["for"] == "approval" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{v}\n--- runner\n{}",
                self.log("runner")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The positions of `needles` in `text`, asserting each occurs and in this order.
fn in_order(text: &str, needles: &[&str]) {
    let mut from = 0;
    for n in needles {
        match text[from..].find(n) {
            Some(i) => from += i + n.len(),
            None => panic!("`{n}` missing (in order {needles:?}) in:\n{text}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_show_watch_and_decide_through_the_api() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(chain).await;

    // Refusals carry the API's codes and a non-zero exit.
    let out = stack
        .ops(
            "keel_sk_not-a-key",
            &["show", &uuid::Uuid::new_v4().to_string()],
        )
        .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("UNAUTHENTICATED"), "{}", out.stderr);
    assert!(!out.stderr.contains("not-a-key"), "no key in errors");
    let out = stack
        .ops(&stack.key_a, &["show", &uuid::Uuid::new_v4().to_string()])
        .await;
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("NOT_FOUND"), "{}", out.stderr);
    let out = stack
        .ops(&stack.key_a, &["list", "--state", "stuckish"])
        .await;
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("INVALID_QUERY"), "{}", out.stderr);

    // An asset creation followed live to completion: the milestone sequence in order,
    // exit code 0 (stdout is a pipe: plain lines).
    let created = stack
        .post(
            "/v1/assets",
            "create-1",
            json!({"name": "Ops Fund", "symbol": "OPS", "decimals": 6,
                   "templateId": "std", "initialPrice": "101.25"}),
        )
        .await;
    let create_id = created["id"].as_str().unwrap().to_owned();
    let asset = created["assetId"].as_str().unwrap().to_owned();
    let out = stack
        .ops(
            &stack.key_a,
            &[
                "watch",
                &create_id,
                "--interval-ms",
                "100",
                "--timeout-seconds",
                "180",
            ],
        )
        .await;
    assert_eq!(
        out.code,
        Some(0),
        "{}\n{}\n--- runner\n{}",
        out.stdout,
        out.stderr,
        stack.log("runner")
    );
    in_order(
        &out.stdout,
        &[
            "accepted   asset.create",
            "submitted  ",
            "confirmed  ",
            "indexed    block ",
            "completed",
        ],
    );
    assert!(out.stdout.contains(" nonce "), "{}", out.stdout);
    assert!(
        !out.stdout.contains('\u{1b}'),
        "no terminal control sequences in plain mode"
    );

    // show: text and the API's JSON.
    let out = stack.ops(&stack.key_a, &["show", &create_id]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("state      completed"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("started by   SERVICE"),
        "{}",
        out.stdout
    );
    in_order(
        &out.stdout,
        &["accepted", "submitted", "confirmed", "indexed"],
    );
    let out = stack
        .ops(&stack.reader, &["show", &create_id, "--json"])
        .await;
    let shown: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(shown["id"], create_id.as_str());
    assert_eq!(shown["state"], "completed");
    assert!(shown["attribution"]["startedBy"].is_object(), "{shown}");

    // history: every page through the API, oldest first, with who asked.
    let out = stack.ops(&stack.reader, &["history", &create_id]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let history: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
    let seqs: Vec<i64> = history.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "no gap");
    assert_eq!(history[0]["kind"], "command_received", "{}", out.stdout);
    assert_eq!(history[0]["actor"]["kind"], "SERVICE", "{}", out.stdout);
    assert_eq!(history.last().unwrap()["kind"], "completed");
    assert!(
        history.iter().any(|e| e["kind"] == "transaction_enqueued"),
        "{}",
        out.stdout
    );
    let out = stack
        .ops(
            &stack.key_a,
            &["history", &uuid::Uuid::new_v4().to_string()],
        )
        .await;
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("NOT_FOUND"), "{}", out.stderr);

    // A mint above the threshold waits for an approval.
    let holder = stack.chain.account(4).unwrap().to_string();
    let mint = |idem: &'static str| {
        let body = json!({"recipient": holder, "amount": "500"});
        let path = format!("/v1/assets/{asset}/mint");
        let stack = &stack;
        async move {
            stack.post(&path, idem, body).await["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let approved = mint("mint-1").await;
    stack.await_approval_wait(&approved).await;

    // list: filters as the API's, table and JSON lines, --stuck.
    let out = stack
        .ops(&stack.reader, &["list", "--kind", "asset.create", "--json"])
        .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{}", out.stdout);
    assert_eq!(lines[0]["id"], create_id.as_str());
    let out = stack
        .ops(
            &stack.reader,
            &["list", "--state", "waiting", "--asset", &asset],
        )
        .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let table: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(table.len(), 2, "{}", out.stdout);
    assert!(table[0].starts_with("ID "), "{}", out.stdout);
    assert!(table[1].starts_with(&approved), "{}", out.stdout);
    assert!(table[1].contains("waiting for approval"), "{}", out.stdout);
    let out = stack
        .ops(
            &stack.reader,
            &["list", "--created-after", "2999-01-01T00:00:00Z"],
        )
        .await;
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "only the header: {}",
        out.stdout
    );
    let out = stack
        .ops(
            &stack.reader,
            &["list", "--stuck", "--stuck-after-seconds", "0", "--json"],
        )
        .await;
    let stuck: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stuck.len(), 1, "only the open one: {}", out.stdout);
    assert_eq!(stuck[0]["id"], approved.as_str());

    // approve: the starting key and a read-only key are refused with the API's codes.
    let out = stack.ops(&stack.key_a, &["approve", &approved]).await;
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("APPROVAL_SAME_KEY"), "{}", out.stderr);
    let out = stack.ops(&stack.reader, &["approve", &approved]).await;
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("INSUFFICIENT_SCOPE"), "{}", out.stderr);
    let out = stack.ops(&stack.key_b, &["approve", &approved]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let view: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        view["attribution"]["approval"]["decision"], "approved",
        "{view}"
    );
    let out = stack
        .ops(
            &stack.key_a,
            &[
                "watch",
                &approved,
                "--interval-ms",
                "100",
                "--timeout-seconds",
                "120",
            ],
        )
        .await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    in_order(
        &out.stdout,
        &["accepted   asset.mint", "confirmed  ", "completed"],
    );
    let out = stack.ops(&stack.key_a, &["show", &approved]).await;
    assert!(
        out.stdout.contains("approved     SERVICE"),
        "{}",
        out.stdout
    );

    // retry of a completed operation: the API's refusal.
    let out = stack.ops(&stack.key_a, &["retry", &approved]).await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("OPERATION_NOT_RETRYABLE"),
        "{}",
        out.stderr
    );

    // reject: the operation fails, and watch exits with the failed state's code.
    let rejected = mint("mint-2").await;
    stack.await_approval_wait(&rejected).await;
    let out = stack.ops(&stack.key_b, &["reject", &rejected]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = stack
        .ops(
            &stack.key_a,
            &[
                "watch",
                &rejected,
                "--interval-ms",
                "100",
                "--timeout-seconds",
                "120",
            ],
        )
        .await;
    assert_eq!(out.code, Some(3), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("APPROVAL_REJECTED"), "{}", out.stdout);
    assert!(out.stdout.trim_end().ends_with("failed"), "{}", out.stdout);
    assert!(out.stderr.contains("APPROVAL_REJECTED"), "{}", out.stderr);
}
