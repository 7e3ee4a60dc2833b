//! Cron with stable cycle keys (`cron_cycle`): a job runs on one owner per cycle, and a
//! cycle recorded by one owner is never started again by another.

use crate::{ClusterError, Result, ShardLease};
use keel_service::{BackgroundService, Report, ServiceConfig};
use sqlx::PgPool;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};
use uuid::Uuid;

const TARGET: &str = "keel::cluster::cron";

/// When a cron job's cycles are scheduled: every `period`, aligned to the Unix epoch plus
/// `offset` (database clock). `Schedule::every(1 h)` runs at the top of each UTC hour;
/// `Schedule::every(24 h).offset(3 h)` daily at 03:00 UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    period: Duration,
    offset: Duration,
}

impl Schedule {
    /// Cycles every `period` (at least 1 ms; sub-millisecond parts are ignored).
    pub fn every(period: Duration) -> Self {
        Self {
            period,
            offset: Duration::ZERO,
        }
    }

    /// Shifts every cycle by `offset` (taken modulo the period).
    pub fn offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    fn period_us(&self) -> i64 {
        i64::try_from(self.period.as_millis())
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000)
    }

    fn offset_us(&self) -> i64 {
        let p = self.period_us().max(1);
        i64::try_from(self.offset.as_micros()).unwrap_or(0) % p
    }

    /// The latest cycle time (Unix µs) at or before `now_us`.
    fn due_at_or_before(&self, now_us: i64) -> i64 {
        let p = self.period_us().max(1);
        let off = self.offset_us();
        (now_us - off).div_euclid(p) * p + off
    }
}

/// Settings of one cron job.
#[derive(Debug, Clone)]
pub struct CronJob {
    /// The job's name, part of every cycle key: `^[a-z][a-z0-9_./-]{0,127}$`. It also
    /// decides the owning shard (`shard_of("cron/" + name)`).
    pub name: String,
    /// When cycles are due.
    pub schedule: Schedule,
    /// At most this many missed cycles are run per pass when catching up after
    /// downtime (default 24); the remaining gap is logged and worked off in the next
    /// passes. The first run of a job never backfills: it starts at the latest due cycle.
    pub max_catch_up_per_pass: u32,
}

impl CronJob {
    /// A job with the default catch-up bound (24 cycles per pass).
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Self {
        Self {
            name: name.into(),
            schedule,
            max_catch_up_per_pass: 24,
        }
    }

    /// Validates the name and schedule.
    ///
    /// # Errors
    /// [`ClusterError::Config`].
    pub fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && self.name.starts_with(|c: char| c.is_ascii_lowercase())
            && self.name.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '/' | '-')
            });
        if !name_ok {
            return Err(ClusterError::Config {
                key: "cron.name",
                reason: "must match ^[a-z][a-z0-9_./-]{0,127}$",
            });
        }
        if self.schedule.period < Duration::from_millis(1) {
            return Err(ClusterError::Config {
                key: "cron.period",
                reason: "must be at least 1 ms",
            });
        }
        if self.max_catch_up_per_pass == 0 {
            return Err(ClusterError::Config {
                key: "cron.maxCatchUpPerPass",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }
}

/// One cycle of a cron job, handed to the job.
#[derive(Debug, Clone)]
pub struct CronCycle {
    /// The job's name.
    pub name: String,
    /// The cycle's scheduled time (the second half of its key).
    pub scheduled_at: SystemTime,
    /// Fires when this replica loses the job's shard: the job must stop writing. The
    /// cycle stays recorded and is not started again elsewhere.
    pub token: CancellationToken,
}

/// Outcome of a recorded cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CronOutcome {
    /// The job returned `Ok`.
    Succeeded,
    /// The job returned `Err` (logged; the text is not stored).
    Failed,
}

impl CronOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// What a successful cycle reports: the number of work items it handled, recorded in
/// `cron_cycle.items` so that "ran and found nothing" (`Some(0)`) is visible. `()` reports
/// nothing (`None`); `u64` reports a count.
pub trait CronReport {
    /// Work items handled by the cycle, when the job counts them.
    fn items(&self) -> Option<u64>;
}

impl CronReport for () {
    fn items(&self) -> Option<u64> {
        None
    }
}

impl CronReport for u64 {
    fn items(&self) -> Option<u64> {
        Some(*self)
    }
}

