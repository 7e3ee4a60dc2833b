//! The executor: claims commands, runs segments, settles them; wakes on notifications,
//! a timer for the earliest future command, and a poll fallback.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::config::ExecutorConfig;
use crate::context::{Halt, JournalEntry, SegmentFlags, WorkflowContext};
use crate::engine::{Engine, parse_status};
use crate::error::{DurableError, Result};
use crate::metrics as m;
use crate::status::{RunStatus, WaitDescription};
use crate::workflow::ErasedOutcome;

/// The notification channel (`pg_notify('keel_durable', '')` on every command insert,
/// and on a settlement that may make a command claimable for another executor).
pub const CHANNEL: &str = "keel_durable";

/// A running executor. Dropping the handle does not stop it; call
/// [`ExecutorHandle::shutdown`] or [`ExecutorHandle::abort`].
#[derive(Debug)]
pub struct ExecutorHandle {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl ExecutorHandle {
    /// Stops claiming and waits for the running segments to settle.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }

    /// Stops claiming and waits up to `grace` for the running segments; then aborts
    /// the rest (their leases lapse). Returns true when everything settled in time.
    pub async fn shutdown_within(mut self, grace: Duration) -> bool {
        self.cancel.cancel();
        match tokio::time::timeout(grace, &mut self.task).await {
            Ok(_) => true,
            Err(_) => {
                self.task.abort();
                let _ = (&mut self.task).await;
                false
            }
        }
    }

    /// Stops at once, dropping running segments mid-flight (their leases lapse and
    /// another executor claims their commands): what a crash looks like to the database.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Aborts a task when dropped, so an aborted executor leaves no segment behind.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn spawn(engine: Engine, config: ExecutorConfig) -> ExecutorHandle {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(Arc::new(engine), config, cancel.clone()));
    ExecutorHandle { cancel, task }
}

#[derive(Debug, sqlx::FromRow)]
struct Claimed {
    command_id: i64,
    kind: String,
    attempt: i32,
    exhausted: bool,
    latency: f64,
    instance_id: Uuid,
    workflow: String,
    status: String,
    input: Value,
    lease_token: Option<Uuid>,
    cancel: bool,
    recovery_attempts: i32,
    db_now: DateTime<Utc>,
}

/// One statement: up to `$3` of the oldest available queued commands of registered
/// workflows whose instance holds no live lease, that no earlier runnable command of
/// their instance precedes, and (for a START) that no earlier unfinished instance with
/// the same serialization key precedes. The per-instance check means at most one
/// command per instance (and one START per serialization key) qualifies, so a batch
/// never holds two commands of one instance. Each is set running with attempt + 1 and
/// its instance leased with a new token — or dead-lettered when its attempts are spent.
const CLAIM: &str = "\
WITH cand AS (
    SELECT c.id AS command_id, c.instance_id, c.attempt + 1 > c.max_attempts AS exhausted,
           (c.kind <> 'cancel' AND i.status IN ('pending', 'waiting', 'suspended')) AS flip
      FROM durable_command c
      JOIN durable_instance i ON i.id = c.instance_id
     WHERE c.state = 'queued' AND c.available_at <= now()
       AND (i.lease_expires_at IS NULL OR i.lease_expires_at <= now())
       AND i.workflow = ANY($1::text[])
       AND NOT EXISTS (
           SELECT 1 FROM durable_command e
            WHERE e.instance_id = c.instance_id AND e.id < c.id
              AND (e.state = 'running' OR (e.state = 'queued' AND e.available_at <= now())))
       AND NOT (c.kind = 'start' AND i.serialization_key IS NOT NULL AND EXISTS (
           SELECT 1 FROM durable_instance p
            WHERE p.serialization_key = i.serialization_key AND p.start_order < i.start_order
              AND p.status NOT IN ('completed', 'cancelled')))
     ORDER BY c.available_at, c.id
     LIMIT $3
       FOR UPDATE OF c, i SKIP LOCKED
), cmd AS (
    UPDATE durable_command c
       SET attempt = CASE WHEN cand.exhausted THEN c.attempt ELSE c.attempt + 1 END,
           state = CASE WHEN cand.exhausted THEN 'dead' ELSE 'running' END,
           completed_at = CASE WHEN cand.exhausted THEN now() END,
           outcome = CASE WHEN cand.exhausted THEN 'dead_letter' END,
           last_error = CASE WHEN cand.exhausted THEN coalesce(c.last_error, 'ATTEMPTS_EXHAUSTED')
                             ELSE c.last_error END
      FROM cand
     WHERE c.id = cand.command_id
 RETURNING c.id, c.instance_id, c.kind, c.attempt, cand.exhausted,
           extract(epoch FROM now() - c.available_at)::float8 AS latency
), inst AS (
    UPDATE durable_instance i
       SET lease_token = CASE WHEN cand.exhausted THEN NULL ELSE gen_random_uuid() END,
           lease_expires_at = CASE WHEN cand.exhausted THEN NULL
                                   ELSE now() + make_interval(secs => $2) END,
           status = CASE WHEN cand.flip AND NOT cand.exhausted THEN 'running' ELSE i.status END,
           wait = CASE WHEN cand.flip AND NOT cand.exhausted THEN NULL ELSE i.wait END,
           updated_at = now()
      FROM cand
     WHERE i.id = cand.instance_id
 RETURNING i.id, i.workflow, i.status, i.input, i.lease_token,
           i.cancel_requested_at IS NOT NULL AS cancel, i.recovery_attempts
)
SELECT cmd.id AS command_id, cmd.kind, cmd.attempt, cmd.exhausted, cmd.latency,
       inst.id AS instance_id, inst.workflow, inst.status, inst.input, inst.lease_token,
       inst.cancel, inst.recovery_attempts, now() AS db_now
  FROM cmd JOIN inst ON inst.id = cmd.instance_id
 ORDER BY cmd.id";

