//! The platform key in KMS, through the binary (issue 35 §1, §4): keel-kms-sim (a local
//! AWS KMS counterpart, as a process) holds the operator key; no private key is in the
//! environment. `keel signer list` prints its kind, address, balance and next nonce;
//! `keel chain bootstrap --deployer-is-operator` deploys the platform signing through KMS
//! (the contracts are the KMS address's creations, its nonce moved); with the key
//! disabled, `keel signer list` and a runner's start fail with `KEY_DISABLED`, naming the
//! configuration key and no secret; re-enabled, the runner starts with the KMS key.

use crate::common::{free_port, keel};

use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use anvil_tests::TestChain;
use keel_store::testing::TestDatabase;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ACCESS_KEY: &str = "keel-sim-access-key";
const SECRET_KEY: &str = "keel-sim-secret-key";
const REGION: &str = "us-east-1";
const ALIAS: &str = "alias/keel-operator";

/// Builds keel-kms-sim into the same target directory as this test's `keel` (so it is
/// never a stale binary) and returns its path.
fn sim_binary() -> std::path::PathBuf {
    let keel = std::path::PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let sim = keel.with_file_name(format!("keel-kms-sim{}", std::env::consts::EXE_SUFFIX));
    let profile_dir = keel.parent().unwrap();
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev",
        other => other,
    };
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "keel-kms-sim", "--profile", profile])
        .arg("--target-dir")
        .arg(profile_dir.parent().unwrap())
        .current_dir(anvil_tests::workspace_root())
        .status()
        .unwrap();
    assert!(status.success(), "building keel-kms-sim failed");
    sim
}

/// The simulator with one key behind [`ALIAS`]; killed on drop.
struct Sim {
    child: Child,
    url: String,
    key_id: String,
    _dir: tempfile::TempDir,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim() -> Sim {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(sim_binary())
        .args(["--create-key", ALIAS, "--state"])
        .arg(dir.path().join("kms.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut key_line = String::new();
    out.read_line(&mut key_line).unwrap();
    let key_id = key_line
        .trim()
        .strip_prefix(&format!("key {ALIAS} "))
        .unwrap_or_else(|| panic!("unexpected key line {key_line:?}"))
        .to_owned();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("keel-kms-sim listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    Sim {
        child,
        url,
        key_id,
        _dir: dir,
    }
}

/// A KMS client of the test (the operator's side: enabling and disabling the key).
async fn kms_client(url: &str) -> aws_sdk_kms::Client {
    let config = aws_sdk_kms::Config::builder()
        .behavior_version(aws_sdk_kms::config::BehaviorVersion::latest())
        .region(aws_sdk_kms::config::Region::new(REGION))
        .endpoint_url(url)
        .credentials_provider(aws_sdk_kms::config::Credentials::new(
            ACCESS_KEY, SECRET_KEY, None, None, "test",
        ))
        .build();
    aws_sdk_kms::Client::from_conf(config)
}

/// `keel` with the stack's environment, the operator key in KMS and the simulator's
/// credentials first on the AWS SDK's default chain (the environment).
fn keel_with(env: &[(String, String)], sim: &Sim) -> Command {
    let mut cmd = keel();
    cmd.envs(env.iter().cloned())
        .env_remove("KEEL_OPERATOR_KEY")
        .env_remove("KEEL_DEPLOYER_KEY")
        .env("KEEL__OPERATOR__SIGNER__KIND", "awsKms")
        .env("KEEL__OPERATOR__SIGNER__KEYID", ALIAS)
        .env("KEEL__OPERATOR__SIGNER__REGION", REGION)
        .env("KEEL__OPERATOR__SIGNER__ENDPOINT", &sim.url)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    cmd
}

fn run(mut cmd: Command, args: &[&str]) -> (bool, String, String) {
    let out = cmd.args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `keel signer list`'s operator line: (kind, address, balance, next nonce).
fn operator_line(stdout: &str) -> (String, Address, String, String) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("operator\t"))
        .unwrap_or_else(|| panic!("no operator line in {stdout:?}"));
    let f: Vec<&str> = line.split('\t').collect();
    assert_eq!(f.len(), 7, "{line:?}");
    assert_eq!(f[3], "local", "{line:?}");
    (
        f[1].to_owned(),
        f[2].parse().unwrap(),
        f[5].to_owned(),
        f[6].to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_key_in_kms_lists_bootstraps_and_gates_the_runner() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sim = start_sim();
    let env = crate::common::stack_env(
        db.url(),
        chain.chain_id(),
        chain.endpoint().as_str(),
        free_port(),
        "",
    );

    // The key's address, read from KMS; a fresh key holds nothing and sent nothing.
    let (ok, stdout, stderr) = run(keel_with(&env, &sim), &["signer", "list"]);
    assert!(ok, "keel signer list: {stderr}");
    let (kind, address, balance, nonce) = operator_line(&stdout);
    assert_eq!(kind, "awsKms");
    assert_eq!((balance.as_str(), nonce.as_str()), ("0", "0"));
    let p = chain.provider();
    p.anvil_set_balance(address, U256::from(10u128.pow(21)))
        .await
        .unwrap();

    // The bootstrap signs through KMS: its contracts are the KMS address's creations.
    let (ok, _, stderr) = run(keel_with(&env, &sim), &["migrate"]);
    assert!(ok, "keel migrate: {stderr}");
    let (ok, bootstrap, stderr) = run(
        keel_with(&env, &sim),
        &[
            "chain",
            "bootstrap",
            "--chain",
            "local",
            "--deploy-erc4337",
            "--deployer-is-operator",
        ],
    );
    assert!(ok, "keel chain bootstrap --deployer-is-operator: {stderr}");
    let sent = p.get_transaction_count(address).await.unwrap();
    assert!(sent > 0, "the KMS address sent nothing");
    let creations: Vec<Address> = (0..sent).map(|n| address.create(n)).collect();
    // The ERC-4337 contracts are at their canonical (CREATE2) addresses; every
    // platform contract is a CREATE of the KMS key.
    let canonical: Vec<Address> = bootstrap
        .lines()
        .filter(|l| l.starts_with("erc4337 "))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    let deployed: Vec<Address> = bootstrap
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[0] == "deployed").then(|| f[2].parse().unwrap())
        })
        .filter(|a| !canonical.contains(a))
        .collect();
    assert!(!deployed.is_empty(), "no deployments printed: {bootstrap}");
    for d in &deployed {
        assert!(
            creations.contains(d),
            "{d} is not a creation of the KMS key {address}"
        );
        assert!(
            !p.get_code_at(*d).await.unwrap().is_empty(),
            "no code at {d}"
        );
    }
    let (ok, stdout, _) = run(keel_with(&env, &sim), &["signer", "list"]);
    assert!(ok);
    let (_, again, _, nonce) = operator_line(&stdout);
    assert_eq!(again, address);
    assert_eq!(
        nonce,
        sent.to_string(),
        "the next nonce is the chain's count"
    );

