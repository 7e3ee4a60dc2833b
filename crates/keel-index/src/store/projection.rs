//! Reads of the projection tables (`index_transfer`, the `index_balance` view,
//! `index_asset`, `index_observation`, `index_directory_entry`, `index_token_pause`,
//! `index_staleness_bound`, `index_freeze_event`) as raw rows; [`crate::read`] decodes them into its typed
//! rows. Numeric columns come back as decimal text.

use crate::Result;
use sqlx::PgExecutor;

/// The position columns every projected row carries.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PositionRow {
    pub block_number: i64,
    pub log_index: i64,
    pub block_hash: Vec<u8>,
    pub tx_hash: Vec<u8>,
}

/// An `index_transfer` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct TransferRecord {
    #[sqlx(flatten)]
    pub position: PositionRow,
    pub token: Vec<u8>,
    pub from_address: Vec<u8>,
    pub to_address: Vec<u8>,
    pub value: String,
}

/// A nonzero `index_balance` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct BalanceRecord {
    pub holder: Vec<u8>,
    pub balance: String,
}

/// An `index_asset` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct AssetRecord {
    #[sqlx(flatten)]
    pub position: PositionRow,
    pub factory: Vec<u8>,
    pub asset_id: Vec<u8>,
    pub token: Vec<u8>,
    pub symbol: String,
    pub decimals: i16,
}

/// An `index_observation` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ObservationRecord {
    #[sqlx(flatten)]
    pub position: PositionRow,
    pub feed: Vec<u8>,
    pub round_id: String,
    pub answer: String,
    pub updated_at: String,
}

/// An `index_directory_entry` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DirectoryEntryRecord {
    #[sqlx(flatten)]
    pub position: PositionRow,
    pub directory: Vec<u8>,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    pub removed_at_block: Option<i64>,
}

/// The latest `index_token_pause` row of a token.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PauseRecord {
    #[sqlx(flatten)]
    pub position: PositionRow,
    pub paused: bool,
}

/// The latest `index_staleness_bound` row of a feed (`bound`: `None` when cleared).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct StalenessBoundRecord {
    #[sqlx(flatten)]
    pub position: PositionRow,
    pub bound: Option<String>,
}

/// An `index_freeze_event` row without its position (`amount`: decimal text).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct FreezeEventRecord {
    pub kind: String,
    pub account: Vec<u8>,
    pub replacement: Option<Vec<u8>>,
    pub amount: Option<String>,
    pub frozen: Option<bool>,
}

/// Transfers of `token` (every token when `None`), in chain order.
pub(crate) async fn transfers_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: Option<&[u8]>,
) -> Result<Vec<TransferRecord>> {
    Ok(sqlx::query_as(
        "SELECT block_number, log_index, block_hash, tx_hash, token, from_address, to_address,
                value::text AS value
         FROM index_transfer WHERE chain_id = $1 AND ($2::bytea IS NULL OR token = $2)
         ORDER BY block_number, log_index",
    )
    .bind(chain)
    .bind(token)
    .fetch_all(db)
    .await?)
}

/// The balance of `holder` in `token` (decimal text); `None` when it never held any.
pub(crate) async fn balance_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    holder: &[u8],
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT balance::text FROM index_balance WHERE chain_id = $1 AND token = $2 AND holder = $3",
    )
    .bind(chain)
    .bind(token)
    .bind(holder)
    .fetch_optional(db)
    .await?)
}

/// Every nonzero balance of `token`, by holder.
pub(crate) async fn balances_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
) -> Result<Vec<BalanceRecord>> {
    Ok(sqlx::query_as(
        "SELECT holder, balance::text AS balance FROM index_balance
         WHERE chain_id = $1 AND token = $2 AND balance <> 0 ORDER BY holder",
    )
    .bind(chain)
    .bind(token)
    .fetch_all(db)
    .await?)
}

/// Assets created on the chain, in chain order.
pub(crate) async fn assets_of(db: impl PgExecutor<'_>, chain: i64) -> Result<Vec<AssetRecord>> {
    Ok(sqlx::query_as(
        "SELECT block_number, log_index, block_hash, tx_hash, factory, asset_id, token, symbol,
                decimals
         FROM index_asset WHERE chain_id = $1 ORDER BY block_number, log_index",
    )
    .bind(chain)
    .fetch_all(db)
    .await?)
}

/// Observations of `feed`, in chain order.
pub(crate) async fn observations_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    feed: &[u8],
) -> Result<Vec<ObservationRecord>> {
    Ok(sqlx::query_as(
        "SELECT block_number, log_index, block_hash, tx_hash, feed, round_id::text AS round_id,
                answer::text AS answer, updated_at::text AS updated_at
         FROM index_observation WHERE chain_id = $1 AND feed = $2
         ORDER BY block_number, log_index",
    )
    .bind(chain)
    .bind(feed)
    .fetch_all(db)
    .await?)
}

/// Entries of `directory` (live ones, or every one with `history`), in chain order.
pub(crate) async fn directory_entries_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    directory: &[u8],
    history: bool,
) -> Result<Vec<DirectoryEntryRecord>> {
    Ok(sqlx::query_as(
        "SELECT block_number, log_index, block_hash, tx_hash, directory, name, value,
                removed_at_block
         FROM index_directory_entry
         WHERE chain_id = $1 AND directory = $2 AND ($3 OR removed_at_block IS NULL)
         ORDER BY block_number, log_index",
    )
    .bind(chain)
    .bind(directory)
    .bind(history)
    .fetch_all(db)
    .await?)
}

/// The latest pause event of `token`.
pub(crate) async fn token_pause_latest(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
) -> Result<Option<PauseRecord>> {
    Ok(sqlx::query_as(
        "SELECT block_number, log_index, block_hash, tx_hash, paused FROM index_token_pause
         WHERE chain_id = $1 AND token = $2
         ORDER BY block_number DESC, log_index DESC LIMIT 1",
    )
    .bind(chain)
    .bind(token)
    .fetch_optional(db)
    .await?)
}

/// The latest staleness-bound event of `feed`.
pub(crate) async fn staleness_bound_latest(
    db: impl PgExecutor<'_>,
    chain: i64,
    feed: &[u8],
) -> Result<Option<StalenessBoundRecord>> {
    Ok(sqlx::query_as(
        "SELECT block_number, log_index, block_hash, tx_hash, bound_seconds::text AS bound
         FROM index_staleness_bound WHERE chain_id = $1 AND feed = $2
         ORDER BY block_number DESC, log_index DESC LIMIT 1",
    )
    .bind(chain)
    .bind(feed)
    .fetch_optional(db)
    .await?)
}

/// The freeze events of `token` at or below block `at_block`, in chain order.
pub(crate) async fn freeze_events_of(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    at_block: i64,
) -> Result<Vec<FreezeEventRecord>> {
    Ok(sqlx::query_as(
        "SELECT kind, account, replacement, amount::text AS amount, frozen
         FROM index_freeze_event
         WHERE chain_id = $1 AND token = $2 AND block_number <= $3
         ORDER BY block_number, log_index",
    )
    .bind(chain)
    .bind(token)
    .bind(at_block)
    .fetch_all(db)
    .await?)
}
