//! The upstream pool against real Anvil nodes: failover, health, node-error
//! classification of real answers, typed decoding, batched receipts.

use alloy::eips::{BlockNumberOrTag, Encodable2718};
use alloy::network::{EthereumWallet, NetworkTransactionBuilder, TransactionBuilder};
use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::providers::Provider;
use alloy::rpc::types::TransactionRequest;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolCall;
use anvil_tests::TestChain;
use keel_abi::bindings::PriceFeed;
use keel_chain::{ChainError, NodeErrorKind, UpstreamConfig, UpstreamPool};
use keel_units::ChainId;

/// A loopback URL where nothing listens (connection refused at once).
const DEAD: &str = "http://127.0.0.1:1";

fn pool(chain: &TestChain, urls: Vec<String>) -> UpstreamPool {
    UpstreamPool::new(ChainId(chain.chain_id()), UpstreamConfig::new(urls)).unwrap()
}

async fn raw_transfer(
    chain: &TestChain,
    signer: &PrivateKeySigner,
    nonce: u64,
    value: u64,
) -> Bytes {
    let tx = TransactionRequest::default()
        .with_from(signer.address())
        .with_to(Address::repeat_byte(0x42))
        .with_value(U256::from(value))
        .with_nonce(nonce)
        .with_chain_id(chain.chain_id())
        .with_gas_limit(21_000)
        .with_max_fee_per_gas(10_000_000_000)
        .with_max_priority_fee_per_gas(1_000_000_000);
    let envelope = tx
        .build(&EthereumWallet::from(signer.clone()))
        .await
        .unwrap();
    envelope.encoded_2718().into()
}

#[tokio::test]
async fn fails_over_past_a_dead_upstream_and_marks_it_unhealthy() {
    let chain = TestChain::start().await.unwrap();
    let pool = pool(&chain, vec![DEAD.into(), chain.endpoint().to_string()]);
    for _ in 0..3 {
        assert_eq!(pool.block_number().await.unwrap(), 0);
    }
    let h = pool.health();
    assert!(
        !h[0].healthy,
        "three transport failures make it unhealthy: {h:?}"
    );
    assert_eq!(h[0].failures, 3);
    assert!(h[1].healthy);
    assert_eq!(h[1].requests, 3);
    // While in cooldown the dead upstream is not tried first any more.
    pool.block_number().await.unwrap();
    assert_eq!(pool.health()[0].requests, 3);
}

#[tokio::test]
async fn all_upstreams_down_is_unavailable_and_retryable() {
    let chain = TestChain::start().await.unwrap();
    let pool = pool(&chain, vec![DEAD.into(), "http://127.0.0.1:2".into()]);
    let err = pool.block_number().await.unwrap_err();
    assert!(
        matches!(err, ChainError::Unavailable { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn wrong_chain_id_is_detected() {
    let chain = TestChain::builder().chain_id(777).start().await.unwrap();
    let wrong = UpstreamPool::new(
        ChainId(1),
        UpstreamConfig::new(vec![chain.endpoint().to_string()]),
    )
    .unwrap();
    let err = wrong.verify_chain_id().await.unwrap_err();
    assert!(
        matches!(
            err,
            ChainError::WrongChain {
                index: 0,
                actual: 777,
                ..
            }
        ),
        "{err:?}"
    );
    pool(&chain, vec![chain.endpoint().to_string()])
        .verify_chain_id()
        .await
        .unwrap();
}

#[tokio::test]
async fn transaction_errors_are_classified_and_never_hurt_health() {
    let chain = TestChain::start().await.unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    let signer = chain.signer(1).unwrap().clone();
    // Mining is explicit here: `evm_mine` returns once the block exists.
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();

    let first = raw_transfer(&chain, &signer, 0, 1).await;
    pool.send_raw_transaction(&first).await.unwrap();
    // Without a block yet, the same nonce with other bytes is an underpriced replacement.
    let replacement = raw_transfer(&chain, &signer, 0, 2).await;
    let err = pool.send_raw_transaction(&replacement).await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::ReplacementUnderpriced),
        "{err:?}"
    );
    // The same bytes again: "already known" (Anvil: "transaction already imported").
    let err = pool.send_raw_transaction(&first).await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::AlreadyKnown),
        "{err:?}"
    );
    chain.mine().await.unwrap();
    // Mined: the same nonce again is "nonce too low".
    let again = raw_transfer(&chain, &signer, 0, 2).await;
    let err = pool.send_raw_transaction(&again).await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::NonceTooLow),
        "{err:?}"
    );

    // An unfunded key: "Insufficient funds" (Anvil capitalises it).
    let poor = PrivateKeySigner::random();
    let raw = raw_transfer(&chain, &poor, 0, 1).await;
    let err = pool.send_raw_transaction(&raw).await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::InsufficientFunds),
        "{err:?}"
    );
    assert!(
        !err.to_string().contains(&format!("{:x}", poor.address())),
        "value-free: {err}"
    );

    let h = pool.health()[0];
    assert!(
        h.healthy && h.consecutive_failures == 0 && h.failures == 0,
        "{h:?}"
    );
}