    // grant-roles needs vaults to grant to; without any it says so and sends nothing.
    let (ok, _, stderr) = run(
        keel_with(&env, &sim),
        &[
            "chain",
            "grant-roles",
            "--chain",
            "local",
            "--deployer-is-operator",
        ],
    );
    assert!(
        !ok && stderr.contains("no custody vaults") && stderr.contains("no pool senders"),
        "{stderr}"
    );
    assert_eq!(p.get_transaction_count(address).await.unwrap(), sent);

    // A disabled key: a typed refusal naming the configuration, never a secret.
    let kms = kms_client(&sim.url).await;
    kms.disable_key().key_id(&sim.key_id).send().await.unwrap();
    let (ok, _, stderr) = run(keel_with(&env, &sim), &["signer", "list"]);
    assert!(!ok, "keel signer list succeeded with a disabled key");
    assert!(
        stderr.contains("KEY_DISABLED") && stderr.contains("operator.signer.keyId"),
        "{stderr}"
    );
    assert!(!stderr.contains(SECRET_KEY), "the secret leaked: {stderr}");
    let (ok, _, stderr) = run(keel_with(&env, &sim), &["run", "--role", "runner"]);
    assert!(!ok, "a runner started with a disabled key");
    assert!(stderr.contains("KEY_DISABLED"), "{stderr}");
    assert!(!stderr.contains(SECRET_KEY), "the secret leaked: {stderr}");

    // Enabled again: the runner starts with the KMS key and serves the chain.
    kms.enable_key().key_id(&sim.key_id).send().await.unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("runner.log");
    let mut runner: Child = keel_with(&env, &sim)
        .args(["run", "--role", "runner"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let loaded = text.lines().any(|l| {
            l.contains("signing key loaded")
                && l.contains("awsKms")
                && l.contains(&address.to_string())
        });
        if loaded {
            break;
        }
        assert!(
            runner.try_wait().unwrap().is_none(),
            "the runner exited: {text}"
        );
        assert!(Instant::now() < deadline, "no KMS key loaded: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = runner.kill();
    let _ = runner.wait();
}
