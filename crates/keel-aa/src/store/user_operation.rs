//! `aa_user_operation` (`migrations/0045_aa_user_operations.sql`, the states of
//! `0071_aa_admission.sql`, `finalized_at` of `0074_aa_reorg_watch.sql`): one row per
//! accepted user operation, moved by the workflow and the bundler.

use keel_units::ChainId;
use keel_units::db::{DbAddress, DbHash};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{StoreResult, UserOpState, stored_chain_id, unreadable};

/// One `aa_user_operation` row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UserOperationRow {
    /// Chain id.
    pub chain_id: ChainId,
    /// The v0.8 operation hash.
    pub user_op_hash: DbHash,
    /// The organization that submitted it, when known.
    pub organization_id: Option<Uuid>,
    /// The account.
    pub sender: DbAddress,
    /// The nonce, decimal string of a uint256.
    pub nonce: String,
    /// The ERC-7769 JSON form of the operation.
    pub user_operation: serde_json::Value,
    /// The journaled [`crate::Resolution`] as JSON.
    pub resolution: serde_json::Value,
    /// The `aa.user-operation` workflow instance.
    pub instance_id: Uuid,
    /// Where it is.
    pub state: UserOpState,
    /// The bundle it is (or last was) in.
    pub bundle_id: Option<Uuid>,
    /// Maximum cost granted by the sponsorship policy, wei (decimal).
    pub sponsored_wei: Option<String>,
    /// Whether the execution call succeeded (included only).
    pub success: Option<bool>,
    /// What the paymaster or account paid, wei (decimal).
    pub actual_gas_cost: Option<String>,
    /// Gas charged, gas units (decimal).
    pub actual_gas_used: Option<String>,
    /// Revert data of the execution call.
    pub revert_reason: Option<Vec<u8>>,
    /// The bundle transaction.
    pub tx_hash: Option<DbHash>,
    /// Its block number.
    pub block_number: Option<i64>,
    /// Its block hash.
    pub block_hash: Option<DbHash>,
    /// ERC-7769 error code of a refusal.
    pub error_code: Option<i32>,
    /// The refusal's reason (`AA31 paymaster deposit too low`, `SPONSOR_…`).
    pub error_reason: Option<String>,
    /// When it was recorded.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Last change.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// When its inclusion was found final and reported to the workflow (`included`
    /// only; `None` while watched).
    pub finalized_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl UserOperationRow {
    /// The row's key as the store functions take it: the stored chain id and the hash.
    pub fn key(&self) -> (i64, &[u8]) {
        (
            stored_chain_id(self.chain_id),
            self.user_op_hash.0.as_slice(),
        )
    }
}

macro_rules! user_op_columns {
    () => {
        "chain_id, user_op_hash, organization_id, sender, nonce, \
    user_operation, resolution, instance_id, state, bundle_id, sponsored_wei, success, \
    actual_gas_cost, actual_gas_used, revert_reason, tx_hash, block_number, block_hash, \
    error_code, error_reason, created_at, updated_at, finalized_at"
    };
}

/// A new `aa_user_operation` row (state `accepted`).
#[derive(Debug, Clone, Copy)]
pub struct NewUserOperation<'a> {
    /// Chain id.
    pub chain_id: i64,
    /// The operation hash (32 bytes).
    pub user_op_hash: &'a [u8],
    /// The organization, when known.
    pub organization_id: Option<Uuid>,
    /// The account (20 bytes).
    pub sender: &'a [u8],
    /// The nonce (decimal).
    pub nonce: &'a str,
    /// The ERC-7769 JSON form.
    pub user_operation: &'a serde_json::Value,
    /// The resolution (JSON).
    pub resolution: &'a serde_json::Value,
    /// The workflow instance.
    pub instance_id: Uuid,
}

