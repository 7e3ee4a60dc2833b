//! SQL of keel-aa's tables (`migrations/0045_aa_user_operations.sql`):
//! `aa_user_operation`, `aa_bundle`, `aa_sponsorship_spend`; and
//! `aa_deposit_request` (`migrations/0061_aa_deposit_requests.sql`); the reorg watch's
//! `finalized_at`, `aa_bundle.final_at` and bundle state `reorged`
//! (`migrations/0074_aa_reorg_watch.sql`).
//!
//! Every function is one statement named noun-first and takes an executor, so the
//! workflow and the bundler compose them in one transaction (a state change and the
//! signal that reports it commit together). Rows come back decoded at the row: a
//! [`ChainId`], [`DbHash`] / [`DbAddress`] for 32/20-byte hashes and addresses, the
//! [`UserOpState`] / [`BundleState`] enums, decimal strings for uint256 values; a row
//! that does not decode is an error naming its table ([`unreadable`]). Updates are guarded by the state they leave: a repeated call
//! changes nothing and says so (`false` / 0 rows).

use keel_store::StoreError;
use keel_units::ChainId;
use keel_units::db::{DbAddress, DbHash};
use sqlx::PgExecutor;
use uuid::Uuid;

/// `Result` of the store functions: every failure is a classified [`StoreError`].
pub type StoreResult<T> = Result<T, StoreError>;

/// Where a user operation is (`aa_user_operation.state`, the CHECK of
/// `migrations/0071_aa_admission.sql`), decoded at the row with the stored spelling:
/// a stored text that is none of these is a decode error ([`unreadable`]), never a
/// fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UserOpState {
    /// Recorded by the workflow's first step; not validated yet.
    Accepted,
    /// Validated and (when a policy applies) sponsored: waiting for a bundle.
    Ready,
    /// In a bundle whose queue request has no handled verdict yet.
    Bundled,
    /// Its `UserOperationEvent` is in a confirmed bundle (the call may have reverted:
    /// see `success`). Watched until the block is final (`finalized_at` set, then the
    /// workflow is told); a reorg meanwhile may move it (new transaction, block,
    /// receipt fields), put it back to `bundled` (its bundle out of the chain, may be
    /// re-included) or `ready` (out for good), or end it.
    Included,
    /// Refused (validation, policy, or alone in a bundle simulation); see `error_code`.
    Failed,
    /// Its nonce was used by an inclusion that is not ours.
    NonceUsedElsewhere,
    /// Superseded before it was bundled by another operation of the same sender and
    /// nonce with higher fees (the ERC-7562 replacement rule, migration 0071).
    Replaced,
}

impl UserOpState {
    /// Every state.
    pub const ALL: [UserOpState; 7] = [
        Self::Accepted,
        Self::Ready,
        Self::Bundled,
        Self::Included,
        Self::Failed,
        Self::NonceUsedElsewhere,
        Self::Replaced,
    ];

    /// The stored text (`accepted`, `ready`, `bundled`, `included`, `failed`,
    /// `nonce_used_elsewhere`, `replaced`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Ready => "ready",
            Self::Bundled => "bundled",
            Self::Included => "included",
            Self::Failed => "failed",
            Self::NonceUsedElsewhere => "nonce_used_elsewhere",
            Self::Replaced => "replaced",
        }
    }
}

/// Where a bundle is (`aa_bundle.state`, the CHECK of
/// `migrations/0074_aa_reorg_watch.sql`), decoded at the row like [`UserOpState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BundleState {
    /// Enqueued on the transaction queue; no verdict handled yet.
    Submitted,
    /// Its verdict was `confirmed`: its operations are `included` (or `bundled` while a
    /// reorg has it out of the chain), watched until the queue finds the block final;
    /// then `final_at` is set and every operation's outcome was reported.
    Included,
    /// Included once, then taken out for good (`REORGED_OUT`) or re-mined without its
    /// operations: they went back to `ready`, ended, or were found in another
    /// transaction.
    Reorged,
    /// Reverted or never took effect: its operations went back to `ready` (or ended).
    Failed,
}

impl BundleState {
    /// Every state.
    pub const ALL: [BundleState; 4] =
        [Self::Submitted, Self::Included, Self::Reorged, Self::Failed];

    /// The stored text (`submitted`, `included`, `reorged`, `failed`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Included => "included",
            Self::Reorged => "reorged",
            Self::Failed => "failed",
        }
    }
}

