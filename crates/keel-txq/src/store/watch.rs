//! The finality watch of settled writes (`migrations/0065`): `txq_request` rows settled
//! `confirmed`/`reverted` whose block is not yet final.

use super::unreadable;
use crate::Result;
use keel_units::db::DbAddress;
use sqlx::PgExecutor;
use uuid::Uuid;

/// A settled write still watched until its block is final (migration 0065).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct WatchedRow {
    pub id: Uuid,
    pub sender: DbAddress,
    pub nonce: Option<i64>,
    pub verdict: serde_json::Value,
    /// A reorg has its transaction out of the chain (`reorged_at` set).
    pub reorged: bool,
}

/// Up to `limit` settled `confirmed`/`reverted` requests of a chain with a nonce (a
/// custody sender's have none: the provider watches those) whose block was not yet
/// found final, oldest settlement first.
pub(crate) async fn requests_watched(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    limit: i64,
) -> Result<Vec<WatchedRow>> {
    sqlx::query_as::<_, WatchedRow>(
        "SELECT id, sender, nonce, verdict, reorged_at IS NOT NULL AS reorged FROM txq_request
          WHERE chain_id = $1 AND state = 'settled' AND final_at IS NULL
            AND verdict_kind IN ('confirmed', 'reverted') AND nonce IS NOT NULL
          ORDER BY settled_at LIMIT $2",
    )
    .bind(chain_id)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Ends the watch of these requests: their verdict's block is final.
pub(crate) async fn requests_mark_final(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE txq_request SET final_at = now(), reorged_at = NULL, updated_at = now()
          WHERE id = ANY($1) AND state = 'settled' AND final_at IS NULL",
    )
    .bind(ids)
    .execute(db)
    .await?;
    Ok(())
}

/// A watched request whose transaction is mined again (after a reorg, in another block,
/// or another of its attempts): its verdict (same kind) is replaced and the reorg mark
/// cleared. False when it is no longer watched.
pub(crate) async fn request_watch_update(
    db: impl PgExecutor<'_>,
    id: Uuid,
    verdict: &serde_json::Value,
    kind: &str,
) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_request SET verdict = $2, verdict_kind = $3, reorged_at = NULL, updated_at = now()
          WHERE id = $1 AND state = 'settled' AND final_at IS NULL",
    )
    .bind(id)
    .bind(verdict)
    .bind(kind)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Marks a watched request's transaction as taken out of the chain by a reorg (first
/// detection only: `reorged_at` set, `reorgs` counted). True when it was newly marked.
pub(crate) async fn request_mark_reorged(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_request SET reorged_at = now(), reorgs = reorgs + 1, updated_at = now()
          WHERE id = $1 AND state = 'settled' AND final_at IS NULL AND reorged_at IS NULL",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Replaces a watched request's verdict with `verdict` (`failed`, `REORGED_OUT`) and
/// ends its watch; returns its idempotency key, `None` when it is no longer watched.
pub(crate) async fn request_reorged_out(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    verdict: &serde_json::Value,
) -> Result<Option<String>> {
    sqlx::query_scalar(
        "UPDATE txq_request SET verdict = $2, verdict_kind = 'failed', final_at = now(),
                reorged_at = coalesce(reorged_at, now()), updated_at = now()
          WHERE id = $1 AND state = 'settled' AND final_at IS NULL
         RETURNING idempotency_key",
    )
    .bind(id)
    .bind(verdict)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unreadable("txq_request"))
}