/// Inserts `row` unless the (chain, hash) exists; true when it was inserted.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_insert(
    db: impl PgExecutor<'_>,
    row: &NewUserOperation<'_>,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "INSERT INTO aa_user_operation (chain_id, user_op_hash, organization_id, sender, nonce, \
         user_operation, resolution, instance_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (chain_id, user_op_hash) DO NOTHING",
    )
    .bind(row.chain_id)
    .bind(row.user_op_hash)
    .bind(row.organization_id)
    .bind(row.sender)
    .bind(row.nonce)
    .bind(row.user_operation)
    .bind(row.resolution)
    .bind(row.instance_id)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The row of (chain, hash), if any.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_get(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
) -> StoreResult<Option<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation WHERE chain_id = $1 AND user_op_hash = $2"
    ))
    .bind(chain_id)
    .bind(user_op_hash)
    .fetch_optional(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// The row of `user_op_hash` on any chain (the hash's EIP-712 domain names its chain, so
/// at most one row in practice; the oldest when not), if any.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_by_hash(
    db: impl PgExecutor<'_>,
    user_op_hash: &[u8],
) -> StoreResult<Option<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation WHERE user_op_hash = $1 ORDER BY created_at LIMIT 1"
    ))
    .bind(user_op_hash)
    .fetch_optional(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// `accepted` → `ready`, recording the sponsorship granted (wei, decimal); false when
/// the row was not `accepted`.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_set_ready(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    sponsored_wei: Option<&str>,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'ready', sponsored_wei = $3, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND state = 'accepted'",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(sponsored_wei)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Ends a non-terminal operation (`accepted`, `ready`, `bundled`, or `included` and
/// not final) in `end_state` ([`state::FAILED`] or [`state::NONCE_USED_ELSEWHERE`])
/// with an ERC-7769 code and a value-free reason, clearing any inclusion fields; false
/// when it had ended already.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_end(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    end_state: UserOpState,
    error_code: i32,
    error_reason: &str,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = $3, error_code = $4, error_reason = left($5, 200), \
         success = NULL, actual_gas_cost = NULL, actual_gas_used = NULL, revert_reason = NULL, \
         tx_hash = NULL, block_number = NULL, block_hash = NULL, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 \
           AND (state IN ('accepted', 'ready', 'bundled') \
                OR (state = 'included' AND finalized_at IS NULL))",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(end_state)
    .bind(error_code)
    .bind(error_reason)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Up to `limit` `ready` operations of `chain_id`, oldest first, leaving out every
/// operation whose sender has another operation `bundled` (in an unsettled bundle): a
/// sender's next operation is never bundled while its earlier one is in flight.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_ready(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    limit: i64,
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation r WHERE chain_id = $1 AND state = 'ready' \
         AND NOT EXISTS (SELECT 1 FROM aa_user_operation b WHERE b.chain_id = r.chain_id \
           AND b.sender = r.sender AND b.state = 'bundled') \
         ORDER BY created_at, user_op_hash LIMIT $2"
    ))
    .bind(chain_id)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// Up to `limit` operations of `chain_id` that have been `ready` (waiting for a bundle)
/// for more than `older_than_secs` seconds on the database clock (since their last
/// state change), oldest first: what the bundler ends `MEMPOOL_EXPIRED`.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_ready_expired(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    older_than_secs: i64,
    limit: i64,
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation WHERE chain_id = $1 AND state = 'ready' \
         AND updated_at < now() - make_interval(secs => $2) \
         ORDER BY updated_at, user_op_hash LIMIT $3"
    ))
    .bind(chain_id)
    .bind(older_than_secs as f64)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// The open operations (`accepted`, `ready`, `bundled`) of `sender` on `chain_id`,
/// oldest first (acceptance's one-operation-per-sender and replacement rules).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_open_of_sender(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation WHERE chain_id = $1 AND sender = $2 \
         AND state IN ('accepted', 'ready', 'bundled') ORDER BY created_at, user_op_hash"
    ))
    .bind(chain_id)
    .bind(sender)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// Ends an operation not yet bundled (`accepted` or `ready`) as [`state::REPLACED`]
/// with an ERC-7769 code and the reason `REPLACED`; false when it was bundled or had
/// ended already (then it is not replaced).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_replace(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    error_code: i32,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'replaced', error_code = $3, \
         error_reason = 'REPLACED', updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND state IN ('accepted', 'ready')",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(error_code)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// `ready` → `bundled` in `bundle_id` for `hashes`; the number of rows moved.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_bundle(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    hashes: &[Vec<u8>],
    bundle_id: Uuid,
) -> StoreResult<u64> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'bundled', bundle_id = $3, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = ANY($2) AND state = 'ready'",
    )
    .bind(chain_id)
    .bind(hashes)
    .bind(bundle_id)
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

