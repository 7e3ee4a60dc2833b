//! [`WorkflowContext`]: the journaled operations a workflow body may use.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sqlx::PgPool;
use tracing::Instrument;
use uuid::Uuid;

use crate::batch::{BatchOp, Combiner, Held, lost, rolled_back};
use crate::config::Backoff;
use crate::error::DurableError;
use crate::metrics as m;
use crate::payload::validate_name;
use crate::status::{WaitDescription, WaitKind};
use crate::workflow::{ChildHandle, ChildOutcome, Interrupt, SignalOutcome, StepError, Workflow};

/// A deadline for [`WorkflowContext::wait_signal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// This long after the wait is first reached (database clock).
    After(Duration),
    /// At this instant (an instant in the past means "now").
    At(DateTime<Utc>),
}

/// Flags shared between a segment and its lease-renewal task.
#[derive(Debug)]
pub(crate) struct SegmentFlags {
    pub(crate) fenced: AtomicBool,
    pub(crate) cancel_requested: AtomicBool,
    /// When the claim statement was sent (the lease's start, or earlier).
    base: Instant,
    /// Milliseconds after `base` at which the last successful renewal was sent.
    renewed_ms: AtomicU64,
}

impl SegmentFlags {
    /// Flags of a segment whose claim was sent at `claimed_at`.
    pub(crate) fn new(claimed_at: Instant) -> Self {
        Self {
            fenced: AtomicBool::new(false),
            cancel_requested: AtomicBool::new(false),
            base: claimed_at,
            renewed_ms: AtomicU64::new(0),
        }
    }

    /// Records a successful renewal whose statement was sent at `sent_at`.
    pub(crate) fn renewed(&self, sent_at: Instant) {
        let ms = u64::try_from(sent_at.saturating_duration_since(self.base).as_millis())
            .unwrap_or(u64::MAX);
        self.renewed_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// True when more than a third of the lease has passed since the last renewal was
    /// sent (or the claim): the next fenced write then renews the lease too.
    pub(crate) fn renewal_due(&self, lease_secs: f64) -> bool {
        let since = self.base.elapsed().as_secs_f64()
            - self.renewed_ms.load(Ordering::Acquire) as f64 / 1000.0;
        since * 3.0 > lease_secs
    }
}

/// Why a segment stopped before the body returned.
#[derive(Debug)]
pub(crate) enum Halt {
    Blocked(WaitDescription),
    Suspended {
        code: &'static str,
        /// The wake tag of a [`crate::StepError::Unavailable`] failure.
        wake: Option<String>,
    },
    /// The journal records `journaled` at `position`; the body reached `reached`.
    Determinism(Box<crate::version::Divergence>),
    /// A version gate met a recorded decision outside its supported range.
    VersionUnsupported(Box<crate::version::VersionGateDetail>),
    JournalIncompatible,
    InvalidName,
    Fenced,
    Cancelled,
    Infra(DurableError),
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JournalEntry {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) result: Value,
}

/// The context of one segment of one instance: replays the journal, then records new
/// results. Every recording is one fenced write: it checks the lease token in the same
/// statement (and renews the lease when a third of it has passed since the last
/// renewal) and fails (stopping the segment) when the token no longer matches.
pub struct WorkflowContext {
    pub(crate) pool: PgPool,
    pub(crate) instance_id: Uuid,
    pub(crate) workflow: &'static str,
    pub(crate) token: Uuid,
    pub(crate) lease_secs: f64,
    pub(crate) journal: Vec<JournalEntry>,
    pub(crate) cursor: usize,
    pub(crate) db_now: DateTime<Utc>,
    pub(crate) halt: Option<Halt>,
    pub(crate) progress: Option<Value>,
    pub(crate) flags: Arc<SegmentFlags>,
    /// The journal entries this segment recorded, for its history entries.
    pub(crate) trail: Vec<crate::history::TrailStep>,
    /// The latest progress the body set (kept after it is written), for the history.
    pub(crate) last_progress: Option<Value>,
    pub(crate) writer: Arc<Combiner<JournalOp>>,
    pub(crate) step_attempts: u32,
    pub(crate) step_backoff: Backoff,
    pub(crate) command_max_attempts: i32,
    /// The version the instance is pinned to (`durable_instance.version`).
    pub(crate) pinned_version: u32,
    /// The running code's [`crate::Workflow::VERSION`].
    pub(crate) code_version: u32,
}

impl std::fmt::Debug for WorkflowContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowContext")
            .field("instance_id", &self.instance_id)
            .field("workflow", &self.workflow)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

/// Journal appends of concurrent segments, as one statement (see [`crate::batch`]): one
/// row per write (`$1`..`$11` are parallel arrays, `$12` the lease in seconds). Each row
/// is fenced by its own token in the same statement: a row with `renew` updates its
/// instance row (lease renewed, progress written); the others only share-lock it (no new
/// row version, no index update), so a claim's `FOR UPDATE SKIP LOCKED` skips the
/// instance while the write is in flight, and a write that waits behind a claim (or any
/// other token change) re-checks the token on the new row version and finds no row.
/// Only the rows whose token matched (`f`) are inserted; the others are fenced out and
/// not returned. `mode` 0 journals `result`, 1 the database clock, 2 a deadline entry
/// (`now() + secs`, or `greatest(now(), at)`, or none) whose time and dueness are
/// returned too.
const JOURNAL_BATCH: &str = "\
WITH req AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::text[], $5::text[], $6::int4[],
                         $7::text[], $8::float8[], $9::timestamptz[], $10::bool[], $11::text[])
           WITH ORDINALITY AS t(instance_id, token, seq, kind, name, mode, result, secs, at,
                                renew, progress, idx)
), r AS (
    UPDATE durable_instance i
       SET lease_expires_at = now() + make_interval(secs => $12), updated_at = now(),
           progress = COALESCE(req.progress::jsonb, i.progress)
      FROM req
     WHERE req.renew AND i.id = req.instance_id AND i.lease_token = req.token
 RETURNING req.idx, i.cancel_requested_at
), s AS (
    SELECT req.idx, i.cancel_requested_at
      FROM req JOIN durable_instance i ON i.id = req.instance_id AND i.lease_token = req.token
     WHERE NOT req.renew
       FOR SHARE OF i
), f AS (
    SELECT idx, cancel_requested_at FROM r UNION ALL SELECT idx, cancel_requested_at FROM s
), v AS (
    SELECT req.idx, req.instance_id, req.seq, req.kind, req.name, req.mode, req.result,
           f.cancel_requested_at,
           CASE WHEN req.mode <> 2 THEN NULL
                WHEN req.secs IS NOT NULL THEN now() + make_interval(secs => req.secs)
                WHEN req.at IS NOT NULL THEN greatest(now(), req.at)
           END AS deadline
      FROM req JOIN f ON f.idx = req.idx
), j AS (
    INSERT INTO durable_journal (instance_id, seq, kind, name, result)
    SELECT instance_id, seq, kind, name,
           CASE mode WHEN 1 THEN jsonb_build_object('ok', to_jsonb(now()))
                     WHEN 2 THEN jsonb_build_object('ok', to_jsonb(deadline))
                     ELSE result::jsonb END
      FROM v
 RETURNING instance_id, seq, result
)
SELECT v.idx, v.cancel_requested_at IS NOT NULL AS cancel, j.result, v.deadline,
       coalesce(v.deadline <= now(), false) AS due
  FROM v JOIN j ON j.instance_id = v.instance_id AND j.seq = v.seq";

