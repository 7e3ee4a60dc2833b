//! ERC-4337 user operations (issue 20) over [`keel_aa::service::AaService`]: the
//! bundler's JSON-RPC 2.0 route (ERC-7769) and the REST routes for integrators who prefer
//! them. Both take the same durable path (`aa.user-operation`, keyed by the operation's
//! hash: a resend answers the same hash and never a second inclusion). Without the
//! service configured ([`crate::ApiState::with_user_operations`]) every route answers
//! `404 NOT_FOUND`.
//!
//! - `POST /v1/chains/{chain}/bundler` (`operate`): a JSON-RPC request or batch; the
//!   answer is always HTTP 200 with JSON-RPC results or errors (ERC-7769 codes, see
//!   [`keel_aa::service`]). A body that is not JSON is the JSON-RPC parse error `-32700`.
//! - `POST /v1/user-operations` (`operate`): `{chainId, entryPoint, userOperation}` →
//!   `202` `{userOpHash, operationId, created}`. The operation hash is its idempotency
//!   key (no `Idempotency-Key` header). Refusals: `422 USER_OPERATION_REJECTED` (the
//!   EntryPoint's pre-check; `detail` holds the ERC-7769 code and the `AAxx` reason),
//!   `422 ENTRY_POINT_NOT_RESOLVED` (the configured reference, or another address, was
//!   named: rebuild and re-sign against the resolved EntryPoint), `422
//!   CHAIN_NOT_CONFIGURED`, `400 INVALID_FIELD`, `503 SERVICE_UNAVAILABLE` (retry).
//! - `GET /v1/user-operations/{hash}` (`read`): state, bundle transaction, receipt
//!   fields or the refusal; operations of other organizations answer `404`.

use crate::ApiState;
use crate::extract::{Authed, JsonBody, MAX_JSON_DEPTH, RawBody, json_too_deep};
use crate::problem::Problem;
use axum::Json;
use axum::extract::{RawPathParams, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_aa::service::{AaService, SendError, UserOperationView};
use keel_aa::{UserOperation, flow::SubmitError};
use serde::{Deserialize, Serialize};
use utoipa::{IntoResponses, ToSchema};
use uuid::Uuid;

/// `POST /v1/user-operations`: a JSON object with exactly these members (each once).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubmitUserOperationRequest {
    /// The chain id.
    pub chain_id: u64,
    /// The EntryPoint the operation was hashed and signed over: the **resolved** address
    /// (`eth_supportedEntryPoints`), never the configured reference.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    pub entry_point: String,
    /// The user operation in its ERC-7769 JSON-RPC form (v0.7/v0.8 unpacked fields,
    /// every number a `0x` hex quantity).
    #[schema(value_type = UserOperationJson)]
    pub user_operation: Box<serde_json::value::RawValue>,
}

// Read by the shared body parser (`crate::extract::parse_body`): `userOperation` is
// kept as its raw text for the user operation's own deserializer, never as a tree.
impl crate::extract::RequestBody for SubmitUserOperationRequest {
    const FIELDS: &'static [crate::extract::Field] = &[
        crate::extract::Field {
            name: "chainId",
            kind: crate::extract::FieldKind::UnsignedInteger,
        },
        crate::extract::Field {
            name: "entryPoint",
            kind: crate::extract::FieldKind::Text,
        },
        crate::extract::Field {
            name: "userOperation",
            kind: crate::extract::FieldKind::Object,
        },
    ];
}

