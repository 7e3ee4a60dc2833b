//! `aa_deposit_request` (`migrations/0061_aa_deposit_requests.sql`): funding requests
//! of a paymaster's EntryPoint deposit.

use keel_units::ChainId;
use keel_units::db::DbAddress;
use sqlx::PgExecutor;

use super::{StoreResult, unreadable};

/// One `aa_deposit_request` row (`migrations/0061_aa_deposit_requests.sql`): a funding
/// request of a paymaster's EntryPoint deposit.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DepositRequestRow {
    /// Chain id.
    pub chain_id: ChainId,
    /// The paymaster.
    pub paymaster: DbAddress,
    /// The resolved EntryPoint holding the deposit.
    pub entry_point: DbAddress,
    /// The deposit at the last check, wei (decimal).
    pub deposit_wei: String,
    /// The configured minimum, wei (decimal).
    pub minimum_wei: String,
    /// `minimum - deposit` at the last check, wei (decimal).
    pub required_wei: String,
    /// `open` or `closed`.
    pub state: String,
    /// When it was (re)opened.
    pub opened_at: chrono::DateTime<chrono::Utc>,
    /// The last check that changed it.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Opens (or, open already, updates) the deposit funding request of `paymaster` on
/// `chain_id` with the check's figures (wei, decimal); true when it was opened now
/// (not open before).
///
/// # Errors
/// [`StoreError`].
pub async fn deposit_request_open(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    paymaster: &[u8],
    entry_point: &[u8],
    deposit_wei: &str,
    minimum_wei: &str,
    required_wei: &str,
) -> StoreResult<bool> {
    let opened: bool = sqlx::query_scalar(
        "INSERT INTO aa_deposit_request \
           (chain_id, paymaster, entry_point, deposit_wei, minimum_wei, required_wei) \
         VALUES ($1, $2, $3, $4::numeric, $5::numeric, $6::numeric) \
         ON CONFLICT (chain_id, paymaster) DO UPDATE \
           SET entry_point = EXCLUDED.entry_point, deposit_wei = EXCLUDED.deposit_wei, \
               minimum_wei = EXCLUDED.minimum_wei, required_wei = EXCLUDED.required_wei, \
               opened_at = CASE WHEN aa_deposit_request.state = 'open' \
                                THEN aa_deposit_request.opened_at ELSE now() END, \
               state = 'open', closed_at = NULL, updated_at = now() \
         RETURNING opened_at = updated_at",
    )
    .bind(chain_id)
    .bind(paymaster)
    .bind(entry_point)
    .bind(deposit_wei)
    .bind(minimum_wei)
    .bind(required_wei)
    .fetch_one(db)
    .await?;
    Ok(opened)
}

/// Closes the open deposit funding request of `paymaster` on `chain_id` (the deposit
/// is back at the minimum); true when one was open.
///
/// # Errors
/// [`StoreError`].
pub async fn deposit_request_close(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    paymaster: &[u8],
    deposit_wei: &str,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_deposit_request \
            SET state = 'closed', closed_at = now(), updated_at = now(), \
                deposit_wei = $3::numeric, required_wei = 0 \
          WHERE chain_id = $1 AND paymaster = $2 AND state = 'open'",
    )
    .bind(chain_id)
    .bind(paymaster)
    .bind(deposit_wei)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The open deposit funding requests (of `chain_id` when given), oldest first.
///
/// # Errors
/// [`StoreError`].
pub async fn deposit_requests_open(
    db: impl PgExecutor<'_>,
    chain_id: Option<i64>,
) -> StoreResult<Vec<DepositRequestRow>> {
    sqlx::query_as(
        "SELECT chain_id, paymaster, entry_point, deposit_wei::text AS deposit_wei, \
                minimum_wei::text AS minimum_wei, required_wei::text AS required_wei, \
                state, opened_at, updated_at \
           FROM aa_deposit_request \
          WHERE state = 'open' AND ($1::bigint IS NULL OR chain_id = $1) \
          ORDER BY opened_at, chain_id",
    )
    .bind(chain_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_deposit_request"))
}
