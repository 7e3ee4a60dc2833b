//! Head watching between tip rounds.

use crate::common::{catch_up, config, env};
use std::time::Duration;

#[tokio::test]
async fn wait_for_new_head_returns_on_a_new_block_or_after_the_poll_interval() -> anyhow::Result<()>
{
    let env = env().await?;
    let tip = env.owner(config(64), "tip").await?;
    catch_up(&tip).await?;
    let indexed = keel_index::read::indexed_tip(env.db.pool(), env.chain_id)
        .await?
        .map(|t| t.number);

    // No new block: returns the unchanged head once `max_wait` is over.
    let head = tip
        .wait_for_new_head(
            indexed,
            Duration::from_millis(300),
            Duration::from_millis(10),
        )
        .await?;
    assert_eq!(Some(head), indexed);

    // A new block: returns its height instead of waiting out `max_wait` (an hour here;
    // the outer timeout only turns a hang into a failure), and the next round ingests it.
    env.chain.mine().await?;
    let head = tokio::time::timeout(
        Duration::from_secs(60),
        tip.wait_for_new_head(
            indexed,
            Duration::from_secs(3600),
            Duration::from_millis(10),
        ),
    )
    .await??;
    assert!(Some(head) > indexed);
    let out = tip.round().await?;
    assert_eq!(out.tip, Some(head));
    Ok(())
}

/// The node reports a head 5 blocks above a block it answers `null` for (the hole
/// Anvil leaves while a reorg races automining): every round stops at the hole and says
/// so, the follow pacing backs off exponentially up to its hole cap (1 s: below the
/// 2 s cap of errors) instead of running rounds again at once, and each round costs a bounded number of requests. Once the block
/// exists, the next round makes progress and the backoff resets.
#[tokio::test]
async fn a_head_above_a_block_the_node_has_no_header_for_backs_off_instead_of_spinning()
-> anyhow::Result<()> {
    use anvil_tests::proxy::{RpcProxy, Rule};
    use keel_chain::{UpstreamConfig, UpstreamPool};
    use keel_index::{FollowBackoff, NextRound, TipIngest};
    use std::sync::Arc;

    let env = env().await?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    let node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let ingest = TipIngest::take_ownership(env.db.pool().clone(), node, config(64), "a").await?;
    catch_up(&ingest).await?;
    let head = env.chain.block_number().await?;
    proxy.add_rule(Rule::result(
        "eth_blockNumber",
        serde_json::json!(format!("0x{:x}", head + 5)),
    ));
    proxy.reset_counts();

    let poll = Duration::from_millis(500);
    let mut pace = FollowBackoff::new(env.chain_id, poll)
        .with_backoff(Duration::from_millis(100), Duration::from_secs(2));
    let mut waits = Vec::new();
    let rounds = 8;
    for _ in 0..rounds {
        let result = ingest.round().await;
        let out = result.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        // The situation a loop running rounds "while tip < head" spins on.
        assert_eq!(out.tip, Some(head));
        assert_eq!(out.head, head + 5);
        assert_eq!(out.missing, Some(head + 1));
        match pace.after(&result) {
            NextRound::Wait(d) => waits.push(d.as_millis()),
            other => panic!("a round stopped at a missing block must back off: {other:?}"),
        }
    }
    assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000, 1_000, 1_000]);
    assert_eq!(pace.failures(), rounds);
    // One header for the stored tip, one for the missing block, per round.
    assert!(
        proxy.count("eth_getBlockByNumber") <= 2 * u64::from(rounds),
        "{} header requests for {rounds} rounds",
        proxy.count("eth_getBlockByNumber")
    );

    proxy.clear_rules();
    env.chain.mine().await?;
    let result = ingest.round().await;
    let out = result.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!((out.tip, out.missing), (Some(head + 1), None));
    assert_eq!(pace.after(&result), NextRound::Wait(poll));
    assert_eq!(pace.failures(), 0);
    Ok(())
}