#[tokio::test]
async fn revert_carries_the_contracts_custom_error() {
    let chain = TestChain::start().await.unwrap();
    let admin = chain.account(0).unwrap();
    let feed = PriceFeed::deploy(
        chain.provider().clone(),
        8u8,
        "EUR / USD".to_owned(),
        admin,
        admin,
    )
    .await
    .unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    let call = TransactionRequest::default()
        .with_to(*feed.address())
        .with_input(PriceFeed::latestRoundDataCall {}.abi_encode());
    let err = pool
        .call(&call, BlockNumberOrTag::Latest)
        .await
        .unwrap_err();
    let ChainError::Node { error, .. } = err else {
        panic!("expected a node error")
    };
    assert_eq!(error.kind, NodeErrorKind::ExecutionReverted);
    let revert = error.revert.unwrap();
    assert!(matches!(
        revert.decode::<PriceFeed::PriceFeedErrors>(),
        Some(PriceFeed::PriceFeedErrors::NoObservation(_))
    ));
}

#[tokio::test]
async fn values_are_decoded_into_chain_bound_units() {
    let chain = TestChain::builder().chain_id(4242).start().await.unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    let gas = pool.gas_price().await.unwrap();
    assert_eq!(gas.chain, ChainId(4242));
    assert!(gas.wei_per_gas > U256::ZERO);
    let balance = pool
        .balance(chain.account(0).unwrap(), BlockNumberOrTag::Latest)
        .await
        .unwrap();
    assert_eq!(balance.chain, ChainId(4242));
    assert_eq!(
        balance.wei.get(),
        U256::from(10_000u64) * U256::from(10u64).pow(U256::from(18u64))
    );
    assert_eq!(
        pool.nonce(chain.account(0).unwrap(), BlockNumberOrTag::Pending)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn receipts_come_back_in_one_batch_in_order() {
    let chain = TestChain::start().await.unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    let signer = chain.signer(2).unwrap().clone();
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let mut hashes = Vec::new();
    for nonce in 0..3 {
        let raw = raw_transfer(&chain, &signer, nonce, 1 + nonce).await;
        hashes.push(pool.send_raw_transaction(&raw).await.unwrap());
    }
    assert!(
        pool.receipts(&hashes)
            .await
            .unwrap()
            .iter()
            .all(Option::is_none),
        "not mined yet"
    );
    chain.mine().await.unwrap();
    hashes.insert(1, B256::repeat_byte(0x77)); // unknown
    let receipts = pool.receipts(&hashes).await.unwrap();
    assert_eq!(receipts.len(), 4);
    assert!(receipts[1].is_none());
    for (i, r) in receipts.iter().enumerate().filter(|(i, _)| *i != 1) {
        let r = r.as_ref().unwrap();
        assert_eq!(r.transaction_hash, hashes[i]);
        assert!(r.status());
    }
}

/// Issue 16, class 2: an upstream that answers the node's "nonce too low" as a
/// JSON-RPC `-32603 internal error` (single requests and batches). Only the node's
/// verdicts on a transaction are final; an internal error fails over to the chain's
/// other upstream, which gives the verdict.
#[tokio::test]
async fn an_internal_error_answer_fails_over_and_a_node_verdict_does_not() {
    use anvil_tests::proxy::{RpcProxy, Rule};
    let chain = TestChain::start().await.unwrap();
    let rewriting = RpcProxy::start(chain.endpoint()).await.unwrap();
    let plain = RpcProxy::start(chain.endpoint()).await.unwrap();
    let rewrite = rewriting.add_rule(Rule::rewrite_error(
        "eth_sendRawTransaction",
        "nonce too low",
        -32603,
        "internal error",
    ));
    let pool = pool(
        &chain,
        vec![rewriting.url().to_string(), plain.url().to_string()],
    );
    let signer = chain.signer(1).unwrap().clone();
    // Mining is explicit (`evm_mine` returns once the block exists).
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let first = raw_transfer(&chain, &signer, 0, 1).await;
    pool.send_raw_transaction(&first).await.unwrap();
    chain.mine().await.unwrap();
    assert_eq!(
        plain.count("eth_sendRawTransaction"),
        0,
        "no failover on success"
    );

    // The same nonce again: the first upstream's answer is rewritten; the second one
    // says what the node said.
    let again = raw_transfer(&chain, &signer, 0, 2).await;
    let err = pool.send_raw_transaction(&again).await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::NonceTooLow),
        "{err:?}"
    );
    assert_eq!(rewriting.hits(rewrite), 1);
    assert_eq!(plain.count("eth_sendRawTransaction"), 1, "failed over once");
    // In a batch, only the item without a verdict goes to the other upstream.
    let fresh = raw_transfer(&chain, &signer, 1, 3).await;
    let answers = pool
        .send_raw_transactions(&[again.clone(), fresh])
        .await
        .unwrap();
    assert!(
        matches!(&answers[0], Err(e) if e.kind == NodeErrorKind::NonceTooLow),
        "{answers:?}"
    );
    assert!(answers[1].is_ok(), "{answers:?}");
    assert_eq!(rewriting.hits(rewrite), 2);
    assert_eq!(
        plain.count("eth_sendRawTransaction"),
        2,
        "only the rewritten item was sent again"
    );

    // A node's verdict is final: no failover.
    rewriting.clear_rules();
    plain.reset_counts();
    let err = pool.send_raw_transaction(&again).await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::NonceTooLow),
        "{err:?}"
    );
    assert_eq!(
        plain.count("eth_sendRawTransaction"),
        0,
        "a verdict is final"
    );

    // Every upstream answering an internal error: the last answer, retryable.
    for proxy in [&rewriting, &plain] {
        let _ = proxy.add_rule(Rule::error("eth_blockNumber", -32603, "internal error"));
    }
    let err = pool.block_number().await.unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::Internal),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(plain.count("eth_blockNumber"), 1);
}

