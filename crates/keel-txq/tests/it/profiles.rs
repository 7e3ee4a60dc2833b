//! Chain profiles (issue 35 §3) against real Anvil nodes: a pre-London chain
//! (`--hardfork berlin`) gets legacy type-0 transactions priced from `eth_gasPrice`, and
//! their replacements raise `gasPrice` past the node's replacement rule; a zero tip is
//! still raised on replacement; an OP Stack chain (`--network optimism`, the
//! GasPriceOracle predeploy installed with `anvil_setCode`, since Anvil 1.7.1 has no code
//! there) counts the L1 data fee in funding checks, and without the oracle nothing is
//! signed; a per-transaction gas cap fails a request before it takes a nonce.

use crate::common::{Transfer, transfer};
use alloy::consensus::TxEnvelope;
use alloy::eips::Decodable2718;
use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use anvil_tests::TestChain;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    EnqueueOptions, FailureCode, FeeModel, Finality, L1DataFee, LocalSigner, PriorityFee,
    RequestState, RequestStatus, SettlementVerdict, TxQueue, TxQueueConfig, TxqError,
};
use keel_units::ChainId;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

fn queue(db: &TestDatabase, chain: &TestChain, config: TxQueueConfig) -> TxQueue {
    let pool = UpstreamPool::new(
        ChainId(chain.chain_id()),
        UpstreamConfig::new(vec![chain.endpoint().to_string()]),
    )
    .unwrap();
    TxQueue::new(db.pool().clone(), Arc::new(pool), config).unwrap()
}

fn local(config: TxQueueConfig) -> TxQueueConfig {
    TxQueueConfig {
        finality: Finality::Depth(0),
        ..config
    }
}

async fn automine(chain: &TestChain, on: bool) {
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (on,))
        .await
        .unwrap();
}

/// Queue passes until `done` holds for the request's status (a bounded probe).
async fn tick_until(
    q: &TxQueue,
    id: Uuid,
    what: &str,
    done: impl Fn(&RequestStatus) -> bool,
) -> RequestStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        q.tick().await.unwrap();
        let status = q.status(id).await.unwrap();
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "never reached {what}: {status:?}"
        );
    }
}

/// Every attempt of the queue's requests: (raw bytes, max fee, tip), in order.
async fn attempts(db: &TestDatabase) -> Vec<(Vec<u8>, u128, u128)> {
    let rows: Vec<(Vec<u8>, String, String)> = sqlx::query_as(
        "SELECT raw, max_fee_per_gas, max_priority_fee_per_gas FROM txq_attempt ORDER BY attempt",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(raw, max, tip)| (raw, max.parse().unwrap(), tip.parse().unwrap()))
        .collect()
}

async fn broadcast_refusals(db: &TestDatabase) -> i64 {
    sqlx::query_scalar("SELECT coalesce(sum(broadcast_failures), 0)::int8 FROM txq_request")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pre_london_chain_gets_legacy_transactions_and_their_replacements_clear_the_node() {
    let chain = TestChain::builder()
        .args(["--hardfork", "berlin"])
        .start()
        .await
        .unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(3).unwrap();
    let market: u128 = chain.provider().get_gas_price().await.unwrap();
    automine(&chain, false).await;
    let mut q = queue(
        &db,
        &chain,
        local(TxQueueConfig {
            fee_model: FeeModel::Legacy {
                gas_price_multiplier_percent: 110,
            },
            bump_after: Some(Duration::ZERO),
            ..TxQueueConfig::default()
        }),
    );
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(3).unwrap().clone())));
    let id = q
        .enqueue(&transfer(sender, "legacy").worth(5))
        .await
        .unwrap();
    // Signed and broadcast, then replaced twice (bump_after = 0), nothing mined meanwhile.
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    let rows = attempts(&db).await;
    assert_eq!(rows.len(), 3, "one transaction and two replacements");
    let mut prices = Vec::new();
    for (raw, max, tip) in &rows {
        let tx = TxEnvelope::decode_2718(&mut raw.as_slice()).unwrap();
        let TxEnvelope::Legacy(signed) = &tx else {
            panic!("a legacy transaction on a pre-London chain: {tx:?}");
        };
        assert_eq!(signed.tx().chain_id, Some(chain.chain_id()), "EIP-155");
        assert_eq!(signed.tx().gas_price, *max, "gasPrice is the stored fee");
        assert_eq!(max, tip, "one fee field");
        prices.push(*max);
    }
    assert!(
        prices[0] * 100 >= market * 110,
        "gasPrice at eth_gasPrice × 110 %: {} vs {market}",
        prices[0]
    );
    for pair in prices.windows(2) {
        assert!(
            pair[1] * 100 >= pair[0] * 110 && pair[1] > pair[0],
            "gasPrice +10 % at least: {} -> {}",
            pair[0],
            pair[1]
        );
    }
    assert_eq!(
        broadcast_refusals(&db).await,
        0,
        "the node accepted every replacement (none underpriced)"
    );
    chain.mine().await.unwrap();
    automine(&chain, true).await;
    let status = tick_until(&q, id, "confirmed", |s| {
        matches!(s.verdict, Some(SettlementVerdict::Confirmed { .. }))
    })
    .await;
    assert_eq!(status.state, RequestState::Settled);
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        1,
        "exactly one of the attempts took effect"
    );
}