/// What a journal write records.
#[derive(Debug, Clone)]
pub(crate) enum JournalValue {
    /// This result (`{"ok": ..}` or `{"err": ..}`), as JSON text.
    Result(String),
    /// The database clock.
    Now,
    /// A deadline entry: `now() + secs`, `greatest(now(), at)`, or none.
    Deadline {
        secs: Option<f64>,
        at: Option<DateTime<Utc>>,
    },
}

/// One fenced journal write (a row of [`JOURNAL_BATCH`]).
#[derive(Debug, Clone)]
pub(crate) struct JournalWrite {
    pub(crate) instance_id: Uuid,
    pub(crate) token: Uuid,
    pub(crate) seq: i32,
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    pub(crate) value: JournalValue,
    pub(crate) renew: bool,
    /// JSON text.
    pub(crate) progress: Option<String>,
}

/// A committed journal write.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    pub(crate) cancel: bool,
    pub(crate) result: Value,
    pub(crate) deadline: Option<DateTime<Utc>>,
    pub(crate) due: bool,
}

/// A row of [`JOURNAL_BATCH`]: the write's 1-based position in the batch, then
/// [`Written`]'s fields.
type WrittenRow = (i64, bool, Value, Option<DateTime<Utc>>, bool);

/// The answer to one write: `Ok(None)` when it was fenced out (nothing written).
pub(crate) type JournalAnswer = Result<Option<Written>, DurableError>;

/// The journal appends of one engine, combined into [`JOURNAL_BATCH`] statements.
#[derive(Debug)]
pub(crate) struct JournalOp {
    pub(crate) lease_secs: f64,
}

