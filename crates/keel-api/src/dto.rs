//! The API's JSON shapes (all camelCase): the wire format, owned here.
//!
//! Request bodies are deserialized from these types, and every response is serialized
//! from them: the handlers convert the operations service's views
//! (`keel_workflows::OperationView`, `AssetView`, ...) with the `From` impls at the end
//! of this module. The OpenAPI document is generated from the same types, so what is
//! documented is what is served.
//!
//! Naming: the service calls an operation's link to a queue request `link`; the wire
//! name is `step` (`TxMilestone::step`, `OperationWait::step`, `FundingRequest::step`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------

/// `POST /v1/assets`: create an asset from one of the organization's templates. The
/// chain, price resolver and staleness bound come from the template, never from the
/// request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "name": "Example Fund Share", "symbol": "EFS", "decimals": 18,
    "templateId": "default", "initialPrice": "1.25"
}))]
pub struct CreateAssetRequest {
    /// ERC-20 name, 1 to 64 printable (non-control) characters.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub name: String,
    /// ERC-20 symbol, 1 to 16 ASCII letters or digits.
    #[schema(min_length = 1, max_length = 16, pattern = "^[A-Za-z0-9]*$")]
    pub symbol: String,
    /// ERC-20 decimals, 0 to 36. An integral JSON number such as `6.0` is the integer
    /// it denotes (as JSON Schema reads it).
    #[schema(minimum = 0, maximum = 36)]
    #[serde(deserialize_with = "integral_u8")]
    pub decimals: u8,
    /// The id of one of the organization's asset templates.
    pub template_id: String,
    /// Initial price in quote units per token, as a **decimal string** (JSON numbers
    /// are refused), at most the template's price decimals of fractional digits,
    /// greater than zero.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$", example = "1.25")]
    pub initial_price: String,
}

/// The integer a JSON number denotes when it has no fractional part (`25` and `25.0`
/// alike, as JSON Schema's `integer` reads them), if it is in `0..=u64::MAX`.
pub fn integral_u64(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..u64::MAX as f64).contains(f))
            .map(|f| f as u64)
    })
}

/// Deserializes a `u8` from an integral JSON number ([`integral_u64`]).
fn integral_u8<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    integral_u64(&n)
        .and_then(|v| u8::try_from(v).ok())
        .ok_or_else(|| serde::de::Error::custom("must be an integer from 0 to 255"))
}

/// `POST /v1/assets/{id}/mint` and `/transfer`: move `amount` token units to
/// `recipient`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "recipient": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "amount": "12.5"
}))]
pub struct TokenAmountRequest {
    /// Receiver: `0x` and 40 hex digits (an EIP-55 checksum is verified when the
    /// digits are mixed-case); not the zero address.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub recipient: String,
    /// Token units as a **decimal string** (JSON numbers are refused), greater than
    /// zero, at most the token's decimals of fractional digits.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$", example = "12.5")]
    pub amount: String,
}

/// `POST /v1/assets/{id}/burn`: burn `amount` token units of the issuer's own holdings,
/// or, with `from`, a forced burn (redemption) of that holder's tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "amount": "12.5", "from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
}))]
pub struct BurnRequest {
    /// Token units as a **decimal string** (JSON numbers are refused), greater than
    /// zero, at most the token's decimals of fractional digits.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$", example = "12.5")]
    pub amount: String,
    /// The holder whose tokens are burned (a forced burn: `AssetToken.forcedBurn`, which
    /// needs the issuer to hold the token's `burner` role — grant it with
    /// `POST /v1/assets/{id}/grant-role`; without it the operation fails
    /// `EXECUTION_REVERTED` with reason `AccessControlUnauthorizedAccount`). `0x` and 40
    /// hex digits (an EIP-55 checksum is verified when mixed-case); not the zero address.
    /// Absent or null: the issuer burns its own holdings (`AssetToken.burn`).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    #[serde(default)]
    pub from: Option<String>,
}

/// `POST /v1/assets/{id}/grant-role` and `/revoke-role`: grant `role` on the asset's
/// token to `account`, or revoke it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "role": "minter", "account": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
}))]
pub struct RoleRequest {
    /// The token role: `minter` (`MINTER_ROLE`: may mint), `pauser` (`PAUSER_ROLE`: may
    /// pause and unpause) or `burner` (`BURNER_ROLE`: may burn any holder's tokens; held
    /// by nobody until granted). Any other name is `422 UNKNOWN_ROLE`.
    #[schema(schema_with = role_schema)]
    pub role: String,
    /// The account that receives or loses the role: `0x` and 40 hex digits (an EIP-55
    /// checksum is verified when mixed-case); not the zero address.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: String,
}