#[tokio::test]
async fn headers_are_typed_and_chained() {
    let chain = TestChain::builder().chain_id(4243).start().await.unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    chain.mine().await.unwrap();
    chain.mine().await.unwrap();
    let genesis = pool
        .header(BlockNumberOrTag::Number(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(genesis.number, 0);
    let latest = pool
        .header(BlockNumberOrTag::Latest)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.number, 2);
    assert_eq!(latest.number, pool.block_number().await.unwrap());
    let one = pool
        .header(BlockNumberOrTag::Number(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.parent_hash, genesis.hash);
    assert_eq!(latest.parent_hash, one.hash);
    assert!(latest.timestamp >= genesis.timestamp);
    let base_fee = latest.base_fee_per_gas.unwrap();
    assert_eq!(base_fee.chain, ChainId(4243), "bound to the pool's chain");
    assert!(base_fee.wei_per_gas > U256::ZERO);
    // Above the head: no block, not an error.
    assert_eq!(
        pool.header(BlockNumberOrTag::Number(1_000)).await.unwrap(),
        None
    );
    // Anvil knows the `finalized` tag: a block at or below the head.
    let finalized = pool.finalized().await.unwrap().unwrap();
    assert!(finalized.number <= latest.number);
}

#[tokio::test]
async fn logs_by_range_and_by_block_hash_agree() {
    let chain = TestChain::start().await.unwrap();
    let admin = chain.account(0).unwrap();
    let feed = PriceFeed::deploy(
        chain.provider().clone(),
        8u8,
        "EUR / USD".to_owned(),
        admin,
        admin,
    )
    .await
    .unwrap();
    let receipt = anvil_tests::submit_observation(chain.provider(), *feed.address(), 108_000_000)
        .await
        .unwrap();
    let block = receipt.block_number.unwrap();
    let hash = receipt.block_hash.unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    let head = pool.block_number().await.unwrap();

    let ranged = pool
        .logs_in_range(&[*feed.address()], 0, head)
        .await
        .unwrap();
    assert!(!ranged.is_empty());
    assert!(ranged.iter().all(|l| l.inner.address == *feed.address()));
    let in_block: Vec<_> = ranged
        .iter()
        .filter(|l| l.block_number == Some(block))
        .cloned()
        .collect();
    let by_hash = pool
        .logs_by_block_hash(&[*feed.address()], hash)
        .await
        .unwrap();
    assert_eq!(by_hash, in_block);
    assert!(by_hash.iter().all(|l| l.block_hash == Some(hash)));
    // Another contract: nothing; a range without the block: nothing.
    let other = Address::repeat_byte(0x42);
    assert!(
        pool.logs_in_range(&[other], 0, head)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        pool.logs_by_block_hash(&[other], hash)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        pool.logs_in_range(&[*feed.address()], 0, block - 1)
            .await
            .unwrap()
            .iter()
            .all(|l| l.block_number < Some(block))
    );
}

#[tokio::test]
async fn estimates_calls_and_known_transactions() {
    let chain = TestChain::start().await.unwrap();
    let pool = pool(&chain, vec![chain.endpoint().to_string()]);
    let rich = chain.account(0).unwrap();
    let transfer = TransactionRequest::default()
        .with_from(rich)
        .with_to(Address::repeat_byte(0x42))
        .with_value(U256::from(1));
    assert_eq!(pool.estimate_gas(&transfer).await.unwrap(), 21_000);

    // State overrides are applied: a balance for an account that has none, and code
    // (`PUSH0 PUSH0 REVERT`) at the plain address the transfer goes to.
    let poor = PrivateKeySigner::random().address();
    let unpaid = TransactionRequest::default()
        .with_from(poor)
        .with_to(Address::repeat_byte(0x42))
        .with_value(U256::from(10u64).pow(U256::from(18u64)));
    let mut overrides = alloy::rpc::types::state::StateOverride::default();
    overrides.insert(
        poor,
        alloy::rpc::types::state::AccountOverride {
            balance: Some(U256::from(10u64).pow(U256::from(30u64))),
            ..Default::default()
        },
    );
    assert_eq!(
        pool.estimate_gas_with_overrides(&unpaid, BlockNumberOrTag::Latest, &overrides)
            .await
            .unwrap(),
        21_000
    );
    overrides.insert(
        Address::repeat_byte(0x42),
        alloy::rpc::types::state::AccountOverride {
            code: Some(Bytes::from(vec![0x5f, 0x5f, 0xfd])),
            ..Default::default()
        },
    );
    let err = pool
        .estimate_gas_with_overrides(&unpaid, BlockNumberOrTag::Latest, &overrides)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ChainError::Node { error, .. } if error.kind == NodeErrorKind::ExecutionReverted),
        "{err:?}"
    );
    assert!(!err.is_retryable(), "a verdict on the request: {err:?}");

    // `eth_call` returns the ABI-encoded answer.
    let admin = chain.account(0).unwrap();
    let feed = PriceFeed::deploy(
        chain.provider().clone(),
        8u8,
        "EUR / USD".to_owned(),
        admin,
        admin,
    )
    .await
    .unwrap();
    let decimals = TransactionRequest::default()
        .with_to(*feed.address())
        .with_input(PriceFeed::decimalsCall {}.abi_encode());
    let out = pool
        .call(&decimals, BlockNumberOrTag::Latest)
        .await
        .unwrap();
    assert_eq!(
        PriceFeed::decimalsCall::abi_decode_returns(&out).unwrap(),
        8
    );

    // Known transactions: a mined one yes, an invented hash no.
    let signer = chain.signer(3).unwrap().clone();
    let raw = raw_transfer(&chain, &signer, 0, 1).await;
    let sent = pool.send_raw_transaction(&raw).await.unwrap();
    assert!(pool.transaction_known(sent).await.unwrap());
    assert!(
        !pool
            .transaction_known(B256::repeat_byte(0x77))
            .await
            .unwrap()
    );
}

