//! The durable flow on one chain for the Anvil tests of admission and EIP-7702: the
//! database, the queue (bundler = dev account 1), the engine and its executor, the
//! bundler service, and the JSON-RPC service in front of them.

use super::{AaChain, ETHER};
use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use keel_aa::UserOperation;
use keel_aa::admission::AdmissionConfig;
use keel_aa::bundler::{Bundler, BundlerConfig};
use keel_aa::flow::{self, AaChain as FlowChain, AaEnv, AaFailure};
use keel_aa::service::AaService;
use keel_aa::store;
use keel_durable::{Engine, EngineConfig, ExecutorConfig, ExecutorHandle};
use keel_store::testing::TestDatabase;
use keel_txq::{Finality, LocalSigner, TxQueue, TxQueueConfig};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A chain, a database, the queue (bundler = dev account 1), the engine and its executor.
pub struct Flow {
    pub aa: AaChain,
    pub db: TestDatabase,
    pub env: Arc<AaEnv>,
    pub engine: Engine,
    executor: Option<ExecutorHandle>,
    pub cancel: CancellationToken,
}

impl Flow {
    pub async fn start(admission: AdmissionConfig) -> anyhow::Result<Self> {
        let aa = AaChain::start().await?;
        let db = TestDatabase::create().await?;
        keel_store::migrate(db.pool()).await?;
        let pool = Arc::new(super::pool(&aa.chain, aa.chain.endpoint().as_str()));
        let mut queue = TxQueue::new(
            db.pool().clone(),
            pool.clone(),
            TxQueueConfig {
                confirmations: 1,
                poll_interval: Duration::from_millis(50),
                // A local chain: the head is final (chains.local.finalityDepth = 0), so
                // outcomes are reported at the verdict (issue 33 §2).
                finality: Finality::Depth(0),
                ..TxQueueConfig::default()
            },
        )?;
        queue.add_signer(Arc::new(LocalSigner::new(aa.chain.signer(1)?.clone())));
        let env = Arc::new(AaEnv {
            db: db.pool().clone(),
            later_chains: Default::default(),
            chains: [(
                aa.chain.chain_id(),
                FlowChain {
                    pool,
                    queue: Arc::new(queue),
                    directory: aa.deployed.directory,
                    bundler: aa.chain.account(1)?,
                    policy: None,
                    organization_policies: Default::default(),
                    beneficiary: None,
                    sponsor: Some(keel_aa::flow::Sponsor {
                        paymaster: aa.paymaster,
                        signer: keel_txq::SignerHandle::local(aa.sponsor.clone()),
                        validity_secs: 600,
                        verification_gas_limit: 100_000,
                        post_op_gas_limit: 0,
                    }),
                    admission,
                },
            )]
            .into_iter()
            .collect(),
        });
        let engine = flow::register(
            Engine::new(db.pool().clone(), EngineConfig::default())?,
            env.clone(),
        );
        let executor = engine.spawn_executor(ExecutorConfig {
            poll_interval: Duration::from_millis(50),
            ..ExecutorConfig::default()
        })?;
        Ok(Self {
            aa,
            db,
            env,
            engine,
            executor: Some(executor),
            cancel: CancellationToken::new(),
        })
    }

    pub fn chain_id(&self) -> u64 {
        self.aa.chain.chain_id()
    }

    pub fn queue(&self) -> Arc<TxQueue> {
        self.env.chains[&self.chain_id()].queue.clone()
    }

    pub fn service(&self) -> AaService {
        AaService::new(self.env.clone(), self.engine.clone())
    }

    pub fn bundler(&self) -> anyhow::Result<Bundler> {
        self.bundler_with(BundlerConfig::default())
    }

    pub fn bundler_with(&self, config: BundlerConfig) -> anyhow::Result<Bundler> {
        Ok(Bundler::new(
            self.env.clone(),
            self.engine.clone(),
            self.chain_id(),
            config,
        )?)
    }

    /// Runs the queue's loops and the bundler service until the test ends.
    pub fn start_queue_and_bundler(&self) -> anyhow::Result<()> {
        self.start_queue_and_bundler_with(BundlerConfig::default())
    }

    /// As [`Flow::start_queue_and_bundler`] with the bundler's `config`.
    pub fn start_queue_and_bundler_with(&self, config: BundlerConfig) -> anyhow::Result<()> {
        self.start_queue();
        tokio::spawn(keel_service::run(
            self.bundler_with(config)?,
            keel_service::ServiceConfig::new(Duration::from_millis(100)),
            self.cancel.clone(),
        ));
        Ok(())
    }

    pub fn start_queue(&self) {
        let queue = self.queue();
        let cancel = self.cancel.clone();
        tokio::spawn(async move { queue.run(cancel).await });
    }

