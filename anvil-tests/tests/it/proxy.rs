//! The fault-injecting JSON-RPC proxy against a real Anvil: forwarding (single and
//! batch), each fault, and geth's replacement rule where Anvil alone is lenient.

use alloy::consensus::{SignableTransaction, TxEip1559, TxEnvelope};
use alloy::eips::eip2718::Encodable2718;
use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, B256, Bytes, TxKind, U256};
use alloy::providers::ext::AnvilApi;
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionRequest;
use alloy::signers::SignerSync;
use alloy::transports::{RpcError, TransportErrorKind};
use anvil_tests::TestChain;
use anvil_tests::proxy::{
    ALREADY_KNOWN, Fault, GETH_TXPOOL_ERROR_CODE, REPLACEMENT_UNDERPRICED, RpcProxy, Rule,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const GWEI: u128 = 1_000_000_000;

async fn chain_and_proxy() -> anyhow::Result<(TestChain, RpcProxy)> {
    let chain = TestChain::start().await?;
    let proxy = RpcProxy::start(chain.endpoint()).await?;
    Ok((chain, proxy))
}

/// Like [`chain_and_proxy`] with automine off: Anvil's automine answers
/// `eth_sendRawTransaction` before the block holding the transaction exists, so a
/// receipt read right after a send may be missing. Tests that read receipts mine
/// explicitly (`evm_mine` returns once the block is there).
async fn manual_chain_and_proxy() -> anyhow::Result<(TestChain, RpcProxy)> {
    let (chain, proxy) = chain_and_proxy().await?;
    chain.provider().anvil_set_auto_mine(false).await?;
    Ok((chain, proxy))
}

/// A provider without a wallet talking to the proxy.
fn via(proxy: &RpcProxy) -> DynProvider {
    ProviderBuilder::new()
        .disable_recommended_fillers()
        .connect_http(proxy.url().clone())
        .erased()
}

/// A value transfer of 1 wei to `Address::ZERO` from dev account `index`, signed
/// locally with the given nonce and fees: the raw bytes and the hash.
fn signed_transfer(
    chain: &TestChain,
    index: usize,
    nonce: u64,
    max_fee: u128,
    tip: u128,
) -> anyhow::Result<(Bytes, B256)> {
    let tx = TxEip1559 {
        chain_id: chain.chain_id(),
        nonce,
        gas_limit: 21_000,
        max_fee_per_gas: max_fee,
        max_priority_fee_per_gas: tip,
        to: TxKind::Call(Address::ZERO),
        value: U256::from(1),
        ..Default::default()
    };
    let signature = chain.signer(index)?.sign_hash_sync(&tx.signature_hash())?;
    let envelope = TxEnvelope::from(tx.into_signed(signature));
    Ok((envelope.encoded_2718().into(), *envelope.tx_hash()))
}

/// Posts a raw JSON body to `url`: the HTTP status and the body (JSON when it parses,
/// else a JSON string holding the text).
async fn post(url: &reqwest::Url, body: &Value) -> anyhow::Result<(u16, Value)> {
    let response = reqwest::Client::new()
        .post(url.clone())
        .json(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

/// The HTTP status of a transport-level failure, `None` for any other error.
fn http_status(err: &RpcError<TransportErrorKind>) -> Option<u16> {
    err.as_transport_err()
        .and_then(TransportErrorKind::as_http_error)
        .map(|e| e.status)
}

/// The (code, message) of a JSON-RPC error answer.
fn rpc_error(err: &RpcError<TransportErrorKind>) -> Option<(i64, String)> {
    err.as_error_resp().map(|e| (e.code, e.message.to_string()))
}

#[tokio::test]
async fn forwards_single_and_batch_requests_and_counts_methods() -> anyhow::Result<()> {
    let (chain, proxy) = chain_and_proxy().await?;
    let proxied = chain.provider_via(0, proxy.url())?;
    assert_ne!(proxy.url(), chain.endpoint());
    assert_eq!(proxy.upstream(), chain.endpoint());

    // Single requests, including a signed transaction and its receipt, go through.
    assert_eq!(proxied.get_chain_id().await?, chain.chain_id());
    let to = chain.account(1)?;
    let before = chain.provider().get_balance(to).await?;
    let receipt = proxied
        .send_transaction(
            TransactionRequest::default()
                .with_to(to)
                .with_value(U256::from(7)),
        )
        .await?
        .get_receipt()
        .await?;
    assert!(receipt.status());
    assert_eq!(
        chain.provider().get_balance(to).await?,
        before + U256::from(7)
    );
    assert_eq!(proxy.count("eth_sendRawTransaction"), 1);
    assert!(proxy.count("eth_chainId") >= 1);
    assert_eq!(proxy.count("eth_getStorageAt"), 0);

    // A batch: answers in request order, with the callers' ids, equal to the node's.
    let dev0 = chain.account(0)?;
    let nonce_reads = proxy.count("eth_getTransactionCount");
    let (status, answer) = post(
        proxy.url(),
        &json!([
            {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
            {"jsonrpc": "2.0", "id": "two", "method": "eth_getBalance", "params": [dev0, "latest"]},
            {"jsonrpc": "2.0", "id": 3, "method": "eth_getTransactionCount", "params": [dev0, "latest"]},
        ]),
    )
    .await?;
    assert_eq!(status, 200, "{answer}");
    let answers = answer.as_array().expect("a batch answer");
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0]["id"], json!(1));
    assert_eq!(
        answers[0]["result"],
        json!(format!("{:#x}", chain.chain_id()))
    );
    assert_eq!(answers[1]["id"], json!("two"));
    let balance: U256 = serde_json::from_value(answers[1]["result"].clone())?;
    assert_eq!(balance, chain.provider().get_balance(dev0).await?);
    assert_eq!(answers[2]["id"], json!(3));
    assert_eq!(answers[2]["result"], json!("0x1"));
    assert_eq!(proxy.count("eth_getBalance"), 1);
    assert_eq!(proxy.count("eth_getTransactionCount"), nonce_reads + 1);

    // A batch mixing a rule's answer with forwarded requests.
    proxy.add_rule(Rule::error("eth_gasPrice", -32005, "limit exceeded"));
    let (status, answer) = post(
        proxy.url(),
        &json!([
            {"jsonrpc": "2.0", "id": 10, "method": "eth_gasPrice", "params": []},
            {"jsonrpc": "2.0", "id": 11, "method": "eth_chainId", "params": []},
        ]),
    )
    .await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!([
            {"jsonrpc": "2.0", "id": 10, "error": {"code": -32005, "message": "limit exceeded"}},
            {"jsonrpc": "2.0", "id": 11, "result": format!("{:#x}", chain.chain_id())},
        ])
    );
    Ok(())
}

#[tokio::test]
async fn dropped_send_response_is_a_transport_error_but_the_node_has_the_tx() -> anyhow::Result<()>
{
    let (chain, proxy) = manual_chain_and_proxy().await?;
    let rule = proxy.add_rule(Rule::drop_response("eth_sendRawTransaction").times(1));
    let (raw, hash) = signed_transfer(&chain, 0, 0, 10 * GWEI, GWEI)?;

    let err = via(&proxy)
        .send_raw_transaction(&raw)
        .await
        .expect_err("the response was dropped");
    assert_eq!(http_status(&err), Some(504), "{err}");
    assert_eq!(proxy.hits(rule), 1);

    // The node received it: pending, then mined.
    let direct = chain.provider();
    let pending = direct
        .get_transaction_by_hash(hash)
        .await?
        .expect("the node has it");
    assert!(pending.block_number.is_none());
    chain.mine().await?;
    let receipt = direct.get_transaction_receipt(hash).await?.expect("mined");
    assert!(receipt.status());
    assert_eq!(direct.get_transaction_count(chain.account(0)?).await?, 1);

    // The rule was for one request: a re-broadcast reaches the caller with the node's
    // own answer (the nonce is used now).
    let err = via(&proxy)
        .send_raw_transaction(&raw)
        .await
        .expect_err("the node refuses the re-broadcast of a mined transaction");
    assert!(rpc_error(&err).is_some(), "{err}");
    assert_eq!(proxy.hits(rule), 1);
    assert_eq!(proxy.count("eth_sendRawTransaction"), 2);
    Ok(())
}

#[tokio::test]
async fn dropped_response_in_a_batch_fails_the_batch_after_forwarding() -> anyhow::Result<()> {
    let (chain, proxy) = manual_chain_and_proxy().await?;
    proxy.add_rule(Rule::drop_response("eth_sendRawTransaction"));
    let (raw, hash) = signed_transfer(&chain, 2, 0, 10 * GWEI, GWEI)?;
    let (status, _) = post(
        proxy.url(),
        &json!([
            {"jsonrpc": "2.0", "id": 1, "method": "eth_sendRawTransaction", "params": [raw]},
            {"jsonrpc": "2.0", "id": 2, "method": "eth_blockNumber", "params": []},
        ]),
    )
    .await?;
    assert_eq!(status, 504);
    assert!(
        chain
            .provider()
            .get_transaction_by_hash(hash)
            .await?
            .is_some(),
        "the node has it"
    );
    Ok(())
}

#[tokio::test]
async fn error_rule_answers_without_forwarding_until_removed() -> anyhow::Result<()> {
    let (chain, proxy) = manual_chain_and_proxy().await?;
    let rule = proxy.add_rule(Rule::new(
        "eth_sendRawTransaction",
        Fault::Error {
            code: -32603,
            message: "upstream overloaded".into(),
        },
    ));
    let (raw, hash) = signed_transfer(&chain, 0, 0, 10 * GWEI, GWEI)?;

    let err = via(&proxy).send_raw_transaction(&raw).await.unwrap_err();
    assert_eq!(
        rpc_error(&err),
        Some((-32603, "upstream overloaded".to_owned()))
    );
    assert_eq!(proxy.hits(rule), 1);
    // Not forwarded: the node never saw it.
    let direct = chain.provider();
    chain.mine().await?;
    assert!(direct.get_transaction_by_hash(hash).await?.is_none());
    assert_eq!(direct.get_transaction_count(chain.account(0)?).await?, 0);

    assert!(proxy.remove_rule(rule));
    assert!(!proxy.remove_rule(rule));
    let sent = via(&proxy).send_raw_transaction(&raw).await?;
    assert_eq!(*sent.tx_hash(), hash);
    chain.mine().await?;
    assert!(direct.get_transaction_receipt(hash).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn null_receipts_for_n_requests_then_the_real_receipt() -> anyhow::Result<()> {
    let (chain, proxy) = manual_chain_and_proxy().await?;
    let (raw, hash) = signed_transfer(&chain, 0, 0, 10 * GWEI, GWEI)?;
    let sent = chain.provider().send_raw_transaction(&raw).await?;
    assert_eq!(*sent.tx_hash(), hash);
    chain.mine().await?;
    let real = chain
        .provider()
        .get_transaction_receipt(hash)
        .await?
        .expect("mined");

    let rule = proxy.add_rule(Rule::null_result("eth_getTransactionReceipt").times(2));
    let proxied = via(&proxy);
    assert!(proxied.get_transaction_receipt(hash).await?.is_none());
    assert!(proxied.get_transaction_receipt(hash).await?.is_none());
    let receipt = proxied
        .get_transaction_receipt(hash)
        .await?
        .expect("the rule is exhausted");
    assert_eq!(receipt.transaction_hash, hash);
    assert_eq!(receipt.block_hash, real.block_hash);
    assert_eq!(proxy.hits(rule), 2);
    assert_eq!(proxy.count("eth_getTransactionReceipt"), 3);
    // Other methods are untouched meanwhile.
    assert_eq!(proxied.get_block_number().await?, 1);
    Ok(())
}

#[tokio::test]
async fn fail_then_recover_answers_503_without_forwarding_then_forwards() -> anyhow::Result<()> {
    let (chain, proxy) = chain_and_proxy().await?;
    let rule = proxy.add_rule(Rule::fail_then_recover("evm_mine", 2));
    let mine = json!({"jsonrpc": "2.0", "id": 1, "method": "evm_mine", "params": []});

    for attempt in 1..=2 {
        let (status, body) = post(proxy.url(), &mine).await?;
        assert_eq!(status, 503, "attempt {attempt}: {body}");
        assert_eq!(chain.block_number().await?, 0, "not forwarded");
    }
    let (status, body) = post(proxy.url(), &mine).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(chain.block_number().await?, 1);
    assert_eq!(proxy.hits(rule), 2);

    // Through alloy the failure is a transport error carrying the status.
    proxy.add_rule(Rule::fail_then_recover("eth_blockNumber", 1));
    let err = via(&proxy).get_block_number().await.unwrap_err();
    assert_eq!(http_status(&err), Some(503), "{err}");
    assert_eq!(via(&proxy).get_block_number().await?, 1);

    // Cleared rules leave everything to the node.
    proxy.clear_rules();
    assert_eq!(proxy.hits(rule), 0);
    Ok(())
}

#[tokio::test]
async fn latency_delays_the_answer() -> anyhow::Result<()> {
    let (chain, proxy) = chain_and_proxy().await?;
    let delay = Duration::from_millis(300);
    let rule = proxy.add_rule(Rule::latency("eth_chainId", delay).times(1));
    let started = Instant::now();
    assert_eq!(via(&proxy).get_chain_id().await?, chain.chain_id());
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    assert_eq!(proxy.hits(rule), 1);
    Ok(())
}

/// The node answers at once and the proxy holds that answer: a block mined while it
/// is held does not show in it (a stale answer arriving late).
#[tokio::test]
async fn hold_response_delivers_the_answer_the_node_gave_before_later_changes() -> anyhow::Result<()>
{
    let (chain, proxy) = chain_and_proxy().await?;
    let before = chain.block_number().await?;
    let rule =
        proxy.add_rule(Rule::hold_response("eth_blockNumber", Duration::from_millis(500)).times(1));
    let held = tokio::spawn({
        let provider = via(&proxy);
        async move { provider.get_block_number().await }
    });
    while proxy.hits(rule) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    chain.mine().await?;
    assert_eq!(held.await??, before);
    assert_eq!(via(&proxy).get_block_number().await?, before + 1);
    assert_eq!(proxy.hits(rule), 1);
    Ok(())
}

#[tokio::test]
async fn result_rule_answers_the_given_result_without_forwarding() -> anyhow::Result<()> {
    let (chain, proxy) = chain_and_proxy().await?;
    let head = chain.block_number().await?;
    let rule = proxy.add_rule(Rule::result(
        "eth_blockNumber",
        json!(format!("0x{:x}", head + 5)),
    ));
    assert_eq!(via(&proxy).get_block_number().await?, head + 5);
    assert_eq!(proxy.hits(rule), 1);
    assert!(proxy.remove_rule(rule));
    assert_eq!(via(&proxy).get_block_number().await?, head);
    Ok(())
}

#[tokio::test]
async fn geth_replacement_rule_enforces_the_bump_and_already_known() -> anyhow::Result<()> {
    let (chain, proxy) = manual_chain_and_proxy().await?;
    let direct = chain.provider();
    let rule = proxy.add_rule(Rule::geth_replacement(10));
    let proxied = via(&proxy);
    let sender = 1;

    // The first transaction stays pending (automine off).
    let (first, first_hash) = signed_transfer(&chain, sender, 0, 10 * GWEI, 2 * GWEI)?;
    let sent = proxied.send_raw_transaction(&first).await?;
    assert_eq!(*sent.tx_hash(), first_hash);
    assert!(direct.get_transaction_by_hash(first_hash).await?.is_some());

    // Identical bytes: geth's "already known" from the proxy (Anvil itself would say
    // "transaction already imported").
    let err = proxied.send_raw_transaction(&first).await.unwrap_err();
    assert_eq!(
        rpc_error(&err),
        Some((GETH_TXPOOL_ERROR_CODE, ALREADY_KNOWN.to_owned()))
    );

    // Anvil would accept both of these (any higher fee replaces); geth refuses them.
    let refused = [
        ("+5% on both", 10_500_000_000, 2_100_000_000),
        ("+20% max fee, +5% tip", 12 * GWEI, 2_100_000_000),
        ("+5% max fee, +50% tip", 10_500_000_000, 3 * GWEI),
    ];
    for (what, max_fee, tip) in refused {
        let (raw, hash) = signed_transfer(&chain, sender, 0, max_fee, tip)?;
        let err = proxied.send_raw_transaction(&raw).await.unwrap_err();
        assert_eq!(
            rpc_error(&err),
            Some((GETH_TXPOOL_ERROR_CODE, REPLACEMENT_UNDERPRICED.to_owned())),
            "{what}"
        );
        assert!(
            direct.get_transaction_by_hash(hash).await?.is_none(),
            "{what} reached the node"
        );
    }
    assert!(direct.get_transaction_by_hash(first_hash).await?.is_some());
    assert_eq!(proxy.hits(rule), 4);

    // +10% on both replaces it in the node.
    let (bumped, bumped_hash) = signed_transfer(&chain, sender, 0, 11 * GWEI, 2_200_000_000)?;
    assert_eq!(
        *proxied.send_raw_transaction(&bumped).await?.tx_hash(),
        bumped_hash
    );
    let pending = direct
        .get_transaction_by_hash(bumped_hash)
        .await?
        .expect("the node holds the replacement");
    assert!(pending.block_number.is_none(), "still pending");
    assert!(
        direct.get_transaction_by_hash(first_hash).await?.is_none(),
        "the node dropped the replaced transaction"
    );

    // The next replacement is measured against the last accepted fees, not the first:
    // +15% over the first but +4.5% over the replacement is refused.
    let (raw, hash) = signed_transfer(&chain, sender, 0, 11_500_000_000, 2_300_000_000)?;
    let err = proxied.send_raw_transaction(&raw).await.unwrap_err();
    assert_eq!(
        rpc_error(&err).map(|(_, m)| m),
        Some(REPLACEMENT_UNDERPRICED.to_owned())
    );
    assert!(direct.get_transaction_by_hash(hash).await?.is_none());

    // Another nonce is not a replacement.
    let (next, next_hash) = signed_transfer(&chain, sender, 1, 10 * GWEI, GWEI)?;
    let sent = proxied.send_raw_transaction(&next).await?;
    assert_eq!(*sent.tx_hash(), next_hash);

    chain.mine().await?;
    let receipt = direct
        .get_transaction_receipt(bumped_hash)
        .await?
        .expect("the replacement is mined");
    assert!(receipt.status());
    assert!(direct.get_transaction_receipt(first_hash).await?.is_none());
    assert!(direct.get_transaction_receipt(next_hash).await?.is_some());
    assert_eq!(
        direct.get_transaction_count(chain.account(sender)?).await?,
        2
    );
    assert_eq!(proxy.count("eth_sendRawTransaction"), 8);
    Ok(())
}
