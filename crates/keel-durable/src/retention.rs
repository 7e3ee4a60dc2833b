//! Retention of the engine's tables: [`Retention::run_once`] deletes settled commands
//! and ended instances older than a window, in bounded batches, each batch one short
//! transaction that selects its rows `FOR UPDATE SKIP LOCKED`, so cleanup never holds one
//! long transaction and never waits for live work.
//!
//! What is eligible (the cutoff is `now() - window`, database clock, fixed per pass):
//!
//! - a **command** in state `done` with `completed_at` before the cutoff (dead-lettered
//!   commands are kept for inspection while their instance lives), except START and
//!   CANCEL commands: they say who started and who cancelled the instance
//!   ([`crate::Engine::attribution`]) and go with their instance;
//! - an **instance** `completed` or `cancelled` with `ended_at` before the cutoff and no
//!   open (`queued`/`running`) command. Deleting it deletes its remaining commands,
//!   journal, signals and history entries ([`crate::history`]; `ON DELETE CASCADE`, so
//!   an operation's history follows its instance's retention window) and detaches its children
//!   (`parent_id` set to NULL). `failed` instances are kept: they can be retried.
//!
//! Each batch is one transaction: select up to `batchSize` eligible rows in deletion order
//! (`completed_at`/`ended_at`, then id) `FOR UPDATE SKIP LOCKED`, delete them, commit. A
//! table's batches stop when one selects fewer rows than the batch size, or at
//! `maxBatchesPerPass`. A row locked by concurrent work is skipped, counted in the report
//! as remaining, and deleted by a later pass. A batch whose cascade would wait on a
//! locked dependent row longer than [`RetentionConfig::lock_timeout`] is rolled back and
//! counted as a failure; the pass continues *after* that batch's rows (a keyset cursor),
//! so one blocked row costs one batch, and the rolled-back rows are retried next pass.
//!
//! Metrics (labels from fixed sets: `table` is `command` or `instance`):
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `keel_durable_retention_deleted_rows_total` | counter | table | rows deleted by retention |
//! | `keel_durable_retention_remaining_eligible_rows` | gauge | table | eligible rows left after the latest pass |
//! | `keel_durable_retention_batches_total` | counter | table | batches (transactions) run |
//! | `keel_durable_retention_failures_total` | counter | table | batches that failed (rolled back) |
//! | `keel_durable_retention_pass_duration_seconds` | histogram | — | one pass, start to report |

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::error::{DurableError, Result};

const TARGET: &str = "keel::durable::retention";

/// Settings of [`Retention`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Rows older than this are deleted (`retention.windowDays`, default 30 days;
    /// at least 1 day).
    pub window: Duration,
    /// Rows per batch, one transaction each (`retention.batchSize`, 1..=100000, default
    /// 1000).
    pub batch_size: u32,
    /// At most this many batches per table per pass (`retention.maxBatchesPerPass`,
    /// at least 1, default 1000); what is left is reported and deleted next pass.
    pub max_batches_per_pass: u32,
    /// How long a batch may wait for a lock on a dependent row (a cascaded command,
    /// journal or signal row, a child instance) before it is rolled back (default 1 s,
    /// 10 ms..=60 s). Selected rows themselves are never waited for (`SKIP LOCKED`).
    pub lock_timeout: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(30 * 86_400),
            batch_size: 1000,
            max_batches_per_pass: 1000,
            lock_timeout: Duration::from_secs(1),
        }
    }
}

