//! `cluster_config` and `cluster_replica`: the recorded shard count and the replica
//! registry (migration `0003_cluster.sql`).

use crate::{ClusterError, Result};
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeSet;
use std::time::Duration;
use uuid::Uuid;

/// Records `configured` as the cluster's shard count if none is recorded yet, then
/// compares it with the recorded one.
///
/// # Errors
/// [`ClusterError::ShardCountMismatch`] when another count is recorded;
/// [`ClusterError::Store`] on database failure.
pub async fn check_shard_count(conn: &mut PgConnection, configured: u32) -> Result<()> {
    let wanted = i32::try_from(configured).map_err(|_| ClusterError::Config {
        key: "durable.sharding.shards",
        reason: "must be between 1 and 65536",
    })?;
    sqlx::query(
        "INSERT INTO cluster_config (shards) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
    )
    .bind(wanted)
    .execute(&mut *conn)
    .await?;
    let recorded: i32 = sqlx::query_scalar("SELECT shards FROM cluster_config")
        .fetch_one(&mut *conn)
        .await?;
    if recorded != wanted {
        return Err(ClusterError::ShardCountMismatch {
            configured,
            recorded: u32::try_from(recorded).unwrap_or(0),
        });
    }
    Ok(())
}

/// The shard count recorded in `cluster_config`, if any.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn recorded_shard_count(conn: &mut PgConnection) -> Result<Option<u32>> {
    let recorded: Option<i32> = sqlx::query_scalar("SELECT shards FROM cluster_config")
        .fetch_optional(conn)
        .await?;
    Ok(recorded.and_then(|n| u32::try_from(n).ok()))
}

/// Registers the replica if its row is missing, else moves its heartbeat to `now()`
/// (database clock). Either way records the shards it declines (migration
/// `0019_cluster_declined_shards.sql`).
pub(crate) async fn heartbeat(
    conn: &mut PgConnection,
    id: Uuid,
    group: &str,
    role: &str,
    host: &str,
    declined: &BTreeSet<u32>,
) -> Result<()> {
    let declined: Vec<i32> = declined
        .iter()
        .filter_map(|s| i32::try_from(*s).ok())
        .collect();
    sqlx::query(
        "INSERT INTO cluster_replica (id, shard_group, role, host, declined_shards) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), declined_shards = $5",
    )
    .bind(id)
    .bind(group)
    .bind(role)
    .bind(host)
    .bind(declined)
    .execute(conn)
    .await?;
    Ok(())
}

/// A live replica of a shard group and the shards it declines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveReplica {
    /// The replica's id.
    pub(crate) id: Uuid,
    /// Shards it declines (see [`crate::assignment_declining`]).
    pub(crate) declined: BTreeSet<u32>,
}

/// The live replicas of `group`: heartbeat within `window` of the database's `now()`,
/// ordered by id, each with the shards it declines.
pub(crate) async fn live_replicas(
    conn: &mut PgConnection,
    group: &str,
    window: Duration,
) -> Result<Vec<LiveReplica>> {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let rows: Vec<(Uuid, Vec<i32>)> = sqlx::query_as(
        "SELECT id, declined_shards FROM cluster_replica \
         WHERE shard_group = $1 AND heartbeat_at > now() - $2 * interval '1 millisecond' \
         ORDER BY id",
    )
    .bind(group)
    .bind(window_ms as f64)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, declined)| LiveReplica {
            id,
            declined: declined
                .into_iter()
                .filter_map(|s| u32::try_from(s).ok())
                .collect(),
        })
        .collect())
}

/// Removes the replica's row (graceful shutdown): peers reassign its shards at their
/// next refresh instead of waiting for the liveness window.
pub(crate) async fn deregister(conn: &mut PgConnection, id: Uuid) -> Result<()> {
    sqlx::query("DELETE FROM cluster_replica WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Deletes the `cluster_replica` rows whose heartbeat (database clock) is older than
/// `older_than` — replicas that crashed instead of deregistering. Pass a multiple of the
/// liveness window (rows within the window are live and never deleted here: the bound is
/// raised to at least the window). Returns the rows deleted.
///
/// # Errors
/// [`ClusterError::Store`] on database failure.
pub async fn prune_stale_replicas(
    pool: &PgPool,
    older_than: Duration,
    liveness_window: Duration,
) -> Result<u64> {
    let bound = older_than.max(liveness_window);
    let ms = i64::try_from(bound.as_millis()).unwrap_or(i64::MAX);
    let deleted = sqlx::query(
        "DELETE FROM cluster_replica WHERE heartbeat_at < now() - $1 * interval '1 millisecond'",
    )
    .bind(ms as f64)
    .execute(pool)
    .await?
    .rows_affected();
    if deleted > 0 {
        crate::metrics::replicas_pruned(deleted);
    }
    Ok(deleted)
}
