//! # keel-service
//!
//! The one shape of Keel's background loops (tip ingest, history workers, cron jobs,
//! retention, and the queue's rounds), in the spirit of River's maintenance services:
//! a service does one bounded piece of work per [`BackgroundService::run_once`] and
//! says what it found in a [`Report`]; [`run`] decides when to call it again.
//!
//! - [`Next::Now`] (more work is immediately pending: "did N, more pending") runs again
//!   at once;
//! - [`Next::Idle`] waits [`ServiceConfig::idle_delay`];
//! - [`Next::After`] waits the service's own delay (a cron job until its next cycle, the
//!   tip ingest's node-hole backoff);
//! - [`Next::Stop`] ends the loop (a handoff to a newer owner, a fatal condition the
//!   service has reported itself);
//! - an `Err` waits a capped exponential backoff with jitter
//!   ([`ServiceConfig::backoff_initial`] doubling up to [`ServiceConfig::backoff_max`],
//!   each delay shortened by up to 20 % at random so that replicas do not retry in
//!   lockstep), logged at WARN with the error; the next success resets it.
//!
//! A service that an event in its own process gives work (the queue's rounds, woken by
//! an enqueue) hands [`run`] a [`Notify`] ([`BackgroundService::wake`]): a
//! `notify_one` on it ends any of these waits at once, and one that came while the
//! service was running (a stored permit) ends the next wait at once.
//!
//! [`run`] stops when its [`CancellationToken`] fires: during a wait at once, and during
//! a `run_once` at once when the service says that dropping it mid-way is safe
//! ([`BackgroundService::cancel_safe`]), else when that `run_once` returns.
//!
//! Every service runs in a tracing span `service{service=<name>}` (target
//! `keel::service`).
//!
//! ## Metrics
//!
//! Labels from fixed sets only: `service` is the service's fixed
//! [`BackgroundService::name`], `outcome` one of [`Outcome::ALL`].
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `keel_service_runs_total` | counter | service, outcome | `run_once` calls by what they reported |
//! | `keel_service_run_seconds` | histogram | service | duration of one `run_once`, seconds |
//! | `keel_service_items_total` | counter | service | work items the runs reported ([`Report::done`]) |
//! | `keel_service_consecutive_failures` | gauge | service | failed runs since the last success |
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub mod trace;

const TARGET: &str = "keel::service";

/// What a service wants after one [`BackgroundService::run_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Next {
    /// More work is pending: run again at once.
    Now,
    /// Nothing left: wait [`ServiceConfig::idle_delay`].
    Idle,
    /// Wait this long (the service paces itself, e.g. until a cron job's next cycle).
    After(Duration),
    /// End the loop: [`run`] returns [`Exit::Stopped`].
    Stop,
}

/// What one [`BackgroundService::run_once`] did: how many work items it handled
/// (ranges, blocks, rows, cycles: the service says which) and what it wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Work items handled by this run.
    pub done: u64,
    /// When to run again.
    pub next: Next,
}

impl Report {
    /// Did `done` items and more are pending: run again at once.
    pub fn more_pending(done: u64) -> Self {
        Self {
            done,
            next: Next::Now,
        }
    }

    /// Did `done` items and nothing is left: wait the idle delay.
    pub fn idle(done: u64) -> Self {
        Self {
            done,
            next: Next::Idle,
        }
    }

    /// Did `done` items; `more` says whether more are pending (a queue round's
    /// "did N, more pending?").
    pub fn pending(done: u64, more: bool) -> Self {
        if more {
            Self::more_pending(done)
        } else {
            Self::idle(done)
        }
    }

    /// Did `done` items; run again after `wait` (zero: at once).
    pub fn after(done: u64, wait: Duration) -> Self {
        Self {
            done,
            next: Next::After(wait),
        }
    }

    /// Did `done` items; end the loop.
    pub fn stop(done: u64) -> Self {
        Self {
            done,
            next: Next::Stop,
        }
    }
}

/// One background loop's work, called again and again by [`run`].
pub trait BackgroundService: Send {
    /// What a failed run reports (logged by [`run`] at WARN; it must be value-free).
    type Error: std::fmt::Display + Send;

    /// The service's fixed name: a tracing field and the `service` metric label, so it
    /// must come from a small fixed set (`index-tip`, not `index-tip/1`).
    fn name(&self) -> &'static str;

