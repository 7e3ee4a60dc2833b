//! The full stack as processes, once for every test that needs it: a fresh database,
//! chain `local` on a [`TestChain`], the environment of [`super::stack_env`] plus a
//! test's own, and the `keel` processes (`run --role …`) with their logs, metrics
//! ports and the API's answers checked against the served OpenAPI document.
//!
//! A test stack wraps [`Procs`] (its own keys, contracts and helpers beside it) and
//! derefs to it, so `stack.cli(..)`, `stack.spawn(..)`, `stack.get(key, ..)` and
//! `stack.await_op(key, ..)` are one implementation everywhere.

#![allow(dead_code)]

use super::doc_check::DocCheck;
use super::{free_port, keel};
use anvil_tests::TestChain;
use keel_store::testing::TestDatabase;
use serde_json::Value;
use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The processes of one test stack and what they share.
pub(crate) struct Procs {
    pub(crate) chain: TestChain,
    pub(crate) db: TestDatabase,
    /// The environment every `keel` process of the stack gets.
    pub(crate) env: Vec<(String, String)>,
    /// The API's origin (`http://127.0.0.1:<port>`).
    pub(crate) api: String,
    /// Every process's log (`<name>.log`) and the test's files.
    pub(crate) logs: tempfile::TempDir,
    pub(crate) procs: HashMap<&'static str, Child>,
    /// The telemetry port of each process (by name), chosen when it is first spawned.
    pub(crate) metrics: HashMap<&'static str, u16>,
    pub(crate) http: reqwest::Client,
    /// The served OpenAPI document, fetched on the first checked answer.
    doc: std::sync::OnceLock<DocCheck>,
    /// The process names whose logs a failure prints.
    shown: Vec<&'static str>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, mut child) in self.procs.drain() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `0x…` hex of Anvil's dev key `index`.
pub(crate) fn dev_key(chain: &TestChain, index: usize) -> String {
    format!(
        "0x{}",
        alloy::hex::encode(chain.signer(index).unwrap().to_bytes())
    )
}

impl Procs {
    /// A stack on `chain` with a fresh database and `extra` environment after the
    /// shared one (Anvil's dev key 0 as operator and deployer); `logs` holds the logs
    /// and any file the test writes before (keys, state). Nothing runs yet.
    pub(crate) async fn new(
        chain: TestChain,
        logs: tempfile::TempDir,
        extra: Vec<(String, String)>,
    ) -> Procs {
        let db = TestDatabase::create().await.unwrap();
        let port = free_port();
        let mut env = super::stack_env(
            db.url(),
            chain.chain_id(),
            chain.endpoint().as_str(),
            port,
            &dev_key(&chain, 0),
        );
        env.extend(extra);
        Procs {
            chain,
            db,
            env,
            api: format!("http://127.0.0.1:{port}"),
            logs,
            procs: HashMap::new(),
            metrics: HashMap::new(),
            http: reqwest::Client::new(),
            doc: std::sync::OnceLock::new(),
            shown: vec!["runner", "api", "indexer"],
        }
    }

    /// Also prints `name`'s log when a wait fails.
    pub(crate) fn show_log(&mut self, name: &'static str) {
        self.shown.push(name);
    }

    /// `keel migrate` and `keel chain bootstrap --chain local --deploy-erc4337`; the
    /// bootstrap's output.
    pub(crate) fn bootstrap(&self) -> String {
        self.cli(&["migrate"]);
        self.cli(&["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"])
    }

    /// Spawns the indexer, the runner and the api, and waits until the api is ready.
    pub(crate) async fn start_roles(&mut self) {
        for role in ["indexer", "runner", "api"] {
            self.spawn(role);
        }
        self.await_ready().await;
    }

    /// Runs a `keel` command to its end with the stack's environment.
    pub(crate) fn cli_output(&self, args: &[&str]) -> std::process::Output {
        keel().args(args).envs(self.env.clone()).output().unwrap()
    }