impl RetentionConfig {
    /// Checks the bounds. `window` below one day is accepted only through
    /// [`Retention::run_once_before`] (tests and tools), never from configuration.
    ///
    /// # Errors
    /// [`DurableError::Config`] naming the key.
    pub fn validate(&self) -> Result<()> {
        let bad = |key, reason| Err(DurableError::Config { key, reason });
        if self.window < Duration::from_secs(86_400) {
            return bad("retention.windowDays", "must be at least 1 day");
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return bad("retention.batchSize", "must be within 1..=100000");
        }
        if self.max_batches_per_pass == 0 {
            return bad("retention.maxBatchesPerPass", "must be at least 1");
        }
        if self.lock_timeout < Duration::from_millis(10)
            || self.lock_timeout > Duration::from_secs(60)
        {
            return bad("retention.lockTimeoutMs", "must be within 10..=60000 ms");
        }
        Ok(())
    }
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Settled commands deleted by the command batches (commands deleted with their
    /// instance are not counted here).
    pub deleted_commands: u64,
    /// Ended instances deleted (with their journal, signals and remaining commands).
    pub deleted_instances: u64,
    /// Eligible commands left after the pass: skipped because locked, beyond the
    /// per-pass cap, in a failed batch, or ended meanwhile.
    pub remaining_eligible_commands: u64,
    /// Eligible instances left after the pass.
    pub remaining_eligible_instances: u64,
    /// Batches that failed and were rolled back.
    pub failures: u32,
    /// Batches run (both tables, failed ones included).
    pub batches: u32,
    /// Wall time of the pass.
    pub duration: Duration,
}

impl RetentionReport {
    /// Rows deleted in all.
    pub fn deleted(&self) -> u64 {
        self.deleted_commands + self.deleted_instances
    }
}

/// Retention of the engine's tables (see the module docs). Run it from one scheduled
/// owner (the cluster's cron); concurrent passes are safe but wasteful.
#[derive(Debug, Clone)]
pub struct Retention {
    pool: PgPool,
    config: RetentionConfig,
}

const SELECT_COMMANDS: &str = "\
SELECT id, completed_at FROM durable_command
 WHERE state = 'done' AND completed_at < $1
   AND kind NOT IN ('start', 'cancel')
   AND ($3::timestamptz IS NULL OR (completed_at, id) > ($3, $4::int8))
 ORDER BY completed_at, id
 LIMIT $2
   FOR UPDATE SKIP LOCKED";

const ELIGIBLE_INSTANCE: &str = "\
status IN ('completed', 'cancelled') AND ended_at < $1
AND NOT EXISTS (SELECT 1 FROM durable_command c
                 WHERE c.instance_id = x.id AND c.state IN ('queued', 'running'))";

/// Position of a row in its table's deletion order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Command(DateTime<Utc>, i64),
    Instance(DateTime<Utc>, Uuid),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Command,
    Instance,
}

impl Table {
    fn as_str(self) -> &'static str {
        match self {
            Self::Command => "command",
            Self::Instance => "instance",
        }
    }
}

