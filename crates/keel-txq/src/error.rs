//! Errors of the queue.

use keel_store::StoreError;

/// Errors of [`crate::TxQueue`]. Messages are value-free.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxqError {
    /// The idempotency key is already used by a request with another payload.
    #[error("idempotency key already used with a different transaction")]
    IdempotencyConflict,
    /// A request field is invalid (names the field).
    #[error("invalid request field `{0}`")]
    InvalidRequest(&'static str),
    /// The queue's configuration breaks a rule (names the setting).
    #[error("invalid queue setting `{key}`: {reason}")]
    Config {
        /// The setting.
        key: &'static str,
        /// The rule.
        reason: &'static str,
    },
    /// No signer is configured for the sender.
    #[error("no signer for this sender")]
    UnknownSender,
    /// No request with that id.
    #[error("transaction request not found")]
    NotFound,
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored row of the queue does not decode (a hash or address of the wrong
    /// length, an unknown custody phase, a negative chain id): names the table, never
    /// the values. Not retryable: the row must be repaired.
    #[error("unreadable stored row in `{table}`")]
    UnreadableRow {
        /// The table read.
        table: &'static str,
    },
    /// The chain failed in a way the pass could not absorb.
    #[error(transparent)]
    Chain(#[from] keel_chain::ChainError),
    /// The L1 data fee oracle of an OP Stack chain (`GasPriceOracle.getL1Fee`) answered
    /// nothing decodable (no code at the configured address, a different contract).
    /// Retryable: the pass backs off and requests stay queued, nothing is signed
    /// without its L1 fee counted.
    #[error("the chain's L1 data fee oracle answered no fee")]
    L1FeeUnreadable,
    /// Signing failed.
    #[error(transparent)]
    Signer(#[from] crate::signer::SignerError),
    /// A custody provider call failed (see [`keel_custody::CustodyError::class`]).
    #[error(transparent)]
    Custody(#[from] keel_custody::CustodyError),
    /// The [`crate::SettlementSink`] failed; nothing was settled (retrying can succeed).
    #[error(transparent)]
    Sink(#[from] crate::settlement::SettlementSinkError),
}

impl TxqError {
    /// True when retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            TxqError::Store(e) => e.is_retryable(),
            TxqError::Chain(e) => e.is_retryable(),
            TxqError::Signer(e) => e.is_retryable(),
            TxqError::Sink(_) | TxqError::L1FeeUnreadable => true,
            TxqError::Custody(e) => e.is_retryable(),
            _ => false,
        }
    }
}

impl From<sqlx::Error> for TxqError {
    fn from(e: sqlx::Error) -> Self {
        TxqError::Store(e.into())
    }
}

/// `Result` with [`TxqError`].
pub type Result<T, E = TxqError> = std::result::Result<T, E>;
