//! The queue's two long-running loops on the shared background-service shape
//! ([`keel_service`]), run side by side by [`TxQueue::run`]:
//!
//! | service | name | one run | then |
//! |---|---|---|---|
//! | [`SenderRounds`] | `txq-rounds` | on a due tick, nonce recovery (every `recovery_every_ticks` ticks); then one round ([`TxQueue::round`]) | at once when the round signed something, else at the next tick or when an enqueue of this process wakes it |
//! | [`Confirmation`] | `txq-confirm` | the confirmation pass ([`TxQueue::confirm`]) and the queue gauges | at the next tick |
//!
//! A tick is due every `poll_interval`, counted from the start of the previous one (a
//! run longer than the interval is followed by the next at once; missed ticks are not
//! made up). A failed run waits one `poll_interval` (the wake ends that wait too, for
//! the rounds), logged and counted by [`keel_service::run`]. Both take the queue's
//! cancellation token into their passes, which check it between stages: a run is never
//! dropped mid-way, it returns early.

use super::{SENDERS_IN_FLIGHT, TxQueue};
use crate::{Result, TxqError};
use keel_service::{BackgroundService, Exit, Report, ServiceConfig};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A fixed cadence: a tick every `period`, counted from the start of the previous tick.
#[derive(Debug)]
struct Cadence {
    period: Duration,
    next: Instant,
}

impl Cadence {
    /// A cadence whose first tick is due at once.
    fn new(period: Duration) -> Self {
        Self {
            period,
            next: Instant::now(),
        }
    }

    /// True when a tick is due; the next one is then due a period from now.
    fn take_due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + self.period;
        true
    }

    /// Starts a tick now: the next one is due a period from now.
    fn start(&mut self) {
        self.next = Instant::now() + self.period;
    }

    /// How long until the next tick is due (zero when it is).
    fn remaining(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }
}

/// The sender rounds of one queue, as a [`BackgroundService`] (`txq-rounds`).
///
/// Each run: when a tick is due, nonce recovery for every registered sender first if
/// the tick count is a multiple of `recovery_every_ticks` (so at start, then
/// periodically); then one round for every sender with work (funding checks, signing,
/// the pipelined broadcast). A round that signed something reports more pending (more
/// may be queued than one round signs), so the next runs at once; otherwise the next
/// run waits for the next tick, which picks up requests recorded by other processes. An
/// enqueue through this queue in this process ends any wait at once
/// ([`BackgroundService::wake`]; a permit is stored while a run is under way).
pub(super) struct SenderRounds<'q> {
    queue: &'q TxQueue,
    cancel: CancellationToken,
    cadence: Cadence,
    ticks: u64,
}

impl<'q> SenderRounds<'q> {
    pub(super) fn new(queue: &'q TxQueue, cancel: CancellationToken) -> Self {
        Self {
            cadence: Cadence::new(queue.config.poll_interval),
            queue,
            cancel,
            ticks: 0,
        }
    }
}

impl BackgroundService for SenderRounds<'_> {
    type Error = TxqError;

    fn name(&self) -> &'static str {
        "txq-rounds"
    }

    async fn run_once(&mut self) -> Result<Report> {
        if self.cadence.take_due() {
            if self
                .ticks
                .is_multiple_of(self.queue.config.recovery_every_ticks.max(1))
            {
                self.queue.recover_all(&self.cancel).await;
            }
            self.ticks = self.ticks.wrapping_add(1);
        }
        if self.cancel.is_cancelled() {
            return Ok(Report::idle(0));
        }
        let round = self.queue.round(None, true, &self.cancel).await?;
        let done = u64::try_from(round.moved + round.broadcast).unwrap_or(u64::MAX);
        Ok(if round.signed > 0 {
            Report::more_pending(done)
        } else {
            Report::after(done, self.cadence.remaining())
        })
    }

    fn wake(&self) -> Option<&tokio::sync::Notify> {
        Some(&self.queue.wake)
    }
}

/// The confirmation pass of one queue and its gauges, as a [`BackgroundService`]
/// (`txq-confirm`): each run is one confirmation pass (receipts, settles, re-broadcasts
/// and fee bumps) followed by the queue-depth and in-flight gauges, one run per tick,
/// without waiting for the rounds. A failed gauge read is logged and does not fail the
/// run.
pub(super) struct Confirmation<'q> {
    queue: &'q TxQueue,
    cancel: CancellationToken,
    cadence: Cadence,
}

impl<'q> Confirmation<'q> {
    pub(super) fn new(queue: &'q TxQueue, cancel: CancellationToken) -> Self {
        Self {
            cadence: Cadence::new(queue.config.poll_interval),
            queue,
            cancel,
        }
    }
}

