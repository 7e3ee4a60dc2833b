//! Metrics of the cluster primitives. Labels come from small fixed sets only: the shard
//! group, a fault reason, a cron job's name (registered jobs) and an outcome; never
//! replica ids or shard numbers.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `keel_cluster_owned_shards` | gauge | group | shards this process owns (lease published) |
//! | `keel_cluster_ownership_faults_total` | counter | group, reason | faults that released every shard: `deadline`, `lock_lost`, `database` |
//! | `keel_cluster_cron_cycles_started_total` | counter | job | cron cycles recorded and started here (attempts; a cycle starts at most once) |
//! | `keel_cluster_cron_cycles_total` | counter | job, outcome | cron cycles run, `succeeded` or `failed` |
//! | `keel_cluster_cron_cycle_duration_seconds` | histogram | job | one cycle, start to finish |
//! | `keel_cluster_cron_last_success_timestamp_seconds` | gauge | job | scheduled time (Unix seconds) of the latest successful cycle run here |
//! | `keel_cluster_cron_catch_up_remaining_cycles` | gauge | job | missed cycles left after the latest pass (0 when caught up) |
//! | `keel_cluster_cron_job_state` | gauge | job, state | 1 for the job's current [`crate::JobHealth`] state, 0 for the others (`report_job_health`) |
//! | `keel_cluster_stale_replicas_pruned_total` | counter | — | `cluster_replica` rows of crashed replicas deleted |

use crate::ClusterError;

pub(crate) fn owned_shards(group: &'static str, n: usize) {
    metrics::gauge!("keel_cluster_owned_shards", "group" => group).set(n as f64);
}

pub(crate) fn fault(group: &'static str, err: &ClusterError) {
    let reason = match err {
        ClusterError::Deadline { .. } => "deadline",
        ClusterError::LockLost { .. } => "lock_lost",
        _ => "database",
    };
    metrics::counter!("keel_cluster_ownership_faults_total", "group" => group, "reason" => reason)
        .increment(1);
}

pub(crate) fn cron_cycle(job: &str, outcome: &'static str, seconds: f64) {
    metrics::counter!("keel_cluster_cron_cycles_total", "job" => job.to_owned(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("keel_cluster_cron_cycle_duration_seconds", "job" => job.to_owned())
        .record(seconds.max(0.0));
}

pub(crate) fn cron_success(job: &str, scheduled_unix_seconds: f64) {
    metrics::gauge!("keel_cluster_cron_last_success_timestamp_seconds", "job" => job.to_owned())
        .set(scheduled_unix_seconds);
}

pub(crate) fn cron_remaining(job: &str, cycles: i64) {
    metrics::gauge!("keel_cluster_cron_catch_up_remaining_cycles", "job" => job.to_owned())
        .set(cycles as f64);
}

pub(crate) fn cron_started(job: &str) {
    metrics::counter!("keel_cluster_cron_cycles_started_total", "job" => job.to_owned())
        .increment(1);
}

pub(crate) fn job_state(job: &'static str, state: &'static str) {
    for s in crate::JobHealth::STATES {
        let v = if s == state { 1.0 } else { 0.0 };
        metrics::gauge!("keel_cluster_cron_job_state", "job" => job, "state" => s).set(v);
    }
}

pub(crate) fn replicas_pruned(n: u64) {
    metrics::counter!("keel_cluster_stale_replicas_pruned_total").increment(n);
}