impl JournalOp {
    async fn exec(
        &self,
        held: &mut Held,
        rows: &[JournalWrite],
    ) -> Result<Vec<Option<Written>>, sqlx::Error> {
        let r = match held.conn().await {
            Ok(conn) => self.exec_on(conn, rows).await,
            Err(e) => Err(e),
        };
        held.check(&r);
        r
    }

    async fn exec_on(
        &self,
        conn: &mut sqlx::PgConnection,
        rows: &[JournalWrite],
    ) -> Result<Vec<Option<Written>>, sqlx::Error> {
        let n = rows.len();
        let mut ids = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut seqs = Vec::with_capacity(n);
        let mut kinds = Vec::with_capacity(n);
        let mut names = Vec::with_capacity(n);
        let mut modes = Vec::with_capacity(n);
        let mut results = Vec::with_capacity(n);
        let mut secs = Vec::with_capacity(n);
        let mut ats = Vec::with_capacity(n);
        let mut renews = Vec::with_capacity(n);
        let mut progress = Vec::with_capacity(n);
        for w in rows {
            ids.push(w.instance_id);
            tokens.push(w.token);
            seqs.push(w.seq);
            kinds.push(w.kind);
            names.push(w.name.as_str());
            let (mode, result, s, at) = match &w.value {
                JournalValue::Result(r) => (0i32, Some(r.as_str()), None, None),
                JournalValue::Now => (1, None, None, None),
                JournalValue::Deadline { secs, at } => (2, None, *secs, *at),
            };
            modes.push(mode);
            results.push(result);
            secs.push(s);
            ats.push(at);
            renews.push(w.renew);
            progress.push(w.progress.as_deref());
        }
        let written: Vec<WrittenRow> = sqlx::query_as(JOURNAL_BATCH)
            .bind(ids)
            .bind(tokens)
            .bind(seqs)
            .bind(kinds)
            .bind(names)
            .bind(modes)
            .bind(results)
            .bind(secs)
            .bind(ats)
            .bind(renews)
            .bind(progress)
            .bind(self.lease_secs)
            .fetch_all(conn)
            .await?;
        let mut out: Vec<Option<Written>> = vec![None; n];
        for (idx, cancel, result, deadline, due) in written {
            let slot = usize::try_from(idx)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| out.get_mut(i));
            if let Some(slot) = slot {
                *slot = Some(Written {
                    cancel,
                    result,
                    deadline,
                    due,
                });
            }
        }
        Ok(out)
    }
}

impl BatchOp for JournalOp {
    type Req = JournalWrite;
    type Resp = JournalAnswer;

    fn weight(req: &JournalWrite) -> usize {
        let result = match &req.value {
            JournalValue::Result(r) => r.len(),
            _ => 0,
        };
        64 + req.name.len() + result + req.progress.as_ref().map_or(0, String::len)
    }

    async fn run(&self, held: &mut Held, batch: Vec<JournalWrite>) -> Vec<JournalAnswer> {
        match self.exec(held, &batch).await {
            Ok(rows) => rows.into_iter().map(Ok).collect(),
            Err(e) if batch.len() > 1 && rolled_back(&e) => {
                // Nothing of the batch was written: each row on its own, so a row that
                // fails does not fail the others.
                let mut answers = Vec::with_capacity(batch.len());
                for w in &batch {
                    answers.push(match self.exec(held, std::slice::from_ref(w)).await {
                        Ok(mut rows) => Ok(rows.pop().flatten()),
                        Err(e) => Err(DurableError::from(e)),
                    });
                }
                answers
            }
            Err(e) if batch.len() == 1 => vec![Err(DurableError::from(e))],
            Err(e) => batch.iter().map(|_| Err(lost(&e))).collect(),
        }
    }
}

const FENCE: &str = "\
UPDATE durable_instance
   SET lease_expires_at = now() + make_interval(secs => $3), updated_at = now(),
       progress = COALESCE($4::jsonb, progress)
 WHERE id = $1 AND lease_token = $2
RETURNING cancel_requested_at IS NOT NULL AS cancel, now() AS now";

impl WorkflowContext {
    /// The instance this segment runs.
    pub fn instance_id(&self) -> Uuid {
        self.instance_id
    }

    /// True while the body is replaying journaled results (useful to silence logs).
    pub fn is_replaying(&self) -> bool {
        self.cursor < self.journal.len()
    }

    /// Sets the progress snapshot shown by the status projection. Not journaled: it is
    /// written with the next recording (or the end of the segment), and a replay sets
    /// the same values again.
    pub fn set_progress(&mut self, progress: Value) {
        self.last_progress = Some(progress.clone());
        self.progress = Some(progress);
    }