/// The operations `bundled` in `bundle_id`, ordered by instance id (the order their
/// signals are recorded in, so two transactions lock instances alike).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_in_bundle(
    db: impl PgExecutor<'_>,
    bundle_id: Uuid,
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation \
         WHERE bundle_id = $1 AND state = 'bundled' ORDER BY instance_id"
    ))
    .bind(bundle_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// The outcome of an included operation.
#[derive(Debug, Clone, Copy)]
pub struct Inclusion<'a> {
    /// Whether the execution call succeeded.
    pub success: bool,
    /// Wei, decimal.
    pub actual_gas_cost: &'a str,
    /// Gas units, decimal.
    pub actual_gas_used: &'a str,
    /// Revert data of the execution call.
    pub revert_reason: Option<&'a [u8]>,
    /// The bundle transaction.
    pub tx_hash: &'a [u8],
    /// Its block.
    pub block_number: i64,
    /// Its block hash.
    pub block_hash: Option<&'a [u8]>,
}

/// `bundled` (in `bundle_id`) → `included` with `inc`; false when it was not.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_include(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    bundle_id: Uuid,
    inc: &Inclusion<'_>,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'included', success = $4, actual_gas_cost = $5, \
         actual_gas_used = $6, revert_reason = $7, tx_hash = $8, block_number = $9, \
         block_hash = $10, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND bundle_id = $3 AND state = 'bundled'",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(bundle_id)
    .bind(inc.success)
    .bind(inc.actual_gas_cost)
    .bind(inc.actual_gas_used)
    .bind(inc.revert_reason)
    .bind(inc.tx_hash)
    .bind(inc.block_number)
    .bind(inc.block_hash)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// `bundled` or `included` and not final (in `bundle_id`) → `ready`: back in flight for
/// the next bundle, re-validated by its simulation (its bundle failed, did not hold
/// it, or a reorg took it out for good); inclusion fields cleared. False when it was
/// not.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_unbundle(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    bundle_id: Uuid,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'ready', success = NULL, actual_gas_cost = NULL, \
         actual_gas_used = NULL, revert_reason = NULL, tx_hash = NULL, block_number = NULL, \
         block_hash = NULL, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND bundle_id = $3 \
           AND (state = 'bundled' OR (state = 'included' AND finalized_at IS NULL))",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(bundle_id)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// `bundled` or `included` and not final (in `bundle_id`) → `included` with `inc`: the
/// inclusion as the chain shows it now (first seen, or moved by a reorg to another
/// block or transaction). False when it was neither (ended, final, or re-bundled).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_track(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    bundle_id: Uuid,
    inc: &Inclusion<'_>,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'included', success = $4, actual_gas_cost = $5, \
         actual_gas_used = $6, revert_reason = $7, tx_hash = $8, block_number = $9, \
         block_hash = $10, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND bundle_id = $3 \
           AND (state = 'bundled' OR (state = 'included' AND finalized_at IS NULL))",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(bundle_id)
    .bind(inc.success)
    .bind(inc.actual_gas_cost)
    .bind(inc.actual_gas_used)
    .bind(inc.revert_reason)
    .bind(inc.tx_hash)
    .bind(inc.block_number)
    .bind(inc.block_hash)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// `included` and not final (in `bundle_id`) → `bundled`: a reorg has its bundle out of
/// the chain for now (the queue re-broadcasts the same bytes); inclusion fields
/// cleared. False when it was not.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_out(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
    bundle_id: Uuid,
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET state = 'bundled', success = NULL, actual_gas_cost = NULL, \
         actual_gas_used = NULL, revert_reason = NULL, tx_hash = NULL, block_number = NULL, \
         block_hash = NULL, updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND bundle_id = $3 \
           AND state = 'included' AND finalized_at IS NULL",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .bind(bundle_id)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// `included` and not final → final (`finalized_at` set): its block is final and the
