//! The harness itself: fresh nodes on distinct ports, configuration reaching Anvil,
//! funded dev accounts, providers per account, and the node's death on drop.

use alloy::eips::BlockNumberOrTag;
use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, U256, address};
use alloy::providers::ext::AnvilApi;
use alloy::providers::{Provider, ProviderBuilder};
use alloy::rpc::types::TransactionRequest;
use anvil_tests::{ChainBuilder, TestChain};
use std::time::Duration;

/// Anvil's dev account 0 from the standard mnemonic (see FIELD-NOTES.md).
const DEV0: Address = address!("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266");

async fn send_value(
    chain: &TestChain,
    from: usize,
    to: Address,
) -> anyhow::Result<alloy::rpc::types::TransactionReceipt> {
    let tx = TransactionRequest::default()
        .with_to(to)
        .with_value(U256::from(1));
    let receipt = chain
        .provider_for(from)?
        .send_transaction(tx)
        .await?
        .get_receipt()
        .await?;
    assert!(receipt.status());
    Ok(receipt)
}

struct BlockInfo {
    number: u64,
    timestamp: u64,
}

async fn block_at(chain: &TestChain, tag: BlockNumberOrTag) -> anyhow::Result<BlockInfo> {
    let block = chain
        .provider()
        .get_block_by_number(tag)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no {tag} block"))?;
    Ok(BlockInfo {
        number: block.header.number,
        timestamp: block.header.timestamp,
    })
}

#[tokio::test]
async fn chains_started_concurrently_get_different_ports_and_are_isolated() -> anyhow::Result<()> {
    let (a, b) = tokio::join!(TestChain::start(), TestChain::start());
    let (a, b) = (a?, b?);
    assert_ne!(a.port(), b.port());
    assert_ne!(a.endpoint(), b.endpoint());
    assert_eq!(
        a.endpoint().as_str(),
        format!("http://127.0.0.1:{}/", a.port())
    );

    assert_eq!(a.block_number().await?, 0);
    assert_eq!(b.block_number().await?, 0);
    send_value(&a, 0, a.account(1)?).await?;
    assert_eq!(
        a.block_number().await?,
        1,
        "automine: one block per transaction"
    );
    assert_eq!(b.block_number().await?, 0, "the other chain saw nothing");
    Ok(())
}

#[tokio::test]
async fn configured_chain_id_is_reported_by_eth_chain_id() -> anyhow::Result<()> {
    let chain = ChainBuilder::new().chain_id(777_001).start().await?;
    assert_eq!(chain.chain_id(), 777_001);
    assert_eq!(chain.provider().get_chain_id().await?, 777_001);
    // Transactions signed for that chain id are accepted.
    let receipt = send_value(&chain, 0, chain.account(1)?).await?;
    let tx = chain
        .provider()
        .get_transaction_by_hash(receipt.transaction_hash)
        .await?
        .ok_or_else(|| anyhow::anyhow!("mined transaction not found"))?;
    assert_eq!(alloy::consensus::Transaction::chain_id(&tx), Some(777_001));

    let default = TestChain::start().await?;
    assert_eq!(default.chain_id(), 31_337);
    assert_eq!(default.provider().get_chain_id().await?, 31_337);
    Ok(())
}

