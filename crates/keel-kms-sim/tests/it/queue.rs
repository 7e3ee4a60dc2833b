//! Keel's AWS KMS signer (`kind = "awsKms"`, built as the roles build it) signing
//! through the transaction queue on Anvil, and every failure class of KMS: nothing is
//! persisted for a signature KMS did not give, the queue reports a typed error, and it
//! resumes once KMS answers again; each effect lands on chain exactly once.

use crate::sim::{Sim, runtime, use_sim_credentials};
use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use anvil_tests::TestChain;
use keel::signer::{SignerConfig, SignerLoadError};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    Finality, RequestState, SettlementVerdict, SignerError, SignerHandle, SignerRefusal, TxQueue,
    TxQueueConfig, TxRequest, TxqError,
};
use keel_units::{ChainId, Wei};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const RECIPIENT: Address = Address::repeat_byte(0x42);

fn config(sim: &Sim, key_id: &str) -> SignerConfig {
    SignerConfig::AwsKms {
        key_id: key_id.to_owned(),
        region: crate::sim::REGION.to_owned(),
        endpoint: Some(sim.url.clone()),
    }
}

async fn kms_signer(sim: &Sim, key_id: &str) -> SignerHandle {
    config(sim, key_id)
        .build("operator.signer")
        .await
        .unwrap()
        .unwrap()
}

struct Fixture {
    chain: TestChain,
    db: TestDatabase,
}

impl Fixture {
    async fn new() -> Self {
        Self {
            chain: TestChain::start().await.unwrap(),
            db: TestDatabase::create().await.unwrap(),
        }
    }

    /// Gives `who` 10 ether.
    async fn fund(&self, who: Address) {
        self.chain
            .provider()
            .raw_request::<_, ()>("anvil_setBalance".into(), (who, U256::from(10u128.pow(19))))
            .await
            .unwrap();
    }

    /// A queue (as after a start of the runner) whose only signer is `signer`.
    fn queue(&self, signer: &SignerHandle) -> TxQueue {
        let pool = UpstreamPool::new(
            ChainId(self.chain.chain_id()),
            UpstreamConfig::new(vec![self.chain.endpoint().to_string()]),
        )
        .unwrap();
        let mut q = TxQueue::new(
            self.db.pool().clone(),
            Arc::new(pool),
            TxQueueConfig {
                finality: Finality::Depth(0),
                ..TxQueueConfig::default()
            },
        )
        .unwrap();
        q.add_signer(signer.tx_signer());
        q
    }

    async fn attempts(&self, id: Uuid) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM txq_attempt WHERE request_id = $1")
            .bind(id)
            .fetch_one(self.db.pool())
            .await
            .unwrap()
    }

    async fn nonce(&self, who: Address) -> u64 {
        self.chain
            .provider()
            .get_transaction_count(who)
            .await
            .unwrap()
    }

    async fn received(&self) -> U256 {
        self.chain.provider().get_balance(RECIPIENT).await.unwrap()
    }
}

fn transfer(sender: Address, key: &str, wei: u64) -> TxRequest {
    TxRequest {
        sender,
        idempotency_key: key.to_owned(),
        to: Some(RECIPIENT),
        value: Wei::new(U256::from(wei)),
        data: Bytes::new(),
        gas_limit: Some(21_000),
        authorization_list: Vec::new(),
    }
}

/// Ticks the queue until every id is settled (a bounded probe), then returns the
/// verdicts in order.
async fn settle(q: &TxQueue, ids: &[Uuid]) -> Vec<SettlementVerdict> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let _ = q.tick().await;
        let mut out = Vec::new();
        for id in ids {
            if let Some(v) = q.status(*id).await.unwrap().verdict {
                out.push(v);
            }
        }
        if out.len() == ids.len() {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} settled",
            out.len(),
            ids.len()
        );
    }
}

/// The signer error a round reports.
fn signer_error(r: Result<(), TxqError>) -> SignerError {
    match r {
        Err(TxqError::Signer(e)) => e,
        other => panic!("expected a signer error, got {other:?}"),
    }
}