/// A user operation in the ERC-7769 JSON-RPC form of EntryPoint v0.7/v0.8 (unpacked
/// fields; every number a `0x` hex quantity, every byte string `0x` hex). `factory` and
/// `factoryData` come together or not at all, likewise `paymaster` and its three
/// members. Refused with `422 INVALID_FIELD` when it does not pack (a paired member
/// alone, a quantity over its width), and with `422 USER_OPERATION_REJECTED` when the
/// EntryPoint's simulation refuses it (its signature, nonce, gas or deposit): rules no
/// schema can state.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct UserOperationJson {
    /// The smart account.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    sender: String,
    /// The account nonce (key ‖ sequence), a hex quantity of at most 256 bits.
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    nonce: String,
    /// The factory creating the account (or `0x7702`, the EIP-7702 marker).
    #[schema(pattern = "^0x([0-9a-fA-F]{40}|7702)$")]
    factory: Option<String>,
    /// The factory's calldata.
    #[schema(pattern = "^0x([0-9a-fA-F]{2})*$")]
    factory_data: Option<String>,
    /// The account's calldata.
    #[schema(pattern = "^0x([0-9a-fA-F]{2})*$")]
    call_data: String,
    /// Gas of the execution call (at most 128 bits).
    #[schema(pattern = "^0[xX](?=[0-9a-fA-F]{1,64}$)0*[0-9a-fA-F]{1,32}$")]
    call_gas_limit: String,
    /// Gas of account creation plus `validateUserOp` (at most 128 bits).
    #[schema(pattern = "^0[xX](?=[0-9a-fA-F]{1,64}$)0*[0-9a-fA-F]{1,32}$")]
    verification_gas_limit: String,
    /// Gas paid for bundle overhead and calldata.
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    pre_verification_gas: String,
    /// EIP-1559 fee cap, wei per gas (at most 128 bits).
    #[schema(pattern = "^0[xX](?=[0-9a-fA-F]{1,64}$)0*[0-9a-fA-F]{1,32}$")]
    max_fee_per_gas: String,
    /// EIP-1559 priority fee, wei per gas (at most 128 bits).
    #[schema(pattern = "^0[xX](?=[0-9a-fA-F]{1,64}$)0*[0-9a-fA-F]{1,32}$")]
    max_priority_fee_per_gas: String,
    /// The paymaster, when one pays.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    paymaster: Option<String>,
    /// Gas of `validatePaymasterUserOp` (at most 128 bits).
    #[schema(pattern = "^0[xX](?=[0-9a-fA-F]{1,64}$)0*[0-9a-fA-F]{1,32}$")]
    paymaster_verification_gas_limit: Option<String>,
    /// Gas of `postOp` (at most 128 bits).
    #[schema(pattern = "^0[xX](?=[0-9a-fA-F]{1,64}$)0*[0-9a-fA-F]{1,32}$")]
    paymaster_post_op_gas_limit: Option<String>,
    /// The paymaster's data.
    #[schema(pattern = "^0x([0-9a-fA-F]{2})*$")]
    paymaster_data: Option<String>,
    /// The account's signature over the operation hash.
    #[schema(pattern = "^0x([0-9a-fA-F]{2})*$")]
    signature: String,
    /// The EIP-7702 authorization (7702 accounts only).
    eip7702_auth: Option<Eip7702AuthJson>,
}

/// An EIP-7702 authorization of a user operation (hex quantities).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct Eip7702AuthJson {
    /// EIP-155 chain id of the authorization (0 = any chain).
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    chain_id: String,
    /// The delegate contract.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    address: String,
    /// The authority's account nonce.
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    nonce: String,
    /// Signature parity.
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    y_parity: String,
    /// Signature `r`.
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    r: String,
    /// Signature `s`.
    #[schema(pattern = "^0[xX][0-9a-fA-F]{1,64}$")]
    s: String,
}

/// An accepted user operation.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserOperationAccepted {
    /// The v0.8 operation hash (over the resolved EntryPoint).
    #[schema(value_type = String)]
    pub user_op_hash: String,
    /// The operation id (its durable workflow instance).
    pub operation_id: Uuid,
    /// False when the same operation had been accepted before.
    pub created: bool,
}

