//! The indexer's background loops on the shared service shape ([`keel_service`]): the
//! tip follow loop of a chain's owner ([`TipFollow`], run by [`follow_tip`]) and a
//! replica's history worker loop ([`HistoryDrain`], run by [`work_history`]). The
//! `keel` binary only wires them: it runs [`follow_tip`] as the cluster singleton
//! `index-tip/<chainId>` and [`work_history`] on every replica, both under its
//! supervisor.

use crate::history::settled_height;
use crate::read::indexed_tip;
use crate::tip::publish_health;
use crate::{FollowBackoff, HistoryWorker, IndexError, NextRound, TipConfig, TipIngest};
use keel_chain::{HeadSignal, UpstreamPool};
use keel_service::{BackgroundService, Report, ServiceConfig};
use keel_store::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

const TARGET: &str = "keel::index::service";

/// Blocks per planned history range.
pub const HISTORY_RANGE_BLOCKS: u64 = 2_000;

/// Before a chain's first tip commit, its owner plans the history below the settled
/// height (the `finalized` tag, else head − confirmations) as leased ranges that every
/// indexer replica's history worker claims, and starts the tip right above it. Once the
/// chain has a tip checkpoint, the tip continues from it and nothing is planned.
async fn plan_before_first_tip(
    db: &PgPool,
    node: &UpstreamPool,
    config: &TipConfig,
    confirmations: u64,
) -> crate::Result<TipConfig> {
    let mut config = config.clone();
    let chain = node.chain();
    if indexed_tip(db, chain).await?.is_some() {
        return Ok(config);
    }
    let settled = settled_height(node, confirmations).await?;
    let ranges = crate::plan_history(db, chain, settled, HISTORY_RANGE_BLOCKS).await?;
    tracing::info!(target: TARGET, chain = %chain, settled, ranges, "history planned below the first tip block");
    config.start_block = Some(settled.saturating_add(1));
    Ok(config)
}

#[derive(Debug)]
enum TipState {
    /// Not the owner yet: check the chain's health, plan history, take ownership.
    Starting { health_checked: bool },
    /// The owner: one [`TipIngest::round`] per run.
    Following(Box<TipIngest>),
    /// Degraded or fenced: the loop ended.
    Ended,
}

/// The tip follow loop of one chain while this replica owns it, as a
/// [`BackgroundService`] (`index-tip`).
///
/// Its first runs publish the chain's health and stop at once when it is degraded
/// (no new owner epoch, no restart loop, until an operator re-indexes it), then plan
/// the history below the settled height before the chain's first tip block and take
/// ownership (a new epoch), retrying every poll interval with a WARN when that fails.
/// Each later run is one [`TipIngest::round`], paced by [`FollowBackoff`] (unchanged:
/// at once while behind, the poll interval once caught up, its capped exponential
/// backoff after a node hole or a failed round, with its rate-limited warnings and
/// metrics): a failed round reaches the runner as a wait, not as an error, so the
/// runner's backoff does not apply twice. A fenced round (a newer owner: a handoff)
/// and a fatal one (a reorg below the finalized block: the chain is marked degraded)
/// end the loop; [`TipFollow::halted`] tells them apart.
#[derive(Debug)]
pub struct TipFollow {
    db: PgPool,
    node: Arc<UpstreamPool>,
    config: TipConfig,
    confirmations: u64,
    owner_id: String,
    poll: Duration,
    pace: FollowBackoff,
    state: TipState,
    halted: bool,
    /// Woken by every new head of a subscription, which hands the round its header
    /// ([`TipFollow::with_head_wake`]).
    heads: Option<Arc<HeadSignal>>,
}

impl TipFollow {
    /// The loop of `node`'s chain for the owner `owner_id`; `poll` is the wait once
    /// caught up (and between ownership attempts), `confirmations` sets the settled
    /// height where the node has no `finalized` tag.
    pub fn new(
        db: PgPool,
        node: Arc<UpstreamPool>,
        config: TipConfig,
        confirmations: u64,
        owner_id: impl Into<String>,
        poll: Duration,
    ) -> Self {
        let pace = FollowBackoff::new(node.chain(), poll);
        Self {
            db,
            node,
            config,
            confirmations,
            owner_id: owner_id.into(),
            poll,
            pace,
            state: TipState::Starting {
                health_checked: false,
            },
            halted: false,
            heads: None,
        }
    }

    /// Rounds start when `heads` is notified (a new head by subscription,
    /// [`keel_chain::watch_heads`]) and run up to the announced head
    /// ([`TipIngest::round_at`]: no `eth_blockNumber`, no re-read of that block's
    /// header), and otherwise every `fallback_poll` once caught up: the poll stays as
    /// the safety net for a subscription that is down or missed a head, at a slower pace
    /// than [`TipFollow::new`]'s `poll`.
    pub fn with_head_wake(mut self, heads: Arc<HeadSignal>, fallback_poll: Duration) -> Self {
        self.heads = Some(heads);
        self.poll = fallback_poll;
        self
    }

    /// True once the chain was found degraded, or a round was fatal: the chain must be
    /// held idle (not owned again in a loop) until the process stops.
    pub fn halted(&self) -> bool {
        self.halted
    }

