//! Reorgs on both sides of the hash window and of the finality Keel recorded (issue 32
//! §1): above recorded finality they are repaired exactly (transfers equal a fresh
//! re-index, balances equal `balanceOf` on chain), whatever the window; at or below it
//! the chain is marked degraded instead of silently accepted; an owner killed in the
//! middle of a repair leaves an index the next owner completes exactly.

use crate::common::{Env, catch_up, config, env, fingerprint, reindex};
use crate::reorg::transfer_request;
use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::keel_abi::bindings::AssetToken;
use keel_index::{IndexError, TipConfig, read};

/// A window of 8 blocks, far shallower than Anvil's finality (head − 64); the node's
/// `finalized` block read every round, so Keel records finality as it moves.
fn shallow_window() -> TipConfig {
    TipConfig {
        hash_window: 8,
        finalized_refresh_blocks: 1,
        ..config(4)
    }
}

/// Every account's indexed balance equals `balanceOf` on chain.
async fn assert_balances_match_chain(
    env: &Env,
    token: Address,
    holders: &[Address],
    what: &str,
) -> anyhow::Result<()> {
    let t = AssetToken::new(token, env.chain.provider().clone());
    for h in holders {
        let on_chain: U256 = t.balanceOf(*h).call().await?;
        let indexed = read::balance(env.db.pool(), env.chain_id, token, *h).await?;
        assert_eq!(indexed, on_chain.to_string(), "{what}: balance of {h}");
    }
    Ok(())
}

/// The index after a repair: the orphaned transfer gone, the replacement there, every
/// balance as on chain, the whole index equal to a fresh re-index, not degraded.
async fn assert_exact(
    env: &Env,
    token: Address,
    orphaned: Address,
    replacement: Address,
    what: &str,
) -> anyhow::Result<()> {
    let health = read::chain_health(env.db.pool(), env.chain_id).await?;
    assert!(!health.is_degraded(), "{what}: {health:?}");
    let t = read::transfers(env.db.pool(), env.chain_id, Some(token)).await?;
    assert!(
        !t.iter().any(|t| t.to == orphaned),
        "{what}: orphaned transfer kept"
    );
    assert!(
        t.iter().any(|t| t.to == replacement),
        "{what}: replacement transfer missing"
    );
    let a0 = env.chain.account(0)?;
    assert_balances_match_chain(env, token, &[a0, orphaned, replacement], what).await?;
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(env).await?,
        "{what}"
    );
    Ok(())
}

async fn mine(env: &Env, blocks: u64) -> anyhow::Result<()> {
    env.chain.provider().anvil_mine(Some(blocks), None).await?;
    Ok(())
}

/// Depth 3 (inside the 8-block window) and depth 20 (below the window, above Anvil's
/// finality and above what Keel recorded as final): both repaired exactly.
#[tokio::test]
async fn reorgs_above_recorded_finality_are_repaired_exactly_on_both_sides_of_the_window()
-> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("WIN").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 10_000).await?;
    let ingest = env.owner(shallow_window(), "a").await?;
    for depth in [3u64, 20] {
        env.transfer(asset.token, a1, depth).await?;
        mine(&env, depth - 1).await?;
        catch_up(&ingest).await?;
        assert_eq!(
            read::balance(env.db.pool(), env.chain_id, asset.token, a1).await?,
            depth.to_string()
        );
        let p = env.chain.provider();
        p.anvil_reorg(ReorgOptions {
            depth,
            tx_block_pairs: vec![(transfer_request(asset.token, a0, a2, 100 + depth, p), 0)],
        })
        .await?;
        let reorgs = catch_up(&ingest).await?;
        assert!(reorgs >= 1, "depth {depth}: no reorg detected");
        assert_exact(&env, asset.token, a1, a2, &format!("depth {depth}")).await?;
    }
    Ok(())
}