/// The schema of [`RoleRequest::role`]: a string, one of the roles'
/// API names.
fn role_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(
            keel_workflows::TokenRole::ALL
                .iter()
                .map(|r| r.name())
                .collect::<Vec<_>>(),
        ))
        .description(Some(
            "The token role: `minter` (`MINTER_ROLE`: may mint), `pauser` (`PAUSER_ROLE`: \
             may pause and unpause) or `burner` (`BURNER_ROLE`: may burn any holder's \
             tokens; held by nobody until granted). Any other name is `422 UNKNOWN_ROLE`.",
        ))
        .examples(["minter"])
        .build()
}

/// The body of `pause`, `unpause`, `approve` and `reject`: empty, or `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

// ---------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------

/// The state of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperationState {
    /// Accepted; waits behind another operation of its asset (see `queuedBehind`).
    Queued,
    /// Accepted and being worked on.
    Running,
    /// Waiting for something outside Keel (see `wait`).
    Waiting,
    /// Stopped on a transient failure; resumes by itself (see `error`).
    Suspended,
    /// Ended successfully (see `result`).
    Completed,
    /// Ended with a failure (see `error`).
    Failed,
    /// Ended by cancellation.
    Cancelled,
}

/// An operation's status (`GET /v1/operations/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Operation {
    /// Operation id.
    pub id: Uuid,
    /// `asset.create`, `asset.mint`, `asset.transfer`, `asset.pause`, `asset.unpause`,
    /// `asset.burn`, `asset.grant-role` or `asset.revoke-role`.
    #[schema(example = "asset.create")]
    pub kind: String,
    /// The asset it acts on.
    pub asset_id: Uuid,
    /// Its state; `completed`, `failed` and `cancelled` are terminal.
    pub state: OperationState,
    /// For a `queued` operation: the operation of the same asset it waits behind (null
    /// otherwise).
    pub queued_behind: Option<Uuid>,
    /// What a `waiting` operation waits for (null otherwise).
    pub wait: Option<OperationWait>,
    /// When a cancel was requested (RFC 3339, UTC), or null. A transaction signed before
    /// the cancel runs to its verdict; `milestones.confirmed` lists what landed.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// The four milestones: accepted → submitted → confirmed → indexed.
    pub milestones: Milestones,
    /// The workflow's last progress snapshot (free-form JSON), or null.
    pub progress: Option<Value>,
    /// The result of a completed operation (free-form JSON, e.g. token and feed
    /// addresses and `indexedBlock`), or null. Token operations give `txHash`, `block`
    /// and `indexedBlock`; `asset.grant-role` and `asset.revoke-role` add `role`,
    /// `account` and `changed` (false when the account already held, or did not hold,
    /// the role: the transaction landed without changing it).
    pub result: Option<Value>,
    /// The failure of a `failed` operation (or the transient reason while
    /// `suspended`), or null.
    pub error: Option<OperationError>,
}

/// The answer to an accepted `POST` (`202`, or `200` once terminal): the operation's
/// status plus `created` and `statusUrl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationAccepted {
    /// The operation's status.
    #[serde(flatten)]
    pub operation: Operation,
    /// False when the `Idempotency-Key` named an existing operation (a replay).
    pub created: bool,
    /// Where to poll the status: `/v1/operations/{id}` (also the `Location` header).
    #[schema(example = "/v1/operations/6f1c2a52-5b5e-4d43-9d1e-0c2f5d1e3a10")]
    pub status_url: String,
}

/// What a waiting operation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitFor {
    /// An approval decision (`POST /v1/operations/{id}/approve|reject`).
    Approval,
    /// A transaction's settlement.
    Transaction,
    /// Gas funds for the sender (see `GET /v1/funding-requests`).
    Funding,
    /// A timer.
    Timer,
}