fn to_system_time(us: i64) -> SystemTime {
    match u64::try_from(us) {
        Ok(us) => UNIX_EPOCH + Duration::from_micros(us),
        Err(_) => UNIX_EPOCH - Duration::from_micros(us.unsigned_abs()),
    }
}

fn to_unix_us(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, |us| -us),
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

async fn db_now_us(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8")
            .fetch_one(pool)
            .await?,
    )
}

async fn last_recorded_us(pool: &PgPool, name: &str) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT (extract(epoch FROM max(scheduled_at)) * 1000000)::int8 \
         FROM cron_cycle WHERE name = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await?)
}

/// Records the cycle before it starts; false when it is already recorded (by any
/// replica), in which case it must not run.
async fn claim(pool: &PgPool, name: &str, at_us: i64, replica: Uuid) -> Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO cron_cycle (name, scheduled_at, replica_id) \
         VALUES ($1, timestamptz 'epoch' + $2 * interval '1 microsecond', $3) \
         ON CONFLICT (name, scheduled_at) DO NOTHING",
    )
    .bind(name)
    .bind(at_us)
    .bind(replica)
    .execute(pool)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

async fn finish(
    pool: &PgPool,
    name: &str,
    at_us: i64,
    replica: Uuid,
    outcome: CronOutcome,
    items: Option<u64>,
) -> Result<()> {
    sqlx::query(
        "UPDATE cron_cycle SET finished_at = clock_timestamp(), outcome = $4, items = $5 \
         WHERE name = $1 AND scheduled_at = timestamptz 'epoch' + $2 * interval '1 microsecond' \
           AND replica_id = $3 AND finished_at IS NULL",
    )
    .bind(name)
    .bind(at_us)
    .bind(replica)
    .bind(outcome.as_str())
    .bind(items.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
    .execute(pool)
    .await?;
    Ok(())
}

/// Records (or updates) the job's schedule in `cron_job`, so that [`job_health`] can
/// judge it from any process. The owner of a job does this when it starts running it;
/// replicas that may run a job call it at startup so an owner that never starts shows
/// as overdue rather than unknown.
///
/// # Errors
/// [`ClusterError::Config`] for an invalid job; [`ClusterError::Store`] on database
/// failure.
pub async fn register_job(pool: &PgPool, job: &CronJob) -> Result<()> {
    job.validate()?;
    let period_ms = duration_ms(job.schedule.period).max(1);
    let offset_ms = job.schedule.offset_us() / 1000;
    sqlx::query(
        "INSERT INTO cron_job (name, period_ms, offset_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (name) DO UPDATE SET period_ms = EXCLUDED.period_ms, \
           offset_ms = EXCLUDED.offset_ms, updated_at = now() \
         WHERE (cron_job.period_ms, cron_job.offset_ms) \
               IS DISTINCT FROM (EXCLUDED.period_ms, EXCLUDED.offset_ms)",
    )
    .bind(&job.name)
    .bind(period_ms)
    .bind(offset_ms)
    .execute(pool)
    .await?;
    Ok(())
}

/// What `cron_cycle` says about one job (the raw record; [`job_health`] judges it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronStatus {
    /// The latest recorded cycle's scheduled time.
    pub last_scheduled_at: Option<SystemTime>,
    /// Its outcome; `None` while running or when its owner was lost mid-run.
    pub last_outcome: Option<CronOutcome>,
    /// Work items the latest cycle reported (`Some(0)`: it ran and found nothing).
    pub last_items: Option<u64>,
    /// Scheduled time of the latest cycle that succeeded.
    pub last_success_at: Option<SystemTime>,
    /// Duration of the latest finished cycle.
    pub last_duration: Option<Duration>,
    /// Number of recorded cycles (attempts: a cycle is started at most once).
    pub cycles: i64,
}

fn parse_outcome(o: &str) -> CronOutcome {
    if o == "succeeded" {
        CronOutcome::Succeeded
    } else {
        CronOutcome::Failed
    }
}

