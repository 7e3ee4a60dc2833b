//! Head watching between tip steps.

use crate::common::{catch_up, config, env};
use std::time::{Duration, Instant};

#[tokio::test]
async fn wait_for_new_head_returns_on_a_new_block_or_after_the_poll_interval() -> anyhow::Result<()>
{
    let env = env().await?;
    let tip = env.owner(config(64), "tip").await?;
    catch_up(&tip).await?;
    let indexed = keel_index::read::indexed_tip(env.db.pool(), env.chain_id)
        .await?
        .map(|t| t.number);

    // No new block: returns the same head once the poll interval has passed.
    let started = Instant::now();
    let head = tip
        .wait_for_new_head(
            indexed,
            Duration::from_millis(300),
            Duration::from_millis(10),
        )
        .await?;
    assert_eq!(Some(head), indexed);
    assert!(started.elapsed() >= Duration::from_millis(300));

    // A block mined while waiting: returns soon after it appears, well before the
    // poll interval, and the next step ingests it.
    let mine = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        env.chain.mine().await
    };
    let started = Instant::now();
    let (head, mined) = tokio::join!(
        tip.wait_for_new_head(indexed, Duration::from_secs(10), Duration::from_millis(10)),
        mine
    );
    mined?;
    let head = head?;
    assert!(Some(head) > indexed);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let out = tip.step().await?;
    assert_eq!(out.tip, Some(head));
    Ok(())
}
