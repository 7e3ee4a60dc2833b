//! The crate's error type.

use keel_chain::ChainError;
use keel_store::StoreError;
use keel_units::ChainId;

/// Errors of the Ledger Index. Messages are value-free: no SQL, no node messages, no
/// row values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// PostgreSQL failed; see [`StoreError::is_retryable`].
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The chain's node failed or refused a request; see [`ChainError::is_retryable`].
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// Another process took ownership of the chain's tip ingest after this one (its
    /// epoch is higher than `epoch`): nothing was committed. Fatal for this owner; it
    /// must stop ingesting the chain.
    #[error("tip ingest of chain {chain} is fenced: epoch {epoch} was superseded")]
    Fenced {
        /// The chain.
        chain: ChainId,
        /// The epoch this owner held.
        epoch: i64,
    },
    /// A reorg replaced a block at or below the block Keel recorded as finalized
    /// (`index_chain.finalized_number`), or below every stored block hash (a reorg
    /// above the recorded finalized block is rolled back to its true common ancestor
    /// instead, however deep): Keel served those rows as final. The chain is marked
    /// degraded ([`crate::read::chain_health`]); fatal for the chain (an operator must
    /// re-index it, `keel index reindex`); counted in `keel_index_reorg_too_deep_total`.
    #[error(
        "chain {chain}: reorg below the block recorded as finalized (tip {tip}, block {oldest} replaced)"
    )]
    ReorgTooDeep {
        /// The chain.
        chain: ChainId,
        /// The indexed tip when the reorg was found.
        tip: u64,
        /// The lowest block known replaced (the fork is below it).
        oldest: u64,
    },
    /// The chain is marked degraded (an earlier reorg below the block Keel recorded as
    /// finalized): its tip ingest writes nothing until an operator re-indexes it. Fatal
    /// for the chain.
    #[error("chain {chain}: the index is degraded; ingest stopped until it is re-indexed")]
    Degraded {
        /// The chain.
        chain: ChainId,
    },
    /// The node answered inconsistently (a block it reported is missing, a log of
    /// another block came back for a block hash). Retryable: the next round re-reads.
    #[error("chain {chain}: node answer for block {number} is inconsistent: {reason}")]
    Inconsistent {
        /// The chain.
        chain: ChainId,
        /// The block number concerned.
        number: u64,
        /// What was wrong.
        reason: &'static str,
    },
    /// [`crate::wait_for_block`] gave up: block `block` was not indexed in time.
    #[error("chain {chain}: block {block} not indexed before the deadline")]
    WaitTimeout {
        /// The chain.
        chain: ChainId,
        /// The block waited for.
        block: u64,
        /// The indexed tip at the deadline, if any.
        indexed: Option<u64>,
    },
    /// A history range's lease was lost (it expired and another worker claimed the
    /// range): nothing of this attempt was committed. Not retryable by this worker.
    #[error(
        "chain {chain}: lease of history range from block {from_block} lost (attempt {attempt})"
    )]
    LeaseLost {
        /// The chain.
        chain: ChainId,
        /// First block of the range.
        from_block: u64,
        /// The attempt that lost its lease.
        attempt: i32,
    },
    /// A history range's answer held rows of block `number` that the index does not
    /// hold as canonical (a reorg replaced it after the fetch, or it is above the
    /// indexed tip): nothing was written and the range was put back to pending, to be
    /// fetched again. Retryable.
    #[error(
        "chain {chain}: history range from block {from_block} holds unsettled block {number}; fetched again"
    )]
    Unsettled {
        /// The chain.
        chain: ChainId,
        /// First block of the range.
        from_block: u64,
        /// The first block whose rows did not match the index's canonical block.
        number: u64,
    },
    /// A row could not be encoded for the binary `COPY` of a bulk write (a value out
    /// of PostgreSQL's range). Nothing was written.
    #[error("a row could not be encoded for the bulk write")]
    Encode,
    /// A fetch task ended without an answer (the runtime is shutting down). Nothing of
    /// the work it belonged to was committed.
    #[error("an index fetch task was cancelled")]
    Interrupted,
    /// Invalid configuration (key named, value not shown).
    #[error("invalid index configuration `{key}`: {reason}")]
    Config {
        /// The configuration key.
        key: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl IndexError {
    /// True when the chain's ingest must stop and an operator is needed
    /// ([`IndexError::ReorgTooDeep`], [`IndexError::Degraded`]) or this process lost ownership
    /// ([`IndexError::Fenced`]).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Fenced { .. } | Self::ReorgTooDeep { .. } | Self::Degraded { .. }
        )
    }

    /// True when the same round may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store(e) => e.is_retryable(),
            Self::Chain(e) => e.is_retryable(),
            Self::Inconsistent { .. }
            | Self::WaitTimeout { .. }
            | Self::Interrupted
            | Self::Unsettled { .. } => true,
            _ => false,
        }
    }
}

impl From<sqlx::Error> for IndexError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::from(e))
    }
}

/// `Result` with [`IndexError`].
pub type Result<T, E = IndexError> = std::result::Result<T, E>;