/// A user operation's state and outcome.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserOperationStatus {
    /// The v0.8 operation hash.
    pub user_op_hash: String,
    /// The chain id.
    pub chain_id: u64,
    /// The operation id.
    pub operation_id: Uuid,
    /// `accepted`, `ready`, `bundled`, `included`, `failed`, `nonce_used_elsewhere`.
    pub state: String,
    /// The account (EIP-55).
    pub sender: String,
    /// The nonce, decimal string.
    pub nonce: String,
    /// The resolved EntryPoint it used (EIP-55).
    pub entry_point: String,
    /// The bundle transaction, once included at the queue's confirmation depth.
    pub transaction_hash: Option<String>,
    /// Its block number.
    pub block_number: Option<u64>,
    /// Its block hash.
    pub block_hash: Option<String>,
    /// Included: whether the execution call succeeded.
    pub success: Option<bool>,
    /// Included: wei paid by the paymaster (or account), decimal string.
    pub actual_gas_cost: Option<String>,
    /// Included: gas charged, decimal string.
    pub actual_gas_used: Option<String>,
    /// Ended otherwise: the ERC-7769 code (-32500 ...).
    pub error_code: Option<i32>,
    /// Ended otherwise: `AAxx …` or a `SPONSOR_…` policy code.
    pub error_reason: Option<String>,
    /// Accepted at.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl From<UserOperationView> for UserOperationStatus {
    fn from(v: UserOperationView) -> Self {
        Self {
            user_op_hash: v.user_op_hash.to_string(),
            chain_id: v.chain_id,
            operation_id: v.operation_id,
            state: v.state,
            sender: crate::dto::address_text(v.sender),
            nonce: v.nonce,
            entry_point: crate::dto::address_text(v.entry_point),
            transaction_hash: v.transaction_hash.map(|h| h.to_string()),
            block_number: v.block_number,
            block_hash: v.block_hash.map(|h| h.to_string()),
            success: v.success,
            actual_gas_cost: v.actual_gas_cost,
            actual_gas_used: v.actual_gas_used,
            error_code: v.error_code,
            error_reason: v.error_reason,
            created_at: v.created_at,
            updated_at: v.updated_at,
        }
    }
}

/// Errors of the user-operation routes (for the OpenAPI document).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum UserOperationErrors {
    /// `MALFORMED_JSON`, `JSON_TOO_DEEP`, `INVALID_FIELD`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such user operation in the caller's organization (or the
    /// service is not configured).
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    Unsupported(Problem),
    /// `USER_OPERATION_REJECTED`, `ENTRY_POINT_NOT_RESOLVED`, `CHAIN_NOT_CONFIGURED`,
    /// `INVALID_FIELD` (a malformed user operation), `INVALID_ADDRESS`.
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// `SERVICE_UNAVAILABLE`: the chain or the database did not answer; retry.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

fn service(state: &ApiState) -> Result<&AaService, Problem> {
    state
        .user_operations()
        .ok_or_else(|| Problem::not_found("route"))
}

pub(crate) fn unavailable() -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "SERVICE_UNAVAILABLE",
        "the chain or the database did not answer; retry",
    )
}

fn unprocessable(code: &str, detail: impl Into<String>) -> Problem {
    Problem::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
}

fn send_problem(e: SendError) -> Problem {
    match e {
        SendError::Rejected {
            code,
            reason,
            revert,
        } => {
            let inner = revert
                .as_ref()
                .and_then(|b| keel_aa::rejection::revert_reason_text(b))
                .map(|t| format!(": {t}"))
                .unwrap_or_default();
            unprocessable(
                "USER_OPERATION_REJECTED",
                format!(
                    "the EntryPoint refused the user operation ({}): {reason}{inner}",
                    code.code()
                ),
            )
        }
        SendError::Violation {
            code,
            reason,
            breach,
        } => unprocessable(
            "USER_OPERATION_REJECTED",
            format!(
                "the user operation breaks a validation rule ({}, {reason}): {}",
                code.code(),
                breach.message
            ),
        ),
        SendError::Refused(r) => unprocessable(
            "USER_OPERATION_REJECTED",
            format!(
                "field `userOperation.{}` refused ({}, {}): {}",
                r.field,
                r.code.code(),
                r.reason,
                r.message()
            ),
        ),
        SendError::Submit(SubmitError::ReferenceAddress) => unprocessable(
            "ENTRY_POINT_NOT_RESOLVED",
            "field `entryPoint` names the configured EntryPointReference; rebuild and re-sign the user operation against the resolved EntryPoint",
        ),
        SendError::Submit(SubmitError::UnsupportedEntryPoint) => unprocessable(
            "ENTRY_POINT_NOT_RESOLVED",
            "field `entryPoint` is not this chain's resolved EntryPoint",
        ),
        SendError::Submit(SubmitError::ChainNotServed(_)) => unprocessable(
            "CHAIN_NOT_CONFIGURED",
            "field `chainId`: the chain is not served",
        ),
        SendError::Submit(SubmitError::Malformed(_)) => {
            unprocessable("INVALID_FIELD", "field `userOperation` does not pack")
        }
        e if e.is_retryable() => unavailable(),
        _ => Problem::internal(),
    }
}

