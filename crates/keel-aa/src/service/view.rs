//! Reads: an operation by hash ([`UserOperationView`]), its status
//! ([`UserOperationStatus`]) and the open deposit funding requests.

use super::*;

/// One user operation as the REST API shows it (`GET /v1/user-operations/{hash}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserOperationView {
    /// The v0.8 hash.
    pub user_op_hash: B256,
    /// The chain.
    pub chain_id: u64,
    /// Its workflow instance (the operation id `POST /v1/user-operations` answered).
    pub operation_id: Uuid,
    /// `accepted`, `ready`, `bundled`, `included`, `failed`, `nonce_used_elsewhere`.
    pub state: String,
    /// The account.
    pub sender: Address,
    /// The nonce, decimal.
    pub nonce: String,
    /// The resolved EntryPoint every step used.
    pub entry_point: Address,
    /// The bundle transaction (once included).
    pub transaction_hash: Option<B256>,
    /// Its block number.
    pub block_number: Option<u64>,
    /// Its block hash.
    pub block_hash: Option<B256>,
    /// Included: whether the execution call succeeded.
    pub success: Option<bool>,
    /// Included: wei paid, decimal.
    pub actual_gas_cost: Option<String>,
    /// Included: gas charged, decimal.
    pub actual_gas_used: Option<String>,
    /// Ended otherwise: ERC-7769 code.
    pub error_code: Option<i32>,
    /// Ended otherwise: `AAxx …` or a `SPONSOR_…` code.
    pub error_reason: Option<String>,
    /// Recorded at (RFC 3339).
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Last change (RFC 3339).
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

pub(super) fn b256(v: &Option<keel_units::db::DbHash>) -> Option<B256> {
    v.map(B256::from)
}

impl UserOperationView {
    fn from_row(row: &UserOperationRow) -> Result<Self, ReadError> {
        let resolution: Resolution =
            serde_json::from_value(row.resolution.clone()).map_err(|_| ReadError::Corrupt {
                table: "aa_user_operation",
                column: "resolution",
            })?;
        Ok(Self {
            user_op_hash: row.user_op_hash.0,
            chain_id: row.chain_id.0,
            operation_id: row.instance_id,
            state: row.state.as_str().to_owned(),
            sender: row.sender.0,
            nonce: row.nonce.clone(),
            entry_point: resolution.resolved.address(),
            transaction_hash: b256(&row.tx_hash),
            block_number: row.block_number.and_then(|n| u64::try_from(n).ok()),
            block_hash: b256(&row.block_hash),
            success: row.success,
            actual_gas_cost: row.actual_gas_cost.clone(),
            actual_gas_used: row.actual_gas_used.clone(),
            error_code: row.error_code,
            error_reason: row.error_reason.clone(),
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// The states `keel_getUserOperationStatus` answers (`docs/aa.md`, "Operation states").
pub mod status {
    /// No operation of this hash on this chain (or not the caller's).
    pub const UNKNOWN: &str = "unknown";
    /// Recorded; not validated yet.
    pub const ACCEPTED: &str = "accepted";
    /// Validated (and sponsored): waiting for a bundle.
    pub const READY: &str = "ready";
    /// In a bundle transaction that is not (or, after a reorg, no longer) in the chain.
    pub const BUNDLED: &str = "bundled";
    /// Its `UserOperationEvent` is in the chain, the block not final yet (a reorg may
    /// still move or remove it).
    pub const INCLUDED: &str = "included";
    /// Included and the block final for the chain: reported to the workflow.
    pub const FINAL: &str = "final";
    /// Refused (validation, policy, bundle simulation): `reason` says why.
    pub const FAILED: &str = "failed";
    /// Its nonce was used by an inclusion that is not this operation's.
    pub const NONCE_USED_ELSEWHERE: &str = "nonce_used_elsewhere";
}

/// The answer of `keel_getUserOperationStatus` (Keel's own method, after rundler's
/// `rundler_getUserOperationStatus`): where one user operation stands, with the
/// reason of a refusal and the bundle transaction it is (or last was) in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserOperationStatus {
    /// One of [`status`].
    pub status: String,
    /// The operation hash (absent for `unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_op_hash: Option<B256>,
    /// The resolved EntryPoint (absent for `unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry_point: Option<Address>,
    /// `failed` / `nonce_used_elsewhere`: the ERC-7769 code and reason; else `null`.
    pub reason: Option<StatusReason>,
    /// The bundle it is or last was in; `null` before its first bundle.
    pub bundle: Option<StatusBundle>,
    /// `included` / `final`: the transaction that includes it; else `null`.
    pub transaction_hash: Option<B256>,
    /// `included` / `final`: its block number (hex quantity); else `null`.
    pub block_number: Option<String>,
    /// `included` / `final`: its block hash; else `null`.
    pub block_hash: Option<B256>,
}

/// Why an operation ended without inclusion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReason {
    /// The ERC-7769 JSON-RPC code (-32500 ...).
    pub code: i32,
    /// `AAxx …`, a `SPONSOR_…` code or a Keel code (`NONCE_USED_ELSEWHERE`, ...).
    pub message: String,
}

/// The bundle an operation is (or last was) in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusBundle {
    /// Keel's bundle id (queue key `aa-bundle:<id>`).
    pub id: Uuid,
    /// `submitted`, `included` (not final yet), `final` (included, its block final),
    /// `reorged`, `failed` (`store::bundle_state`).
    pub state: String,
    /// The bundle transaction: the one its verdict names once settled, else the latest
    /// signed attempt (a fee bump changes it); `null` before it was signed.
    pub transaction_hash: Option<B256>,
}

impl UserOperationStatus {
    fn unknown() -> Self {
        Self {
            status: status::UNKNOWN.to_owned(),
            user_op_hash: None,
            entry_point: None,
            reason: None,
            bundle: None,
            transaction_hash: None,
            block_number: None,
            block_hash: None,
        }
    }
}

/// The status name of a row: its state, `final` for a final inclusion.
pub fn status_of(row: &UserOperationRow) -> &str {
    if row.state == store::state::INCLUDED && row.finalized_at.is_some() {
        status::FINAL
    } else {
        row.state.as_str()
    }
}

impl AaService {
    /// The operation `hash` (any chain), when it exists and `organization_id` may see it
    /// (`None`: any organization's; `Some`: operations submitted by that organization).
    ///
    /// # Errors
    /// [`ReadError`].
    pub async fn user_operation(
        &self,
        hash: B256,
        organization_id: Option<Uuid>,
    ) -> Result<Option<UserOperationView>, ReadError> {
        let row = store::user_operation_by_hash(&self.env.db, hash.as_slice()).await?;
        row.filter(|r| organization_id.is_none() || r.organization_id == organization_id)
            .as_ref()
            .map(UserOperationView::from_row)
            .transpose()
    }

