//! `index_chain`: one row per chain with the tip-ingest owner's epoch (fencing), the
//! checkpoint (`tip_number`, `tip_hash`) and the degraded marker (migration `0017`).

use crate::Result;
use sqlx::PgExecutor;

/// The fencing state of a chain row, read under `FOR UPDATE`.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub(crate) struct ChainFenceRow {
    pub owner_epoch: i64,
    pub degraded: bool,
}

/// The checkpoint columns of a chain row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CheckpointRow {
    pub tip_number: Option<i64>,
    pub tip_hash: Option<Vec<u8>>,
}

/// The fencing state and the checkpoint of a chain row, read without a lock.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct FenceCheckpointRow {
    pub owner_epoch: i64,
    pub degraded: bool,
    pub tip_number: Option<i64>,
    pub tip_hash: Option<Vec<u8>>,
}

/// Reads the epoch, the degraded marker and the checkpoint in one plain read (no row
/// lock, so no write transaction): a tip round's opening check. Writes still check the
/// epoch under [`chain_lock_fence`] in their own transaction. `None` when the chain has
/// no row.
pub(crate) async fn chain_fence_checkpoint(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<FenceCheckpointRow>> {
    Ok(sqlx::query_as(
        "SELECT owner_epoch, degraded_at IS NOT NULL AS degraded, tip_number, tip_hash
           FROM index_chain WHERE chain_id = $1",
    )
    .bind(chain)
    .fetch_optional(db)
    .await?)
}

/// Takes ownership: increments `owner_epoch` (creating the row at epoch 1) and records
/// `owner_id`. Returns the new epoch.
pub(crate) async fn chain_take_ownership(
    db: impl PgExecutor<'_>,
    chain: i64,
    owner_id: &str,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO index_chain (chain_id, owner_epoch, owner_id) VALUES ($1, 1, $2)
         ON CONFLICT (chain_id) DO UPDATE
           SET owner_epoch = index_chain.owner_epoch + 1, owner_id = EXCLUDED.owner_id,
               updated_at = now()
         RETURNING owner_epoch",
    )
    .bind(chain)
    .bind(owner_id)
    .fetch_one(db)
    .await?)
}

/// Locks the chain row (`FOR UPDATE`, inside the caller's transaction) and reads its
/// epoch and degraded marker; `None` when the chain has no row.
pub(crate) async fn chain_lock_fence(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<ChainFenceRow>> {
    Ok(sqlx::query_as(
        "SELECT owner_epoch, degraded_at IS NOT NULL AS degraded FROM index_chain
          WHERE chain_id = $1 FOR UPDATE",
    )
    .bind(chain)
    .fetch_optional(db)
    .await?)
}

/// Moves the checkpoint to (`number`, `hash`). The caller holds the fenced row lock.
pub(crate) async fn chain_set_checkpoint(
    db: impl PgExecutor<'_>,
    chain: i64,
    number: i64,
    hash: &[u8],
) -> Result<()> {
    sqlx::query(
        "UPDATE index_chain SET tip_number = $2, tip_hash = $3, updated_at = now()
         WHERE chain_id = $1",
    )
    .bind(chain)
    .bind(number)
    .bind(hash)
    .execute(db)
    .await?;
    Ok(())
}

/// A committed tip block's update of the chain row, in one statement: moves the
/// checkpoint to (`number`, `hash`), raises the recorded finalized block to `finalized`
/// when known (never lowers it), records the node's `head` as observed now (as
/// [`chain_observe_head`] does: `behind_since` kept while `number` is below it, cleared
/// once it is not; a re-index's `rebuild_started_at` cleared once no history range is
/// open), and queues `pg_notify(channel, "<chain>:<number>")` (delivered at
/// commit). The caller holds the fenced row lock.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn chain_advance_tip(
    db: impl PgExecutor<'_>,
    chain: i64,
    number: i64,
    hash: &[u8],
    finalized: Option<i64>,
    head: i64,
    channel: &str,
) -> Result<()> {
    sqlx::query(
        "WITH moved AS (
           UPDATE index_chain
              SET tip_number = $2, tip_hash = $3, updated_at = now(),
                  finalized_number = CASE WHEN $4::bigint IS NULL THEN finalized_number
                                          ELSE GREATEST(COALESCE(finalized_number, $4), $4) END,
                  head_number = $7, head_observed_at = now(),
                  behind_since = CASE WHEN $2 < $7 THEN coalesce(behind_since, now()) END,
                  rebuild_started_at = CASE
                      WHEN rebuild_started_at IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM index_range r
                                        WHERE r.chain_id = $1 AND r.state <> 'completed')
                      THEN NULL ELSE rebuild_started_at END
            WHERE chain_id = $1
           RETURNING chain_id)
         SELECT pg_notify($5, $6) FROM moved",
    )
    .bind(chain)
    .bind(number)
    .bind(hash)
    .bind(finalized)
    .bind(channel)
    .bind(format!("{chain}:{number}"))
    .bind(head)
    .execute(db)
    .await?;
    Ok(())
}