/// Sets up the chain of the "stopped while the chain moved" case: a transfer to a1 in
/// block X, 20 blocks above it, an index caught up to X + 20 with a shallow window
/// (Keel records finality at about X − 44), then the chain moves 70 blocks without the
/// indexer (the node's `finalized` passes Keel's tip) and a reorg replaces everything
/// from X up, X holding a transfer to a2 instead. Returns (token, a1, a2, Keel's tip).
async fn fork_below_the_nodes_finality(
    env: &Env,
) -> anyhow::Result<(Address, Address, Address, u64)> {
    let asset = env.mintable("MOVED").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 10_000).await?;
    mine(env, 70).await?;
    env.transfer(asset.token, a1, 7).await?;
    let x = env.chain.block_number().await?;
    mine(env, 20).await?;
    {
        let first = env.owner(shallow_window(), "first").await?;
        catch_up(&first).await?;
    } // the indexer stops
    let tip = read::indexed_tip(env.db.pool(), env.chain_id)
        .await?
        .map(|t| t.number)
        .unwrap_or_default();
    let recorded: Option<i64> =
        sqlx::query_scalar("SELECT finalized_number FROM index_chain WHERE chain_id = $1")
            .bind(env.chain_id.get() as i64)
            .fetch_one(env.db.pool())
            .await?;
    assert!(
        recorded.is_some_and(|f| (f as u64) < x),
        "Keel recorded finality {recorded:?} below the fork at {x}"
    );
    mine(env, 70).await?;
    let head = env.chain.block_number().await?;
    let p = env.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: head - x + 1,
        tx_block_pairs: vec![(transfer_request(asset.token, a0, a2, 11, p), 0)],
    })
    .await?;
    let finalized = p
        .get_block_by_number(alloy::eips::BlockNumberOrTag::Finalized)
        .await?
        .map(|b| b.header.number)
        .unwrap_or_default();
    assert!(
        finalized > tip,
        "the node's finalized block {finalized} is above Keel's tip {tip}"
    );
    Ok((asset.token, a1, a2, tip))
}

/// The case turned around: the fork is below the window and below the node's
/// *current* `finalized` block (which is on the new branch), but above everything Keel
/// recorded as final. The next owner walks its stored hashes down to the true common
/// ancestor and repairs exactly, instead of trusting the node's finalized block (which
/// marked the chain degraded here, or rolled back onto the new branch).
#[tokio::test]
async fn a_fork_below_the_nodes_finalized_block_but_above_recorded_finality_is_repaired_exactly()
-> anyhow::Result<()> {
    let env = env().await?;
    let (token, a1, a2, _) = fork_below_the_nodes_finality(&env).await?;
    let second = env.owner(shallow_window(), "second").await?;
    let reorgs = catch_up(&second).await?;
    assert!(reorgs >= 1, "no reorg detected");
    assert_exact(&env, token, a1, a2, "fork below the node's finality").await
}

/// The same repair with its owner killed (task aborted) once the rollback committed and
/// the re-ingest is under way: a new owner (new epoch) completes it exactly.
#[tokio::test]
async fn an_owner_killed_mid_repair_leaves_an_index_the_next_owner_completes_exactly()
-> anyhow::Result<()> {
    let env = env().await?;
    let (token, a1, a2, tip) = fork_below_the_nodes_finality(&env).await?;
    let slow = TipConfig {
        max_blocks_per_round: 2,
        ..shallow_window()
    };
    let repairing = env.owner(slow, "repairing").await?;
    let task = tokio::spawn(async move {
        loop {
            if let Err(e) = repairing.round().await {
                break e;
            }
        }
    });
    // The rollback committed (the checkpoint moved below the old tip) and at least one
    // block was re-ingested above the ancestor: kill the owner there.
    let rolled_back = loop {
        let now = read::indexed_tip(env.db.pool(), env.chain_id)
            .await?
            .map(|t| t.number);
        if let Some(n) = now.filter(|n| *n < tip) {
            break n;
        }
        assert!(!task.is_finished(), "the repairing owner stopped: {task:?}");
        tokio::task::yield_now().await;
    };
    task.abort();
    let _ = task.await;
    let at_kill = read::indexed_tip(env.db.pool(), env.chain_id)
        .await?
        .map(|t| t.number)
        .unwrap_or_default();
    assert!(
        at_kill < tip,
        "killed mid-repair ({rolled_back} .. {at_kill} < {tip})"
    );

    let next = env.owner(shallow_window(), "next").await?;
    catch_up(&next).await?;
    assert_exact(&env, token, a1, a2, "after a kill mid-repair").await
}