    /// One bounded piece of work.
    ///
    /// # Errors
    /// Whatever failed; [`run`] backs off and calls it again.
    fn run_once(&mut self) -> impl Future<Output = Result<Report, Self::Error>> + Send;

    /// True when dropping a `run_once` future mid-way is safe (its writes are
    /// transactional and fenced, an interrupted claim lapses with its lease): [`run`]
    /// then stops at once when cancelled. Default false: a cancelled [`run`] lets the
    /// current `run_once` finish.
    fn cancel_safe(&self) -> bool {
        false
    }

    /// A handle that ends [`run`]'s wait after a run early, whatever the wait (the idle
    /// delay, the service's own delay, a backoff): a `notify_one` on it starts the next
    /// run at once (a permit stored while a run was under way: as soon as it returns).
    /// Default `None`: only the clock ends a wait.
    fn wake(&self) -> Option<&Notify> {
        None
    }
}

impl<S: BackgroundService> BackgroundService for &mut S {
    type Error = S::Error;

    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn run_once(&mut self) -> impl Future<Output = Result<Report, Self::Error>> + Send {
        (**self).run_once()
    }

    fn cancel_safe(&self) -> bool {
        (**self).cancel_safe()
    }

    fn wake(&self) -> Option<&Notify> {
        (**self).wake()
    }
}

/// Errors of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A setting is invalid (the field named, the value not shown).
    #[error("invalid service setting `{key}`: {reason}")]
    Config {
        /// The [`ServiceConfig`] field.
        key: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// The pacing of [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceConfig {
    /// Wait after a run that reported [`Next::Idle`].
    pub idle_delay: Duration,
    /// First wait after a failed run (at least 1 ms).
    pub backoff_initial: Duration,
    /// Longest wait after repeated failures (at least `backoff_initial`).
    pub backoff_max: Duration,
}

/// Default of [`ServiceConfig::backoff_initial`].
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Default of [`ServiceConfig::backoff_max`].
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);

impl ServiceConfig {
    /// `idle_delay` with the default backoff (100 ms doubling up to 30 s).
    pub fn new(idle_delay: Duration) -> Self {
        Self {
            idle_delay,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
        }
    }

    /// The same with the backoff `initial` doubling up to `max`.
    #[must_use]
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max;
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`ServiceError::Config`] naming `backoffInitial` (below 1 ms) or `backoffMax`
    /// (below `backoffInitial`).
    pub fn validate(&self) -> Result<(), ServiceError> {
        if self.backoff_initial < Duration::from_millis(1) {
            return Err(ServiceError::Config {
                key: "backoffInitial",
                reason: "must be at least 1 ms",
            });
        }
        if self.backoff_max < self.backoff_initial {
            return Err(ServiceError::Config {
                key: "backoffMax",
                reason: "must be at least backoffInitial",
            });
        }
        Ok(())
    }

    /// The backoff before retrying after `failures` consecutive failures (1 = the first),
    /// before jitter: `backoff_initial × 2^(failures−1)`, at most `backoff_max`.
    pub fn backoff(&self, failures: u32) -> Duration {
        let initial = self.backoff_initial.max(Duration::from_millis(1));
        let shift = failures.saturating_sub(1).min(30);
        initial
            .saturating_mul(1u32 << shift)
            .min(self.backoff_max.max(initial))
    }
}

/// How [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The cancellation token fired.
    Cancelled,
    /// The service reported [`Next::Stop`].
    Stopped,
}

/// The `outcome` label of `keel_service_runs_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Reported [`Next::Now`].
    MorePending,
    /// Reported [`Next::Idle`].
    Idle,
    /// Reported [`Next::After`].
    Wait,
    /// Reported [`Next::Stop`].
    Stop,
    /// Returned an error.
    Error,
}

impl Outcome {
    /// Every label value.
    pub const ALL: [&'static str; 5] = ["more_pending", "idle", "wait", "stop", "error"];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MorePending => "more_pending",
            Self::Idle => "idle",
            Self::Wait => "wait",
            Self::Stop => "stop",
            Self::Error => "error",
        }
    }

    fn of(next: Next) -> Self {
        match next {
            Next::Now => Self::MorePending,
            Next::Idle => Self::Idle,
            Next::After(_) => Self::Wait,
            Next::Stop => Self::Stop,
        }
    }
}