/// The wait of a `waiting` operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationWait {
    /// What it waits for.
    #[serde(rename = "for")]
    pub waits_for: WaitFor,
    /// The deadline (RFC 3339, UTC), when there is one: an approval not decided by
    /// then fails the operation `APPROVAL_EXPIRED`; a funding wait not funded by then
    /// fails `FUNDING_DEADLINE_EXPIRED`.
    pub until: Option<DateTime<Utc>>,
    /// The workflow step whose transaction it waits for, if any.
    pub step: Option<String>,
    /// For a transaction wait: the error class of the last broadcast that no node
    /// accepted (`internal`, `unavailable`, `rate_limited`, `nonce_too_high`, ...), or
    /// null when every broadcast went through so far.
    pub last_broadcast_error: Option<String>,
}

/// Accepted → submitted → confirmed → indexed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Milestones {
    /// When the operation was accepted (RFC 3339, UTC).
    pub accepted: DateTime<Utc>,
    /// Every transaction signed (and, when `broadcast`, submitted), by step.
    pub submitted: Vec<TxMilestone>,
    /// Every transaction confirmed, by step, with its block.
    pub confirmed: Vec<TxMilestone>,
    /// The index block that reflects the operation, once read-after-write passed.
    pub indexed: Option<IndexedMilestone>,
}

/// A transaction of an operation step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TxMilestone {
    /// The workflow step (`deploy-token`, `create-feed`, `mint`, ...).
    pub step: String,
    /// The transaction hash (`0x` + 64 hex digits): the latest attempt's, the mined
    /// one once confirmed.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub tx_hash: Option<String>,
    /// The sender's nonce.
    pub nonce: Option<u64>,
    /// Whether a node accepted the transaction.
    pub broadcast: bool,
    /// The block number, once confirmed (null in `submitted`).
    pub block: Option<u64>,
}

/// The indexed milestone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexedMilestone {
    /// The Ledger Index block that reflects the operation.
    pub block: u64,
}

/// The failure of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationError {
    /// Stable code (`EXECUTION_REVERTED`, `APPROVAL_EXPIRED`, `APPROVAL_REJECTED`,
    /// `GAS_REQUIRED`, `FUNDING_DEADLINE_EXPIRED`, ...).
    pub code: String,
    /// Whether a retry can help.
    pub retryable: bool,
    /// Value-free description.
    pub detail: String,
    /// The decoded revert reason, when a transaction reverted.
    pub reason: Option<String>,
}

/// The lifecycle of an asset (from its `asset.create` operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AssetStatus {
    /// Its creation is in progress; token operations answer `409 ASSET_NOT_READY`.
    Creating,
    /// Created; mintable.
    Active,
    /// Its creation failed or was cancelled.
    Failed,
}

/// An asset: identity from Keel's records, on-chain state from the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Asset {
    /// Asset id.
    pub id: Uuid,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// The template it was created from.
    pub template_id: String,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// `creating`, `active` or `failed`.
    pub status: AssetStatus,
    /// Its `asset.create` operation.
    pub create_operation_id: Option<Uuid>,
    /// The token contract (EIP-55 checksummed), once deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub token_address: Option<String>,
    /// The price feed contract (EIP-55 checksummed), once deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub feed_address: Option<String>,
    /// Total supply in token units (decimal string), from the index.
    pub supply: Option<String>,
    /// Whether the token is paused, from the index.
    pub paused: Option<bool>,
    /// The feed's staleness bound in seconds (decimal string), from the index.
    pub staleness_bound_seconds: Option<String>,
    /// The feed's latest observation, from the index.
    pub latest_observation: Option<Observation>,
    /// The index block this view reflects (null before the index saw the chain).
    pub indexed_block: Option<u64>,
    /// True when the Ledger Index of the asset's chain is degraded (the chain
    /// reorganized below its finalized block; ingest stopped): the index state shown
    /// may include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
}

/// `GET /v1/assets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssetList {
    /// The caller's assets, oldest first (at most 1000).
    pub assets: Vec<Asset>,
}

/// A price observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Observation {
    /// The answer in the feed's decimals (signed integer string).
    pub answer: String,
    /// The round id (integer string).
    pub round_id: String,
    /// The round's timestamp, unix seconds (integer string).
    pub updated_at: String,
    /// The block of the observation.
    pub block: u64,
}

