//! The work each role runs, built from the configuration.
//!
//! | role | runs |
//! |---|---|
//! | `runner` | a durable executor with every workflow of [`keel_workflows::workflows::WORKFLOWS`]; per chain the transaction queue loop (sign, broadcast, confirmation watcher every `durable.confirmationWatcher.intervalMs`, nonce recovery) as the cluster singleton `txq/<chainId>`; the verdict relay as the singleton `verdict-relay` |
//! | `indexer` | per chain the tip ingest as the singleton `index-tip/<chainId>` (epoch-fenced; a new owner takes a new epoch; before the chain's first tip block the owner plans the history below the settled height as leased ranges) and a history worker on every replica |
//! | `api` | the Platform API (see [`keel_api`]) |

use crate::config::Config;
use anyhow::Context;
use keel_chain::{AttributionSuffix, UpstreamConfig, UpstreamPool};
use keel_cluster::ShardOwner;
use keel_durable::{Engine, EngineConfig, ExecutorConfig, ExecutorHandle};
use keel_index::{HistoryConfig, HistoryWorker, TipConfig, TipIngest};
use keel_txq::{LocalSigner, TxQueue, TxQueueConfig, TxSigner};
use keel_units::ChainId;
use keel_workflows::{ChainContext, Platform, PlatformAddresses};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TARGET: &str = "keel::services";

/// `chains.<name>.confirmations` of the chain with `chain_id` (at least 1; 1 when the
/// chain is not configured).
fn chain_confirmations(config: &Config, chain_id: u64) -> u64 {
    config
        .chains
        .values()
        .find(|c| c.chain_id == chain_id)
        .map_or(1, |c| c.confirmations.max(1))
}

/// One upstream pool per configured chain that answers with its configured `chainId`.
/// A chain that cannot be reached or reports another id is skipped with an error log
/// and the metric `keel_chain_unavailable_at_start_total{chain_id}`: the process keeps
/// serving its other chains (restart it once the chain is back).
///
/// # Errors
/// When a chain's upstream configuration is invalid.
pub async fn upstreams(config: &Config) -> anyhow::Result<Vec<Arc<UpstreamPool>>> {
    let mut out = Vec::new();
    for (name, chain) in &config.chains {
        let pool = UpstreamPool::new(
            ChainId(chain.chain_id),
            UpstreamConfig::new(chain.rpc_urls.clone()),
        )
        .with_context(|| format!("chain `{name}`: upstream configuration"))?;
        if let Err(e) = pool.verify_chain_id().await {
            tracing::error!(target: TARGET, chain = name.as_str(), chain_id = chain.chain_id,
                error = %e, "chain unavailable at start; skipped");
            metrics::counter!("keel_chain_unavailable_at_start_total",
                "chain_id" => chain.chain_id.to_string())
            .increment(1);
            continue;
        }
        out.push(Arc::new(pool));
    }
    Ok(out)
}

/// The runner's workflow platform: one queue per reachable, bootstrapped chain with
/// the operator signer registered, the chains' platform contracts (chains that were
/// not bootstrapped are skipped with a warning) and the attribution suffix. Without
/// any such chain the operator key is not needed; operations on a missing chain are
/// suspended (`CHAIN_NOT_CONFIGURED`) and retried with backoff.
///
/// # Errors
/// When the operator key is missing or invalid while a chain is served, or the
/// attribution codes are invalid.
pub async fn platform(config: &Config, pool: &PgPool) -> anyhow::Result<Arc<Platform>> {
    let suffix = AttributionSuffix::new(&config.operator.attribution_codes)
        .context("configuration key `operator.attributionCodes`")?;
    let mut usable = Vec::new();
    for node in upstreams(config).await? {
        let chain_id = node.chain().get();
        match PlatformAddresses::load(pool, chain_id).await {
            Ok(c) => usable.push((node, c)),
            Err(e) => {
                tracing::warn!(target: TARGET, chain_id, error = %e, "chain skipped");
            }
        }
    }
    let mut chains = HashMap::new();
    let mut operator = alloy::primitives::Address::ZERO;
    if !usable.is_empty() {
        let signer = LocalSigner::from_env(&config.operator.key_env).with_context(|| {
            format!(
                "operator key: set the environment variable {} (hex private key)",
                config.operator.key_env
            )
        })?;
        operator = signer.address();
        let signer: Arc<dyn TxSigner> = Arc::new(signer);
        for (node, contracts) in usable {
            let chain_id = node.chain().get();
            let confirmations = chain_confirmations(config, chain_id);
            let queue_config = TxQueueConfig {
                confirmations,
                poll_interval: Duration::from_millis(
                    config.durable.confirmation_watcher.interval_ms,
                ),
                ..TxQueueConfig::default()
            };
            let mut queue = TxQueue::new(pool.clone(), node.clone(), queue_config)
                .with_context(|| format!("transaction queue of chain {chain_id}"))?;
            queue.add_signer(signer.clone());
            chains.insert(
                chain_id,
                ChainContext {
                    chain_id: ChainId(chain_id),
                    node,
                    queue: Arc::new(queue),
                    contracts,
                },
            );
        }
    }
    Ok(Arc::new(Platform {
        db: pool.clone(),
        operator,
        suffix,
        chains,
        index_wait: Duration::from_millis(config.index.read_after_write_wait_ms),
    }))
}