/// Settles a segment under the fence: the instance's new state, the command done, the
/// open commands of an instance that ended, the lease released, and `extra` (the
/// recovery RETRY of a suspension or the TIMER of a blocked wait with a deadline: only
/// in the statements that need them, since every `INSERT INTO durable_command`, even of
/// zero rows, fires the notifying statement trigger).
///
/// It notifies (`n`) only when the release may make a command claimable for another
/// executor: the instance has another queued command (in the statement's snapshot), or
/// may get one concurrently (open signals, a cancel request: both are read from the row
/// version this update wrote, which is the latest), or it holds a serialization key (a
/// later START may now run). The executor that settles claims again anyway.
macro_rules! settle {
    ($extra:literal) => {
        concat!(
            "WITH i AS (
    UPDATE durable_instance
       SET status = $3, output = $4, error_code = $5, error_retryable = $6, error_message = $7,
           error_detail = $8, wait = $9, progress = COALESCE($10::jsonb, progress),
           ended_at = CASE WHEN $3 IN ('completed', 'failed', 'cancelled') THEN now() END,
           recovery_attempts = CASE WHEN $3 = 'suspended' THEN recovery_attempts + 1 ELSE 0 END,
           cancel_requested_at = CASE WHEN $3 = 'cancelled' THEN coalesce(cancel_requested_at, now())
                                      ELSE cancel_requested_at END,
           lease_token = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE id = $1 AND lease_token = $2
 RETURNING id, serialization_key, open_signals, cancel_requested_at
), c AS (
    UPDATE durable_command SET state = 'done', outcome = $11, completed_at = now()
      FROM i WHERE durable_command.id = $12
 RETURNING durable_command.id
), o AS (
    UPDATE durable_command SET state = 'done', outcome = 'instance_' || $3, completed_at = now()
      FROM i
     WHERE durable_command.instance_id = i.id AND durable_command.state = 'queued'
       AND durable_command.id <> $12 AND $3 IN ('completed', 'cancelled', 'failed')
       AND NOT ($3 = 'failed' AND durable_command.kind IN ('cancel', 'retry'))
 RETURNING durable_command.id
)",
            $extra,
            ", n AS (
    SELECT pg_notify('keel_durable', '') FROM i
     WHERE i.serialization_key IS NOT NULL OR i.open_signals > 0
        OR i.cancel_requested_at IS NOT NULL
        OR EXISTS (SELECT 1 FROM durable_command x
                    WHERE x.instance_id = i.id AND x.state = 'queued' AND x.id <> $12)
)
SELECT (SELECT count(*) FROM i) AS settled, (SELECT count(*) FROM n) AS notified"
        )
    };
}