/// A holder's balance of an asset, from the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Balance {
    /// The asset.
    pub asset_id: Uuid,
    /// The holder (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// Token units (decimal string with the token's decimals).
    pub balance: String,
    /// Base units (decimal integer string).
    pub balance_base_units: String,
    /// The index block this balance reflects.
    pub indexed_block: u64,
    /// True when the Ledger Index of the asset's chain is degraded: the balance may
    /// include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
}

/// An open funding request: an operation's transaction waits until its sender holds
/// enough native currency for gas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FundingRequest {
    /// The operation that waits.
    pub operation_id: Uuid,
    /// Its workflow step.
    pub step: String,
    /// The transaction-queue request that waits.
    pub request_id: Uuid,
    /// EIP-155 chain id (decimal string).
    #[schema(example = "31337")]
    pub chain_id: String,
    /// Where to send the funds: the transaction's sender (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// The shortfall in wei (decimal string) at the last check.
    pub required_wei: String,
    /// After this instant (RFC 3339, UTC) the operation fails
    /// `FUNDING_DEADLINE_EXPIRED`.
    pub deadline: DateTime<Utc>,
    /// The gas limit of the computation, units of gas.
    pub gas_limit: u64,
    /// The max fee per gas of the computation, wei per gas (decimal string).
    pub max_fee_per_gas_wei: String,
    /// The transaction's native value, wei (decimal string).
    pub value_wei: String,
}

/// `GET /v1/funding-requests`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FundingRequestList {
    /// The caller's open funding requests, oldest first.
    pub funding_requests: Vec<FundingRequest>,
}

/// `GET /healthz` and `GET /readyz` when healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}

// ---------------------------------------------------------------------------------------
// API keys (`/v1/api-keys`)
// ---------------------------------------------------------------------------------------

/// The most scopes a key can hold (there are four).
pub const MAX_SCOPES_PER_KEY: usize = 4;

/// What an API key may do. Every route requires one scope (`GET` routes `read`,
/// operation-creating `POST`s, retry and cancel `operate`, approve and reject
/// `approve`, the `/v1/api-keys` routes `admin`); a key may hold several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApiKeyScope {
    /// Every `GET` route.
    Read,
    /// The operation-creating `POST`s, retry and cancel.
    Operate,
    /// Approve and reject.
    Approve,
    /// The `/v1/api-keys` routes (key management).
    Admin,
}

impl From<keel_workflows::Scope> for ApiKeyScope {
    fn from(s: keel_workflows::Scope) -> Self {
        match s {
            keel_workflows::Scope::Read => Self::Read,
            keel_workflows::Scope::Operate => Self::Operate,
            keel_workflows::Scope::Approve => Self::Approve,
            keel_workflows::Scope::Admin => Self::Admin,
        }
    }
}

/// `POST /v1/api-keys`: create a key of the caller's organization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"label": "ci-reader", "scopes": ["read"]}))]
pub struct CreateApiKeyRequest {
    /// Who or what uses the key: 1 to 255 printable (non-control) characters.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub label: String,
    /// Its scopes: one to four distinct names (`uniqueItems`), each one the calling key
    /// holds itself (else `403 INSUFFICIENT_SCOPE`).
    #[schema(value_type = Vec<ApiKeyScope>, min_items = 1, max_items = 4)]
    pub scopes: Vec<String>,
}

/// `POST /v1/api-keys/{id}/rotate`: empty, `{}`, or the overlap of the old secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"expiresInSeconds": 3600}))]
pub struct RotateApiKeyRequest {
    /// How long the old secret keeps working, seconds (0 to 604800, i.e. 7 days).
    /// Absent, null or 0: it stops at once.
    #[schema(minimum = 0, maximum = 604_800)]
    #[serde(default, deserialize_with = "integral_u64_opt")]
    pub expires_in_seconds: Option<u64>,
}

/// Deserializes an optional `u64` from an integral JSON number ([`integral_u64`]).
fn integral_u64_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<serde_json::Number>::deserialize(d)?
        .map(|n| {
            integral_u64(&n)
                .ok_or_else(|| serde::de::Error::custom("must be a non-negative integer"))
        })
        .transpose()
}

/// An API key as its organization sees it. Its secret is never shown again after
/// creation or rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKey {
    /// Key id (stays the same across rotations).
    pub id: Uuid,
    /// Who or what uses it.
    pub label: String,
    /// What it may do.
    pub scopes: Vec<ApiKeyScope>,
    /// When it was created (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// Its last rotation (RFC 3339, UTC), or null.
    pub rotated_at: Option<DateTime<Utc>>,
    /// When it was revoked (RFC 3339, UTC), or null. A revoked key authenticates
    /// nothing.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Until when the secret its last rotation replaced keeps working (RFC 3339, UTC),
    /// or null when it does not.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

