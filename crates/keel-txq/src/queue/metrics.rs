//! Every metric of the queue: names, labels and the recording helpers (the table with
//! their meaning is in the crate docs, `## Metrics`). Labels come from small fixed
//! sets only: `chain_id`, `kind` (verdict kind), `class` (broadcast error class) and,
//! for the in-flight gauge, `sender` (the registered signers); never ids or hashes.

use alloy::primitives::Address;

/// `keel_txq_enqueue_batch_rows`: rows per group-commit `INSERT` of enqueues.
pub(crate) fn enqueue_batch_rows(rows: usize) {
    ::metrics::histogram!("keel_txq_enqueue_batch_rows").record(rows as f64);
}

/// `keel_txq_enqueued_total{chain_id}`: a new request recorded.
pub(crate) fn enqueued(chain_id: i64) {
    ::metrics::counter!("keel_txq_enqueued_total", "chain_id" => chain_id.to_string()).increment(1);
}

/// `keel_txq_queue_depth{chain_id}` (queued + waiting_funding) and
/// `keel_txq_waiting_funding{chain_id}`, requests.
pub(crate) fn queue_depth(chain_id: i64, depth: i64, waiting: i64) {
    let chain = chain_id.to_string();
    ::metrics::gauge!("keel_txq_queue_depth", "chain_id" => chain.clone()).set(depth as f64);
    ::metrics::gauge!("keel_txq_waiting_funding", "chain_id" => chain).set(waiting as f64);
}

/// `keel_txq_in_flight{chain_id, sender}`: `signed` + `broadcast` requests of a
/// registered sender.
pub(crate) fn in_flight(chain_id: i64, sender: &Address, n: i64) {
    ::metrics::gauge!("keel_txq_in_flight", "chain_id" => chain_id.to_string(), "sender" => sender.to_string())
        .set(n as f64);
}

/// `keel_txq_sender_depth{chain_id, sender}`: `queued` + `waiting_funding` requests of
/// a registered sender.
pub(crate) fn sender_depth(chain_id: i64, sender: &Address, n: i64) {
    ::metrics::gauge!("keel_txq_sender_depth", "chain_id" => chain_id.to_string(), "sender" => sender.to_string())
        .set(n as f64);
}

/// `keel_txq_sender_balance_wei{chain_id, sender}`: a registered sender's balance at the
/// node's `pending` block, wei (as a float: exact below 2^53 wei, about 0.009 ETH,
/// relative precision 1e-16 above).
pub(crate) fn sender_balance(chain_id: i64, sender: &Address, wei: alloy::primitives::U256) {
    let v: f64 = wei.to_string().parse().unwrap_or(f64::MAX);
    ::metrics::gauge!("keel_txq_sender_balance_wei", "chain_id" => chain_id.to_string(), "sender" => sender.to_string())
        .set(v);
}

/// `keel_txq_time_to_broadcast_seconds{chain_id}`: enqueue → first accepted broadcast,
/// once per request in `secs`.
pub(crate) fn time_to_broadcast(chain_id: i64, secs: &[f64]) {
    let histogram = ::metrics::histogram!("keel_txq_time_to_broadcast_seconds", "chain_id" => chain_id.to_string());
    for s in secs {
        histogram.record(*s);
    }
}

/// `keel_txq_broadcast_total{chain_id}`: `n` broadcasts a node accepted (or knew).
pub(crate) fn broadcasts(chain_id: i64, n: usize) {
    ::metrics::counter!("keel_txq_broadcast_total", "chain_id" => chain_id.to_string())
        .increment(n as u64);
}

/// `keel_txq_broadcast_failures_total{chain_id, class}`: `n` failed broadcasts of an
/// error class (a closed set).
pub(crate) fn broadcast_failures(chain_id: i64, class: &'static str, n: u64) {
    ::metrics::counter!("keel_txq_broadcast_failures_total", "chain_id" => chain_id.to_string(), "class" => class)
        .increment(n);
}

/// `keel_txq_sign_failures_total{chain_id, reason}`: a signature the signer did not
/// give (`reason`: [`crate::SignerError::code`], a closed set such as `UNAVAILABLE` or
/// `KEY_DISABLED`). Nothing was persisted for it.
pub(crate) fn sign_failures(chain_id: i64, reason: &'static str) {
    ::metrics::counter!("keel_txq_sign_failures_total", "chain_id" => chain_id.to_string(), "reason" => reason)
        .increment(1);
}

/// `keel_txq_verdicts_total{chain_id, kind}`: `n` requests settled with a verdict of
/// `kind` (`confirmed`, `reverted`, `failed`).
pub(crate) fn verdicts(chain_id: i64, kind: &'static str, n: usize) {
    ::metrics::counter!("keel_txq_verdicts_total", "chain_id" => chain_id.to_string(), "kind" => kind)
        .increment(n as u64);
}

/// `keel_txq_time_to_confirmation_seconds{chain_id}`: enqueue → settled `confirmed` or
/// `reverted`.
pub(crate) fn time_to_confirmation(chain_id: i64, secs: f64) {
    ::metrics::histogram!("keel_txq_time_to_confirmation_seconds", "chain_id" => chain_id.to_string())
        .record(secs);
}

