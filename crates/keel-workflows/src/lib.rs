//! # keel-workflows
//!
//! Keel's asset-issuance workflows, the operations service the Platform API calls, and
//! the settlement sink that connects the transaction queue to the workflows.
//!
//! - [`workflows`]: `asset.create` (feed, token, first observation, staleness bound,
//!   unpause, read-after-write — fail-closed), `asset.mint`, `asset.transfer`,
//!   `asset.pause`, `asset.unpause`, `asset.burn` (the issuer's holdings, or a forced
//!   burn of a holder's with the token's `BURNER_ROLE`), `asset.grant-role`,
//!   `asset.revoke-role` (one at a time per asset, optional approval wait).
//!   [`workflows::register_all`] registers exactly [`workflows::WORKFLOWS`];
//! - [`kinds`]: [`OperationKind`], the one list of operation kinds (workflow, route
//!   segment, result shape); every other list is derived from it or tested equal;
//!   [`workflows::contract`] holds their inputs, outputs, signals and typed failure.
//! - [`ops`]: [`ops::Ops`], the API's service: idempotent acceptance (organization +
//!   `Idempotency-Key`, request hash), the operation status projection (state, wait,
//!   milestones accepted → submitted → confirmed → indexed, result, typed error),
//!   approvals, retries (a retryable transaction failure is sent again as a new,
//!   separately keyed attempt once the operation is retried; landed writes never are),
//!   cancels, the operation, asset and template lists (keyset pagination: each returns
//!   `limit + 1` items), asset, balance and funding-request reads, readiness.
//! - [`store`]: every SQL statement on this crate's tables, noun-first, over any
//!   executor. The workflows and the service both use it; neither uses the other's
//!   internals (the service starts workflows, the workflows never call the service).
//! - [`tenancy`]: organizations, API keys (stored as SHA-256 of a 256-bit token, with
//!   scopes, rotation with an optional overlap, revocation), asset templates.
//! - [`verdicts`]: [`VerdictSink`], the queue's settlement sink: records each verdict
//!   as its workflow's signal `tx.<link>` in the transaction that settles the request.
//! - [`events`]: the operations' webhook events ([`OperationEvents`]: the engine's
//!   transition hook; also used by acceptance and the verdict sink), written in the
//!   transaction of the change they report.
//! - [`env`]: what the workflow bodies act through ([`env::WorkflowEnv`]: database,
//!   operator, attribution suffix, per-chain [`env::ChainContext`]).
//! - [`platform`]: Keel's platform contract addresses on a chain.
//!
//! ## Vocabulary
//! - *step*: only a journal step of a workflow (`ctx.step`).
//! - *write*: one named on-chain write of a workflow (`create-feed`, `mint`, ...).
//! - *link*: the link of one attempt of a write to its queue request, `<write>` or
//!   `<write>#<n>` (column `operation_tx.step`; JSON name `step` in the API).
//! - *recipient*: the receiver of tokens (journaled JSON name `to`); `to` otherwise
//!   only as the queue's transaction field.
//! - *tx_hash*: a transaction hash (`hash` only in the queue's verdict type).
//!
//! Tables: `migrations/0007_platform_api.sql` (+ `0011`, `0020`, `0022`, `0023`, `0027`, `0029`, `0033`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod compliance;
pub mod env;
mod error;
pub mod events;
pub mod kinds;
pub mod ops;
pub mod platform;
pub mod store;
pub mod tenancy;
pub mod verdicts;
pub mod workflows;

pub use env::{ChainContext, SenderPool, WorkflowEnv};
pub use error::{OpsError, Result};
pub use events::{OperationEvents, Renderer};
/// Who asked for a command (the engine's attribution types, re-exported for the API).
pub use keel_durable::{Actor, ActorKind, AttributionStatus, HistoryEntry};
pub use kinds::{OperationKind, ResultShape, UnknownKind};
pub use ops::accept::{Accepted, BatchRecipient, NewAsset, TokenRequest};
pub use ops::ledger::{HolderView, HoldersView, SupplyView, TransferView, TransfersView};
pub use ops::read::{
    AssetKey, AssetStatus, AssetView, BalanceView, FundingRequestView, ObservationView,
    QueuedBehindFundingView, TemplateView,
};
pub use ops::snapshots::{PendingReason, SnapshotHoldersView, SnapshotView};
pub use ops::view::{
    ApprovalRecord, CustodyWait, ErrorView, IndexedMilestone, Milestones, OPERATION_SCAN_BATCH,
    OPERATION_SCAN_BUDGET, OperationAttribution, OperationFilter, OperationKey, OperationList,
    OperationState, OperationView, RecordedBy, TxMilestone, WaitFor, WaitView,
};
pub use ops::{MAX_INPUT_DEPTH, MAX_WAIT, NotReady, Ops, input_too_deep};
pub use platform::PlatformAddresses;
pub use tenancy::{ApiKeyView, Caller, Credential, RotatedApiKey, Scope, Scopes};
pub use verdicts::VerdictSink;
pub use workflows::TokenRole;

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_counter!(
        "keel_workflows_verdicts_delivered_total",
        ::metrics::Unit::Count,
        "Transaction verdicts delivered to workflows (count)."
    );
    ::metrics::describe_counter!(
        "keel_webhook_mark_unreadable_total",
        ::metrics::Unit::Count,
        "Operations whose stored webhook mark could not be read, so their current events were written again (count; webhooks are at least once)."
    );
}