impl From<keel_workflows::ApiKeyView> for ApiKey {
    fn from(k: keel_workflows::ApiKeyView) -> Self {
        Self {
            id: k.id,
            label: k.label,
            scopes: k.scopes.iter().map(Into::into).collect(),
            created_at: k.created_at,
            rotated_at: k.rotated_at,
            revoked_at: k.revoked_at,
            previous_secret_expires_at: k.previous_secret_expires_at,
        }
    }
}

/// A key with its secret: the answer of create and rotate, the only time the token is
/// shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeyWithToken {
    /// The key.
    pub api_key: ApiKey,
    /// The bearer token, shown once: `keel_sk_` + 64 hex digits. Store it now; Keel
    /// keeps only its SHA-256.
    #[schema(pattern = "^keel_sk_[0-9a-f]{64}$")]
    pub token: String,
}

impl From<keel_workflows::RotatedApiKey> for ApiKeyWithToken {
    fn from(r: keel_workflows::RotatedApiKey) -> Self {
        Self {
            api_key: r.key.into(),
            token: r.token,
        }
    }
}

/// `GET /v1/api-keys`: one page of the organization's keys (revoked ones included),
/// oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeyList {
    /// The keys of this page.
    pub data: Vec<ApiKey>,
    /// True when more keys follow.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

// ---------------------------------------------------------------------------------------
// From the service's views
// ---------------------------------------------------------------------------------------

use keel_workflows as svc;

impl From<svc::OperationState> for OperationState {
    fn from(s: svc::OperationState) -> Self {
        match s {
            svc::OperationState::Queued => Self::Queued,
            svc::OperationState::Running => Self::Running,
            svc::OperationState::Waiting => Self::Waiting,
            svc::OperationState::Suspended => Self::Suspended,
            svc::OperationState::Completed => Self::Completed,
            svc::OperationState::Failed => Self::Failed,
            svc::OperationState::Cancelled => Self::Cancelled,
        }
    }
}

impl From<svc::WaitFor> for WaitFor {
    fn from(w: svc::WaitFor) -> Self {
        match w {
            svc::WaitFor::Approval => Self::Approval,
            svc::WaitFor::Transaction => Self::Transaction,
            svc::WaitFor::Funding => Self::Funding,
            svc::WaitFor::Timer => Self::Timer,
        }
    }
}

impl From<svc::OperationView> for Operation {
    fn from(v: svc::OperationView) -> Self {
        Self {
            id: v.id,
            kind: v.kind,
            asset_id: v.asset_id,
            state: v.state.into(),
            queued_behind: v.queued_behind,
            wait: v.wait.map(Into::into),
            cancel_requested_at: v.cancel_requested_at,
            milestones: v.milestones.into(),
            progress: v.progress,
            result: v.result,
            error: v.error.map(Into::into),
        }
    }
}

impl From<svc::WaitView> for OperationWait {
    fn from(w: svc::WaitView) -> Self {
        Self {
            waits_for: w.waits_for.into(),
            until: w.until,
            step: w.link,
            last_broadcast_error: w.last_broadcast_error,
        }
    }
}

impl From<svc::Milestones> for Milestones {
    fn from(m: svc::Milestones) -> Self {
        Self {
            accepted: m.accepted,
            submitted: m.submitted.into_iter().map(Into::into).collect(),
            confirmed: m.confirmed.into_iter().map(Into::into).collect(),
            indexed: m.indexed.map(Into::into),
        }
    }
}

impl From<svc::TxMilestone> for TxMilestone {
    fn from(t: svc::TxMilestone) -> Self {
        Self {
            step: t.link,
            // `0x` + 64 lowercase hex digits.
            tx_hash: t.tx_hash.map(|h| h.to_string()),
            nonce: t.nonce,
            broadcast: t.broadcast,
            block: t.block,
        }
    }
}

impl From<svc::IndexedMilestone> for IndexedMilestone {
    fn from(i: svc::IndexedMilestone) -> Self {
        Self { block: i.block }
    }
}

