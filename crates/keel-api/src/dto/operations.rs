//! Operations: their state, attribution, wait, milestones, typed results
//! ([`OperationResult`]), errors, history and lists.

use chrono::{DateTime, Utc};
use keel_workflows as svc;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

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
    /// `asset.unpause`, `asset.burn`, `asset.grant-role`, `asset.revoke-role`,
    /// `distribution.pay`, `organization.system`); a completed operation's `result.kind` repeats it.
    #[schema(example = "asset.create")]
    pub kind: String,
    /// The asset it acts on; null for an operation on no asset (`organization.system`).
    pub asset_id: Option<Uuid>,
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
    /// A paused distribution waits for `POST /v1/distributions/{id}/resume`.
    Resume,
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

/// The result of a completed `distribution.pay`: its payments tallied (per holder:
/// `GET /v1/distributions/{id}/payments`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributionResult {
    /// Holders paid.
    pub holders_paid: u64,
    /// Holders whose payment the paying token or the recipient refused (not paid).
    pub holders_refused: u64,
    /// Base units of the paying token paid (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub amount_paid: String,
    /// Base units owed to refused holders, not paid.
    #[schema(pattern = "^[0-9]+$")]
    pub amount_refused: String,
    /// Base units the rounding rule left unpaid (they stay with the paying account).
    #[schema(pattern = "^[0-9]+$")]
    pub remainder: String,
    /// Batch transactions sent and confirmed.
    pub batches: u32,
}

/// The result of a completed `organization.system`: the deployed system (also
/// `GET /v1/organizations/{id}/systems`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgSystemResult {
    /// The system's id (this operation's id).
    pub system_id: Uuid,
    /// Its `OrgAssetFactory` (EIP-55 checksummed): deploys the organization's assets.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub factory_address: String,
    /// Its `IdentityRegistry`: the eligibility registry.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub registry_address: String,
    /// Its `Compliance` contract.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub compliance_address: String,
    /// The system it replaced, or null for the organization's first on the chain (and
    /// for a superseded deployment).
    pub replaced: Option<Uuid>,
    /// The system of a deployment accepted later that finished first, or null: this
    /// deployment's contracts exist but it never became the organization's system.
    pub superseded_by: Option<Uuid>,
    /// The block of the deployment transaction.
    pub deployed_block: u64,
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
        distribution: { $($(#[$ddoc:meta])* $dist:ident => $dkind:tt,)* }
        system: { $($(#[$sdoc:meta])* $sys:ident => $skind:tt,)* }
    ) => {
        /// The result of a completed operation, by `kind` (a `oneOf` keyed by its `kind`
        /// member, which repeats the operation's).
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
        #[serde(tag = "kind")]
        pub enum OperationResult {
            $($(#[$cdoc])* #[serde(rename = $ckind)] $create(AssetCreateResult),)*
            $($(#[$tdoc])* #[serde(rename = $tkind)] $token(TokenOperationResult),)*
            $($(#[$rdoc])* #[serde(rename = $rkind)] $role(RoleChangeResult),)*
            $($(#[$ddoc])* #[serde(rename = $dkind)] $dist(DistributionResult),)*
            $($(#[$sdoc])* #[serde(rename = $skind)] $sys(OrgSystemResult),)*
        }

        impl OperationResult {
            /// Each variant's serialized `kind` beside the operation kind it stands for
            /// (a test proves the two spell the same and cover every kind).
            #[cfg(test)]
            const VARIANTS: &'static [(&'static str, svc::OperationKind, svc::ResultShape)] = &[
                $(($ckind, svc::OperationKind::$create, svc::ResultShape::AssetCreate),)*
                $(($tkind, svc::OperationKind::$token, svc::ResultShape::TokenOp),)*
                $(($rkind, svc::OperationKind::$role, svc::ResultShape::RoleChange),)*
                $(($dkind, svc::OperationKind::$dist, svc::ResultShape::Distribution),)*
                $(($skind, svc::OperationKind::$sys, svc::ResultShape::OrgSystem),)*
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

            fn distribution(kind: svc::OperationKind, r: DistributionResult) -> Option<Self> {
                match kind {
                    $(svc::OperationKind::$dist => Some(Self::$dist(r)),)*
                    _ => None,
                }
            }

            fn system(kind: svc::OperationKind, r: OrgSystemResult) -> Option<Self> {
                match kind {
                    $(svc::OperationKind::$sys => Some(Self::$sys(r)),)*
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
        /// `asset.set-compliance`: the `Compliance.setRules` transaction.
        AssetSetCompliance => "asset.set-compliance",
        /// `asset.freeze`: the freeze transaction (address or partial).
        AssetFreeze => "asset.freeze",
        /// `asset.unfreeze`: the unfreeze transaction (address or partial).
        AssetUnfreeze => "asset.unfreeze",
        /// `asset.forced-transfer`: the forced transfer transaction.
        AssetForcedTransfer => "asset.forced-transfer",
        /// `asset.recover`: the last of its writes (the lost wallet's registry entry
        /// removed, or the recovery itself when the wallet was not registered).
        AssetRecover => "asset.recover",
        /// `asset.batch-mint`: the one batch mint transaction.
        AssetBatchMint => "asset.batch-mint",
        /// `asset.batch-transfer`: the one batch transfer transaction.
        AssetBatchTransfer => "asset.batch-transfer",
        /// `investor.set`: the `IdentityRegistry.setInvestor` transaction.
        InvestorSet => "investor.set",
    }
    role: {
        /// `asset.grant-role`: the grant transaction and whether it changed the role.
        AssetGrantRole => "asset.grant-role",
        /// `asset.revoke-role`: the revoke transaction and whether it changed the role.
        AssetRevokeRole => "asset.revoke-role",
    }
    distribution: {
        /// `distribution.pay`: the payments of the distribution tallied.
        DistributionPay => "distribution.pay",
    }
    system: {
        /// `organization.system`: the deployed organization system.
        OrgSystemDeploy => "organization.system",
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
            svc::ResultShape::OrgSystem => {
                let o: svc::workflows::OrgSystemOutput = serde_json::from_value(output).ok()?;
                Self::system(
                    kind,
                    OrgSystemResult {
                        system_id: o.system_id,
                        factory_address: address_text(o.factory),
                        registry_address: address_text(o.registry),
                        compliance_address: address_text(o.compliance),
                        replaced: o.replaced,
                        superseded_by: o.superseded_by,
                        deployed_block: o.deployed_block,
                    },
                )
            }
            svc::ResultShape::Distribution => {
                let o: svc::workflows::DistributionOutput = serde_json::from_value(output).ok()?;
                Self::distribution(
                    kind,
                    DistributionResult {
                        holders_paid: o.holders_paid,
                        holders_refused: o.holders_refused,
                        amount_paid: o.amount_paid.to_string(),
                        amount_refused: o.amount_refused.to_string(),
                        remainder: o.remainder.to_string(),
                        batches: o.batches,
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::Address;

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
