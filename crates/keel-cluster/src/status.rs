//! Cluster state for Platform Status, from the database only: the replica registry
//! with heartbeat ages, which replica holds which shard (the advisory locks of
//! `pg_locks`, matched to replicas by their lock connection's `application_name`,
//! `keel-cluster/<group>/<replica id>`), the owners of named singletons
//! ([`cluster_status`]), and every registered cron job judged ([`jobs_status`]).

use crate::cron::{CronOutcome, JobHealth, cron_status, db_now, job_health};
use crate::{Result, Role, group_key, shard_of};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// One registered replica (`cluster_replica`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Its id.
    pub id: Uuid,
    /// Its role (`runner`, `indexer`).
    pub role: String,
    /// The host it reported (a pod or machine name).
    pub host: String,
    /// When it registered (database clock).
    pub started_at: SystemTime,
    /// Time since its last heartbeat (database clock).
    pub heartbeat_age: Duration,
    /// Shards of its group whose advisory locks it holds now.
    pub shards_owned: u32,
    /// Shards it declines (singletons it cannot serve).
    pub shards_declined: u32,
}

/// The owner of one named singleton.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingletonStatus {
    /// The singleton's name (`txq/<chainId>`, `index-tip/<chainId>`).
    pub name: String,
    /// The role whose shard group runs it.
    pub role: Role,
    /// Its shard ([`crate::shard_of`] of the name).
    pub shard: u32,
    /// The replica holding that shard's lock (`None`: nobody holds it now).
    pub owner: Option<Uuid>,
}

/// The cluster ([`cluster_status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The recorded shard count (`None`: no replica ever started).
    pub shards: Option<u32>,
    /// Registered replicas by role, then host.
    pub replicas: Vec<ReplicaStatus>,
    /// The singletons asked for, in the order given.
    pub singletons: Vec<SingletonStatus>,
}

/// The replicas, the shards they hold and the owners of `singletons` (name and the
/// role that runs it). Three statements; reads `pg_locks` and `pg_stat_activity` of
/// the current database.
///
/// # Errors
/// [`crate::ClusterError::Store`] on database failure.
pub async fn cluster_status(pool: &PgPool, singletons: &[(Role, String)]) -> Result<ClusterStatus> {
    let shards: Option<i32> = sqlx::query_scalar("SELECT shards FROM cluster_config")
        .fetch_optional(pool)
        .await?;
    let shards = shards.and_then(|n| u32::try_from(n).ok());
    type ReplicaRow = (Uuid, String, String, String, i64, i64, i32);
    let rows: Vec<ReplicaRow> = sqlx::query_as(
        "SELECT id, shard_group, role, host,
                (extract(epoch FROM started_at) * 1000000)::int8,
                (extract(epoch FROM now() - heartbeat_at) * 1000000)::int8,
                cardinality(declined_shards)
           FROM cluster_replica ORDER BY role, host, id",
    )
    .fetch_all(pool)
    .await?;
    // (group key, shard) → replica, from the advisory locks of live lock connections.
    let locks: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT a.application_name, l.classid::int8, l.objid::int8
           FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND a.application_name LIKE 'keel-cluster/%'",
    )
    .fetch_all(pool)
    .await?;
    let mut holder: BTreeMap<(i64, i64), Uuid> = BTreeMap::new();
    for (app, class, obj) in locks {
        if let Some(id) = app.rsplit('/').next().and_then(|s| Uuid::parse_str(s).ok()) {
            holder.insert((class, obj), id);
        }
    }
    let replicas = rows
        .into_iter()
        .map(|(id, group, role, host, started, age, declined)| {
            let key = i64::from(group_key(&group));
            let owned = holder
                .iter()
                .filter(|((class, _), owner)| *class == key && **owner == id)
                .count();
            ReplicaStatus {
                id,
                role,
                host,
                started_at: from_unix_us(started),
                heartbeat_age: Duration::from_micros(u64::try_from(age).unwrap_or(0)),
                shards_owned: u32::try_from(owned).unwrap_or(u32::MAX),
                shards_declined: u32::try_from(declined).unwrap_or(0),
            }
        })
        .collect();
    let singletons = singletons
        .iter()
        .map(|(role, name)| {
            let shard = shards.map_or(0, |n| shard_of(name.as_bytes(), n));
            let key = i64::from(group_key(role.shard_group()));
            SingletonStatus {
                name: name.clone(),
                role: *role,
                shard,
                owner: shards.and_then(|_| holder.get(&(key, i64::from(shard))).copied()),
            }
        })
        .collect();
    Ok(ClusterStatus {
        shards,
        replicas,
        singletons,
    })
}

