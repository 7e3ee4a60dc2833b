//! An operator's re-index (issue 32 §2) while the indexer's services run: a degraded
//! chain (a reorg below recorded finality, then an operator's `TRUNCATE` that left
//! balances stale) and a healthy chain re-indexed from a block are rebuilt by the
//! running services to exactly a fresh index of the chain, balances equal `balanceOf`,
//! the degraded marker is cleared and reads say `rebuilding` meanwhile.

use crate::common::{Env, env, fingerprint, reindex as reference};
use crate::reorg::transfer_request;
use alloy::primitives::{Address, U256};
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::keel_abi::bindings::AssetToken;
use keel_index::{HistoryConfig, HistoryWorker, TipConfig, follow_tip, read, work_history};
use keel_store::testing::until;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const POLL: Duration = Duration::from_millis(50);
/// How long a rebuild or a degraded verdict may take to show.
const WITHIN: Duration = Duration::from_secs(90);

/// The indexer role's two loops for the chain, stopped by `stop`.
fn start_indexer(env: &Env, stop: &CancellationToken) -> anyhow::Result<()> {
    let db = env.db.pool().clone();
    let config = TipConfig {
        hash_window: 8,
        finalized_refresh_blocks: 1,
        ..TipConfig::new(4)
    };
    tokio::spawn({
        let (db, node, stop) = (db.clone(), env.node.clone(), stop.clone());
        async move { follow_tip(db, node, config, 4, "indexer", POLL, stop).await }
    });
    let worker = Arc::new(HistoryWorker::new(
        db,
        env.node.clone(),
        "indexer/history",
        HistoryConfig::default(),
    )?);
    let (serving_tx, serving) = tokio::sync::watch::channel(true);
    let stop2 = stop.clone();
    tokio::spawn(async move {
        work_history(worker, serving, POLL, stop2).await;
        drop(serving_tx);
    });
    Ok(())
}

/// The chain rebuilt: not rebuilding any more, the tip at the head.
async fn until_rebuilt(env: &Env) -> anyhow::Result<()> {
    let head = env.chain.block_number().await?;
    until("the rebuild", WITHIN, || async {
        let h = read::chain_health(env.db.pool(), env.chain_id).await?;
        anyhow::Ok(!h.is_rebuilding() && h.tip.is_some_and(|t| t.number >= head))
    })
    .await;
    Ok(())
}

async fn assert_exact(env: &Env, token: Address, holders: &[Address]) -> anyhow::Result<()> {
    let health = read::chain_health(env.db.pool(), env.chain_id).await?;
    assert!(!health.is_degraded(), "{health:?}");
    let t = AssetToken::new(token, env.chain.provider().clone());
    for h in holders {
        let on_chain: U256 = t.balanceOf(*h).call().await?;
        assert_eq!(
            read::balance(env.db.pool(), env.chain_id, token, *h).await?,
            on_chain.to_string(),
            "balance of {h}"
        );
    }
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reference(env).await?
    );
    Ok(())
}

#[tokio::test]
async fn a_degraded_chain_is_rebuilt_exactly_by_a_reindex_while_the_indexer_runs()
-> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("REIDX").await?;
    let (a0, a1, a2, a3) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
        env.chain.account(3)?,
    );
    env.mint(asset.token, a0, 10_000).await?;
    env.chain.provider().anvil_mine(Some(10), None).await?;
    env.transfer(asset.token, a1, 5).await?;
    let x = env.chain.block_number().await?;
    env.chain.provider().anvil_mine(Some(80), None).await?;

    let stop = CancellationToken::new();
    let _stop_guard = stop.clone().drop_guard();
    start_indexer(&env, &stop)?;
    let head = env.chain.block_number().await?;
    read::wait_for_block(
        env.db.pool(),
        env.chain_id,
        head,
        Duration::from_secs(60),
        POLL,
    )
    .await?;

    // A reorg below the block Keel recorded as final: the running indexer marks the
    // chain degraded and holds it.
    let p = env.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: head - x + 1,
        tx_block_pairs: vec![(transfer_request(asset.token, a0, a2, 9, p), 0)],
    })
    .await?;
    until("degraded", WITHIN, || async {
        anyhow::Ok(
            read::chain_health(env.db.pool(), env.chain_id)
                .await?
                .is_degraded(),
        )
    })
    .await;
    // An operator's attempt by hand: TRUNCATE fires no trigger, balances stay stale.
    sqlx::query("TRUNCATE index_transfer")
        .execute(env.db.pool())
        .await?;

    let done = keel_index::reindex(env.db.pool(), env.chain_id, None, "test").await?;
    assert!(done.was_degraded);
    assert_eq!(done.from_block, 0);
    let health = read::chain_health(env.db.pool(), env.chain_id).await?;
    assert!(!health.is_degraded(), "the marker is cleared: {health:?}");
    assert!(health.is_rebuilding(), "reads say rebuilding: {health:?}");

    // The chain moves on during the rebuild.
    env.transfer(asset.token, a3, 2).await?;
    until_rebuilt(&env).await?;
    assert_exact(&env, asset.token, &[a0, a1, a2, a3]).await
}

#[tokio::test]
async fn a_reindex_from_a_block_fences_the_live_owner_and_rebuilds_exactly() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("LIVE").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 10_000).await?;
    env.chain.provider().anvil_mine(Some(70), None).await?;
    env.transfer(asset.token, a1, 3).await?;
    let from = env.chain.block_number().await?;
    env.transfer(asset.token, a2, 4).await?;
    env.chain.provider().anvil_mine(Some(5), None).await?;

    let stop = CancellationToken::new();
    let _stop_guard = stop.clone().drop_guard();
    start_indexer(&env, &stop)?;
    let head = env.chain.block_number().await?;
    read::wait_for_block(
        env.db.pool(),
        env.chain_id,
        head,
        Duration::from_secs(60),
        POLL,
    )
    .await?;
    let live_epoch: i64 =
        sqlx::query_scalar("SELECT owner_epoch FROM index_chain WHERE chain_id = $1")
            .bind(env.chain_id.get() as i64)
            .fetch_one(env.db.pool())
            .await?;

    let done = keel_index::reindex(env.db.pool(), env.chain_id, Some(from), "test").await?;
    assert!(!done.was_degraded);
    assert!(done.epoch > live_epoch);
    assert!(
        read::chain_health(env.db.pool(), env.chain_id)
            .await?
            .is_rebuilding()
    );
    // Rows below the first block stay; the ones at and above it are gone until rebuilt.
    assert_eq!(
        read::balance(env.db.pool(), env.chain_id, asset.token, a1).await?,
        "0"
    );
    env.transfer(asset.token, a1, 1).await?;
    until_rebuilt(&env).await?;
    // The fenced owner started over: a newer epoch than the re-index's holds the chain.
    let epoch: i64 = sqlx::query_scalar("SELECT owner_epoch FROM index_chain WHERE chain_id = $1")
        .bind(env.chain_id.get() as i64)
        .fetch_one(env.db.pool())
        .await?;
    assert!(epoch > done.epoch, "{epoch} > {}", done.epoch);
    assert_exact(&env, asset.token, &[a0, a1, a2]).await
}
