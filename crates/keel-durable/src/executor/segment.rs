//! A segment slot: runs a claimed command's segment (the ended-instance table, then the
//! workflow body in its own task under a renewed lease) and decides how it ends
//! ([`Disposition`]); [`super::finish`] writes that end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::AbortOnDrop;
use super::claim::Claimed;
use super::finish::finish;
use super::outcome::Outcome;
use crate::context::{Halt, JournalEntry, SegmentFlags, WorkflowContext};
use crate::engine::Engine;
use crate::metrics as m;
use crate::status::CommandKind;
use crate::status::{RunStatus, WaitDescription};
use crate::store;
use crate::version::ClaimSet;
use crate::workflow::ErasedOutcome;

/// How a segment ends: what its segment settle writes.
pub(super) struct SegmentSettle {
    pub(super) status: RunStatus,
    pub(super) output: Option<Value>,
    /// Code, retryable, value-free message, detail.
    pub(super) error: Option<(String, bool, &'static str, Option<Value>)>,
    pub(super) wait: Option<WaitDescription>,
    pub(super) outcome: Outcome,
    /// The wake tag of a suspension ([`crate::StepError::Unavailable`]).
    pub(super) wake: Option<String>,
}

impl SegmentSettle {
    fn new(status: RunStatus, outcome: Outcome) -> Self {
        Self {
            status,
            output: None,
            error: None,
            wait: None,
            outcome,
            wake: None,
        }
    }

