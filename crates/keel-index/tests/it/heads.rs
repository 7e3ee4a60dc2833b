//! Rounds handed a head announced by a subscription ([`TipIngest::round_at`]): the
//! announced header replaces `eth_blockNumber` and that block's header read, and proves
//! the stored tip when it is its child; any other shape (missed heads, a stale head from
//! before a reorg, a head below the tip after the chain shrank, a head whose parent is
//! not the tip) falls back to reads by number and the parent-hash walk, and the index
//! ends equal to a fresh re-index.

use crate::common::{Env, catch_up, config, env, fingerprint, reindex};
use crate::reorg::{assert_branch_replaced, transfer_request};
use alloy::eips::BlockNumberOrTag;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::proxy::RpcProxy;
use keel_chain::{BlockHeader, UpstreamConfig, UpstreamPool};
use keel_index::{TipIngest, read};
use std::collections::HashMap;
use std::sync::Arc;

/// The JSON-RPC methods a tip round can send.
const METHODS: &[&str] = &[
    "eth_blockNumber",
    "eth_getBlockByNumber",
    "eth_getBlockByHash",
    "eth_getLogs",
];

/// An owner whose upstream is a counting proxy in front of the env's chain.
async fn counted_owner(env: &Env, id: &str) -> anyhow::Result<(TipIngest, RpcProxy)> {
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    let node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let ingest = TipIngest::take_ownership(env.db.pool().clone(), node, config(64), id).await?;
    Ok((ingest, proxy))
}

fn counts(proxy: &RpcProxy) -> HashMap<&'static str, u64> {
    METHODS.iter().map(|m| (*m, proxy.count(m))).collect()
}