    /// Ends the instance as `cancelled` from inside the body (return the interrupt with
    /// `?` or `Err(..into())`): for a workflow that learns, in a journaled step, that its
    /// caller asked it to stop. Nothing after this call runs; the segment settles the
    /// instance `cancelled` like an [`crate::Engine::cancel`] does. A replay that reaches
    /// the same call ends the same way.
    pub fn cancel_self(&mut self) -> Interrupt {
        self.halt(Halt::Cancelled)
    }

    pub(crate) fn halt(&mut self, halt: Halt) -> Interrupt {
        if self.halt.is_none() {
            self.halt = Some(halt);
        }
        Interrupt(())
    }

    pub(crate) fn check(&mut self) -> Result<(), Interrupt> {
        if self.halt.is_some() {
            return Err(Interrupt(()));
        }
        if self.flags.fenced.load(Ordering::Acquire) {
            return Err(self.halt(Halt::Fenced));
        }
        if self.flags.cancel_requested.load(Ordering::Acquire) {
            return Err(self.halt(Halt::Cancelled));
        }
        Ok(())
    }

    pub(crate) fn check_name(&mut self, name: &str) -> Result<(), Interrupt> {
        if validate_name("step name", name).is_err() {
            return Err(self.halt(Halt::InvalidName));
        }
        Ok(())
    }

    /// The journaled result at the cursor, if the journal reaches that far; a kind or
    /// name mismatch is a determinism violation.
    ///
    /// A version-gate entry (kind `version`) at the cursor that this call is not (a gate
    /// that a newer release recorded and this code does not have, or one a later release
    /// removed) is stepped over: see [`crate::version`].
    fn replay(&mut self, kind: &str, name: &str) -> Result<Option<Value>, Interrupt> {
        while kind != crate::version::KIND
            && self
                .journal
                .get(self.cursor)
                .is_some_and(|e| e.kind == crate::version::KIND)
        {
            self.cursor += 1;
        }
        let Some(entry) = self.journal.get(self.cursor) else {
            return Ok(None);
        };
        if entry.kind != kind || entry.name != name {
            tracing::error!(
                target: "keel::durable::replay",
                instance_id = %self.instance_id,
                position = self.cursor,
                "determinism violation: the body reached a different step than its journal"
            );
            let divergence = crate::version::Divergence {
                position: self.cursor,
                journaled: (entry.kind.clone(), entry.name.clone()),
                reached: (kind.to_owned(), name.to_owned()),
            };
            return Err(self.halt(Halt::Determinism(Box::new(divergence))));
        }
        let result = entry.result.clone();
        self.cursor += 1;
        Ok(Some(result))
    }

    fn decode<T: DeserializeOwned>(&mut self, v: Value) -> Result<T, Interrupt> {
        serde_json::from_value(v).map_err(|_| self.halt(Halt::JournalIncompatible))
    }

    /// `{"ok": v}` → `Ok(v)`, `{"err": e}` → `Err(e)`.
    fn decode_result<T: DeserializeOwned, E: DeserializeOwned>(
        &mut self,
        mut v: Value,
    ) -> Result<Result<T, E>, Interrupt> {
        if let Some(ok) = v.get_mut("ok") {
            let ok = ok.take();
            return self.decode(ok).map(Ok);
        }
        if let Some(err) = v.get_mut("err") {
            let err = err.take();
            return self.decode(err).map(Err);
        }
        Err(self.halt(Halt::JournalIncompatible))
    }

    fn seq(&self) -> i32 {
        i32::try_from(self.cursor).unwrap_or(i32::MAX)
    }

    fn fail_infra(&mut self, e: impl Into<DurableError>) -> Interrupt {
        self.halt(Halt::Infra(e.into()))
    }

    /// Appends one journal entry under the fence. `result: None` records the database
    /// clock (`{"ok": now()}`).
    pub(crate) async fn append(
        &mut self,
        kind: &'static str,
        name: &str,
        result: Option<Value>,
    ) -> Result<Value, Interrupt> {
        let value = match result {
            Some(v) => match serde_json::to_string(&v) {
                Ok(text) => JournalValue::Result(text),
                Err(_) => {
                    return Err(self.fail_infra(DurableError::Json {
                        what: "journal entry",
                    }));
                }
            },
            None => JournalValue::Now,
        };
        let written = self.write(kind, name, value).await?;
        Ok(written.result)
    }