/// [`settle!`] for a segment that completed, failed, was cancelled or blocked without a
/// deadline.
const SETTLE: &str = settle!("");

/// [`settle!`] for a suspension: a recovery RETRY after `$13` seconds (`$14` attempts).
const SETTLE_SUSPENDED: &str = settle!(
    ", r AS (
    INSERT INTO durable_command (instance_id, kind, available_at, max_attempts)
    SELECT i.id, 'retry', now() + make_interval(secs => $13), $14 FROM i
 RETURNING id
)"
);

/// [`settle!`] for a blocked wait with a deadline `$15`: its TIMER (`$14` attempts),
/// unless one at or before the deadline is queued.
const SETTLE_TIMER: &str = settle!(
    ", t AS (
    INSERT INTO durable_command (instance_id, kind, available_at, max_attempts)
    SELECT i.id, 'timer', $15, $14 FROM i
     WHERE NOT EXISTS (
           SELECT 1 FROM durable_command x
            WHERE x.instance_id = i.id AND x.kind = 'timer' AND x.state = 'queued'
              AND x.id <> $12 AND x.available_at <= $15)
 RETURNING id
)"
);

/// Settles only the command (the instance is unchanged) and releases the lease.
const SETTLE_COMMAND: &str = "\
WITH i AS (
    UPDATE durable_instance SET lease_token = NULL, lease_expires_at = NULL
     WHERE id = $1 AND lease_token = $2
 RETURNING id
), c AS (
    UPDATE durable_command SET state = 'done', outcome = $4, completed_at = now()
      FROM i WHERE durable_command.id = $3
 RETURNING durable_command.id
), n AS (
    SELECT pg_notify('keel_durable', '') FROM i
)
SELECT (SELECT count(*) FROM i) AS settled, (SELECT count(*) FROM n) AS notified";

/// Puts the command back with a backoff after an infrastructure failure (attempt kept).
const RELEASE: &str = "\
WITH i AS (
    UPDATE durable_instance SET lease_token = NULL, lease_expires_at = NULL
     WHERE id = $1 AND lease_token = $2
 RETURNING id
), c AS (
    UPDATE durable_command
       SET state = 'queued', available_at = now() + make_interval(secs => $4), last_error = $5
      FROM i WHERE durable_command.id = $3
 RETURNING durable_command.id
)
SELECT count(*) FROM c";

/// The rescuer: a running command whose instance's lease lapsed (its executor crashed
/// or stalled) is queued again at its original position, its attempt kept (the next
/// claim spends one). A stalled executor that wakes later is fenced out by the new
/// token of whoever claims next.
const RESCUE: &str = "\
UPDATE durable_command c SET state = 'queued'
  FROM durable_instance i
 WHERE c.state = 'running' AND i.id = c.instance_id
   AND (i.lease_expires_at IS NULL OR i.lease_expires_at <= now())";

const RENEW: &str = "\
UPDATE durable_instance SET lease_expires_at = now() + make_interval(secs => $3)
 WHERE id = $1 AND lease_token = $2
RETURNING cancel_requested_at IS NOT NULL";

/// Seconds to the earliest future queued command, seconds to the earliest lease expiry
/// (negative when one has lapsed), and the queue depth.
const NEXT_DUE: &str = "\
SELECT extract(epoch FROM (SELECT min(available_at) FROM durable_command
                            WHERE state = 'queued' AND available_at > now()) - now())::float8,
       extract(epoch FROM (SELECT min(lease_expires_at) FROM durable_instance
                            WHERE lease_expires_at IS NOT NULL) - now())::float8,
       (SELECT count(*) FROM durable_command WHERE state = 'queued')";