/// Reads the [`CronStatus`] of the job `name`.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn cron_status(pool: &PgPool, name: &str) -> Result<CronStatus> {
    type Row = (
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        i64,
    );
    let row: Row = sqlx::query_as(
        "SELECT \
           (extract(epoch FROM l.scheduled_at) * 1000000)::int8, l.outcome, l.items, \
           (SELECT (extract(epoch FROM max(scheduled_at)) * 1000000)::int8 FROM cron_cycle \
             WHERE name = $1 AND outcome = 'succeeded'), \
           (SELECT (extract(epoch FROM finished_at - started_at) * 1000000)::int8 FROM cron_cycle \
             WHERE name = $1 AND finished_at IS NOT NULL ORDER BY scheduled_at DESC LIMIT 1), \
           (SELECT count(*) FROM cron_cycle WHERE name = $1) \
         FROM (SELECT 1) one \
         LEFT JOIN LATERAL (SELECT scheduled_at, outcome, items FROM cron_cycle \
                             WHERE name = $1 ORDER BY scheduled_at DESC LIMIT 1) l ON true",
    )
    .bind(name)
    .fetch_one(pool)
    .await?;
    let (last, outcome, items, success, duration, cycles) = row;
    Ok(CronStatus {
        last_scheduled_at: last.map(to_system_time),
        last_outcome: outcome.as_deref().map(parse_outcome),
        last_items: items.and_then(|n| u64::try_from(n).ok()),
        last_success_at: success.map(to_system_time),
        last_duration: duration
            .and_then(|us| u64::try_from(us).ok())
            .map(Duration::from_micros),
        cycles,
    })
}

/// The health of a scheduled job at a point in time, judged from `cron_job` (its period)
/// and its latest *started* cycle in `cron_cycle`. The states are exclusive and checked
/// in this order:
///
/// 1. [`JobHealth::Unknown`]: the job is not registered and has no cycles;
/// 2. [`JobHealth::StoppedReporting`]: the latest cycle started but has not finished
///    within one period (its owner was lost mid-run, or the job hangs);
/// 3. [`JobHealth::Running`]: the latest cycle started less than a period ago and runs;
/// 4. [`JobHealth::Overdue`]: no cycle started within 2 × period (of `now`), or, for a job
///    that never ran, within 2 × period of its registration: nobody runs the job;
/// 5. otherwise the latest cycle's outcome: [`JobHealth::Failed`],
///    [`JobHealth::FoundNothing`] (succeeded reporting 0 items) or
///    [`JobHealth::Succeeded`]; or [`JobHealth::Pending`] when registered recently and
///    no cycle is due yet.
///
/// For a job with cycles but no registration (no period known), 2 and 4 cannot be told
/// and the latest outcome is reported.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobHealth {
    /// Neither registered nor ever run.
    Unknown,
    /// Registered less than 2 × period ago; no cycle has started yet.
    Pending,
    /// The latest cycle is running (started less than a period ago).
    Running {
        /// The running cycle's scheduled time.
        scheduled_at: SystemTime,
    },
    /// The latest cycle succeeded and handled work (or does not count its work).
    Succeeded {
        /// Its scheduled time.
        scheduled_at: SystemTime,
        /// Work items it reported, if it counts them.
        items: Option<u64>,
    },
    /// The latest cycle succeeded and found nothing to do (reported 0 items).
    FoundNothing {
        /// Its scheduled time.
        scheduled_at: SystemTime,
    },
    /// The latest cycle failed.
    Failed {
        /// Its scheduled time.
        scheduled_at: SystemTime,
        /// Scheduled time of the latest successful cycle, if any.
        last_success_at: Option<SystemTime>,
    },
    /// No cycle started within 2 × period.
    Overdue {
        /// When the latest cycle started (`None`: never).
        last_started_at: Option<SystemTime>,
        /// How long past the 2 × period bound `now` is.
        overdue_by: Duration,
    },
    /// The latest cycle started more than a period ago and never reported an outcome.
    StoppedReporting {
        /// The silent cycle's scheduled time.
        scheduled_at: SystemTime,
        /// When it started.
        started_at: SystemTime,
    },
}

impl JobHealth {
    /// Every state label, the value set of the `state` metric label.
    pub const STATES: [&'static str; 8] = [
        "unknown",
        "pending",
        "running",
        "succeeded",
        "found_nothing",
        "failed",
        "overdue",
        "stopped_reporting",
    ];

