//! `index_snapshot` and `index_snapshot_holder` (migration `0088`): record-date
//! snapshots as objects. A snapshot row is created `pending`; sealing copies its holders
//! into `index_snapshot_holder` once and marks it `final` with its count, total and
//! content hash (guarded by `state = 'pending'`), after which nothing writes it again.

use crate::Result;
use sqlx::PgExecutor;
use sqlx::types::chrono::{DateTime, Utc};
use uuid::Uuid;

/// An `index_snapshot` row (`total` as decimal text).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SnapshotRecord {
    pub id: Uuid,
    pub chain_id: i64,
    pub token: Vec<u8>,
    pub at_block: i64,
    pub state: String,
    pub holder_count: Option<i64>,
    pub total: Option<String>,
    pub content_hash: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub finalized_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, chain_id, token, at_block, state, holder_count, total::text AS total, \
                       content_hash, created_at, finalized_at";

/// Inserts a pending snapshot of `token` at `at` unless one exists; returns the row
/// (the existing one when it did) and whether it was created.
pub(crate) async fn snapshot_insert(
    db: &mut sqlx::PgConnection,
    id: Uuid,
    chain: i64,
    token: &[u8],
    at: i64,
) -> Result<(SnapshotRecord, bool)> {
    let created: Option<SnapshotRecord> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO index_snapshot (id, chain_id, token, at_block) VALUES ($1, $2, $3, $4)
         ON CONFLICT (chain_id, token, at_block) DO NOTHING RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(chain)
    .bind(token)
    .bind(at)
    .fetch_optional(&mut *db)
    .await?;
    if let Some(row) = created {
        return Ok((row, true));
    }
    let row = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM index_snapshot WHERE chain_id = $1 AND token = $2 AND at_block = $3"
    )))
    .bind(chain)
    .bind(token)
    .bind(at)
    .fetch_one(&mut *db)
    .await?;
    Ok((row, false))
}

/// The snapshot `id`; `None` when there is none.
pub(crate) async fn snapshot_get(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<SnapshotRecord>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM index_snapshot WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// The snapshot `id`, locked for its sealing (`FOR UPDATE`).
pub(crate) async fn snapshot_lock(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<SnapshotRecord>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM index_snapshot WHERE id = $1 FOR UPDATE"
    )))
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Snapshots of `token`, newest record date first, strictly below block `before`, at
/// most `limit`.
pub(crate) async fn snapshots_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    before: i64,
    limit: i64,
) -> Result<Vec<SnapshotRecord>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM index_snapshot
          WHERE chain_id = $1 AND token = $2 AND at_block < $3
          ORDER BY at_block DESC LIMIT $4"
    )))
    .bind(chain)
    .bind(token)
    .bind(before)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Ids of the pending snapshots of the chain at or below block `at` (lowest first).
pub(crate) async fn snapshots_pending_at_or_below(
    db: impl PgExecutor<'_>,
    chain: i64,
    at: i64,
) -> Result<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM index_snapshot
          WHERE chain_id = $1 AND state = 'pending' AND at_block <= $2 ORDER BY at_block",
    )
    .bind(chain)
    .bind(at)
    .fetch_all(db)
    .await?)
}

/// History ranges of the chain not yet completed that start at or below block `at`
/// (rows of such a range may still be missing below it).
pub(crate) async fn ranges_open_at_or_below(
    db: impl PgExecutor<'_>,
    chain: i64,
    at: i64,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM index_range
          WHERE chain_id = $1 AND state <> 'completed' AND from_block <= $2",
    )
    .bind(chain)
    .bind(at)
    .fetch_one(db)
    .await?)
}

