//! Property/fault test: backfills, reorgs (some while a backfill answer is held by the
//! proxy), tip-owner restarts and history-worker crashes, interleaved in an order drawn
//! from a seed. Whatever the order, once history is drained and the tip caught up,
//! every indexed balance equals the chain's `balanceOf` and the index equals a fresh
//! re-index of the chain.

use crate::common::{Env, catch_up, config, env, fingerprint, reindex};
use crate::reorg::transfer_request;
use crate::unsettled::assert_balances_match_chain;
use alloy::primitives::Address;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::proxy::{RpcProxy, Rule};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::history::pending_ranges;
use keel_index::{HistoryConfig, HistoryWorker, IndexError, TipConfig, TipIngest, plan_history};
use std::sync::Arc;
use std::time::Duration;

/// xorshift64*: a small deterministic generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct World {
    env: Env,
    proxy: RpcProxy,
    history_node: Arc<UpstreamPool>,
    tokens: Vec<Address>,
    holders: Vec<Address>,
    tip_config: TipConfig,
    settled: u64,
    restarts: u32,
}

impl World {
    fn worker(&self, id: &str) -> anyhow::Result<HistoryWorker> {
        Ok(HistoryWorker::new(
            self.env.db.pool().clone(),
            self.history_node.clone(),
            id,
            HistoryConfig {
                lease: Duration::from_millis(600),
                max_span: 2_000,
                retries: 5,
            },
        )?)
    }

    async fn owner(&mut self) -> anyhow::Result<TipIngest> {
        self.restarts += 1;
        self.env
            .owner(self.tip_config.clone(), &format!("tip-{}", self.restarts))
            .await
    }

    /// One to three transfers from dev account 0, one block each.
    async fn activity(&self, rng: &mut Rng) -> anyhow::Result<()> {
        for _ in 0..=rng.below(3) {
            let token = self.tokens[rng.below(self.tokens.len() as u64) as usize];
            let to = self.holders[1 + rng.below(self.holders.len() as u64 - 1) as usize];
            self.env.transfer(token, to, 1 + rng.below(50)).await?;
        }
        Ok(())
    }

    /// Replaces the last 1–`max_depth` blocks (never the settled ones) with as many
    /// blocks holding 0–2 other transfers.
    async fn reorg(&self, rng: &mut Rng, max_depth: u64) -> anyhow::Result<()> {
        let above = self.env.chain.block_number().await? - self.settled;
        let depth = 1 + rng.below(max_depth.min(above).max(1));
        let p = self.env.chain.provider();
        let mut pairs = Vec::new();
        for _ in 0..rng.below(3) {
            let token = self.tokens[rng.below(self.tokens.len() as u64) as usize];
            let to = self.holders[1 + rng.below(self.holders.len() as u64 - 1) as usize];
            pairs.push((
                transfer_request(token, self.holders[0], to, 1_000 + rng.below(50), p),
                rng.below(depth),
            ));
        }
        pairs.sort_by_key(|(_, offset)| *offset);
        p.anvil_reorg(ReorgOptions {
            depth,
            tx_block_pairs: pairs,
        })
        .await?;
        Ok(())
    }
}

/// A history range or a tip round may fail transiently in this test only in the ways
/// the index handles by retrying.
fn tolerated(e: &IndexError) -> bool {
    matches!(
        e,
        IndexError::Unsettled { .. } | IndexError::LeaseLost { .. }
    ) || e.is_retryable()
}

