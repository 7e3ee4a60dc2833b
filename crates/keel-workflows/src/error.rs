//! [`OpsError`]: what the operations service refuses, with stable codes.

use keel_units::UnitsError;

/// An error of the operations service. Every variant has a stable machine-readable
/// [`OpsError::code`], a [`OpsError::is_retryable`] flag and a value-free message: no SQL,
/// no payload values, no secrets. (The HTTP status of each is the Platform API's
/// business: `keel-api` maps them.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The bearer token is missing, malformed, unknown or revoked. Code `UNAUTHENTICATED`.
    #[error("missing or invalid API key")]
    Unauthenticated,
    /// The resource does not exist **for the caller's organization** (another
    /// organization's resources are reported the same way). Code `NOT_FOUND`.
    #[error("{what} not found")]
    NotFound {
        /// What was looked up (`asset`, `operation`, `template`).
        what: &'static str,
    },
    /// The idempotency key was used before with a different request. Code
    /// `IDEMPOTENCY_CONFLICT`.
    #[error("the idempotency key was used with a different request")]
    IdempotencyConflict,
    /// A request field is invalid. Code `INVALID_FIELD`.
    #[error("field `{field}`: {reason}")]
    InvalidField {
        /// The field's name in the request.
        field: &'static str,
        /// The rule it broke (never its value).
        reason: &'static str,
    },
    /// An amount or price could not be read. Code: the units error's code
    /// (`AMOUNT_MALFORMED`, `AMOUNT_NEGATIVE`, `AMOUNT_PRECISION_LOSS`, ...).
    #[error("field `{field}`: {source}")]
    Amount {
        /// The field's name in the request.
        field: &'static str,
        /// What was wrong.
        #[source]
        source: UnitsError,
    },
    /// A role name the token does not define among the roles Keel manages (`minter`,
    /// `pauser`, `burner`). Code `UNKNOWN_ROLE`.
    #[error("unknown role: the token's manageable roles are minter, pauser and burner")]
    UnknownRole,
    /// The asset is not ready for this operation (its creation has not completed).
    /// Code `ASSET_NOT_READY`.
    #[error("the asset has not finished its creation")]
    AssetNotReady,
    /// The template's chain is not configured on this deployment. Code
    /// `CHAIN_NOT_CONFIGURED`.
    #[error("the template's chain is not configured")]
    ChainNotConfigured,
    /// An approval decision by the key that requested the operation. Code
    /// `APPROVAL_SAME_KEY`.
    #[error("an operation must be approved or rejected by a different API key")]
    ApprovalSameKey,
    /// The operation does not wait for an approval (none needed, already decided, or
    /// ended). Code `APPROVAL_NOT_PENDING`.
    #[error("the operation is not waiting for an approval")]
    ApprovalNotPending,
    /// Only a `failed` or `suspended` operation can be retried. Code
    /// `OPERATION_NOT_RETRYABLE`.
    #[error("only a failed or suspended operation can be retried")]
    NotRetryable,
    /// The operation failed with a code a retry cannot change (`EXECUTION_REVERTED`,
    /// `APPROVAL_REJECTED`, ...): correct the cause and submit a new operation with a new
    /// `Idempotency-Key`. Code `OPERATION_NOT_RETRYABLE`; `detail` names the failure code.
    #[error(
        "the operation failed with {code}, which a retry cannot change; submit a new operation"
    )]
    FailureNotRetryable {
        /// The operation's failure code (a Keel code, never a value).
        code: String,
    },
    /// The approval deadline of the operation has passed: a decision has no effect any
    /// more. Code `APPROVAL_EXPIRED`.
    #[error("the approval deadline of the operation has passed")]
    ApprovalExpired,
    /// The operation has ended (`completed`, `failed` or `cancelled`): there is nothing
    /// to cancel. Code `OPERATION_ENDED`.
    #[error("the operation has ended")]
    OperationEnded,
    /// The API key lacks the scope an action needs (e.g. a key that creates another
    /// key may grant only scopes it holds itself). Code `INSUFFICIENT_SCOPE`.
    #[error("the API key lacks the scope this action needs")]
    InsufficientScope,
    /// The API key is revoked: it can be listed but not rotated. Code
    /// `API_KEY_REVOKED`.
    #[error("the API key is revoked")]
    ApiKeyRevoked,
    /// The durable engine refused (bounds) or failed. Code `ENGINE_*` or
    /// `SERVICE_UNAVAILABLE` when retryable.
    #[error("workflow engine: {0}")]
    Engine(#[from] keel_durable::DurableError),
    /// The index could not be read. Code `INDEX_UNAVAILABLE`; retryable.
    #[error("ledger index unavailable")]
    Index(#[from] keel_index::IndexError),
    /// The index has not reached the requested block within the wait. Code
    /// `INDEX_BEHIND`; retryable.
    #[error("the ledger index has not reached the requested block yet")]
    IndexBehind,
    /// The index did not reach the requested block within the wait and its chain is
    /// marked degraded (a reorg below a block Keel recorded as final): it will not get
    /// there until an operator re-indexes the chain (`keel index reindex --chain NAME`
    /// or `POST /v1/chains/{chain}/index/reindex`). Code `INDEX_DEGRADED`; retryable
    /// once the chain is re-indexed.
    #[error(
        "the ledger index of this chain is degraded (a reorg below a block it recorded as final) \
         and will not reach the requested block until an operator re-indexes the chain \
         (keel index reindex, or POST /v1/chains/{{chain}}/index/reindex)"
    )]
    IndexDegraded,
    /// A read `atBlock` is above the Ledger Index's indexed tip of the asset's chain (or
    /// nothing is indexed yet): the index cannot answer for that block exactly. Code
    /// `BLOCK_NOT_INDEXED`; the same read can succeed once the index has reached it.
    #[error("the requested block is above the ledger index's indexed tip")]
    BlockNotIndexed {
        /// The indexed tip, if any block was indexed.
        indexed: Option<u64>,
    },
    /// The snapshot is still pending (its block is not final on its chain, or the index
    /// has not caught up to it): what was asked (an export) exists only for a final
    /// snapshot. Code `SNAPSHOT_NOT_FINAL`; the same request can succeed once it is.
    #[error("the snapshot is not final yet")]
    SnapshotNotFinal,
    /// The organization's system on the chain is switched off by an operator: it
    /// creates no assets until it is switched on. Code `SYSTEM_DISABLED`.
    #[error("the organization's system is disabled")]
    SystemDisabled,
    /// The system's contracts were never deployed (its deployment failed before its
    /// transaction landed): there is nothing to switch on or off. Code `SYSTEM_NOT_DEPLOYED`.
    #[error("the system has no deployed contracts")]
    SystemNotDeployed,
    /// The asset was not created through an organization system: it has no compliance
    /// rules to set. Code `ASSET_NOT_REGULATED`.
    #[error("the asset has no organization system's compliance contract")]
    AssetNotRegulated,
    /// The asset's compliance contract, read at the latest block, refuses the mint or
    /// transfer: `code` is one of [`crate::compliance::REFUSAL_CODES`]
    /// (`COMPLIANCE_NOT_ELIGIBLE`, ...). Nothing was accepted.
    #[error("the asset's compliance rules refuse this mint or transfer (the code names the rule)")]
    ComplianceRefused {
        /// The typed refusal code.
        code: &'static str,
    },
    /// A batch mint or transfer names more recipients than its template allows
    /// (`batchMaxRecipients`). Code `BATCH_TOO_LARGE`. Nothing was accepted.
    #[error("the batch names more recipients than the asset's template allows ({max})")]
    BatchTooLarge {
        /// The template's limit.
        max: u16,
    },
    /// The database failed. Code `SERVICE_UNAVAILABLE`; retryable when transient.
    #[error("database: {0}")]
    Store(#[from] keel_store::StoreError),
}

