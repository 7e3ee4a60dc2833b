//! `keel index reindex`: the way back from a degraded chain's Ledger Index, no SQL.

use super::connect_migrated;
use anyhow::{Context, bail};
use clap::Subcommand;
use keel::config::Config;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub(super) enum IndexCommand {
    /// Re-index a chain's Ledger Index (the way back from a degraded chain, no SQL):
    /// takes a new owner epoch (the running indexer's tip owner is fenced and starts
    /// over), deletes every row at and above the first block (balances follow and are
    /// recomputed), clears the degraded marker; the indexer role then rebuilds the
    /// chain while reads say `indexRebuilding`. Safe while the indexer runs.
    Reindex {
        /// The chain's name in the configuration (`[chains.<name>]`).
        #[arg(long)]
        chain: String,
        /// The first block to rebuild (default: the lowest `from_block` of the scope).
        #[arg(long)]
        from_block: Option<u64>,
        /// Wait until the rebuild is done (the chain has a tip again and every history
        /// range is completed), at most this many seconds; 0 returns at once.
        #[arg(long, default_value_t = 0)]
        wait_seconds: u64,
    },
}

/// Runs a `keel index` command.
pub(super) async fn run(config: &Config, command: IndexCommand) -> anyhow::Result<()> {
    match command {
        IndexCommand::Reindex {
            chain,
            from_block,
            wait_seconds,
        } => reindex(config, &chain, from_block, wait_seconds).await,
    }
}

/// `keel index reindex`: starts the re-index, prints what it did, and optionally waits
/// for the rebuild.
async fn reindex(
    config: &Config,
    chain: &str,
    from_block: Option<u64>,
    wait_seconds: u64,
) -> anyhow::Result<()> {
    let chain_id = config
        .chains
        .get(chain)
        .with_context(|| format!("no chain named `{chain}` in the configuration (chains.*)"))?
        .chain_id;
    let chain_id = keel_units::ChainId(chain_id);
    let pool = connect_migrated(config).await?;
    let done = keel_index::reindex(&pool, chain_id, from_block, "cli")
        .await
        .context("starting the re-index")?;
    println!(
        "chain {chain} ({chain_id}): re-index from block {} started (epoch {}, {}, {} history ranges replanned); the indexer role rebuilds it",
        done.from_block,
        done.epoch,
        if done.was_degraded {
            "degraded marker cleared"
        } else {
            "was not degraded"
        },
        done.ranges_cut
    );
    if wait_seconds == 0 {
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_seconds);
    loop {
        let health = keel_index::read::chain_health(&pool, chain_id).await?;
        if !health.is_rebuilding() {
            let tip = health.tip.map(|t| t.number);
            println!("chain {chain} ({chain_id}): rebuilt, indexed tip {tip:?}");
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "chain {chain}: still rebuilding after {wait_seconds} s (is an indexer role running?)"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