    /// The runner's pacing: idle delay = the poll interval (the failure backoff is
    /// [`FollowBackoff`]'s).
    pub fn service_config(&self) -> ServiceConfig {
        ServiceConfig::new(self.poll)
    }

    fn halt(&mut self) -> Report {
        self.halted = true;
        self.state = TipState::Ended;
        Report::stop(0)
    }
}

impl BackgroundService for TipFollow {
    type Error = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "index-tip"
    }

    fn wake(&self) -> Option<&Notify> {
        self.heads.as_deref().map(HeadSignal::notify)
    }

    async fn run_once(&mut self) -> Result<Report, Self::Error> {
        match &mut self.state {
            TipState::Ended => Ok(Report::stop(0)),
            TipState::Starting { health_checked } => {
                if !*health_checked {
                    *health_checked = true;
                    if let Ok(health) = publish_health(&self.db, self.node.chain()).await
                        && let Some(d) = health.degraded
                    {
                        tracing::error!(target: TARGET, reason = %d.reason, since = %d.since, "the chain's index is degraded; tip ingest stays stopped until it is re-indexed");
                        return Ok(self.halt());
                    }
                }
                let planned =
                    plan_before_first_tip(&self.db, &self.node, &self.config, self.confirmations)
                        .await;
                let owned = match planned {
                    Ok(config) => {
                        TipIngest::take_ownership(
                            self.db.clone(),
                            self.node.clone(),
                            config,
                            &self.owner_id,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                };
                match owned {
                    Ok(ingest) => {
                        self.state = TipState::Following(Box::new(ingest));
                        Ok(Report::more_pending(0))
                    }
                    Err(e) => {
                        tracing::warn!(target: TARGET, error = %e, "taking tip ownership failed; retrying");
                        Ok(Report::after(0, self.poll))
                    }
                }
            }
            TipState::Following(ingest) => {
                let announced = self.heads.as_deref().and_then(HeadSignal::take);
                let result = ingest.round_at(announced).await;
                let (blocks, caught_up) = match &result {
                    Ok(out) => (
                        out.blocks,
                        out.missing.is_none() && out.tip.is_none_or(|t| t >= out.head),
                    ),
                    Err(_) => (0, false),
                };
                Ok(match self.pace.after(&result) {
                    NextRound::Now => Report::more_pending(blocks),
                    NextRound::Wait(_) if caught_up => Report::idle(blocks),
                    NextRound::Wait(wait) => Report::after(blocks, wait),
                    NextRound::GiveUp => {
                        self.state = TipState::Ended;
                        Report::stop(blocks)
                    }
                    // Fatal for the chain (logged once by FollowBackoff).
                    NextRound::Halt => self.halt(),
                })
            }
        }
    }
}

/// Runs [`TipFollow`] for `node`'s chain until `stop` fires (in the span
/// `index_tip{chain}`). A round fenced by a newer owner returns at once, unless that
/// owner is an operator's re-index ([`crate::reindex()`]): the loop then starts over
/// (plans the re-index's history and takes a new epoch). A degraded chain is held idle,
/// rather than owned again in a loop, until a re-index clears the marker (re-read
/// every poll interval, at least every second) or `stop` fires.
pub async fn follow_tip(
    db: PgPool,
    node: Arc<UpstreamPool>,
    config: TipConfig,
    confirmations: u64,
    owner_id: &str,
    poll: Duration,
    stop: CancellationToken,
) {
    follow_tip_with_heads(db, node, config, confirmations, owner_id, poll, None, stop).await;
}

/// [`follow_tip`], woken by new heads when `heads` is set: a `newHeads` subscription
/// ([`keel_chain::watch_heads`], run beside the loop until `stop` fires) starts a round
/// per head, and `poll` is then only the fallback pace (see
/// [`TipFollow::with_head_wake`]).
#[allow(clippy::too_many_arguments)]
pub async fn follow_tip_with_heads(
    db: PgPool,
    node: Arc<UpstreamPool>,
    config: TipConfig,
    confirmations: u64,
    owner_id: &str,
    poll: Duration,
    heads: Option<keel_chain::HeadWatchConfig>,
    stop: CancellationToken,
) {
    let chain = node.chain();
    async move {
        // The subscription lives as long as this loop (a child token of `stop`).
        let watch_stop = stop.child_token();
        let _watch_guard = watch_stop.clone().drop_guard();
        let wake = heads.map(|h| {
            let wake = Arc::new(HeadSignal::new());
            tokio::spawn(
                keel_chain::watch_heads(chain, h, wake.clone(), watch_stop)
                    .instrument(tracing::info_span!("index_heads", chain = %chain)),
            );
            wake
        });
        loop {
            let mut follow =
                TipFollow::new(db.clone(), node.clone(), config.clone(), confirmations, owner_id, poll);
            if let Some(wake) = &wake {
                follow = follow.with_head_wake(wake.clone(), poll);
            }
            let pacing = follow.service_config();
            keel_service::run(&mut follow, pacing, stop.clone()).await;
            if stop.is_cancelled() {
                return;
            }
            if follow.halted() {
                // Degraded: hold the chain idle (no ownership loop) until an operator's
                // re-index clears the marker, then start over.
                if !hold_while_degraded(&db, chain, poll, &stop).await {
                    return;
                }
                tracing::info!(target: TARGET, "the chain's degraded marker was cleared (re-index); tip ingest starts over");
                continue;
            }
            // Fenced. By a re-index: start over (plan its history, take a new epoch); by
            // another replica's owner (a handoff): this loop ends.
            match crate::reindex::owned_by_reindex(&db, chain).await {
                Ok(true) => {
                    tracing::info!(target: TARGET, "fenced by a re-index; tip ingest starts over");
                }
                _ => return,
            }
        }
    }
    .instrument(tracing::info_span!("index_tip", chain = %chain))
    .await;
}

/// Waits, re-reading the chain's health every `poll` (at least 1 s), until its degraded
/// marker is cleared (true) or `stop` fires (false).
async fn hold_while_degraded(
    db: &PgPool,
    chain: keel_units::ChainId,
    poll: Duration,
    stop: &CancellationToken,
) -> bool {
    let every = poll.max(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(every) => {}
        }
        if let Ok(h) = publish_health(db, chain).await
            && !h.is_degraded()
        {
            return true;
        }
    }
}