async fn run(seed: u64) -> anyhow::Result<()> {
    let env = env().await?;
    let mut rng = Rng(seed);
    // Two tokens (with feeds) created below the settled height: only history finds them.
    let mut tokens = Vec::new();
    for symbol in ["PA", "PB"] {
        let asset = env.mintable(symbol).await?;
        env.mint(asset.token, env.chain.account(0)?, 1_000_000)
            .await?;
        tokens.push(asset.token);
    }
    let holders: Vec<Address> = (0..5)
        .map(|i| env.chain.account(i))
        .collect::<anyhow::Result<_>>()?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    let history_node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let settled = env.chain.block_number().await?;
    let mut world = World {
        env,
        proxy,
        history_node,
        tokens,
        holders,
        tip_config: TipConfig {
            start_block: Some(settled + 1),
            ..config(64)
        },
        settled,
        restarts: 0,
    };
    // History is planned in several ranges, so discoveries schedule address ranges
    // while other ranges are still pending.
    plan_history(
        world.env.db.pool(),
        world.env.chain_id,
        settled,
        settled / 2 + 1,
    )
    .await?;
    for _ in 0..4 {
        world.activity(&mut rng).await?;
    }
    let mut tip = world.owner().await?;
    catch_up(&tip).await?;
    let mut worker = world.worker("h0")?;

    for round in 0..20 {
        let action = rng.below(8);
        println!("seed {seed} round {round}: action {action}");
        match action {
            0 => world.activity(&mut rng).await?,
            1 => {
                world.reorg(&mut rng, 3).await?;
                world.activity(&mut rng).await?;
            }
            2 => {
                if let Err(e) = catch_up(&tip).await {
                    anyhow::bail!("seed {seed}: tip failed: {e}");
                }
            }
            3 => tip = world.owner().await?, // restart: a new owner, a new epoch
            4..=6 => {
                // A backfill range whose answer the node gives now and the proxy holds
                // while the chain reorganizes and the tip follows.
                let held = world.proxy.add_rule(
                    Rule::hold_response("eth_getLogs", Duration::from_millis(800)).times(1),
                );
                let w = worker;
                let range = tokio::spawn(async move {
                    let out = w.run_once().await;
                    (w, out)
                });
                // Until the node answered the range's getLogs, or the worker is done
                // (no claimable range: nothing fetched, the rule stays unused).
                let fetched = loop {
                    if world.proxy.hits(held) > 0 {
                        break true;
                    }
                    if range.is_finished() {
                        break false;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                };
                if fetched {
                    // Up to every block above the settled height.
                    world.reorg(&mut rng, u64::MAX).await?;
                    world.activity(&mut rng).await?;
                    catch_up(&tip).await?;
                }
                let (w, out) = range.await?;
                println!("  held={fetched} out={out:?}");
                worker = w;
                world.proxy.clear_rules();
                if let Err(e) = out
                    && !tolerated(&e)
                {
                    anyhow::bail!("seed {seed}: history failed: {e}");
                }
            }
            _ => {
                // A history worker crashes mid-range (its lease lapses) and a new one
                // takes over.
                let w = world.worker(&format!("h{round}"))?;
                let crashed = tokio::spawn(async move { w.run_once().await });
                tokio::task::yield_now().await;
                crashed.abort();
                let _ = crashed.await;
                worker = world.worker(&format!("h{round}b"))?;
            }
        }
    }

    // Drain: every range completes (crashed ones once their lease lapsed), the tip
    // catches up, and the index equals the chain.
    for _ in 0..200 {
        catch_up(&tip).await?;
        match worker.run_once().await {
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(e) if tolerated(&e) => continue,
            Err(e) => anyhow::bail!("seed {seed}: history failed: {e}"),
        }
        if pending_ranges(world.env.db.pool(), world.env.chain_id).await? == 0 {
            break;
        }
        // A crashed worker's range is claimable once its lease lapses.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        pending_ranges(world.env.db.pool(), world.env.chain_id).await?,
        0
    );
    catch_up(&tip).await?;
    for token in &world.tokens {
        assert_balances_match_chain(&world.env, *token, &world.holders).await?;
    }
    assert_eq!(
        fingerprint(&world.env.db, world.env.chain_id, &world.env.deployed).await?,
        reindex(&world.env).await?,
        "seed {seed}"
    );
    Ok(())
}

#[tokio::test]
async fn backfills_reorgs_and_restarts_in_any_order_converge_to_the_chain() -> anyhow::Result<()> {
    for seed in [
        0x9E37_79B9_7F4A_7C15,
        0xD1B5_4A32_D192_ED03,
        0x2545_F491_4F6C_DD1D,
    ] {
        run(seed).await?;
    }
    Ok(())
}
