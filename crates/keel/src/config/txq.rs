//! `[txq]`: the runner's transaction queue.

use serde::{Deserialize, Serialize};

/// `[txq]`: the runner's transaction queue, for every chain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TxqSettings {
    /// A broadcast transaction without a receipt for this long (while its sender had
    /// no new inclusion for as long) is replaced with bumped fees, milliseconds; 0
    /// disables fee bumping, otherwise 1000..=86400000 (default 30000).
    pub bump_after_ms: u64,
    /// Percent a replacement raises both the max fee and the priority fee by
    /// (10..=1000; default 12; geth and reth refuse replacements below +10 %).
    pub bump_percent: u64,
    /// Upper bound of the max fee per gas, gwei (1..=10000000; default 1000).
    pub max_fee_cap_gwei: u64,
    /// Percent added to a gas estimate for the gas limit (0..=1000; default 20).
    pub gas_limit_headroom_percent: u64,
    /// Queued requests signed per sender per pass (1..=100000; default 256).
    pub sign_batch: u32,
    /// Nonce recovery runs every this many queue ticks (1..=1000000; default 40).
    pub recovery_every_ticks: u64,
    /// Broadcasts refused for insufficient funds retried (with a funding pause) before
    /// the request fails `GAS_REQUIRED` (0..=10000; default 10).
    pub funding_broadcast_retries: u32,
    /// Broadcasts of one sender outstanding at once (1..=4096; default 16).
    pub broadcast_in_flight: usize,
    /// Broadcasts per JSON-RPC batch (1..=1024; default 16; 1 = one request each).
    pub broadcast_batch: usize,
}

impl Default for TxqSettings {
    fn default() -> Self {
        Self {
            bump_after_ms: 30_000,
            bump_percent: 12,
            max_fee_cap_gwei: 1_000,
            gas_limit_headroom_percent: 20,
            sign_batch: 256,
            recovery_every_ticks: 40,
            funding_broadcast_retries: 10,
            broadcast_in_flight: 16,
            broadcast_batch: 16,
        }
    }
}
