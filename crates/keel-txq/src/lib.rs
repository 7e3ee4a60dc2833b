//! # keel-txq
//!
//! Every on-chain write Keel makes goes through this queue, keyed by (chain, sender).
//! Its promise: per request (identified by an idempotency key) at most one transaction
//! takes effect on chain, a sender's nonces are used in order, and every request ends
//! with a typed [`SettlementVerdict`].
//!
//! ## Lifecycle of a request
//!
//! The states are [`RequestState`] (stored as the snake_case names below); a failed
//! verdict's code is a [`FailureCode`] (stored as its SCREAMING_SNAKE_CASE name, e.g.
//! `GAS_REQUIRED`).
//!
//! | state | meaning | moved by |
//! |---|---|---|
//! | `queued` | recorded, no nonce yet | [`TxQueue::enqueue`] / [`TxQueue::enqueue_with`]; the funding check when funds arrived |
//! | `waiting_funding` | the sender cannot pay and the request has a funding pause; no nonce; an open [`FundingRequest`] | the sender pass |
//! | `signed` | a nonce is assigned and the signed raw transaction is **persisted**; it may not have reached a node | the sender pass |
//! | `broadcast` | a node accepted an attempt (or said it already knew it) | the sender pass |
//! | `settled` | the verdict is final: `confirmed`, `reverted` or `failed` | the confirmation pass, or the sender pass for failures before signing |
//!
//! - **Enqueue** is idempotent by (chain, sender, key): the same key and payload
//!   return the existing request; a different payload is [`TxqError::IdempotencyConflict`].
//! - **Signing** works in rounds across senders. A round reads every sender's queued
//!   requests with its next nonce (`txq_sender`) in one statement, signs them through
//!   the [`TxSigner`] seam with consecutive nonces from there (no row is locked while
//!   a possibly remote signer works), and commits a group of up to 128 signed
//!   transactions of several senders in one statement (`txq_commit_signed`, migration
//!   0013). Under each sender's row lock (`FOR UPDATE`, senders in a fixed order) it
//!   checks that the next nonce is still the one the signatures start at and that
//!   every request is still `queued`; only then are the attempts (raw bytes and hash)
//!   inserted, the requests marked `signed` and the next nonce advanced. A sender that
//!   fails the check writes nothing: its signatures are discarded unbroadcast and its
//!   requests stay queued for the next round. A request that fails before signing
//!   (gas estimation reverts, its gas limit exceeds the latest block's gas limit —
//!   `EXCEEDS_BLOCK_GAS_LIMIT`, issue 33 §1 —, the sender cannot pay and has no funding
//!   pause) consumes no nonce and settles `failed`.
//! - **Broadcast** happens after the commit, outside any transaction, in JSON-RPC
//!   batches that each hold one sender's consecutive nonces. A crash between
//!   the two leaves a `signed` request whose exact bytes the next pass re-broadcasts.
//!   "Already known" is success. "Nonce too low" is resolved by looking for any
//!   attempt of the request: ours known (mined) means broadcast; none known while the
//!   sender's nonce **at the final block** ([`TxQueueConfig::finality`]) passed ours
//!   means another transaction took the nonce for good, so none of the request's
//!   attempts can ever be mined: the request is **re-signed at a fresh nonce**
//!   (persisted before its broadcast; `keel_txq_resigned_total`), never failed — its
//!   effect never happened (issue 32 §3, `queue/resign.rs`). Until that transaction is
//!   final the request stays in flight as a failed broadcast.
//!   Only a node's verdict on the transaction is final for a broadcast: an internal
//!   error, a gateway's error or unknown text makes the upstream pool ask the chain's
//!   other upstreams (`keel-chain`), and an answer that is no verdict leaves the request
//!   `signed` for the next pass.
//! - **Failed broadcasts** (no node accepted the attempt and the answer did not settle
//!   the request) are recorded on the request (error class, time, count; migration
//!   0018; [`RequestStatus::broadcast_failure`], [`broadcast_failures`]), counted in
//!   `keel_txq_broadcast_failures_total{chain_id, class}` and logged as a WARN at most
//!   once per class every 30 s with the number of failures since the previous one.
//!   Such a request **backs off** (issue 32 §8): after its second failed broadcast the
//!   next one waits min(60 s, 0.5 s × 2^(failures − 2)) from the last failure (database
//!   clock, so it holds across restarts); the broadcasts put off are counted in
//!   `keel_txq_broadcasts_deferred_total{chain_id}`. Receipts and the chain's nonce
//!   are still checked every pass.
//! - **Confirmation**: receipts of every attempt of in-flight requests (`broadcast`
//!   ones, and `signed` ones with failed broadcasts: an attempt may have reached a node
//!   whose answer was lost) are fetched in one batch; a receipt at least
//!   `confirmations` blocks deep settles the request (`confirmed`, or `reverted` with
//!   the decoded reason). A `signed` request with failed broadcasts and no receipt
//!   whose nonce the final chain passed while no node knows any of its attempts is
//!   re-signed at a fresh nonce, as above. A receipt that disappears
//!   in a reorg before that depth leaves the request in flight, and the same signed
//!   bytes are re-broadcast when the node no longer knows the transaction.
//! - **Watched until final** (issue 32 §10, migration 0065, `queue/watch.rs`): a request
//!   settled `confirmed` or `reverted` stays watched until its verdict's block is final
//!   ([`TxQueueConfig::finality`]). Re-included after a reorg: the verdict stands with the
//!   new block. Out of the chain with its nonce free: the verdict's exact bytes are
//!   broadcast again. Out with its nonce taken by another transaction on the final
//!   chain: the verdict becomes `Failed { code: REORGED_OUT }`, handed to
//!   [`SettlementSink::reorged`] in that transaction; the queue re-sends nothing
//!   (`keel_txq_reorged_total`, `keel_txq_reorged_out_total`).
//! - A caller (a workflow step) reads the verdict with [`TxQueue::status`] or waits for
//!   it with [`TxQueue::await_verdict`].
//!
//! - **Fee bumping**: a `broadcast` transaction without a receipt after `bump_after`
//!   is replaced at the same nonce with both fees raised by `bump_percent` (≥ 10 %,
//!   the geth/reth replacement rule) and at least the market's, capped per chain; each
//!   attempt is persisted before broadcast and whichever attempt mines settles. Of a
//!   sender's stuck transactions only the lowest nonce is replaced, unless the others
//!   are underpriced too: later nonces waiting behind it mine once it does. None is
//!   replaced while a lower nonce of its sender is still `signed` (never accepted by a
//!   node): it cannot mine before that one, whatever its fees.
//! - **Cancellation**: [`TxQueue::run`] checks its token between the stages of every
//!   pass (before each write and broadcast); once it fired nothing more is written or
//!   sent.
//!
//! - **Nonce recovery** ([`TxQueue::recover_nonces`], at start and periodically):
//!   adopts a nonce advanced outside Keel and fills gaps left by requests that failed
//!   after signing with zero-value self-transfers (never a nonce held by a live request
//!   or by a request settled `confirmed` or `reverted`: a reorg may have freed it, and
//!   only its own signed bytes may fill it).
//! - **Nonce drift before signing** (issue 32 §3): a sender with nothing in flight
//!   (idle) is reconciled with the chain before it signs: a `pending` nonce above
//!   Keel's (a transaction sent from the key outside Keel) is adopted, one below it (a
//!   nonce Keel assigned that no node holds) is filled by nonce recovery at once. Keel
//!   never lowers its counter (a lower nonce could collide with an attempt of its own
//!   still in some pool); a busy sender's drift is resolved per request as above.
//!
//! ## Funding pauses
//!
//! A request enqueued with [`TxQueue::enqueue_with`] and
//! [`EnqueueOptions::funding_pause`] does not fail when its sender cannot pay for it.
//!
//! - **Detection, before a nonce.** While preparing a queued request (before any nonce
//!   is assigned) the sender pass compares the sender's `pending` balance, less what
//!   the requests signed ahead of it in the same pass cost, with its cost: gas limit ×
//!   max fee per gas + value, in wei (max fee = 2 × base fee + priority fee). When the
//!   balance is short (or the node refuses to estimate gas for lack of funds) the
//!   request moves to `waiting_funding` with a [`FundingRequest`]: the destination
//!   address (the sender), the required amount in wei (cost − balance), the deadline
//!   (database clock: the first detection + the pause; it never moves afterwards), and
//!   the gas limit and max fee the amount was computed from. It holds **no nonce**, so
//!   waiting can never leave a nonce gap. Without a funding pause the request settles
//!   `Failed { code: "GAS_REQUIRED" }` as before.
//! - **Every tick re-checks** the waiting requests of each sender (one balance read per
//!   sender): when the balance covers the cost at current fees the request goes back to
//!   `queued` and is signed in the same pass; past the deadline it settles
//!   `Failed { code: "FUNDING_DEADLINE_EXPIRED" }`; otherwise the required amount is
//!   updated (fees move, partial top-ups count).
//! - **Same-sender requests wait behind it** (head-of-line): while a sender has a
//!   `waiting_funding` request none of its later requests is signed, with or without a
//!   funding pause. Funds sent for the waiting request are therefore not spent by later
//!   requests, the sender's requests keep their submission order, and at most one
//!   request per sender waits at a time (the required amount covers that request only;
//!   the ones behind it are checked when their turn comes). Requests already signed
//!   before the pause are unaffected and proceed.
//! - **Refused after signing.** When a node still answers "insufficient funds" to the
//!   broadcast of a `signed` request (the balance moved between check and broadcast, or
//!   the funding has not reached that node), a request with a funding pause is retried
//!   with the same bytes on the next passes, at most
//!   [`TxQueueConfig::funding_broadcast_retries`] times, then it settles `GAS_REQUIRED`
//!   like a request without a pause; the nonce it held is then a gap that nonce recovery
//!   fills. A refused *replacement* (or re-broadcast) of a request an earlier attempt
//!   of which a node accepted never settles it: that attempt may still mine.
//! - **Reading them**: [`RequestStatus::funding`], [`TxQueue::funding_requests`] (this
//!   chain) and [`funding_requests`] (every chain or one, from the database only);
//!   [`funding_queued_behind`]: the `queued` requests each funding wait holds up.
//!
//! ## Settlements are pushed
//!
//! A [`SettlementSink`] ([`TxQueue::set_settlement_sink`], and the `sink` argument of
//! [`withdraw_by_key_prefix`]) receives every request that moves to `settled` — by
//! the confirmation pass, a failure before or at signing or broadcast, an expired
//! funding deadline or a withdrawal — inside the database transaction that settles it,
//! on that transaction's connection, exactly once (only the rows the guarded update
//! moved are passed). A sink error rolls the settlement back: the request keeps its
//! state and a later pass settles it again (`keel_txq_settlement_sink_failures_total`,
//! a WARN); a batch is then retried request by request at once, so a request the sink
//! refuses does not hold back the others. A request whose settlement before signing
//! rolled back stays `queued`, and its sender's later requests wait behind it (queue
//! order), as they would behind any request not yet prepared. Without a sink each
//! settle is one autocommit statement, as before.
//!
//! ## Progress is pushed too
//!
//! A [`ProgressSink`] ([`TxQueue::set_progress_sink`]) receives a request's first
//! broadcast (`signed` → `broadcast`: hash and nonce of the accepted attempt) and the
//! opening of its funding request (`queued` → `waiting_funding`: address, required wei,
//! deadline) inside the transaction that records them. A sink error never holds the queue
//! back: the change is recorded again at once, request by request with the sink, and
//! finally without it (`keel_txq_progress_sink_failures_total`, a WARN; see
//! `progress.rs`).
//!
//! ## Custody senders
//!
//! A sender registered with [`TxQueue::add_custody_sender`] is a vault account at a
//! custody provider that signs and broadcasts (`keel_custody::CustodyProvider`). Its
//! requests keep the queue's promises (idempotent enqueue, at most one effect, a typed
//! verdict) without a local nonce: see [`CustodySender`] and `custody.rs` for the
//! submission phases, the in-doubt rule, approvals, rejections (`CUSTODY_*` failure
//! codes), lost hashes, silent drops and the poll budget (migration 0040,
//! `txq_custody_attempt`). [`custody_wake`] is the wake-up a verified provider webhook
//! gives; [`custody_views`] / [`RequestStatus::custody`] / [`RequestView::custody`]
//! what an operator sees.
//!
//! ## Reading requests from other crates
//!
//! [`requests`] reads many requests by id as [`RequestView`]s (state, nonce, verdict,
//! the hash of the highest-numbered attempt, funding deadline, last broadcast error) in
//! one statement, so no other crate reads `txq_request` or `txq_attempt`.
//!
//! ## Layout
//!
//! `queue/` holds the queue by stage: `mod.rs` (the [`TxQueue`], its configuration, the
//! public entry points and the orchestration of a round and of the confirmation pass),
//! `prepare.rs`, `sign.rs`, `broadcast.rs`, `confirm.rs`, `replace.rs`, `recover.rs`,
//! the shared floor `attempt.rs` (one send and what the node said, settles, fee reads)
//! and `metrics.rs` (every metric). A stage uses `mod.rs`, `attempt.rs` and
//! `metrics.rs` only, never another stage. `service.rs` holds the two long-running
//! loops of [`TxQueue::run`] as background services on the shared shape of
//! `keel-service` (`txq-rounds`: nonce recovery and the sender rounds, woken by an
//! enqueue; `txq-confirm`: the confirmation pass and the gauges). `store/` holds the
//! SQL, one module per table (`request`, `funding`, `attempt`, `sender`, `custody`,
//! `watch`, `view`, `health`); stored hashes, addresses and chain ids decode at the
//! row (`keel_units::db`), and a row that does not decode is
//! [`TxqError::UnreadableRow`] naming its table.
//!
//! ## Metrics
//!
//! Labels are bounded: `chain_id`, `kind` (verdict kind), `class` (broadcast error
//! class, a closed set) and, for the in-flight gauge
//! only, `sender` (the registered signers' addresses, a configured set). Never request
//! ids or hashes.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `keel_txq_queue_depth` | gauge | `chain_id` | requests `queued` + `waiting_funding`, set every tick |
//! | `keel_txq_waiting_funding` | gauge | `chain_id` | requests `waiting_funding`, set every tick |
//! | `keel_txq_in_flight` | gauge | `chain_id`, `sender` | requests `signed` + `broadcast` per registered signer, set every tick |
//! | `keel_txq_sender_depth` | gauge | `chain_id`, `sender` | requests `queued` + `waiting_funding` per registered sender, set every tick |
//! | `keel_txq_sender_balance_wei` | gauge | `chain_id`, `sender` | a registered sender's balance at `pending`, wei, read every `BALANCE_REFRESH` (15 s) |
//! | `keel_txq_time_to_broadcast_seconds` | histogram | `chain_id` | enqueue → first accepted broadcast (includes any funding wait) |
//! | `keel_txq_time_to_confirmation_seconds` | histogram | `chain_id` | enqueue → settled `confirmed` or `reverted` (at the confirmation depth) |
//! | `keel_txq_verdicts_total` | counter | `chain_id`, `kind` | settled requests by verdict kind (`confirmed`, `reverted`, `failed`) |
//! | `keel_txq_replacements_total` | counter | `chain_id` | fee-bumped replacement attempts persisted |
//! | `keel_txq_replacements_capped_total` | counter | `chain_id` | replacements skipped at `max_fee_cap` |
//! | `keel_txq_enqueued_total` | counter | `chain_id` | new requests recorded (idempotent repeats excluded) |
//! | `keel_txq_signed_total` | counter | `chain_id` | requests signed (nonce assigned) |
//! | `keel_txq_broadcast_total` | counter | `chain_id` | broadcasts a node accepted (or already knew) |
//! | `keel_txq_broadcast_failures_total` | counter | `chain_id`, `class` | failed broadcasts by error class (a `keel_chain::NodeErrorKind` code, or `unavailable`) |
//! | `keel_txq_sign_failures_total` | counter | `chain_id`, `reason` | signatures a signer did not give (`SignerError::code`: `UNAVAILABLE`, `KEY_DISABLED`, `ACCESS_DENIED`, ...); nothing persisted, the requests stay queued |
//! | `keel_txq_funding_paused_total` | counter | `chain_id` | requests entering `waiting_funding` |
//! | `keel_txq_funding_resumed_total` | counter | `chain_id` | waiting requests resumed after funding |
//! | `keel_txq_nonce_adopted_total` | counter | `chain_id` | nonces advanced outside Keel and adopted |
//! | `keel_txq_nonce_gaps_filled_total` | counter | `chain_id` | gaps filled with zero-value self-transfers |
//! | `keel_txq_resigned_total` | counter | `chain_id` | requests re-signed at a fresh nonce after another transaction took theirs for good |
//! | `keel_txq_broadcasts_deferred_total` | counter | `chain_id` | broadcasts of requests whose earlier broadcasts failed, put off to the end of their backoff |
//! | `keel_txq_reorged_total` | counter | `chain_id` | settled transactions found out of the chain after a reorg (once per reorg) |
//! | `keel_txq_reorged_out_total` | counter | `chain_id` | settled verdicts replaced by `REORGED_OUT` |
//! | `keel_txq_settlement_sink_failures_total` | counter | `chain_id` | settling transactions rolled back because the [`SettlementSink`] failed |
//! | `keel_txq_progress_sink_failures_total` | counter | `chain_id`, `change` | transactions recording a first broadcast or a funding request (`change`: `broadcast`, `funding`, `custody_approval`) rolled back because the [`ProgressSink`] failed |
//! | `keel_txq_enqueue_batch_rows` | histogram | — | rows per group-commit `INSERT` of enqueues |
//! | `keel_txq_custody_creates_total` | counter | `chain_id`, `outcome` | custody creates: `created`, `in_doubt`, `retry`, `refused`, `config` |
//! | `keel_txq_custody_status_reads_total` | counter | `chain_id`, `phase` | provider reads by the status phase read |
//! | `keel_txq_custody_step_failures_total` | counter | `chain_id` | custody steps that failed (the request is deferred) |
//! | `keel_txq_custody_resubmissions_total` | counter | `chain_id` | silent drops cancelled and resubmitted |
//! | `keel_txq_custody_poll_budget_exceeded_total` | counter | `chain_id` | submissions that outlived the poll budget (also a WARN and [`CustodyView::budget_exceeded`]) |
//! | `keel_txq_custody_lost_hash_recovered_total` | counter | `chain_id` | hashes recovered by external id |
//!
//! [`TxQueue::run`]'s loops also carry `keel-service`'s metrics
//! (`keel_service_runs_total`, `keel_service_run_seconds`, `keel_service_items_total`,
//! `keel_service_consecutive_failures`) with `service` = `txq-rounds` (items: requests a
//! round moved) or `txq-confirm` (items: requests settled).
//!
//! In the `keel` binary the runner role runs [`TxQueue::run`] (sender passes, the
//! confirmation pass, fee bumps, nonce recovery, funding checks) per chain as the
//! cluster singleton `txq/<chainId>`, declined while the chain is not served (see
//! `crates/keel/src/services.rs`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod batch;
mod custody;
mod error;
mod failures;
mod funding;
mod health;
mod progress;
mod queue;
mod settlement;
mod signer;
mod state;
mod store;
mod submission;
mod verdict;
mod view;
mod withdraw;