/// Marks the chain degraded, once (guarded by `degraded_at IS NULL`). Returns true when
/// this call set the marker.
pub(crate) async fn chain_mark_degraded(
    db: impl PgExecutor<'_>,
    chain: i64,
    reason: &str,
    block: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE index_chain
            SET degraded_at = now(), degraded_reason = $2, degraded_block = $3, updated_at = now()
          WHERE chain_id = $1 AND degraded_at IS NULL",
    )
    .bind(chain)
    .bind(reason)
    .bind(block)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Creates the chain's row unless it exists.
pub(crate) async fn chain_ensure(db: impl PgExecutor<'_>, chain: i64) -> Result<()> {
    sqlx::query("INSERT INTO index_chain (chain_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(chain)
        .execute(db)
        .await?;
    Ok(())
}

/// Locks the chain row exclusively (`FOR UPDATE`), serializing planners of the chain.
pub(crate) async fn chain_lock(db: impl PgExecutor<'_>, chain: i64) -> Result<()> {
    sqlx::query("SELECT 1 FROM index_chain WHERE chain_id = $1 FOR UPDATE")
        .bind(chain)
        .execute(db)
        .await?;
    Ok(())
}

/// Locks the chain row shared (`FOR SHARE`: tip commits and rollbacks lock it
/// exclusively, so the checkpoint stays as read until the caller commits) and returns
/// its tip number (`None`: no row or no tip yet).
pub(crate) async fn chain_tip_for_share(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT tip_number FROM index_chain WHERE chain_id = $1 FOR SHARE")
            .bind(chain)
            .fetch_optional(db)
            .await?
            .flatten(),
    )
}

/// A chain row's checkpoint and degraded marker.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ChainHealthRow {
    pub chain_id: i64,
    pub tip_number: Option<i64>,
    pub tip_hash: Option<Vec<u8>>,
    pub degraded_at: Option<sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>>,
    pub degraded_reason: Option<String>,
    pub degraded_block: Option<i64>,
    pub rebuild_started_at: Option<sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>>,
}

/// The checkpoint when the chain has a tip (`tip_number` set).
pub(crate) async fn chain_tip(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<CheckpointRow>> {
    Ok(sqlx::query_as(
        "SELECT tip_number, tip_hash FROM index_chain WHERE chain_id = $1 AND tip_number IS NOT NULL",
    )
    .bind(chain)
    .fetch_optional(db)
    .await?)
}

const HEALTH_COLUMNS: &str = "chain_id, tip_number, tip_hash, degraded_at, degraded_reason, \
     degraded_block, rebuild_started_at";

/// The health columns of the chain's row; `None` when the chain has no row.
pub(crate) async fn chain_health_of(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<ChainHealthRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {HEALTH_COLUMNS} FROM index_chain WHERE chain_id = $1"
    )))
    .bind(chain)
    .fetch_optional(db)
    .await?)
}

/// The health columns of every degraded chain, by chain id.
pub(crate) async fn chains_degraded(db: impl PgExecutor<'_>) -> Result<Vec<ChainHealthRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {HEALTH_COLUMNS} FROM index_chain WHERE degraded_at IS NOT NULL ORDER BY chain_id"
    )))
    .fetch_all(db)
    .await?)
}

