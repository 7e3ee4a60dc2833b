//! What the Platform API calls: [`AaService`] — acceptance with a synchronous
//! pre-check, reads of an operation by hash, and the bundler's JSON-RPC 2.0 methods
//! (ERC-7769) over them ([`AaService::rpc`]).
//!
//! ## JSON-RPC (`POST /v1/chains/{chain}/bundler`)
//!
//! | method | params | result |
//! |---|---|---|
//! | `eth_chainId` | — | the chain id, hex quantity |
//! | `eth_supportedEntryPoints` | — | `[resolved EntryPoint]` (never the configured reference) |
//!
//! Top-level addresses of results are EIP-55 checksummed.
//! | `eth_sendUserOperation` | `[userOperation, entryPoint]` | the operation hash; the resolved address only |
//! | `eth_getUserOperationByHash` | `[hash]` | `{userOperation, entryPoint, blockNumber, blockHash, transactionHash}` (block fields `null` while pending: accepted, ready, bundled) or `null` (unknown, or ended without inclusion: `failed`, `nonce_used_elsewhere` — it will never be included; see `keel_getUserOperationStatus` for why) |
//! | `eth_getUserOperationReceipt` | `[hash]` | `{userOpHash, entryPoint, sender, nonce, paymaster, actualGasCost, actualGasUsed, success, reason, logs, receipt}` or `null` (until included at the queue's depth; read from the chain, so `null` again while a reorg has its bundle out) |
//! | `keel_getUserOperationStatus` | `[hash]` | [`UserOperationStatus`]: `{status, userOpHash, entryPoint, reason, bundle, transactionHash, blockNumber, blockHash}`; `{status: "unknown"}` for an unknown hash (states: `docs/aa.md`, "Operation states") |
//! | `eth_estimateUserOperationGas` | `[userOperation, entryPoint]` (configured or resolved; gas fields and signature may be absent) | `{preVerificationGas, verificationGasLimit, callGasLimit, paymasterVerificationGasLimit, paymasterPostOpGasLimit}` (see [`crate::estimate`]) |
//! | `pm_getPaymasterStubData` (ERC-7677) | `[userOperation, entryPoint, chainId, context]` | `{paymaster, paymasterData, paymasterVerificationGasLimit, paymasterPostOpGasLimit, sponsor, isFinal: false}` |
//! | `pm_getPaymasterData` (ERC-7677) | `[userOperation, entryPoint, chainId, context]` | `{paymaster, paymasterData}`: signed by the sponsor key after the sponsorship policy |
//!
//! Errors (`error.code`): `-32700` parse error, `-32600` invalid request, `-32601` method
//! not found, `-32501` paymaster (no paymaster configured on the chain, or the
//! sponsorship policy refused: `data.reason` names the rule, `SPONSOR_…`), `-32602`
//! invalid params (a `chainId` that is not the route's, an unsupported EntryPoint, including the
//! configured reference named for submission: rebuild and re-sign against the resolved
//! EntryPoint), the EntryPoint's refusal in the pre-check with its ERC-7769 code
//! (`-32500`, `-32501`, `-32503`, `-32507`, `-32508`; `data.reason` holds the `AAxx`
//! reason), a validation rule's refusal (`-32502` ERC-7562 rule, `-32504` reputation,
//! `-32505` a stake below the minimum; the message in the reference bundler's phrasing
//! with the rule, e.g. `account uses banned opcode: TIMESTAMP (OP-011)`, `data.reason`,
//! `data.rule` and `data.entity`), `-32603` internal error (retryable: the chain or the database did not
//! answer). Messages are value-free.
//!
//! `eth_sendUserOperation` first applies the admission checks of [`crate::admission`]
//! against the latest block (fee floors, `preVerificationGas`, the bundle fit, one open
//! operation per sender, the ERC-7562 replacement rule; `-32602` or `-32505` with
//! `data.field` and `data.reason`, the message naming the field), then pre-checks the
//! operation with the same `handleOps` simulation the workflow journals (so a refusal is
//! answered at once, before anything is recorded), then starts or joins its workflow: a
//! resend answers the same hash. An accepted replacement ends the operation it replaces
//! `replaced` and tells its workflow once.

