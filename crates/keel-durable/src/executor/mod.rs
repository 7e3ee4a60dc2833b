//! The executor: claims commands, runs segments, ends each with its segment settle; wakes
//! on notifications, a timer for the earliest future command, and a poll fallback.
//!
//! One module per reason:
//! - [`claim`]: the one claim statement (the loop's and settle-and-claim-next's), the
//!   claimed row and the dead letters a claim reports;
//! - [`settle`]: the one segment-settle statement (every settle of a segment that ran,
//!   one row or many) and its group-commit combiner;
//! - [`segment`]: a slot running a claimed command's segment and deciding how it ends;
//! - [`finish`]: turning that decision into its settle, release or lone command settle;
//! - [`outcome`]: how a segment ended (the stored outcome code and metric label);
//! - [`rescuer`]: the maintenance service that requeues commands whose lease lapsed;
//! - [`wake`]: the LISTEN connection and the runner-version heartbeat;
//! - this module: the handle and the loop that claims for free slots.

mod claim;
mod finish;
mod outcome;
mod rescuer;
mod segment;
mod settle;
mod wake;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::ExecutorConfig;
use crate::engine::Engine;
use crate::metrics as m;
use crate::store;

pub(crate) use settle::SettleOp;
#[cfg(test)]
pub(crate) use {outcome::Outcome, settle::SettleRow};

/// The notification channel (`pg_notify('keel_durable', '')` on every command insert,
/// and on a segment settle that may make a command claimable for another executor).
pub const CHANNEL: &str = "keel_durable";

/// A running executor. Dropping the handle does not stop it; call
/// [`ExecutorHandle::shutdown`] or [`ExecutorHandle::abort`].
#[derive(Debug)]
pub struct ExecutorHandle {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl ExecutorHandle {
    /// Whether the executor's task has ended. It runs until [`ExecutorHandle::shutdown`]
    /// (or `abort`); an end before that (a panic) means nothing claims commands here
    /// any more, and the caller should restart or exit.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops claiming and waits for the running segments to settle.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }

    /// Stops claiming and waits up to `grace` for the running segments; then aborts
    /// the rest (their leases lapse). Returns true when everything settled in time.
    pub async fn shutdown_within(mut self, grace: Duration) -> bool {
        self.cancel.cancel();
        match tokio::time::timeout(grace, &mut self.task).await {
            Ok(_) => true,
            Err(_) => {
                self.task.abort();
                let _ = (&mut self.task).await;
                false
            }
        }
    }

