//! Starting the simulator process and talking to it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The credentials the simulator accepts by default (`--credential`).
pub(crate) const ACCESS_KEY: &str = "keel-sim-access-key";
pub(crate) const SECRET_KEY: &str = "keel-sim-secret-key";
pub(crate) const REGION: &str = "us-east-1";

/// Puts the simulator's credentials where the AWS SDK's default chain reads them (the
/// environment), once per test process and before any runtime thread starts: every
/// test here is a plain `#[test]` that calls this first, then builds its runtime.
pub(crate) fn use_sim_credentials() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: called before any other thread of this test process exists (the
        // tests build their tokio runtime after it; nextest runs one test per process).
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
            std::env::remove_var("AWS_SESSION_TOKEN");
            std::env::remove_var("AWS_PROFILE");
            // No shared config or credentials file of the machine is consulted.
            std::env::set_var("AWS_CONFIG_FILE", "/nonexistent/keel-kms-sim/config");
            std::env::set_var(
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/keel-kms-sim/credentials",
            );
            std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        }
    });
}

/// A multi-threaded runtime for a test body.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A running simulator with its state file; killed on drop.
pub(crate) struct Sim {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`.
    pub(crate) url: String,
    port: u16,
    state: PathBuf,
    _dir: tempfile::TempDir,
}

fn spawn(listen: &str, state: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel-kms-sim"))
        .args(["--listen", listen, "--state"])
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("keel-kms-sim listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    (child, url)
}

impl Sim {
    /// Starts a simulator on a free port with a fresh state file.
    pub(crate) fn start() -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("kms.json");
        let (child, url) = spawn("127.0.0.1:0", &state);
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        Sim {
            child: Some(child),
            url,
            port,
            state,
            _dir: dir,
        }
    }

    /// SIGKILL: KMS is unreachable until [`Sim::restart`].
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Starts the simulator again on the same port with the same state file.
    pub(crate) fn restart(&mut self) {
        self.kill();
        let (child, url) = spawn(&format!("127.0.0.1:{}", self.port), &self.state);
        assert_eq!(url, self.url);
        self.child = Some(child);
    }

    /// Sets fault knobs (`POST /_sim/faults`).
    pub(crate) async fn faults(&self, body: serde_json::Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/_sim/faults", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }

    /// Turns every fault off.
    pub(crate) async fn clear(&self) {
        reqwest::Client::new()
            .post(format!("{}/_sim/faults/clear", self.url))
            .send()
            .await
            .unwrap();
    }

    /// `GET /_sim/stats`.
    pub(crate) async fn stats(&self) -> serde_json::Value {
        reqwest::Client::new()
            .get(format!("{}/_sim/stats", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// An AWS SDK KMS client for this simulator, signing with `access_key`/`secret`
    /// (no SDK retries: each call is one request).
    pub(crate) async fn client_as(&self, access_key: &str, secret: &str) -> aws_sdk_kms::Client {
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(REGION))
            .endpoint_url(&self.url)
            .credentials_provider(aws_sdk_kms::config::Credentials::new(
                access_key, secret, None, None, "test",
            ))
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .load()
            .await;
        aws_sdk_kms::Client::new(&config)
    }

    /// A client with the accepted credentials.
    pub(crate) async fn client(&self) -> aws_sdk_kms::Client {
        self.client_as(ACCESS_KEY, SECRET_KEY).await
    }

    /// Creates an `ECC_SECG_P256K1` signing key; returns its id.
    pub(crate) async fn create_key(&self) -> String {
        self.client()
            .await
            .create_key()
            .key_spec(aws_sdk_kms::types::KeySpec::EccSecgP256K1)
            .key_usage(aws_sdk_kms::types::KeyUsageType::SignVerify)
            .send()
            .await
            .unwrap()
            .key_metadata
            .unwrap()
            .key_id
    }

    /// Disables or enables a key through the KMS API.
    pub(crate) async fn set_enabled(&self, key_id: &str, enabled: bool) {
        let c = self.client().await;
        if enabled {
            c.enable_key().key_id(key_id).send().await.unwrap();
        } else {
            c.disable_key().key_id(key_id).send().await.unwrap();
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.kill();
    }
}