/// Calls per method since `before`, methods with none left out.
fn since(proxy: &RpcProxy, before: &HashMap<&'static str, u64>) -> HashMap<&'static str, u64> {
    counts(proxy)
        .into_iter()
        .map(|(m, n)| (m, n - before.get(m).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The header the node has now at `number` (read directly, not through the proxy), as a
/// subscription would announce it.
async fn head_at(env: &Env, number: u64) -> anyhow::Result<BlockHeader> {
    env.node
        .header(BlockNumberOrTag::Number(number))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no block {number}"))
}

#[tokio::test]
async fn an_announced_child_of_the_tip_costs_one_get_logs_and_missed_heads_are_read_by_number()
-> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("HEADS").await?;
    let (a0, a1) = (env.chain.account(0)?, env.chain.account(1)?);
    let (ingest, proxy) = counted_owner(&env, "heads").await?;
    catch_up(&ingest).await?;

    // One new block, announced: no eth_blockNumber, no header read, one eth_getLogs.
    env.mint(asset.token, a0, 50).await?;
    let head = head_at(&env, env.chain.block_number().await?).await?;
    let before = counts(&proxy);
    let out = ingest.round_at(Some(head)).await?;
    assert_eq!(
        (out.head, out.tip, out.blocks),
        (head.number, Some(head.number), 1)
    );
    assert_eq!(
        since(&proxy, &before),
        HashMap::from([("eth_getLogs", 1)]),
        "an announced child of the tip"
    );
    assert_eq!(
        read::balance(env.db.pool(), env.chain_id, asset.token, a0).await?,
        "50"
    );

    // The same head again (a duplicate announcement): it is the tip, nothing is read.
    let before = counts(&proxy);
    let out = ingest.round_at(Some(head)).await?;
    assert_eq!((out.tip, out.blocks), (Some(head.number), 0));
    assert_eq!(
        since(&proxy, &before),
        HashMap::new(),
        "the tip announced again"
    );

    // Three blocks, only the last announced (two heads missed): the two are read by
    // number, the announced one is not; every block's logs are fetched once.
    env.transfer(asset.token, a1, 5).await?;
    env.chain.mine().await?;
    env.transfer(asset.token, a1, 7).await?;
    let head = head_at(&env, env.chain.block_number().await?).await?;
    let before = counts(&proxy);
    let out = ingest.round_at(Some(head)).await?;
    assert_eq!((out.tip, out.blocks), (Some(head.number), 3));
    let calls = since(&proxy, &before);
    assert_eq!(calls.get("eth_blockNumber"), None, "{calls:?}");
    assert_eq!(calls.get("eth_getLogs"), Some(&3), "{calls:?}");
    // The tip's header (the head is not its child, so it proves nothing about it) and
    // the two missed blocks; the `finalized` tag is not due (4 blocks since its read).
    assert_eq!(calls.get("eth_getBlockByNumber"), Some(&3), "{calls:?}");
    assert_eq!(
        read::balance(env.db.pool(), env.chain_id, asset.token, a1).await?,
        "12"
    );
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

/// A head announced before a reorg replaced its block: whatever the round made of it,
/// the next announced head (the new branch's child, whose parent is not the stored
/// tip) rolls it back, and the index equals a re-index.
#[tokio::test]
async fn a_head_announced_before_a_reorg_is_rolled_back_by_the_next_head() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("STALE").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 1_000).await?;
    let (ingest, proxy) = counted_owner(&env, "stale").await?;
    catch_up(&ingest).await?;

    for depth in 1..=3u64 {
        // A transfer to a1 at the head, announced; the block is replaced before the round
        // runs (a2 gets a transfer instead, in the newest replacement block).
        env.transfer(asset.token, a1, depth).await?;
        for _ in 1..depth {
            env.chain.mine().await?;
        }
        let stale = head_at(&env, env.chain.block_number().await?).await?;
        let p = env.chain.provider();
        p.anvil_reorg(ReorgOptions {
            depth,
            tx_block_pairs: vec![(
                transfer_request(asset.token, a0, a2, 100 + depth, p),
                depth - 1,
            )],
        })
        .await?;
        let replaced = head_at(&env, stale.number).await?;
        assert_ne!(
            replaced.hash, stale.hash,
            "depth {depth}: the reorg kept the block"
        );
        let before = counts(&proxy);
        let out = ingest.round_at(Some(stale)).await?;
        // Bounded work: the stale header is dropped once its parent does not match, not
        // taken for a reorg of the tip again and again.
        let calls: u64 = since(&proxy, &before).values().sum();
        assert!(out.reorgs <= 1, "depth {depth}: {out:?}");
        assert!(calls <= 3 * depth + 3, "depth {depth}: {calls} calls");

        // The new branch's next block is announced: its parent is not a stale tip.
        env.chain.mine().await?;
        let next = head_at(&env, env.chain.block_number().await?).await?;
        let out = ingest.round_at(Some(next)).await?;
        assert_eq!(out.tip, Some(next.number), "depth {depth}");

        assert_branch_replaced(&env, asset.token, a1, a2, depth).await?;
    }
    Ok(())
}

/// The chain shrank (reverted to a snapshot) and grew one block: the announced head is
/// below the stored tip. The round reads the tip by number, finds it gone, rolls back to
/// the common ancestor and ingests the announced block.
#[tokio::test]
async fn a_head_below_the_tip_after_the_chain_shrank_rolls_back_to_the_ancestor()
-> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("SHRINK").await?;
    let (a0, a1) = (env.chain.account(0)?, env.chain.account(1)?);
    env.mint(asset.token, a0, 10).await?;
    let p = env.chain.provider();
    let snapshot = p.anvil_snapshot().await?;
    env.transfer(asset.token, a1, 3).await?;
    env.chain.mine().await?;
    env.chain.mine().await?;
    let (ingest, _proxy) = counted_owner(&env, "shrink").await?;
    catch_up(&ingest).await?;
    let old_tip = env.chain.block_number().await?;
    assert_eq!(
        read::balance(env.db.pool(), env.chain_id, asset.token, a1).await?,
        "3"
    );

    assert!(p.anvil_revert(snapshot).await?);
    env.transfer(asset.token, a1, 4).await?;
    let head = head_at(&env, env.chain.block_number().await?).await?;
    assert!(head.number < old_tip);
    let out = ingest.round_at(Some(head)).await?;
    assert!(out.reorgs >= 1, "{out:?}");
    assert_eq!(out.tip, Some(head.number));
    assert_eq!(
        read::balance(env.db.pool(), env.chain_id, asset.token, a1).await?,
        "4"
    );
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

/// The node's `finalized` block is read by a committing round only once the head moved
/// `finalized_refresh_blocks` since the last read (Anvil: finalized = head − 64); in
/// between the recorded height stays (a lower bound), and a catch-up that spans more
/// blocks reads it at once.
#[tokio::test]
async fn the_finalized_block_is_read_again_every_refresh_blocks() -> anyhow::Result<()> {
    let env = env().await?;
    let p = env.chain.provider();
    p.anvil_mine(Some(70), None).await?;
    let ingest = env
        .owner(
            keel_index::TipConfig {
                finalized_refresh_blocks: 4,
                ..config(64)
            },
            "finalized",
        )
        .await?;
    catch_up(&ingest).await?;
    let first = env.chain.block_number().await? - 64;
    let recorded = || read::finalized_block(env.db.pool(), env.chain_id);
    assert_eq!(recorded().await?, Some(first));

    // Three blocks, one round each: not due, the recorded height stays.
    for _ in 0..3 {
        env.chain.mine().await?;
        catch_up(&ingest).await?;
        assert_eq!(recorded().await?, Some(first));
    }
    // The fourth: due, read again.
    env.chain.mine().await?;
    catch_up(&ingest).await?;
    assert_eq!(recorded().await?, Some(first + 4));

    // A catch-up over ten blocks reads it at its first commit.
    p.anvil_mine(Some(10), None).await?;
    catch_up(&ingest).await?;
    assert_eq!(
        recorded().await?,
        Some(env.chain.block_number().await? - 64)
    );
    Ok(())
}
