//! Sponsored user operations per second end to end (accepted → included) through Keel's
//! durable flow on Anvil, against the ceiling: the same kind of operations sent as
//! `handleOps` bundles straight from an EOA, with no durability (no database, no
//! workflow, no queue). Printed as a ratio in the same run.
//!
//! `cargo bench -p keel-aa --bench aa` (needs PostgreSQL, Anvil, the ERC-4337 artifacts
//! as for the tests). `KEEL_AA_BENCH_N` operations per case (default 256, from as many
//! fresh SimpleAccounts created by the operations, each a sponsored AssetToken
//! transfer), `KEEL_AA_BENCH_REPEAT` rounds (default 1), `KEEL_AA_BENCH_VALIDATION`
//! `tracing` (default, ERC-7562 rules through `debug_traceCall`, as `aa.validation`
//! defaults) or `unsafe` (plain `eth_call`: the cost of the tracing is the difference).
//! Not part of `scripts/test`.
//!
//! - **keel**: every operation accepted with [`flow::submit`] (the workflow
//!   `aa.user-operation`: resolve, record, validate by `handleOps` simulation, ready;
//!   32 submissions in flight, as concurrent wallets),
//!   bundled by the [`Bundler`] (up to 32 per bundle) onto the transaction queue,
//!   settled at the queue's verdict; the clock runs from the first acceptance to the
//!   last instance's completion.
//! - **ceiling**: the same number of operations, already signed, sent as `handleOps`
//!   bundles of 32 from dev account 1, each bundle's receipt awaited before the next.

#[path = "../tests/common/mod.rs"]
mod common;

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use alloy::rpc::types::TransactionRequest;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolCall;
use anvil_tests::keel_abi::erc4337::IEntryPointV08;
use common::{AaChain, ETHER};
use keel_aa::bundler::{Bundler, BundlerConfig};
use keel_aa::flow::{self, AaChain as FlowChain, AaEnv};
use keel_aa::{PackedUserOperation, UserOperation};
use keel_durable::{Engine, EngineConfig, ExecutorConfig, RunStatus};
use keel_store::testing::TestDatabase;
use keel_txq::{LocalSigner, TxQueue, TxQueueConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `n` sponsored, signed transfers from `n` fresh accounts (each holding a token).
async fn operations(aa: &AaChain, n: usize) -> anyhow::Result<Vec<UserOperation>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let owner = PrivateKeySigner::random();
        let sender = aa.account_of(owner.address()).await?;
        aa.mint(sender, U256::from(ETHER)).await?;
        let op = aa.transfer_op(
            owner.address(),
            sender,
            0,
            true,
            Address::with_last_byte(u8::try_from(i % 200).unwrap_or(0) + 1),
            U256::from(1u64),
        );
        let (packed, _) = aa.sponsor_and_sign(op, &aa.sponsor, &owner).await?;
        out.push(packed.unpack()?);
    }
    Ok(out)
}

