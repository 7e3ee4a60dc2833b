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

pub(crate) fn settled(workflow: &str, outcome: &'static str) {
    metrics::counter!("keel_durable_commands_settled_total", "workflow" => workflow.to_owned(), "outcome" => outcome)
        .increment(1);
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

pub(crate) fn queue_depth(depth: i64) {
    metrics::gauge!("keel_durable_queue_depth").set(depth as f64);
}