/// `keel_txq_settlement_sink_failures_total{chain_id}`: settling transactions rolled
/// back because the settlement sink failed (the requests settle on a later pass).
pub(crate) fn settlement_sink_failures(chain_id: i64) {
    ::metrics::counter!("keel_txq_settlement_sink_failures_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_progress_sink_failures_total{chain_id, change}`: transactions recording a
/// first broadcast or a funding request (`change`: `broadcast`, `funding`) rolled back
/// because the progress sink failed (recorded again at once; see `crate::progress`).
pub(crate) fn progress_sink_failures(chain_id: i64, change: &'static str) {
    ::metrics::counter!("keel_txq_progress_sink_failures_total", "chain_id" => chain_id.to_string(), "change" => change)
        .increment(1);
}

/// `keel_txq_funding_paused_total{chain_id}`: a request entered `waiting_funding`.
pub(crate) fn funding_paused(chain_id: i64) {
    ::metrics::counter!("keel_txq_funding_paused_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_funding_resumed_total{chain_id}`: a waiting request resumed after funding.
pub(crate) fn funding_resumed(chain_id: i64) {
    ::metrics::counter!("keel_txq_funding_resumed_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_nonce_adopted_total{chain_id}`: a nonce advanced outside Keel, adopted.
pub(crate) fn nonce_adopted(chain_id: i64) {
    ::metrics::counter!("keel_txq_nonce_adopted_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_nonce_gaps_filled_total{chain_id}`: a gap filled with a zero-value
/// self-transfer.
pub(crate) fn nonce_gap_filled(chain_id: i64) {
    ::metrics::counter!("keel_txq_nonce_gaps_filled_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_replacements_total{chain_id}`: a fee-bumped replacement persisted.
pub(crate) fn replacement(chain_id: i64) {
    ::metrics::counter!("keel_txq_replacements_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_replacements_capped_total{chain_id}`: a replacement skipped at
/// `max_fee_cap`.
pub(crate) fn replacement_capped(chain_id: i64) {
    ::metrics::counter!("keel_txq_replacements_capped_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_signed_total{chain_id}`: `n` requests signed (a nonce assigned).
pub(crate) fn signed(chain_id: i64, n: usize) {
    ::metrics::counter!("keel_txq_signed_total", "chain_id" => chain_id.to_string())
        .increment(n as u64);
}

/// `keel_txq_custody_creates_total{chain_id, outcome}`: custody creates by outcome
/// (`created`, `in_doubt`, `retry`, `refused`, `config`).
pub(crate) fn custody_create(chain_id: i64, outcome: &'static str) {
    ::metrics::counter!("keel_txq_custody_creates_total", "chain_id" => chain_id.to_string(), "outcome" => outcome)
        .increment(1);
}

/// `keel_txq_custody_status_reads_total{chain_id, phase}`: provider reads by the status
/// phase read (`pre_broadcast`, `awaiting_approval`, `broadcast`, `cancelling`,
/// `completed`, `rejected`, `unknown`).
pub(crate) fn custody_status(chain_id: i64, phase: &'static str) {
    ::metrics::counter!("keel_txq_custody_status_reads_total", "chain_id" => chain_id.to_string(), "phase" => phase)
        .increment(1);
}

/// `keel_txq_custody_step_failures_total{chain_id}`: custody steps that failed (the
/// request is deferred).
pub(crate) fn custody_step_failed(chain_id: i64) {
    ::metrics::counter!("keel_txq_custody_step_failures_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_custody_resubmissions_total{chain_id}`: silent drops cancelled and
/// resubmitted.
pub(crate) fn custody_resubmitted(chain_id: i64) {
    ::metrics::counter!("keel_txq_custody_resubmissions_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_custody_poll_budget_exceeded_total{chain_id}`: submissions that outlived
/// their poll budget.
pub(crate) fn custody_budget_exceeded(chain_id: i64) {
    ::metrics::counter!("keel_txq_custody_poll_budget_exceeded_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_custody_lost_hash_recovered_total{chain_id}`: hashes recovered by external
/// id after a `COMPLETED` without one.
pub(crate) fn custody_lost_hash_recovered(chain_id: i64) {
    ::metrics::counter!("keel_txq_custody_lost_hash_recovered_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_resigned_total{chain_id}`: a request re-signed at a fresh nonce after
/// another transaction took its nonce for good (issue 32 §3).
pub(crate) fn resigned(chain_id: i64) {
    ::metrics::counter!("keel_txq_resigned_total", "chain_id" => chain_id.to_string()).increment(1);
}

/// `keel_txq_reorged_total{chain_id}`: a settled transaction found out of the chain
/// after a reorg (issue 32 §10), once per reorg.
pub(crate) fn reorged(chain_id: i64) {
    ::metrics::counter!("keel_txq_reorged_total", "chain_id" => chain_id.to_string()).increment(1);
}

/// `keel_txq_reorged_out_total{chain_id}`: a settled verdict replaced by `REORGED_OUT`.
pub(crate) fn reorged_out(chain_id: i64) {
    ::metrics::counter!("keel_txq_reorged_out_total", "chain_id" => chain_id.to_string())
        .increment(1);
}

/// `keel_txq_broadcasts_deferred_total{chain_id}`: `n` broadcasts of requests whose
/// earlier broadcasts failed, put off to the end of their backoff (issue 32 §8).
pub(crate) fn broadcasts_deferred(chain_id: i64, n: usize) {
    if n > 0 {
        ::metrics::counter!("keel_txq_broadcasts_deferred_total", "chain_id" => chain_id.to_string())
            .increment(n as u64);
    }
}