/// Issue 32 §8: health is per upstream and method class. The first upstream answers
/// every send with an HTTP error while it serves reads: after `failureThreshold` failed
/// sends it is skipped for sends (they go straight to the second), and it stays first
/// in line for reads. Counted per upstream at the proxies.
#[tokio::test]
async fn an_upstream_failing_every_send_is_skipped_for_sends_only() {
    use anvil_tests::proxy::{RpcProxy, Rule};
    let chain = TestChain::start().await.unwrap();
    let broken = RpcProxy::start(chain.endpoint()).await.unwrap();
    let good = RpcProxy::start(chain.endpoint()).await.unwrap();
    let refuse = broken.add_rule(Rule::fail_then_recover("eth_sendRawTransaction", u64::MAX));
    let pool = pool(
        &chain,
        vec![broken.url().to_string(), good.url().to_string()],
    );
    let signer = chain.signer(2).unwrap().clone();
    let sends = 10;
    for nonce in 0..sends {
        let raw = raw_transfer(&chain, &signer, nonce, 1).await;
        pool.send_raw_transaction(&raw).await.unwrap();
        // A read between sends: served by the first upstream.
        pool.block_number().await.unwrap();
    }
    assert_eq!(good.count("eth_sendRawTransaction"), sends);
    assert_eq!(
        broken.hits(refuse),
        3,
        "after three failed sends the broken upstream is skipped for sends"
    );
    assert_eq!(
        broken.count("eth_blockNumber"),
        sends,
        "reads stay on the first upstream"
    );
    assert_eq!(good.count("eth_blockNumber"), 0);
    let h = pool.health();
    assert!(h[0].healthy && !h[0].sends_healthy, "{h:?}");
    assert!(h[1].healthy && h[1].sends_healthy, "{h:?}");
}