    /// One fenced journal write through the engine's combiner; waits until it has
    /// committed (or was fenced out) before the body continues.
    async fn write(
        &mut self,
        kind: &'static str,
        name: &str,
        value: JournalValue,
    ) -> Result<Written, Interrupt> {
        let progress = match self.progress.as_ref().map(serde_json::to_string) {
            None => None,
            Some(Ok(text)) => Some(text),
            Some(Err(_)) => return Err(self.fail_infra(DurableError::Json { what: "progress" })),
        };
        let (renew, sent_at) = self.renew_now();
        let write = JournalWrite {
            instance_id: self.instance_id,
            token: self.token,
            seq: self.seq(),
            kind,
            name: name.to_owned(),
            value,
            renew,
            progress,
        };
        let answer = match self.writer.submit(write).await {
            Some(a) => a,
            None => {
                return Err(self.fail_infra(DurableError::Store(
                    keel_store::StoreError::Transient {
                        kind: keel_store::TransientKind::ConnectionLost,
                        sqlstate: None,
                    },
                )));
            }
        };
        let written = match answer {
            Ok(Some(w)) => w,
            Ok(None) => return Err(self.halt(Halt::Fenced)),
            Err(e) => return Err(self.fail_infra(e)),
        };
        if renew {
            self.flags.renewed(sent_at);
        }
        self.logged(kind, name, &written.result);
        self.after_write(written.cancel);
        Ok(written)
    }

    /// Whether the next fenced write renews the lease (a third of it has passed since
    /// the last renewal, or there is progress to write), and the instant it is sent.
    fn renew_now(&self) -> (bool, Instant) {
        let renew = self.progress.is_some() || self.flags.renewal_due(self.lease_secs);
        (renew, Instant::now())
    }

    /// Keeps a recorded journal entry for the segment's history entries.
    fn logged(&mut self, kind: &str, name: &str, result: &Value) {
        self.trail.push(crate::history::TrailStep {
            kind: kind.to_owned(),
            name: name.to_owned(),
            result: crate::history::summarize(kind, result),
            duration_ms: None,
            replayed: false,
        });
    }

    fn after_write(&mut self, cancel: bool) {
        self.progress = None;
        self.cursor += 1;
        if cancel {
            self.flags.cancel_requested.store(true, Ordering::Release);
        }
    }

