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
    /// are refused): greater than zero, at most 78 digits before and after the point
    /// (the pattern). Two more rules depend on the named template and answer `422`:
    /// at most its price decimals of fractional digits, trailing zeros included
    /// (`AMOUNT_PRECISION_LOSS`), and
    /// the price in base units (times 10^price decimals) at most 2^127-1, the largest
    /// answer the feed holds (`INVALID_FIELD`).
    #[schema(
        pattern = r"^(?=[0-9.]*[1-9])[0-9]{1,78}(\.[0-9]{1,78})?$",
        example = "1.25"
    )]
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
    #[schema(pattern = "^0x(?=[0-9a-fA-F]{0,39}[1-9a-fA-F])[0-9a-fA-F]{40}$")]
    pub recipient: String,
    /// Token units as a **decimal string** (JSON numbers are refused): greater than
    /// zero, at most 78 digits before and after the point (the pattern). Two more rules
    /// depend on the asset and answer `422`: at most the token's decimals of fractional
    /// digits, trailing zeros included (`AMOUNT_PRECISION_LOSS`: `"1.0000000"` of a
    /// 6-decimals token is refused), and at most 2^256-1 base units
    /// (`AMOUNT_OVERFLOW`).
    #[schema(
        pattern = r"^(?=[0-9.]*[1-9])[0-9]{1,78}(\.[0-9]{1,78})?$",
        example = "12.5"
    )]
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
    /// Token units as a **decimal string** (JSON numbers are refused): greater than
    /// zero, at most 78 digits before and after the point (the pattern). Two more rules
    /// depend on the asset and answer `422`: at most the token's decimals of fractional
    /// digits, trailing zeros included (`AMOUNT_PRECISION_LOSS`: `"1.0000000"` of a
    /// 6-decimals token is refused), and at most 2^256-1 base units
    /// (`AMOUNT_OVERFLOW`).
    #[schema(
        pattern = r"^(?=[0-9.]*[1-9])[0-9]{1,78}(\.[0-9]{1,78})?$",
        example = "12.5"
    )]
    pub amount: String,
    /// The holder whose tokens are burned (a forced burn: `AssetToken.forcedBurn`, which
    /// needs the issuer to hold the token's `burner` role — grant it with
    /// `POST /v1/assets/{id}/grant-role`; without it the operation fails
    /// `EXECUTION_REVERTED` with reason `AccessControlUnauthorizedAccount`). `0x` and 40
    /// hex digits (an EIP-55 checksum is verified when mixed-case); not the zero address.
    /// Absent or null: the issuer burns its own holdings (`AssetToken.burn`).
    #[schema(pattern = "^0x(?=[0-9a-fA-F]{0,39}[1-9a-fA-F])[0-9a-fA-F]{40}$")]
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
    #[schema(pattern = "^0x(?=[0-9a-fA-F]{0,39}[1-9a-fA-F])[0-9a-fA-F]{40}$")]
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
    /// The kind (`asset.create`, `asset.mint`, `asset.transfer`, `asset.pause`,
    /// `asset.unpause`, `asset.burn`, `asset.grant-role`, `asset.revoke-role`); a completed operation's `result.kind` repeats it.
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
    /// The workflow's last progress snapshot (free-form JSON: `phase` and the addresses
    /// known so far, EIP-55 checksummed), or null.
    pub progress: Option<Value>,
    /// The result of a `completed` operation, by kind (its `kind` member repeats the
    /// operation's); null otherwise.
    pub result: Option<OperationResult>,
    /// The failure of a `failed` operation (or the transient reason while
    /// `suspended`; `CANCELLED` saying what landed for a `cancelled` one), or null.
    /// A `completed` operation carries `REORGED_OUT` here when a reorg took back one
    /// of its transactions for good after its verdict (another transaction took its
    /// nonce on the final chain): its effect is absent and Keel does not re-send it.
    pub error: Option<OperationError>,
    /// When the operation was accepted (RFC 3339, UTC; also `milestones.accepted`).
    pub created_at: DateTime<Utc>,
    /// When anything this view shows last changed (RFC 3339, UTC): a cancel, the
    /// operation's state, wait or progress, or one of its transactions.
    pub updated_at: DateTime<Utc>,
    /// When it reached its terminal state (`completed`, `failed` or `cancelled`; RFC
    /// 3339, UTC), or null while it has not (a retried failure clears it).
    pub completed_at: Option<DateTime<Utc>>,
    /// Who started, approved or rejected, retried and cancelled the operation, and
    /// when, as recorded from each caller's authenticated API key (never from a
    /// request body or header). Present on `GET /v1/operations/{id}` and the answers
    /// of the routes that act on one operation; absent in lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<OperationAttribution>,
    /// The code version of the workflow the operation runs under (the release that
    /// started it pins it; old operations keep their version across upgrades), or null
    /// before it is pinned. See docs/versioning.md.
    #[serde(default)]
    pub workflow_version: Option<u32>,
    /// True while the operation is not terminal and no live runner knows its
    /// `workflowVersion`: it waits for a runner that knows that version (deferred,
    /// not failed) and resumes when one runs.
    #[serde(default)]
    pub awaiting_runner: bool,
}