/// The sqlx text column type of a state enum (`ALL`, `as_str`), with the stored
/// spelling; an unknown text is a decode error naming `$column` (not the value).
macro_rules! stored_state {
    ($ty:ty, $column:literal) => {
        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl sqlx::postgres::PgHasArrayType for $ty {
            fn array_type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<'_, sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $ty {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let s = <&str as sqlx::Decode<'r, sqlx::Postgres>>::decode(value)?;
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| Box::new(UnknownState { column: $column }).into())
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// Compares with the stored spelling.
        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        /// Compares with the stored spelling.
        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }
    };
}

stored_state!(UserOpState, "aa_user_operation.state");
stored_state!(BundleState, "aa_bundle.state");

/// A stored state this build does not know (the value is not shown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{column} holds a state this build does not know")]
pub struct UnknownState {
    /// The column, as `table.column`.
    pub column: &'static str,
}

/// The [`UserOpState`] values under their stored names.
pub mod state {
    use super::UserOpState;

    /// [`UserOpState::Accepted`].
    pub const ACCEPTED: UserOpState = UserOpState::Accepted;
    /// [`UserOpState::Ready`].
    pub const READY: UserOpState = UserOpState::Ready;
    /// [`UserOpState::Bundled`].
    pub const BUNDLED: UserOpState = UserOpState::Bundled;
    /// [`UserOpState::Included`].
    pub const INCLUDED: UserOpState = UserOpState::Included;
    /// [`UserOpState::Failed`].
    pub const FAILED: UserOpState = UserOpState::Failed;
    /// [`UserOpState::NonceUsedElsewhere`].
    pub const NONCE_USED_ELSEWHERE: UserOpState = UserOpState::NonceUsedElsewhere;
    /// [`UserOpState::Replaced`].
    pub const REPLACED: UserOpState = UserOpState::Replaced;
}

/// The [`BundleState`] values under their stored names.
pub mod bundle_state {
    use super::BundleState;

    /// [`BundleState::Submitted`].
    pub const SUBMITTED: BundleState = BundleState::Submitted;
    /// [`BundleState::Included`].
    pub const INCLUDED: BundleState = BundleState::Included;
    /// [`BundleState::Reorged`].
    pub const REORGED: BundleState = BundleState::Reorged;
    /// [`BundleState::Failed`].
    pub const FAILED: BundleState = BundleState::Failed;
}

/// The error of a failed statement that reads rows of `table`: a row that does not
/// decode (a state this build does not know, a hash or address of the wrong length, a
/// negative chain id) is logged at ERROR naming the table and the column (never the
/// value), counted in `keel_aa_unreadable_rows_total{table}`, and returned as
/// [`StoreError::Decode`]; never skipped, zeroed or defaulted.
pub fn unreadable(table: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| {
        if let sqlx::Error::ColumnDecode { index, .. } = &e {
            metrics::counter!("keel_aa_unreadable_rows_total", "table" => table).increment(1);
            tracing::error!(target: "keel::aa::store", table, column = %index,
                "a stored row does not decode; it is refused");
        } else if matches!(e, sqlx::Error::Decode(_)) {
            metrics::counter!("keel_aa_unreadable_rows_total", "table" => table).increment(1);
            tracing::error!(target: "keel::aa::store", table, "a stored row does not decode; it is refused");
        }
        StoreError::from(e)
    }
}

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

/// A chain id read from a row, as the store functions take it. It was decoded from the
/// column ([`ChainId::from_db`]), so [`ChainId::to_db`] cannot fail on it.
pub fn stored_chain_id(chain_id: ChainId) -> i64 {
    chain_id.to_db().unwrap_or(i64::MAX)
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

/// Wei the policy granted to `organization_id` on `chain_id` on UTC `day` (decimal
/// string; "0" without a row).
///
/// # Errors
/// [`StoreError`].
pub async fn sponsorship_spend_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    chain_id: i64,
    day: chrono::NaiveDate,
) -> StoreResult<String> {
    let v: Option<String> = sqlx::query_scalar(
        "SELECT granted_wei::text FROM aa_sponsorship_spend \
         WHERE organization_id = $1 AND chain_id = $2 AND day = $3",
    )
    .bind(organization_id)
    .bind(chain_id)
    .bind(day)
    .fetch_optional(db)
    .await?;
    Ok(v.unwrap_or_else(|| "0".to_owned()))
}