    /// A fresh SimpleAccount (created by initCode, no ETH) holding 10 tokens; its owner.
    pub async fn account(&self) -> anyhow::Result<(PrivateKeySigner, Address)> {
        let owner = PrivateKeySigner::random();
        let sender = self.aa.account_of(owner.address()).await?;
        self.aa
            .mint(sender, U256::from(10u64) * U256::from(ETHER))
            .await?;
        Ok((owner, sender))
    }

    /// A transfer of 1 base unit from `sender` at `nonce` (created when 0), with `edit`
    /// applied to its fields, then sponsored and signed.
    pub async fn op(
        &self,
        owner: &PrivateKeySigner,
        sender: Address,
        nonce: u64,
        edit: impl FnOnce(&mut UserOperation),
    ) -> anyhow::Result<(UserOperation, B256)> {
        let mut op = self.aa.transfer_op(
            owner.address(),
            sender,
            nonce,
            nonce == 0,
            Address::with_last_byte(0x77),
            U256::from(1u64),
        );
        op.pre_verification_gas = U256::from(100_000u64);
        edit(&mut op);
        let (packed, hash) = self
            .aa
            .sponsor_and_sign(op, &self.aa.sponsor, owner)
            .await?;
        Ok((packed.unpack()?, hash))
    }

    pub async fn submit(&self, op: UserOperation) -> anyhow::Result<flow::Submitted> {
        Ok(flow::submit(
            &self.env,
            &self.engine,
            self.chain_id(),
            self.aa.ep().address(),
            op,
            None,
        )
        .await?)
    }

    /// `eth_sendUserOperation([op, entryPoint])` through the JSON-RPC service.
    pub async fn send(&self, op: &UserOperation) -> Value {
        let body = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "eth_sendUserOperation",
            "params": [op, self.aa.ep().address()],
        }))
        .unwrap();
        self.service().rpc(self.chain_id(), None, &body).await
    }

    pub async fn rpc(&self, method: &str, params: Value) -> Value {
        let body = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": 1, "method": method, "params": params,
        }))
        .unwrap();
        self.service().rpc(self.chain_id(), None, &body).await
    }

    pub async fn row(&self, hash: B256) -> anyhow::Result<Option<store::UserOperationRow>> {
        Ok(
            store::user_operation_get(self.db.pool(), self.chain_id() as i64, hash.as_slice())
                .await?,
        )
    }

    pub async fn state(&self, hash: B256) -> anyhow::Result<store::UserOpState> {
        Ok(self
            .row(hash)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no row"))?
            .state)
    }

    /// Waits (the engine's idle probe, bounded) until the row of `hash` is in `state`.
    pub async fn until_state(&self, hash: B256, state: store::UserOpState) -> anyhow::Result<()> {
        for _ in 0..300 {
            if self.row(hash).await?.is_some_and(|r| r.state == state) {
                return Ok(());
            }
            self.engine.await_idle(Duration::from_secs(1)).await.ok();
        }
        anyhow::bail!(
            "operation never reached {state}: {:?}",
            self.row(hash).await?.map(|r| r.state)
        )
    }

    pub async fn settled(&self, id: Uuid) -> anyhow::Result<keel_durable::InstanceStatus> {
        for _ in 0..240 {
            if let Some(s) = self
                .engine
                .await_terminal(id, Duration::from_secs(1))
                .await?
            {
                return Ok(s);
            }
        }
        anyhow::bail!("instance {id} did not end")
    }

    /// The latest block's base fee, wei per gas.
    pub async fn base_fee(&self) -> anyhow::Result<u128> {
        let block = self
            .aa
            .provider()
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no block"))?;
        Ok(u128::from(block.header.base_fee_per_gas.unwrap_or(0)))
    }

    /// Transactions the bundler's sender (dev account 1) has on chain.
    pub async fn bundler_txs(&self) -> anyhow::Result<u64> {
        Ok(self
            .aa
            .provider()
            .get_transaction_count(self.aa.chain.account(1)?)
            .await?)
    }

    pub async fn count(&self, sql: &'static str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(sql).fetch_one(self.db.pool()).await?)
    }

    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(e) = self.executor.take() {
            e.shutdown().await;
        }
    }
}

pub fn failure(s: &keel_durable::InstanceStatus) -> AaFailure {
    let detail = s
        .error
        .as_ref()
        .and_then(|e| e.detail.clone())
        .expect("typed failure");
    serde_json::from_value(detail).unwrap()
}

/// Asserts a JSON-RPC refusal with `code` naming `field` (in `data.field` and in the
/// message) for `reason`.
pub fn refused(r: &Value, code: i64, field: &str, reason: &str) {
    assert_eq!(r["error"]["code"], code, "{r}");
    assert_eq!(r["error"]["data"]["field"], field, "{r}");
    assert_eq!(r["error"]["data"]["reason"], reason, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap_or("").contains(field),
        "the message names the field: {r}"
    );
}