    /// The status of operation `hash` on `chain_id` for `organization_id` (see
    /// [`UserOperationStatus`]; `unknown` when there is none or it is another
    /// organization's).
    ///
    /// # Errors
    /// [`ReadError`].
    pub async fn user_operation_status(
        &self,
        chain_id: u64,
        hash: B256,
        organization_id: Option<Uuid>,
    ) -> Result<UserOperationStatus, ReadError> {
        let row =
            store::user_operation_get(&self.env.db, flow::chain_id_i64(chain_id), hash.as_slice())
                .await?
                .filter(|r| organization_id.is_none() || r.organization_id == organization_id);
        let Some(row) = row else {
            return Ok(UserOperationStatus::unknown());
        };
        let entry_point = serde_json::from_value::<Resolution>(row.resolution.clone())
            .map(|r| Some(r.resolved.address()))
            .map_err(|_| ReadError::Corrupt {
                table: "aa_user_operation",
                column: "resolution",
            })?;
        let mut bundle = None;
        if let Some(id) = row.bundle_id
            && let Some(b) = store::bundle_get(&self.env.db, id).await?
        {
            let view = keel_txq::requests(&self.env.db, &[b.txq_request_id])
                .await
                .ok()
                .and_then(|v| v.into_iter().next());
            let verdict_hash = view.as_ref().and_then(|v| match &v.verdict {
                Some(
                    keel_txq::SettlementVerdict::Confirmed { hash, .. }
                    | keel_txq::SettlementVerdict::Reverted { hash, .. },
                ) => Some(*hash),
                _ => None,
            });
            let state = if b.state == store::bundle_state::INCLUDED && b.final_at.is_some() {
                status::FINAL.to_owned()
            } else {
                b.state.as_str().to_owned()
            };
            bundle = Some(StatusBundle {
                id: b.id,
                state,
                transaction_hash: verdict_hash.or(view.and_then(|v| v.last_hash)),
            });
        }
        let included = row.state == store::state::INCLUDED;
        let ended =
            row.state == store::state::FAILED || row.state == store::state::NONCE_USED_ELSEWHERE;
        Ok(UserOperationStatus {
            status: status_of(&row).to_owned(),
            user_op_hash: Some(hash),
            entry_point,
            reason: match (ended, row.error_code, &row.error_reason) {
                (true, Some(code), Some(message)) => Some(StatusReason {
                    code,
                    message: message.clone(),
                }),
                _ => None,
            },
            bundle,
            transaction_hash: b256(&row.tx_hash).filter(|_| included),
            block_number: row
                .block_number
                .and_then(|n| u64::try_from(n).ok())
                .filter(|_| included)
                .map(hex_u64),
            block_hash: b256(&row.block_hash).filter(|_| included),
        })
    }
}

/// An open funding request of a paymaster's EntryPoint deposit
/// ([`crate::runway`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepositRequestView {
    /// The chain.
    pub chain_id: u64,
    /// The resolved EntryPoint holding the deposit.
    pub entry_point: Address,
    /// The paymaster whose deposit it is.
    pub paymaster: Address,
    /// The deposit at the last check, wei (decimal).
    pub deposit_wei: String,
    /// The configured minimum, wei (decimal).
    pub minimum_wei: String,
    /// `minimum - deposit`, wei (decimal).
    pub required_wei: String,
    /// When it opened.
    pub opened_at: chrono::DateTime<chrono::Utc>,
    /// The last check.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl AaService {
    /// The open funding requests of paymaster deposits (of `chain_id` when given),
    /// oldest first.
    ///
    /// # Errors
    /// [`ReadError::Store`].
    pub async fn deposit_requests(
        &self,
        chain_id: Option<u64>,
    ) -> Result<Vec<DepositRequestView>, ReadError> {
        let rows =
            store::deposit_requests_open(&self.env.db, chain_id.map(flow::chain_id_i64)).await?;
        Ok(rows
            .into_iter()
            .map(|r| DepositRequestView {
                chain_id: r.chain_id.0,
                entry_point: r.entry_point.0,
                paymaster: r.paymaster.0,
                deposit_wei: r.deposit_wei,
                minimum_wei: r.minimum_wei,
                required_wei: r.required_wei,
                opened_at: r.opened_at,
                updated_at: r.updated_at,
            })
            .collect())
    }
}