/// Asserts `id` is still queued with nothing signed or persisted for it.
async fn untouched(f: &Fixture, q: &TxQueue, id: Uuid) {
    let status = q.status(id).await.unwrap();
    assert_eq!(status.state, RequestState::Queued, "{status:?}");
    assert_eq!(status.nonce, None);
    assert_eq!(
        f.attempts(id).await,
        0,
        "an attempt was persisted without a signature"
    );
}

fn confirmed(v: &SettlementVerdict) {
    assert!(matches!(v, SettlementVerdict::Confirmed { .. }), "{v:?}");
}

/// A transfer signed in KMS is sent and confirmed on Anvil from the KMS key's
/// address; the key never left the simulator (the queue only ever held its address).
#[test]
fn a_kms_key_signs_and_sends_through_the_queue() {
    use_sim_credentials();
    runtime().block_on(async {
        let f = Fixture::new().await;
        let sim = Sim::start();
        let key = sim.create_key().await;
        let signer = kms_signer(&sim, &key).await;
        assert_eq!(signer.kind(), "awsKms");
        let from = signer.address();
        f.fund(from).await;
        let q = f.queue(&signer);
        let ids = [
            q.enqueue(&transfer(from, "kms-1", 5)).await.unwrap(),
            q.enqueue(&transfer(from, "kms-2", 7)).await.unwrap(),
        ];
        for v in settle(&q, &ids).await {
            confirmed(&v);
        }
        assert_eq!(f.nonce(from).await, 2);
        assert_eq!(f.received().await, U256::from(12u64));
        let hash = match q.status(ids[0]).await.unwrap().verdict.unwrap() {
            SettlementVerdict::Confirmed { attempts, .. } => attempts[0].hash,
            other => panic!("{other:?}"),
        };
        let tx = f
            .chain
            .provider()
            .get_transaction_by_hash(hash)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(alloy::consensus::Transaction::nonce(tx.inner.inner()), 0);
        assert_eq!(tx.inner.signer(), from);
        assert!(sim.stats().await["signs"].as_u64().unwrap() >= 2);
    });
}

/// Throttled, KMS-side errors, unreachable, key disabled: each is a typed signer error,
/// nothing half-signed is persisted, and once KMS answers again the queue resumes and
/// the transfer lands exactly once.
#[test]
fn every_kms_failure_leaves_the_request_queued_and_the_queue_resumes() {
    use_sim_credentials();
    runtime().block_on(async {
        let f = Fixture::new().await;
        let mut sim = Sim::start();
        let key = sim.create_key().await;
        let signer = kms_signer(&sim, &key).await;
        let from = signer.address();
        f.fund(from).await;
        let q = f.queue(&signer);
        let mut ids = Vec::new();

        // Throttled (HTTP 400 ThrottlingException) beyond the SDK's own 3 attempts.
        sim.faults(serde_json::json!({"throttle": 100})).await;
        let id = q.enqueue(&transfer(from, "throttled", 1)).await.unwrap();
        let e = signer_error(q.tick().await);
        assert!(matches!(e, SignerError::Unavailable), "{e:?}");
        assert!(e.is_retryable());
        untouched(&f, &q, id).await;
        sim.clear().await;
        ids.push(id);

        // KMS-side faults (HTTP 500 KMSInternalException).
        sim.faults(serde_json::json!({"internalError": 100})).await;
        let id = q.enqueue(&transfer(from, "internal", 1)).await.unwrap();
        let e = signer_error(q.tick().await);
        assert!(matches!(e, SignerError::Unavailable), "{e:?}");
        for id in ids.iter().chain([&id]) {
            untouched(&f, &q, *id).await;
        }
        sim.clear().await;
        ids.push(id);

        // Unreachable: the process is gone.
        sim.kill();
        let id = q.enqueue(&transfer(from, "unreachable", 1)).await.unwrap();
        let e = signer_error(q.tick().await);
        assert!(matches!(e, SignerError::Unavailable), "{e:?}");
        for id in ids.iter().chain([&id]) {
            untouched(&f, &q, *id).await;
        }
        sim.restart();
        ids.push(id);

        // The key disabled in KMS: refused, not retryable by itself.
        sim.set_enabled(&key, false).await;
        let id = q.enqueue(&transfer(from, "disabled", 1)).await.unwrap();
        let e = signer_error(q.tick().await);
        assert!(
            matches!(e, SignerError::Refused(SignerRefusal::KeyDisabled)),
            "{e:?}"
        );
        assert_eq!(e.code(), "KEY_DISABLED");
        assert!(!e.is_retryable());
        for id in ids.iter().chain([&id]) {
            untouched(&f, &q, *id).await;
        }
        assert_eq!(f.nonce(from).await, 0, "nothing reached the chain");
        sim.set_enabled(&key, true).await;
        ids.push(id);

        // KMS answers again: every request is signed once, in order, and confirmed.
        let verdicts = settle(&q, &ids).await;
        for v in &verdicts {
            confirmed(v);
        }
        assert_eq!(f.nonce(from).await, 4);
        assert_eq!(f.received().await, U256::from(4u64));
        for id in &ids {
            assert_eq!(f.attempts(*id).await, 1, "one signature per request");
        }
    });
}