#[tokio::test]
async fn an_eip_7702_request_on_a_legacy_fee_chain_is_refused_before_a_nonce() {
    let chain = TestChain::builder()
        .args(["--hardfork", "berlin"])
        .start()
        .await
        .unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(1).unwrap();
    let mut q = queue(
        &db,
        &chain,
        local(TxQueueConfig {
            fee_model: FeeModel::Legacy {
                gas_price_multiplier_percent: 100,
            },
            ..TxQueueConfig::default()
        }),
    );
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(1).unwrap().clone())));
    let authority = PrivateKeySigner::random();
    let auth = alloy::eips::eip7702::Authorization {
        chain_id: U256::from(chain.chain_id()),
        address: Address::repeat_byte(0x11),
        nonce: 0,
    };
    use alloy::signers::SignerSync;
    let sig = authority.sign_hash_sync(&auth.signature_hash()).unwrap();
    let mut req = transfer(sender, "setcode").gas(Some(80_000));
    req.authorization_list = vec![auth.into_signed(sig)];
    let id = q.enqueue(&req).await.unwrap();
    let err = q
        .tick()
        .await
        .expect_err("a type-4 transaction cannot be priced legacy");
    assert!(
        matches!(err, TxqError::InvalidRequest("authorization_list")),
        "{err:?}"
    );
    let status = q.status(id).await.unwrap();
    assert_eq!(status.nonce, None, "no nonce taken");
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn a_zero_tip_is_raised_on_replacement_so_the_node_accepts_it() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(2).unwrap();
    automine(&chain, false).await;
    let mut q = queue(
        &db,
        &chain,
        local(TxQueueConfig {
            fee_model: FeeModel::Eip1559 {
                base_fee_multiplier_percent: 100,
                priority_fee: PriorityFee::Fixed(0),
                min_priority_fee_per_gas: 0,
            },
            bump_after: Some(Duration::ZERO),
            ..TxQueueConfig::default()
        }),
    );
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(2).unwrap().clone())));
    let id = q.enqueue(&transfer(sender, "zero-tip")).await.unwrap();
    q.tick().await.unwrap();
    let rows = attempts(&db).await;
    assert_eq!(rows.len(), 2, "sent and replaced once");
    assert_eq!(rows[0].2, 0, "the first attempt tips nothing");
    assert!(rows[1].2 >= 1, "the replacement's tip rose from 0");
    assert!(rows[1].1 > rows[0].1, "and its max fee rose");
    assert_eq!(broadcast_refusals(&db).await, 0, "the node accepted it");
    chain.mine().await.unwrap();
    automine(&chain, true).await;
    let done = tick_until(&q, id, "settled", |s| s.verdict.is_some()).await;
    assert!(
        matches!(done.verdict, Some(SettlementVerdict::Confirmed { .. })),
        "{:?}",
        done.verdict
    );
}