    /// Runs a step: returns its journaled result on replay; otherwise runs `body`
    /// (retrying [`StepError::Transient`] up to the configured attempts with capped
    /// backoff), journals `Ok(T)` or the typed `Err(E)`, and returns it.
    ///
    /// The outer `Err(Interrupt)` means the segment stops here (propagate it with `?`):
    /// blocked, fenced out, cancelled, suspended after exhausted transient retries (nothing
    /// journaled; recovery is scheduled), or a determinism violation (the journal holds
    /// a different step at this position: the instance fails with
    /// `DETERMINISM_VIOLATION`).
    ///
    /// Steps are at-least-once: a step interrupted before its result was committed runs
    /// again in a later segment. The value returned is always the journaled JSON decoded
    /// again, so the first run and every replay see the same value.
    pub async fn step<T, E, F, Fut>(
        &mut self,
        name: &str,
        mut body: F,
    ) -> Result<Result<T, E>, Interrupt>
    where
        T: Serialize + DeserializeOwned + Send,
        E: Serialize + DeserializeOwned + Send,
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, StepError<E>>> + Send,
    {
        self.check()?;
        self.check_name(name)?;
        if let Some(v) = self.replay("step", name)? {
            m::step(self.workflow, "replayed");
            return self.decode_result(v);
        }
        let span = tracing::info_span!(target: "keel::durable::step", "step", workflow = self.workflow, step = name);
        let mut attempt: u32 = 0;
        let began = Instant::now();
        let result = loop {
            attempt += 1;
            match body().instrument(span.clone()).await {
                Ok(t) => match serde_json::to_value(&t) {
                    Ok(v) => break json!({ "ok": v }),
                    Err(_) => {
                        return Err(self.fail_infra(DurableError::Json {
                            what: "step result",
                        }));
                    }
                },
                Err(StepError::Failed(e)) => match serde_json::to_value(&e) {
                    Ok(v) => break json!({ "err": v }),
                    Err(_) => {
                        return Err(self.fail_infra(DurableError::Json { what: "step error" }));
                    }
                },
                Err(e @ (StepError::Transient { .. } | StepError::Unavailable { .. })) => {
                    let (code, wake) = match e {
                        StepError::Unavailable { code, wake } => (code, Some(wake)),
                        StepError::Transient { code } => (code, None),
                        StepError::Failed(_) => ("TRANSIENT", None),
                    };
                    tracing::warn!(target: "keel::durable::step", parent: &span, attempt, code, "step failed transiently");
                    if attempt >= self.step_attempts {
                        m::step(self.workflow, "suspended");
                        // A tag outside the bounds is dropped (the recovery backoff
                        // still resumes the instance).
                        let wake = wake.filter(|w| (1..=255).contains(&w.chars().count()));
                        return Err(self.halt(Halt::Suspended { code, wake }));
                    }
                    tokio::time::sleep(self.step_backoff.delay(attempt)).await;
                    self.check()?;
                }
            }
        };
        let took = began.elapsed();
        let stored = self.append("step", name, Some(result)).await?;
        if let Some(last) = self.trail.last_mut() {
            last.duration_ms = Some(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
        }
        let outcome = if stored.get("ok").is_some() {
            "ok"
        } else {
            "err"
        };
        m::step(self.workflow, outcome);
        self.decode_result(stored)
    }

    /// The database clock, journaled.
    pub async fn now(&mut self) -> Result<DateTime<Utc>, Interrupt> {
        self.check()?;
        let v = match self.replay("now", "")? {
            Some(v) => v,
            None => self.append("now", "", None).await?,
        };
        self.decode_ok(v)
    }

    pub(crate) fn decode_ok<T: DeserializeOwned>(&mut self, mut v: Value) -> Result<T, Interrupt> {
        match v.get_mut("ok") {
            Some(ok) => {
                let ok = ok.take();
                self.decode(ok)
            }
            None => Err(self.halt(Halt::JournalIncompatible)),
        }
    }

    /// A random (v4) UUID, journaled.
    pub async fn uuid(&mut self) -> Result<Uuid, Interrupt> {
        self.check()?;
        let v = match self.replay("uuid", "")? {
            Some(v) => v,
            None => {
                self.append("uuid", "", Some(json!({ "ok": Uuid::new_v4() })))
                    .await?
            }
        };
        self.decode_ok(v)
    }

    /// A random `u64`, journaled (stored as a decimal string: JSON numbers lose
    /// precision above 2^53 in many readers).
    pub async fn random(&mut self) -> Result<u64, Interrupt> {
        self.check()?;
        let v = match self.replay("random", "")? {
            Some(v) => v,
            None => {
                let r = (Uuid::new_v4().as_u128() >> 64) as u64;
                self.append("random", "", Some(json!({ "ok": r.to_string() })))
                    .await?
            }
        };
        let s: String = self.decode_ok(v)?;
        s.parse().map_err(|_| self.halt(Halt::JournalIncompatible))
    }

    /// Records a deadline entry (and its TIMER command when in the future).
    async fn record_deadline(
        &mut self,
        kind: &'static str,
        name: &str,
        deadline: Option<Deadline>,
    ) -> Result<(Option<DateTime<Utc>>, bool), Interrupt> {
        let (secs, at) = match deadline {
            Some(Deadline::After(d)) => (Some(d.as_secs_f64()), None),
            Some(Deadline::At(t)) => (None, Some(t)),
            None => (None, None),
        };
        let written = self
            .write(kind, name, JournalValue::Deadline { secs, at })
            .await?;
        Ok((written.deadline, written.due))
    }

    /// A durable sleep: the deadline is `now() + duration` on the database clock,
    /// recorded once; the instance is `waiting` until a TIMER command at the deadline
    /// runs it again. A zero duration records the entry and continues.
    pub async fn sleep(&mut self, duration: Duration) -> Result<(), Interrupt> {
        self.sleep_inner(Deadline::After(duration)).await
    }

    /// A durable sleep until `at` (database clock; an instant in the past continues at
    /// once).
    pub async fn sleep_until(&mut self, at: DateTime<Utc>) -> Result<(), Interrupt> {
        self.sleep_inner(Deadline::At(at)).await
    }

    async fn sleep_inner(&mut self, deadline: Deadline) -> Result<(), Interrupt> {
        self.check()?;
        let (at, due) = match self.replay("sleep", "")? {
            Some(v) => {
                let at: Option<DateTime<Utc>> = self.decode_ok(v)?;
                (at, at.is_none_or(|t| t <= self.db_now))
            }
            None => self.record_deadline("sleep", "", Some(deadline)).await?,
        };
        if due {
            Ok(())
        } else {
            Err(self.halt(Halt::Blocked(WaitDescription {
                kind: WaitKind::Timer,
                name: None,
                deadline: at,
            })))
        }
    }

    /// Waits for the signal `name`. Resolution rule: the earliest unconsumed signal of
    /// that name whose `recorded_at` is no later than the deadline wins, even when the
    /// executor runs late; otherwise, once the database clock has passed the deadline,
    /// [`SignalOutcome::Expired`] is journaled. Signals recorded before the wait is
    /// reached are kept and consumed here. Without a deadline it waits indefinitely.
    ///
    /// A payload that does not decode into `T` fails the instance with
    /// `JOURNAL_INCOMPATIBLE`.
    pub async fn wait_signal<T: DeserializeOwned>(
        &mut self,
        name: &str,
        deadline: Option<Deadline>,
    ) -> Result<SignalOutcome<T>, Interrupt> {
        self.check()?;
        self.check_name(name)?;
        let deadline_at = match self.replay("wait", name)? {
            Some(v) => self.decode_ok::<Option<DateTime<Utc>>>(v)?,
            None => self.record_deadline("wait", name, deadline).await?.0,
        };
        if let Some(v) = self.replay("signal", name)? {
            return self.decode_ok(v);
        }
        match self.resolve_signal(name, deadline_at).await {
            Ok(Some(v)) => self.decode_ok(v),
            Ok(None) => Err(self.halt(Halt::Blocked(WaitDescription {
                kind: WaitKind::Signal,
                name: Some(name.to_owned()),
                deadline: deadline_at,
            }))),
            Err(DurableError::Fenced) => Err(self.halt(Halt::Fenced)),
            Err(e) => Err(self.fail_infra(e)),
        }
    }

    /// Consumes the winning signal or records the expiry, under the fence; `None` when
    /// the wait must block.
    async fn resolve_signal(
        &mut self,
        name: &str,
        deadline: Option<DateTime<Utc>>,
    ) -> Result<Option<Value>, DurableError> {
        let mut tx = self.pool.begin().await?;
        let fence: Option<(bool, DateTime<Utc>)> = sqlx::query_as(FENCE)
            .bind(self.instance_id)
            .bind(self.token)
            .bind(self.lease_secs)
            .bind(self.progress.as_ref())
            .fetch_optional(&mut *tx)
            .await?;
        let Some((cancel, now)) = fence else {
            return Err(DurableError::Fenced);
        };
        let signal: Option<(i64, Value)> = sqlx::query_as(
            "SELECT id, payload FROM durable_signal
              WHERE instance_id = $1 AND name = $2 AND consumed_seq IS NULL
                AND ($3::timestamptz IS NULL OR recorded_at <= $3)
              ORDER BY recorded_at, id LIMIT 1 FOR UPDATE",
        )
        .bind(self.instance_id)
        .bind(name)
        .bind(deadline)
        .fetch_optional(&mut *tx)
        .await?;
        let result = match signal {
            Some((id, payload)) => {
                sqlx::query("UPDATE durable_signal SET consumed_seq = $2 WHERE id = $1")
                    .bind(id)
                    .bind(self.seq())
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "UPDATE durable_instance SET open_signals = greatest(open_signals - 1, 0) WHERE id = $1",
                )
                .bind(self.instance_id)
                .execute(&mut *tx)
                .await?;
                json!({ "ok": { "received": payload } })
            }
            None if deadline.is_some_and(|d| now >= d) => json!({ "ok": "expired" }),
            None => {
                tx.rollback().await?;
                if cancel {
                    self.flags.cancel_requested.store(true, Ordering::Release);
                }
                return Ok(None);
            }
        };
        sqlx::query(
            "INSERT INTO durable_journal (instance_id, seq, kind, name, result) VALUES ($1, $2, 'signal', $3, $4)",
        )
        .bind(self.instance_id)
        .bind(self.seq())
        .bind(name)
        .bind(&result)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.logged("signal", name, &result);
        self.after_write(cancel);
        Ok(Some(result))
    }

