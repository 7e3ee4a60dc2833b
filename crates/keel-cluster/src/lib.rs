//! # keel-cluster
//!
//! Cluster primitives for Keel's replicas, built on PostgreSQL alone (no other
//! coordinator):
//!
//! - [`shard_of`]: the stable key → shard mapping (SHA-256, never changes);
//! - [`check_shard_count`]: the shard count recorded in `cluster_config`; a process
//!   configured with another count refuses to start
//!   ([`ClusterError::ShardCountMismatch`]);
//! - [`ShardOwner`]: a replica's registration in `cluster_replica` and its ownership of
//!   shards, each a session advisory lock `(group_key, shard)` on one reserved
//!   connection, spread over the live replicas of a shard group by rendezvous hashing,
//!   re-asserted on a fixed refresh interval under deadlines; each owned shard carries a
//!   [`ShardLease`] whose cancellation token fires when the shard is lost;
//! - [`ShardOwner::singleton`]: a long-lived task that runs only on the owner of its
//!   name's shard and moves with it; [`ShardOwner::singleton_while`] one that runs only
//!   while the replica can serve it, the replica declining its shard otherwise, so the
//!   shard moves to a replica that can ([`assignment_declining`]);
//! - [`ShardOwner::cron`]: a job run once per cycle on one owner, each cycle keyed by
//!   (name, scheduled time) and recorded in `cron_cycle` before it starts, so an
//!   ownership handoff never starts a recorded cycle twice; missed cycles are caught up
//!   at most [`CronJob::max_catch_up_per_pass`] per pass ([`cron_pass`]); the job's loop
//!   is a `keel-service` background service (`cron`): a pass that is catching up runs
//!   again at once, else it waits for the next due cycle;
//! - [`job_health`] / [`report_job_health`]: each job's schedule (`cron_job`) and cycles
//!   (attempt, outcome, duration, items, last success) judged as one [`JobHealth`] —
//!   "ran and found nothing", "overdue" and "stopped reporting" are distinct states;
//! - retention of the crate's tables: [`prune_stale_replicas`] deletes registry rows of
//!   crashed replicas, [`prune_cron_cycles`] old cycle records (keeping each job's latest).
//!
//! Schema: migrations `0003_cluster.sql`, `0004_cron_job.sql` and
//! `0019_cluster_declined_shards.sql`. Metrics: see the table in `src/metrics.rs`
//! (`keel_cluster_*`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod config;
mod cron;
mod error;
mod hash;
mod lock;
mod metrics;
mod owner;
mod registry;
mod status;

pub use config::{MAX_SHARDS, OwnerConfig, Role, Timing};
pub use cron::{
    CronCycle, CronJob, CronOutcome, CronPass, CronReport, CronStatus, JobHealth, Schedule,
    cron_pass, cron_status, db_now, job_health, prune_cron_cycles, register_job, report_job_health,
};
pub use error::{ClusterError, Result};
pub use hash::{
    assignment, assignment_declining, group_key, rendezvous_owner, rendezvous_weight, shard_of,
};
pub use owner::{OwnedShards, ShardLease, ShardOwner};
pub use registry::{check_shard_count, prune_stale_replicas, recorded_shard_count};
pub use status::{
    ClusterStatus, JobStatus, JobVerdict, ReplicaStatus, SingletonStatus, cluster_status,
    jobs_status,
};

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_gauge!(
        "keel_cluster_cron_catch_up_remaining_cycles",
        ::metrics::Unit::Count,
        "Missed cron cycles still to catch up (cycles)."
    );
    ::metrics::describe_histogram!(
        "keel_cluster_cron_cycle_duration_seconds",
        ::metrics::Unit::Seconds,
        "Duration of one cron cycle (seconds)."
    );
    ::metrics::describe_counter!(
        "keel_cluster_cron_cycles_started_total",
        ::metrics::Unit::Count,
        "Cron cycles started (count)."
    );
    ::metrics::describe_counter!(
        "keel_cluster_cron_cycles_total",
        ::metrics::Unit::Count,
        "Cron cycles finished (count)."
    );
    ::metrics::describe_gauge!(
        "keel_cluster_cron_job_state",
        ::metrics::Unit::Count,
        "1 for the current health state of a cron job (label state), 0 for the other states (boolean)."
    );
    ::metrics::describe_gauge!(
        "keel_cluster_cron_last_success_timestamp_seconds",
        ::metrics::Unit::Seconds,
        "Unix time of the last successful cron cycle (seconds)."
    );
    ::metrics::describe_gauge!(
        "keel_cluster_owned_shards",
        ::metrics::Unit::Count,
        "Shards this replica currently owns (count)."
    );
    ::metrics::describe_counter!(
        "keel_cluster_ownership_faults_total",
        ::metrics::Unit::Count,
        "Shard ownership faults (count)."
    );
    ::metrics::describe_counter!(
        "keel_cluster_stale_replicas_pruned_total",
        ::metrics::Unit::Count,
        "Stale replica registrations removed (count)."
    );
}