impl BackgroundService for Confirmation<'_> {
    type Error = TxqError;

    fn name(&self) -> &'static str {
        "txq-confirm"
    }

    async fn run_once(&mut self) -> Result<Report> {
        self.cadence.start();
        let settled = self.queue.confirm(&self.cancel).await;
        if !self.cancel.is_cancelled()
            && let Err(e) = self.queue.record_gauges().await
        {
            tracing::warn!(target: "keel::txq", error = %e, "queue gauges failed; retrying next tick");
        }
        let settled = u64::try_from(settled?).unwrap_or(u64::MAX);
        Ok(Report::after(settled, self.cadence.remaining()))
    }
}

/// The custody pass of one queue, as a [`BackgroundService`] (`txq-custody`): each run
/// is one custody pass ([`TxQueue::custody_round`]), one run per tick, beside the
/// rounds (a slow provider never delays local-key senders). Idle without custody
/// senders.
pub(super) struct CustodyPasses<'q> {
    queue: &'q TxQueue,
    cancel: CancellationToken,
    cadence: Cadence,
}

impl<'q> CustodyPasses<'q> {
    pub(super) fn new(queue: &'q TxQueue, cancel: CancellationToken) -> Self {
        Self {
            cadence: Cadence::new(queue.config.poll_interval),
            queue,
            cancel,
        }
    }
}

impl BackgroundService for CustodyPasses<'_> {
    type Error = TxqError;

    fn name(&self) -> &'static str {
        "txq-custody"
    }

    async fn run_once(&mut self) -> Result<Report> {
        self.cadence.start();
        let settled = self.queue.custody_round(&self.cancel).await?;
        let settled = u64::try_from(settled).unwrap_or(u64::MAX);
        Ok(Report::after(settled, self.cadence.remaining()))
    }
}

impl TxQueue {
    /// Runs the queue until `cancel` fires: two background services
    /// ([`keel_service::run`]) side by side, in the span `txq{chain_id}`.
    ///
    /// - Sender rounds (`txq-rounds`): a request recorded through this queue
    ///   ([`TxQueue::enqueue`] / [`TxQueue::enqueue_with`], this process) wakes the loop
    ///   for a round at once, and a round that signed something is followed by another
    ///   at once (more may be queued than one round signs); otherwise a round runs every
    ///   `poll_interval`, which picks up requests recorded by other processes. Nonce
    ///   recovery ([`TxQueue::recover_nonces`]) runs for every registered sender at start
    ///   and then every `recovery_every_ticks` intervals, between rounds.
    /// - The custody pass ([`TxQueue::custody_pass`], `txq-custody`) every
    ///   `poll_interval`, when custody senders are registered.
    /// - The confirmation pass ([`TxQueue::confirm_pass`]) and the queue gauges
    ///   (`txq-confirm`), every `poll_interval`, without waiting for rounds (it only
    ///   reads and settles `broadcast` requests, and replaces stuck ones at their own
    ///   nonce).
    ///
    /// A failed run is logged (WARN, target `keel::service`, with the service's name)
    /// and counted (`keel_service_runs_total{service, outcome="error"}`); the loop tries
    /// again after one `poll_interval` (the rounds sooner when an enqueue wakes them).
    ///
    /// Once `cancel` fires no new pass starts, and a pass under way stops at its next
    /// stage boundary: it checks the token before every database write and every
    /// broadcast, so nothing is written or sent after the token fired (a shard's new
    /// owner may be running its own passes by then). A write already sent completes.
    ///
    /// The future is `Send`: `tokio::spawn(async move { queue.run(token).await })` on
    /// an `Arc<TxQueue>` works.
    pub async fn run(&self, cancel: CancellationToken) {
        use tracing::Instrument;
        let poll = self.config.poll_interval;
        let pacing = ServiceConfig::new(poll).with_backoff(poll, poll);
        let rounds = keel_service::run(
            SenderRounds::new(self, cancel.clone()),
            pacing,
            cancel.clone(),
        );
        let confirmation = keel_service::run(
            Confirmation::new(self, cancel.clone()),
            pacing,
            cancel.clone(),
        );
        let custody = keel_service::run(CustodyPasses::new(self, cancel.clone()), pacing, cancel);
        async {
            let (_, _, _): (Exit, Exit, Exit) = tokio::join!(rounds, confirmation, custody);
        }
        .instrument(tracing::info_span!("txq", chain_id = self.chain_id))
        .await
    }

    /// [`TxQueue::recover_nonces`] for every registered sender, a few at once; a
    /// failure is logged and retried at the next recovery.
    async fn recover_all(&self, cancel: &CancellationToken) {
        use futures::StreamExt;
        let recoveries: Vec<_> = self
            .signers
            .keys()
            .map(|sender| self.recover(*sender, cancel))
            .collect();
        let results: Vec<Result<(bool, usize)>> = futures::stream::iter(recoveries)
            .buffer_unordered(SENDERS_IN_FLIGHT)
            .collect()
            .await;
        for r in results {
            if let Err(e) = r {
                tracing::warn!(target: "keel::txq", error = %e, "nonce recovery failed; retrying later");
            }
        }
    }
}