use crate::admission::{self, ChainView, Refusal};
use crate::flow::{self, AaEnv, SubmitError, Submitted};
use crate::store::{self, UserOperationRow};
use crate::{Erc7769Code, Resolution, UserOperation, resolve_entry_point, user_operation_receipt};
use alloy::primitives::{Address, B256};
use keel_durable::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use uuid::Uuid;

/// The account-abstraction service of the API.
#[derive(Clone)]
pub struct AaService {
    env: Arc<AaEnv>,
    engine: Engine,
    debug_namespace: bool,
}

impl std::fmt::Debug for AaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AaService").finish_non_exhaustive()
    }
}

/// What [`AaService`]'s sender rule found (see `sender_rule`).
struct SenderCheck {
    /// The open operation a replacement supersedes.
    replaces: Option<UserOperationRow>,
    /// An open operation of the sender holds the nonce just below (same key).
    predecessor: bool,
}

/// Why [`AaService::send`] refused, beyond [`SubmitError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Acceptance refused (see [`SubmitError`]).
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The EntryPoint refused the operation in the pre-check.
    #[error("the EntryPoint refused the user operation")]
    Rejected {
        /// The ERC-7769 code.
        code: Erc7769Code,
        /// The `AAxx` reason.
        reason: String,
        /// The revert data of the account, factory or paymaster
        /// (`FailedOpWithRevert.inner`), when the EntryPoint passed it on.
        revert: Option<alloy::primitives::Bytes>,
    },
    /// Keel's validation rules refused the operation (an ERC-7562 rule broken in the
    /// traced validation, or an entity's reputation), not the EntryPoint.
    #[error("the user operation breaks a validation rule")]
    Violation {
        /// The ERC-7769 code (-32502, -32504 or -32505).
        code: Erc7769Code,
        /// Keel's reason (`OP-011 account TIMESTAMP`).
        reason: String,
        /// The rule and entity, and the client-facing message
        /// (`account uses banned opcode: TIMESTAMP (OP-011)`).
        breach: crate::validation::Breach,
    },
    /// Admission refused the operation before simulating it ([`crate::admission`]):
    /// a fee floor, `preVerificationGas`, the bundle fit, one operation per sender, the
    /// replacement rule. Names the field.
    #[error("the user operation was refused at admission")]
    Refused(#[source] Refusal),
    /// The chain did not answer the pre-check; retry.
    #[error("the chain did not answer")]
    Unavailable,
    /// The database did not answer; retry.
    #[error("the database did not answer")]
    Store(#[source] keel_store::StoreError),
}

impl SendError {
    /// The JSON-RPC `error.code` (ERC-7769, or -32603 for a retryable failure).
    pub fn code(&self) -> i32 {
        match self {
            Self::Submit(e) => e.erc7769().map_or(-32603, Erc7769Code::code),
            Self::Rejected { code, .. } | Self::Violation { code, .. } => code.code(),
            Self::Refused(r) => r.code.code(),
            Self::Unavailable | Self::Store(_) => -32603,
        }
    }

    /// True when the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Submit(e) => e.is_retryable(),
            Self::Rejected { .. } | Self::Violation { .. } | Self::Refused(_) => false,
            Self::Unavailable | Self::Store(_) => true,
        }
    }
}

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