/// The recorded finalized block of the chain (`finalized_number`, migration `0025`);
/// `None` when the chain has no row or none was recorded yet.
pub(crate) async fn chain_finalized(db: impl PgExecutor<'_>, chain: i64) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT finalized_number FROM index_chain WHERE chain_id = $1")
            .bind(chain)
            .fetch_optional(db)
            .await?
            .flatten(),
    )
}

/// Records the node's head as observed by the owner holding `epoch` (migration 0050):
/// `head_number`, `head_observed_at = now()`, and `behind_since` (kept while the
/// stored tip is below the head, cleared once it is not); clears a re-index's
/// `rebuild_started_at` (migration 0062) once the chain has a tip and no history range
/// of it is open. Returns false when the epoch
/// no longer matches (fenced: nothing written).
pub(crate) async fn chain_observe_head(
    db: impl PgExecutor<'_>,
    chain: i64,
    epoch: i64,
    head: i64,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE index_chain
            SET head_number = $3, head_observed_at = now(),
                behind_since = CASE WHEN tip_number IS NULL OR tip_number < $3
                                    THEN coalesce(behind_since, now()) END,
                rebuild_started_at = CASE
                    WHEN rebuild_started_at IS NOT NULL AND tip_number IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM index_range r
                                      WHERE r.chain_id = $1 AND r.state <> 'completed')
                    THEN NULL ELSE rebuild_started_at END
          WHERE chain_id = $1 AND owner_epoch = $2",
    )
    .bind(chain)
    .bind(epoch)
    .bind(head)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// One chain row as Platform Status shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ChainStatusRow {
    pub chain_id: i64,
    pub owner_epoch: i64,
    pub tip_number: Option<i64>,
    pub head_number: Option<i64>,
    pub head_observed_at: Option<chrono::DateTime<chrono::Utc>>,
    pub behind_since: Option<chrono::DateTime<chrono::Utc>>,
    pub degraded_at: Option<chrono::DateTime<chrono::Utc>>,
    pub degraded_reason: Option<String>,
    pub rebuild_started_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every `index_chain` row by chain id (the owner id is not read: it names a process).
pub(crate) async fn chains_status(db: impl PgExecutor<'_>) -> Result<Vec<ChainStatusRow>> {
    Ok(sqlx::query_as(
        "SELECT chain_id, owner_epoch, tip_number, head_number, head_observed_at, behind_since,
                degraded_at, degraded_reason, rebuild_started_at
           FROM index_chain ORDER BY chain_id",
    )
    .fetch_all(db)
    .await?)
}

/// The owner id recorded by the last ownership change; `None` when the chain has no
/// row or none was recorded.
pub(crate) async fn chain_owner_id(db: impl PgExecutor<'_>, chain: i64) -> Result<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT owner_id FROM index_chain WHERE chain_id = $1")
            .bind(chain)
            .fetch_optional(db)
            .await?
            .flatten(),
    )
}

/// The degraded marker (`degraded_at`) of a chain row locked by the caller.
pub(crate) async fn chain_degraded_at(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>>> {
    Ok(
        sqlx::query_scalar("SELECT degraded_at FROM index_chain WHERE chain_id = $1")
            .bind(chain)
            .fetch_optional(db)
            .await?
            .flatten(),
    )
}

/// A re-index's reset of the chain row (migration 0062): no checkpoint (the next owner
/// plans history from `from` and starts a new tip), no recorded finalized block, the
/// degraded marker cleared, `rebuild_started_at = now()`, `rebuild_from_block = from`.
/// The caller holds the row locked (it took a new epoch in the same transaction).
pub(crate) async fn chain_start_rebuild(
    db: impl PgExecutor<'_>,
    chain: i64,
    from: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE index_chain
            SET tip_number = NULL, tip_hash = NULL, finalized_number = NULL,
                behind_since = NULL,
                degraded_at = NULL, degraded_reason = NULL, degraded_block = NULL,
                rebuild_started_at = now(), rebuild_from_block = $2, updated_at = now()
          WHERE chain_id = $1",
    )
    .bind(chain)
    .bind(from)
    .execute(db)
    .await?;
    Ok(())
}