/// The kind of an actor: `USER` (a person: a key issued to one), `SERVICE` (an API
/// key), `SYSTEM` (Keel itself: `reason` says which part), `NONE` (nobody known).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActorKind {
    /// A person.
    User,
    /// A service principal (an API key).
    Service,
    /// Keel itself.
    System,
    /// Nobody known (recorded without an authenticated context).
    None,
}

/// How far an actor can be trusted: `VERIFIED` (an authenticated context), `ABSENT`
/// (none: kind `NONE`), `DEGRADED` (a context its source marked as degraded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AttributionStatus {
    /// Authenticated.
    Verified,
    /// No context.
    Absent,
    /// Degraded context.
    Degraded,
}

/// Who asked for a recorded command. Ids and reasons hold no control, separator or
/// format characters and at most 255 characters (`[unprintable]` when nothing was left).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Actor {
    /// The kind.
    pub kind: ActorKind,
    /// `SERVICE`: the API key's id; `USER`: the person's id; null otherwise.
    #[schema(example = "2b0f9c1e-7d3a-4f6e-9a51-0c8d4e2f1a33")]
    pub id: Option<String>,
    /// `SYSTEM`: which part of Keel (`timer`, `settlement`, `recovery`,
    /// `operator-cli`, ...); for an approval decision `approve` or `reject`; else null.
    pub reason: Option<String>,
    /// The subject the actor acted for, when it differs from `id`; null otherwise.
    pub on_behalf_of: Option<String>,
    /// The attribution status.
    pub status: AttributionStatus,
}

/// A recorded decision: who, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedBy {
    /// Who.
    pub actor: Actor,
    /// When it was recorded (RFC 3339, UTC; database clock).
    pub at: DateTime<Utc>,
}

/// An approval decision (`POST /v1/operations/{id}/approve|reject`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalDecision {
    /// `approved` or `rejected`.
    #[schema(example = "approved")]
    pub decision: String,
    /// Who decided (the approving key), and when.
    pub by: RecordedBy,
}

/// Who asked for what on an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationAttribution {
    /// Who started it (the key that posted the request); null only for an operation
    /// accepted but not yet started.
    pub started_by: Option<RecordedBy>,
    /// The approval decision, or null.
    pub approval: Option<ApprovalDecision>,
    /// Who cancelled it (when the cancel reached its workflow), or null.
    pub cancelled_by: Option<RecordedBy>,
    /// Who retried it, oldest first (Keel's own recovery retries are not listed).
    pub retried_by: Vec<RecordedBy>,
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
    /// A custody sender's transaction waits for an approval at the custody provider
    /// (decided there, not in Keel); `custody` shows the provider's status.
    #[serde(rename = "custody_approval")]
    CustodyApproval,
    /// A runner that knows the operation's workflow version (`workflowVersion`): no
    /// live runner can run it (a release was rolled back). Deferred, not failed; it
    /// does not hold its asset's queue, so the operations a runner can run go ahead.
    Runner,
}