/// The bundler's JSON-RPC 2.0 endpoint of a chain (ERC-7769): `eth_chainId`,
/// `eth_supportedEntryPoints`, `eth_sendUserOperation`, `eth_getUserOperationByHash`,
/// `eth_getUserOperationReceipt`. Always HTTP 200 with a JSON-RPC response; errors carry
/// the ERC-7769 codes.
#[utoipa::path(post, path = "/v1/chains/{chain}/bundler", tag = "user-operations", operation_id = "bundlerRpc",
    params(("chain" = u64, Path, description = "Chain id")),
    request_body(content = Object, content_type = "application/json", description = "A JSON-RPC 2.0 request or a batch of 1 to 32."),
    responses((status = 200, description = "The JSON-RPC response (or batch of responses).", body = Object), UserOperationErrors),
    security(("bearer" = [])))]
pub(crate) async fn bundler_rpc(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Result<Response, Problem> {
    let svc = service(&state)?;
    let chain: u64 = params
        .iter()
        .find(|(k, _)| *k == "chain")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| Problem::not_found("chain"))?;
    if !svc.chain_ids().contains(&chain) {
        return Err(Problem::not_found("chain"));
    }
    crate::extract::require_json(&headers)?;
    if json_too_deep(&bytes, MAX_JSON_DEPTH) {
        return Err(Problem::bad_request(
            "JSON_TOO_DEEP",
            format!("the request body is nested deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    let answer = svc.rpc(chain, Some(caller.organization_id), &bytes).await;
    Ok(Json(answer).into_response())
}

/// Submit a user operation (the same durable path as `eth_sendUserOperation`).
#[utoipa::path(post, path = "/v1/user-operations", tag = "user-operations", operation_id = "submitUserOperation",
    request_body(content = SubmitUserOperationRequest, content_type = "application/json"),
    responses((status = 202, description = "Accepted (or accepted before: `created` false).", body = UserOperationAccepted), UserOperationErrors),
    security(("bearer" = [])))]
pub(crate) async fn submit(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    JsonBody(req): JsonBody<SubmitUserOperationRequest>,
) -> Result<Response, Problem> {
    let svc = service(&state)?;
    let entry_point = req.entry_point.parse().map_err(|_| {
        unprocessable(
            "INVALID_ADDRESS",
            "field `entryPoint` is not a 20-byte hex address",
        )
    })?;
    let op: UserOperation = serde_json::from_str::<serde_json::Value>(req.user_operation.get())
        .ok()
        .ok_or_else(|| {
            unprocessable(
                "INVALID_FIELD",
                "field `userOperation` is not an ERC-7769 user operation (hex quantities, paired paymaster and factory fields)",
            )
        })
        .and_then(|v| {
            keel_aa::parse_user_operation(&v).map_err(|e| {
                unprocessable(
                    "INVALID_FIELD",
                    format!("field `userOperation.{}` {}", e.field, e.problem),
                )
            })
        })?;
    let s = svc
        .send(req.chain_id, entry_point, op, Some(caller.organization_id))
        .await
        .map_err(send_problem)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(UserOperationAccepted {
            user_op_hash: s.user_op_hash.to_string(),
            operation_id: s.instance_id,
            created: s.created,
        }),
    )
        .into_response())
}

/// One user operation by its hash.
#[utoipa::path(get, path = "/v1/user-operations/{hash}", tag = "user-operations", operation_id = "getUserOperation",
    params(("hash" = String, Path, description = "The user operation hash (0x + 64 hex digits)")),
    responses((status = 200, description = "The user operation.", body = UserOperationStatus), UserOperationErrors),
    security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
) -> Result<Response, Problem> {
    let svc = service(&state)?;
    let hash = params
        .iter()
        .find(|(k, _)| *k == "hash")
        .and_then(|(_, v)| v.parse::<alloy_primitives::B256>().ok())
        .ok_or_else(|| Problem::not_found("user operation"))?;
    let view = svc
        .user_operation(hash, Some(caller.organization_id))
        .await
        .map_err(|_| unavailable())?
        .ok_or_else(|| Problem::not_found("user operation"))?;
    Ok(Json(UserOperationStatus::from(view)).into_response())
}