#[tokio::test]
async fn block_time_mines_blocks_without_transactions() -> anyhow::Result<()> {
    let chain = ChainBuilder::new().block_time(1).start().await?;
    let start = chain.block_number().await?;
    let reached = tokio::time::timeout(Duration::from_secs(20), async {
        let mut poll = tokio::time::interval(Duration::from_millis(100));
        loop {
            poll.tick().await;
            let now = chain.block_number().await?;
            if now >= start + 2 {
                return anyhow::Ok(now);
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no two new blocks within 20 s with --block-time 1"))??;
    assert!(reached >= start + 2);
    // No transaction was sent: the blocks are empty.
    let block = chain
        .provider()
        .get_block_by_number(BlockNumberOrTag::Number(reached))
        .await?
        .ok_or_else(|| anyhow::anyhow!("block {reached} missing"))?;
    assert!(block.transactions.is_empty());
    Ok(())
}

#[tokio::test]
async fn automine_is_the_default() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    assert!(chain.provider().anvil_get_auto_mine().await?);
    let receipt = send_value(&chain, 0, chain.account(2)?).await?;
    assert_eq!(receipt.block_number, Some(1));
    Ok(())
}

#[tokio::test]
async fn extra_args_reach_anvil() -> anyhow::Result<()> {
    // `safe` is head - slots_in_an_epoch and `finalized` head - 2 epochs.
    let chain = ChainBuilder::new()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await?;
    chain.provider().anvil_mine(Some(10), None).await?;
    let head = chain.block_number().await?;
    assert_eq!(head, 10);
    assert_eq!(
        block_at(&chain, BlockNumberOrTag::Safe).await?.number,
        head - 1
    );
    assert_eq!(
        block_at(&chain, BlockNumberOrTag::Finalized).await?.number,
        head - 2
    );

    // Without the argument, the default epoch of 32 slots applies.
    let default = TestChain::start().await?;
    default.provider().anvil_mine(Some(40), None).await?;
    assert_eq!(
        block_at(&default, BlockNumberOrTag::Safe).await?.number,
        40 - 32
    );
    Ok(())
}

#[tokio::test]
async fn dev_accounts_are_funded_and_providers_sign_as_them() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let accounts = chain.accounts();
    assert_eq!(accounts.len(), 10);
    assert_eq!(accounts[0], DEV0);
    assert_eq!(chain.account(0)?, DEV0);
    assert_eq!(chain.signer(0)?.address(), DEV0);
    assert!(chain.account(10).is_err());
    for a in &accounts {
        assert!(chain.provider().get_balance(*a).await? >= U256::from(10u128.pow(21)));
    }
    // The default provider signs as account 0, `provider_for(i)` as account i.
    let r0 = send_value(&chain, 0, accounts[5]).await?;
    assert_eq!(r0.from, accounts[0]);
    let r3 = send_value(&chain, 3, accounts[5]).await?;
    assert_eq!(r3.from, accounts[3]);
    let tx = TransactionRequest::default()
        .with_to(accounts[5])
        .with_value(U256::from(1));
    let r = chain
        .provider()
        .send_transaction(tx)
        .await?
        .get_receipt()
        .await?;
    assert_eq!(r.from, accounts[0]);
    Ok(())
}

#[tokio::test]
async fn dropping_the_chain_kills_anvil() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let url = chain.endpoint().clone();
    let reader = ProviderBuilder::new().connect_http(url);
    assert_eq!(reader.get_block_number().await?, 0);
    drop(chain);
    let after = reader.get_block_number().await;
    assert!(after.is_err(), "Anvil still answers after drop: {after:?}");
    Ok(())
}

#[tokio::test]
async fn increase_time_moves_the_clock_and_mines() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let before = block_at(&chain, BlockNumberOrTag::Number(0))
        .await?
        .timestamp;
    chain.increase_time(10_000).await?;
    assert_eq!(
        chain.block_number().await?,
        1,
        "increase_time mines a block"
    );
    assert!(
        block_at(&chain, BlockNumberOrTag::Number(1))
            .await?
            .timestamp
            >= before + 10_000
    );
    Ok(())
}

#[tokio::test]
async fn a_refused_send_does_not_block_the_accounts_next_transaction() -> anyhow::Result<()> {
    use anvil_tests::keel_abi::bindings::Directory::{self, DirectoryErrors};
    let chain = TestChain::start().await?;
    let p = chain.provider();
    let dir = Directory::deploy(p.clone(), chain.account(0)?).await?;
    // Refused by gas estimation (ZeroName), from the same provider, twice.
    for _ in 0..2 {
        let err = anvil_tests::expect_revert::<DirectoryErrors, _, _>(
            &dir.set(alloy::primitives::B256::ZERO, DEV0),
        )
        .await?;
        assert_eq!(err, DirectoryErrors::ZeroName(Directory::ZeroName {}));
    }
    // The next transaction gets the next nonce and is mined (a provider that reserved
    // nonces for the refused sends would leave a gap and wait forever here).
    let key = anvil_tests::keel_abi::directory_key("x");
    let pending = dir.set(key, DEV0).send().await?;
    let receipt = tokio::time::timeout(Duration::from_secs(30), pending.get_receipt())
        .await
        .map_err(|_| anyhow::anyhow!("the transaction after a refused send was never mined"))??;
    assert!(receipt.status());
    assert_eq!(p.get_transaction_count(DEV0).await?, 2);
    Ok(())
}