/// A custody sender's transaction as its wait shows it: the provider's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustodyWaitDetail {
    /// The provider (`fireblocks`).
    pub provider: String,
    /// The provider's transaction id, once known.
    pub provider_tx_id: Option<String>,
    /// The provider's last status as read (`PENDING_AUTHORIZATION`, `QUEUED`,
    /// `CONFIRMING`, ...), once read.
    pub status: Option<String>,
    /// The provider's last sub-status, when it gave one.
    pub sub_status: Option<String>,
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
    /// For a transaction of a custody sender (`for` is `transaction` or
    /// `custody_approval`): the provider's view of it. Absent for local-key senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custody: Option<CustodyWaitDetail>,
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
    /// When a node first accepted the transaction (RFC 3339, UTC), or null while none
    /// has.
    pub broadcast_at: Option<DateTime<Utc>>,
    /// The block it mined in, once the queue has its receipt (confirmed or reverted);
    /// null before.
    pub block: Option<u64>,
    /// When Keel recorded its confirmation (RFC 3339, UTC), or null while it is not
    /// confirmed.
    pub confirmed_at: Option<DateTime<Utc>>,
}

/// The indexed milestone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexedMilestone {
    /// The Ledger Index block that reflects the operation.
    pub block: u64,
    /// When the read-after-write passed (RFC 3339, UTC): the operation's completion.
    pub at: Option<DateTime<Utc>>,
}

/// The result of a completed `asset.create`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateResult {
    /// The token contract (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub token_address: String,
    /// The price feed contract (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub feed_address: String,
    /// The Ledger Index block that showed the asset (read-after-write).
    pub indexed_block: u64,
}

/// The result of a completed token operation (one transaction).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenOperationResult {
    /// The transaction that mined (`0x` + 64 hex digits).
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub tx_hash: String,
    /// Its block.
    pub block: u64,
    /// The Ledger Index block that reflects it (read-after-write).
    pub indexed_block: u64,
}

/// The result of a completed `asset.grant-role` or `asset.revoke-role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleChangeResult {
    /// The transaction that mined (`0x` + 64 hex digits).
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub tx_hash: String,
    /// Its block.
    pub block: u64,
    /// The Ledger Index block that reflects it (read-after-write).
    pub indexed_block: u64,
    /// The role: `minter`, `pauser` or `burner`.
    #[schema(pattern = "^(minter|pauser|burner)$")]
    pub role: String,
    /// The account that received or lost it (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: String,
    /// Whether the role changed: false when the account already held (grant) or did
    /// not hold (revoke) it, so the transaction landed without changing it.
    pub changed: bool,
}