/// A key that cannot be used at start stops the role with a typed error naming the
/// configuration key and the key id, never a secret; a key that is not secp256k1
/// is told apart.
#[test]
fn an_unusable_kms_key_is_a_startup_error() {
    use_sim_credentials();
    runtime().block_on(async {
        let mut sim = Sim::start();
        let key = sim.create_key().await;
        let reason = |r: Result<Option<SignerHandle>, SignerLoadError>| match r {
            Err(SignerLoadError::AwsKms {
                key,
                key_id,
                reason,
            }) => {
                assert_eq!(key, "operator.signer");
                (key_id, reason)
            }
            other => panic!("expected an AwsKms load error, got {other:?}"),
        };
        sim.set_enabled(&key, false).await;
        let e = config(&sim, &key).build("operator.signer").await;
        let msg = e.as_ref().unwrap_err().to_string();
        assert_eq!(reason(e), (key.clone(), "KEY_DISABLED"));
        assert!(
            msg.contains(&key) && msg.contains("operator.signer.keyId"),
            "{msg}"
        );
        assert!(!msg.contains(crate::sim::SECRET_KEY), "{msg}");

        let missing = "2f1c0a34-0000-4000-8000-000000000000";
        let e = config(&sim, missing).build("operator.signer").await;
        assert_eq!(reason(e), (missing.to_owned(), "KEY_NOT_FOUND"));

        sim.kill();
        let e = config(&sim, &key).build("operator.signer").await;
        assert_eq!(reason(e), (key.clone(), "UNAVAILABLE"));
    });
}

/// The configuration's checks of the kind's fields.
#[test]
fn kms_signer_fields_are_validated() {
    let ok = SignerConfig::AwsKms {
        key_id: "alias/keel-operator".into(),
        region: "eu-west-1".into(),
        endpoint: None,
    };
    assert!(ok.validate("operator.signer").is_ok());
    assert_eq!(ok.kind(), "awsKms");
    for (bad, field) in [
        (
            SignerConfig::AwsKms {
                key_id: " ".into(),
                region: "eu-west-1".into(),
                endpoint: None,
            },
            "keyId",
        ),
        (
            SignerConfig::AwsKms {
                key_id: "k".into(),
                region: "".into(),
                endpoint: None,
            },
            "region",
        ),
        (
            SignerConfig::AwsKms {
                key_id: "k".into(),
                region: "eu-west-1".into(),
                endpoint: Some("kms.local".into()),
            },
            "endpoint",
        ),
    ] {
        let e = bad.validate("operator.signer").unwrap_err().to_string();
        assert!(e.contains(&format!("operator.signer.{field}")), "{e}");
    }
    // The TOML form.
    let parsed: SignerConfig = toml::from_str(
        "kind = \"awsKms\"\nkeyId = \"1234abcd-12ab-34cd-56ef-1234567890ab\"\nregion = \"us-east-1\"\nendpoint = \"https://kms.us-east-1.amazonaws.com\"\n",
    )
    .unwrap();
    assert!(matches!(
        parsed,
        SignerConfig::AwsKms {
            endpoint: Some(_),
            ..
        }
    ));
}
