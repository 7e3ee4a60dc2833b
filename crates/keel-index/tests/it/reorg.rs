//! Reorgs at the tip: derived rows of orphaned blocks are rolled back and the new
//! branch is ingested; the result equals a fresh re-index.

use crate::common::{Env, catch_up, config, env, env_on, fingerprint, reindex};
use alloy::network::TransactionBuilder;
use alloy::primitives::U256;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::{ReorgOptions, TransactionData};
use anvil_tests::keel_abi::bindings::AssetToken;
use keel_index::{IndexError, TipConfig, read};

pub(crate) fn transfer_request(
    token: alloy::primitives::Address,
    from: alloy::primitives::Address,
    to: alloy::primitives::Address,
    amount: u64,
    provider: &alloy::providers::DynProvider,
) -> TransactionData {
    let instance = AssetToken::new(token, provider.clone());
    let req = instance
        .transfer(to, U256::from(amount))
        .into_transaction_request()
        .with_from(from)
        .with_gas_limit(200_000);
    TransactionData::JSON(req)
}

/// After a reorg of `depth` blocks that replaced a transfer to `orphaned` by one of
/// `100 + depth` to `replacement`: the orphaned transfer is gone, the replacement is
/// there, and the index equals a fresh re-index.
pub(crate) async fn assert_branch_replaced(
    env: &Env,
    token: alloy::primitives::Address,
    orphaned: alloy::primitives::Address,
    replacement: alloy::primitives::Address,
    depth: u64,
) -> anyhow::Result<()> {
    let t = read::transfers(env.db.pool(), env.chain_id, Some(token)).await?;
    assert!(
        !t.iter().any(|t| t.to == orphaned),
        "depth {depth}: orphaned transfer kept: {t:?}"
    );
    assert!(
        t.iter()
            .any(|t| t.to == replacement && t.value == (100 + depth).to_string()),
        "depth {depth}: replacement transfer missing: {t:?}"
    );
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(env).await?,
        "depth {depth}"
    );
    Ok(())
}

