//! Cron with stable cycle keys (`cron_cycle`): a job runs on one owner per cycle, and a
//! cycle recorded by one owner is never started again by another.

use crate::{ClusterError, Result, ShardLease};
use sqlx::PgPool;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
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

fn to_system_time(us: i64) -> SystemTime {
    match u64::try_from(us) {
        Ok(us) => UNIX_EPOCH + Duration::from_micros(us),
        Err(_) => UNIX_EPOCH - Duration::from_micros(us.unsigned_abs()),
    }
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
) -> Result<()> {
    sqlx::query(
        "UPDATE cron_cycle SET finished_at = clock_timestamp(), outcome = $4 \
         WHERE name = $1 AND scheduled_at = timestamptz 'epoch' + $2 * interval '1 microsecond' \
           AND replica_id = $3 AND finished_at IS NULL",
    )
    .bind(name)
    .bind(at_us)
    .bind(replica)
    .bind(outcome.as_str())
    .execute(pool)
    .await?;
    Ok(())
}

/// What `cron_cycle` says about one job, so that "ran and found nothing", "overdue" and
/// "stopped reporting" can be told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronStatus {
    /// The latest recorded cycle's scheduled time.
    pub last_scheduled_at: Option<SystemTime>,
    /// Its outcome; `None` while running or when its owner was lost mid-run.
    pub last_outcome: Option<CronOutcome>,
    /// Scheduled time of the latest cycle that succeeded.
    pub last_success_at: Option<SystemTime>,
    /// Duration of the latest finished cycle.
    pub last_duration: Option<Duration>,
    /// Number of recorded cycles.
    pub cycles: i64,
}

/// Reads the [`CronStatus`] of the job `name`.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn cron_status(pool: &PgPool, name: &str) -> Result<CronStatus> {
    let row: (Option<i64>, Option<String>, Option<i64>, Option<i64>, i64) = sqlx::query_as(
        "SELECT \
           (SELECT (extract(epoch FROM scheduled_at) * 1000000)::int8 FROM cron_cycle \
             WHERE name = $1 ORDER BY scheduled_at DESC LIMIT 1), \
           (SELECT outcome FROM cron_cycle WHERE name = $1 ORDER BY scheduled_at DESC LIMIT 1), \
           (SELECT (extract(epoch FROM max(scheduled_at)) * 1000000)::int8 FROM cron_cycle \
             WHERE name = $1 AND outcome = 'succeeded'), \
           (SELECT (extract(epoch FROM finished_at - started_at) * 1000000)::int8 FROM cron_cycle \
             WHERE name = $1 AND finished_at IS NOT NULL ORDER BY scheduled_at DESC LIMIT 1), \
           (SELECT count(*) FROM cron_cycle WHERE name = $1)",
    )
    .bind(name)
    .fetch_one(pool)
    .await?;
    let (last, outcome, success, duration, cycles) = row;
    Ok(CronStatus {
        last_scheduled_at: last.map(to_system_time),
        last_outcome: outcome.as_deref().map(|o| {
            if o == "succeeded" {
                CronOutcome::Succeeded
            } else {
                CronOutcome::Failed
            }
        }),
        last_success_at: success.map(to_system_time),
        last_duration: duration
            .and_then(|us| u64::try_from(us).ok())
            .map(Duration::from_micros),
        cycles,
    })
}

/// The loop a cron job runs under its shard's lease.
pub(crate) async fn run<F, Fut, E>(
    pool: PgPool,
    replica: Uuid,
    job: CronJob,
    lease: ShardLease,
    work: &F,
) where
    F: Fn(CronCycle) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: std::fmt::Display,
{
    let token = lease.token().clone();
    let retry = job
        .schedule
        .period
        .clamp(Duration::from_millis(100), Duration::from_secs(5));
    while !token.is_cancelled() {
        let wait = match pass(&pool, replica, &job, &token, work).await {
            Ok(wait) => wait,
            Err(err) => {
                warn!(target: TARGET, name = %job.name, error = %err, "cron pass failed");
                retry
            }
        };
        tokio::select! {
            () = token.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Runs the due, unrecorded cycles (at most `max_catch_up_per_pass`); returns how long
/// to wait for the next one.
async fn pass<F, Fut, E>(
    pool: &PgPool,
    replica: Uuid,
    job: &CronJob,
    token: &CancellationToken,
    work: &F,
) -> Result<Duration>
where
    F: Fn(CronCycle) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: std::fmt::Display,
{
    let period = job.schedule.period_us().max(1);
    let now = db_now_us(pool).await?;
    let due = job.schedule.due_at_or_before(now);
    let mut next = match last_recorded_us(pool, &job.name).await? {
        Some(last) => job.schedule.due_at_or_before(last) + period,
        None => due,
    };
    let mut ran = 0u32;
    while next <= due && ran < job.max_catch_up_per_pass && !token.is_cancelled() {
        if claim(pool, &job.name, next, replica).await? {
            let cycle = CronCycle {
                name: job.name.clone(),
                scheduled_at: to_system_time(next),
                token: token.clone(),
            };
            let started = std::time::Instant::now();
            let outcome = match work(cycle).await {
                Ok(()) => CronOutcome::Succeeded,
                Err(err) => {
                    warn!(target: TARGET, name = %job.name, error = %err, "cron cycle failed");
                    CronOutcome::Failed
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
            finish(pool, &job.name, next, replica, outcome).await?;
        }
        ran += 1;
        next += period;
    }
    if next <= due {
        let remaining = (due - next) / period + 1;
        crate::metrics::cron_remaining(&job.name, remaining);
        info!(target: TARGET, name = %job.name, remaining, "cron catch-up continues next pass");
        return Ok(Duration::ZERO);
    }
    crate::metrics::cron_remaining(&job.name, 0);
    let now = db_now_us(pool).await?;
    Ok(Duration::from_micros(
        u64::try_from(next - now).unwrap_or(0),
    ))
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