/// outcome is reported in the same transaction. False when it was not (final already,
/// or no longer included).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operation_finalize(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    user_op_hash: &[u8],
) -> StoreResult<bool> {
    let r = sqlx::query(
        "UPDATE aa_user_operation SET finalized_at = now(), updated_at = now() \
         WHERE chain_id = $1 AND user_op_hash = $2 AND state = 'included' \
           AND finalized_at IS NULL",
    )
    .bind(chain_id)
    .bind(user_op_hash)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The operations of `bundle_id` still watched with it (`bundled`, or `included` and
/// not final), ordered by instance id.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_watched_in_bundle(
    db: impl PgExecutor<'_>,
    bundle_id: Uuid,
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation \
         WHERE bundle_id = $1 \
           AND (state = 'bundled' OR (state = 'included' AND finalized_at IS NULL)) \
         ORDER BY instance_id"
    ))
    .bind(bundle_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// Up to `limit` operations of `chain_id` found `included` in a transaction that is not
/// their (watched) bundle's — their bundle is `reorged` or `failed` — and not final
/// yet, oldest change first: the bundler watches each by its own transaction.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_found_elsewhere(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    limit: i64,
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation o \
         WHERE o.chain_id = $1 AND o.state = 'included' AND o.finalized_at IS NULL \
           AND EXISTS (SELECT 1 FROM aa_bundle b WHERE b.id = o.bundle_id \
                        AND b.state IN ('reorged', 'failed')) \
         ORDER BY o.updated_at, o.user_op_hash LIMIT $2"
    ))
    .bind(chain_id)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// Operations of every chain in a non-terminal state recorded before `older_than`
/// seconds ago, per state (the bundler watchdog's read).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_stale(
    db: impl PgExecutor<'_>,
    older_than_seconds: i64,
) -> StoreResult<Vec<(ChainId, UserOpState, i64)>> {
    sqlx::query_as(
        "SELECT chain_id, state, count(*) FROM aa_user_operation \
         WHERE state IN ('accepted', 'ready', 'bundled') \
           AND created_at < now() - make_interval(secs => $1) \
         GROUP BY chain_id, state ORDER BY chain_id, state",
    )
    .bind(older_than_seconds as f64)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// The chain's operations not yet in a bundle (`accepted` or `ready`), oldest first, at
/// most `limit`.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn user_operations_pending(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    limit: i64,
) -> StoreResult<Vec<UserOperationRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        user_op_columns!(),
        " FROM aa_user_operation WHERE chain_id = $1 AND state IN ('accepted', 'ready') \
         ORDER BY created_at, user_op_hash LIMIT $2"
    ))
    .bind(chain_id)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}

/// How many operations of `chain_id` not yet ended (accepted, ready, bundled) name
/// `address` (lowercase `0x…` hex) as their paymaster or factory.
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_open_with_entity<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address_hex: &str,
) -> StoreResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM aa_user_operation WHERE chain_id = $1 \
         AND state IN ('accepted', 'ready', 'bundled') \
         AND (lower(user_operation->>'paymaster') = $2 OR lower(user_operation->>'factory') = $2)",
    )
    .bind(chain_id)
    .bind(address_hex)
    .fetch_one(db)
    .await?)
}

/// The hash and ERC-7769 JSON of every operation of `chain_id` not yet ended (accepted, ready,
/// bundled) that names `address` (lowercase `0x…` hex) as its paymaster: what the
/// paymaster's EntryPoint deposit must cover (ERC-7562 EREP-010).
///
/// # Errors
/// [`StoreError`].
pub async fn user_operations_open_with_paymaster<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address_hex: &str,
) -> StoreResult<Vec<(DbHash, serde_json::Value)>> {
    sqlx::query_as(
        "SELECT user_op_hash, user_operation FROM aa_user_operation WHERE chain_id = $1 \
         AND state IN ('accepted', 'ready', 'bundled') \
         AND lower(user_operation->>'paymaster') = $2",
    )
    .bind(chain_id)
    .bind(address_hex)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_user_operation"))
}