impl Retention {
    /// Retention on `pool` with a validated `config`.
    ///
    /// # Errors
    /// [`DurableError::Config`] naming the key.
    pub fn new(pool: PgPool, config: RetentionConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { pool, config })
    }

    /// The settings.
    pub fn config(&self) -> &RetentionConfig {
        &self.config
    }

    /// One pass with the cutoff `now() - window` (database clock). Stops between
    /// batches when `stop` fires. Logs the report and records the metrics.
    ///
    /// # Errors
    /// [`DurableError::Store`] when the cutoff or the final counts cannot be read
    /// (batch failures are counted in [`RetentionReport::failures`] instead).
    pub async fn run_once(&self, stop: &CancellationToken) -> Result<RetentionReport> {
        let cutoff: DateTime<Utc> = sqlx::query_scalar("SELECT now() - make_interval(secs => $1)")
            .bind(self.config.window.as_secs_f64())
            .fetch_one(&self.pool)
            .await?;
        self.run_once_before(cutoff, stop).await
    }

    /// One pass deleting what is eligible before `cutoff` (an injectable clock for tests
    /// and operator tools; [`Retention::run_once`] passes `now() - window`).
    ///
    /// # Errors
    /// As [`Retention::run_once`].
    pub async fn run_once_before(
        &self,
        cutoff: DateTime<Utc>,
        stop: &CancellationToken,
    ) -> Result<RetentionReport> {
        let started = Instant::now();
        let mut report = RetentionReport::default();
        for table in [Table::Command, Table::Instance] {
            let mut batches = 0u32;
            // Keyset cursor past the rows of failed batches, so one blocked row costs
            // one batch, not the rest of the table's pass.
            let mut after: Option<Key> = None;
            while batches < self.config.max_batches_per_pass && !stop.is_cancelled() {
                batches += 1;
                report.batches += 1;
                metrics::counter!("keel_durable_retention_batches_total", "table" => table.as_str())
                    .increment(1);
                match self.batch(table, cutoff, after.as_ref()).await {
                    Ok(n) => {
                        match table {
                            Table::Command => report.deleted_commands += n,
                            Table::Instance => report.deleted_instances += n,
                        }
                        metrics::counter!("keel_durable_retention_deleted_rows_total", "table" => table.as_str())
                            .increment(n);
                        if n < u64::from(self.config.batch_size) {
                            break;
                        }
                    }
                    Err((err, last)) => {
                        report.failures += 1;
                        metrics::counter!("keel_durable_retention_failures_total", "table" => table.as_str())
                            .increment(1);
                        warn!(target: TARGET, table = table.as_str(), error = %err,
                            "retention batch failed; its rows are retried next pass");
                        match last {
                            Some(key) => after = Some(key),
                            None => break,
                        }
                    }
                }
            }
        }
        let (commands, instances) = self.eligible(cutoff).await?;
        report.remaining_eligible_commands = commands;
        report.remaining_eligible_instances = instances;
        report.duration = started.elapsed();
        metrics::gauge!("keel_durable_retention_remaining_eligible_rows", "table" => "command")
            .set(commands as f64);
        metrics::gauge!("keel_durable_retention_remaining_eligible_rows", "table" => "instance")
            .set(instances as f64);
        metrics::histogram!("keel_durable_retention_pass_duration_seconds")
            .record(report.duration.as_secs_f64());
        info!(
            target: TARGET,
            deleted_commands = report.deleted_commands,
            deleted_instances = report.deleted_instances,
            remaining_eligible_commands = report.remaining_eligible_commands,
            remaining_eligible_instances = report.remaining_eligible_instances,
            failures = report.failures,
            batches = report.batches,
            duration_ms = u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX),
            "retention pass finished"
        );
        Ok(report)
    }

    /// One batch of `table` in its own transaction: selects up to `batch_size` eligible
    /// rows after `after` (`FOR UPDATE SKIP LOCKED`), then deletes them. Returns the rows
    /// deleted; on failure the error and, when the rows were selected, the last one's
    /// key (the next batch continues after it).
    async fn batch(
        &self,
        table: Table,
        cutoff: DateTime<Utc>,
        after: Option<&Key>,
    ) -> std::result::Result<u64, (DurableError, Option<Key>)> {
        let mut tx = self.pool.begin().await.map_err(|e| (e.into(), None))?;
        let lock_ms = format!("{}ms", self.config.lock_timeout.as_millis());
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(lock_ms)
            .execute(&mut *tx)
            .await
            .map_err(|e| (e.into(), None))?;
        let limit = i64::from(self.config.batch_size);
        let (after_at, after_command, after_instance) = match after {
            Some(Key::Command(at, id)) => (Some(*at), Some(*id), None),
            Some(Key::Instance(at, id)) => (Some(*at), None, Some(*id)),
            None => (None, None, None),
        };
        let (last, deleted) = match table {
            Table::Command => {
                let rows: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(SELECT_COMMANDS)
                    .bind(cutoff)
                    .bind(limit)
                    .bind(after_at)
                    .bind(after_command)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(|e| (e.into(), None))?;
                let last = rows.last().map(|(id, at)| Key::Command(*at, *id));
                let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
                let deleted = sqlx::query("DELETE FROM durable_command WHERE id = ANY($1)")
                    .bind(ids)
                    .execute(&mut *tx)
                    .await;
                (last, deleted)
            }
            Table::Instance => {
                let rows: Vec<(Uuid, DateTime<Utc>)> =
                    sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT id, ended_at FROM durable_instance x
                          WHERE {ELIGIBLE_INSTANCE}
                            AND ($3::timestamptz IS NULL OR (ended_at, id) > ($3, $4::uuid))
                          ORDER BY ended_at, id
                          LIMIT $2
                            FOR UPDATE SKIP LOCKED"
                    )))
                    .bind(cutoff)
                    .bind(limit)
                    .bind(after_at)
                    .bind(after_instance)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(|e| (e.into(), None))?;
                let last = rows.last().map(|(id, at)| Key::Instance(*at, *id));
                let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
                let deleted = sqlx::query("DELETE FROM durable_instance WHERE id = ANY($1)")
                    .bind(ids)
                    .execute(&mut *tx)
                    .await;
                (last, deleted)
            }
        };
        let deleted = deleted.map_err(|e| (e.into(), last.clone()))?;
        tx.commit().await.map_err(|e| (e.into(), last))?;
        Ok(deleted.rows_affected())
    }

    /// Eligible rows (locked ones included: counting does not lock).
    async fn eligible(&self, cutoff: DateTime<Utc>) -> Result<(u64, u64)> {
        let (commands, instances): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM durable_command
                      WHERE state = 'done' AND completed_at < $1
                        AND kind NOT IN ('start', 'cancel')),
                    (SELECT count(*) FROM durable_instance x WHERE {ELIGIBLE_INSTANCE})"
        )))
        .bind(cutoff)
        .fetch_one(&self.pool)
        .await?;
        Ok((
            u64::try_from(commands).unwrap_or(0),
            u64::try_from(instances).unwrap_or(0),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_name_keys() {
        assert!(RetentionConfig::default().validate().is_ok());
        let c = RetentionConfig {
            batch_size: 0,
            ..RetentionConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(DurableError::Config {
                key: "retention.batchSize",
                ..
            })
        ));
        let c = RetentionConfig {
            window: Duration::from_secs(3600),
            ..RetentionConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(DurableError::Config {
                key: "retention.windowDays",
                ..
            })
        ));
    }
}