/// Issue 32 §8: a node hole (a block answered `null` under the reported head) backs
/// off at most [`keel_index::tip::DEFAULT_HOLE_BACKOFF_CAP`] however long it lasts, so
/// catch-up starts within that of the hole closing (it grew to 30 s before); failed
/// rounds still back off to the longer cap; a round with progress resets both.
#[test]
fn a_node_hole_backs_off_at_most_the_hole_cap_however_long_it_lasts() {
    use keel_index::tip::{DEFAULT_BACKOFF_CAP, DEFAULT_HOLE_BACKOFF_CAP};
    use keel_index::{FollowBackoff, IndexError, NextRound, RoundOutcome};
    let chain = keel_units::ChainId(1);
    let mut pace = FollowBackoff::new(chain, Duration::from_secs(5));
    let hole = Ok(RoundOutcome {
        head: 100,
        tip: Some(50),
        missing: Some(51),
        ..RoundOutcome::default()
    });
    // 15 s of holes at the grown backoff is far more than 30 rounds.
    let waits: Vec<Duration> = (0..30)
        .map(|_| match pace.after(&hole) {
            NextRound::Wait(d) => d,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        waits.iter().all(|d| *d <= DEFAULT_HOLE_BACKOFF_CAP),
        "{waits:?}"
    );
    assert_eq!(waits.last(), Some(&DEFAULT_HOLE_BACKOFF_CAP));
    // Progress resets the backoff.
    let progress = Ok(RoundOutcome {
        head: 100,
        tip: Some(60),
        blocks: 10,
        ..RoundOutcome::default()
    });
    assert_eq!(pace.after(&progress), NextRound::Now);
    assert_eq!(pace.failures(), 0);
    // Errors keep their longer cap.
    let failed: keel_index::Result<RoundOutcome> = Err(IndexError::Interrupted);
    let last = (0..30)
        .map(|_| match pace.after(&failed) {
            NextRound::Wait(d) => d,
            other => panic!("{other:?}"),
        })
        .last();
    assert_eq!(last, Some(DEFAULT_BACKOFF_CAP));
}

/// A node that answers `null` for the stored tip's header (and every other block) while
/// reporting its head is a hole, not a proof of a reorg: the round says so
/// (`missing`), nothing is rolled back or marked degraded (before, the search treated
/// every missing header as replaced and marked the chain degraded), the pacing backs off
/// at most the hole cap, and once the node answers again the round goes on.
#[tokio::test]
async fn a_null_header_at_the_stored_tip_is_a_hole_not_a_reorg() -> anyhow::Result<()> {
    use anvil_tests::proxy::{RpcProxy, Rule};
    use keel_chain::{UpstreamConfig, UpstreamPool};
    use keel_index::tip::DEFAULT_HOLE_BACKOFF_CAP;
    use keel_index::{FollowBackoff, NextRound, TipIngest, read};
    use std::sync::Arc;

    let env = env().await?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    let node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let ingest = TipIngest::take_ownership(env.db.pool().clone(), node, config(64), "a").await?;
    catch_up(&ingest).await?;
    let tip = read::indexed_tip(env.db.pool(), env.chain_id).await?;
    let before = crate::common::fingerprint(&env.db, env.chain_id, &env.deployed).await?;
    env.chain.mine().await?;
    proxy.add_rule(Rule::result(
        "eth_getBlockByNumber",
        serde_json::Value::Null,
    ));
    let mut pace = FollowBackoff::new(env.chain_id, Duration::from_millis(500));
    for _ in 0..3 {
        let result = ingest.round().await;
        let out = result.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!(out.reorgs, 0, "{out:?}");
        assert_eq!(out.missing, tip.map(|t| t.number), "{out:?}");
        match pace.after(&result) {
            NextRound::Wait(d) => assert!(d <= DEFAULT_HOLE_BACKOFF_CAP, "{d:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        !read::chain_health(env.db.pool(), env.chain_id)
            .await?
            .is_degraded()
    );
    assert_eq!(tip, read::indexed_tip(env.db.pool(), env.chain_id).await?);
    assert_eq!(
        before,
        crate::common::fingerprint(&env.db, env.chain_id, &env.deployed).await?
    );
    proxy.clear_rules();
    let out = ingest.round().await?;
    assert_eq!((out.missing, out.reorgs), (None, 0), "{out:?}");
    assert_eq!(out.tip, Some(out.head));
    Ok(())
}
