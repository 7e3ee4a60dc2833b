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
/// while the chain is not served, once more at the first healthy probe after the
/// chain became served, and at the first healthy probe after failed probes of a served
/// chain (a chain that went down and came back without being unserved): so it runs at
/// every down→up transition and must be idempotent (the runner's wakes the work that
/// suspended on the chain there, issue 32 §4; the second call catches work that
/// suspended while the first ran); its error (a reason without values) keeps the chain
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
        let mut state = ProbeState::default();
        loop {
            let reachable = node.verify_chain_id().await;
            let served = chains.is_served(chain_id);
            let wait = match (served, reachable) {
                (true, Ok(())) => {
                    if state.served_healthy()
                        && let Err(reason) = prepare().await
                    {
                        tracing::warn!(target: TARGET, reason,
                            "the follow-up of a newly served or recovered chain failed");
                    }
                    probe
                }
                (true, Err(e)) => {
                    let unserve = state.served_failed(settings.failures_before_unserved);
                    tracing::warn!(target: TARGET, error = %e, failures = state.failures,
                        "served chain failed its probe");
                    if unserve {
                        chains.set_served(chain_id, false);
                        backoff = initial;
                    }
                    probe.min(initial)
                }
                (false, Ok(())) => match prepare().await {
                    Ok(()) => {
                        chains.set_served(chain_id, true);
                        state.served_now();
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

/// What [`keep_health`] remembers between the probes of a chain.
#[derive(Debug, Default)]
struct ProbeState {
    /// Failed probes in a row of the served chain.
    failures: u32,
    /// Served by the loop and not yet followed by a second `prepare`.
    just_served: bool,
}

impl ProbeState {
    /// A served chain answered its probe. Returns whether `prepare` runs again: at the
    /// first healthy probe after the loop served the chain, and at the first one after
    /// failed probes (the chain came back up without having been unserved), so that
    /// the runner wakes the work suspended on the chain at every down→up transition.
    fn served_healthy(&mut self) -> bool {
        let again = std::mem::take(&mut self.just_served) || self.failures > 0;
        self.failures = 0;
        again
    }

    /// A served chain failed its probe. Returns whether it stops being served (`limit`
    /// failed probes in a row).
    fn served_failed(&mut self, limit: u32) -> bool {
        self.failures = self.failures.saturating_add(1);
        self.failures >= limit
    }

    /// An unserved chain was prepared and is served now.
    fn served_now(&mut self) {
        self.just_served = true;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeState;

    /// Issue 32 §4: `prepare` (the runner's wake of `chain:<id>`) runs again at every
    /// down→up transition of a served chain, not only at the first: after a short
    /// outage that left the chain served, and after one that unserved it.
    #[test]
    fn prepare_runs_again_at_every_down_up_transition() {
        let mut s = ProbeState::default();
        // Served by the loop: the follow-up runs once, then steady probes do not.
        s.served_now();
        assert!(s.served_healthy(), "the follow-up of a newly served chain");
        assert!(!s.served_healthy());
        // Short outages (fewer failed probes than the limit), each followed by a wake.
        for _ in 0..2 {
            assert!(!s.served_failed(3));
            assert!(!s.served_failed(3));
            assert!(s.served_healthy(), "the chain came back up: wake");
            assert!(!s.served_healthy(), "no wake while it stays up");
        }
        // A long outage unserves the chain; serving it again wakes (in `prepare`
        // itself) and the follow-up wakes once more.
        assert!(!s.served_failed(3));
        assert!(!s.served_failed(3));
        assert!(s.served_failed(3), "unserved at the limit");
        s.served_now();
        assert!(s.served_healthy());
        assert!(!s.served_healthy());
    }
}
