//! The simulator as a process on a real Anvil, a `FireblocksProvider` pointed at it, a
//! webhook receiver, and the on-chain contracts the calls go to.

use std::process::Stdio;
use std::time::Duration;

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::TransactionRequest;
use anvil_tests::TestChain;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_custody::{
    AssetId, ContractCall, ExternalTxId, FireblocksConfig, FireblocksProvider, ProviderTransaction,
    ProviderTxId, Secret, SecretSource, TxStatus, VaultAccountId,
};
use keel_custody::{CustodyProvider, webhook::SIGNATURE_HEADER};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The API key registered with the simulator.
pub(crate) const API_KEY: &str = "keel-test-api-key-6f1c";
/// The vault account the tests use.
pub(crate) const VAULT: &str = "7";
/// The asset id the simulator accepts.
pub(crate) const ASSET: &str = "ETH_TEST";

/// How long a test waits for a status before failing.
pub(crate) const STATUS_DEADLINE: Duration = Duration::from_secs(30);

/// An RSA key pair as PEM.
pub(crate) struct RsaPem {
    pub private: String,
    pub public: String,
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A fresh 2048-bit RSA key.
pub(crate) fn rsa_key() -> RsaPem {
    let pair = KeyPair::generate(KeySize::Rsa2048).unwrap();
    let private = pair.as_der().unwrap();
    let public = pair.public_key().as_der().unwrap();
    RsaPem {
        private: pem("PRIVATE KEY", private.as_ref()),
        public: pem("PUBLIC KEY", public.as_ref()),
    }
}

/// A webhook delivery as received: the signature header and the raw body.
pub(crate) type Delivery = (Option<String>, Vec<u8>);

/// The simulator process. Dropping it kills the process.
pub(crate) struct Sim {
    _child: Child,
    pub(crate) base: String,
    pub(crate) key: RsaPem,
    pub(crate) http: reqwest::Client,
    pub(crate) deliveries: mpsc::UnboundedReceiver<Delivery>,
    _dir: tempfile::TempDir,
}

/// Starts a webhook receiver; returns its URL and the deliveries.
async fn receiver() -> (String, mpsc::UnboundedReceiver<Delivery>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let tx = tx.clone();
                async move {
                    let sig = headers
                        .get(SIGNATURE_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let _ = tx.send((sig, body.to_vec()));
                    "ok"
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), rx)
}

impl Sim {
    /// Starts the simulator against `chain`, with webhooks to a local receiver.
    pub(crate) async fn start(chain: &TestChain) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let key = rsa_key();
        let public_path = dir.path().join("api-user.pub.pem");
        std::fs::write(&public_path, &key.public).unwrap();
        let (hook_url, deliveries) = receiver().await;
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel-custody-sim"))
            .arg("--rpc-url")
            .arg(chain.endpoint().as_str())
            .arg("--api-user")
            .arg(format!("{API_KEY}={}", public_path.display()))
            .arg("--asset-id")
            .arg(ASSET)
            .arg("--seed")
            .arg("it")
            .arg("--webhook-url")
            .arg(&hook_url)
            .arg("--step-delay-ms")
            .arg("20")
            .arg("--poll-interval-ms")
            .arg("50")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the simulator reports its address")
            .unwrap()
            .expect("a first line");
        let base = line
            .strip_prefix("keel-custody-sim listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Sim {
            _child: child,
            base,
            key,
            http: reqwest::Client::new(),
            deliveries,
            _dir: dir,
        }
    }

    /// The adapter configuration pointing at this simulator.
    pub(crate) fn config(&self) -> FireblocksConfig {
        FireblocksConfig::new(
            self.base.clone(),
            SecretSource::Env("UNUSED_IN_TESTS".into()),
            SecretSource::Env("UNUSED_IN_TESTS".into()),
        )
    }

    /// A `FireblocksProvider` with the registered key.
    pub(crate) fn provider(&self) -> FireblocksProvider {
        self.provider_with(&self.config())
    }

    /// A `FireblocksProvider` with the registered key and `config`.
    pub(crate) fn provider_with(&self, config: &FireblocksConfig) -> FireblocksProvider {
        FireblocksProvider::with_secrets(
            config,
            Secret::new(API_KEY),
            &Secret::new(self.key.private.clone()),
        )
        .unwrap()
    }

