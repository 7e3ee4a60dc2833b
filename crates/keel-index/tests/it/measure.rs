//! Small-scale measurements (ignored by default; run with
//! `cargo test -p keel-index --test it measure -- --ignored --nocapture`).

use crate::common::{catch_up, config, env};
use alloy::primitives::U256;
use alloy::providers::Provider;
use anvil_tests::keel_abi::bindings::AssetToken;
use keel_index::{HistoryConfig, HistoryWorker, TipConfig, plan_history};
use std::time::{Duration, Instant};

async fn drain(w: &HistoryWorker) -> anyhow::Result<u64> {
    let mut logs = 0;
    while let Some(d) = w.run_once().await? {
        logs += d.logs;
    }
    Ok(logs)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test]
#[ignore = "measurement"]
async fn measure_history_throughput_and_tip_latency() -> anyhow::Result<()> {
    const TRANSFERS: u64 = 2_000;
    let env = env().await?;
    let asset = env.mintable("BENCH").await?;
    let a0 = env.chain.account(0)?;
    env.mint(asset.token, a0, 1_000_000_000).await?;
    let token = AssetToken::new(asset.token, env.chain.provider().clone());
    let to = env.chain.account(1)?;
    for i in 0..TRANSFERS {
        let _pending = token.transfer(to, U256::from(i + 1)).send().await?;
    }
    let boundary = env.chain.provider().get_block_number().await?;

    // History: 3 workers, 100-block ranges.
    plan_history(env.db.pool(), env.chain_id, boundary, 100).await?;
    let mk = |id: &str| {
        HistoryWorker::new(
            env.db.pool().clone(),
            env.node.clone(),
            id,
            HistoryConfig::default(),
        )
    };
    let (w1, w2, w3) = (mk("w1")?, mk("w2")?, mk("w3")?);
    let started = Instant::now();
    let (l1, l2, l3) = tokio::join!(drain(&w1), drain(&w2), drain(&w3));
    let logs = l1? + l2? + l3? + drain(&w1).await?;
    let elapsed = started.elapsed();
    println!(
        "history: {logs} logs over {boundary} blocks in {elapsed:?} = {:.0} logs/s",
        logs as f64 / elapsed.as_secs_f64()
    );

    // Tip: one transfer per block; time from the transfer's return (mined, automine)
    // to the round that committed it.
    let tip = env
        .owner(
            TipConfig {
                start_block: Some(boundary + 1),
                ..config(64)
            },
            "tip",
        )
        .await?;
    catch_up(&tip).await?;
    let mut latencies = Vec::new();
    for i in 0..200u64 {
        let number = anvil_tests::confirm(&token.transfer(to, U256::from(i + 1)))
            .await?
            .block_number
            .unwrap_or_default();
        let t0 = Instant::now();
        let out = tip.round().await?;
        assert_eq!(out.tip, Some(number));
        latencies.push(t0.elapsed());
    }
    latencies.sort();
    println!(
        "tip round (block mined → committed, no poll delay): p50 {:?} p99 {:?} max {:?}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
    Ok(())
}