/// The durable engine's settings from `[durable]`.
pub fn engine_config(config: &Config) -> EngineConfig {
    EngineConfig {
        lease: Duration::from_millis(config.durable.lease_ms),
        ..EngineConfig::default()
    }
}

/// What the runner started.
#[derive(Debug)]
pub struct RunnerServices {
    /// The executor (shut down with a grace on stop).
    pub executor: ExecutorHandle,
    /// The singletons' supervisors.
    pub tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// Starts the runner's work on `owner`'s shards.
///
/// # Errors
/// As [`platform`]; an invalid executor configuration.
pub async fn start_runner(
    config: &Config,
    pool: &PgPool,
    owner: &ShardOwner,
) -> anyhow::Result<RunnerServices> {
    let platform = platform(config, pool).await?;
    let engine = keel_workflows::workflows::register_all(
        Engine::new(pool.clone(), engine_config(config)).context("durable engine")?,
        platform.clone(),
    );
    // Startup assertion: every workflow the API can start is executed here, so no
    // accepted operation can wait forever for an executor that does not know it.
    let registered = engine.registered();
    if let Some(missing) = keel_workflows::workflows::WORKFLOWS
        .iter()
        .find(|w| !registered.iter().any(|r| r == *w))
    {
        anyhow::bail!("workflow `{missing}` can be started by the API but is not registered");
    }
    let executor = engine
        .spawn_executor(ExecutorConfig::default())
        .context("durable executor")?;
    let mut tasks = Vec::new();
    for chain in platform.chains.values() {
        let queue = chain.queue.clone();
        let name = format!("txq/{}", chain.chain_id.get());
        let handle = owner.singleton(&name, move |lease| {
            let queue = queue.clone();
            async move {
                tracing::info!(target: TARGET, shard = lease.shard(), "transaction queue loop owned");
                queue.run(lease.token().clone()).await;
            }
        });
        tasks.push(("txq", handle));
    }
    let interval = Duration::from_millis(config.durable.confirmation_watcher.interval_ms);
    let relay_pool = pool.clone();
    let relay = owner.singleton("verdict-relay", move |lease| {
        let pool = relay_pool.clone();
        let engine = engine.clone();
        async move {
            keel_workflows::relay::run_relay(pool, engine, interval, lease.token().clone()).await;
        }
    });
    tasks.push(("verdict-relay", relay));
    tracing::info!(target: TARGET, chains = platform.chains.len(), operator = %platform.operator,
        "runner services started");
    Ok(RunnerServices { executor, tasks })
}

/// Starts the indexer's work: per chain a tip-ingest singleton and a history worker.
///
/// # Errors
/// When a chain is unreachable or a worker configuration is invalid.
pub async fn start_indexer(
    config: &Config,
    pool: &PgPool,
    owner: &ShardOwner,
    stop: CancellationToken,
) -> anyhow::Result<Vec<(&'static str, JoinHandle<()>)>> {
    let mut tasks = Vec::new();
    let poll = Duration::from_millis(config.index.poll_interval_ms);
    let replica = owner.replica_id().to_string();
    for node in upstreams(config).await? {
        let chain_id = node.chain().get();
        let tip_config = TipConfig::new(config.index.finality_depth);
        let confirmations = chain_confirmations(config, chain_id);
        let tip_pool = pool.clone();
        let tip_node = node.clone();
        let owner_id = replica.clone();
        let name = format!("index-tip/{chain_id}");
        let handle = owner.singleton(&name, move |lease| {
            let pool = tip_pool.clone();
            let node = tip_node.clone();
            let config = tip_config.clone();
            let owner_id = owner_id.clone();
            async move {
                let token = lease.token().clone();
                run_tip(pool, node, config, confirmations, &owner_id, poll, token).await;
            }
        });
        tasks.push(("index-tip", handle));

        let worker = HistoryWorker::new(
            pool.clone(),
            node.clone(),
            format!("{replica}/{chain_id}"),
            HistoryConfig::default(),
        )
        .context("history worker")?
        .with_fetch_concurrency(config.index.history_fetch_concurrency);
        let stop = stop.clone();
        let history = tokio::spawn(async move {
            while !stop.is_cancelled() {
                // Pipelined: the next range is fetched while the last one is written.
                // Stopping drops a range mid-flight: its transaction rolls back and the
                // range is offered again when its lease lapses (writes are fenced by
                // attempt and idempotent).
                let drained = tokio::select! {
                    _ = stop.cancelled() => break,
                    r = worker.drain() => r,
                };
                let idle = match drained {
                    Ok(done) => done.is_empty(),
                    Err(e) => {
                        tracing::warn!(target: TARGET, chain_id, error = %e, "history range failed; its lease will lapse");
                        true
                    }
                };
                if idle {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(poll) => {}
                    }
                }
            }
        });
        tasks.push(("index-history", history));
    }
    Ok(tasks)
}