    /// The state's label (one of [`JobHealth::STATES`]).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Pending => "pending",
            Self::Running { .. } => "running",
            Self::Succeeded { .. } => "succeeded",
            Self::FoundNothing { .. } => "found_nothing",
            Self::Failed { .. } => "failed",
            Self::Overdue { .. } => "overdue",
            Self::StoppedReporting { .. } => "stopped_reporting",
        }
    }

    /// True for the states an operator should be alerted on (failed, overdue, stopped
    /// reporting).
    pub fn is_alarming(&self) -> bool {
        matches!(
            self,
            Self::Failed { .. } | Self::Overdue { .. } | Self::StoppedReporting { .. }
        )
    }
}

/// Judges the health of the job `name` at `now` (see [`JobHealth`] for the rules). Pass
/// the database clock ([`db_now`]) outside tests: cycle times are the database's.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn job_health(pool: &PgPool, name: &str, now: SystemTime) -> Result<JobHealth> {
    type Row = (
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<i64>,
    );
    let (period_ms, registered, scheduled, started, outcome, items, success): Row = sqlx::query_as(
        "SELECT j.period_ms, (extract(epoch FROM j.registered_at) * 1000000)::int8, \
                    (extract(epoch FROM l.scheduled_at) * 1000000)::int8, \
                    (extract(epoch FROM l.started_at) * 1000000)::int8, \
                    l.outcome, l.items, \
                    (SELECT (extract(epoch FROM max(scheduled_at)) * 1000000)::int8 \
                       FROM cron_cycle WHERE name = $1 AND outcome = 'succeeded') \
               FROM (SELECT 1) one \
               LEFT JOIN cron_job j ON j.name = $1 \
               LEFT JOIN LATERAL (SELECT scheduled_at, started_at, outcome, items FROM cron_cycle \
                                   WHERE name = $1 ORDER BY started_at DESC, scheduled_at DESC \
                                   LIMIT 1) l ON true",
    )
    .bind(name)
    .fetch_one(pool)
    .await?;
    let now_us = to_unix_us(now);
    let period_us = period_ms.map(|ms| ms.saturating_mul(1000).max(1));
    let (Some(scheduled), Some(started)) = (scheduled, started) else {
        return Ok(match (period_us, registered) {
            (Some(p), Some(reg)) => {
                let late = now_us - reg - 2 * p;
                if late > 0 {
                    JobHealth::Overdue {
                        last_started_at: None,
                        overdue_by: Duration::from_micros(late.unsigned_abs()),
                    }
                } else {
                    JobHealth::Pending
                }
            }
            _ => JobHealth::Unknown,
        });
    };
    if let Some(p) = period_us {
        if outcome.is_none() {
            return Ok(if now_us - started > p {
                JobHealth::StoppedReporting {
                    scheduled_at: to_system_time(scheduled),
                    started_at: to_system_time(started),
                }
            } else {
                JobHealth::Running {
                    scheduled_at: to_system_time(scheduled),
                }
            });
        }
        let late = now_us - started - 2 * p;
        if late > 0 {
            return Ok(JobHealth::Overdue {
                last_started_at: Some(to_system_time(started)),
                overdue_by: Duration::from_micros(late.unsigned_abs()),
            });
        }
    }
    let scheduled_at = to_system_time(scheduled);
    Ok(match outcome.as_deref().map(parse_outcome) {
        None => JobHealth::Running { scheduled_at },
        Some(CronOutcome::Failed) => JobHealth::Failed {
            scheduled_at,
            last_success_at: success.map(to_system_time),
        },
        Some(CronOutcome::Succeeded) => match items {
            Some(0) => JobHealth::FoundNothing { scheduled_at },
            items => JobHealth::Succeeded {
                scheduled_at,
                items: items.and_then(|n| u64::try_from(n).ok()),
            },
        },
    })
}

/// Evaluates [`job_health`] for each of `names` at the database's clock and sets the
/// gauge `keel_cluster_cron_job_state{job, state}` (1 for the current state, 0 for the
/// others). `names` must be a fixed set (the job names are metric labels).
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn report_job_health(
    pool: &PgPool,
    names: &[&'static str],
) -> Result<Vec<(&'static str, JobHealth)>> {
    let now = db_now(pool).await?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let health = job_health(pool, name, now).await?;
        crate::metrics::job_state(name, health.as_str());
        if health.is_alarming() {
            warn!(target: TARGET, name, state = health.as_str(), "scheduled job unhealthy");
        }
        out.push((*name, health));
    }
    Ok(out)
}