impl From<sqlx::Error> for OpsError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(keel_store::StoreError::from(e))
    }
}

impl OpsError {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::NotFound { .. } => "NOT_FOUND",
            Self::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            Self::InvalidField { .. } => "INVALID_FIELD",
            Self::Amount { source, .. } => source.code(),
            Self::UnknownRole => "UNKNOWN_ROLE",
            Self::AssetNotReady => "ASSET_NOT_READY",
            Self::ChainNotConfigured => "CHAIN_NOT_CONFIGURED",
            Self::ApprovalSameKey => "APPROVAL_SAME_KEY",
            Self::ApprovalNotPending => "APPROVAL_NOT_PENDING",
            Self::NotRetryable | Self::FailureNotRetryable { .. } => "OPERATION_NOT_RETRYABLE",
            Self::ApprovalExpired => "APPROVAL_EXPIRED",
            Self::OperationEnded => "OPERATION_ENDED",
            Self::InsufficientScope => "INSUFFICIENT_SCOPE",
            Self::ApiKeyRevoked => "API_KEY_REVOKED",
            Self::SystemDisabled => "SYSTEM_DISABLED",
            Self::AssetNotRegulated => "ASSET_NOT_REGULATED",
            Self::ComplianceRefused { code } => code,
            Self::BatchTooLarge { .. } => "BATCH_TOO_LARGE",
            Self::SystemNotDeployed => "SYSTEM_NOT_DEPLOYED",
            Self::Engine(e) => match e {
                keel_durable::DurableError::InvalidInput(_) => "PAYLOAD_TOO_LARGE_OR_DEEP",
                keel_durable::DurableError::IdempotencyConflict { .. } => "IDEMPOTENCY_CONFLICT",
                _ => "SERVICE_UNAVAILABLE",
            },
            Self::Index(_) => "INDEX_UNAVAILABLE",
            Self::IndexBehind => "INDEX_BEHIND",
            Self::IndexDegraded => "INDEX_DEGRADED",
            Self::BlockNotIndexed { .. } => "BLOCK_NOT_INDEXED",
            Self::SnapshotNotFinal => "SNAPSHOT_NOT_FINAL",
            Self::Store(_) => "SERVICE_UNAVAILABLE",
        }
    }

    /// Whether the same request may succeed later: true for the failures of a
    /// dependency (database, engine, index) and for [`OpsError::IndexBehind`]; false for
    /// every refusal of the request itself (including the engine's payload bound and
    /// its idempotency conflict).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Engine(
                keel_durable::DurableError::InvalidInput(_)
                | keel_durable::DurableError::IdempotencyConflict { .. },
            ) => false,
            Self::Engine(_)
            | Self::Index(_)
            | Self::IndexBehind
            | Self::IndexDegraded
            | Self::Store(_) => true,
            Self::Unauthenticated
            | Self::SystemDisabled
            | Self::SystemNotDeployed
            | Self::AssetNotRegulated
            | Self::ComplianceRefused { .. }
            | Self::BatchTooLarge { .. }
            | Self::NotFound { .. }
            | Self::IdempotencyConflict
            | Self::InvalidField { .. }
            | Self::Amount { .. }
            | Self::UnknownRole
            | Self::AssetNotReady
            | Self::ChainNotConfigured
            | Self::ApprovalSameKey
            | Self::ApprovalNotPending
            | Self::NotRetryable
            | Self::FailureNotRetryable { .. }
            | Self::ApprovalExpired
            | Self::OperationEnded
            | Self::InsufficientScope
            | Self::ApiKeyRevoked
            | Self::BlockNotIndexed { .. }
            | Self::SnapshotNotFinal => false,
        }
    }

    /// A value-free description for clients (`detail` of a problem document). Server
    /// failures are summarized without their internal cause.
    pub fn detail(&self) -> String {
        match self {
            Self::Engine(_) | Self::Store(_) | Self::Index(_) if self.is_retryable() => {
                "a dependency is temporarily unavailable; retry later".to_owned()
            }
            other => other.to_string(),
        }
    }
}

/// `Result` with [`OpsError`].
pub type Result<T, E = OpsError> = std::result::Result<T, E>;
