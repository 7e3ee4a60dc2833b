//! Metrics of the engine. Labels come from small fixed sets only: the workflow name
//! (registered types) and an outcome code; never instance ids.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `keel_durable_commands_settled_total` | counter | workflow, outcome | commands settled, by outcome |
//! | `keel_durable_dead_letters_total` | counter | workflow | commands dead-lettered after `commandMaxAttempts` |
//! | `keel_durable_claim_latency_seconds` | histogram | workflow | from a command's `available_at` to its claim |
//! | `keel_durable_segment_duration_seconds` | histogram | workflow | one segment, claim to segment settle |
//! | `keel_durable_steps_total` | counter | workflow, outcome | steps: `ok`, `err`, `replayed`, `suspended` |
//! | `keel_durable_queue_depth` | gauge | — | queued commands (sampled when an executor goes idle) |
//! | `keel_durable_open_instances` | gauge | workflow, status | instances not yet ended, from the census ([`OpenCensusGauge`]) |
//! | `keel_durable_instances_awaiting_runner` | gauge | workflow | open instances whose version no live runner can run ([`crate::VersionWaitGauge`]) |
//! | `keel_durable_runner_heartbeat_failures_total` | counter | — | failed refreshes of an executor's runner version record |
//! | `keel_durable_undecodable_values_total` | counter | column | stored values of a closed set this build does not know (`durable_instance.status`, `durable_command.kind`, `durable_command.state`); their rows were refused ([`crate::UnknownStoredValue`]) |
//! | `keel_durable_transition_hook_failures_total` | counter | kind | transition hook calls that failed (`database`, `other`); their transactions rolled back |

pub(crate) fn settled(workflow: &str, outcome: &'static str) {
    metrics::counter!("keel_durable_commands_settled_total", "workflow" => workflow.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn undecodable(column: &'static str) {
    metrics::counter!("keel_durable_undecodable_values_total", "column" => column).increment(1);
}

pub(crate) fn dead_letter(workflow: &str) {
    metrics::counter!("keel_durable_dead_letters_total", "workflow" => workflow.to_owned())
        .increment(1);
}

pub(crate) fn claim_latency(workflow: &str, seconds: f64) {
    metrics::histogram!("keel_durable_claim_latency_seconds", "workflow" => workflow.to_owned())
        .record(seconds.max(0.0));
}

pub(crate) fn segment_duration(workflow: &str, seconds: f64) {
    metrics::histogram!("keel_durable_segment_duration_seconds", "workflow" => workflow.to_owned())
        .record(seconds);
}

pub(crate) fn step(workflow: &str, outcome: &'static str) {
    metrics::counter!("keel_durable_steps_total", "workflow" => workflow.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn hook_failed(kind: &'static str) {
    metrics::counter!("keel_durable_transition_hook_failures_total", "kind" => kind).increment(1);
}

pub(crate) fn runner_heartbeat_failed() {
    metrics::counter!("keel_durable_runner_heartbeat_failures_total").increment(1);
}

pub(crate) fn queue_depth(depth: i64) {
    metrics::gauge!("keel_durable_queue_depth").set(depth as f64);
}

/// Exports the open-instance census ([`crate::Engine::open_census`]) as the gauge
/// `keel_durable_open_instances{workflow, status}`. It remembers the pairs it has
/// reported, so a pair that has no instance any more reads 0 instead of keeping its
/// last count. Labels stay bounded: workflow names are registered types, statuses the
/// four open ones.
#[derive(Debug, Default)]
pub struct OpenCensusGauge {
    reported: std::collections::BTreeSet<(String, &'static str)>,
}

/// The statuses an open instance can be in, as the gauge's `status` label.
const OPEN_STATUSES: [&str; 4] = ["pending", "running", "waiting", "suspended"];

impl OpenCensusGauge {
    /// A gauge that reports every open status of each of `workflows` (the registered
    /// workflow names), so a workflow with no open instance reads a genuine 0 rather
    /// than no series at all.
    pub fn new<'a>(workflows: impl IntoIterator<Item = &'a str>) -> Self {
        let reported = workflows
            .into_iter()
            .flat_map(|w| OPEN_STATUSES.iter().map(move |s| (w.to_owned(), *s)))
            .collect();
        Self { reported }
    }

    /// Sets the gauge from one census; pairs reported before and absent now are set to 0.
    pub fn export(&mut self, census: &[crate::OpenCount]) {
        let mut now = std::collections::BTreeSet::new();
        for c in census {
            let status = c.status.as_str();
            metrics::gauge!("keel_durable_open_instances", "workflow" => c.workflow.clone(), "status" => status)
                .set(c.count as f64);
            now.insert((c.workflow.clone(), status));
        }
        for (workflow, status) in self.reported.difference(&now) {
            metrics::gauge!("keel_durable_open_instances", "workflow" => workflow.clone(), "status" => *status)
                .set(0.0);
        }
        self.reported.extend(now);
    }
}