    /// Starts a child instance of `W`, journaled: the child's idempotency key is
    /// `<this instance's id>:<key>`, so a replay (or a crash between the insert and the
    /// journal write) finds the same child. `key` is 1 to 218 characters. The child runs
    /// on its own (with its own commands) and is not cancelled with its parent.
    ///
    /// A replay that starts the child with a different input fails this instance with
    /// `DETERMINISM_VIOLATION`.
    pub async fn start_child<W: Workflow>(
        &mut self,
        key: &str,
        input: &W::Input,
    ) -> Result<ChildHandle<W>, Interrupt> {
        self.check()?;
        self.check_name(key)?;
        let child_key = format!("{}:{key}", self.instance_id);
        if validate_name("child key", &child_key).is_err() {
            return Err(self.halt(Halt::InvalidName));
        }
        let id = match self.replay("child", key)? {
            Some(v) => self.decode_ok::<Uuid>(v)?,
            None => {
                let Ok(value) = serde_json::to_value(input) else {
                    return Err(self.fail_infra(DurableError::Json {
                        what: "child input",
                    }));
                };
                match self
                    .record_child(W::NAME, W::VERSION.max(1), key, &child_key, &value)
                    .await
                {
                    Ok(Some(id)) => id,
                    Ok(None) => {
                        let divergence = crate::version::Divergence {
                            position: self.cursor,
                            journaled: ("child".to_owned(), key.to_owned()),
                            reached: ("child".to_owned(), key.to_owned()),
                        };
                        return Err(self.halt(Halt::Determinism(Box::new(divergence))));
                    }
                    Err(DurableError::Fenced) => return Err(self.halt(Halt::Fenced)),
                    Err(e) => return Err(self.fail_infra(e)),
                }
            }
        };
        Ok(ChildHandle {
            instance_id: id,
            _workflow: std::marker::PhantomData,
        })
    }