/// How a scheduled job is doing, in the words of Platform Status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobVerdict {
    /// The latest cycle succeeded with work, runs now, or none is due yet.
    Ok,
    /// The latest cycle succeeded and found nothing to do (a genuine zero).
    Quiet,
    /// The latest cycle failed.
    Failed,
    /// No cycle started within 2 × period: nobody runs the job.
    Overdue,
    /// A cycle started more than a period ago and never reported an outcome.
    StoppedReporting,
    /// Cycles recorded for a job that is not registered (no schedule to judge by).
    Unknown,
}

impl JobVerdict {
    /// The label: `ok`, `quiet`, `failed`, `overdue`, `stopped_reporting`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Quiet => "quiet",
            Self::Failed => "failed",
            Self::Overdue => "overdue",
            Self::StoppedReporting => "stopped_reporting",
            Self::Unknown => "unknown",
        }
    }

    fn of(health: &JobHealth) -> Self {
        match health {
            JobHealth::Pending | JobHealth::Running { .. } | JobHealth::Succeeded { .. } => {
                Self::Ok
            }
            JobHealth::FoundNothing { .. } => Self::Quiet,
            JobHealth::Failed { .. } => Self::Failed,
            JobHealth::Overdue { .. } => Self::Overdue,
            JobHealth::StoppedReporting { .. } => Self::StoppedReporting,
            _ => Self::Unknown,
        }
    }
}

/// One registered cron job ([`jobs_status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    /// The job's name.
    pub name: String,
    /// Its period.
    pub period: Duration,
    /// The scheduled time of its latest cycle (the last attempt; `None`: never ran).
    pub last_attempt_at: Option<SystemTime>,
    /// That cycle's outcome (`None` while it runs or when it never reported).
    pub last_outcome: Option<CronOutcome>,
    /// Work items it reported.
    pub last_items: Option<u64>,
    /// Duration of the latest finished cycle.
    pub last_duration: Option<Duration>,
    /// The scheduled time of the latest successful cycle.
    pub last_success_at: Option<SystemTime>,
    /// The next cycle time after the latest one (or after registration).
    pub next_due_at: SystemTime,
    /// The detailed state ([`JobHealth::as_str`]).
    pub state: &'static str,
    /// The verdict.
    pub verdict: JobVerdict,
}

/// Every registered job (`cron_job`, by name), judged at the database clock
/// ([`job_health`]) with its latest cycle ([`cron_status`]).
///
/// # Errors
/// [`crate::ClusterError::Store`] on database failure.
pub async fn jobs_status(pool: &PgPool) -> Result<Vec<JobStatus>> {
    let jobs: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT name, period_ms, offset_ms, (extract(epoch FROM registered_at) * 1000000)::int8
           FROM cron_job ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    let now = db_now(pool).await?;
    let mut out = Vec::with_capacity(jobs.len());
    for (name, period_ms, offset_ms, registered_us) in jobs {
        let health = job_health(pool, &name, now).await?;
        let status = cron_status(pool, &name).await?;
        let period_us = period_ms.max(1).saturating_mul(1000);
        let offset_us = offset_ms.saturating_mul(1000) % period_us;
        let after = status.last_scheduled_at.map_or(registered_us, to_unix_us);
        let next = (after - offset_us).div_euclid(period_us) * period_us + offset_us + period_us;
        out.push(JobStatus {
            period: Duration::from_millis(u64::try_from(period_ms).unwrap_or(1)),
            last_attempt_at: status.last_scheduled_at,
            last_outcome: status.last_outcome,
            last_items: status.last_items,
            last_duration: status.last_duration,
            last_success_at: status.last_success_at,
            next_due_at: from_unix_us(next),
            state: health.as_str(),
            verdict: JobVerdict::of(&health),
            name,
        });
    }
    Ok(out)
}

fn from_unix_us(us: i64) -> SystemTime {
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