/// `d` shortened by a random part of up to 20 % (never longer than `d`).
fn jitter(d: Duration) -> Duration {
    // A fresh randomly keyed SipHash per call: std only, no extra dependency.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let fraction = (r % 1_000) as f64 / 1_000.0 * 0.2;
    d.mul_f64(1.0 - fraction)
}

/// Completes when `wake` is notified (never without one).
async fn woken(wake: Option<&Notify>) {
    match wake {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}

/// What [`run`] does after one run: wait (`Some`, zero = at once) or stop (`None`).
/// Keeps the consecutive failure count; pure, so the pacing is testable without time.
#[derive(Debug, Clone)]
struct Pacer {
    config: ServiceConfig,
    failures: u32,
}

impl Pacer {
    fn new(config: ServiceConfig) -> Self {
        Self {
            config,
            failures: 0,
        }
    }

    /// The wait after a successful run that reported `next`; `None` to stop.
    fn after_success(&mut self, next: Next) -> Option<Duration> {
        self.failures = 0;
        match next {
            Next::Now => Some(Duration::ZERO),
            Next::Idle => Some(self.config.idle_delay),
            Next::After(d) => Some(d),
            Next::Stop => None,
        }
    }

    /// The (jittered) backoff after a failed run.
    fn after_failure(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        jitter(self.config.backoff(self.failures))
    }
}

/// Runs `service` until `cancel` fires or it reports [`Next::Stop`] (see the crate
/// documentation for the pacing, the wake handle, logging and metrics). Returns how it ended. A failed
/// run is logged, counted and retried after a backoff. An invalid `config` is clamped
/// (backoff at least 1 ms, max at least initial); call [`ServiceConfig::validate`]
/// where settings come from configuration.
pub async fn run<S: BackgroundService>(
    mut service: S,
    config: ServiceConfig,
    cancel: CancellationToken,
) -> Exit {
    let name = service.name();
    let span = tracing::info_span!(target: TARGET, "service", service = name);
    async move {
        tracing::debug!(target: TARGET, "service started");
        let mut pacer = Pacer::new(config);
        metrics::gauge!("keel_service_consecutive_failures", "service" => name).set(0.0);
        loop {
            if cancel.is_cancelled() {
                return Exit::Cancelled;
            }
            let started = Instant::now();
            let result = if service.cancel_safe() {
                tokio::select! {
                    () = cancel.cancelled() => return Exit::Cancelled,
                    r = service.run_once() => r,
                }
            } else {
                service.run_once().await
            };
            metrics::histogram!("keel_service_run_seconds", "service" => name)
                .record(started.elapsed().as_secs_f64());
            let wait = match result {
                Ok(report) => {
                    if pacer.failures > 0 {
                        tracing::info!(target: TARGET, failures = pacer.failures, "service recovered");
                        metrics::gauge!("keel_service_consecutive_failures", "service" => name)
                            .set(0.0);
                    }
                    metrics::counter!("keel_service_runs_total", "service" => name, "outcome" => Outcome::of(report.next).as_str())
                        .increment(1);
                    metrics::counter!("keel_service_items_total", "service" => name)
                        .increment(report.done);
                    let Some(wait) = pacer.after_success(report.next) else {
                        tracing::debug!(target: TARGET, "service stopped itself");
                        return Exit::Stopped;
                    };
                    wait
                }
                Err(e) => {
                    let delay = pacer.after_failure();
                    metrics::gauge!("keel_service_consecutive_failures", "service" => name)
                        .set(f64::from(pacer.failures));
                    metrics::counter!("keel_service_runs_total", "service" => name, "outcome" => Outcome::Error.as_str())
                        .increment(1);
                    tracing::warn!(target: TARGET, error = %e, failures = pacer.failures,
                        backoff_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        "service run failed; backing off");
                    delay
                }
            };
            if wait.is_zero() {
                tokio::task::yield_now().await;
            } else {
                let wake = service.wake();
                // Biased: a fired token wins over a due wake or timer (no extra run).
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Exit::Cancelled,
                    () = woken(wake) => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_gauge!(
        "keel_service_consecutive_failures",
        ::metrics::Unit::Count,
        "Consecutive failed runs of a background service loop (count)."
    );
    ::metrics::describe_counter!(
        "keel_service_items_total",
        ::metrics::Unit::Count,
        "Items processed by background service loops (count)."
    );
    ::metrics::describe_histogram!(
        "keel_service_run_seconds",
        ::metrics::Unit::Seconds,
        "Duration of one run of a background service loop (seconds)."
    );
    ::metrics::describe_counter!(
        "keel_service_runs_total",
        ::metrics::Unit::Count,
        "Runs of background service loops (count)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    /// A scripted service: returns the scripted results in order, then hangs (or
    /// idles) so that a test can cancel it; counts its calls.
    struct Script {
        results: VecDeque<Result<Report, &'static str>>,
        calls: Arc<Mutex<u32>>,
        safe: bool,
        release: Option<tokio::sync::oneshot::Receiver<()>>,
    }

    impl Script {
        fn new(results: Vec<Result<Report, &'static str>>) -> Self {
            Self {
                results: results.into(),
                calls: Arc::default(),
                safe: false,
                release: None,
            }
        }
    }

    impl BackgroundService for Script {
        type Error = &'static str;

        fn name(&self) -> &'static str {
            "test"
        }

        async fn run_once(&mut self) -> Result<Report, &'static str> {
            *self.calls.lock().unwrap() += 1;
            if let Some(r) = self.results.pop_front() {
                return r;
            }
            match self.release.take() {
                Some(rx) => {
                    let _ = rx.await;
                }
                None => std::future::pending::<()>().await,
            }
            Ok(Report::more_pending(0))
        }

        fn cancel_safe(&self) -> bool {
            self.safe
        }
    }

    /// An idle delay and backoffs far longer than any test: a test that completes
    /// proves that nothing waited for them.
    fn long() -> ServiceConfig {
        ServiceConfig::new(Duration::from_secs(3_600))
            .with_backoff(Duration::from_secs(3_600), Duration::from_secs(7_200))
    }

    async fn until_calls(calls: &Arc<Mutex<u32>>, n: u32) {
        while *calls.lock().unwrap() < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn more_pending_runs_again_at_once() {
        let s = Script::new(vec![
            Ok(Report::more_pending(3)),
            Ok(Report::pending(2, true)),
            Ok(Report::after(1, Duration::ZERO)),
            Ok(Report::stop(0)),
        ]);
        let calls = s.calls.clone();
        assert_eq!(
            run(s, long(), CancellationToken::new()).await,
            Exit::Stopped
        );
        assert_eq!(*calls.lock().unwrap(), 4);
    }

    #[test]
    fn idle_waits_the_idle_delay_and_after_the_services_delay() {
        let mut p = Pacer::new(ServiceConfig::new(Duration::from_secs(10)));
        assert_eq!(p.after_success(Next::Now), Some(Duration::ZERO));
        assert_eq!(p.after_success(Next::Idle), Some(Duration::from_secs(10)));
        assert_eq!(
            p.after_success(Next::After(Duration::from_millis(1_500))),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(p.after_success(Next::Stop), None);
        assert_eq!(Report::pending(4, false), Report::idle(4));
    }

    #[tokio::test]
    async fn an_idle_service_is_not_run_again_before_the_idle_delay() {
        let s = Script::new(vec![Ok(Report::idle(1))]);
        let calls = s.calls.clone();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(s, long(), cancel.clone()));
        until_calls(&calls, 1).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
        assert_eq!(task.await.unwrap(), Exit::Cancelled);
        assert_eq!(
            *calls.lock().unwrap(),
            1,
            "idle: waited instead of running again"
        );
    }

    #[test]
    fn backoff_doubles_is_capped_and_resets_after_a_success() {
        let c = ServiceConfig::new(Duration::ZERO)
            .with_backoff(Duration::from_secs(1), Duration::from_secs(8));
        let full: Vec<u64> = (1..=6).map(|n| c.backoff(n).as_secs()).collect();
        assert_eq!(full, vec![1, 2, 4, 8, 8, 8]);
        assert!(c.validate().is_ok());
        let bad = c.with_backoff(Duration::from_secs(2), Duration::from_secs(1));
        assert!(bad.validate().is_err());

        // Each failure waits its backoff shortened by at most 20 % of jitter.
        let within = |got: Duration, full: u64| {
            let full = Duration::from_secs(full);
            got <= full && got >= full.mul_f64(0.8)
        };
        let mut p = Pacer::new(c);
        for full in [1, 2, 4, 8, 8] {
            let got = p.after_failure();
            assert!(within(got, full), "{got:?} for {full} s");
        }
        assert_eq!(p.after_success(Next::Now), Some(Duration::ZERO));
        let got = p.after_failure();
        assert!(
            within(got, 1),
            "the backoff restarts after a success: {got:?}"
        );
    }

    #[tokio::test]
    async fn a_failing_service_backs_off_instead_of_running_again() {
        let s = Script::new(vec![Err("down")]);
        let calls = s.calls.clone();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(s, long(), cancel.clone()));
        until_calls(&calls, 1).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
        assert_eq!(task.await.unwrap(), Exit::Cancelled);
        assert_eq!(*calls.lock().unwrap(), 1);
    }

    #[tokio::test]
    async fn cancel_interrupts_a_cancel_safe_run() {
        let mut s = Script::new(vec![]);
        s.safe = true;
        let calls = s.calls.clone();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(s, long(), cancel.clone()));
        until_calls(&calls, 1).await;
        cancel.cancel();
        assert_eq!(task.await.unwrap(), Exit::Cancelled);
    }

    #[tokio::test]
    async fn cancel_lets_a_run_that_is_not_cancel_safe_finish_then_stops() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let mut s = Script::new(vec![]);
        s.release = Some(released);
        let calls = s.calls.clone();
        let cancel = CancellationToken::new();
        let mut task = tokio::spawn(run(s, long(), cancel.clone()));
        until_calls(&calls, 1).await;
        cancel.cancel();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!task.is_finished(), "the run in progress is not dropped");
        release.send(()).unwrap();
        assert_eq!((&mut task).await.unwrap(), Exit::Cancelled);
        assert_eq!(*calls.lock().unwrap(), 1, "no run starts after the cancel");
    }

    /// A service that reports the scripted results, then idles, with a wake handle.
    struct Woken {
        results: VecDeque<Result<Report, &'static str>>,
        calls: Arc<Mutex<u32>>,
        wake: Arc<Notify>,
    }

    impl BackgroundService for Woken {
        type Error = &'static str;

        fn name(&self) -> &'static str {
            "test"
        }

        async fn run_once(&mut self) -> Result<Report, &'static str> {
            *self.calls.lock().unwrap() += 1;
            self.results.pop_front().unwrap_or(Ok(Report::idle(0)))
        }

        fn wake(&self) -> Option<&Notify> {
            Some(&self.wake)
        }
    }

    async fn idles_at(calls: &Arc<Mutex<u32>>, n: u32) {
        until_calls(calls, n).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(*calls.lock().unwrap(), n, "waited instead of running again");
    }

    #[tokio::test]
    async fn a_wake_ends_the_idle_wait_and_a_stored_permit_the_next_one() {
        let wake = Arc::new(Notify::new());
        let s = Woken {
            results: VecDeque::from([Ok(Report::after(1, Duration::from_secs(3_600)))]),
            calls: Arc::default(),
            wake: wake.clone(),
        };
        let calls = s.calls.clone();
        // Notified before the first run (as if during it): the first wait ends at once.
        wake.notify_one();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(s, long(), cancel.clone()));
        // Run 1 reported a wait of an hour; the stored permit started run 2.
        idles_at(&calls, 2).await;
        // Run 2 idles (an hour): a notify starts run 3 at once.
        wake.notify_one();
        idles_at(&calls, 3).await;
        cancel.cancel();
        assert_eq!(task.await.unwrap(), Exit::Cancelled);
    }

    #[tokio::test]
    async fn a_wake_ends_a_backoff_too() {
        let wake = Arc::new(Notify::new());
        let s = Woken {
            results: VecDeque::from([Err("down")]),
            calls: Arc::default(),
            wake: wake.clone(),
        };
        let calls = s.calls.clone();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(s, long(), cancel.clone()));
        // Run 1 failed: an hour of backoff, ended by the notify.
        idles_at(&calls, 1).await;
        wake.notify_one();
        idles_at(&calls, 2).await;
        cancel.cancel();
        assert_eq!(task.await.unwrap(), Exit::Cancelled);
    }

    #[tokio::test]
    async fn a_mutable_reference_is_a_service_too() {
        let mut s = Script::new(vec![Ok(Report::stop(0))]);
        assert_eq!(
            run(&mut s, long(), CancellationToken::new()).await,
            Exit::Stopped
        );
        assert_eq!(*s.calls.lock().unwrap(), 1);
        assert_eq!(Outcome::ALL.len(), 5);
    }
}