/// Adds `wei` (decimal) to the day's grant of `organization_id` on `chain_id`; the new
/// total (decimal).
///
/// # Errors
/// [`StoreError`].
pub async fn sponsorship_spend_add(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    chain_id: i64,
    day: chrono::NaiveDate,
    wei: &str,
) -> StoreResult<String> {
    Ok(sqlx::query_scalar(
        "INSERT INTO aa_sponsorship_spend (organization_id, chain_id, day, granted_wei) \
         VALUES ($1, $2, $3, $4::numeric) \
         ON CONFLICT (organization_id, chain_id, day) DO UPDATE \
           SET granted_wei = aa_sponsorship_spend.granted_wei + EXCLUDED.granted_wei, \
               updated_at = now() \
         RETURNING granted_wei::text",
    )
    .bind(organization_id)
    .bind(chain_id)
    .bind(day)
    .bind(wei)
    .fetch_one(db)
    .await?)
}

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

// ---- aa_bundler_control (migration 0080, the debug_bundler_* namespace) ----

/// The bundler controls of a chain: `(manual, send_now)`; `(false, false)` without a row
/// (automatic bundling).
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundler_control_get(
    db: impl PgExecutor<'_>,
    chain_id: i64,
) -> StoreResult<(bool, bool)> {
    let row: Option<(bool, bool)> =
        sqlx::query_as("SELECT manual, send_now FROM aa_bundler_control WHERE chain_id = $1")
            .bind(chain_id)
            .fetch_optional(db)
            .await?;
    Ok(row.unwrap_or((false, false)))
}

/// Sets the chain's bundling mode (`manual` true: bundles only on request); clears a
/// pending send-now request.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundler_control_set_manual(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    manual: bool,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO aa_bundler_control (chain_id, manual, send_now) VALUES ($1, $2, false)
         ON CONFLICT (chain_id) DO UPDATE SET manual = $2, send_now = false, updated_at = now()",
    )
    .bind(chain_id)
    .bind(manual)
    .execute(db)
    .await?;
    Ok(())
}

/// Raises (`true`) or clears (`false`) the chain's send-now request.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundler_control_send_now(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    raise: bool,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO aa_bundler_control (chain_id, send_now) VALUES ($1, $2)
         ON CONFLICT (chain_id) DO UPDATE SET send_now = $2, updated_at = now()",
    )
    .bind(chain_id)
    .bind(raise)
    .execute(db)
    .await?;
    Ok(())
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

// ---------------------------------------------------------------------------------------
// aa_reputation (migrations/0077_aa_reputation.sql): ERC-7562 opsSeen / opsIncluded per
// (chain, entity), decayed by floor(value * (23/24)^h) over the whole hours h since
// `decayed_at`, on every read and write.

/// One entity's decayed reputation counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct ReputationRow {
    /// `opsSeen` after decay.
    pub ops_seen: i64,
    /// `opsIncluded` after decay.
    pub ops_included: i64,
}

/// The decay expression of a column of `aa_reputation` (`r`), as of now.
macro_rules! decayed {
    ($col:literal) => {
        concat!(
            "floor(r.",
            $col,
            " * power(23.0 / 24.0, floor(extract(epoch FROM now() - r.decayed_at) / 3600)))::bigint"
        )
    };
}
/// The new `decayed_at` (advanced by the whole hours applied).
macro_rules! decayed_at {
    () => {
        "r.decayed_at + floor(extract(epoch FROM now() - r.decayed_at) / 3600) * interval '1 hour'"
    };
}

/// The decayed counters of `address` on `chain_id` (zeros when unknown).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_get<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address: &[u8],
) -> StoreResult<ReputationRow> {
    let row: Option<ReputationRow> = sqlx::query_as(concat!(
        "SELECT ",
        decayed!("ops_seen"),
        " AS ops_seen, ",
        decayed!("ops_included"),
        " AS ops_included FROM aa_reputation r WHERE r.chain_id = $1 AND r.address = $2"
    ))
    .bind(chain_id)
    .bind(address)
    .fetch_optional(db)
    .await
    .map_err(unreadable("aa_reputation"))?;
    Ok(row.unwrap_or(ReputationRow {
        ops_seen: 0,
        ops_included: 0,
    }))
}

/// Adds `seen` to `opsSeen` and `included` to `opsIncluded` of every address (after
/// decaying them).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_add<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    addresses: &[Vec<u8>],
    seen: i64,
    included: i64,
) -> StoreResult<()> {
    sqlx::query(concat!(
        "INSERT INTO aa_reputation AS r (chain_id, address, ops_seen, ops_included) ",
        "SELECT $1, a, $3, $4 FROM unnest($2::bytea[]) AS a ",
        "ON CONFLICT (chain_id, address) DO UPDATE SET ops_seen = ",
        decayed!("ops_seen"),
        " + $3, ops_included = ",
        decayed!("ops_included"),
        " + $4, decayed_at = ",
        decayed_at!(),
        ", updated_at = now()"
    ))
    .bind(chain_id)
    .bind(addresses)
    .bind(seen)
    .bind(included)
    .execute(db)
    .await?;
    Ok(())
}

