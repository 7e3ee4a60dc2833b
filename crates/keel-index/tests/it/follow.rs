//! Head watching between tip steps.

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
    // the outer timeout only turns a hang into a failure), and the next step ingests it.
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
    let out = tip.step().await?;
    assert_eq!(out.tip, Some(head));
    Ok(())
}