    fn failed(code: &str, retryable: bool, message: &'static str) -> Self {
        Self {
            error: Some((code.to_owned(), retryable, message, None)),
            ..Self::new(RunStatus::Failed, Outcome::Failed)
        }
    }
}

/// How a segment ends.
pub(super) enum Disposition {
    /// The body ran (or a cancel ends the instance): the segment settle.
    Settle(SegmentSettle),
    /// No body ran (the instance had ended): the command is settled with this outcome.
    SettleCommand(Outcome),
    /// The command goes back to the queue with a backoff; the code says why.
    Release(&'static str),
    /// Fenced out: write nothing (the lease lapsed or was taken).
    Abandon,
}

/// What a segment slot needs besides its command.
pub(super) struct SlotContext {
    pub(super) engine: Arc<Engine>,
    pub(super) renew_every: Duration,
    pub(super) renew: bool,
    /// The registered workflows, for claiming the next command with the segment settle.
    pub(super) names: Arc<ClaimSet>,
    pub(super) cancel: CancellationToken,
    /// The executor listens for notifications ([`ExecutorConfig::listen`]).
    pub(super) listen: bool,
    /// The last claim (the loop's, or a segment settle's) got every command it asked
    /// for, so more may be queued: segment settles then claim their slot's next command.
    /// Once a claim comes back short, the queue was drained as of that claim; work that
    /// arrives later notifies (every command insert does, and every settle that may
    /// make a queued command claimable), so until then a segment settle claims nothing
    /// and a segment that ends does not send the loop to claim again (each would be an
    /// empty claim per settle batch and per segment: under a burst that the executor
    /// keeps pace with, most of its claims). Without a listener, always true in effect.
    pub(super) backlog: AtomicBool,
}

impl SlotContext {
    /// Whether a segment settle should claim the slot's next command, and a segment end
    /// wake the loop: more work may be queued, or no notification would say so.
    fn expect_work(&self) -> bool {
        !self.listen || self.backlog.load(Ordering::Acquire)
    }
}

/// A segment slot: runs the claimed command's segment, and then the commands claimed
/// with its segment settles (settle-and-claim-next), until a segment settle brings no command or
/// the executor is shutting down; then frees the slot.
pub(super) async fn segment(
    slot: Arc<SlotContext>,
    c: Claimed,
    claimed_at: Instant,
    permit: OwnedSemaphorePermit,
    wake: Arc<Notify>,
) {
    let mut next = Some((c, claimed_at));
    // A segment that ended other than by a plain settle (a release with a backoff, a
    // fenced or failed settle whose lease lapses, a command settled alone) sends the
    // loop round: its next-due query sees the released command or the lapsing lease.
    let mut plain = true;
    while let Some((c, claimed_at)) = next.take() {
        let want_next =
            (!slot.cancel.is_cancelled() && slot.expect_work()).then(|| slot.names.clone());
        let (outcome, got, drained) = run_segment(&slot, c, claimed_at, want_next).await;
        plain = outcome.is_plain_settle();
        if drained {
            // The settle's claim came back short: the queue is drained as of it.
            slot.backlog.store(false, Ordering::Release);
        }
        next = got;
        if let Some((c, _)) = &next {
            m::claim_latency(&c.workflow, c.latency);
        }
    }
    drop(permit);
    if !plain || slot.expect_work() {
        wake.notify_one();
    }
}

/// A segment released because the database failed transiently (a pool timeout, a lost
/// connection, a serialization failure): not the command's fault.
const DATABASE_UNAVAILABLE: &str = "DATABASE_UNAVAILABLE";
/// A segment released because its journal could not be read.
const JOURNAL_READ_FAILED: &str = "JOURNAL_READ_FAILED";
/// Release codes whose claim's attempt is given back (issue 32 §11): a database that
/// is briefly unavailable under load (500 starts after a restart exhaust a 10-connection
/// pool) must not dead-letter the commands it could not serve; their release backoff
/// still paces them. Attempts stay spent by crashes (a lapsed lease), panics and
/// non-transient failures, which is what the dead letter is for.
pub(super) const REFUNDED: &[&str] = &[DATABASE_UNAVAILABLE, JOURNAL_READ_FAILED];

/// One segment; returns its outcome and the next command when its segment settle claimed
/// one for this slot.
async fn run_segment(
    slot: &SlotContext,
    c: Claimed,
    claimed_at: Instant,
    want_next: Option<Arc<ClaimSet>>,
) -> (Outcome, Option<(Claimed, Instant)>, bool) {
    let started = Instant::now();
    let engine = &slot.engine;
    // The instance's trace (recorded by its start), read before the span is entered.
    let traceparent = if engine.config.continue_traces {
        store::instance_trace_context(&engine.pool, c.instance_id)
            .await
            .ok()
            .flatten()
    } else {
        None
    };
    let span = tracing::info_span!(target: "keel::durable::segment", "segment",
        workflow = %c.workflow, instance_id = %c.instance_id, kind = %c.kind, attempt = c.attempt,
        outcome = tracing::field::Empty);
    if let Some(tp) = &traceparent {
        keel_service::trace::continue_trace(&span, tp);
    }
    async {
        let Some(token) = c.lease_token else {
            return (Outcome::NoToken, None, false);
        };
        let mut trail = crate::history::SegmentTrail::default();
        let disposition = decide(
            engine,
            &c,
            token,
            claimed_at,
            slot.renew_every,
            slot.renew,
            &mut trail,
        )
        .await;
        let progress = trail.progress.take();
        let (outcome, next, drained) = match finish(engine, &c, token, disposition, progress, trail, want_next).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(target: "keel::durable::segment", error = %e, "segment settle failed; the lease will lapse");
                (Outcome::SettleFailed, None, false)
            }
        };
        tracing::Span::current().record("outcome", outcome.as_str());
        m::settled(&c.workflow, outcome.as_str());
        m::segment_duration(&c.workflow, started.elapsed().as_secs_f64());
        (outcome, next, drained)
    }
    .instrument(span)
    .await
}