    /// POSTs a JSON body to an admin path; returns the HTTP status (no assertion).
    pub(crate) async fn admin_status(&self, path: &str, body: serde_json::Value) -> u16 {
        self.http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// POSTs a JSON body to an admin path; returns the JSON answer.
    pub(crate) async fn admin(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "admin {path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// GETs an admin path.
    pub(crate) async fn admin_get(&self, path: &str) -> serde_json::Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "admin {path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// The vault account's address, funded with 10 ETH on `chain`.
    pub(crate) async fn funded_vault(&self, chain: &TestChain, id: &str) -> Address {
        let vault = self.admin_get(&format!("/admin/vaults/{id}")).await;
        let address: Address = vault["address"].as_str().unwrap().parse().unwrap();
        chain
            .provider()
            .anvil_set_balance(address, U256::from(10u128.pow(19)))
            .await
            .unwrap();
        address
    }

    /// The next webhook delivery, within the deadline.
    pub(crate) async fn next_delivery(&mut self) -> Delivery {
        tokio::time::timeout(STATUS_DEADLINE, self.deliveries.recv())
            .await
            .expect("a webhook delivery in time")
            .expect("the receiver is running")
    }
}

/// Deploys a contract whose code stores calldata word 0 in slot 0.
pub(crate) async fn deploy_store(chain: &TestChain) -> Address {
    // runtime: PUSH1 0 CALLDATALOAD PUSH1 0 SSTORE STOP (7 bytes)
    deploy(chain, "600035600055 00").await
}

/// Deploys a contract that always reverts.
pub(crate) async fn deploy_reverter(chain: &TestChain) -> Address {
    // runtime: PUSH1 0 PUSH1 0 REVERT (5 bytes)
    deploy(chain, "60006000fd").await
}

async fn deploy(chain: &TestChain, runtime_hex: &str) -> Address {
    let runtime = alloy::hex::decode(runtime_hex.replace(' ', "")).unwrap();
    let len = u8::try_from(runtime.len()).unwrap();
    // PUSH1 len PUSH1 12 PUSH1 0 CODECOPY PUSH1 len PUSH1 0 RETURN, then the runtime.
    let mut init = vec![
        0x60, len, 0x60, 0x0c, 0x60, 0x00, 0x39, 0x60, len, 0x60, 0x00, 0xf3,
    ];
    init.extend_from_slice(&runtime);
    let receipt = chain
        .provider()
        .send_transaction(TransactionRequest::default().with_deploy_code(Bytes::from(init)))
        .await
        .unwrap()
        .get_receipt()
        .await
        .unwrap();
    receipt.contract_address.unwrap()
}

/// A contract call from [`VAULT`] writing `word` into the store contract.
pub(crate) fn call(to: Address, word: u64, external: &str) -> ContractCall {
    let mut calldata = U256::from(word).to_be_bytes::<32>().to_vec();
    // The ERC-8021 suffix Keel appends travels unchanged (any trailing bytes here).
    calldata.extend_from_slice(&[0xde, 0xad, 0x80, 0x21]);
    ContractCall {
        vault: VaultAccountId::new(VAULT).unwrap(),
        asset: AssetId::new(ASSET).unwrap(),
        to,
        calldata: Bytes::from(calldata),
        value: U256::ZERO,
        external_tx_id: ExternalTxId::new(external).unwrap(),
        note: "keel test".into(),
    }
}

/// Polls the provider until `done` holds for the transaction, within the deadline.
pub(crate) async fn wait_for(
    provider: &FireblocksProvider,
    id: &ProviderTxId,
    done: impl Fn(&ProviderTransaction) -> bool,
) -> ProviderTransaction {
    keel_store::testing::until("the transaction's status", STATUS_DEADLINE, || async {
        let tx = provider.get(id).await.unwrap();
        if done(&tx) {
            std::ops::ControlFlow::Break(tx)
        } else {
            std::ops::ControlFlow::Continue(tx.status)
        }
    })
    .await
}

/// Polls until the transaction has `status`.
pub(crate) async fn wait_status(
    provider: &FireblocksProvider,
    id: &ProviderTxId,
    status: TxStatus,
) -> ProviderTransaction {
    wait_for(provider, id, |tx| tx.status == status).await
}

/// The number of transactions `address` has sent on chain.
pub(crate) async fn sent_count(chain: &TestChain, address: Address) -> u64 {
    chain
        .provider()
        .get_transaction_count(address)
        .await
        .unwrap()
}
