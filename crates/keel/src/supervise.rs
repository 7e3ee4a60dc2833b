//! Supervision of a process's critical tasks.
//!
//! Every long-lived task a role depends on (the durable executor, the queue loops, tip
//! ingest, the history workers, job health, the API server, the
//! retention job, chain health) runs under a [`Supervisor`]. When such a task ends or
//! panics while the process is not stopping, the supervisor logs an ERROR naming it and
//!
//! - restarts it after a capped exponential backoff (`supervision.restartInitialMs`,
//!   doubling up to `supervision.restartMaxMs`), counting consecutive restarts (a task
//!   that ran for a minute since its last end starts counting from zero again); or,
//! - after `supervision.maxRestarts` consecutive restarts, or for a task that cannot be
//!   restarted (the shard owner's singleton supervisors, the API server, the executor),
//!   marks the process failed: [`Supervisor::failed`] resolves with the task's name and
//!   the binary drains and exits non-zero.
//!
//! Metrics (labels: the task's fixed name only):
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `keel_critical_task_restarts_total{task}` | counter | ends of a critical task followed by a restart |
//! | `keel_critical_task_failures_total{task}` | counter | ends that make the process exit |

use crate::config::SupervisionSettings;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TARGET: &str = "keel::supervise";

/// A task that ran this long since its previous end starts its restart count afresh.
pub const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

/// Watches critical tasks (see the module documentation). Cheap to clone; clones share
/// state.
#[derive(Debug, Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    initial: Duration,
    max: Duration,
    max_restarts: u32,
    stop: CancellationToken,
    failed: CancellationToken,
    reason: Mutex<Option<String>>,
}

