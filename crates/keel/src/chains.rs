//! Which configured chains a runner or indexer process serves.
//!
//! A chain is *served* while the process can reach it (its RPC answers `eth_chainId`
//! with the configured id) and, for a runner, its platform contracts are recorded and
//! the operator key is set. A chain that is not served at start is retried in the
//! background with a capped exponential backoff (`chainHealth.retryInitialMs` …
//! `chainHealth.retryMaxMs`), never dropped for the life of the process; a served chain
//! is probed every `chainHealth.probeIntervalMs` and stops being served after
//! `chainHealth.failuresBeforeUnserved` failed probes in a row.
//!
//! The chain's singletons (`txq/<chainId>`, `index-tip/<chainId>`) are registered with
//! [`keel_cluster::ShardOwner::singleton_while`] on [`ChainSet::subscribe`]: while the
//! chain is not served here the replica declines their shards and a replica that
//! serves it takes them.
//!
//! Exposed as the gauge `keel_chain_served{chain_id, role}` (1 or 0; configured chains
//! only, so the labels are bounded) and in the `/readyz` body ([`ChainSet::report`]).

use crate::config::{ChainHealthSettings, Config};
use keel_chain::UpstreamPool;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const TARGET: &str = "keel::chains";

/// One configured chain and whether this process serves it.
#[derive(Debug)]
pub struct ChainSlot {
    /// The chain's name in the configuration (`chains.<name>`).
    pub name: String,
    /// Its EIP-155 id.
    pub chain_id: u64,
    serving: watch::Sender<bool>,
}

/// The configured chains of a process and their serving state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ChainSet {
    role: &'static str,
    slots: Arc<Vec<ChainSlot>>,
}

/// A chain as listed by [`ChainSet::report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainEntry {
    /// `chains.<name>`.
    pub name: String,
    /// EIP-155 id.
    pub chain_id: u64,
}

/// The chains a process serves and the ones it does not (yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct ChainReport {
    /// Served chains, in configuration order.
    pub served: Vec<ChainEntry>,
    /// Configured chains not served (unreachable, not bootstrapped, or no operator key).
    pub unserved: Vec<ChainEntry>,
}

impl ChainSet {
    /// Every chain of `config`, none served yet, for a process of `role` (the gauge's
    /// `role` label).
    pub fn new(config: &Config, role: &'static str) -> Self {
        let slots = config
            .chains
            .iter()
            .map(|(name, c)| {
                let (serving, _) = watch::channel(false);
                metrics::gauge!("keel_chain_served",
                    "chain_id" => c.chain_id.to_string(), "role" => role)
                .set(0.0);
                ChainSlot {
                    name: name.clone(),
                    chain_id: c.chain_id,
                    serving,
                }
            })
            .collect();
        Self {
            role,
            slots: Arc::new(slots),
        }
    }

    /// The configured chains.
    pub fn slots(&self) -> &[ChainSlot] {
        &self.slots
    }

    /// A receiver of whether `chain_id` is served (always false for a chain that is not
    /// configured).
    pub fn subscribe(&self, chain_id: u64) -> watch::Receiver<bool> {
        match self.slots.iter().find(|s| s.chain_id == chain_id) {
            Some(slot) => slot.serving.subscribe(),
            None => watch::channel(false).1,
        }
    }

    /// Whether `chain_id` is served now.
    pub fn is_served(&self, chain_id: u64) -> bool {
        self.slots
            .iter()
            .any(|s| s.chain_id == chain_id && *s.serving.borrow())
    }

    /// Records whether `chain_id` is served (logs the change, sets the gauge).
    pub fn set_served(&self, chain_id: u64, served: bool) {
        let Some(slot) = self.slots.iter().find(|s| s.chain_id == chain_id) else {
            return;
        };
        let before = slot.serving.send_replace(served);
        metrics::gauge!("keel_chain_served",
            "chain_id" => chain_id.to_string(), "role" => self.role)
        .set(if served { 1.0 } else { 0.0 });
        if before != served {
            if served {
                tracing::info!(target: TARGET, chain = slot.name.as_str(), chain_id,
                    "chain served");
            } else {
                tracing::warn!(target: TARGET, chain = slot.name.as_str(), chain_id,
                    "chain no longer served; its singletons are left to replicas that can serve it");
            }
        }
    }

    /// The served and unserved chains.
    pub fn report(&self) -> ChainReport {
        let mut report = ChainReport::default();
        for slot in self.slots.iter() {
            let entry = ChainEntry {
                name: slot.name.clone(),
                chain_id: slot.chain_id,
            };
            if *slot.serving.borrow() {
                report.served.push(entry);
            } else {
                report.unserved.push(entry);
            }
        }
        report
    }
}

/// Keeps `chain_id`'s serving state in `chains` up to date until `stop` fires (see the
/// module documentation). `prepare` runs after each successful reachability check
/// while the chain is not served, and once more at the first healthy probe after the
/// chain became served (so it must be idempotent: the runner's wakes the work that
/// suspended on the chain there, and the second call catches work that suspended
/// while the first ran); its error (a reason without values) keeps the chain
/// unserved and is retried with the backoff. Never returns an error: every failure is
/// retried.
pub async fn keep_health<P, Fut>(
    chains: ChainSet,
    chain_id: u64,
    node: Arc<UpstreamPool>,
    settings: ChainHealthSettings,
    prepare: P,
    stop: CancellationToken,
) where
    P: Fn() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    use tracing::Instrument;
    let initial = Duration::from_millis(settings.retry_initial_ms);
    let max = Duration::from_millis(settings.retry_max_ms);
    let probe = Duration::from_millis(settings.probe_interval_ms);
    async move {
        let mut backoff = initial;
        let mut failures: u32 = 0;
        // Served by this task and not yet followed by a second `prepare`.
        let mut just_served = false;
        loop {
            let reachable = node.verify_chain_id().await;
            let served = chains.is_served(chain_id);
            let wait = match (served, reachable) {
                (true, Ok(())) => {
                    failures = 0;
                    if std::mem::take(&mut just_served)
                        && let Err(reason) = prepare().await
                    {
                        tracing::warn!(target: TARGET, reason,
                            "the follow-up of a newly served chain failed");
                    }
                    probe
                }
                (true, Err(e)) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(target: TARGET, error = %e, failures,
                        "served chain failed its probe");
                    if failures >= settings.failures_before_unserved {
                        chains.set_served(chain_id, false);
                        backoff = initial;
                    }
                    probe.min(initial)
                }
                (false, Ok(())) => match prepare().await {
                    Ok(()) => {
                        chains.set_served(chain_id, true);
                        just_served = true;
                        failures = 0;
                        backoff = initial;
                        probe
                    }
                    Err(reason) => {
                        tracing::warn!(target: TARGET, reason,
                            retry_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
                            "chain reachable but not served yet; retrying");
                        let wait = backoff;
                        backoff = (backoff * 2).min(max);
                        wait
                    }
                },
                (false, Err(e)) => {
                    tracing::warn!(target: TARGET, error = %e,
                        retry_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
                        "chain unreachable; retrying");
                    metrics::counter!("keel_chain_unreachable_total",
                        "chain_id" => chain_id.to_string())
                    .increment(1);
                    let wait = backoff;
                    backoff = (backoff * 2).min(max);
                    wait
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
    .instrument(tracing::info_span!("chain_health", chain_id))
    .await;
}
