//! `[durable]` (with `executor`, `confirmationWatcher`, `sharding`): the durable engine and
//! executor.

use serde::{Deserialize, Serialize};

/// `[durable]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DurableConfig {
    /// `durable.confirmationWatcher`.
    pub confirmation_watcher: ConfirmationWatcherConfig,
    /// `durable.sharding`.
    pub sharding: ShardingConfig,
    /// Execution lease of a workflow segment, milliseconds (1000..=600000; default
    /// 30000): a crashed runner's in-flight segment is resumed elsewhere this long
    /// after its last renewal.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Largest start input or signal payload, bytes of compact JSON (1024..=16777216;
    /// default 262144).
    #[serde(default = "default_max_payload_bytes")]
    pub max_payload_bytes: usize,
    /// Unconsumed signals one workflow instance may hold (1..=100000; default 100).
    #[serde(default = "default_max_open_signals")]
    pub max_open_signals: u32,
    /// Claims of one command before it is dead-lettered (1..=1000; default 5).
    #[serde(default = "default_command_max_attempts")]
    pub command_max_attempts: u32,
    /// Attempts of a transiently failing step body inside one segment (1..=100;
    /// default 3).
    #[serde(default = "default_step_attempts")]
    pub step_attempts: u32,
    /// `durable.executor`: the runner's workflow executor.
    #[serde(default)]
    pub executor: ExecutorSettings,
}

fn default_lease_ms() -> u64 {
    30_000
}
fn default_max_payload_bytes() -> usize {
    262_144
}
fn default_max_open_signals() -> u32 {
    100
}
fn default_command_max_attempts() -> u32 {
    5
}
fn default_step_attempts() -> u32 {
    3
}

/// `[durable.executor]`: the runner's durable executor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExecutorSettings {
    /// Workflow segments one runner executes concurrently (1..=1024; default 4).
    pub concurrency: usize,
    /// Poll interval when no notification arrives (the fallback for lost notifications
    /// and lapsed leases), milliseconds (10..=60000; default 1000).
    pub poll_interval_ms: u64,
    /// How often a running segment renews its lease, milliseconds; 0 (default): a
    /// third of `durable.leaseMs`. Otherwise 100 or more and shorter than the lease.
    pub renew_interval_ms: u64,
}

impl Default for ExecutorSettings {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll_interval_ms: 1_000,
            renew_interval_ms: 0,
        }
    }
}

/// `[durable.confirmationWatcher]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfirmationWatcherConfig {
    /// Receipt reconciliation interval per chain, in milliseconds; 50..=60000, default 250.
    pub interval_ms: u64,
}

/// `[durable.sharding]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShardingConfig {
    /// Shard modulus (> 0), identical on every role of a deployment.
    pub shards: u32,
}