    /// Runs a `keel` command to success; its stdout (trimmed).
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args);
        assert!(
            out.status.success(),
            "keel {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Starts process `role` running that role.
    pub(crate) fn spawn(&mut self, role: &'static str) {
        self.spawn_named(role, role);
    }

    /// Starts process `name` running `role` (several processes may share a role); its
    /// log is appended to `<name>.log`, its metrics served on a port kept per name.
    pub(crate) fn spawn_named(&mut self, name: &'static str, role: &'static str) {
        self.spawn_with(name, role, &[]);
    }

    /// [`Procs::spawn_named`] with `extra` environment for this process only.
    pub(crate) fn spawn_with(
        &mut self,
        name: &'static str,
        role: &'static str,
        extra: &[(String, String)],
    ) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.path().join(format!("{name}.log")))
            .unwrap();
        let metrics_port = *self.metrics.entry(name).or_insert_with(free_port);
        let child = keel()
            .args(["run", "--role", role, "--termination-grace-seconds", "5"])
            .envs(self.env.clone())
            .env(
                "KEEL__TELEMETRY__METRICSADDRESS",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("KEEL__CLUSTER__HOST", name)
            .envs(extra.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        self.procs.insert(name, child);
    }

    /// Keeps `child` (a peer such as a simulator) as process `name`: killed with the
    /// stack.
    pub(crate) fn adopt(&mut self, name: &'static str, child: Child) {
        self.procs.insert(name, child);
    }

    /// SIGKILL (no shutdown path runs).
    pub(crate) fn kill9(&mut self, name: &'static str) {
        let mut child = self.procs.remove(name).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Waits (probe, 50 ms apart) until process `name` exits on its own, at most
    /// `within`; forgets it and returns its exit status.
    pub(crate) async fn await_exit(
        &mut self,
        name: &'static str,
        within: Duration,
    ) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            let child = self.procs.get_mut(name).unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                self.procs.remove(name);
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not exit within {within:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Process `name`'s log so far.
    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The logs a failure prints, each under a `--- name` line.
    pub(crate) fn logs(&self) -> String {
        self.shown
            .iter()
            .map(|n| format!("--- {n}\n{}\n", self.log(n)))
            .collect()
    }

    /// Waits (probe, 100 ms apart, at most 60 s) until the api answers `/readyz`.
    pub(crate) async fn await_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = self.http.get(format!("{}/readyz", self.api)).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(Instant::now() < deadline, "api not ready: {}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls `probe` (100 ms apart) until it answers `Some` or `within` passes (then
    /// fails naming `what`, with the logs).
    pub(crate) async fn until<T, F, Fut>(&self, within: Duration, what: &str, probe: F) -> T
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = probe().await {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not happen\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET path` with `key`, the answer checked against the OpenAPI document.
    pub(crate) async fn get(&self, key: &str, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.api))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        self.checked("GET", path, r).await
    }

    /// `POST path` with `key` and `Idempotency-Key: idem`, the answer checked against
    /// the OpenAPI document.
    pub(crate) async fn post(
        &self,
        key: &str,
        path: &str,
        idem: &str,
        body: Value,
    ) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.api))
            .bearer_auth(key)
            .header("Idempotency-Key", idem)
            .json(&body)
            .send()
            .await
            .unwrap();
        self.checked("POST", path, r).await
    }

    /// The status and JSON body (null when not JSON) of `r`, the answer to
    /// `method path`; fails the test unless the answer matches the served OpenAPI
    /// document (path, method and status declared, body valid against the schema).
    pub(crate) async fn checked(
        &self,
        method: &str,
        path: &str,
        r: reqwest::Response,
    ) -> (u16, Value) {
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let raw = r.bytes().await.unwrap();
        if let Err(e) = self
            .doc()
            .await
            .check(method, path, status, content_type.as_deref(), &raw)
        {
            panic!("the answer disagrees with the OpenAPI document: {e}");
        }
        (status, serde_json::from_slice(&raw).unwrap_or(Value::Null))
    }

    /// The served `/openapi.json`, fetched once.
    pub(crate) async fn doc(&self) -> &DocCheck {
        if self.doc.get().is_none() {
            let doc: Value = self
                .http
                .get(format!("{}/openapi.json", self.api))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let _ = self.doc.set(DocCheck::new(doc));
        }
        self.doc.get().unwrap()
    }

    /// Polls operation `id` (read with `key`) until `done(view)` holds (probe, 50 ms
    /// apart) or `within` passes (then fails with the logs).
    pub(crate) async fn await_op(
        &self,
        key: &str,
        id: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, view) = self.get(key, &format!("/v1/operations/{id}")).await;
            assert_eq!(status, 200, "{view}");
            if done(&view) {
                return view;
            }
            assert!(
                Instant::now() < deadline,
                "operation {id} did not reach the expected state: {view}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Process `name`'s `/metrics` text.
    pub(crate) async fn scrape(&self, name: &str) -> String {
        let port = self.metrics[name];
        self.http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}