pub use custody::{
    CustodySender, CustodySenderConfig, CustodyView, ORGANIZATION_SCOPED_KEY_PREFIX, custody_views,
    custody_wake, organization_scoped,
};
pub use error::{Result, TxqError};
pub use failures::{BroadcastFailure, broadcast_failures};
pub use funding::{FundingRequest, QueuedBehindFunding, funding_queued_behind, funding_requests};
pub use health::{CustodyCount, PendingApproval, SenderHealth, custody_health, queue_health};
pub use keel_store::UnknownStoredValue;
pub use progress::{Progress, ProgressSink, ProgressSinkError};
pub use queue::{
    BALANCE_REFRESH, EnqueueOptions, FeeModel, Finality, L1DataFee, PriorityFee, RequestStatus,
    TxQueue, TxQueueConfig, TxRequest,
};
pub use settlement::{Settled, SettlementSink, SettlementSinkError};
pub use signer::{LocalSigner, SignFuture, SignerError, SignerHandle, SignerRefusal, TxSigner};
pub use state::{RequestState, UnknownRequestState};
pub use submission::{CancelReason, CustodyPhase};
pub use verdict::{AttemptRecord, FailureCode, SettlementVerdict};
pub use view::{RequestView, requests};
pub use withdraw::{Withdrawal, withdraw_by_key_prefix};