impl From<svc::ErrorView> for OperationError {
    fn from(e: svc::ErrorView) -> Self {
        Self {
            code: e.code,
            retryable: e.retryable,
            detail: e.detail,
            reason: e.reason,
        }
    }
}

/// The status URL of operation `id`: `/v1/operations/{id}`.
pub fn status_url(id: Uuid) -> String {
    format!("/v1/operations/{id}")
}

impl OperationAccepted {
    /// The answer to an accepted `POST`: the operation's status, whether this request
    /// created it, and its status URL.
    pub fn new(operation: svc::OperationView, created: bool) -> Self {
        let status_url = status_url(operation.id);
        Self {
            operation: operation.into(),
            created,
            status_url,
        }
    }
}

impl From<svc::AssetStatus> for AssetStatus {
    fn from(s: svc::AssetStatus) -> Self {
        match s {
            svc::AssetStatus::Creating => Self::Creating,
            svc::AssetStatus::Active => Self::Active,
            svc::AssetStatus::Failed => Self::Failed,
        }
    }
}

/// An address as served: `0x` + 40 lowercase hex digits, exactly as the service's
/// views serialized it before the API owned its DTOs. (The schema's descriptions say
/// "EIP-55 checksummed"; the pattern admits both, and changing the served form is not
/// part of a refactoring.)
fn address_text(a: alloy_primitives::Address) -> String {
    format!("{a:#x}")
}

impl From<svc::AssetView> for Asset {
    fn from(a: svc::AssetView) -> Self {
        Self {
            id: a.id,
            name: a.name,
            symbol: a.symbol,
            decimals: a.decimals,
            template_id: a.template_id,
            chain_id: a.chain_id.get(),
            status: a.status.into(),
            create_operation_id: a.create_operation_id,
            token_address: a.token_address.map(address_text),
            feed_address: a.feed_address.map(address_text),
            supply: a.supply,
            paused: a.paused,
            staleness_bound_seconds: a.staleness_bound_seconds,
            latest_observation: a.latest_observation.map(Into::into),
            indexed_block: a.indexed_block,
            index_degraded: a.index_degraded,
        }
    }
}

impl From<svc::ObservationView> for Observation {
    fn from(o: svc::ObservationView) -> Self {
        Self {
            answer: o.answer,
            round_id: o.round_id,
            updated_at: o.updated_at,
            block: o.block,
        }
    }
}

impl From<svc::BalanceView> for Balance {
    fn from(b: svc::BalanceView) -> Self {
        Self {
            asset_id: b.asset_id,
            address: address_text(b.address),
            balance: b.balance,
            balance_base_units: b.balance_base_units,
            indexed_block: b.indexed_block,
            index_degraded: b.index_degraded,
        }
    }
}

impl From<svc::FundingRequestView> for FundingRequest {
    fn from(f: svc::FundingRequestView) -> Self {
        let r = f.request;
        Self {
            operation_id: f.operation_id,
            step: f.link,
            request_id: r.request_id,
            chain_id: r.chain_id.to_string(),
            address: address_text(r.address),
            required_wei: r.required_wei.to_string(),
            deadline: r.deadline,
            gas_limit: r.gas_limit,
            max_fee_per_gas_wei: r.max_fee_per_gas_wei.to_string(),
            value_wei: r.value_wei.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Address, B256};

    /// Hashes are served as `0x` + 64 lowercase hex digits and addresses as `0x` + 40
    /// lowercase hex digits: the forms alloy's serde gives them.
    #[test]
    fn hashes_and_addresses_have_their_documented_form() {
        let t = TxMilestone::from(svc::TxMilestone {
            link: "mint#2".into(),
            tx_hash: Some(B256::repeat_byte(0xab)),
            nonce: Some(7),
            broadcast: true,
            block: None,
        });
        assert_eq!(t.step, "mint#2");
        assert_eq!(
            t.tx_hash.as_deref(),
            Some(&*format!("0x{}", "ab".repeat(32)))
        );
        let a: Address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
            .parse()
            .unwrap();
        assert_eq!(
            address_text(a),
            "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
        );
        assert_eq!(
            serde_json::to_value(a).unwrap(),
            serde_json::json!(address_text(a))
        );
        let h = B256::repeat_byte(0xab);
        assert_eq!(
            serde_json::to_value(h).unwrap(),
            serde_json::json!(h.to_string())
        );
    }
}
