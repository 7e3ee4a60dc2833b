//! The crate's error type.

use keel_store::StoreError;

/// Errors of the cluster primitives. Messages are value-free: they name the operation
/// or configuration key, never SQL text or row values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// This process is configured with a shard count other than the one recorded in
    /// `cluster_config`. The shard count is the modulus of every key → shard mapping, so
    /// a process with another count would disagree with its peers about ownership: it
    /// must not start.
    #[error(
        "shard count mismatch: this process is configured with {configured} shards, \
         the database records {recorded} (durable.sharding.shards must be identical on every role)"
    )]
    ShardCountMismatch {
        /// The count this process was configured with.
        configured: u32,
        /// The count recorded in `cluster_config` by the first process that started.
        recorded: u32,
    },
    /// The cluster configuration is invalid.
    #[error("invalid cluster configuration `{key}`: {reason}")]
    Config {
        /// The configuration key, e.g. `cluster.refreshIntervalMs`.
        key: &'static str,
        /// Why it is invalid (never the value itself).
        reason: &'static str,
    },
    /// A lock operation on the reserved connection did not finish within its deadline.
    /// The owner releases every shard and rebuilds the connection.
    #[error("lock operation `{op}` overran its deadline of {deadline_ms} ms")]
    Deadline {
        /// The operation (`connect`, `heartbeat`, `live_set`, `check`, `acquire`,
        /// `release`, `reap`).
        op: &'static str,
        /// The deadline, in milliseconds.
        deadline_ms: u64,
    },
    /// A shard this replica believed it held is not among its session's advisory locks.
    #[error("advisory lock of shard {shard} vanished from the reserved session")]
    LockLost {
        /// The shard whose lock is missing.
        shard: u32,
    },
    /// A database failure, classified by [`StoreError`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ClusterError {
    /// True when the process must not go on (configuration errors); every other error
    /// is handled by releasing shards and rejoining.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::ShardCountMismatch { .. } | Self::Config { .. })
    }

    /// True when retrying the same operation later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Deadline { .. } | Self::LockLost { .. } => true,
            Self::Store(e) => e.is_retryable(),
            Self::ShardCountMismatch { .. } | Self::Config { .. } => false,
        }
    }
}

impl From<sqlx::Error> for ClusterError {
    fn from(err: sqlx::Error) -> Self {
        Self::Store(StoreError::from(err))
    }
}

/// `Result` with [`ClusterError`].
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