/// The chain id of this crate's API (re-exported from `keel-units`).
pub use keel_units::ChainId;

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_counter!(
        "keel_txq_resigned_total",
        ::metrics::Unit::Count,
        "Requests re-signed at a fresh nonce after another transaction took theirs on the final chain (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_broadcasts_deferred_total",
        ::metrics::Unit::Count,
        "Broadcasts of requests whose earlier broadcasts failed, put off to the end of their backoff (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_reorged_total",
        ::metrics::Unit::Count,
        "Settled transactions found out of the chain after a reorg, once per reorg (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_reorged_out_total",
        ::metrics::Unit::Count,
        "Settled verdicts replaced by REORGED_OUT: another transaction took the nonce on the final chain (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_custody_creates_total",
        ::metrics::Unit::Count,
        "Custody creates by outcome (created, in_doubt, retry, refused, config) (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_custody_status_reads_total",
        ::metrics::Unit::Count,
        "Custody provider reads by the status phase read (pre_broadcast, awaiting_approval, broadcast, cancelling, completed, rejected, unknown) (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_custody_step_failures_total",
        ::metrics::Unit::Count,
        "Custody steps that failed and were deferred (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_custody_resubmissions_total",
        ::metrics::Unit::Count,
        "Silently dropped custody transactions cancelled and resubmitted (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_custody_poll_budget_exceeded_total",
        ::metrics::Unit::Count,
        "Custody submissions that outlived their poll budget (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_custody_lost_hash_recovered_total",
        ::metrics::Unit::Count,
        "Custody hashes recovered by external id after a COMPLETED without one (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_broadcast_failures_total",
        ::metrics::Unit::Count,
        "Transaction broadcasts that failed (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_sign_failures_total",
        ::metrics::Unit::Count,
        "Signatures a signer did not give, by reason; nothing was persisted for them (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_broadcast_total",
        ::metrics::Unit::Count,
        "Broadcasts a node accepted or already knew (count)."
    );
    ::metrics::describe_histogram!(
        "keel_txq_enqueue_batch_rows",
        ::metrics::Unit::Count,
        "Rows per group-commit INSERT of enqueues (rows)."
    );
    ::metrics::describe_counter!(
        "keel_txq_enqueued_total",
        ::metrics::Unit::Count,
        "Transactions enqueued (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_funding_paused_total",
        ::metrics::Unit::Count,
        "Times a sender paused for lack of funds (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_funding_resumed_total",
        ::metrics::Unit::Count,
        "Times a sender resumed after funding (count)."
    );
    ::metrics::describe_gauge!(
        "keel_txq_in_flight",
        ::metrics::Unit::Count,
        "Requests signed or broadcast and not yet settled, per sender (requests)."
    );
    ::metrics::describe_gauge!(
        "keel_txq_sender_depth",
        ::metrics::Unit::Count,
        "Requests queued or waiting for funding, per registered sender (requests)."
    );
    ::metrics::describe_gauge!(
        "keel_txq_sender_balance_wei",
        ::metrics::Unit::Count,
        "A registered sender's balance at the pending block, read every 15 s (wei)."
    );
    ::metrics::describe_counter!(
        "keel_txq_nonce_adopted_total",
        ::metrics::Unit::Count,
        "Nonces advanced outside Keel and adopted (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_nonce_gaps_filled_total",
        ::metrics::Unit::Count,
        "Nonce gaps filled (count)."
    );
    ::metrics::describe_gauge!(
        "keel_txq_queue_depth",
        ::metrics::Unit::Count,
        "Requests queued or waiting for funding, not yet signed (requests)."
    );
    ::metrics::describe_counter!(
        "keel_txq_replacements_capped_total",
        ::metrics::Unit::Count,
        "Replacements not sent because the fee cap was reached (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_replacements_total",
        ::metrics::Unit::Count,
        "Fee-bump replacements broadcast (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_settlement_sink_failures_total",
        ::metrics::Unit::Count,
        "Settling transactions rolled back because the settlement sink failed (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_progress_sink_failures_total",
        ::metrics::Unit::Count,
        "Transactions recording a first broadcast or a funding request rolled back because the progress sink failed, by change (broadcast, funding) (count)."
    );
    ::metrics::describe_counter!(
        "keel_txq_signed_total",
        ::metrics::Unit::Count,
        "Transactions signed (count)."
    );
    ::metrics::describe_histogram!(
        "keel_txq_time_to_broadcast_seconds",
        ::metrics::Unit::Seconds,
        "Time from enqueue to first broadcast (seconds)."
    );
    ::metrics::describe_histogram!(
        "keel_txq_time_to_confirmation_seconds",
        ::metrics::Unit::Seconds,
        "Time from enqueue to confirmation (seconds)."
    );
    ::metrics::describe_counter!(
        "keel_txq_verdicts_total",
        ::metrics::Unit::Count,
        "Final transaction verdicts (count)."
    );
    ::metrics::describe_gauge!(
        "keel_txq_waiting_funding",
        ::metrics::Unit::Count,
        "Requests waiting for the sender to be funded (requests)."
    );
}
