//! # keel-chain
//!
//! How Keel talks to EVM nodes:
//!
//! - [`node_error`]: classification of JSON-RPC error answers (geth, reth, anvil,
//!   erigon, nethermind, besu) into a closed [`NodeErrorKind`], by error code and
//!   **lowercased** message substrings, with revert data decoded where present.
//! - [`attribution`]: the fixed ERC-8021 attribution suffix (schema 0), computed once
//!   and appended byte-identically to the calldata of every transaction attempt.
//! - [`upstream`]: a per-chain [`UpstreamPool`] of JSON-RPC upstreams from
//!   configuration, in failover order, each with a `governor` rate limit and health;
//!   transport failures, and error answers that are not a node's verdict on the request
//!   (internal errors, gateway errors, rate limiting, unknown text), fail over and
//!   count against an upstream's health; node verdicts about a transaction never do. Values are decoded into `keel-units` types
//!   at this boundary (gas prices bound to their chain, native amounts), and receipts
//!   are fetched in JSON-RPC batches. Call sites use the typed methods
//!   ([`UpstreamPool::header`], [`UpstreamPool::finalized`],
//!   [`UpstreamPool::logs_in_range`], [`UpstreamPool::logs_by_block_hash`],
//!   [`UpstreamPool::estimate_gas`], [`UpstreamPool::call`],
//!   [`UpstreamPool::transaction_known`], …), all with the one failover and retry
//!   classification of [`UpstreamPool::request`] ([`NodeErrorKind::is_retryable`],
//!   [`ChainError::is_retryable`]).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod attribution;
pub mod heads;
pub mod node_error;
pub mod upstream;

pub use attribution::AttributionSuffix;
pub use heads::{HeadSignal, HeadWatchConfig, watch_heads};
pub use node_error::{NodeError, NodeErrorKind, RevertReason};
pub use upstream::{BlockHeader, MethodClass, UpstreamConfig, UpstreamHealth, UpstreamPool};

use keel_units::ChainId;

/// Errors of chain access. Messages are value-free: they never quote node messages
/// (which carry addresses and balances), calldata or URLs (which can carry API keys).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// The node answered with a JSON-RPC error; `kind` says what it means.
    #[error("node rejected {method}: {error}")]
    Node {
        /// The JSON-RPC method.
        method: &'static str,
        /// The classified answer.
        error: NodeError,
    },
    /// Every upstream failed at the transport level (connection, timeout, HTTP status,
    /// malformed response). Retryable.
    #[error("no upstream of chain {chain} answered {method} ({attempts} attempts)")]
    Unavailable {
        /// The chain.
        chain: ChainId,
        /// The JSON-RPC method.
        method: &'static str,
        /// Upstreams tried.
        attempts: usize,
    },
    /// An upstream reports a different chain id than configured (EIP-155).
    #[error("upstream #{index} of chain {expected} reports chain id {actual}")]
    WrongChain {
        /// Position of the upstream in the configured list.
        index: usize,
        /// The configured chain id.
        expected: ChainId,
        /// What `eth_chainId` returned.
        actual: u64,
    },
    /// The configuration is invalid (key named, value not shown).
    #[error("invalid chain configuration `{key}`: {reason}")]
    Config {
        /// The configuration key.
        key: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl ChainError {
    /// True when the same request may succeed later (transport failures, and node
    /// answers that are not about the request itself).
    pub fn is_retryable(&self) -> bool {
        match self {
            ChainError::Unavailable { .. } => true,
            ChainError::Node { error, .. } => error.kind.is_retryable(),
            _ => false,
        }
    }
}

/// `Result` with [`ChainError`].
pub type Result<T, E = ChainError> = std::result::Result<T, E>;

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_counter!(
        "keel_chain_rpc_requests_total",
        ::metrics::Unit::Count,
        "JSON-RPC requests sent to chain upstreams (count)."
    );
    heads::describe_metrics();
}
