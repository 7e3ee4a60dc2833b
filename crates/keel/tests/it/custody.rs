//! A custody vault as a template's sender, end to end (issue 19): the `keel` binary's
//! three roles and `keel-custody-sim` as separate processes against a real PostgreSQL
//! and a real Anvil, driven through the Platform API. The asset's writes are signed and
//! broadcast by the simulator for vault account 7 (configured as
//! `chains.local.custody.vaults.treasury`); its webhooks reach the api role.

use crate::common::free_port;
use crate::common::stack::{Procs, dev_key};

use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use alloy::rpc::types::Filter;
use alloy::sol_types::SolEvent;
use anvil_tests::TestChain;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use base64::Engine as _;
use keel_abi::bindings::{AssetFactory, AssetToken};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

/// The API key registered with the simulator (a test value).
const API_KEY: &str = "keel-e2e-custody-api-key-3b7d";
/// The vault account at the simulator.
const VAULT_ACCOUNT: &str = "7";
/// The vault's name in Keel's configuration.
const VAULT: &str = "treasury";
/// The provider's asset id of the chain's coin.
const ASSET_ID: &str = "ETH_TEST";
/// The environment variable that holds the API key (a secret source `env:`).
const API_KEY_ENV: &str = "KEEL_TEST_FIREBLOCKS_API_KEY";

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The simulator binary, current: `cargo build -p keel-custody-sim` into the target
/// directory and profile `keel` was built in, every time (a no-op when it is fresh). A
/// simulator binary that already exists is never trusted as is: it may predate the
/// simulator's source. Fails loudly when the build fails or leaves no binary.
fn sim_binary() -> std::path::PathBuf {
    let keel = std::path::PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let sim = keel.with_file_name(format!("keel-custody-sim{}", std::env::consts::EXE_SUFFIX));
    // `<target>/<profile dir>/keel`; the `debug` directory is the `dev` profile's.
    let profile_dir = keel.parent().unwrap();
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev",
        other => other,
    };
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "keel-custody-sim",
            "--profile",
            profile,
            "--target-dir",
        ])
        .arg(profile_dir.parent().unwrap())
        .current_dir(anvil_tests::workspace_root())
        .status()
        .unwrap();
    assert!(status.success(), "building keel-custody-sim failed");
    assert!(
        sim.exists(),
        "no simulator at {} after its build",
        sim.display()
    );
    sim
}

/// The full stack ([`Procs`]) and `keel-custody-sim` (process `sim`) with vault
/// account 7 configured as `chains.local.custody.vaults.treasury`, acme's key and its
/// template `vault` sending from it.
struct Stack {
    procs: Procs,
    /// The simulator's origin.
    sim: String,
    vault: Address,
    key: String,
}

impl std::ops::Deref for Stack {
    type Target = Procs;
    fn deref(&self) -> &Procs {
        &self.procs
    }
}

impl std::ops::DerefMut for Stack {
    fn deref_mut(&mut self) -> &mut Procs {
        &mut self.procs
    }
}

