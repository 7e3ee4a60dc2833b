//! `aa_bundle` (`migrations/0045_aa_user_operations.sql`; `final_at` and state
//! `reorged` of `0074_aa_reorg_watch.sql`): one row per handleOps bundle enqueued on the
//! transaction queue.

use keel_units::ChainId;
use keel_units::db::{DbAddress, DbHash};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{BundleState, StoreResult, unreadable};

/// One `aa_bundle` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BundleRow {
    /// The bundle id (queue key `aa-bundle:<id>`).
    pub id: Uuid,
    /// Chain id.
    pub chain_id: ChainId,
    /// The resolved EntryPoint it calls.
    pub entry_point: DbAddress,
    /// Its queue request.
    pub txq_request_id: Uuid,
    /// Operation hashes in bundle order.
    pub user_op_hashes: Vec<DbHash>,
    /// Where it is.
    pub state: BundleState,
    /// The transaction that settled it.
    pub tx_hash: Option<DbHash>,
    /// Its block.
    pub block_number: Option<i64>,
    /// Its block hash.
    pub block_hash: Option<DbHash>,
    /// `included` only: when its block was found final (`None` while watched).
    pub final_at: Option<chrono::DateTime<chrono::Utc>>,
}

macro_rules! bundle_columns {
    () => {
        "id, chain_id, entry_point, txq_request_id, user_op_hashes, state, tx_hash, block_number, \
         block_hash, final_at"
    };
}

/// Inserts a `submitted` bundle.
///
/// # Errors
/// [`StoreError`].
pub async fn bundle_insert(
    db: impl PgExecutor<'_>,
    id: Uuid,
    chain_id: i64,
    entry_point: &[u8],
    txq_request_id: Uuid,
    user_op_hashes: &[Vec<u8>],
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO aa_bundle (id, chain_id, entry_point, txq_request_id, user_op_hashes) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(chain_id)
    .bind(entry_point)
    .bind(txq_request_id)
    .bind(user_op_hashes)
    .execute(db)
    .await?;
    Ok(())
}

/// The `submitted` bundles of `chain_id`, oldest first.
///
/// # Errors
/// [`StoreError`].
pub async fn bundles_submitted(
    db: impl PgExecutor<'_>,
    chain_id: i64,
) -> StoreResult<Vec<BundleRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        bundle_columns!(),
        " FROM aa_bundle WHERE chain_id = $1 AND state = 'submitted' \
         ORDER BY created_at, id"
    ))
    .bind(chain_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_bundle"))
}

/// The `included` bundles of `chain_id` not final yet (watched), oldest first, at most
/// `limit`.
///
/// # Errors
/// [`StoreError`].
pub async fn bundles_watched(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    limit: i64,
) -> StoreResult<Vec<BundleRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        bundle_columns!(),
        " FROM aa_bundle WHERE chain_id = $1 AND state = 'included' AND final_at IS NULL \
         ORDER BY created_at, id LIMIT $2"
    ))
    .bind(chain_id)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_bundle"))
}

/// A watched bundle (`included`, not final) with its transaction as the chain shows it
/// now, and its state: `included` (still watched, or final when `final_now`: `final_at`
/// set) or `reorged`; false when it was not watched.
///
/// # Errors
/// [`StoreError`].
pub async fn bundle_watch_update(
    db: impl PgExecutor<'_>,
    id: Uuid,
    new_state: BundleState,
    final_now: bool,
    tx_hash: Option<&[u8]>,
    block_number: Option<i64>,
    block_hash: Option<&[u8]>,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_bundle SET state = $2, final_at = CASE WHEN $6 THEN now() END, \
         tx_hash = coalesce($3, tx_hash), block_number = coalesce($4, block_number), \
         block_hash = coalesce($5, block_hash), updated_at = now() \
         WHERE id = $1 AND state = 'included' AND final_at IS NULL",
    )
    .bind(id)
    .bind(new_state)
    .bind(tx_hash)
    .bind(block_number)
    .bind(block_hash)
    .bind(final_now)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The bundle `id`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn bundle_get(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<Option<BundleRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        bundle_columns!(),
        " FROM aa_bundle WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
    .map_err(unreadable("aa_bundle"))
}

/// `submitted` → `end_state` (`included` or `failed`) with the settling transaction;
/// false when it was not `submitted`.
///
/// # Errors
/// [`StoreError`].
pub async fn bundle_settle(
    db: impl PgExecutor<'_>,
    id: Uuid,
    end_state: BundleState,
    tx_hash: Option<&[u8]>,
    block_number: Option<i64>,
    block_hash: Option<&[u8]>,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_bundle SET state = $2, tx_hash = $3, block_number = $4, block_hash = $5, \
         updated_at = now() WHERE id = $1 AND state = 'submitted'",
    )
    .bind(id)
    .bind(end_state)
    .bind(tx_hash)
    .bind(block_number)
    .bind(block_hash)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The newest bundle of the chain created at or after `since` (database clock) and its
/// state (`submitted`, `included`, `failed`), when there is one.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundle_latest_since(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    since: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Option<(Uuid, BundleState)>> {
    sqlx::query_as(
        "SELECT id, state FROM aa_bundle WHERE chain_id = $1 AND created_at >= $2
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(chain_id)
    .bind(since)
    .fetch_optional(db)
    .await
    .map_err(unreadable("aa_bundle"))
}