fn b256(v: &Option<keel_units::db::DbHash>) -> Option<B256> {
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

/// A failed read (value-free).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The database failed.
    #[error("database")]
    Store(#[from] keel_store::StoreError),
    /// The chain failed.
    #[error("chain access")]
    Chain(#[from] keel_chain::ChainError),
    /// A stored row holds a value that does not decode (the table and column named,
    /// never the value).
    #[error("a stored {table} row is unreadable ({column})")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
}

fn rpc_error(id: &Value, code: i32, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let Some(d) = data {
        error["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC call's failure.
pub(crate) struct CallError {
    pub(crate) code: i32,
    pub(crate) message: std::borrow::Cow<'static, str>,
    pub(crate) data: Option<Value>,
}

impl CallError {
    pub(crate) fn invalid_params(message: &'static str) -> Self {
        Self {
            code: -32602,
            message: message.into(),
            data: None,
        }
    }

    /// `-32602` naming the field of the user operation at fault (`data.field`).
    pub(crate) fn malformed(e: &crate::MalformedField) -> Self {
        Self {
            code: -32602,
            message: e.to_string().into(),
            data: Some(json!({ "field": e.field })),
        }
    }

    pub(crate) fn internal() -> Self {
        Self {
            code: -32603,
            message: "internal error; retry".into(),
            data: None,
        }
    }
}

impl From<SendError> for CallError {
    fn from(e: SendError) -> Self {
        let code = e.code();
        match e {
            SendError::Rejected { reason, revert, .. } => {
                let inner = revert
                    .as_ref()
                    .and_then(|b| crate::rejection::revert_reason_text(b));
                let message = match &inner {
                    Some(text) => format!("user operation rejected by the EntryPoint: {reason}: {text}"),
                    None => format!("user operation rejected by the EntryPoint: {reason}"),
                };
                let mut data = json!({ "reason": reason });
                if let Some(r) = revert {
                    data["revertData"] = json!(r);
                }
                Self {
                    code,
                    message: message.into(),
                    data: Some(data),
                }
            }
            SendError::Violation { reason, breach, .. } => Self {
                code,
                message: breach.message.into(),
                data: Some(json!({
                    "reason": reason,
                    "rule": breach.rule,
                    "entity": breach.entity.as_str(),
                })),
            },
            SendError::Refused(r) => Self {
                code,
                message: r.message().into(),
                data: Some(json!({ "field": r.field, "reason": r.reason })),
            },
            SendError::Submit(SubmitError::ReferenceAddress) => Self {
                code,
                message: "the EntryPoint named is the configured reference; rebuild and re-sign the user operation against the resolved EntryPoint (eth_supportedEntryPoints)".into(),
                data: None,
            },
            SendError::Submit(SubmitError::UnsupportedEntryPoint) => Self {
                code,
                message: "unsupported EntryPoint (see eth_supportedEntryPoints)".into(),
                data: None,
            },
            SendError::Submit(SubmitError::Malformed(e)) => Self {
                code,
                message: format!("malformed user operation: {e}").into(),
                data: None,
            },
            SendError::Submit(SubmitError::ChainNotServed(_)) => Self {
                code,
                message: "chain not served".into(),
                data: None,
            },
            _ => Self::internal(),
        }
    }
}

/// The latest block's base fee and gas limit ([`ChainView`]).
///
/// # Errors
/// The chain access error.
pub async fn chain_view(
    pool: &keel_chain::UpstreamPool,
) -> Result<ChainView, keel_chain::ChainError> {
    let latest = alloy::rpc::types::BlockNumberOrTag::Latest;
    let base_fee = pool
        .header(latest)
        .await?
        .and_then(|h| h.base_fee_per_gas)
        .map_or(0, |fee| {
            u128::try_from(fee.wei_per_gas).unwrap_or(u128::MAX)
        });
    let block_gas_limit = pool.block_gas_limit(latest).await?;
    Ok(ChainView {
        base_fee_per_gas: base_fee,
        block_gas_limit,
    })
}

fn hash_param(params: &Value) -> Result<B256, CallError> {
    params
        .get(0)
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<B256>().ok())
        .ok_or_else(|| {
            CallError::invalid_params(
                "Missing/invalid userOpHash: expected [userOpHash], a 0x-prefixed 32-byte hash",
            )
        })
}

fn hex_u64(n: u64) -> String {
    format!("{n:#x}")
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
    /// The service over `env`, starting workflows on `engine`.
    pub fn new(env: Arc<AaEnv>, engine: Engine) -> Self {
        Self {
            env,
            engine,
            debug_namespace: false,
        }
    }

    /// The same service answering the `debug_bundler_*` methods ([`crate::debug`]) when
    /// `on` (configuration `aa.debugMethods`; off by default: they let a client change
    /// the bundling mode and drop operations).
    #[must_use]
    pub fn with_debug_namespace(mut self, on: bool) -> Self {
        self.debug_namespace = on;
        self
    }

    /// The served chain ids.
    pub fn chain_ids(&self) -> Vec<u64> {
        self.env.served_chain_ids()
    }

    /// Pre-checks `op` ([`crate::validation::validate`]: the ERC-7562 traced `handleOps`
    /// simulation on the resolved EntryPoint, or the plain one in unsafe mode, and the
    /// entities' reputation) and accepts
    /// it ([`flow::submit`], over the same resolution). A resend of an accepted operation is not simulated again
    /// (its nonce may be used by its own inclusion): it answers the same hash.
    ///
    /// # Errors
    /// [`SendError`].
    pub async fn send(
        &self,
        chain_id: u64,
        entry_point: Address,
        op: UserOperation,
        organization_id: Option<Uuid>,
    ) -> Result<Submitted, SendError> {
        let chain = self
            .env
            .chain(chain_id)
            .ok_or(SubmitError::ChainNotServed(chain_id))?;
        let resolution = resolve_entry_point(&chain.pool, chain.directory)
            .await
            .map_err(|e| {
                if e.is_retryable() {
                    SubmitError::Unavailable(e)
                } else {
                    SubmitError::Misconfigured(e)
                }
            })?;
        let mut replaces = None;
        if resolution.accepts_for_submission(entry_point) {
            let hash = op
                .hash_v08(&resolution.resolved)
                .map_err(SubmitError::Malformed)?;
            let known = store::user_operation_get(
                &self.env.db,
                flow::chain_id_i64(chain_id),
                hash.as_slice(),
            )
            .await
            .map_err(SubmitError::Store)?
            .is_some();
            if !known {
                let packed = op.pack().map_err(SubmitError::Malformed)?;
                let view = chain_view(&chain.pool)
                    .await
                    .map_err(|_| SendError::Unavailable)?;
                admission::check_fields(&op, &packed, view, &chain.admission)
                    .map_err(SendError::Refused)?;
                crate::eip7702::check(&op, chain_id).map_err(SendError::Refused)?;
                let sender = self
                    .sender_rule(chain_id, &op, hash, chain, &resolution.resolved)
                    .await?;
                replaces = sender.replaces;
                self.paymaster_deposit_rule(
                    chain_id,
                    chain,
                    &resolution.resolved,
                    &op,
                    replaces.as_ref(),
                )
                .await?;
                match crate::validation::validate(
                    &self.env.db,
                    chain,
                    &resolution.resolved,
                    &op,
                    &packed,
                    crate::validation::Admission::Check,
                )
                .await
                {
                    Ok(None) => {}
                    // Back to back (issue 33 §5): the sender's operation at the nonce
                    // below is still open, so this one cannot validate against the
                    // latest block yet (AA25, or AA20 when that one creates the
                    // account). Accepted; its workflow validates it once that lands.
                    Ok(Some(r)) if sender.predecessor && flow::waits_for_predecessor(&r.reason) => {
                    }
                    Ok(Some(r)) => {
                        return Err(match r.breach {
                            Some(breach) => SendError::Violation {
                                code: r.code,
                                reason: r.reason,
                                breach,
                            },
                            None => SendError::Rejected {
                                code: r.code,
                                reason: r.reason,
                                revert: r.revert,
                            },
                        });
                    }
                    Err(_) => return Err(SendError::Unavailable),
                }
            }
        }
        let submitted = flow::submit_resolved(
            &self.env,
            &self.engine,
            chain_id,
            entry_point,
            op,
            organization_id,
            &resolution,
        )
        .await?;
        if let Some(old) = replaces
            && submitted.created
        {
            self.supersede(&old).await?;
        }
        Ok(submitted)
    }

    /// The sender rules of acceptance (ERC-7562): a same-nonce operation open and not
    /// bundled is replaced (when the fees rise enough); an unstaked sender has at most
    /// [`crate::admission::AdmissionConfig::same_sender_mempool_count`] open operations
    /// (UREP-010; a staked one is not bounded). Also says whether the operation at the
    /// nonce just below (same key) is open: a back-to-back operation waits for it.
    ///
    /// # Errors
    /// [`SendError::Refused`] (`SENDER_OPERATION_PENDING`, `REPLACEMENT_IN_FLIGHT`,
    /// `REPLACEMENT_UNDERPRICED`), [`SendError::Store`], [`SendError::Unavailable`] (the
    /// stake could not be read).
    async fn sender_rule(
        &self,
        chain_id: u64,
        op: &UserOperation,
        hash: B256,
        chain: &flow::AaChain,
        ep: &crate::ResolvedEntryPoint,
    ) -> Result<SenderCheck, SendError> {
        let open = store::user_operations_open_of_sender(
            &self.env.db,
            flow::chain_id_i64(chain_id),
            op.sender.as_slice(),
        )
        .await
        .map_err(SendError::Store)?;
        let mut check = SenderCheck {
            replaces: None,
            predecessor: false,
        };
        let mut others = 0usize;
        for row in open {
            if row.user_op_hash.0 == hash {
                continue;
            }
            let Ok(other) = serde_json::from_value::<UserOperation>(row.user_operation.clone())
            else {
                others += 1;
                continue;
            };
            if other.nonce != op.nonce {
                check.predecessor |= flow::is_predecessor_nonce(other.nonce, op.nonce);
                others += 1;
                continue;
            }
            if row.state == store::state::BUNDLED {
                return Err(SendError::Refused(admission::replacement_in_flight()));
            }
            admission::check_replacement(&other, op, chain.admission.replacement_increase_percent)
                .map_err(SendError::Refused)?;
            check.replaces = Some(row);
        }
        if others >= chain.admission.same_sender_mempool_count
            && !crate::validation::is_staked(&chain.pool, ep.address(), op.sender)
                .await
                .map_err(|_| SendError::Unavailable)?
        {
            return Err(SendError::Refused(admission::sender_pending()));
        }
        Ok(check)
    }

    /// ERC-7562 EREP-010: the paymaster's EntryPoint deposit covers the maximum cost of
    /// its open operations (but the one `replaces` supersedes) and `op`'s
    /// ([`admission::check_paymaster_deposit`]). Nothing to check without a paymaster.
    ///
    /// # Errors
    /// [`SendError::Refused`] (`PAYMASTER_DEPOSIT_TOO_LOW`, -32508), [`SendError::Store`],
    /// [`SendError::Unavailable`] (the deposit could not be read).
    async fn paymaster_deposit_rule(
        &self,
        chain_id: u64,
        chain: &flow::AaChain,
        ep: &crate::ResolvedEntryPoint,
        op: &UserOperation,
        replaces: Option<&UserOperationRow>,
    ) -> Result<(), SendError> {
        let Some(paymaster) = op.paymaster else {
            return Ok(());
        };
        let rows = store::user_operations_open_with_paymaster(
            &self.env.db,
            flow::chain_id_i64(chain_id),
            &format!("{paymaster:#x}"),
        )
        .await
        .map_err(SendError::Store)?;
        let open: Vec<UserOperation> = rows
            .into_iter()
            .filter(|(hash, _)| replaces.is_none_or(|r| &r.user_op_hash != hash))
            .filter_map(|(_, json)| serde_json::from_value(json).ok())
            .collect();
        let deposit = crate::bundler::entry_point_deposit(&chain.pool, ep, paymaster)
            .await
            .map_err(|_| SendError::Unavailable)?;
        admission::check_paymaster_deposit(op, &open, deposit).map_err(SendError::Refused)
    }

    /// Ends `old` as `replaced` (when it is still not bundled) and tells its workflow,
    /// in one transaction, once (the signal is deduplicated).
    async fn supersede(&self, old: &UserOperationRow) -> Result<(), SendError> {
        let db = |e: sqlx::Error| SendError::Store(e.into());
        let code = Erc7769Code::InvalidParams.code();
        let mut tx = self.env.db.begin().await.map_err(db)?;
        let (chain_id, old_hash) = old.key();
        if !store::user_operation_replace(&mut *tx, chain_id, old_hash, code)
            .await
            .map_err(SendError::Store)?
        {
            // Bundled meanwhile: it stays in flight; the replacement waits behind it
            // (the bundler never bundles a sender in flight) and fails AA25 once the
            // nonce is used.
            tracing::info!(target: "keel::aa", "replaced user operation was bundled meanwhile; it stays in flight");
            return Ok(());
        }
        let outcome = flow::OutcomeSignal::ended(store::state::REPLACED, code, "REPLACED");
        let payload = serde_json::to_value(&outcome)
            .map_err(|_| SendError::Store(keel_store::StoreError::Decode))?;
        match self
            .engine
            .signal_in_as(
                &mut tx,
                old.instance_id,
                flow::OUTCOME_SIGNAL,
                "replaced",
                &payload,
                &keel_durable::Actor::system(crate::bundler::BUNDLER_ACTOR),
            )
            .await
        {
            Ok(_)
            | Err(
                keel_durable::DurableError::InstanceEnded { .. }
                | keel_durable::DurableError::InstanceNotFound(_),
            ) => {}
            Err(e) => return Err(SendError::Submit(SubmitError::Engine(e))),
        }
        tx.commit().await.map_err(db)?;
        Ok(())
    }

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
            .ok()
            .map(|r| r.resolved.address());
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

    /// Answers one JSON-RPC 2.0 request body (a single request or a batch) for `chain_id`
    /// on behalf of `organization_id` (see the module docs). Always a JSON-RPC response
    /// value; never fails.
    pub async fn rpc(&self, chain_id: u64, organization_id: Option<Uuid>, body: &[u8]) -> Value {
        let Ok(request) = serde_json::from_slice::<Value>(body) else {
            return rpc_error(&Value::Null, -32700, "parse error", None);
        };
        match request {
            Value::Array(calls) if !calls.is_empty() && calls.len() <= 32 => {
                let mut out = Vec::with_capacity(calls.len());
                for call in calls {
                    out.push(self.call(chain_id, organization_id, call).await);
                }
                Value::Array(out)
            }
            Value::Array(_) => rpc_error(
                &Value::Null,
                -32600,
                "invalid request: a batch holds 1 to 32 calls",
                None,
            ),
            call => self.call(chain_id, organization_id, call).await,
        }
    }

    async fn call(&self, chain_id: u64, organization_id: Option<Uuid>, call: Value) -> Value {
        let id = call.get("id").cloned().unwrap_or(Value::Null);
        let (Some("2.0"), Some(method)) = (
            call.get("jsonrpc").and_then(Value::as_str),
            call.get("method").and_then(Value::as_str),
        ) else {
            return rpc_error(&id, -32600, "invalid request", None);
        };
        let params = call.get("params").cloned().unwrap_or(Value::Array(vec![]));
        match self
            .dispatch(chain_id, organization_id, method, &params)
            .await
        {
            Ok(result) => rpc_result(&id, result),
            Err(e) => rpc_error(&id, e.code, &e.message, e.data),
        }
    }

    async fn dispatch(
        &self,
        chain_id: u64,
        organization_id: Option<Uuid>,
        method: &str,
        params: &Value,
    ) -> Result<Value, CallError> {
        let chain = self.env.chain(chain_id).ok_or(CallError {
            code: -32602,
            message: "chain not served".into(),
            data: None,
        })?;
        match method {
            "eth_chainId" => Ok(json!(hex_u64(chain_id))),
            "eth_supportedEntryPoints" => {
                let r = resolve_entry_point(&chain.pool, chain.directory)
                    .await
                    .map_err(|_| CallError::internal())?;
                Ok(json!([r.resolved.address().to_checksum(None)]))
            }
            "eth_sendUserOperation" => {
                let op: UserOperation = match params.get(0) {
                    Some(v) => {
                        crate::parse_user_operation(v).map_err(|e| CallError::malformed(&e))?
                    }
                    None => {
                        return Err(CallError::invalid_params(
                            "expected [userOperation, entryPoint]",
                        ));
                    }
                };
                let ep: Address = params
                    .get(1)
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| {
                        CallError::invalid_params("expected [userOperation, entryPoint]")
                    })?;
                let s = self.send(chain_id, ep, op, organization_id).await?;
                Ok(json!(s.user_op_hash))
            }
            "eth_getUserOperationByHash" => {
                let hash = hash_param(params)?;
                let Some(row) = self.row(chain_id, hash, organization_id).await? else {
                    return Ok(Value::Null);
                };
                if row.state == store::state::FAILED
                    || row.state == store::state::NONCE_USED_ELSEWHERE
                {
                    // Ended without inclusion: neither pending nor included, ever.
                    return Ok(Value::Null);
                }
                let resolution: Resolution = serde_json::from_value(row.resolution.clone())
                    .map_err(|_| CallError::internal())?;
                Ok(json!({
                    "userOperation": row.user_operation,
                    "entryPoint": resolution.resolved.address().to_checksum(None),
                    "blockNumber": row.block_number.and_then(|n| u64::try_from(n).ok()).map(hex_u64),
                    "blockHash": b256(&row.block_hash),
                    "transactionHash": b256(&row.tx_hash),
                }))
            }
            "eth_getUserOperationReceipt" => {
                let hash = hash_param(params)?;
                let Some(row) = self.row(chain_id, hash, organization_id).await? else {
                    return Ok(Value::Null);
                };
                let Some(tx) = b256(&row.tx_hash).filter(|_| row.state == store::state::INCLUDED)
                else {
                    return Ok(Value::Null);
                };
                let resolution: Resolution = serde_json::from_value(row.resolution.clone())
                    .map_err(|_| CallError::internal())?;
                let receipts = chain
                    .pool
                    .receipts(&[tx])
                    .await
                    .map_err(|_| CallError::internal())?;
                // The chain's answer: a reorg may have the bundle out right now (the
                // bundler then moves the row back to `bundled`).
                let Some(Some(receipt)) = receipts.into_iter().next() else {
                    return Ok(Value::Null);
                };
                let Some(r) = user_operation_receipt(&receipt, &resolution.resolved, hash) else {
                    return Ok(Value::Null);
                };
                Ok(json!({
                    "userOpHash": hash,
                    "entryPoint": r.entry_point.to_checksum(None),
                    "sender": r.sender.to_checksum(None),
                    "nonce": format!("{:#x}", r.nonce),
                    "paymaster": r.paymaster.to_checksum(None),
                    "actualGasCost": format!("{:#x}", r.actual_gas_cost.get()),
                    "actualGasUsed": format!("{:#x}", r.actual_gas_used),
                    "success": r.success,
                    "reason": r.revert_reason.map(|b| b.to_string()).unwrap_or_default(),
                    "logs": r.logs,
                    "receipt": receipt,
                }))
            }
            "keel_getUserOperationStatus" => {
                let hash = hash_param(params)?;
                let st = self
                    .user_operation_status(chain_id, hash, organization_id)
                    .await
                    .map_err(|_| CallError::internal())?;
                serde_json::to_value(st).map_err(|_| CallError::internal())
            }
            "eth_estimateUserOperationGas" => crate::estimate::estimate_rpc(chain, params).await,
            "pm_getPaymasterStubData" => {
                crate::estimate::paymaster_stub_rpc(chain, chain_id, params).await
            }
            "pm_getPaymasterData" => {
                crate::estimate::paymaster_data_rpc(
                    &self.env,
                    chain,
                    chain_id,
                    organization_id,
                    params,
                )
                .await
            }
            m if m.starts_with("debug_bundler_") => {
                // Bundling mode and mempool ([`crate::debug`], `aa.debugMethods` through
                // `with_debug_namespace`); reputation and stake ([`crate::validation::debug`]).
                let handled = if self.debug_namespace {
                    crate::debug::dispatch(&self.env, &self.engine, chain, chain_id, m, params)
                        .await
                } else {
                    None
                };
                match handled {
                    Some(answer) => answer,
                    None => crate::validation::debug::rpc(&self.env.db, chain, m, params).await,
                }
            }
            _ => Err(CallError {
                code: -32601,
                message: "method not found".into(),
                data: None,
            }),
        }
    }

    async fn row(
        &self,
        chain_id: u64,
        hash: B256,
        organization_id: Option<Uuid>,
    ) -> Result<Option<UserOperationRow>, CallError> {
        let row =
            store::user_operation_get(&self.env.db, flow::chain_id_i64(chain_id), hash.as_slice())
                .await
                .map_err(|_| CallError::internal())?;
        Ok(row.filter(|r| organization_id.is_none() || r.organization_id == organization_id))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Breach, rules::Entity};

    /// A rule violation is answered with the reference bundler's phrasing and the rule,
    /// not as the EntryPoint's refusal; Keel's reason, rule and entity are in `data`.
    #[test]
    fn a_rule_violation_is_not_called_the_entry_point_s_refusal() {
        let e = CallError::from(SendError::Violation {
            code: Erc7769Code::BannedOpcode,
            reason: "OP-011 account TIMESTAMP".to_owned(),
            breach: Breach {
                rule: "OP-011",
                entity: Entity::Account,
                message: "account uses banned opcode: TIMESTAMP (OP-011)".to_owned(),
            },
        });
        assert_eq!(e.code, -32502);
        assert_eq!(e.message, "account uses banned opcode: TIMESTAMP (OP-011)");
        assert_eq!(
            e.data,
            Some(
                json!({"reason": "OP-011 account TIMESTAMP", "rule": "OP-011", "entity": "account"})
            )
        );
        let r = CallError::from(SendError::Rejected {
            code: Erc7769Code::RejectedByEntryPoint,
            reason: "AA25 invalid account nonce".to_owned(),
            revert: None,
        });
        assert_eq!(
            r.message,
            "user operation rejected by the EntryPoint: AA25 invalid account nonce"
        );
    }
}
