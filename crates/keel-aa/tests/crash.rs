//! Durability of the user-operation flow under real process kills: the runner
//! (executor + bundler + queue, `keel-aa-crash-worker`) is SIGKILLed after the bundle was
//! enqueued and before it was sent, then after it was mined and before its verdict;
//! every operation lands exactly once and is reported once. And (issue 33 §2) killed
//! after an operation was shown included and before a reorg took its bundle out: the
//! restarted runner follows the chain and reports the final inclusion once.

mod common;

use alloy::primitives::{Address, B256, U256, aliases::U192};
use alloy::providers::Provider;
use alloy::rpc::types::Filter;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolEvent;
use anvil_tests::keel_abi::erc4337::IEntryPointV08;
use common::{AaChain, ETHER};
use keel_aa::flow::{self, AaChain as FlowChain, AaEnv, OutcomeSignal};
use keel_durable::{Engine, EngineConfig, RunStatus};
use keel_store::testing::TestDatabase;
use keel_txq::{TxQueue, TxQueueConfig};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

struct Worker(Child);

impl Worker {
    fn start(db: &TestDatabase, aa: &AaChain, mode: &str, confirmations: u64) -> Self {
        Self::start_final(db, aa, mode, confirmations, 0)
    }

    /// A worker whose queue counts blocks `finality_depth` below the head as final.
    fn start_final(
        db: &TestDatabase,
        aa: &AaChain,
        mode: &str,
        confirmations: u64,
        finality_depth: u64,
    ) -> Self {
        let key = aa.chain.signer(1).unwrap().to_bytes();
        let child = Command::new(env!("CARGO_BIN_EXE_keel-aa-crash-worker"))
            .env("KEEL_AA_DB", db.url())
            .env("KEEL_AA_RPC", aa.chain.endpoint().to_string())
            .env("KEEL_AA_CHAIN_ID", aa.chain.chain_id().to_string())
            .env("KEEL_AA_DIRECTORY", aa.deployed.directory.to_string())
            .env("KEEL_AA_KEY", key.to_string())
            .env("KEEL_AA_MODE", mode)
            .env("KEEL_AA_CONFIRMATIONS", confirmations.to_string())
            .env("KEEL_AA_FINALITY_DEPTH", finality_depth.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Self(child)
    }

    fn kill(mut self) {
        self.0.kill().unwrap(); // SIGKILL
        self.0.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn count(db: &TestDatabase, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db.pool()).await.unwrap()
}

/// Polls `probe` (a database or chain read) until it holds; 60 s at most.
async fn until<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..600 {
        if probe().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn kill_9_between_bundle_enqueue_and_verdict_loses_nothing_and_doubles_nothing()
-> anyhow::Result<()> {
    const N: u64 = 5;
    const CONFIRMATIONS: u64 = N + 1;
    let aa = AaChain::start().await?;
    let db = TestDatabase::create().await?;
    keel_store::migrate(db.pool()).await?;
    // The test's own engine and env accept operations; the worker runs them.
    let pool = Arc::new(common::pool(&aa.chain, aa.chain.endpoint().as_str()));
    let queue = Arc::new(TxQueue::new(
        db.pool().clone(),
        pool.clone(),
        TxQueueConfig::default(),
    )?);
    let env = AaEnv {
        db: db.pool().clone(),
        later_chains: Default::default(),
        chains: [(
            aa.chain.chain_id(),
            FlowChain {
                pool,
                queue,
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
    };
    let engine = Engine::new(db.pool().clone(), EngineConfig::default())?;
    let recipient = Address::with_last_byte(0x75);
    let mut accepted: Vec<(Address, B256, uuid::Uuid)> = Vec::new();
    for i in 0..N {
        let owner = PrivateKeySigner::random();
        let sender = aa.account_of(owner.address()).await?;
        aa.mint(sender, U256::from(100u64) * U256::from(ETHER))
            .await?;
        let op = aa.transfer_op(
            owner.address(),
            sender,
            0,
            true,
            recipient,
            U256::from(1 + i) * U256::from(ETHER),
        );
        let (packed, hash) = aa.sponsor_and_sign(op, &aa.sponsor, &owner).await?;
        let s = flow::submit(
            &env,
            &engine,
            aa.chain.chain_id(),
            aa.ep().address(),
            packed.unpack()?,
            None,
        )
        .await?;
        accepted.push((sender, hash, s.instance_id));
    }

    // Phase 1: the runner validates and bundles, but its queue does not run: killed with
    // the bundle enqueued and nothing sent.
    let w = Worker::start(&db, &aa, "no-queue", 3);
    until("a bundle of every operation", || async {
        count(
            &db,
            "SELECT count(*) FROM aa_user_operation WHERE state = 'bundled'",
        )
        .await
            == N as i64
    })
    .await;
    w.kill();
    // Operations become ready one by one: one or more bundles, all enqueued, none sent.
    let bundles = count(&db, "SELECT count(*) FROM aa_bundle").await;
    assert!((1..=N as i64).contains(&bundles));
    assert_eq!(
        count(&db, "SELECT count(*) FROM txq_request").await,
        bundles
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM txq_request WHERE state <> 'queued'"
        )
        .await,
        0
    );
    let ep = IEntryPointV08::new(aa.ep().address(), aa.provider().clone());
    for (sender, ..) in &accepted {
        assert_eq!(ep.getNonce(*sender, U192::ZERO).call().await?, U256::ZERO);
    }

    // Phase 2: restarted with its queue; killed once the bundle is mined (automine) but
    // before the queue's depth of N + 1 blocks gave a verdict: at most N bundles, one per
    // block, so even the first bundle is at most N blocks deep when the last is mined
    // (a depth of 3 let the first of four or five bundles settle before the kill).
    let w = Worker::start(&db, &aa, "full", CONFIRMATIONS);
    until("every bundle on chain", || async {
        for (sender, ..) in &accepted {
            if ep.getNonce(*sender, U192::ZERO).call().await.ok() != Some(U256::from(1)) {
                return false;
            }
        }
        true
    })
    .await;
    w.kill();
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM aa_user_operation WHERE state = 'bundled'"
        )
        .await,
        N as i64,
        "no verdict yet"
    );

    // Phase 3: restarted; blocks are mined until every operation is reported.
    let _w = Worker::start(&db, &aa, "full", CONFIRMATIONS);
    for (_, _, id) in &accepted {
        let mut done = None;
        for _ in 0..120 {
            if let Some(s) = engine.await_terminal(*id, Duration::from_secs(1)).await? {
                done = Some(s);
                break;
            }
            aa.chain.mine().await?;
        }
        let s = done.expect("every operation ends");
        assert_eq!(s.status, RunStatus::Completed, "{s:?}");
        let out: OutcomeSignal = serde_json::from_value(s.output.clone().unwrap())?;
        assert_eq!(out.success, Some(true));
    }
    // On chain: each account used nonce 0 once, each hash has one UserOperationEvent,
    // the recipient got each amount once; no bundle or queue request was added.
    let mut total = U256::ZERO;
    for (i, (sender, hash, _)) in accepted.iter().enumerate() {
        assert_eq!(
            ep.getNonce(*sender, U192::ZERO).call().await?,
            U256::from(1)
        );
        let filter = Filter::new()
            .address(aa.ep().address())
            .event_signature(IEntryPointV08::UserOperationEvent::SIGNATURE_HASH)
            .topic1(*hash)
            .from_block(0);
        assert_eq!(aa.provider().get_logs(&filter).await?.len(), 1);
        total += U256::from(1 + i as u64) * U256::from(ETHER);
    }
    assert_eq!(aa.token_balance(recipient).await?, total);
    assert_eq!(count(&db, "SELECT count(*) FROM aa_bundle").await, bundles);
    assert_eq!(
        count(&db, "SELECT count(*) FROM txq_request").await,
        bundles
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM aa_user_operation WHERE state = 'included'"
        )
        .await,
        N as i64
    );
    // Reported once: one outcome signal per instance.
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM durable_signal WHERE name = 'aa.outcome'"
        )
        .await,
        N as i64
    );
    Ok(())
}