/// Sets both counters of `address` (the ban penalty, an operator's `setReputation`);
/// the decay restarts now.
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_set<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address: &[u8],
    ops_seen: i64,
    ops_included: i64,
) -> StoreResult<()> {
    sqlx::query(concat!(
        "INSERT INTO aa_reputation (chain_id, address, ops_seen, ops_included) ",
        "VALUES ($1, $2, $3, $4) ON CONFLICT (chain_id, address) DO UPDATE SET ",
        "ops_seen = $3, ops_included = $4, decayed_at = now(), updated_at = now()"
    ))
    .bind(chain_id)
    .bind(address)
    .bind(ops_seen)
    .bind(ops_included)
    .execute(db)
    .await?;
    Ok(())
}

/// Moves `decayed_at` of `address` back by `hours` (tests of the decay).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_age<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address: &[u8],
    hours: i32,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE aa_reputation SET decayed_at = decayed_at - make_interval(hours => $3) \
         WHERE chain_id = $1 AND address = $2",
    )
    .bind(chain_id)
    .bind(address)
    .bind(hours)
    .execute(db)
    .await?;
    Ok(())
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

/// One entity of [`reputation_list`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReputationEntry {
    /// The entity's address.
    pub address: DbAddress,
    /// `opsSeen` after decay.
    pub ops_seen: i64,
    /// `opsIncluded` after decay.
    pub ops_included: i64,
}

/// Every entity of `chain_id` with its decayed counters, by address (at most 10,000).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_list<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
) -> StoreResult<Vec<ReputationEntry>> {
    sqlx::query_as(concat!(
        "SELECT r.address, ",
        decayed!("ops_seen"),
        " AS ops_seen, ",
        decayed!("ops_included"),
        " AS ops_included FROM aa_reputation r WHERE r.chain_id = $1 ORDER BY r.address LIMIT 10000"
    ))
    .bind(chain_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_reputation"))
}

/// Deletes every reputation row of `chain_id`; the rows deleted.
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_clear<'e>(db: impl PgExecutor<'e>, chain_id: i64) -> StoreResult<u64> {
    Ok(sqlx::query("DELETE FROM aa_reputation WHERE chain_id = $1")
        .bind(chain_id)
        .execute(db)
        .await?
        .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_store::testing::TestDatabase;

    /// Every stored state spelling decodes to its enum value; a state this build does
    /// not know, or a hash of the wrong length, makes the row an error (never a row
    /// with a default, never a skipped row).
    #[tokio::test]
    async fn rows_decode_at_the_row_and_an_unreadable_one_is_an_error() {
        let db = TestDatabase::create().await.unwrap();
        let pool = db.pool();
        for st in UserOpState::ALL {
            let back: UserOpState = sqlx::query_scalar("SELECT $1::text")
                .bind(st)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(back, st);
            assert_eq!(back, st.as_str());
        }
        for st in BundleState::ALL {
            let back: BundleState = sqlx::query_scalar("SELECT $1::text")
                .bind(st)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(back, st);
        }
        let hash = [7u8; 32];
        let json = serde_json::json!({});
        let row = NewUserOperation {
            chain_id: 1,
            user_op_hash: &hash,
            organization_id: None,
            sender: &[1u8; 20],
            nonce: "0",
            user_operation: &json,
            resolution: &json,
            instance_id: Uuid::new_v4(),
        };
        assert!(user_operation_insert(pool, &row).await.unwrap());
        let got = user_operation_get(pool, 1, &hash).await.unwrap().unwrap();
        assert_eq!(got.state, UserOpState::Accepted);
        assert_eq!(got.key(), (1, hash.as_slice()));
        // A newer schema's state (the CHECK of this one refuses it).
        sqlx::query("ALTER TABLE aa_user_operation DROP CONSTRAINT aa_user_operation_state_check")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("UPDATE aa_user_operation SET state = 'parked'")
            .execute(pool)
            .await
            .unwrap();
        assert!(matches!(
            user_operation_get(pool, 1, &hash).await,
            Err(StoreError::Decode)
        ));
        assert!(matches!(
            user_operations_open_of_sender(pool, 1, &[1u8; 20]).await,
            Ok(v) if v.is_empty()
        ));
        assert!(matches!(
            user_operation_by_hash(pool, &hash).await,
            Err(StoreError::Decode)
        ));
    }
}