    /// Inserts the child (or finds it) and journals its id, under the fence. `None` when
    /// the key names a child with another input.
    async fn record_child(
        &mut self,
        workflow: &str,
        version: u32,
        key: &str,
        child_key: &str,
        input: &Value,
    ) -> Result<Option<Uuid>, DurableError> {
        let mut tx = self.pool.begin().await?;
        let fence: Option<(bool, DateTime<Utc>)> = sqlx::query_as(FENCE)
            .bind(self.instance_id)
            .bind(self.token)
            .bind(self.lease_secs)
            .bind(self.progress.as_ref())
            .fetch_optional(&mut *tx)
            .await?;
        let Some((cancel, _)) = fence else {
            return Err(DurableError::Fenced);
        };
        let created: Option<Uuid> = sqlx::query_scalar(
            "WITH ins AS (
                INSERT INTO durable_instance (id, workflow, idempotency_key, input, parent_id,
                                              version, trace_context)
                VALUES ($1, $2, $3, $4, $5, $7, $8)
                ON CONFLICT (workflow, idempotency_key) DO NOTHING
             RETURNING id
             ), cmd AS (
                INSERT INTO durable_command (instance_id, kind, max_attempts,
                                             actor_kind, actor_reason, attribution_status)
                SELECT id, 'start', $6, 'SYSTEM', 'child-start', 'VERIFIED' FROM ins
             )
             SELECT id FROM ins",
        )
        .bind(Uuid::new_v4())
        .bind(workflow)
        .bind(child_key)
        .bind(input)
        .bind(self.instance_id)
        .bind(self.command_max_attempts)
        .bind(i32::try_from(version).unwrap_or(i32::MAX))
        // The child joins the trace of the segment that starts it.
        .bind(keel_service::trace::current_traceparent())
        .fetch_optional(&mut *tx)
        .await?;
        let id = match created {
            Some(id) => id,
            None => {
                let existing: Option<(Uuid, bool)> = sqlx::query_as(
                    "SELECT id, input = $3 FROM durable_instance WHERE workflow = $1 AND idempotency_key = $2",
                )
                .bind(workflow)
                .bind(child_key)
                .bind(input)
                .fetch_optional(&mut *tx)
                .await?;
                match existing {
                    Some((id, true)) => id,
                    _ => return Ok(None),
                }
            }
        };
        sqlx::query(
            "INSERT INTO durable_journal (instance_id, seq, kind, name, result) VALUES ($1, $2, 'child', $3, $4)",
        )
        .bind(self.instance_id)
        .bind(self.seq())
        .bind(key)
        .bind(json!({ "ok": id }))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.logged("child", key, &json!({ "ok": id }));
        self.after_write(cancel);
        Ok(Some(id))
    }

    /// Waits until the child ends (`completed` or `cancelled`), or the deadline passes.
    /// A `failed` child has not ended (it can be retried): the parent keeps waiting, so
    /// give a deadline when that matters. Works like [`WorkflowContext::wait_signal`]
    /// on the signal `child:<child id>` that the child's end records.
    pub async fn await_child<W: Workflow>(
        &mut self,
        child: ChildHandle<W>,
        deadline: Option<Deadline>,
    ) -> Result<ChildOutcome<W::Output>, Interrupt> {
        #[derive(serde::Deserialize)]
        struct Ended {
            status: crate::status::RunStatus,
            output: Option<Value>,
        }
        let name = format!("child:{}", child.instance_id);
        match self.wait_signal::<Ended>(&name, deadline).await? {
            SignalOutcome::Expired => Ok(ChildOutcome::Expired),
            SignalOutcome::Received(e) if e.status == crate::status::RunStatus::Completed => {
                let out = e.output.unwrap_or(Value::Null);
                Ok(ChildOutcome::Completed(self.decode(out)?))
            }
            SignalOutcome::Received(_) => Ok(ChildOutcome::Cancelled),
        }
    }
}