#[tokio::test]
async fn anvil_reorg_rolls_back_orphaned_transfers_and_ingests_the_new_branch() -> anyhow::Result<()>
{
    let env = env().await?;
    let asset = env.mintable("REORG").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 1_000).await?;
    let ingest = env.owner(config(64), "a").await?;

    for depth in 1..=5u64 {
        // A transfer to a1 in the block `depth` below the head + empty blocks above it.
        env.transfer(asset.token, a1, depth).await?;
        for _ in 1..depth {
            env.chain.mine().await?;
        }
        catch_up(&ingest).await?;
        let orphan_count = read::transfers(env.db.pool(), env.chain_id, Some(asset.token))
            .await?
            .iter()
            .filter(|t| t.to == a1)
            .count();
        assert_eq!(orphan_count, 1, "depth {depth}");

        // Replace the last `depth` blocks: the a1 transfer is gone, a2 gets one instead,
        // placed in the newest replacement block (a previously empty block gains a log).
        let p = env.chain.provider();
        p.anvil_reorg(ReorgOptions {
            depth,
            tx_block_pairs: vec![(
                transfer_request(asset.token, a0, a2, 100 + depth, p),
                depth - 1,
            )],
        })
        .await?;
        let reorgs = catch_up(&ingest).await?;
        assert!(reorgs >= 1, "depth {depth}: no reorg detected");

        assert_branch_replaced(&env, asset.token, a1, a2, depth).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_reorg_while_no_owner_ran_is_rolled_back_by_the_next_owner() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("DOWN").await?;
    let (a0, a1) = (env.chain.account(0)?, env.chain.account(1)?);
    let p = env.chain.provider();
    let snapshot = p.anvil_snapshot().await?;
    env.mint(asset.token, a0, 10).await?;
    env.transfer(asset.token, a1, 3).await?;
    {
        let first = env.owner(config(64), "first").await?;
        catch_up(&first).await?;
        assert_eq!(
            read::balance(env.db.pool(), env.chain_id, asset.token, a1).await?,
            "3"
        );
    } // the first owner stops

    assert!(p.anvil_revert(snapshot).await?);
    env.mint(asset.token, a0, 20).await?;
    for _ in 0..3 {
        env.chain.mine().await?;
    }
    let second = env.owner(config(64), "second").await?;
    let reorgs = catch_up(&second).await?;
    assert!(reorgs >= 1);
    let pool = env.db.pool();
    assert_eq!(
        read::balance(pool, env.chain_id, asset.token, a1).await?,
        "0"
    );
    assert_eq!(
        read::balance(pool, env.chain_id, asset.token, a0).await?,
        "20"
    );
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

/// With `--slots-in-an-epoch 1` Anvil's `finalized` is head − 2: a reorg of 5 blocks
/// replaces finalized blocks. The round fails once with the typed fatal error, the chain
/// is marked degraded (readable through `read::chain_health`), nothing is rolled back
/// or written, and later rounds (this owner's or a new owner's) write nothing either.
#[tokio::test]
async fn a_reorg_below_the_finalized_block_marks_the_chain_degraded_and_stops_ingest()
-> anyhow::Result<()> {
    use keel_index::{FollowBackoff, NextRound};
    let chain = anvil_tests::TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await?;
    let env = env_on(chain).await?;
    let asset = env.mintable("FINAL").await?;
    let a0 = env.chain.account(0)?;
    env.mint(asset.token, a0, 5).await?;
    for _ in 0..5 {
        env.chain.mine().await?;
    }
    let cfg = TipConfig {
        hash_window: 3,
        ..config(3)
    };
    let ingest = env.owner(cfg.clone(), "a").await?;
    catch_up(&ingest).await?;
    assert!(
        !read::chain_health(env.db.pool(), env.chain_id)
            .await?
            .is_degraded()
    );
    let before = fingerprint(&env.db, env.chain_id, &env.deployed).await?;
    let tip = read::indexed_tip(env.db.pool(), env.chain_id).await?;

    env.chain
        .provider()
        .anvil_reorg(ReorgOptions {
            depth: 5,
            tx_block_pairs: vec![],
        })
        .await?;
    let result = ingest.round().await;
    let err = result.as_ref().unwrap_err();
    assert!(matches!(err, IndexError::ReorgTooDeep { .. }), "{err}");
    assert!(err.is_fatal());
    let mut pace = FollowBackoff::new(env.chain_id, std::time::Duration::from_millis(100));
    assert_eq!(pace.after(&result), NextRound::Halt);

    let health = read::chain_health(env.db.pool(), env.chain_id).await?;
    let degraded = health.degraded.expect("the chain is marked degraded");
    assert_eq!(degraded.at_block, tip.map(|t| t.number));
    assert_eq!(
        read::degraded_chains(env.db.pool())
            .await?
            .iter()
            .map(|h| h.chain)
            .collect::<Vec<_>>(),
        vec![env.chain_id]
    );
    assert!(
        keel_index::tip::publish_health(env.db.pool(), env.chain_id)
            .await?
            .is_degraded()
    );

    // Stopped once: later rounds, and a new owner's, fail as degraded and write nothing.
    env.chain.mine().await?;
    let again = ingest.round().await.unwrap_err();
    assert!(matches!(again, IndexError::Degraded { .. }), "{again}");
    let next_owner = env.owner(cfg, "b").await?;
    let other = next_owner.round().await.unwrap_err();
    assert!(matches!(other, IndexError::Degraded { .. }), "{other}");
    assert!(other.is_fatal());
    assert_eq!(
        before,
        fingerprint(&env.db, env.chain_id, &env.deployed).await?
    );
    assert_eq!(tip, read::indexed_tip(env.db.pool(), env.chain_id).await?);
    Ok(())
}

#[tokio::test]
async fn get_logs_for_a_block_reorged_away_mid_round_converges() -> anyhow::Result<()> {
    use anvil_tests::proxy::{RpcProxy, Rule};
    use keel_chain::{UpstreamConfig, UpstreamPool};
    use std::sync::Arc;
    use std::time::Duration;

    let env = env().await?;
    let asset = env.mintable("SIGNAL").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 100).await?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    let node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let ingest =
        keel_index::TipIngest::take_ownership(env.db.pool().clone(), node, config(64), "a").await?;
    catch_up(&ingest).await?;

    // Block N holds a transfer to a1. The next getLogs (by N's hash) reaches the node
    // late: meanwhile N is replaced by a block with a transfer to a2, so the node is
    // asked for the logs of a block that is no longer canonical.
    env.transfer(asset.token, a1, 1).await?;
    let before = proxy.count("eth_getLogs");
    proxy.add_rule(Rule::latency("eth_getLogs", Duration::from_millis(1_500)).times(1));
    let round = tokio::spawn({
        let ingest = ingest.clone();
        async move { ingest.round().await }
    });
    // Reorg only once the round is inside the slow getLogs of block N.
    while proxy.count("eth_getLogs") == before {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let p = env.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: 1,
        tx_block_pairs: vec![(transfer_request(asset.token, a0, a2, 2, p), 0)],
    })
    .await?;
    let out = round.await??;
    println!("round across the reorg: {out:?}");
    // Whatever the node answered for the orphaned hash (an error: a reorg signal; an
    // empty list: the tip check of the next round), the index converges.
    catch_up(&ingest).await?;
    let t = read::transfers(env.db.pool(), env.chain_id, Some(asset.token)).await?;
    assert!(!t.iter().any(|t| t.to == a1), "{t:?}");
    assert!(t.iter().any(|t| t.to == a2), "{t:?}");
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}
