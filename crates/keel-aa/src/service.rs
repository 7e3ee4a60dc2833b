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
//! | `eth_getUserOperationByHash` | `[hash]` | `{userOperation, entryPoint, blockNumber, blockHash, transactionHash}` or `null` |
//! | `eth_getUserOperationReceipt` | `[hash]` | `{userOpHash, entryPoint, sender, nonce, paymaster, actualGasCost, actualGasUsed, success, reason, logs, receipt}` or `null` (until included at the queue's depth) |
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
//! reason), `-32603` internal error (retryable: the chain or the database did not
//! answer). Messages are value-free.
//!
//! `eth_sendUserOperation` pre-checks the operation with the same `handleOps` simulation
//! the workflow journals (so a refusal is answered at once, before anything is
//! recorded), then starts or joins its workflow: a resend answers the same hash.

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
}

impl std::fmt::Debug for AaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AaService").finish_non_exhaustive()
    }
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
    },
    /// The chain did not answer the pre-check; retry.
    #[error("the chain did not answer")]
    Unavailable,
}

impl SendError {
    /// The JSON-RPC `error.code` (ERC-7769, or -32603 for a retryable failure).
    pub fn code(&self) -> i32 {
        match self {
            Self::Submit(e) => e.erc7769().map_or(-32603, Erc7769Code::code),
            Self::Rejected { code, .. } => code.code(),
            Self::Unavailable => -32603,
        }
    }

    /// True when the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Submit(e) => e.is_retryable(),
            Self::Rejected { .. } => false,
            Self::Unavailable => true,
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

fn b256(v: &Option<Vec<u8>>) -> Option<B256> {
    v.as_deref().and_then(|b| B256::try_from(b).ok())
}

impl UserOperationView {
    fn from_row(row: &UserOperationRow) -> Option<Self> {
        let resolution: Resolution = serde_json::from_value(row.resolution.clone()).ok()?;
        Some(Self {
            user_op_hash: B256::try_from(row.user_op_hash.as_slice()).ok()?,
            chain_id: u64::try_from(row.chain_id).ok()?,
            operation_id: row.instance_id,
            state: row.state.clone(),
            sender: Address::try_from(row.sender.as_slice()).ok()?,
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
    pub(crate) message: &'static str,
    pub(crate) data: Option<Value>,
}

impl CallError {
    pub(crate) fn invalid_params(message: &'static str) -> Self {
        Self {
            code: -32602,
            message,
            data: None,
        }
    }

    pub(crate) fn internal() -> Self {
        Self {
            code: -32603,
            message: "internal error; retry",
            data: None,
        }
    }
}

impl From<SendError> for CallError {
    fn from(e: SendError) -> Self {
        let code = e.code();
        match e {
            SendError::Rejected { reason, .. } => Self {
                code,
                message: "user operation rejected by the EntryPoint",
                data: Some(json!({ "reason": reason })),
            },
            SendError::Submit(SubmitError::ReferenceAddress) => Self {
                code,
                message: "the EntryPoint named is the configured reference; rebuild and re-sign the user operation against the resolved EntryPoint (eth_supportedEntryPoints)",
                data: None,
            },
            SendError::Submit(SubmitError::UnsupportedEntryPoint) => Self {
                code,
                message: "unsupported EntryPoint (see eth_supportedEntryPoints)",
                data: None,
            },
            SendError::Submit(SubmitError::Malformed(_)) => Self {
                code,
                message: "malformed user operation",
                data: None,
            },
            SendError::Submit(SubmitError::ChainNotServed(_)) => Self {
                code,
                message: "chain not served",
                data: None,
            },
            _ => Self::internal(),
        }
    }
}

fn hash_param(params: &Value) -> Result<B256, CallError> {
    params
        .get(0)
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<B256>().ok())
        .ok_or_else(|| CallError::invalid_params("expected [userOpHash]"))
}

fn hex_u64(n: u64) -> String {
    format!("{n:#x}")
}

impl AaService {
    /// The service over `env`, starting workflows on `engine`.
    pub fn new(env: Arc<AaEnv>, engine: Engine) -> Self {
        Self { env, engine }
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
                    Ok(Some(r)) => {
                        return Err(SendError::Rejected {
                            code: r.code,
                            reason: r.reason,
                        });
                    }
                    Err(_) => return Err(SendError::Unavailable),
                }
            }
        }
        Ok(flow::submit_resolved(
            &self.env,
            &self.engine,
            chain_id,
            entry_point,
            op,
            organization_id,
            &resolution,
        )
        .await?)
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
        Ok(row
            .filter(|r| organization_id.is_none() || r.organization_id == organization_id)
            .as_ref()
            .and_then(UserOperationView::from_row))
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
            Err(e) => rpc_error(&id, e.code, e.message, e.data),
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
            message: "chain not served",
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
                let op: UserOperation = params
                    .get(0)
                    .cloned()
                    .and_then(|v| serde_json::from_value(v).ok())
                    .ok_or_else(|| CallError::invalid_params("malformed user operation"))?;
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
                let Some(Some(receipt)) = receipts.into_iter().next() else {
                    return Err(CallError::internal());
                };
                let Some(r) = user_operation_receipt(&receipt, &resolution.resolved, hash) else {
                    return Err(CallError::internal());
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
                crate::validation::debug::rpc(&self.env.db, chain, m, params).await
            }
            _ => Err(CallError {
                code: -32601,
                message: "method not found",
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
            .filter_map(|r| {
                Some(DepositRequestView {
                    chain_id: u64::try_from(r.chain_id).ok()?,
                    entry_point: Address::try_from(r.entry_point.as_slice()).ok()?,
                    paymaster: Address::try_from(r.paymaster.as_slice()).ok()?,
                    deposit_wei: r.deposit_wei,
                    minimum_wei: r.minimum_wei,
                    required_wei: r.required_wei,
                    opened_at: r.opened_at,
                    updated_at: r.updated_at,
                })
            })
            .collect())
    }
}