#[tokio::test]
async fn a_request_over_the_chains_per_transaction_gas_cap_fails_before_a_nonce() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(4).unwrap();
    let mut q = queue(
        &db,
        &chain,
        local(TxQueueConfig {
            max_gas_per_transaction: Some(1 << 24),
            ..TxQueueConfig::default()
        }),
    );
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(4).unwrap().clone())));
    // Under Anvil's block gas limit (30,000,000), over EIP-7825's 2^24.
    let big = q
        .enqueue(&transfer(sender, "big").gas(Some((1 << 24) + 1)))
        .await
        .unwrap();
    let fits = q.enqueue(&transfer(sender, "fits")).await.unwrap();
    let status = tick_until(&q, big, "failed", |s| s.verdict.is_some()).await;
    match status.verdict {
        Some(SettlementVerdict::Failed { code, .. }) => {
            assert_eq!(code, FailureCode::ExceedsBlockGasLimit)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(status.nonce, None);
    let ok = tick_until(&q, fits, "confirmed", |s| s.verdict.is_some()).await;
    assert!(
        matches!(ok.verdict, Some(SettlementVerdict::Confirmed { .. })),
        "{:?}",
        ok.verdict
    );
    assert_eq!(ok.nonce, Some(0), "the failed request left no nonce gap");
}

/// Installs the GasPriceOracle stand-in (abi/src/test/GasPriceOracleStandIn.sol) at the
/// OP Stack predeploy address with its L1 prices.
async fn install_oracle(chain: &TestChain) {
    let path = anvil_tests::workspace_root().join("abi/out/GasPriceOracleStandIn.json");
    let artifact: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let code = artifact["deployedBytecode"].as_str().unwrap().to_owned();
    let p = chain.provider();
    p.raw_request::<_, ()>("anvil_setCode".into(), (L1DataFee::OP_STACK_ORACLE, code))
        .await
        .unwrap();
    // l1BaseFee 3,000 gwei, blobBaseFee 1 gwei, scalars 1,368 and 810,949 (Ecotone).
    for (slot, value) in [
        (0u64, 3_000_000_000_000u128),
        (1, 1_000_000_000),
        (2, 1_368),
        (3, 810_949),
    ] {
        p.raw_request::<_, bool>(
            "anvil_setStorageAt".into(),
            (
                L1DataFee::OP_STACK_ORACLE,
                U256::from(slot),
                B256::from(U256::from(value)),
            ),
        )
        .await
        .unwrap();
    }
}

async fn set_balance(chain: &TestChain, who: Address, wei: U256) {
    chain
        .provider()
        .raw_request::<_, ()>("anvil_setBalance".into(), (who, wei))
        .await
        .unwrap();
}

fn op_stack(config: TxQueueConfig) -> TxQueueConfig {
    local(TxQueueConfig {
        l1_data_fee: Some(L1DataFee::op_stack()),
        ..config
    })
}

#[tokio::test]
async fn an_op_stack_chain_counts_the_l1_data_fee_in_funding_checks() {
    let chain = TestChain::builder()
        .args(["--network", "optimism"])
        .start()
        .await
        .unwrap();
    install_oracle(&chain).await;
    let db = TestDatabase::create().await.unwrap();
    let mut q = queue(&db, &chain, op_stack(TxQueueConfig::default()));
    let key = PrivateKeySigner::random();
    let sender = key.address();
    q.add_signer(Arc::new(LocalSigner::new(key)));
    let value = 1_000u64;
    let id = q
        .enqueue_with(
            &transfer(sender, "op-fund").worth(value),
            &EnqueueOptions::funding_pause(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    let status = tick_until(&q, id, "waiting_funding", |s| {
        s.state == RequestState::WaitingFunding
    })
    .await;
    let funding = status.funding.expect("a funding request");
    let execution = U256::from(21_000u64) * funding.max_fee_per_gas_wei.get() + U256::from(value);
    let required = funding.required_wei.get();
    assert!(
        required > execution,
        "the L1 data fee is asked for on top of execution gas: {required} vs {execution}"
    );
    let l1: U256 = required - execution;
    // The oracle's own figure for a transfer of this size, × 150 %, is what was counted
    // (within the few bytes a real nonce and signature change).
    let oracle_floor = U256::from(1_088u64 * 1_000_000); // 68 bytes of signature at least
    assert!(l1 > oracle_floor, "{l1}");

    // Funded for execution only: still waiting (the L1 fee is not paid yet).
    set_balance(&chain, sender, execution).await;
    for _ in 0..3 {
        q.tick().await.unwrap();
    }
    assert_eq!(
        q.status(id).await.unwrap().state,
        RequestState::WaitingFunding
    );
    // Funded for all of it: the request is sent and confirms.
    set_balance(&chain, sender, required).await;
    let done = tick_until(&q, id, "confirmed", |s| s.verdict.is_some()).await;
    assert!(
        matches!(done.verdict, Some(SettlementVerdict::Confirmed { .. })),
        "{:?}",
        done.verdict
    );
}

#[tokio::test]
async fn without_the_l1_fee_oracle_nothing_is_signed_and_the_queue_resumes_once_it_answers() {
    let chain = TestChain::builder()
        .args(["--network", "optimism"])
        .start()
        .await
        .unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(5).unwrap();
    let mut q = queue(&db, &chain, op_stack(TxQueueConfig::default()));
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(5).unwrap().clone())));
    let id = q.enqueue(&transfer(sender, "no-oracle")).await.unwrap();
    // Anvil 1.7.1 has no code at the predeploy: the fee cannot be read.
    for _ in 0..2 {
        let err = q.tick().await.expect_err("no L1 fee, no signature");
        assert!(matches!(err, TxqError::L1FeeUnreadable), "{err:?}");
        assert!(err.is_retryable());
    }
    let status = q.status(id).await.unwrap();
    assert_eq!(status.state, RequestState::Queued);
    assert_eq!(status.nonce, None, "nothing signed without its L1 fee");
    install_oracle(&chain).await;
    let done = tick_until(&q, id, "confirmed", |s| s.verdict.is_some()).await;
    assert!(
        matches!(done.verdict, Some(SettlementVerdict::Confirmed { .. })),
        "{:?}",
        done.verdict
    );
}

