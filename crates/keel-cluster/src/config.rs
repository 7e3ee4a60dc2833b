//! Roles, shard groups and the timing of shard ownership.

use crate::{ClusterError, Result};
use std::time::Duration;

/// Largest accepted shard count (`durable.sharding.shards`).
pub const MAX_SHARDS: u32 = 65_536;

/// The role of a replica that owns shards. `api` processes own nothing and do not run a
/// [`crate::ShardOwner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// Runs workflows; owns shards of the [`Role::shard_group`] `workflow`.
    Runner,
    /// Runs the Ledger Index; owns shards of the group `indexer`.
    Indexer,
}

impl Role {
    /// The role's name as stored in `cluster_replica.role`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runner => "runner",
            Self::Indexer => "indexer",
        }
    }

    /// The shard group the role's replicas share. Each group is its own advisory-lock
    /// namespace ([`crate::group_key`]) and its own rendezvous set: a runner and an
    /// indexer never compete for a shard.
    pub fn shard_group(self) -> &'static str {
        match self {
            Self::Runner => "workflow",
            Self::Indexer => "indexer",
        }
    }
}

/// Settings of one replica's [`crate::ShardOwner`].
///
/// Derived timings (see [`OwnerConfig::timing`]):
/// - lock deadline = `min(refresh_interval / 2, liveness_window / 4)`: every operation on
///   the reserved connection must finish within it;
/// - handoff delay = `refresh_interval + 2 × lock deadline` unless set: how long a newly
///   acquired shard waits before its work starts, which bounds how late a previous owner
///   whose connection was cut can notice and stop.
#[derive(Debug, Clone)]
pub struct OwnerConfig {
    /// The replica's role (decides its shard group).
    pub role: Role,
    /// The shard count (`durable.sharding.shards`), 1..=[`MAX_SHARDS`]; must equal the
    /// count recorded in the database.
    pub shards: u32,
    /// How often the replica heartbeats, recomputes its assignment and re-asserts its
    /// locks (50 ms ..= 60 s; default 1 s).
    pub refresh_interval: Duration,
    /// A replica whose last heartbeat (database clock) is older than this is not live and
    /// its shards are reassigned. At least `3 × refresh_interval` (default 5 s).
    pub liveness_window: Duration,
    /// Override of the derived handoff delay (see above). Shortening it below the
    /// derived value weakens the guarantee that a cut-off owner stops first.
    pub handoff_delay: Option<Duration>,
    /// Host name recorded in the registry (1..=255 bytes).
    pub host: String,
}

impl OwnerConfig {
    /// A configuration with default timings (refresh 1 s, liveness 5 s).
    pub fn new(role: Role, shards: u32, host: impl Into<String>) -> Self {
        Self {
            role,
            shards,
            refresh_interval: Duration::from_secs(1),
            liveness_window: Duration::from_secs(5),
            handoff_delay: None,
            host: host.into(),
        }
    }

    /// Validates the configuration and derives its timings.
    ///
    /// # Errors
    /// [`ClusterError::Config`] naming the offending key.
    pub fn timing(&self) -> Result<Timing> {
        let invalid = |key, reason| Err(ClusterError::Config { key, reason });
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return invalid("durable.sharding.shards", "must be between 1 and 65536");
        }
        let refresh = self.refresh_interval;
        if refresh < Duration::from_millis(50) || refresh > Duration::from_secs(60) {
            return invalid(
                "cluster.refreshIntervalMs",
                "must be between 50 ms and 60 s",
            );
        }
        if self.liveness_window < refresh * 3 {
            return invalid(
                "cluster.livenessWindowMs",
                "must be at least three refresh intervals",
            );
        }
        if self.host.is_empty() || self.host.len() > 255 {
            return invalid("cluster.host", "must be 1 to 255 bytes");
        }
        let lock_deadline = (refresh / 2).min(self.liveness_window / 4);
        let handoff_delay = self.handoff_delay.unwrap_or(refresh + lock_deadline * 2);
        Ok(Timing {
            refresh_interval: refresh,
            liveness_window: self.liveness_window,
            lock_deadline,
            handoff_delay,
        })
    }
}

/// The validated timings of a [`crate::ShardOwner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Period of heartbeat + reassignment + lock re-assertion.
    pub refresh_interval: Duration,
    /// Heartbeat age beyond which a replica is not live.
    pub liveness_window: Duration,
    /// Deadline of each operation on the reserved connection (also its
    /// `statement_timeout`).
    pub lock_deadline: Duration,
    /// Wait between acquiring a shard's lock and starting its work.
    pub handoff_delay: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_derive_timings() {
        let t = OwnerConfig::new(Role::Runner, 64, "h").timing().unwrap();
        assert_eq!(t.lock_deadline, Duration::from_millis(500));
        assert_eq!(t.handoff_delay, Duration::from_secs(2));
    }

    #[test]
    fn invalid_settings_are_refused() {
        let mut c = OwnerConfig::new(Role::Indexer, 0, "h");
        assert!(matches!(
            c.timing(),
            Err(ClusterError::Config {
                key: "durable.sharding.shards",
                ..
            })
        ));
        c.shards = 8;
        c.liveness_window = c.refresh_interval * 2;
        assert!(matches!(
            c.timing(),
            Err(ClusterError::Config {
                key: "cluster.livenessWindowMs",
                ..
            })
        ));
        c.liveness_window = c.refresh_interval * 3;
        c.refresh_interval = Duration::from_millis(10);
        assert!(c.timing().is_err());
    }
}