async fn run(engine: Arc<Engine>, config: ExecutorConfig, cancel: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let _listener = config.listen.then(|| {
        AbortOnDrop(tokio::spawn(listen(
            engine.pool.clone(),
            wake.clone(),
            cancel.clone(),
        )))
    });
    let names = engine.registry.names();
    let slots = Arc::new(Semaphore::new(config.concurrency));
    let mut segments: JoinSet<()> = JoinSet::new();
    let mut last_rescue: Option<Instant> = None;
    // When the earliest lease (as of the last next-due query) lapses: an empty claim
    // runs the rescuer only from then on (and at least once per poll interval anyway).
    let mut rescue_from: Option<Instant> = Some(Instant::now());
    loop {
        // Rescue lapsed leases at least once per poll interval, even under load.
        if last_rescue.is_none_or(|t| t.elapsed() >= config.poll_interval) {
            last_rescue = Some(Instant::now());
            rescue(&engine).await;
        }
        while segments.try_join_next().is_some() {}
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = cancel.cancelled() => break,
        };
        // Claim for every free slot in one statement.
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let wanted = permits.len();
        let claimed_at = Instant::now();
        match claim(&engine, &names, wanted).await {
            Ok(batch) if !batch.is_empty() => {
                let full = batch.len() >= wanted;
                for c in batch {
                    if c.exhausted {
                        tracing::warn!(target: "keel::durable::executor", command_id = c.command_id,
                            instance_id = %c.instance_id, kind = %c.kind, "command dead-lettered");
                        m::dead_letter(&c.workflow);
                        m::settled(&c.workflow, "dead_letter");
                        continue;
                    }
                    let Some(permit) = permits.pop() else { break };
                    m::claim_latency(&c.workflow, c.latency);
                    let engine = engine.clone();
                    let wake = wake.clone();
                    let renew_every = config.renew_every(&engine.config);
                    let renew = config.renew_leases;
                    segments.spawn(segment(
                        engine,
                        c,
                        claimed_at,
                        permit,
                        wake,
                        renew_every,
                        renew,
                    ));
                }
                drop(permits);
                if full {
                    continue;
                }
            }
            Ok(_) => {
                drop(permits);
                if rescue_from.is_some_and(|t| Instant::now() >= t) && rescue(&engine).await > 0 {
                    last_rescue = Some(Instant::now());
                    continue;
                }
            }
            Err(e) => {
                drop(permits);
                tracing::warn!(target: "keel::durable::executor", error = %e, "claim failed");
            }
        }
        let mut pause = config.poll_interval;
        match sqlx::query_as::<_, (Option<f64>, Option<f64>, i64)>(NEXT_DUE)
            .fetch_one(&engine.pool)
            .await
        {
            Ok((next, lease, depth)) => {
                m::queue_depth(depth);
                let now = Instant::now();
                rescue_from = lease.map(|secs| now + Duration::from_secs_f64(secs.max(0.0)));
                for secs in [next, lease.filter(|s| *s > 0.0)].into_iter().flatten() {
                    let d = Duration::from_secs_f64(secs.max(0.0)) + Duration::from_millis(2);
                    pause = pause.min(d);
                }
            }
            Err(e) => {
                rescue_from = Some(Instant::now());
                tracing::warn!(target: "keel::durable::executor", error = %e, "next-due query failed")
            }
        }
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(pause) => {}
            Some(_) = segments.join_next() => {}
            () = cancel.cancelled() => break,
        }
    }
    while segments.join_next().await.is_some() {}
}