/// A fee-history tip source prices the tip at what recent blocks paid
/// (`eth_feeHistory`) at the configured percentile: after one block whose five
/// transfers tipped 1..=5 gwei, a queue at the 90th percentile tips 5 gwei and one at
/// the 10th tips 1 gwei, whatever the node suggests.
#[tokio::test]
async fn a_fee_history_tip_follows_what_recent_blocks_paid_at_its_percentile() {
    use alloy::network::TransactionBuilder;
    use alloy::rpc::types::TransactionRequest;
    let chain = TestChain::start().await.unwrap();
    automine(&chain, false).await;
    for (i, account) in (5..10).enumerate() {
        let tx = TransactionRequest::default()
            .with_to(Address::repeat_byte(0x43))
            .with_value(U256::from(1))
            .with_gas_limit(21_000)
            .with_max_priority_fee_per_gas(1_000_000_000 * (i as u128 + 1))
            .with_max_fee_per_gas(100_000_000_000);
        let _pending = chain
            .provider_for(account)
            .unwrap()
            .send_transaction(tx)
            .await
            .unwrap();
    }
    chain.mine().await.unwrap();
    let mut tips = Vec::new();
    for (percentile, account) in [(90u8, 2usize), (10, 3)] {
        let db = TestDatabase::create().await.unwrap();
        let mut q = queue(
            &db,
            &chain,
            local(TxQueueConfig {
                fee_model: FeeModel::Eip1559 {
                    base_fee_multiplier_percent: 200,
                    priority_fee: PriorityFee::FeeHistory {
                        blocks: 1,
                        percentile,
                    },
                    min_priority_fee_per_gas: 0,
                },
                ..TxQueueConfig::default()
            }),
        );
        q.add_signer(Arc::new(LocalSigner::new(
            chain.signer(account).unwrap().clone(),
        )));
        let sender = chain.account(account).unwrap();
        q.enqueue(&transfer(sender, "history-tip")).await.unwrap();
        q.tick().await.unwrap();
        let rows = attempts(&db).await;
        assert_eq!(rows.len(), 1, "signed and sent once");
        tips.push(rows[0].2);
    }
    assert_eq!(
        tips,
        [5_000_000_000, 1_000_000_000],
        "percentiles 90 and 10"
    );
    chain.mine().await.unwrap();
    automine(&chain, true).await;

    // Out-of-bounds sources are refused when the queue is built.
    let db = TestDatabase::create().await.unwrap();
    for (blocks, percentile) in [(0, 50), (1025, 50), (10, 101)] {
        let pool = UpstreamPool::new(
            ChainId(chain.chain_id()),
            UpstreamConfig::new(vec![chain.endpoint().to_string()]),
        )
        .unwrap();
        let bad = TxQueue::new(
            db.pool().clone(),
            Arc::new(pool),
            TxQueueConfig {
                fee_model: FeeModel::Eip1559 {
                    base_fee_multiplier_percent: 200,
                    priority_fee: PriorityFee::FeeHistory { blocks, percentile },
                    min_priority_fee_per_gas: 0,
                },
                ..TxQueueConfig::default()
            },
        );
        assert!(
            matches!(
                bad,
                Err(TxqError::Config {
                    key: "priorityFeeHistory",
                    ..
                })
            ),
            "{blocks} {percentile}"
        );
    }
}
