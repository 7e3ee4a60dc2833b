//! `[chainHealth]`, `[supervision]`, `[cluster]`, `[retention]`: which chains a process
//! serves, restarts of critical tasks, shard ownership, retention.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[chainHealth]`: how runner and indexer processes decide which chains they serve.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ChainHealthSettings {
    /// First delay before a chain that is unreachable (or not bootstrapped) is tried
    /// again, milliseconds (10..=600000; default 1000); doubles per failure.
    pub retry_initial_ms: u64,
    /// Largest such delay, milliseconds (>= retryInitialMs, <= 600000; default 30000).
    pub retry_max_ms: u64,
    /// How often a served chain is probed (`eth_chainId`), milliseconds (10..=600000;
    /// default 5000).
    pub probe_interval_ms: u64,
    /// Consecutive failed probes after which a served chain is no longer served (its
    /// singleton shards are handed on) (1..=1000; default 3).
    pub failures_before_unserved: u32,
}

impl Default for ChainHealthSettings {
    fn default() -> Self {
        Self {
            retry_initial_ms: 1_000,
            retry_max_ms: 30_000,
            probe_interval_ms: 5_000,
            failures_before_unserved: 3,
        }
    }
}

/// `[supervision]`: restarts of a process's critical tasks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SupervisionSettings {
    /// First delay before a critical task that ended is restarted, milliseconds
    /// (10..=600000; default 1000); doubles per consecutive restart.
    pub restart_initial_ms: u64,
    /// Largest restart delay, milliseconds (>= restartInitialMs, <= 600000; default
    /// 30000).
    pub restart_max_ms: u64,
    /// Consecutive restarts of one task (each within a minute of the last) after which
    /// the process exits non-zero instead (1..=1000; default 10).
    pub max_restarts: u32,
}

impl Default for SupervisionSettings {
    fn default() -> Self {
        Self {
            restart_initial_ms: 1_000,
            restart_max_ms: 30_000,
            max_restarts: 10,
        }
    }
}

/// `[cluster]`: shard ownership of runner and indexer replicas (keel-cluster).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// Heartbeat / reassignment / lock re-assertion period, milliseconds (50..=60000).
    pub refresh_interval_ms: u64,
    /// Heartbeat age after which a replica is not live, milliseconds (>= 3 refresh
    /// intervals).
    pub liveness_window_ms: u64,
    /// Host name recorded in `cluster_replica` (empty: the machine's host name).
    pub host: String,
}

impl ClusterConfig {
    /// The refresh interval.
    pub fn refresh_interval(&self) -> Duration {
        Duration::from_millis(self.refresh_interval_ms)
    }

    /// The liveness window.
    pub fn liveness_window(&self) -> Duration {
        Duration::from_millis(self.liveness_window_ms)
    }
}

/// `[retention]`: the daily retention pass of the runner role.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionSettings {
    /// Age in days after which settled commands and ended instances are deleted (>= 1).
    pub window_days: u32,
    /// Rows per batch (one transaction each), 1..=100000.
    pub batch_size: u32,
    /// Batches per table per pass (>= 1).
    pub max_batches_per_pass: u32,
    /// Wait bound on a dependent row's lock, milliseconds (10..=60000).
    pub lock_timeout_ms: u64,
    /// Hour of the day (UTC) of the daily pass, 0..=23.
    pub hour_utc: u32,
    /// Registry rows of replicas silent for this many liveness windows are deleted (>= 2).
    pub stale_replica_windows: u32,
}

/// `[organizations]`: the runner's abandonment sweep of organization system
/// deployments (issue 37 §1, cron job `org-systems/sweep`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OrganizationSettings {
    /// Seconds between sweeps (1..=86400, default 60).
    pub sweep_interval_seconds: u64,
    /// A deployment accepted this many seconds ago whose workflow was never started, or
    /// one that failed retryably and was not retried for this long, counts as gone
    /// (>= 1, default 300). One whose instance is missing, cancelled or failed for good
    /// is gone at once.
    pub abandon_after_seconds: u64,
}

impl Default for OrganizationSettings {
    fn default() -> Self {
        Self {
            sweep_interval_seconds: 60,
            abandon_after_seconds: 300,
        }
    }
}