async fn keel_case(n: usize) -> anyhow::Result<f64> {
    let aa = AaChain::start().await?;
    let ops = operations(&aa, n).await?;
    let db = TestDatabase::create().await?;
    keel_store::migrate(db.pool()).await?;
    let pool = Arc::new(common::pool(&aa.chain, aa.chain.endpoint().as_str()));
    let mut queue = TxQueue::new(
        db.pool().clone(),
        pool.clone(),
        TxQueueConfig {
            confirmations: 1,
            poll_interval: Duration::from_millis(50),
            // A local chain: the head is final (chains.local.finalityDepth = 0).
            finality: keel_txq::Finality::Depth(0),
            ..TxQueueConfig::default()
        },
    )?;
    queue.add_signer(Arc::new(LocalSigner::new(aa.chain.signer(1)?.clone())));
    let queue = Arc::new(queue);
    let chain_id = aa.chain.chain_id();
    if std::env::var("KEEL_AA_BENCH_VALIDATION").as_deref() == Ok("unsafe") {
        keel_aa::validation::configure(
            chain_id,
            keel_aa::validation::ValidationSettings {
                mode: keel_aa::validation::ValidationMode::Unsafe,
                ..keel_aa::validation::ValidationSettings::default()
            },
        );
    }
    let env = Arc::new(AaEnv {
        db: db.pool().clone(),
        later_chains: Default::default(),
        chains: [(
            chain_id,
            FlowChain {
                pool,
                queue: queue.clone(),
                directory: aa.deployed.directory,
                bundler: aa.chain.account(1)?,
                policy: None,
                organization_policies: Default::default(),
                beneficiary: None,
                sponsor: None,
                admission: Default::default(),
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
        poll_interval: Duration::from_millis(20),
        concurrency: 64,
        ..ExecutorConfig::default()
    })?;
    let cancel = CancellationToken::new();
    let q = queue.clone();
    let c = cancel.clone();
    tokio::spawn(async move { q.run(c).await });
    let bundler = Bundler::new(
        env.clone(),
        engine.clone(),
        chain_id,
        BundlerConfig::default(),
    )?;
    tokio::spawn(keel_service::run(
        bundler,
        keel_service::ServiceConfig::new(Duration::from_millis(20)),
        cancel.clone(),
    ));
    let ep = aa.ep().address();
    let started = Instant::now();
    // Clients submit concurrently (32 in flight), as wallets do.
    let mut ids = Vec::with_capacity(n);
    let mut pending = tokio::task::JoinSet::new();
    for op in ops {
        if pending.len() >= 32
            && let Some(r) = pending.join_next().await
        {
            ids.push(r??);
        }
        let (env, engine) = (env.clone(), engine.clone());
        pending.spawn(async move {
            flow::submit(&env, &engine, chain_id, ep, op, None)
                .await
                .map(|s| s.instance_id)
        });
    }
    while let Some(r) = pending.join_next().await {
        ids.push(r??);
    }
    for id in ids {
        let st = loop {
            if let Some(s) = engine.await_terminal(id, Duration::from_secs(60)).await? {
                break s;
            }
        };
        anyhow::ensure!(st.status == RunStatus::Completed, "{st:?}");
    }
    let elapsed = started.elapsed();
    let (bundles, largest): (i64, Option<i32>) = sqlx::query_as(
        "SELECT count(*), max(array_length(user_op_hashes, 1)) FROM aa_bundle WHERE state = 'included'",
    )
    .fetch_one(db.pool())
    .await?;
    println!(
        "  keel: {n} operations in {bundles} bundles (largest {}), {:.2} s",
        largest.unwrap_or(0),
        elapsed.as_secs_f64()
    );
    cancel.cancel();
    executor.shutdown().await;
    Ok(n as f64 / elapsed.as_secs_f64())
}

async fn ceiling_case(n: usize) -> anyhow::Result<f64> {
    let aa = AaChain::start().await?;
    let ops = operations(&aa, n).await?;
    let packed: Vec<PackedUserOperation> =
        ops.iter().map(|o| o.pack()).collect::<Result<_, _>>()?;
    let bundler = aa.chain.provider_for(1)?;
    let from = aa.chain.account(1)?;
    let started = Instant::now();
    for chunk in packed.chunks(32) {
        let call = IEntryPointV08::handleOpsCall {
            ops: chunk.iter().map(PackedUserOperation::to_sol).collect(),
            beneficiary: from,
        };
        // The operations' limits plus the EntryPoint's overhead, as Keel's bundler sets it.
        let gas: u64 = chunk
            .iter()
            .map(|_| 860_000u64)
            .fold(200_000, u64::saturating_add);
        let tx = TransactionRequest::default()
            .with_from(from)
            .with_to(aa.ep().address())
            .with_input(call.abi_encode())
            .with_gas_limit(gas);
        let receipt = bundler.send_transaction(tx).await?.get_receipt().await?;
        anyhow::ensure!(receipt.status(), "handleOps reverted");
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n = env_usize("KEEL_AA_BENCH_N", 256);
    let repeat = env_usize("KEEL_AA_BENCH_REPEAT", 1).max(1);
    println!(
        "keel-aa bench: {n} sponsored operations from fresh accounts per case, {repeat} round(s)"
    );
    for round in 1..=repeat {
        let ceiling = ceiling_case(n).await?;
        let keel = keel_case(n).await?;
        println!(
            "round {round}: keel (durable, accepted -> included) {keel:.1} ops/s; ceiling (plain handleOps, no durability) {ceiling:.1} ops/s; ratio {:.0} %",
            100.0 * keel / ceiling
        );
    }
    Ok(())
}
