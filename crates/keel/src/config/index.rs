//! `[index]` (with `history`): the Ledger Index.

use serde::{Deserialize, Serialize};

/// `[index.history]`: the indexer's history workers (leased ranges below the tip).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HistorySettings {
    /// How long a claimed range stays leased, milliseconds (1000..=3600000; default
    /// 60000); renewed every third of it while its worker fetches.
    pub lease_ms: u64,
    /// Largest `eth_getLogs` span, blocks (1..=1000000; default 2000); halves on a
    /// "range too large" answer.
    pub max_span: u64,
    /// Retries of a rate-limited or unreachable `eth_getLogs` before the range is left
    /// to its lease (0..=100; default 5).
    pub retries: u32,
}

impl Default for HistorySettings {
    fn default() -> Self {
        Self {
            lease_ms: 60_000,
            max_span: 2_000,
            retries: 5,
        }
    }
}

/// `[index]`: the Ledger Index (role `indexer`) and read-after-write waits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexSettings {
    /// Tip-ingest poll interval, milliseconds (50..=60000; default 100).
    pub poll_interval_ms: u64,
    /// Blocks after which a block is final (default 12); the hash window is twice this.
    pub finality_depth: u64,
    /// A workflow's read-after-write wait per step attempt, milliseconds (default 30000).
    pub read_after_write_wait_ms: u64,
    /// `eth_getLogs` requests a history worker keeps in flight per range (1..=64;
    /// default 4). Each counts against the upstream's rate limit.
    #[serde(default = "default_history_fetch_concurrency")]
    pub history_fetch_concurrency: usize,
    /// `index.history`.
    #[serde(default)]
    pub history: HistorySettings,
    /// The tip loop's fallback poll interval while a chain's `wsUrl` subscription wakes
    /// it on every new head, milliseconds (100..=600000; default 5000).
    #[serde(default = "default_subscribed_poll_interval_ms")]
    pub subscribed_poll_interval_ms: u64,
}

fn default_history_fetch_concurrency() -> usize {
    4
}

fn default_subscribed_poll_interval_ms() -> u64 {
    5_000
}

impl Default for IndexSettings {
    fn default() -> Self {
        Self {
            poll_interval_ms: 100,
            finality_depth: 12,
            read_after_write_wait_ms: 30_000,
            history_fetch_concurrency: default_history_fetch_concurrency(),
            history: HistorySettings::default(),
            subscribed_poll_interval_ms: default_subscribed_poll_interval_ms(),
        }
    }
}
