//! Session advisory locks of shards, two-int form `(group_key, shard)`, on the reserved
//! connection.

use crate::Result;
use sqlx::{PgConnection, Row};
use std::collections::BTreeSet;

fn shard_array(shards: &BTreeSet<u32>) -> Vec<i32> {
    shards
        .iter()
        .filter_map(|s| i32::try_from(*s).ok())
        .collect()
}

/// Tries to lock each shard (`pg_try_advisory_lock(group, shard)`, never waits); returns
/// the shards now held.
pub(crate) async fn try_acquire(
    conn: &mut PgConnection,
    group: i32,
    shards: &BTreeSet<u32>,
) -> Result<BTreeSet<u32>> {
    let rows =
        sqlx::query("SELECT s, pg_try_advisory_lock($1, s) AS got FROM unnest($2::int4[]) AS s")
            .bind(group)
            .bind(shard_array(shards))
            .fetch_all(conn)
            .await?;
    let mut got = BTreeSet::new();
    for row in rows {
        let shard: i32 = row.try_get("s")?;
        let ok: bool = row.try_get("got")?;
        if ok && let Ok(shard) = u32::try_from(shard) {
            got.insert(shard);
        }
    }
    Ok(got)
}

/// Unlocks each shard (`pg_advisory_unlock(group, shard)`).
pub(crate) async fn release(
    conn: &mut PgConnection,
    group: i32,
    shards: &BTreeSet<u32>,
) -> Result<()> {
    sqlx::query("SELECT pg_advisory_unlock($1, s) FROM unnest($2::int4[]) AS s")
        .bind(group)
        .bind(shard_array(shards))
        .execute(conn)
        .await?;
    Ok(())
}

/// The shards of `group` whose advisory locks this session holds, read from `pg_locks`
/// (the server's view, not ours).
pub(crate) async fn held(conn: &mut PgConnection, group: i32) -> Result<BTreeSet<u32>> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT objid::int8 FROM pg_locks \
         WHERE locktype = 'advisory' AND pid = pg_backend_pid() \
           AND classid = $1::int8::oid AND objsubid = 2 AND granted",
    )
    .bind(i64::from(group))
    .fetch_all(conn)
    .await?;
    Ok(ids
        .into_iter()
        .filter_map(|s| u32::try_from(s).ok())
        .collect())
}

/// This session's backend pid.
pub(crate) async fn backend_pid(conn: &mut PgConnection) -> Result<i32> {
    Ok(sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await?)
}

/// Terminates a previous reserved session of this replica (identified by pid *and*
/// application name, never this session) so the advisory locks it may still hold — a
/// session whose query hung is not ended by dropping the client socket — are freed.
/// Waits up to `wait_ms` for it to exit.
pub(crate) async fn reap(
    conn: &mut PgConnection,
    pid: i32,
    application_name: &str,
    wait_ms: i64,
) -> Result<()> {
    sqlx::query(
        "SELECT pg_terminate_backend(pid, $3) FROM pg_stat_activity \
         WHERE pid = $1 AND application_name = $2 AND pid <> pg_backend_pid()",
    )
    .bind(pid)
    .bind(application_name)
    .bind(wait_ms)
    .execute(conn)
    .await?;
    Ok(())
}