/// Keeps a LISTEN connection; wakes the loop on every notification and after every
/// (re)connection (notifications sent while disconnected are lost).
async fn listen(pool: sqlx::PgPool, wake: Arc<Notify>, cancel: CancellationToken) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(target: "keel::durable::listener", error = %keel_store::StoreError::from(e), "listen connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                    () = cancel.cancelled() => return,
                }
            }
        };
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!(target: "keel::durable::listener", error = %keel_store::StoreError::from(e), "LISTEN failed");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                () = cancel.cancelled() => return,
            }
        }
        wake.notify_one();
        loop {
            tokio::select! {
                r = listener.try_recv() => match r {
                    Ok(Some(_)) => wake.notify_one(),
                    Ok(None) | Err(_) => {
                        tracing::info!(target: "keel::durable::listener", "listen connection lost; reconnecting");
                        wake.notify_one();
                        break;
                    }
                },
                () = cancel.cancelled() => return,
            }
        }
    }
}

async fn rescue(engine: &Engine) -> u64 {
    match sqlx::query(RESCUE).execute(&engine.pool).await {
        Ok(r) => {
            if r.rows_affected() > 0 {
                tracing::info!(target: "keel::durable::executor", commands = r.rows_affected(),
                    "rescued commands whose lease lapsed");
            }
            r.rows_affected()
        }
        Err(e) => {
            tracing::warn!(target: "keel::durable::executor", error = %keel_store::StoreError::from(e), "rescue failed");
            0
        }
    }
}

async fn claim(engine: &Engine, names: &[String], limit: usize) -> Result<Vec<Claimed>> {
    // Unprepared on purpose: as a prepared statement PostgreSQL may switch it to a
    // generic plan chosen while the tables were nearly empty (a full scan and sort of
    // every queued command), which the benchmark saw take 150-1,100 ms per claim until
    // the next ANALYZE. An unnamed statement is planned with its parameters each time.
    Ok(sqlx::query_as::<_, Claimed>(CLAIM)
        .persistent(false)
        .bind(names)
        .bind(engine.config.lease.as_secs_f64())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&engine.pool)
        .await?)
}

/// How a segment ends.
struct Settlement {
    status: RunStatus,
    output: Option<Value>,
    error: Option<(String, bool, &'static str, Option<Value>)>,
    wait: Option<WaitDescription>,
    outcome: &'static str,
}

impl Settlement {
    fn new(status: RunStatus, outcome: &'static str) -> Self {
        Self {
            status,
            output: None,
            error: None,
            wait: None,
            outcome,
        }
    }