/// Copies the holders of `token` at block `at` into the snapshot's rows in one
/// statement: each holder's kept balance minus its changes above `at`, positive
/// balances only, never the zero address. Returns the rows written.
pub(crate) async fn snapshot_holders_fill(
    db: impl PgExecutor<'_>,
    id: Uuid,
    chain: i64,
    token: &[u8],
    at: i64,
) -> Result<u64> {
    Ok(sqlx::query(
        "INSERT INTO index_snapshot_holder (snapshot_id, holder, balance)
         SELECT $1, b.holder, b.balance - COALESCE(m.delta, 0)
           FROM index_holder_balance b
           LEFT JOIN (SELECT holder, sum(delta) AS delta FROM index_holder_change
                       WHERE chain_id = $2 AND token = $3 AND block_number > $4
                       GROUP BY holder) m ON m.holder = b.holder
          WHERE b.chain_id = $2 AND b.token = $3
            AND b.holder <> '\\x0000000000000000000000000000000000000000'::bytea
            AND b.balance - COALESCE(m.delta, 0) > 0",
    )
    .bind(id)
    .bind(chain)
    .bind(token)
    .bind(at)
    .execute(db)
    .await?
    .rows_affected())
}

/// Marks the pending snapshot final with its count, total (decimal text) and content
/// hash. Returns false when it was not pending (nothing written).
pub(crate) async fn snapshot_finalize(
    db: impl PgExecutor<'_>,
    id: Uuid,
    holder_count: i64,
    total: &str,
    content_hash: &[u8],
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE index_snapshot
            SET state = 'final', holder_count = $2, total = $3::numeric, content_hash = $4,
                finalized_at = now()
          WHERE id = $1 AND state = 'pending'",
    )
    .bind(id)
    .bind(holder_count)
    .bind(total)
    .bind(content_hash)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// A holder row of a final snapshot (`balance` as decimal text).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SnapshotHolderRecord {
    pub holder: Vec<u8>,
    pub balance: String,
}

/// Rows of snapshot `id` ranked by `(balance DESC, holder ASC)` after the keyset
/// `(after_balance, after_holder)` (exclusive), at most `limit`: one index range scan
/// (`index_snapshot_holder_rank`) starting at the cursor.
pub(crate) async fn snapshot_holders_ranked(
    db: impl PgExecutor<'_>,
    id: Uuid,
    after_balance: &str,
    after_holder: &[u8],
    limit: i64,
) -> Result<Vec<SnapshotHolderRecord>> {
    Ok(sqlx::query_as(
        "SELECT holder, balance::text AS balance FROM index_snapshot_holder
          WHERE snapshot_id = $1 AND balance <= $2::numeric
            AND (balance < $2::numeric OR holder > $3)
          -- (the table's numeric column, not the text output of the same name)
          ORDER BY index_snapshot_holder.balance DESC, holder LIMIT $4",
    )
    .bind(id)
    .bind(after_balance)
    .bind(after_holder)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Rows of snapshot `id` by holder ascending (the canonical order), strictly after
/// `after_holder`, at most `limit`: one primary-key range scan.
pub(crate) async fn snapshot_holders_by_address(
    db: impl PgExecutor<'_>,
    id: Uuid,
    after_holder: &[u8],
    limit: i64,
) -> Result<Vec<SnapshotHolderRecord>> {
    Ok(sqlx::query_as(
        "SELECT holder, balance::text AS balance FROM index_snapshot_holder
          WHERE snapshot_id = $1 AND holder > $2 ORDER BY holder LIMIT $3",
    )
    .bind(id)
    .bind(after_holder)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// What a sealing checks on the chain row: the owner epoch (a re-index or a takeover
/// takes a new one), tip, recorded finality, degraded and rebuilding markers.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct SealViewRow {
    pub owner_epoch: i64,
    pub tip_number: Option<i64>,
    pub finalized_number: Option<i64>,
    pub degraded: bool,
    pub rebuilding: bool,
}

/// The chain row as a sealing checks it; `None` when the chain has no row.
pub(crate) async fn chain_seal_view(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<SealViewRow>> {
    Ok(sqlx::query_as(
        "SELECT owner_epoch, tip_number, finalized_number, degraded_at IS NOT NULL AS degraded,
                rebuild_started_at IS NOT NULL AS rebuilding
           FROM index_chain WHERE chain_id = $1",
    )
    .bind(chain)
    .fetch_optional(db)
    .await?)
}