/// Retention of `cron_cycle`: deletes cycles scheduled more than `older_than` ago (database
/// clock), in batches of `batch` rows (one statement each, `FOR UPDATE SKIP LOCKED`), at
/// most `max_batches` per call. The latest cycle of every job is always kept: it is where
/// the job's next pass continues (and what [`job_health`] judges). Returns the rows
/// deleted.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn prune_cron_cycles(
    pool: &PgPool,
    older_than: Duration,
    batch: u32,
    max_batches: u32,
) -> Result<u64> {
    let ms = duration_ms(older_than);
    let mut deleted = 0u64;
    for _ in 0..max_batches {
        let n = sqlx::query(
            "WITH old AS (
                SELECT name, scheduled_at FROM cron_cycle c
                 WHERE scheduled_at < now() - $1 * interval '1 millisecond'
                   AND scheduled_at < (SELECT max(scheduled_at) FROM cron_cycle l
                                        WHERE l.name = c.name)
                 ORDER BY scheduled_at
                 LIMIT $2
                   FOR UPDATE SKIP LOCKED)
             DELETE FROM cron_cycle d USING old
              WHERE d.name = old.name AND d.scheduled_at = old.scheduled_at",
        )
        .bind(ms as f64)
        .bind(i64::from(batch.max(1)))
        .execute(pool)
        .await?
        .rows_affected();
        deleted += n;
        if n < u64::from(batch.max(1)) {
            break;
        }
    }
    Ok(deleted)
}

/// The database clock.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn db_now(pool: &PgPool) -> Result<SystemTime> {
    Ok(to_system_time(db_now_us(pool).await?))
}

/// A cron job's loop under its shard's lease, as a [`BackgroundService`] (`cron`):
/// each run is one [`cron_pass`]; a pass that is catching up (more due cycles than
/// [`CronJob::max_catch_up_per_pass`]) runs again at once, else the loop waits until
/// the next cycle is due. A failed pass is retried after the job's period clamped to
/// 100 ms..=5 s (the runner's backoff, fixed at that delay).
struct CronLoop<'a, F> {
    pool: &'a PgPool,
    replica: Uuid,
    job: &'a CronJob,
    token: &'a CancellationToken,
    work: &'a F,
}

impl<F, Fut, T, E> BackgroundService for CronLoop<'_, F>
where
    F: Fn(CronCycle) -> Fut + Sync,
    Fut: Future<Output = std::result::Result<T, E>> + Send,
    T: CronReport + Send,
    E: std::fmt::Display + Send,
{
    type Error = ClusterError;

    fn name(&self) -> &'static str {
        "cron"
    }

    async fn run_once(&mut self) -> Result<Report> {
        // A failure is logged at WARN by the runner, in the span `cron_job{name}`.
        let pass = cron_pass(self.pool, self.replica, self.job, self.token, self.work).await?;
        let ran = u64::from(pass.ran);
        Ok(if pass.wait.is_zero() {
            Report::more_pending(ran)
        } else {
            Report::after(ran, pass.wait)
        })
    }
}

/// The loop a cron job runs under its shard's lease ([`CronLoop`] on the
/// [`keel_service`] runner, stopped by the lease's token).
pub(crate) async fn run<F, Fut, T, E>(
    pool: PgPool,
    replica: Uuid,
    job: CronJob,
    lease: ShardLease,
    work: &F,
) where
    F: Fn(CronCycle) -> Fut + Sync,
    Fut: Future<Output = std::result::Result<T, E>> + Send,
    T: CronReport + Send,
    E: std::fmt::Display + Send,
{
    let token = lease.token().clone();
    let retry = job
        .schedule
        .period
        .clamp(Duration::from_millis(100), Duration::from_secs(5));
    if let Err(err) = register_job(&pool, &job).await {
        warn!(target: TARGET, name = %job.name, error = %err, "cron job registration failed");
    }
    let service = CronLoop {
        pool: &pool,
        replica,
        job: &job,
        token: &token,
        work,
    };
    let pacing = ServiceConfig::new(retry).with_backoff(retry, retry);
    keel_service::run(service, pacing, token.clone())
        .instrument(tracing::info_span!("cron_job", name = %job.name))
        .await;
}

/// What one [`cron_pass`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CronPass {
    /// Cycles this pass started (recorded here and run).
    pub ran: u32,
    /// Due cycles it found already recorded (by another owner) and skipped.
    pub skipped: u32,
    /// Due cycles left for the next passes (catch-up after downtime; 0 when caught up).
    pub remaining: i64,
    /// How long to wait before the next pass (zero while catching up).
    pub wait: Duration,
}