/// Issue 33 §2: the runner is SIGKILLed after the operation is shown `included` (verdict
/// at depth 0, finality 8 blocks) and before a reorg of depth 1 to 5 takes its bundle
/// out — the bundler's nonce left free, or taken by another transaction in the new
/// branch. The restarted runner lands the operation once and reports it once, from the
/// final chain.
#[tokio::test]
async fn kill_9_between_inclusion_and_a_reorg_of_depth_1_to_5_reports_the_final_chain_once()
-> anyhow::Result<()> {
    const FINAL_DEPTH: u64 = 8;
    let aa = AaChain::start().await?;
    let db = TestDatabase::create().await?;
    keel_store::migrate(db.pool()).await?;
    let pool = Arc::new(common::pool(&aa.chain, aa.chain.endpoint().as_str()));
    let queue = Arc::new(TxQueue::new(
        db.pool().clone(),
        pool.clone(),
        TxQueueConfig::default(),
    )?);
    let env = AaEnv {
        db: db.pool().clone(),
        later_chains: Default::default(),
        chains: [(
            aa.chain.chain_id(),
            FlowChain {
                pool,
                queue,
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
    };
    let engine = Engine::new(db.pool().clone(), EngineConfig::default())?;
    let ep = IEntryPointV08::new(aa.ep().address(), aa.provider().clone());
    let events = |hash: B256| {
        let filter = Filter::new()
            .address(aa.ep().address())
            .event_signature(IEntryPointV08::UserOperationEvent::SIGNATURE_HASH)
            .topic1(hash)
            .from_block(0);
        let p = aa.provider().clone();
        async move { p.get_logs(&filter).await.unwrap() }
    };
    for depth in 1..=5u64 {
        for nonce_taken in [false, true] {
            let ctx = format!("depth {depth}, bundler nonce taken: {nonce_taken}");
            let owner = PrivateKeySigner::random();
            let sender = aa.account_of(owner.address()).await?;
            aa.mint(sender, U256::from(100u64) * U256::from(ETHER))
                .await?;
            let recipient = Address::with_last_byte(0xa0 + depth as u8 * 2 + nonce_taken as u8);
            let op = aa.transfer_op(
                owner.address(),
                sender,
                0,
                true,
                recipient,
                U256::from(depth) * U256::from(ETHER),
            );
            let (packed, hash) = aa.sponsor_and_sign(op, &aa.sponsor, &owner).await?;
            let s = flow::submit(
                &env,
                &engine,
                aa.chain.chain_id(),
                aa.ep().address(),
                packed.unpack()?,
                None,
            )
            .await?;
            let w = Worker::start_final(&db, &aa, "full", 1, FINAL_DEPTH);
            let row_of = || async {
                keel_aa::store::user_operation_get(
                    db.pool(),
                    aa.chain.chain_id() as i64,
                    hash.as_slice(),
                )
                .await
                .unwrap()
                .unwrap()
            };
            until("the operation shown included", || async {
                row_of().await.state == "included"
            })
            .await;
            w.kill();
            let row = row_of().await;
            assert!(row.finalized_at.is_none(), "{ctx}");
            let bundle_tx = B256::from(row.tx_hash.unwrap());
            let bundle_block = row.block_number.unwrap() as u64;
            for _ in 1..depth {
                aa.chain.mine().await?;
            }
            assert_eq!(
                aa.chain.block_number().await? + 1 - bundle_block,
                depth,
                "{ctx}"
            );
            let mut txs: Vec<(alloy::primitives::Bytes, u64)> = Vec::new();
            if nonce_taken {
                use alloy::eips::Encodable2718;
                use keel_txq::TxSigner;
                let tx = aa
                    .provider()
                    .get_transaction_by_hash(bundle_tx)
                    .await?
                    .expect("known");
                let signer = keel_txq::LocalSigner::new(aa.chain.signer(1)?.clone());
                let other = alloy::consensus::TxEip1559 {
                    chain_id: aa.chain.chain_id(),
                    nonce: alloy::consensus::Transaction::nonce(&tx),
                    gas_limit: 21_000,
                    max_fee_per_gas: 100_000_000_000,
                    max_priority_fee_per_gas: 1_000_000_000,
                    to: alloy::primitives::TxKind::Call(Address::repeat_byte(0x99)),
                    value: U256::ZERO,
                    access_list: Default::default(),
                    input: Default::default(),
                };
                txs.push((signer.sign(other.into()).await?.encoded_2718().into(), 0));
            }
            aa.provider()
                .raw_request::<_, ()>("anvil_reorg".into(), (depth, txs))
                .await?;
            assert!(events(hash).await.is_empty(), "{ctx}: out of the chain");
            assert_eq!(
                ep.getNonce(sender, U192::ZERO).call().await?,
                U256::ZERO,
                "{ctx}"
            );

            let _w = Worker::start_final(&db, &aa, "full", 1, FINAL_DEPTH);
            let mut done = None;
            for _ in 0..600 {
                if let Some(st) = engine
                    .await_terminal(s.instance_id, Duration::from_millis(200))
                    .await?
                {
                    done = Some(st);
                    break;
                }
                aa.chain.mine().await?;
            }
            let st = done.expect("the operation ends");
            assert_eq!(st.status, RunStatus::Completed, "{ctx}: {st:?}");
            let out: OutcomeSignal = serde_json::from_value(st.output.clone().unwrap())?;
            let evs = events(hash).await;
            assert_eq!(evs.len(), 1, "{ctx}: one UserOperationEvent");
            assert_eq!(out.tx_hash, evs[0].transaction_hash, "{ctx}");
            assert_eq!(out.block_number, evs[0].block_number, "{ctx}");
            assert!(
                evs[0].block_number.unwrap() + FINAL_DEPTH <= aa.chain.block_number().await?,
                "{ctx}: reported from a final block"
            );
            assert_eq!(
                ep.getNonce(sender, U192::ZERO).call().await?,
                U256::from(1),
                "{ctx}"
            );
            assert_eq!(
                aa.token_balance(recipient).await?,
                U256::from(depth) * U256::from(ETHER),
                "{ctx}"
            );
            let row = row_of().await;
            assert_eq!(row.state, "included", "{ctx}");
            assert!(row.finalized_at.is_some(), "{ctx}");
            assert_eq!(
                row.tx_hash.map(B256::from),
                evs[0].transaction_hash,
                "{ctx}"
            );
            assert_eq!(row.block_hash.map(B256::from), evs[0].block_hash, "{ctx}");
            let signals: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM durable_signal WHERE instance_id = $1 AND name = 'aa.outcome'",
            )
            .bind(s.instance_id)
            .fetch_one(db.pool())
            .await?;
            assert_eq!(signals, 1, "{ctx}: told once");
        }
    }
    Ok(())
}