    /// Stops at once, dropping running segments mid-flight (their leases lapse and
    /// another executor claims their commands): what a crash looks like to the database.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Aborts a task when dropped, so an aborted executor leaves no segment behind.
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn spawn(engine: Engine, config: ExecutorConfig) -> ExecutorHandle {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(Arc::new(engine), config, cancel.clone()));
    ExecutorHandle { cancel, task }
}

/// The executor loop: claims for every free slot in one statement and runs each claimed
/// command's segment in its slot; between claims it waits for a notification, the next
/// due command or lapsing lease, or the poll interval. Expired leases are the
/// [`rescuer`]'s (its own service beside the loop, poked when a lease is known lapsed).
async fn run(engine: Arc<Engine>, config: ExecutorConfig, cancel: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let _listener = config.listen.then(|| {
        AbortOnDrop(tokio::spawn(wake::listen(
            engine.pool.clone(),
            wake.clone(),
            cancel.clone(),
        )))
    });
    let names = engine.registry.claim_set();
    let runner = Uuid::new_v4();
    let _heartbeat = AbortOnDrop(tokio::spawn(wake::heartbeat(
        engine.pool.clone(),
        runner,
        names.clone(),
    )));
    let rescuer = rescuer::Rescuer::new(engine.pool.clone(), wake.clone());
    let rescue_now = rescuer.poke();
    let _rescuer = AbortOnDrop(tokio::spawn(keel_service::run(
        rescuer,
        keel_service::ServiceConfig::new(config.poll_interval),
        cancel.child_token(),
    )));
    let slot = Arc::new(segment::SlotContext {
        engine: engine.clone(),
        renew_every: config.renew_every(&engine.config),
        renew: config.renew_leases,
        names: Arc::new(names.clone()),
        cancel: cancel.clone(),
        listen: config.listen,
        backlog: AtomicBool::new(true),
    });
    let slots = Arc::new(Semaphore::new(config.concurrency));
    let mut segments: JoinSet<()> = JoinSet::new();
    // When the earliest lease (as of the last next-due query) lapses: an empty claim
    // pokes the rescuer only from then on (it runs at least once per poll interval anyway).
    let mut rescue_from: Option<Instant> = Some(Instant::now());
    loop {
        while segments.try_join_next().is_some() {}
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = cancel.cancelled() => break,
        };
        // Claim for every free slot in one statement.
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let wanted = permits.len();
        let claimed_at = Instant::now();
        let mut claim_at = None;
        let lease_secs = engine.config.lease.as_secs_f64();
        let claimed = claim::claim(&engine.pool, &names, lease_secs, wanted)
            .await
            .inspect(|c| {
                claim_at = c.at;
                slot.backlog.store(
                    c.claimed.len() + c.unreadable.len() >= wanted,
                    Ordering::Release,
                );
            });
        if let Ok(c) = &claimed
            && !c.unreadable.is_empty()
        {
            match engine.pool.acquire().await {
                Ok(mut conn) => {
                    claim::release_unreadable(&mut conn, &c.unreadable, lease_secs).await;
                }
                Err(e) => tracing::warn!(target: "keel::durable::executor",
                    error = %keel_store::StoreError::from(e),
                    "unreadable commands not released; their leases lapse"),
            }
        }
        let claimed = claimed.map(|c| c.claimed);
        match claimed {
            Ok(batch) if !batch.is_empty() => {
                let full = batch.len() >= wanted;
                claim::report_dead_letters(&engine, &batch).await;
                for c in batch {
                    if c.exhausted {
                        claim::dead_lettered(&c);
                        continue;
                    }
                    let Some(permit) = permits.pop() else { break };
                    m::claim_latency(&c.workflow, c.latency);
                    segments.spawn(segment::segment(
                        slot.clone(),
                        c,
                        claimed_at,
                        permit,
                        wake.clone(),
                    ));
                }
                drop(permits);
                if full {
                    continue;
                }
            }
            Ok(_) => {
                drop(permits);
                // A lease has lapsed: the rescuer requeues its command and wakes the loop.
                if rescue_from.is_some_and(|t| Instant::now() >= t) {
                    rescue_now.notify_one();
                }
            }
            Err(e) => {
                drop(permits);
                tracing::warn!(target: "keel::durable::executor",
                    error = %keel_store::StoreError::from(e), "claim failed");
            }
        }
        let mut pause = config.poll_interval;
        match store::queue_next_due(&engine.pool, claim_at).await {
            Ok(store::NextDue { next, lease, depth }) => {
                m::queue_depth(depth);
                let now = Instant::now();
                rescue_from = lease.map(|secs| now + Duration::from_secs_f64(secs.max(0.0)));
                for secs in [next, lease.filter(|s| *s > 0.0)].into_iter().flatten() {
                    let d = Duration::from_secs_f64(secs.max(0.0)) + Duration::from_millis(2);
                    pause = pause.min(d);
                }
            }
            Err(e) => {
                rescue_from = Some(Instant::now());
                tracing::warn!(target: "keel::durable::executor", error = %e, "next-due query failed")
            }
        }
        // Wait for work: a notification (or the rescuer's wake), the next due command or
        // lapsing lease (or the poll interval), or a segment whose end may have made work
        // (see `segment`). Without a listener, every segment end is a reason to claim again.
        let until = tokio::time::Instant::now() + pause;
        let stop = loop {
            tokio::select! {
                () = wake.notified() => break false,
                () = tokio::time::sleep_until(until) => break false,
                Some(_) = segments.join_next() => if !config.listen { break false },
                () = cancel.cancelled() => break true,
            }
        };
        if stop {
            break;
        }
    }
    while segments.join_next().await.is_some() {}
    drop(_heartbeat);
    if let Err(e) = crate::version::runner_deregister(&engine.pool, runner).await {
        tracing::warn!(target: "keel::durable::executor", error = %keel_store::StoreError::from(e),
            "runner version record not removed; it lapses");
    }
}