/// Declares [`OperationResult`]: one variant per operation kind, named as the kind's
/// [`svc::OperationKind`] variant and grouped by its [`svc::ResultShape`]. The kinds
/// themselves are listed once, in keel-workflows ([`svc::OperationKind::ALL`]); the
/// `kind` filter of `GET /v1/operations` and the OpenAPI `Operation.kind` enum derive
/// from that list, and a test proves this enum has exactly one variant per kind, each
/// serialized as the kind's name.
macro_rules! operation_results {
    (
        create: { $($(#[$cdoc:meta])* $create:ident => $ckind:tt,)* }
        token: { $($(#[$tdoc:meta])* $token:ident => $tkind:tt,)* }
        role: { $($(#[$rdoc:meta])* $role:ident => $rkind:tt,)* }
    ) => {
        /// The result of a completed operation, by `kind` (a `oneOf` keyed by its `kind`
        /// member, which repeats the operation's).
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
        #[serde(tag = "kind")]
        pub enum OperationResult {
            $($(#[$cdoc])* #[serde(rename = $ckind)] $create(AssetCreateResult),)*
            $($(#[$tdoc])* #[serde(rename = $tkind)] $token(TokenOperationResult),)*
            $($(#[$rdoc])* #[serde(rename = $rkind)] $role(RoleChangeResult),)*
        }

        impl OperationResult {
            /// Each variant's serialized `kind` beside the operation kind it stands for
            /// (a test proves the two spell the same and cover every kind).
            #[cfg(test)]
            const VARIANTS: &'static [(&'static str, svc::OperationKind, svc::ResultShape)] = &[
                $(($ckind, svc::OperationKind::$create, svc::ResultShape::AssetCreate),)*
                $(($tkind, svc::OperationKind::$token, svc::ResultShape::TokenOp),)*
                $(($rkind, svc::OperationKind::$role, svc::ResultShape::RoleChange),)*
            ];

            fn create(kind: svc::OperationKind, r: AssetCreateResult) -> Option<Self> {
                match kind {
                    $(svc::OperationKind::$create => Some(Self::$create(r)),)*
                    _ => None,
                }
            }

            fn token(kind: svc::OperationKind, r: TokenOperationResult) -> Option<Self> {
                match kind {
                    $(svc::OperationKind::$token => Some(Self::$token(r)),)*
                    _ => None,
                }
            }

            fn role(kind: svc::OperationKind, r: RoleChangeResult) -> Option<Self> {
                match kind {
                    $(svc::OperationKind::$role => Some(Self::$role(r)),)*
                    _ => None,
                }
            }
        }
    };
}

operation_results! {
    create: {
        /// `asset.create`: the deployed contracts.
        AssetCreate => "asset.create",
    }
    token: {
        /// `asset.mint`: the mint transaction.
        AssetMint => "asset.mint",
        /// `asset.transfer`: the transfer transaction (from the issuer's balance).
        AssetTransfer => "asset.transfer",
        /// `asset.pause`: the pause transaction.
        AssetPause => "asset.pause",
        /// `asset.unpause`: the unpause transaction.
        AssetUnpause => "asset.unpause",
        /// `asset.burn`: the burn (or forced burn) transaction.
        AssetBurn => "asset.burn",
    }
    role: {
        /// `asset.grant-role`: the grant transaction and whether it changed the role.
        AssetGrantRole => "asset.grant-role",
        /// `asset.revoke-role`: the revoke transaction and whether it changed the role.
        AssetRevokeRole => "asset.revoke-role",
    }
}

impl OperationResult {
    /// Every operation kind's name, `asset.create` first (from
    /// [`svc::OperationKind::ALL`]).
    pub fn kinds() -> impl Iterator<Item = &'static str> {
        svc::OperationKind::ALL.iter().map(|k| k.name())
    }

    /// The typed result of a completed operation of `kind` from its workflow output,
    /// read as the kind's [`svc::ResultShape`] (`None` for an output of another shape,
    /// which the workflows' contract rules out).
    pub fn from_output(kind: svc::OperationKind, output: Value) -> Option<Self> {
        match kind.result_shape() {
            svc::ResultShape::AssetCreate => {
                let o: svc::workflows::AssetCreateOutput = serde_json::from_value(output).ok()?;
                Self::create(
                    kind,
                    AssetCreateResult {
                        token_address: address_text(o.token),
                        feed_address: address_text(o.feed),
                        indexed_block: o.indexed_block,
                    },
                )
            }
            svc::ResultShape::RoleChange => {
                let o: svc::workflows::RoleChangeOutput = serde_json::from_value(output).ok()?;
                Self::role(
                    kind,
                    RoleChangeResult {
                        tx_hash: o.tx_hash.to_string(),
                        block: o.block,
                        indexed_block: o.indexed_block,
                        role: o.role.name().to_owned(),
                        account: address_text(o.account),
                        changed: o.changed,
                    },
                )
            }
            svc::ResultShape::TokenOp => {
                let o: svc::workflows::TokenOpOutput = serde_json::from_value(output).ok()?;
                Self::token(
                    kind,
                    TokenOperationResult {
                        tx_hash: o.tx_hash.to_string(),
                        block: o.block,
                        indexed_block: o.indexed_block,
                    },
                )
            }
        }
    }
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
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
    /// The issuer (EIP-55 checksummed): the account that sends every transaction of the
    /// asset and administers its token and feed. `transfer` moves tokens from this
    /// account's balance, so mint to it first. Null until the token is deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub issuer_address: Option<String>,
    /// When the asset was accepted (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When Keel's record of the asset last changed (RFC 3339, UTC): addresses recorded,
    /// its creation's progress. Index state (supply, paused, observation) is not a
    /// change of the record; see `indexedBlock`.
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/assets`: one page of the caller's assets, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssetList {
    /// The assets of this page.
    pub data: Vec<Asset>,
    /// True when more assets follow this page.
    pub has_more: bool,
    /// Pass as `cursor` to get the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// One entry of an operation's history (the decision log of its workflow): what was
/// asked (`command_received`, `retry`, `cancel_requested`, `cancelled`) and what Keel
/// decided (`step_recorded`, `transaction_enqueued`, `timer_set`, `timer_fired`,
/// `timeout`, `wait_entered`, `signal_applied`, `verdict_received`, `child_started`,
/// `suspended`, `completed`, `failed`), with the actor of the command it belongs to and
/// the operation's published state after it. Values a workflow declares personal, and
/// members named like secrets, read `[redacted]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationHistoryEntry {
    /// 1-based position in the operation's history, without gaps.
    #[schema(example = 3)]
    pub seq: i64,
    /// What happened (see above).
    #[schema(example = "step_recorded")]
    pub kind: String,
    /// When it was recorded (RFC 3339, UTC; database clock).
    pub recorded_at: DateTime<Utc>,
    /// Who asked for the command the entry belongs to.
    pub actor: Actor,
    /// Value-free facts of the entry: `name`, `outcome` (`ok`/`err`), `durationMs`
    /// (milliseconds a step took), `replayed` (logged by the segment that ran the
    /// command again after a lost one), `command`, `code`, the wait (`kind`, `name`,
    /// `deadline`), a start's redacted `input`.
    #[schema(value_type = Object)]
    pub detail: Value,
    /// RFC 6902 JSON Patch (`add`, `remove`, `replace` only) from the state after the
    /// previous entry to the state after this one (`[]`: unchanged); null when the entry
    /// holds a full baseline or was truncated.
    #[schema(value_type = Option<Vec<Object>>)]
    pub patch: Option<Value>,
    /// True when the entry holds a full baseline of the state instead of a patch.
    pub baseline: bool,
    /// True when the state change was too large to log (no patch, no baseline).
    pub truncated: bool,
    /// The state after this entry (`status`, `progress`, `wait`, `output`, `error`,
    /// redacted; addresses EIP-55 checksummed as in the operation), reconstructed from the latest baseline and the patches since; null
    /// when unknown (after a truncated entry, until the next baseline).
    #[schema(value_type = Option<Object>)]
    pub state: Option<Value>,
}

/// `GET /v1/operations/{id}/history`: one page of an operation's history, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationHistory {
    /// The entries of this page, in `seq` order.
    pub data: Vec<OperationHistoryEntry>,
    /// True when more entries follow this page.
    pub has_more: bool,
    /// Pass as `cursor` to get the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

impl From<keel_workflows::HistoryEntry> for OperationHistoryEntry {
    fn from(e: keel_workflows::HistoryEntry) -> Self {
        Self {
            seq: e.seq,
            kind: e.kind,
            recorded_at: e.recorded_at,
            actor: (&e.actor).into(),
            detail: checksum_addresses(e.detail),
            patch: e.patch.map(checksum_addresses),
            baseline: e.baseline,
            truncated: e.truncated,
            state: e.state.map(checksum_addresses),
        }
    }
}

/// `GET /v1/operations`: one page of the caller's operations matching the filters,
/// oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationList {
    /// The operations of this page (possibly fewer than `limit`, even none, while
    /// `hasMore` is true: a `state` filter examines a bounded number of operations per
    /// request).
    pub data: Vec<Operation>,
    /// True when more operations may follow this page.
    pub has_more: bool,
    /// Pass as `cursor` (with the same filters) to get the next page; null exactly when
    /// `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// An asset template: the server-side settings assets are created from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Template {
    /// Template id (`templateId` of `POST /v1/assets`).
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub id: String,
    /// EIP-155 chain id of its assets.
    pub chain_id: u64,
    /// Decimals of the price feed's answers.
    pub price_decimals: u8,
    /// Staleness bound installed on the price resolver, seconds.
    pub staleness_bound_seconds: u64,
    /// Mints above this amount (token units, decimal string) wait for an approval; null:
    /// never.
    pub mint_approval_threshold: Option<String>,
    /// How long an approval may take, seconds (then `APPROVAL_EXPIRED`).
    pub approval_ttl_seconds: u64,
    /// Whether missing gas funds pause an operation (a funding request) instead of
    /// failing it `GAS_REQUIRED`.
    pub funding_pause: bool,
    /// How long a funding pause may last, seconds.
    pub funding_deadline_seconds: u64,
    /// When it was created (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When it was last written (RFC 3339, UTC).
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/templates`: one page of the caller's asset templates, by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateList {
    /// The templates of this page.
    pub data: Vec<Template>,
    /// True when more templates follow this page.
    pub has_more: bool,
    /// Pass as `cursor` to get the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
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
    /// The indexed tip when the balance was read (0 when nothing is indexed yet).
    pub indexed_block: u64,
    /// The block the balance reflects: `atBlock` when given (every canonical transfer
    /// at or below it), else the indexed tip.
    pub block: u64,
    /// True when `block` is at or below the chain's finalized block: the balance can
    /// no longer change. False: a reorg may still replace blocks up to `block`.
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded: the balance may
    /// include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
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
    /// When the transaction was queued (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When the request last changed (RFC 3339, UTC; the last funding check included).
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/funding-requests`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FundingRequestList {
    /// The caller's open funding requests, oldest first.
    pub funding_requests: Vec<FundingRequest>,
    /// Open funding requests of Keel's SponsorPaymaster deposit at the EntryPoint (the
    /// paymaster deposit runway, docs/aa.md), oldest first; the platform's, the same for
    /// every organization.
    #[serde(default)]
    pub entry_point_deposits: Vec<EntryPointDepositRequest>,
}

/// A funding request of the SponsorPaymaster's **EntryPoint deposit**: its deposit
/// (`EntryPoint.balanceOf(paymaster)`) is below the configured minimum
/// (`aa.runwayMinimumWei`). Fund it with `EntryPoint.depositTo(paymaster)` (value =
/// at least `requiredWei`); ETH sent to the paymaster's address does not count. Closed
/// by the next check that sees the deposit at the minimum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryPointDepositRequest {
    /// EIP-155 chain id (decimal string).
    #[schema(example = "31337")]
    pub chain_id: String,
    /// Where the funds go: the EntryPoint (resolved address, EIP-55 checksummed),
    /// credited to `paymaster` with `depositTo(paymaster)`.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub entry_point: String,
    /// The deposit's owner: Keel's SponsorPaymaster (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub paymaster: String,
    /// The deposit at the last check, wei (decimal string).
    pub deposit_wei: String,
    /// The configured minimum, wei (decimal string).
    pub minimum_wei: String,
    /// `minimumWei - depositWei` at the last check, wei (decimal string).
    pub required_wei: String,
    /// When the deposit was first seen below the minimum (RFC 3339, UTC).
    pub opened_at: DateTime<Utc>,
    /// The last check (RFC 3339, UTC).
    pub updated_at: DateTime<Utc>,
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
    /// The named person the key is issued to (an id in your directory: employee
    /// number, e-mail, ...): 1 to 255 characters with no control, separator or format
    /// characters (else `422 INVALID_FIELD`). The commands the key asks for are then
    /// recorded as actor `USER` with this id; without it, as `SERVICE` with the key's id.
    /// Set once, here.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255, example = "employee-4711")]
    pub issued_to: Option<String>,
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
pub(crate) fn integral_u64_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
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
    /// The named person the key is issued to (its commands are recorded as actor `USER`
    /// with this id), or null for a service key.
    pub issued_to: Option<String>,
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
            issued_to: k.issued_to,
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
            svc::WaitFor::CustodyApproval => Self::CustodyApproval,
            svc::WaitFor::Runner => Self::Runner,
        }
    }
}

impl From<svc::OperationView> for Operation {
    fn from(v: svc::OperationView) -> Self {
        let result = v
            .result
            .filter(|_| v.state == svc::OperationState::Completed)
            .and_then(|o| OperationResult::from_output(v.kind, o));
        Self {
            id: v.id,
            asset_id: v.asset_id,
            state: v.state.into(),
            queued_behind: v.queued_behind,
            wait: v.wait.map(Into::into),
            cancel_requested_at: v.cancel_requested_at,
            milestones: v.milestones.into(),
            progress: v.progress.map(checksum_addresses),
            result,
            error: v.error.map(Into::into),
            created_at: v.created_at,
            updated_at: v.updated_at,
            completed_at: v.completed_at,
            kind: v.kind.name().to_owned(),
            attribution: v.attribution.map(Into::into),
            workflow_version: v.workflow_version,
            awaiting_runner: v.awaiting_runner,
        }
    }
}

impl From<&svc::Actor> for Actor {
    fn from(a: &svc::Actor) -> Self {
        Self {
            kind: match a.kind() {
                svc::ActorKind::User => ActorKind::User,
                svc::ActorKind::Service => ActorKind::Service,
                svc::ActorKind::System => ActorKind::System,
                svc::ActorKind::None => ActorKind::None,
            },
            id: a.id().map(str::to_owned),
            reason: a.reason().map(str::to_owned),
            on_behalf_of: a.on_behalf_of_id().map(str::to_owned),
            status: match a.status() {
                svc::AttributionStatus::Verified => AttributionStatus::Verified,
                svc::AttributionStatus::Absent => AttributionStatus::Absent,
                svc::AttributionStatus::Degraded => AttributionStatus::Degraded,
            },
        }
    }
}

impl From<svc::RecordedBy> for RecordedBy {
    fn from(r: svc::RecordedBy) -> Self {
        Self {
            actor: (&r.actor).into(),
            at: r.at,
        }
    }
}

impl From<svc::OperationAttribution> for OperationAttribution {
    fn from(a: svc::OperationAttribution) -> Self {
        Self {
            started_by: a.started.map(Into::into),
            approval: a.approval.map(|d| ApprovalDecision {
                decision: if d.approved { "approved" } else { "rejected" }.to_owned(),
                by: d.by.into(),
            }),
            cancelled_by: a.cancelled.map(Into::into),
            retried_by: a.retried.into_iter().map(Into::into).collect(),
        }
    }
}

/// `v` with every string that is an address in lowercase hex (`0x` + 40 lowercase hex
/// digits, the form alloy's serde writes) in its EIP-55 checksummed form; the free-form
/// progress snapshot holds addresses that way.
fn checksum_addresses(v: Value) -> Value {
    match v {
        Value::String(s) => {
            let lower_hex = s.len() == 42
                && s.starts_with("0x")
                && s[2..]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            match s.parse::<alloy_primitives::Address>() {
                Ok(a) if lower_hex => Value::String(address_text(a)),
                _ => Value::String(s),
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(checksum_addresses).collect()),
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k, checksum_addresses(v)))
                .collect(),
        ),
        other => other,
    }
}

impl From<svc::WaitView> for OperationWait {
    fn from(w: svc::WaitView) -> Self {
        Self {
            waits_for: w.waits_for.into(),
            until: w.until,
            step: w.link,
            last_broadcast_error: w.last_broadcast_error,
            custody: w.custody.map(|c| CustodyWaitDetail {
                provider: c.provider,
                provider_tx_id: c.provider_tx_id,
                status: c.status,
                sub_status: c.sub_status,
            }),
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
            broadcast_at: t.broadcast_at,
            block: t.block,
            confirmed_at: t.confirmed_at,
        }
    }
}

impl From<svc::IndexedMilestone> for IndexedMilestone {
    fn from(i: svc::IndexedMilestone) -> Self {
        Self {
            block: i.block,
            at: i.at,
        }
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

/// An address as served: EIP-55 checksummed (`0x` + 40 hex digits, mixed case; the
/// chain-agnostic checksum of EIP-55, not EIP-1191's chain-specific one).
pub fn address_text(a: alloy_primitives::Address) -> String {
    a.to_checksum(None)
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
            index_rebuilding: a.index_rebuilding,
            issuer_address: a.issuer_address.map(address_text),
            created_at: a.created_at,
            updated_at: a.updated_at,
        }
    }
}

impl From<svc::TemplateView> for Template {
    fn from(v: svc::TemplateView) -> Self {
        let t = v.template;
        Self {
            id: t.id,
            chain_id: t.chain_id,
            price_decimals: t.price_decimals,
            staleness_bound_seconds: t.staleness_bound_seconds,
            mint_approval_threshold: t.mint_approval_threshold,
            approval_ttl_seconds: t.approval_ttl_seconds,
            funding_pause: t.funding_pause,
            funding_deadline_seconds: t.funding_deadline_seconds,
            created_at: v.created_at,
            updated_at: v.updated_at,
        }
    }
}

/// Builds the list DTOs from a [`crate::page::Page`] of their items.
macro_rules! from_page {
    ($($list:ident of $item:ident),*) => {$(
        impl From<crate::page::Page<$item>> for $list {
            fn from(p: crate::page::Page<$item>) -> Self {
                Self {
                    data: p.data,
                    has_more: p.has_more,
                    next_cursor: p.next_cursor,
                }
            }
        }
    )*};
}

from_page!(
    AssetList of Asset,
    OperationList of Operation,
    TemplateList of Template,
    OperationHistory of OperationHistoryEntry
);

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
            block: b.block,
            finalized: b.finalized,
            index_degraded: b.index_degraded,
            index_rebuilding: b.index_rebuilding,
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
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

impl From<keel_aa::service::DepositRequestView> for EntryPointDepositRequest {
    fn from(d: keel_aa::service::DepositRequestView) -> Self {
        Self {
            chain_id: d.chain_id.to_string(),
            entry_point: d.entry_point.to_checksum(None),
            paymaster: d.paymaster.to_checksum(None),
            deposit_wei: d.deposit_wei,
            minimum_wei: d.minimum_wei,
            required_wei: d.required_wei,
            opened_at: d.opened_at,
            updated_at: d.updated_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Address, B256};

    /// Hashes are served as `0x` + 64 lowercase hex digits and addresses EIP-55
    /// checksummed, also inside the free-form progress snapshot.
    #[test]
    fn hashes_and_addresses_have_their_documented_form() {
        let t = TxMilestone::from(svc::TxMilestone {
            link: "mint#2".into(),
            tx_hash: Some(B256::repeat_byte(0xab)),
            nonce: Some(7),
            broadcast: true,
            block: Some(9),
            broadcast_at: None,
            confirmed_at: None,
        });
        assert_eq!(t.step, "mint#2");
        assert_eq!(t.block, Some(9));
        assert_eq!(
            t.tx_hash.as_deref(),
            Some(&*format!("0x{}", "ab".repeat(32)))
        );
        let a: Address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
            .parse()
            .unwrap();
        assert_eq!(
            address_text(a),
            "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
        );
        // alloy's serde and `to_string` write an address in lowercase hex: what
        // `checksum_addresses` rewrites in progress snapshots.
        let progress = serde_json::json!({"phase": "x", "feed": a, "list": [a], "n": "0xabc"});
        let fixed = checksum_addresses(progress);
        assert_eq!(fixed["feed"], serde_json::json!(address_text(a)));
        assert_eq!(fixed["list"][0], serde_json::json!(address_text(a)));
        assert_eq!(fixed["n"], "0xabc");
    }

    /// Every workflow the runner registers is an operation kind with a documented
    /// result, and no other kind is listed.
    #[test]
    fn every_workflow_is_a_kind_with_a_result() {
        let mut kinds: Vec<_> = OperationResult::kinds().collect();
        let mut workflows = svc::workflows::WORKFLOWS.to_vec();
        kinds.sort_unstable();
        workflows.sort_unstable();
        assert_eq!(kinds, workflows);
        // One result variant per kind, serialized as the kind's name, of its shape.
        let mut covered: Vec<_> = OperationResult::VARIANTS.iter().map(|v| v.1).collect();
        covered.sort_unstable();
        covered.dedup();
        assert_eq!(covered.len(), OperationResult::VARIANTS.len());
        assert_eq!(covered.as_slice(), svc::OperationKind::ALL);
        for (name, kind, shape) in OperationResult::VARIANTS {
            assert_eq!(*name, kind.name());
            assert_eq!(*shape, kind.result_shape(), "{kind}");
        }
    }

    /// A completed operation's output becomes the result variant of its kind; an
    /// unknown kind has none.
    #[test]
    fn results_are_typed_by_kind() {
        let out = serde_json::json!({
            "txHash": format!("0x{}", "cd".repeat(32)), "block": 5, "indexedBlock": 6
        });
        let r =
            OperationResult::from_output(svc::OperationKind::AssetTransfer, out.clone()).unwrap();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "asset.transfer");
        assert_eq!(v["block"], 5);
        // An output of another shape has no result (the workflows' contract rules it out).
        assert!(OperationResult::from_output(svc::OperationKind::AssetCreate, out).is_none());
        let token = Address::repeat_byte(0x11);
        let feed = Address::repeat_byte(0x22);
        let out = serde_json::json!({"token": token, "feed": feed, "indexedBlock": 3});
        let v = serde_json::to_value(
            OperationResult::from_output(svc::OperationKind::AssetCreate, out).unwrap(),
        )
        .unwrap();
        assert_eq!(v["kind"], "asset.create");
        assert_eq!(v["tokenAddress"], address_text(token));
    }
}
