//! The crate's background services: the tip follow loop plans history below the
//! settled height and follows the head, the history loop drains the planned ranges,
//! and both stop on their cancellation token.

use crate::common::env_on;
use alloy::primitives::Address;
use anvil_tests::TestChain;
use keel_index::history::pending_ranges;
use keel_index::{HistoryConfig, HistoryWorker, TipConfig, follow_tip, read, work_history};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_tip_and_history_services_index_everything_and_stop_on_cancel() -> anyhow::Result<()> {
    // `finalized` is head − 2: the early mint ends below it, in the planned history.
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await?;
    let env = env_on(chain).await?;
    let asset = env.mintable("SVC").await?;
    let early = Address::repeat_byte(0x11);
    env.mint(asset.token, early, 5).await?;
    let early_block = env.chain.block_number().await?;
    for _ in 0..4 {
        env.chain.mine().await?;
    }
    let db = env.db.pool().clone();
    let stop = CancellationToken::new();
    let poll = Duration::from_millis(50);

    let tip = tokio::spawn({
        let (db, node, stop) = (db.clone(), env.node.clone(), stop.clone());
        async move { follow_tip(db, node, TipConfig::new(2), 2, "svc-1", poll, stop).await }
    });
    let worker = Arc::new(HistoryWorker::new(
        db.clone(),
        env.node.clone(),
        "svc-1/history",
        HistoryConfig::default(),
    )?);
    let (_serving_tx, serving) = tokio::sync::watch::channel(true);
    let history = tokio::spawn(work_history(worker, serving, poll, stop.clone()));

    // A transfer after the services started: the tip ingests it.
    let late = Address::repeat_byte(0x22);
    env.mint(asset.token, late, 7).await?;
    let head = env.chain.block_number().await?;
    read::wait_for_block(&db, env.chain_id, head, Duration::from_secs(30), poll).await?;
    // The history below the first tip block is worked off by the history service.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pending_ranges(&db, env.chain_id).await? > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "history not drained"
        );
        tokio::time::sleep(poll).await;
    }
    let planned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM index_range WHERE chain_id = $1 AND to_block >= $2",
    )
    .bind(i64::try_from(env.chain_id.get())?)
    .bind(i64::try_from(early_block)?)
    .fetch_one(&db)
    .await?;
    assert!(
        planned > 0,
        "the early mint was left to the history service"
    );
    let balances = read::balances(&db, env.chain_id, asset.token).await?;
    assert!(balances.contains(&(early, "5".to_owned())), "{balances:?}");
    assert!(balances.contains(&(late, "7".to_owned())), "{balances:?}");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), tip).await??;
    tokio::time::timeout(Duration::from_secs(10), history).await??;
    Ok(())
}