    fn failed(code: &str, retryable: bool, message: &'static str) -> Self {
        Self {
            error: Some((code.to_owned(), retryable, message, None)),
            ..Self::new(RunStatus::Failed, "failed")
        }
    }
}

enum Disposition {
    Settle(Settlement),
    SettleCommand(&'static str),
    Release(&'static str),
    Abandon,
}

async fn segment(
    engine: Arc<Engine>,
    c: Claimed,
    claimed_at: Instant,
    permit: OwnedSemaphorePermit,
    wake: Arc<Notify>,
    renew_every: Duration,
    renew: bool,
) {
    let started = Instant::now();
    let span = tracing::info_span!(target: "keel::durable::segment", "segment",
        workflow = %c.workflow, instance_id = %c.instance_id, kind = %c.kind, attempt = c.attempt,
        outcome = tracing::field::Empty);
    async {
        let Some(token) = c.lease_token else {
            return;
        };
        let mut progress = None;
        let disposition = decide(
            &engine,
            &c,
            token,
            claimed_at,
            renew_every,
            renew,
            &mut progress,
        )
        .await;
        let outcome = match finish(&engine, &c, token, disposition, progress).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(target: "keel::durable::segment", error = %e, "settlement failed; the lease will lapse");
                "settle_failed"
            }
        };
        tracing::Span::current().record("outcome", outcome);
        m::settled(&c.workflow, outcome);
        m::segment_duration(&c.workflow, started.elapsed().as_secs_f64());
    }
    .instrument(span)
    .await;
    drop(permit);
    wake.notify_one();
}

/// The ended-instance table (see the crate docs), then the segment itself.
async fn decide(
    engine: &Arc<Engine>,
    c: &Claimed,
    token: Uuid,
    claimed_at: Instant,
    renew_every: Duration,
    renew: bool,
    progress: &mut Option<Value>,
) -> Disposition {
    let status = match parse_status(&c.status) {
        Ok(s) => s,
        Err(_) => return Disposition::Release("STATUS_UNKNOWN"),
    };
    match (status, c.kind.as_str()) {
        (RunStatus::Completed, "signal") => return Disposition::SettleCommand("rejected"),
        (RunStatus::Completed, _) => return Disposition::SettleCommand("stale"),
        (RunStatus::Cancelled, _) => return Disposition::SettleCommand("cancelled"),
        (RunStatus::Failed, "signal") => return Disposition::SettleCommand("parked"),
        (RunStatus::Failed, "cancel") => {
            return Disposition::Settle(Settlement::new(RunStatus::Cancelled, "cancelled"));
        }
        (RunStatus::Failed, _) => return Disposition::SettleCommand("stale"),
        (_, "cancel") => {
            return Disposition::Settle(Settlement::new(RunStatus::Cancelled, "cancelled"));
        }
        _ => {}
    }
    if c.cancel {
        return Disposition::Settle(Settlement::new(RunStatus::Cancelled, "cancelled"));
    }
    let Some((name, workflow)) = engine
        .registry
        .by_name
        .get_key_value(c.workflow.as_str())
        .map(|(k, v)| (*k, v.clone()))
    else {
        return Disposition::Release("WORKFLOW_NOT_REGISTERED");
    };
    // A START on its first attempt is the instance's first claim ever (every claim
    // spends an attempt, and no other command of the instance can run before its START:
    // it is the instance's first command and precedes the rest while it is runnable),
    // so no segment has journaled anything yet: skip the read.
    let first_start = c.kind == "start" && c.attempt == 1;
    let journal: Vec<JournalEntry> = if first_start {
        Vec::new()
    } else {
        match sqlx::query_as(
            "SELECT kind, name, result FROM durable_journal WHERE instance_id = $1 ORDER BY seq",
        )
        .bind(c.instance_id)
        .fetch_all(&engine.pool)
        .await
        {
            Ok(j) => j,
            Err(_) => return Disposition::Release("JOURNAL_READ_FAILED"),
        }
    };
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
        step_attempts: engine.config.step_attempts,
        step_backoff: engine.config.step_backoff,
        command_max_attempts: i32::try_from(engine.config.command_max_attempts).unwrap_or(i32::MAX),
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
    let (ctx, outcome) = match (&mut { body }.0).await {
        Ok(r) => r,
        Err(_) => return Disposition::Release("PANICKED"),
    };
    *progress = ctx.progress.clone();
    if flags.fenced.load(Ordering::Acquire) {
        return Disposition::Abandon;
    }
    if let Some(halt) = ctx.halt {
        return match halt {
            Halt::Blocked(wait) => Disposition::Settle(Settlement {
                wait: Some(wait),
                ..Settlement::new(RunStatus::Waiting, "waiting")
            }),
            Halt::Suspended { code } => Disposition::Settle(Settlement {
                error: Some((
                    code.to_owned(),
                    true,
                    "a step's transient retries were exhausted; recovery is scheduled",
                    None,
                )),
                ..Settlement::new(RunStatus::Suspended, "suspended")
            }),
            Halt::Determinism => Disposition::Settle(Settlement::failed(
                "DETERMINISM_VIOLATION",
                false,
                "the body reached a different step than its journal records at that position",
            )),
            Halt::JournalIncompatible => Disposition::Settle(Settlement::failed(
                "JOURNAL_INCOMPATIBLE",
                false,
                "a journaled value does not decode into the type the body expects",
            )),
            Halt::InvalidName => Disposition::Settle(Settlement::failed(
                "INVALID_NAME",
                false,
                "a step or signal name is empty or longer than 255 characters",
            )),
            Halt::Fenced => Disposition::Abandon,
            Halt::Cancelled => {
                Disposition::Settle(Settlement::new(RunStatus::Cancelled, "cancelled"))
            }
            Halt::Infra(e) => {
                tracing::warn!(target: "keel::durable::segment", error = %e, "segment failed on infrastructure");
                Disposition::Release("INFRASTRUCTURE")
            }
        };
    }
    match outcome {
        ErasedOutcome::Completed(v) => Disposition::Settle(Settlement {
            output: Some(v),
            ..Settlement::new(RunStatus::Completed, "completed")
        }),
        ErasedOutcome::Failed(v) => Disposition::Settle(Settlement {
            error: Some((
                "WORKFLOW_FAILED".to_owned(),
                false,
                "the workflow returned its typed error (see detail)",
                Some(v),
            )),
            ..Settlement::new(RunStatus::Failed, "failed")
        }),
        ErasedOutcome::InputIncompatible => Disposition::Settle(Settlement::failed(
            "INPUT_INCOMPATIBLE",
            false,
            "the stored input does not decode into the workflow's input type",
        )),
        ErasedOutcome::EncodeFailed => Disposition::Settle(Settlement::failed(
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
        let r: std::result::Result<Option<bool>, _> = sqlx::query_scalar(RENEW)
            .bind(instance_id)
            .bind(token)
            .bind(lease_secs)
            .fetch_optional(&pool)
            .await;
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

async fn finish(
    engine: &Engine,
    c: &Claimed,
    token: Uuid,
    disposition: Disposition,
    progress: Option<Value>,
) -> Result<&'static str> {
    let max_attempts = i32::try_from(engine.config.command_max_attempts).unwrap_or(i32::MAX);
    match disposition {
        Disposition::Abandon => Ok("fenced"),
        Disposition::SettleCommand(outcome) => {
            let (settled, _): (i64, i64) = sqlx::query_as(SETTLE_COMMAND)
                .bind(c.instance_id)
                .bind(token)
                .bind(c.command_id)
                .bind(outcome)
                .fetch_one(&engine.pool)
                .await?;
            Ok(if settled == 1 { outcome } else { "fenced" })
        }
        Disposition::Release(code) => {
            let attempt = u32::try_from(c.attempt).unwrap_or(1);
            let delay = engine.config.release_backoff.delay(attempt);
            sqlx::query_scalar::<_, i64>(RELEASE)
                .bind(c.instance_id)
                .bind(token)
                .bind(c.command_id)
                .bind(delay.as_secs_f64())
                .bind(code)
                .fetch_one(&engine.pool)
                .await?;
            Ok("released")
        }
        Disposition::Settle(s) => {
            let recovery = engine
                .config
                .recovery_backoff
                .delay(u32::try_from(c.recovery_attempts).unwrap_or(0) + 1);
            let wait = match &s.wait {
                Some(w) => {
                    Some(serde_json::to_value(w).map_err(|_| DurableError::Json { what: "wait" })?)
                }
                None => None,
            };
            let timer_at = s.wait.as_ref().and_then(|w| w.deadline);
            let (code, retryable, message, detail) = match s.error {
                Some((c, r, m, d)) => (Some(c), Some(r), Some(m), d),
                None => (None, None, None, None),
            };
            let sql = match (s.status, timer_at) {
                (RunStatus::Suspended, _) => SETTLE_SUSPENDED,
                (RunStatus::Waiting, Some(_)) => SETTLE_TIMER,
                _ => SETTLE,
            };
            let (settled, _): (i64, i64) = sqlx::query_as(sql)
                .bind(c.instance_id)
                .bind(token)
                .bind(s.status.as_str())
                .bind(s.output)
                .bind(code)
                .bind(retryable)
                .bind(message)
                .bind(detail)
                .bind(wait)
                .bind(progress)
                .bind(s.outcome)
                .bind(c.command_id)
                .bind(recovery.as_secs_f64())
                .bind(max_attempts)
                .bind(timer_at)
                .fetch_one(&engine.pool)
                .await?;
            Ok(if settled == 1 { s.outcome } else { "fenced" })
        }
    }
}