/// A reorg replacing a block at or below the block Keel recorded as finalized (the
/// issue's input: depth 70 under Anvil's head − 64 finality) marks the chain degraded
/// instead of rolling back onto the node's current finalized block. Checked with the
/// shallow window (no stored block is canonical) and with a window deep enough to hold
/// the common ancestor (found, but below recorded finality).
#[tokio::test]
async fn a_reorg_below_recorded_finality_marks_the_chain_degraded_whatever_the_window()
-> anyhow::Result<()> {
    for window in [8u64, 120] {
        let env = env().await?;
        let asset = env.mintable("FINAL").await?;
        let (a0, a1, a2) = (
            env.chain.account(0)?,
            env.chain.account(1)?,
            env.chain.account(2)?,
        );
        env.mint(asset.token, a0, 10_000).await?;
        mine(&env, 10).await?;
        env.transfer(asset.token, a1, 5).await?;
        let x = env.chain.block_number().await?;
        mine(&env, 80).await?;
        let cfg = TipConfig {
            hash_window: window,
            ..shallow_window()
        };
        let ingest = env.owner(cfg.clone(), "a").await?;
        catch_up(&ingest).await?;
        let head = env.chain.block_number().await?;
        let recorded: Option<i64> =
            sqlx::query_scalar("SELECT finalized_number FROM index_chain WHERE chain_id = $1")
                .bind(env.chain_id.get() as i64)
                .fetch_one(env.db.pool())
                .await?;
        assert!(
            recorded.is_some_and(|f| f as u64 >= x),
            "window {window}: Keel recorded {recorded:?} as final, at or above block {x}"
        );
        let before = fingerprint(&env.db, env.chain_id, &env.deployed).await?;
        let p = env.chain.provider();
        p.anvil_reorg(ReorgOptions {
            depth: head - x + 1,
            tx_block_pairs: vec![(transfer_request(asset.token, a0, a2, 9, p), 0)],
        })
        .await?;
        let err = ingest.round().await.unwrap_err();
        assert!(
            matches!(err, IndexError::ReorgTooDeep { .. }),
            "window {window}: {err}"
        );
        let health = read::chain_health(env.db.pool(), env.chain_id).await?;
        assert!(health.is_degraded(), "window {window}: {health:?}");
        // Nothing was rolled back or written: the rows stay as they were until an
        // operator re-indexes, and reads say the chain is degraded.
        assert_eq!(
            before,
            fingerprint(&env.db, env.chain_id, &env.deployed).await?,
            "window {window}"
        );
        let again = env.owner(cfg, "b").await?.round().await.unwrap_err();
        assert!(
            matches!(again, IndexError::Degraded { .. }),
            "window {window}: {again}"
        );
    }
    Ok(())
}

/// A chain whose finality is set as a depth (`TipConfig::finalized_tag` off,
/// `chains.<name>.indexFinalityDepth`): the block `finality_depth` below the head is
/// recorded as final although the node's `finalized` tag (Anvil: head − 64) is far
/// lower, so the same depth-5 reorg is repaired exactly on a chain that follows the tag
/// and marks a depth-3 chain degraded.
#[tokio::test]
async fn a_finality_depth_in_place_of_the_nodes_tag_decides_which_reorgs_are_too_deep()
-> anyhow::Result<()> {
    for finalized_tag in [true, false] {
        let env = env().await?;
        let asset = env.mintable("DEPTH").await?;
        let (a0, a1, a2) = (
            env.chain.account(0)?,
            env.chain.account(1)?,
            env.chain.account(2)?,
        );
        env.mint(asset.token, a0, 10_000).await?;
        env.transfer(asset.token, a1, 5).await?;
        mine(&env, 10).await?;
        let cfg = TipConfig {
            finalized_tag,
            ..TipConfig {
                finalized_refresh_blocks: 1,
                ..config(3)
            }
        };
        let ingest = env.owner(cfg, "a").await?;
        catch_up(&ingest).await?;
        let head = env.chain.block_number().await?;
        let recorded: Option<i64> =
            sqlx::query_scalar("SELECT finalized_number FROM index_chain WHERE chain_id = $1")
                .bind(env.chain_id.get() as i64)
                .fetch_one(env.db.pool())
                .await?;
        let recorded = recorded.map(|f| f as u64);
        if finalized_tag {
            assert!(
                recorded.unwrap_or(0) <= head.saturating_sub(64),
                "the tag: head {head}, recorded {recorded:?}"
            );
        } else {
            assert_eq!(recorded, Some(head - 3), "depth 3 below head {head}");
        }
        let p = env.chain.provider();
        p.anvil_reorg(ReorgOptions {
            depth: 5,
            tx_block_pairs: vec![(transfer_request(asset.token, a0, a2, 9, p), 0)],
        })
        .await?;
        let outcome = catch_up(&ingest).await;
        let health = read::chain_health(env.db.pool(), env.chain_id).await?;
        if finalized_tag {
            outcome?;
            assert!(!health.is_degraded(), "{health:?}");
            let t = read::transfers(env.db.pool(), env.chain_id, Some(asset.token)).await?;
            assert!(t.iter().any(|t| t.to == a2), "the reorg's transfer indexed");
            assert_balances_match_chain(&env, asset.token, &[a0, a1, a2], "tag").await?;
        } else {
            assert!(
                outcome.is_err(),
                "a reorg below depth-3 finality is refused"
            );
            assert!(health.is_degraded(), "{health:?}");
        }
    }
    Ok(())
}