impl Stack {
    async fn start(chain: TestChain) -> Stack {
        let mut procs = Procs::new(chain, tempfile::tempdir().unwrap(), Vec::new()).await;
        procs.show_log("sim");
        let api = procs.api.clone();
        let sim_port = free_port();
        let sim = format!("http://127.0.0.1:{sim_port}");
        // The API user's RSA key: the private half for Keel (a `file:` secret), the
        // public half registered with the simulator, which verifies every request JWT.
        let pair = KeyPair::generate(KeySize::Rsa2048).unwrap();
        let private_path = procs.logs.path().join("fireblocks.pem");
        std::fs::write(
            &private_path,
            pem("PRIVATE KEY", pair.as_der().unwrap().as_ref()),
        )
        .unwrap();
        let public_path = procs.logs.path().join("fireblocks.pub.pem");
        std::fs::write(
            &public_path,
            pem("PUBLIC KEY", pair.public_key().as_der().unwrap().as_ref()),
        )
        .unwrap();
        // Vault account 7 holds Anvil's funded dev account 5 (so it can pay for gas).
        let vault_key = dev_key(&procs.chain, 5);
        let vault = procs.chain.account(5).unwrap();
        let sim_log = std::fs::File::create(procs.logs.path().join("sim.log")).unwrap();
        let mut child = std::process::Command::new(sim_binary())
            .args(["--listen", &format!("127.0.0.1:{sim_port}")])
            .args(["--rpc-url", procs.chain.endpoint().as_str()])
            .arg("--api-user")
            .arg(format!("{API_KEY}={}", public_path.display()))
            .args(["--asset-id", ASSET_ID])
            .args(["--vault-key", &format!("{VAULT_ACCOUNT}={vault_key}")])
            .args([
                "--webhook-url",
                &format!("{api}/v1/custody/webhooks/fireblocks"),
            ])
            .args(["--step-delay-ms", "20", "--poll-interval-ms", "50"])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(sim_log))
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(
            first.trim(),
            format!("keel-custody-sim listening on {sim}"),
            "the simulator did not start"
        );
        procs.adopt("sim", child);
        let custody = "KEEL__CHAINS__LOCAL__CUSTODY__";
        let vault_key_prefix = format!("{custody}VAULTS__{}__", VAULT.to_uppercase());
        let specific: Vec<(String, String)> = vec![
            (format!("{custody}PROVIDER"), "fireblocks".into()),
            (format!("{custody}BASEURL"), sim.clone()),
            (format!("{custody}APIKEY"), format!("env:{API_KEY_ENV}")),
            (
                format!("{custody}PRIVATEKEY"),
                format!("file:{}", private_path.display()),
            ),
            (
                format!("{vault_key_prefix}VAULTACCOUNTID"),
                format!("\"{VAULT_ACCOUNT}\""),
            ),
            (format!("{vault_key_prefix}ASSETID"), ASSET_ID.into()),
            (format!("{vault_key_prefix}ADDRESS"), vault.to_string()),
            // Webhooks are the fast path; the polls are only the safety net.
            (format!("{vault_key_prefix}POLLINTERVALMS"), "2000".into()),
            (
                format!("{vault_key_prefix}MAXPOLLINTERVALMS"),
                "5000".into(),
            ),
            (
                "KEEL__CUSTODY__WEBHOOKJWKSURL".into(),
                format!("{sim}/.well-known/jwks.json"),
            ),
            (API_KEY_ENV.into(), API_KEY.into()),
        ];
        procs.env.extend(specific);
        let mut stack = Stack {
            procs,
            sim,
            vault,
            key: String::new(),
        };
        stack.bootstrap();
        stack.cli(&["org", "create", "--name", "acme"]);
        stack.key = stack.cli(&["api-key", "create", "--org", "acme", "--label", "a"]);
        let set = stack.cli(&[
            "template", "set", "--org", "acme", "--id", "vault", "--chain", "local", "--sender",
            VAULT,
        ]);
        assert!(set.contains("sender vault treasury"), "{set}");
        stack.start_roles().await;
        stack
    }

    /// `POST path` with acme's key (checked against the OpenAPI document).
    async fn post(&self, path: &str, idem: &str, body: Value) -> (u16, Value) {
        self.procs.post(&self.key, path, idem, body).await
    }

    /// `GET path` with acme's key (checked against the OpenAPI document).
    async fn get(&self, path: &str) -> (u16, Value) {
        self.procs.get(&self.key, path).await
    }

    /// A call of the simulator's admin API (no auth; loopback).
    async fn admin(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.sim))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "admin {path}: {}", r.status());
        r.json().await.unwrap_or(Value::Null)
    }

    /// Polls the operation (read with acme's key) until `done(view)` holds.
    async fn await_op(&self, id: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        self.procs.await_op(&self.key, id, within, done).await
    }

    async fn mint(&self, asset: &str, idem: &str, to: Address, amount: &str) -> String {
        let (status, body) = self
            .post(
                &format!("/v1/assets/{asset}/mint"),
                idem,
                json!({"recipient": to.to_string(), "amount": amount}),
            )
            .await;
        assert!(status == 202 || status == 200, "{status} {body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// The token's `Transfer` events from the zero address (its mints).
    async fn mints_of(&self, token: Address) -> Vec<alloy::rpc::types::Log> {
        self.chain
            .provider()
            .get_logs(
                &Filter::new()
                    .address(token)
                    .event_signature(AssetToken::Transfer::SIGNATURE_HASH)
                    .topic1(Address::ZERO.into_word())
                    .from_block(0),
            )
            .await
            .unwrap()
    }

    /// The api role's `keel_api_custody_webhooks_total` samples, by `result`.
    async fn webhook_counts(&self) -> HashMap<String, f64> {
        let text = self.scrape("api").await;
        text.lines()
            .filter(|l| l.starts_with("keel_api_custody_webhooks_total{"))
            .filter_map(|l| {
                let result = l.split("result=\"").nth(1)?.split('"').next()?.to_owned();
                let value = l.rsplit(' ').next()?.parse().ok()?;
                Some((result, value))
            })
            .collect()
    }
}

fn state(v: &Value) -> &str {
    v["state"].as_str().unwrap_or_default()
}

fn terminal(v: &Value) -> bool {
    matches!(state(v), "completed" | "failed" | "cancelled")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vault_template_creates_and_mints_through_the_provider_with_an_approval_and_a_rejection()
{
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(chain).await;

    // An unknown vault is refused by name, and nothing is written.
    let out = stack.cli_output(&[
        "template", "set", "--org", "acme", "--id", "nope", "--chain", "local", "--sender",
        "missing",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown sender `missing`")
            && stderr.contains("chains.local.custody.vaults.missing"),
        "{stderr}"
    );
    // The printed configuration names the secret sources, never the values.
    let printed = stack.cli(&["config", "print"]);
    assert!(printed.contains(&format!("env:{API_KEY_ENV}")), "{printed}");
    assert!(!printed.contains(API_KEY), "{printed}");

    // The asset: all five writes sent by the vault (signed and broadcast by the
    // provider), which becomes the asset's issuer.
    let (status, body) = stack
        .post(
            "/v1/assets",
            "create-1",
            json!({"name": "Vault Fund", "symbol": "VLT", "decimals": 6,
                   "templateId": "vault", "initialPrice": "1.00"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let (op, asset) = (
        body["id"].as_str().unwrap().to_owned(),
        body["assetId"].as_str().unwrap().to_owned(),
    );
    let view = stack
        .await_op(&op, Duration::from_secs(180), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}\n{}", stack.logs());
    let (_, asset_view) = stack.get(&format!("/v1/assets/{asset}")).await;
    assert_eq!(
        asset_view["issuerAddress"],
        stack.vault.to_checksum(None),
        "{asset_view}"
    );
    let token: Address = asset_view["tokenAddress"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let created = stack
        .chain
        .provider()
        .get_logs(
            &Filter::new()
                .event_signature(AssetFactory::AssetCreated::SIGNATURE_HASH)
                .from_block(0),
        )
        .await
        .unwrap();
    assert_eq!(created.len(), 1, "one deployment");
    let deploy = stack
        .chain
        .provider()
        .get_transaction_receipt(created[0].transaction_hash.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(deploy.from, stack.vault, "sent by the vault");

    // A mint that waits for an approval at the provider: visible as a wait of kind
    // `custody_approval` with the provider's id and status, nothing on chain meanwhile.
    stack
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let holder = stack.chain.account(3).unwrap();
    let mint = stack.mint(&asset, "mint-1", holder, "5").await;
    let waiting = stack
        .await_op(&mint, Duration::from_secs(60), |v| {
            v["wait"]["for"] == "custody_approval"
        })
        .await;
    let custody = &waiting["wait"]["custody"];
    assert_eq!(custody["provider"], "fireblocks", "{waiting}");
    assert_eq!(custody["status"], "PENDING_AUTHORIZATION", "{waiting}");
    let provider_id = custody["providerTxId"].as_str().unwrap().to_owned();
    assert!(stack.mints_of(token).await.is_empty(), "nothing minted yet");
    stack
        .admin(
            &format!("/admin/transactions/{provider_id}/approve"),
            json!({}),
        )
        .await;
    let view = stack
        .await_op(&mint, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let mints = stack.mints_of(token).await;
    assert_eq!(mints.len(), 1, "exactly one mint on chain");
    let balance = AssetToken::new(token, stack.chain.provider())
        .balanceOf(holder)
        .call()
        .await
        .unwrap();
    assert_eq!(balance, U256::from(5_000_000u64));

    // A mint the provider rejects: the operation fails with the provider's code and
    // reason, and nothing reaches the chain.
    stack
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "reject", "subStatus": "REJECTED_BY_USER"}),
        )
        .await;
    let rejected = stack.mint(&asset, "mint-2", holder, "7").await;
    let view = stack
        .await_op(&rejected, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "failed", "{view}");
    assert_eq!(view["error"]["code"], "CUSTODY_REJECTED", "{view}");
    assert_eq!(stack.mints_of(token).await.len(), 1, "no second mint");
    let balance = AssetToken::new(token, stack.chain.provider())
        .balanceOf(holder)
        .call()
        .await
        .unwrap();
    assert_eq!(balance, U256::from(5_000_000u64));

    // Issue 32 §5: a cancel of a mint waiting for an approval at the provider cancels it
    // there; the operation reads `cancelled`, naming the provider's transaction, and an
    // approval given at the provider afterwards has nothing to approve: nothing minted.
    stack
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let doomed = stack.mint(&asset, "mint-3", holder, "11").await;
    let waiting = stack
        .await_op(&doomed, Duration::from_secs(60), |v| {
            v["wait"]["for"] == "custody_approval"
        })
        .await;
    let doomed_pid = waiting["wait"]["custody"]["providerTxId"]
        .as_str()
        .unwrap()
        .to_owned();
    // `keel ops show` prints the provider's transaction id and status.
    let out = crate::common::keel()
        .args(["ops", "show", &doomed])
        .env("KEEL_API_URL", &stack.api)
        .env("KEEL_API_KEY", &stack.key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(
        shown.contains(&format!(
            "fireblocks tx {doomed_pid} status PENDING_AUTHORIZATION"
        )),
        "{shown}"
    );
    let (status, body) = stack
        .post(
            &format!("/v1/operations/{doomed}/cancel"),
            "cancel-3",
            json!({}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    // The instance is cancelled at once (it was waiting); the provider's cancel is
    // confirmed by the queue's custody pass shortly after.
    let view = stack
        .await_op(&doomed, Duration::from_secs(60), |v| {
            v["error"]["detail"]
                .as_str()
                .is_some_and(|d| d.contains("cancelled at the provider"))
        })
        .await;
    assert_eq!(state(&view), "cancelled", "{view}");
    let detail = view["error"]["detail"].as_str().unwrap();
    assert!(detail.contains("none of its transactions landed"), "{view}");
    assert!(
        detail.contains(&format!(
            "transaction {doomed_pid} was cancelled at the provider"
        )),
        "{view}"
    );
    let late = reqwest::Client::new()
        .post(format!(
            "{}/admin/transactions/{doomed_pid}/approve",
            stack.sim
        ))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status().as_u16(), 409, "nothing left to approve");
    assert_eq!(
        stack.mints_of(token).await.len(),
        1,
        "no mint from the cancel"
    );

    // The provider's webhooks reached the api role, verified, and woke the queue.
    let counts = stack.webhook_counts().await;
    assert!(
        counts.get("woken").copied().unwrap_or(0.0) >= 1.0,
        "{counts:?}"
    );
    assert_eq!(
        counts.get("refused").copied().unwrap_or(0.0),
        0.0,
        "{counts:?}"
    );

    // Every custody metric the api and the runner exported is in docs/metrics.md, with
    // its labels (the scrape test of e2e.rs runs no custody sender).
    let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
    let doc = std::fs::read_to_string(doc_path).unwrap();
    let mut seen = Vec::new();
    for role in ["api", "runner"] {
        for line in stack.scrape(role).await.lines() {
            let Some(name) = line.split(['{', ' ']).next() else {
                continue;
            };
            let name = name.trim_end_matches("_bucket");
            if line.starts_with('#') || !name.starts_with("keel_") || !name.contains("custody") {
                continue;
            }
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}` |")))
                .unwrap_or_else(|| panic!("{name} is not in {doc_path}"));
            let labels = line
                .split_once('{')
                .map(|(_, rest)| rest.split('}').next().unwrap_or_default())
                .unwrap_or_default();
            for label in labels.split(',').filter_map(|kv| kv.split('=').next()) {
                if !label.is_empty() && label != "deployment_id" {
                    assert!(
                        row.contains(&format!("`{label}`")),
                        "{name}: label {label} not in {row}"
                    );
                }
            }
            seen.push(name.to_owned());
        }
    }
    for expected in [
        "keel_api_custody_webhooks_total",
        "keel_txq_custody_creates_total",
        "keel_txq_custody_status_reads_total",
        "keel_custody_requests_total",
    ] {
        assert!(
            seen.iter().any(|n| n == expected),
            "{expected} not exported: {seen:?}"
        );
    }
}