/// The ended-instance table (see the crate docs), then the segment itself.
async fn decide(
    engine: &Arc<Engine>,
    c: &Claimed,
    token: Uuid,
    claimed_at: Instant,
    renew_every: Duration,
    renew: bool,
    trail: &mut crate::history::SegmentTrail,
) -> Disposition {
    match (c.status, c.kind) {
        (RunStatus::Completed, CommandKind::Signal) => {
            return Disposition::SettleCommand(Outcome::Rejected);
        }
        (RunStatus::Completed, _) => return Disposition::SettleCommand(Outcome::Stale),
        (RunStatus::Cancelled, _) => return Disposition::SettleCommand(Outcome::Cancelled),
        (RunStatus::Failed, CommandKind::Signal) => {
            return Disposition::SettleCommand(Outcome::Parked);
        }
        (RunStatus::Failed, CommandKind::Cancel) => {
            return Disposition::Settle(SegmentSettle::new(
                RunStatus::Cancelled,
                Outcome::Cancelled,
            ));
        }
        (RunStatus::Failed, _) => return Disposition::SettleCommand(Outcome::Stale),
        (_, CommandKind::Cancel) => {
            return Disposition::Settle(SegmentSettle::new(
                RunStatus::Cancelled,
                Outcome::Cancelled,
            ));
        }
        _ => {}
    }
    if c.cancel {
        return Disposition::Settle(SegmentSettle::new(RunStatus::Cancelled, Outcome::Cancelled));
    }
    let Some((name, workflow)) = engine
        .registry
        .by_name
        .get_key_value(c.workflow.as_str())
        .map(|(k, v)| (*k, v.clone()))
    else {
        return Disposition::Release("WORKFLOW_NOT_REGISTERED");
    };
    let Some(range) = engine.registry.range(name) else {
        return Disposition::Release("WORKFLOW_NOT_REGISTERED");
    };
    // The claim only hands out instances pinned to a version in the range (and pins an
    // unpinned one); check again rather than run the wrong code.
    let pinned = c
        .version
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(range.max);
    if !range.contains(pinned) {
        return Disposition::Release("VERSION_NOT_RUNNABLE");
    }
    // A START on its first attempt is the instance's first claim ever (every claim
    // spends an attempt, and no other command of the instance can run before its START:
    // it is the instance's first command and precedes the rest while it is runnable),
    // so no segment has journaled anything yet: skip the read.
    let first_start = c.kind == CommandKind::Start && c.attempt == 1;
    // The history's log position is read beside the journal (a first START's is the
    // one its recording wrote).
    let journal: Vec<JournalEntry> = if first_start {
        trail.prior = Some(crate::history::Prior::initial());
        Vec::new()
    } else {
        let (j, prior) = tokio::join!(
            store::journal_entries(&engine.pool, c.instance_id),
            crate::history::prior(&engine.pool, c.instance_id)
        );
        match (j, prior) {
            (Ok(j), Ok(prior)) => {
                trail.prior = prior;
                j
            }
            _ => return Disposition::Release(JOURNAL_READ_FAILED),
        }
    };
    let logged = trail
        .prior
        .as_ref()
        .map_or(0, |p| usize::try_from(p.history_journal).unwrap_or(0));
    trail.steps = journal
        .iter()
        .skip(logged)
        .map(crate::history::TrailStep::from_journal)
        .collect();
    let flags = Arc::new(SegmentFlags::new(claimed_at));
    let lease_secs = engine.config.lease.as_secs_f64();
    let _renewal = renew.then(|| {
        AbortOnDrop(tokio::spawn(renew_lease(
            engine.pool.clone(),
            c.instance_id,
            token,
            lease_secs,
            renew_every,
            flags.clone(),
        )))
    });
    let mut ctx = WorkflowContext {
        pool: engine.pool.clone(),
        instance_id: c.instance_id,
        workflow: name,
        token,
        lease_secs,
        journal,
        cursor: 0,
        db_now: c.db_now,
        halt: None,
        progress: None,
        flags: flags.clone(),
        trail: Vec::new(),
        last_progress: None,
        writer: engine.journal.clone(),
        step_attempts: engine.config.step_attempts,
        step_backoff: engine.config.step_backoff,
        command_max_attempts: i32::try_from(engine.config.command_max_attempts).unwrap_or(i32::MAX),
        pinned_version: pinned,
        code_version: range.max,
    };
    let input = c.input.clone();
    // The body runs in its own task so that a panic is contained (the command is
    // released with a backoff and its attempts eventually dead-letter it).
    let body = AbortOnDrop(tokio::spawn(
        async move {
            let outcome = workflow.run(&mut ctx, input).await;
            (ctx, outcome)
        }
        .in_current_span(),
    ));
    let (mut ctx, outcome) = match (&mut { body }.0).await {
        Ok(r) => r,
        Err(_) => return Disposition::Release("PANICKED"),
    };
    trail.progress = ctx.progress.clone();
    trail.journal_len = i32::try_from(ctx.journal.len().max(ctx.cursor)).unwrap_or(i32::MAX);
    trail.last_progress = ctx.last_progress.take();
    trail.steps.append(&mut ctx.trail);
    if flags.fenced.load(Ordering::Acquire) {
        return Disposition::Abandon;
    }
    if let Some(halt) = ctx.halt {
        return match halt {
            Halt::Blocked(wait) => Disposition::Settle(SegmentSettle {
                wait: Some(wait),
                ..SegmentSettle::new(RunStatus::Waiting, Outcome::Waiting)
            }),
            Halt::Suspended { code, wake } => Disposition::Settle(SegmentSettle {
                error: Some((
                    code.to_owned(),
                    true,
                    if wake.is_some() {
                        "a step's transient retries were exhausted; it resumes as soon as what it needs is back (and recovery is scheduled)"
                    } else {
                        "a step's transient retries were exhausted; recovery is scheduled"
                    },
                    None,
                )),
                wake,
                ..SegmentSettle::new(RunStatus::Suspended, Outcome::Suspended)
            }),
            Halt::Determinism(d) => {
                let detail = d.detail(Some(pinned), range.max);
                Disposition::Settle(SegmentSettle {
                    error: Some((
                        "DETERMINISM_VIOLATION".to_owned(),
                        false,
                        "the body reached a different step than its journal records at that position (see detail: the position, both steps and both versions)",
                        serde_json::to_value(detail).ok(),
                    )),
                    ..SegmentSettle::new(RunStatus::Failed, Outcome::Failed)
                })
            }
            Halt::VersionUnsupported(d) => Disposition::Settle(SegmentSettle {
                error: Some((
                    "VERSION_UNSUPPORTED".to_owned(),
                    false,
                    "a version gate met a recorded decision this code no longer supports (see detail)",
                    serde_json::to_value(*d).ok(),
                )),
                ..SegmentSettle::new(RunStatus::Failed, Outcome::Failed)
            }),
            Halt::JournalIncompatible => Disposition::Settle(SegmentSettle::failed(
                "JOURNAL_INCOMPATIBLE",
                false,
                "a journaled value does not decode into the type the body expects",
            )),
            Halt::InvalidName => Disposition::Settle(SegmentSettle::failed(
                "INVALID_NAME",
                false,
                "a step or signal name is empty or longer than 255 characters",
            )),
            Halt::Fenced => Disposition::Abandon,
            Halt::Cancelled => {
                Disposition::Settle(SegmentSettle::new(RunStatus::Cancelled, Outcome::Cancelled))
            }
            Halt::Infra(e) => {
                tracing::warn!(target: "keel::durable::segment", error = %e, "segment failed on infrastructure");
                if e.is_retryable() {
                    Disposition::Release(DATABASE_UNAVAILABLE)
                } else {
                    Disposition::Release("INFRASTRUCTURE")
                }
            }
        };
    }
    match outcome {
        ErasedOutcome::Completed(v) => Disposition::Settle(SegmentSettle {
            output: Some(v),
            ..SegmentSettle::new(RunStatus::Completed, Outcome::Completed)
        }),
        ErasedOutcome::Failed(v) => Disposition::Settle(SegmentSettle {
            error: Some((
                "WORKFLOW_FAILED".to_owned(),
                false,
                "the workflow returned its typed error (see detail)",
                Some(v),
            )),
            ..SegmentSettle::new(RunStatus::Failed, Outcome::Failed)
        }),
        ErasedOutcome::InputIncompatible => Disposition::Settle(SegmentSettle::failed(
            "INPUT_INCOMPATIBLE",
            false,
            "the stored input does not decode into the workflow's input type",
        )),
        ErasedOutcome::EncodeFailed => Disposition::Settle(SegmentSettle::failed(
            "ENCODE_FAILED",
            false,
            "the output or typed error could not be encoded as JSON",
        )),
        // Interrupted without a recorded halt cannot happen; be safe.
        ErasedOutcome::Interrupted => Disposition::Release("INTERRUPTED"),
    }
}

async fn renew_lease(
    pool: sqlx::PgPool,
    instance_id: Uuid,
    token: Uuid,
    lease_secs: f64,
    every: Duration,
    flags: Arc<SegmentFlags>,
) {
    loop {
        tokio::time::sleep(every).await;
        let sent_at = Instant::now();
        let r = store::instance_renew_lease(&pool, instance_id, token, lease_secs).await;
        match r {
            Ok(Some(cancel)) => {
                flags.renewed(sent_at);
                if cancel {
                    flags.cancel_requested.store(true, Ordering::Release);
                }
            }
            Ok(None) => {
                flags.fenced.store(true, Ordering::Release);
                return;
            }
            Err(e) => {
                tracing::warn!(target: "keel::durable::segment", error = %keel_store::StoreError::from(e), "lease renewal failed");
            }
        }
    }
}