impl Supervisor {
    /// A supervisor with `[supervision]`'s settings. `stop` is the process's stop
    /// token: once it fires, task ends are expected and not reported.
    pub fn new(settings: &SupervisionSettings, stop: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                initial: Duration::from_millis(settings.restart_initial_ms),
                max: Duration::from_millis(settings.restart_max_ms),
                max_restarts: settings.max_restarts,
                stop,
                failed: CancellationToken::new(),
                reason: Mutex::new(None),
            }),
        }
    }

    /// The process's stop token.
    pub fn stop_token(&self) -> CancellationToken {
        self.inner.stop.clone()
    }

    /// Whether the process is stopping (task ends are expected).
    pub fn is_stopping(&self) -> bool {
        self.inner.stop.is_cancelled()
    }

    /// Marks the process failed because critical task `task` ended (`reason`: what
    /// happened, without values). The first failure is kept; logs an ERROR naming the
    /// task. Ignored while the process is stopping.
    pub fn fail(&self, task: &str, reason: &str) {
        if self.is_stopping() {
            return;
        }
        tracing::error!(target: TARGET, task, reason,
            "critical task `{task}` ended and is not restarted: the process exits");
        metrics::counter!("keel_critical_task_failures_total", "task" => task.to_owned())
            .increment(1);
        let mut first = self
            .inner
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            *first = Some(format!("critical task `{task}` ended: {reason}"));
        }
        self.inner.failed.cancel();
    }

    /// Resolves when a critical task made the process fail, with a message naming the
    /// task.
    pub async fn failed(&self) -> String {
        self.inner.failed.cancelled().await;
        self.inner
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "a critical task ended".to_owned())
    }

    /// Whether a critical task made the process fail.
    pub fn is_failed(&self) -> bool {
        self.inner.failed.is_cancelled()
    }

    /// The restart bookkeeping of task `task` (a fixed name, also a metric label), for
    /// work that something else (re)starts, e.g. a singleton under its shard's lease.
    pub fn critical(&self, task: &'static str) -> Critical {
        Critical {
            supervisor: self.clone(),
            task,
            state: Arc::new(Mutex::new(RestartState::default())),
        }
    }

    /// Runs `make()` as critical task `task`, restarting it (a fresh `make()`) with
    /// backoff when it ends or panics, until the process stops (the running instance
    /// is then aborted) or the restart budget is spent (the process fails).
    pub fn spawn<F, Fut>(&self, task: &'static str, make: F) -> JoinHandle<()>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let critical = self.critical(task);
        let stop = self.stop_token();
        tokio::spawn(async move {
            loop {
                let mut running = tokio::spawn(make());
                let outcome = tokio::select! {
                    () = stop.cancelled() => {
                        running.abort();
                        let _ = running.await;
                        return;
                    }
                    r = &mut running => r,
                };
                let Some(delay) = critical.ended(outcome_of(&outcome)) else {
                    return;
                };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        })
    }

    /// Watches `handle`, the handle of a critical task that cannot be restarted from
    /// here (a shard owner's singleton supervisor): if it ends while the process runs,
    /// the process fails naming `task`. The returned handle aborts `handle` when aborted.
    pub fn watch(&self, task: &'static str, handle: JoinHandle<()>) -> JoinHandle<()> {
        let supervisor = self.clone();
        tokio::spawn(async move {
            let mut guard = AbortOnDrop(handle);
            let outcome = (&mut guard.0).await;
            supervisor.fail(task, outcome_of(&outcome));
        })
    }

    fn delay(&self, restarts: u32) -> Duration {
        let exp = restarts.saturating_sub(1).min(20);
        self.inner
            .initial
            .saturating_mul(1u32 << exp)
            .min(self.inner.max)
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn outcome_of(r: &Result<(), tokio::task::JoinError>) -> &'static str {
    match r {
        Ok(()) => "returned",
        Err(e) if e.is_panic() => "panicked",
        Err(_) => "was cancelled",
    }
}

#[derive(Debug, Default)]
struct RestartState {
    restarts: u32,
    last_end: Option<Instant>,
}

/// The restart bookkeeping of one critical task ([`Supervisor::critical`]). Clones
/// share the count.
#[derive(Debug, Clone)]
pub struct Critical {
    supervisor: Supervisor,
    task: &'static str,
    state: Arc<Mutex<RestartState>>,
}

impl Critical {
    /// Records an end of the task (`outcome`: `returned`, `panicked`, …). Returns the
    /// delay before the restart, or `None` when the process is stopping or has just
    /// been failed because the task spent its restart budget.
    pub fn ended(&self, outcome: &str) -> Option<Duration> {
        if self.supervisor.is_stopping() {
            return None;
        }
        let restarts = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if s.last_end
                .is_some_and(|t| now.duration_since(t) > RESTART_RESET_AFTER)
            {
                s.restarts = 0;
            }
            s.last_end = Some(now);
            s.restarts = s.restarts.saturating_add(1);
            s.restarts
        };
        let task = self.task;
        if restarts > self.supervisor.inner.max_restarts {
            self.supervisor.fail(
                task,
                &format!("{outcome}; restarted {} times in a row", restarts - 1),
            );
            return None;
        }
        let delay = self.supervisor.delay(restarts);
        tracing::error!(target: TARGET, task, outcome, restart = restarts,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "critical task `{task}` {outcome}; restarting after a backoff");
        metrics::counter!("keel_critical_task_restarts_total", "task" => task).increment(1);
        Some(delay)
    }

    /// Runs `work` (spawned, so a panic is caught) until it ends or `token` fires.
    /// `work` returns true when it ended as expected (e.g. fenced by a newer owner: a
    /// handoff), false when it should not have ended. An unexpected end (or a panic)
    /// while `token` has not fired is recorded ([`Critical::ended`]) and waited out with
    /// the backoff (bounded by `token`) before this returns, so a caller that starts the
    /// work again (a shard's singleton supervisor) restarts it with backoff. When
    /// `token` fires the work is expected to stop by itself; it is awaited.
    pub async fn run<Fut>(&self, token: &CancellationToken, work: Fut)
    where
        Fut: Future<Output = bool> + Send + 'static,
    {
        let outcome = tokio::spawn(work).await;
        if token.is_cancelled() || matches!(outcome, Ok(true)) {
            return;
        }
        let outcome = outcome.map(|_| ());
        if let Some(delay) = self.ended(outcome_of(&outcome)) {
            tokio::select! {
                () = token.cancelled() => {}
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_restarts: u32) -> SupervisionSettings {
        SupervisionSettings {
            restart_initial_ms: 10,
            restart_max_ms: 40,
            max_restarts,
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let s = Supervisor::new(&settings(10), CancellationToken::new());
        assert_eq!(s.delay(1), Duration::from_millis(10));
        assert_eq!(s.delay(2), Duration::from_millis(20));
        assert_eq!(s.delay(3), Duration::from_millis(40));
        assert_eq!(s.delay(30), Duration::from_millis(40));
    }

    #[tokio::test]
    async fn a_task_that_keeps_ending_is_restarted_then_fails_the_process() {
        let s = Supervisor::new(&settings(3), CancellationToken::new());
        let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&starts);
        let _h = s.spawn("test-task", move || {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                panic!("boom");
            }
        });
        let reason = s.failed().await;
        assert!(reason.contains("test-task"), "{reason}");
        // First start plus three restarts, then the budget is spent.
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_watched_handle_that_ends_fails_the_process() {
        let s = Supervisor::new(&settings(3), CancellationToken::new());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let inner = tokio::spawn(async move {
            let _ = rx.await;
        });
        let _w = s.watch("watched", inner);
        assert!(!s.is_failed());
        drop(tx);
        assert!(s.failed().await.contains("watched"));
    }

    #[tokio::test]
    async fn ends_after_stop_are_not_reported() {
        let stop = CancellationToken::new();
        let s = Supervisor::new(&settings(1), stop.clone());
        stop.cancel();
        assert_eq!(s.critical("t").ended("returned"), None);
        s.fail("t", "returned");
        assert!(!s.is_failed());
    }
}