/// One pass of a cron job, as its owner's loop runs it (public for tests and tools; the
/// caller must be the job's owner, as [`crate::ShardOwner::cron`] ensures): runs the due,
/// unrecorded cycles after the latest recorded one, oldest first, at most
/// [`CronJob::max_catch_up_per_pass`] of them, and logs and reports (gauge
/// `keel_cluster_cron_catch_up_remaining_cycles`) how many missed cycles remain. The first
/// pass of a job that never ran starts at the latest due cycle (no backfill).
///
/// # Errors
/// [`ClusterError::Store`] on database failure (a cycle already started stays recorded).
pub async fn cron_pass<F, Fut, T, E>(
    pool: &PgPool,
    replica: Uuid,
    job: &CronJob,
    token: &CancellationToken,
    work: &F,
) -> Result<CronPass>
where
    F: Fn(CronCycle) -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
    T: CronReport,
    E: std::fmt::Display,
{
    let period = job.schedule.period_us().max(1);
    let now = db_now_us(pool).await?;
    let due = job.schedule.due_at_or_before(now);
    let mut next = match last_recorded_us(pool, &job.name).await? {
        Some(last) => job.schedule.due_at_or_before(last) + period,
        None => due,
    };
    let mut pass = CronPass {
        ran: 0,
        skipped: 0,
        remaining: 0,
        wait: Duration::ZERO,
    };
    while next <= due
        && pass.ran + pass.skipped < job.max_catch_up_per_pass
        && !token.is_cancelled()
    {
        if claim(pool, &job.name, next, replica).await? {
            pass.ran += 1;
            crate::metrics::cron_started(&job.name);
            let cycle = CronCycle {
                name: job.name.clone(),
                scheduled_at: to_system_time(next),
                token: token.clone(),
            };
            let started = std::time::Instant::now();
            let (outcome, items) = match work(cycle).await {
                Ok(report) => (CronOutcome::Succeeded, report.items()),
                Err(err) => {
                    warn!(target: TARGET, name = %job.name, error = %err, "cron cycle failed");
                    (CronOutcome::Failed, None)
                }
            };
            crate::metrics::cron_cycle(
                &job.name,
                outcome.as_str(),
                started.elapsed().as_secs_f64(),
            );
            if outcome == CronOutcome::Succeeded {
                crate::metrics::cron_success(&job.name, next as f64 / 1e6);
            }
            finish(pool, &job.name, next, replica, outcome, items).await?;
        } else {
            pass.skipped += 1;
        }
        next += period;
    }
    if next <= due {
        pass.remaining = (due - next) / period + 1;
        crate::metrics::cron_remaining(&job.name, pass.remaining);
        let gap_seconds = (due - next + period) / 1_000_000;
        info!(target: TARGET, name = %job.name, ran = pass.ran, remaining = pass.remaining,
            gap_seconds, "cron catch-up bounded; the remaining gap continues next pass");
        return Ok(pass);
    }
    crate::metrics::cron_remaining(&job.name, 0);
    let now = db_now_us(pool).await?;
    pass.wait = Duration::from_micros(u64::try_from(next - now).unwrap_or(0));
    Ok(pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_align_to_epoch_plus_offset() {
        let s = Schedule::every(Duration::from_secs(60));
        assert_eq!(s.due_at_or_before(125_000_000), 120_000_000);
        assert_eq!(s.due_at_or_before(120_000_000), 120_000_000);
        let s = s.offset(Duration::from_secs(90));
        // offset 90 s ≡ 30 s: cycles at ..., 30 s, 90 s, 150 s, ...
        assert_eq!(s.due_at_or_before(125_000_000), 90_000_000);
        assert_eq!(s.due_at_or_before(-1), -30_000_000);
    }

    #[test]
    fn names_are_validated() {
        let every = Schedule::every(Duration::from_secs(1));
        assert!(CronJob::new("retention/daily", every).validate().is_ok());
        assert!(CronJob::new("Retention", every).validate().is_err());
        assert!(CronJob::new("", every).validate().is_err());
        assert!(
            CronJob::new("x", Schedule::every(Duration::ZERO))
                .validate()
                .is_err()
        );
    }
}