/// A replica's history worker loop for one chain, as a [`BackgroundService`]
/// (`index-history`): while the chain is served, each run drains the claimable ranges
/// ([`HistoryWorker::drain`], pipelined) and reports the ranges completed (more may be
/// pending when some were); while it is not served, a run waits until it is. A run is
/// cancel safe: stopping drops a range mid-flight, its transaction rolls back and the
/// range is offered again when its lease lapses (writes are fenced by attempt and
/// idempotent).
#[derive(Debug)]
pub struct HistoryDrain {
    worker: Arc<HistoryWorker>,
    serving: watch::Receiver<bool>,
}

impl HistoryDrain {
    /// The loop of `worker`, running while `serving` is true (a dropped sender ends it).
    pub fn new(worker: Arc<HistoryWorker>, serving: watch::Receiver<bool>) -> Self {
        Self { worker, serving }
    }
}

impl BackgroundService for HistoryDrain {
    type Error = IndexError;

    fn name(&self) -> &'static str {
        "index-history"
    }

    async fn run_once(&mut self) -> Result<Report, IndexError> {
        if !*self.serving.borrow_and_update() {
            return Ok(match self.serving.changed().await {
                Ok(()) => Report::more_pending(0),
                Err(_) => Report::stop(0),
            });
        }
        let done = self.worker.drain().await?;
        Ok(Report::pending(done.len() as u64, !done.is_empty()))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}

/// Runs [`HistoryDrain`] (in the span `index_history{chain}`) until `stop` fires or
/// `serving`'s sender is dropped: drains
/// while the chain is served, waits `poll` when idle and after a failed drain (its
/// range's lease lapses), waits for the chain while it is not served.
pub async fn work_history(
    worker: Arc<HistoryWorker>,
    serving: watch::Receiver<bool>,
    poll: Duration,
    stop: CancellationToken,
) {
    let pacing = ServiceConfig::new(poll).with_backoff(poll, poll);
    let span = tracing::info_span!("index_history", chain = %worker.chain());
    keel_service::run(HistoryDrain::new(worker, serving), pacing, stop)
        .instrument(span)
        .await;
}

/// Seals the pending snapshots of one chain once their block is final
/// ([`crate::snapshot::seal_due`]), so a snapshot turns final without anyone reading it
/// (a distribution or an export finds it sealed). Each run seals what is due and idles;
/// concurrent sealers (every indexer replica runs one) seal a snapshot once, under its
/// row lock. Cancel safe: a seal is one transaction.
#[derive(Debug)]
pub struct SnapshotSeal {
    pool: PgPool,
    chain: keel_units::ChainId,
}

impl SnapshotSeal {
    /// The sealer of `chain`'s snapshots.
    pub fn new(pool: PgPool, chain: keel_units::ChainId) -> Self {
        Self { pool, chain }
    }
}

impl BackgroundService for SnapshotSeal {
    type Error = IndexError;

    fn name(&self) -> &'static str {
        "snapshot-seal"
    }

    async fn run_once(&mut self) -> Result<Report, IndexError> {
        let sealed = crate::snapshot::seal_due(&self.pool, self.chain).await?;
        Ok(Report::idle(sealed))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}

/// Runs [`SnapshotSeal`] for `chain` (in the span `snapshot_seal{chain}`) every
/// `interval` until `stop` fires; a failed pass (the database) is logged and retried
/// after up to six intervals.
pub async fn seal_snapshots(
    pool: PgPool,
    chain: keel_units::ChainId,
    interval: Duration,
    stop: CancellationToken,
) {
    let pacing = ServiceConfig::new(interval).with_backoff(interval, interval * 6);
    let span = tracing::info_span!("snapshot_seal", chain = %chain);
    keel_service::run(SnapshotSeal::new(pool, chain), pacing, stop)
        .instrument(span)
        .await;
}