/// Blocks per planned history range.
pub const HISTORY_RANGE_BLOCKS: u64 = 2_000;

/// Before a chain's first tip commit, its owner plans the history below the settled
/// height (the `finalized` tag, else head − confirmations) as leased ranges that every
/// indexer replica's history worker claims, and starts the tip right above it. Once the
/// chain has a tip checkpoint, the tip continues from it and nothing is planned.
async fn plan_before_first_tip(
    pool: &PgPool,
    node: &UpstreamPool,
    config: &TipConfig,
    confirmations: u64,
) -> keel_index::Result<TipConfig> {
    let mut config = config.clone();
    let chain = node.chain();
    if keel_index::read::indexed_tip(pool, chain).await?.is_some() {
        return Ok(config);
    }
    let settled = keel_index::history::settled_height(node, confirmations).await?;
    let ranges = keel_index::plan_history(pool, chain, settled, HISTORY_RANGE_BLOCKS).await?;
    tracing::info!(target: TARGET, chain = %chain, settled, ranges, "history planned below the first tip block");
    config.start_block = Some(settled.saturating_add(1));
    Ok(config)
}

/// The tip-ingest loop of one chain while this replica owns it: takes ownership (a new
/// epoch), then steps until the lease's token fires, paced by
/// [`keel_index::FollowBackoff`]. A fenced step (a newer owner) ends the loop; a fatal
/// error (a reorg below the finalized block: the chain is marked degraded) stops ingest
/// of the chain once, loudly, and holds it idle; node holes and other errors are
/// retried after a capped exponential backoff.
async fn run_tip(
    pool: PgPool,
    node: Arc<UpstreamPool>,
    config: TipConfig,
    confirmations: u64,
    owner_id: &str,
    poll: Duration,
    stop: CancellationToken,
) {
    use tracing::Instrument;
    let chain = node.chain();
    async move {
        // A degraded chain (a reorg below its finalized block) stays stopped: no new
        // owner epoch, no restart loop, until an operator re-indexes it.
        if let Ok(health) = keel_index::tip::publish_health(&pool, chain).await
            && let Some(d) = health.degraded
        {
            tracing::error!(target: TARGET, reason = %d.reason, since = %d.since, "the chain's index is degraded; tip ingest stays stopped until it is re-indexed");
            stop.cancelled().await;
            return;
        }
        let ingest = loop {
            let planned = plan_before_first_tip(&pool, &node, &config, confirmations).await;
            let attempt = match planned {
                Ok(config) => {
                    TipIngest::take_ownership(pool.clone(), node.clone(), config, owner_id).await
                }
                Err(e) => Err(e),
            };
            match attempt {
                Ok(i) => break i,
                Err(e) => {
                    tracing::warn!(target: TARGET, error = %e, "taking tip ownership failed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(poll) => {}
                    }
                }
            }
        };
        // Paced by keel-index: at once while behind, the poll interval once caught up,
        // a capped exponential backoff after a node hole or an error.
        let mut pace = keel_index::FollowBackoff::new(chain, poll);
        while !stop.is_cancelled() {
            let result = ingest.step().await;
            match pace.after(&result) {
                keel_index::NextStep::Now => {}
                keel_index::NextStep::Wait(wait) => {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                keel_index::NextStep::GiveUp => return,
                keel_index::NextStep::Halt => {
                    // Fatal for the chain (logged once by keel-index): hold it idle
                    // rather than retaking ownership in a loop.
                    stop.cancelled().await;
                    return;
                }
            }
        }
    }
    .instrument(tracing::info_span!("index_tip", chain = %chain))
    .await;
}
