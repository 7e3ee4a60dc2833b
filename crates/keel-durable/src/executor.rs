//! The executor: claims commands, runs segments, ends each with its segment settle; wakes
//! on notifications,
//! a timer for the earliest future command, and a poll fallback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::batch::{BatchOp, Held, lost, rolled_back};
use crate::config::ExecutorConfig;
use crate::context::{Halt, JournalEntry, SegmentFlags, WorkflowContext};
use crate::engine::Engine;
use crate::error::{DurableError, Result};
use crate::metrics as m;
use crate::status::{RunStatus, WaitDescription};
use crate::store::{self, parse_status};
use crate::version::ClaimSet;
use crate::workflow::ErasedOutcome;

/// The notification channel (`pg_notify('keel_durable', '')` on every command insert,
/// and on a segment settle that may make a command claimable for another executor).
pub const CHANNEL: &str = "keel_durable";

/// A running executor. Dropping the handle does not stop it; call
/// [`ExecutorHandle::shutdown`] or [`ExecutorHandle::abort`].
#[derive(Debug)]
pub struct ExecutorHandle {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl ExecutorHandle {
    /// Whether the executor's task has ended. It runs until [`ExecutorHandle::shutdown`]
    /// (or `abort`); an end before that (a panic) means nothing claims commands here
    /// any more, and the caller should restart or exit.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

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
pub(crate) struct Claimed {
    pub(crate) command_id: i64,
    pub(crate) kind: String,
    pub(crate) attempt: i32,
    pub(crate) exhausted: bool,
    pub(crate) latency: f64,
    pub(crate) instance_id: Uuid,
    pub(crate) workflow: String,
    pub(crate) status: String,
    pub(crate) input: Value,
    pub(crate) lease_token: Option<Uuid>,
    pub(crate) cancel: bool,
    pub(crate) recovery_attempts: i32,
    pub(crate) db_now: DateTime<Utc>,
    /// The version the instance is pinned to (the claim pins an unpinned one).
    pub(crate) version: Option<i32>,
}

/// Up to `$5` of the oldest available queued commands of registered workflows (`$1`,
/// each with its version range `$2..=$3`: only instances pinned to a version in the
/// range, or not pinned yet, migration 0058) whose
/// instance holds no live lease, that no earlier runnable command of their instance
/// precedes, and (for a START) that no earlier unfinished instance with the same
/// serialization key precedes: each is set running with attempt + 1 and its instance
/// leased with a new token — or dead-lettered when its attempts are spent. The
/// per-instance check means at most one command per instance (and one START per
/// serialization key) qualifies, so a batch never holds two commands of one instance.
/// `durable_claim` (migration 0012) walks the queue in claim order and stops after `$3`
/// claims, checking and locking (`FOR UPDATE ... SKIP LOCKED`) each candidate by primary
/// key, so its cost does not grow with the backlog and no plan can make it scan the queue.
const CLAIM: &str = "\
SELECT command_id, kind, attempt, exhausted, latency, instance_id, workflow, status, input,
       lease_token, cancel, recovery_attempts, db_now, version
  FROM durable_claim_versions($1, $2, $3, $4, $5::int4)";

/// The segment settle, under the fence: the instance's new state, the command done, the
/// open commands of an instance that ended, the lease released, and `extra` (the
/// recovery RETRY of a suspension or the TIMER of a blocked wait with a deadline: only
/// in the statements that need them, since every `INSERT INTO durable_command`, even of
/// zero rows, fires the notifying statement trigger). The segment's history entries
/// (`$16`, a JSON array, see [`crate::history`]) are appended in the same statement,
/// numbered after the instance's `history_seq`, with the actor of the command, and the
/// logged state (`$17`) and journal count (`$18`) are kept on the instance: a fenced-out
/// settle writes no entry.
///
/// It notifies (`n`) only when the release may make a command claimable for another
/// executor: the instance has another queued command (in the statement's snapshot), or
/// may get one concurrently (open signals, a cancel request: both are read from the row
/// version this update wrote, which is the latest), or it holds a serialization key (a
/// later START may now run). The executor that ran the segment hears it too; it claims
/// again by itself only while its queue is backlogged (see `SlotContext::backlog`).
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
           lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
           history_seq = history_seq + jsonb_array_length($16::jsonb),
           history_state = $17::jsonb, history_journal = $18,
           wake_tag = CASE WHEN $3 = 'suspended' THEN $19::text END
     WHERE id = $1 AND lease_token = $2
 RETURNING id, serialization_key, open_signals, cancel_requested_at, history_seq
), h AS (
    INSERT INTO durable_history (instance_id, seq, kind, command_id, actor_kind, actor_id,
                                 actor_reason, on_behalf_of, attribution_status, detail,
                                 patch, baseline, truncated)
    SELECT i.id, i.history_seq - jsonb_array_length($16::jsonb) + e.n, e.v->>'kind', x.id,
           x.actor_kind, x.actor_id, x.actor_reason, x.on_behalf_of, x.attribution_status,
           coalesce(e.v->'detail', '{}'::jsonb), NULLIF(e.v->'patch', 'null'::jsonb),
           NULLIF(e.v->'baseline', 'null'::jsonb), coalesce((e.v->>'truncated')::boolean, false)
      FROM i JOIN durable_command x ON x.id = $12
     CROSS JOIN LATERAL jsonb_array_elements($16::jsonb) WITH ORDINALITY AS e(v, n)
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

/// Plain segment settles ([`settle!`] without extra) of concurrent segments in one statement (see
/// [`crate::batch`]): one row per segment (`$1`..`$15` are parallel arrays), each fenced
/// by its own token; the rows whose token no longer matches change nothing and are not
/// returned. Notifies once when any settled row qualifies (the rule of [`settle!`]).
/// Two rows never touch the same command: a row's own command and the queued commands
/// of its own instance only, and at most one row per instance matches its token.
const SETTLE_BATCH: &str = "\
WITH req AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::bool[],
                         $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::int8[],
                         $13::text[], $14::text[], $15::int4[])
           WITH ORDINALITY AS t(instance_id, token, status, output, error_code, error_retryable,
                                error_message, error_detail, wait, progress, outcome, command_id,
                                history, history_state, history_journal, idx)
), i AS (
    UPDATE durable_instance d
       SET status = req.status, output = req.output::jsonb, error_code = req.error_code,
           error_retryable = req.error_retryable, error_message = req.error_message,
           error_detail = req.error_detail::jsonb, wait = req.wait::jsonb,
           progress = COALESCE(req.progress::jsonb, d.progress),
           ended_at = CASE WHEN req.status IN ('completed', 'failed', 'cancelled') THEN now() END,
           recovery_attempts = CASE WHEN req.status = 'suspended' THEN d.recovery_attempts + 1 ELSE 0 END,
           cancel_requested_at = CASE WHEN req.status = 'cancelled'
                                      THEN coalesce(d.cancel_requested_at, now())
                                      ELSE d.cancel_requested_at END,
           lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
           history_seq = d.history_seq + jsonb_array_length(req.history::jsonb),
           history_state = req.history_state::jsonb, history_journal = req.history_journal
      FROM req
     WHERE d.id = req.instance_id AND d.lease_token = req.token
 RETURNING req.idx, d.id, req.status, req.outcome, req.command_id, d.serialization_key,
           d.open_signals, d.cancel_requested_at, d.history_seq, req.history
), h AS (
    INSERT INTO durable_history (instance_id, seq, kind, command_id, actor_kind, actor_id,
                                 actor_reason, on_behalf_of, attribution_status, detail,
                                 patch, baseline, truncated)
    SELECT i.id, i.history_seq - jsonb_array_length(i.history::jsonb) + e.n, e.v->>'kind', x.id,
           x.actor_kind, x.actor_id, x.actor_reason, x.on_behalf_of, x.attribution_status,
           coalesce(e.v->'detail', '{}'::jsonb), NULLIF(e.v->'patch', 'null'::jsonb),
           NULLIF(e.v->'baseline', 'null'::jsonb), coalesce((e.v->>'truncated')::boolean, false)
      FROM i JOIN durable_command x ON x.id = i.command_id
     CROSS JOIN LATERAL jsonb_array_elements(i.history::jsonb) WITH ORDINALITY AS e(v, n)
), c AS (
    UPDATE durable_command x SET state = 'done', outcome = i.outcome, completed_at = now()
      FROM i WHERE x.id = i.command_id
 RETURNING x.id
), o AS (
    UPDATE durable_command x SET state = 'done', outcome = 'instance_' || i.status, completed_at = now()
      FROM i
     WHERE x.instance_id = i.id AND x.state = 'queued' AND x.id <> i.command_id
       AND i.status IN ('completed', 'cancelled', 'failed')
       AND NOT (i.status = 'failed' AND x.kind IN ('cancel', 'retry'))
 RETURNING x.id
), n AS (
    SELECT pg_notify('keel_durable', '')
     WHERE EXISTS (
           SELECT 1 FROM i
            WHERE i.serialization_key IS NOT NULL OR i.open_signals > 0
               OR i.cancel_requested_at IS NOT NULL
               OR EXISTS (SELECT 1 FROM durable_command x
                           WHERE x.instance_id = i.id AND x.state = 'queued' AND x.id <> i.command_id))
)
SELECT i.idx, (SELECT count(*) FROM n) AS notified FROM i";

/// One plain segment settle (a row of [`SETTLE_BATCH`]); JSON values as text.
#[derive(Debug)]
pub(crate) struct SettleRow {
    pub(crate) instance_id: Uuid,
    /// The instance's workflow (for the transition hook).
    pub(crate) workflow: String,
    pub(crate) token: Uuid,
    pub(crate) status: &'static str,
    pub(crate) output: Option<String>,
    pub(crate) error_code: Option<String>,
    pub(crate) error_retryable: Option<bool>,
    pub(crate) error_message: Option<&'static str>,
    pub(crate) error_detail: Option<String>,
    pub(crate) wait: Option<String>,
    pub(crate) progress: Option<String>,
    pub(crate) outcome: &'static str,
    pub(crate) command_id: i64,
    /// The segment's history entries (JSON array text), the state logged after them
    /// (JSON text; `None`: unknown) and the journal entries logged.
    pub(crate) history: crate::history::SettleHistory,
    /// The slot wants its next command, of these workflows, claimed with the segment settle.
    pub(crate) next: Option<Arc<ClaimSet>>,
}

/// The answer to a [`SettleRow`].
#[derive(Debug)]
pub(crate) struct SettleAnswer {
    /// False: fenced out (nothing written).
    pub(crate) settled: bool,
    /// The slot's next command, claimed in the same transaction, and when that
    /// transaction was begun (no later than the lease's start).
    pub(crate) next: Option<(Claimed, Instant)>,
    /// The row asked for its slot's next command and the claim in the settle's
    /// transaction came back short (the queue was drained as of that claim).
    pub(crate) drained: bool,
}

/// The plain segment settles of one engine's segments, combined into [`SETTLE_BATCH`]
/// statements. When rows ask for their slot's next command, the batch and one
/// [`CLAIM`] for that many commands run in one transaction (settle-and-claim-next: one
/// commit instead of two, and the slot does not wait for the executor loop).
pub(crate) struct SettleOp {
    pub(crate) lease_secs: f64,
    /// The engine's transition hook, run in the settling transaction.
    pub(crate) hook: crate::hook::HookSlot,
}

impl std::fmt::Debug for SettleOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleOp")
            .field("lease_secs", &self.lease_secs)
            .field("hook", &self.hook.get().is_some())
            .finish()
    }
}

/// Why a segment settle transaction failed: a statement (classified by
/// [`rolled_back`]), or the transition hook (the transaction rolled back).
#[derive(Debug)]
enum SettleFail {
    Db(sqlx::Error),
    Hook(crate::hook::TransitionHookError),
}

impl From<sqlx::Error> for SettleFail {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e)
    }
}

impl SettleFail {
    /// Whether the transaction surely rolled back (the rows can be settled again, one
    /// by one): a database error, or a failed hook.
    fn rolled_back(&self) -> bool {
        match self {
            Self::Db(e) => rolled_back(e),
            Self::Hook(_) => true,
        }
    }

    /// The answer of one row whose settle failed.
    fn into_durable(self) -> DurableError {
        match self {
            Self::Db(e) => DurableError::from(e),
            Self::Hook(e) => DurableError::TransitionHook(e),
        }
    }

    /// The answer of every row of a batch whose outcome is unknown.
    fn lost(&self) -> DurableError {
        match self {
            Self::Db(e) => lost(e),
            Self::Hook(_) => lost(&sqlx::Error::Protocol("transition hook".to_owned())),
        }
    }

    /// Discards `held`'s connection when the failure was not the server's answer (a
    /// failed hook leaves it usable: its transaction was dropped, so rolled back).
    fn check(held: &mut Held, r: &std::result::Result<impl Sized, SettleFail>) {
        if let Err(Self::Db(e)) = r
            && !rolled_back(e)
        {
            held.discard();
        }
    }
}

/// The answer of a settle without a claim.
fn answer(settled: bool) -> SettleAnswer {
    SettleAnswer {
        settled,
        next: None,
        drained: false,
    }
}

impl SettleOp {
    /// The batch statement, then the transition hook for the settled rows (the caller
    /// runs both in one transaction when a hook is set).
    async fn exec(
        &self,
        conn: &mut sqlx::PgConnection,
        rows: &[SettleRow],
    ) -> std::result::Result<Vec<bool>, SettleFail> {
        let out = Self::exec_batch(&mut *conn, rows).await?;
        if self.hook.get().is_some() {
            let transitions: Vec<crate::hook::Transition> = rows
                .iter()
                .zip(&out)
                .filter(|(_, settled)| **settled)
                .filter_map(|(r, _)| {
                    Some(crate::hook::Transition {
                        instance_id: r.instance_id,
                        workflow: r.workflow.clone(),
                        status: parse_status(r.status).ok()?,
                    })
                })
                .collect();
            crate::hook::call(&self.hook, conn, &transitions)
                .await
                .map_err(SettleFail::Hook)?;
        }
        Ok(out)
    }

    async fn exec_batch(
        conn: &mut sqlx::PgConnection,
        rows: &[SettleRow],
    ) -> std::result::Result<Vec<bool>, sqlx::Error> {
        let settled: Vec<(i64, i64)> = sqlx::query_as(SETTLE_BATCH)
            .bind(rows.iter().map(|r| r.instance_id).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.token).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.status).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.output.as_deref()).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.error_code.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.error_retryable).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.error_message).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.error_detail.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.wait.as_deref()).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.progress.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.outcome).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.command_id).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.history.entries.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|r| r.history.state.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.history.journal).collect::<Vec<_>>())
            .fetch_all(conn)
            .await?;
        let mut out = vec![false; rows.len()];
        for (idx, _) in settled {
            let slot = usize::try_from(idx)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| out.get_mut(i));
            if let Some(slot) = slot {
                *slot = true;
            }
        }
        Ok(out)
    }

    /// The batch and a claim of `want` commands of `names`, in one transaction.
    async fn exec_and_claim(
        &self,
        conn: &mut sqlx::PgConnection,
        rows: &[SettleRow],
        names: &ClaimSet,
        want: usize,
    ) -> std::result::Result<(Vec<bool>, Vec<Claimed>, Instant), SettleFail> {
        use sqlx::Connection;
        let sent_at = Instant::now();
        let mut tx = conn.begin().await?;
        let settled = self.exec(&mut tx, rows).await?;
        let claimed = sqlx::query_as::<_, Claimed>(CLAIM)
            .bind(&names.names)
            .bind(&names.min)
            .bind(&names.max)
            .bind(self.lease_secs)
            .bind(i32::try_from(want).unwrap_or(i32::MAX))
            .fetch_all(&mut *tx)
            .await?;
        // A dead letter failed its instance in the claim: its transition is reported in
        // the same transaction.
        let failed = dead_letter_transitions(&claimed);
        crate::hook::call(&self.hook, &mut tx, &failed)
            .await
            .map_err(SettleFail::Hook)?;
        tx.commit().await?;
        Ok((settled, claimed, sent_at))
    }

    /// [`SettleOp::exec`] on the held connection.
    async fn exec_held(
        &self,
        held: &mut Held,
        rows: &[SettleRow],
    ) -> std::result::Result<Vec<bool>, SettleFail> {
        use sqlx::Connection;
        let r = match held.conn().await {
            Ok(conn) if self.hook.get().is_some() => {
                // The statement and the hook commit together.
                match conn.begin().await {
                    Ok(mut tx) => match self.exec(&mut tx, rows).await {
                        Ok(out) => tx.commit().await.map(|()| out).map_err(SettleFail::Db),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(SettleFail::Db(e)),
                }
            }
            Ok(conn) => self.exec(conn, rows).await,
            Err(e) => Err(SettleFail::Db(e)),
        };
        SettleFail::check(held, &r);
        r
    }

    /// The batch on its own; when it rolled back (a database error, or the transition
    /// hook failed), each row on its own.
    async fn settle_only(&self, held: &mut Held, batch: &[SettleRow]) -> Vec<Result<SettleAnswer>> {
        match self.exec_held(held, batch).await {
            Ok(settled) => settled.into_iter().map(|s| Ok(answer(s))).collect(),
            Err(e) if batch.len() > 1 && e.rolled_back() => self.settle_each(held, batch).await,
            Err(e) if batch.len() == 1 => vec![Err(e.into_durable())],
            Err(e) => batch.iter().map(|_| Err(e.lost())).collect(),
        }
    }

    /// Each row of `batch` in its own transaction (with the hook).
    async fn settle_each(&self, held: &mut Held, batch: &[SettleRow]) -> Vec<Result<SettleAnswer>> {
        let mut answers = Vec::with_capacity(batch.len());
        for row in batch {
            answers.push(
                match self.exec_held(held, std::slice::from_ref(row)).await {
                    Ok(settled) => Ok(answer(settled.first().copied().unwrap_or(false))),
                    Err(e) => Err(e.into_durable()),
                },
            );
        }
        answers
    }
}

impl BatchOp for SettleOp {
    type Req = SettleRow;
    type Resp = Result<SettleAnswer>;

    fn weight(r: &SettleRow) -> usize {
        128 + r.history.entries.len()
            + [
                &r.output,
                &r.error_detail,
                &r.wait,
                &r.progress,
                &r.history.state,
            ]
            .iter()
            .map(|v| v.as_ref().map_or(0, String::len))
            .sum::<usize>()
    }

    async fn run(&self, held: &mut Held, batch: Vec<SettleRow>) -> Vec<Result<SettleAnswer>> {
        // Claims go to the rows that want one with the same workflows as the first such
        // row (one engine's executors all have the same; clones that registered more
        // workflows differ).
        let Some(names) = batch.iter().find_map(|r| r.next.clone()) else {
            return self.settle_only(held, &batch).await;
        };
        let takers: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, r)| r.next.as_ref().is_some_and(|n| **n == *names))
            .map(|(i, _)| i)
            .collect();
        let r = match held.conn().await {
            Ok(conn) => {
                self.exec_and_claim(conn, &batch, &names, takers.len())
                    .await
            }
            Err(e) => Err(SettleFail::Db(e)),
        };
        SettleFail::check(held, &r);
        let (settled, claimed, sent_at) = match r {
            Ok(r) => r,
            // The hook failed: each row on its own, without claiming (the executor loop
            // claims for the freed slots).
            Err(SettleFail::Hook(_)) if batch.len() > 1 => {
                return self.settle_each(held, &batch).await;
            }
            // Rolled back as a whole: settle without claiming.
            Err(e) if e.rolled_back() => return self.settle_only(held, &batch).await,
            Err(e) => return batch.iter().map(|_| Err(e.lost())).collect(),
        };
        let mut answers: Vec<SettleAnswer> = settled
            .into_iter()
            .map(|settled| SettleAnswer {
                settled,
                next: None,
                drained: false,
            })
            .collect();
        if claimed.len() < takers.len() {
            for &i in &takers {
                if let Some(a) = answers.get_mut(i) {
                    a.drained = true;
                }
            }
        }
        let mut takers = takers.into_iter();
        for c in claimed {
            if c.exhausted {
                dead_lettered(&c);
                continue;
            }
            match takers.next().and_then(|i| answers.get_mut(i)) {
                Some(a) => a.next = Some((c, sent_at)),
                // Cannot happen (the claim is limited to the takers); the lease lapses.
                None => tracing::warn!(target: "keel::durable::executor",
                    command_id = c.command_id, "claimed a command for no slot"),
            }
        }
        answers.into_iter().map(Ok).collect()
    }
}

/// Logs and counts a command that its claim dead-lettered. The claim also failed its
/// instance (`ATTEMPTS_EXHAUSTED`, retryable) unless it had ended or failed already
/// (migration 0069), so no instance is left without a command that runs it.
fn dead_lettered(c: &Claimed) {
    tracing::error!(target: "keel::durable::executor", command_id = c.command_id,
        instance_id = %c.instance_id, kind = %c.kind, attempts = c.attempt, status = %c.status,
        "command dead-lettered (attempts exhausted); its instance is failed ATTEMPTS_EXHAUSTED: retry it to resume");
    m::dead_letter(&c.workflow);
    m::settled(&c.workflow, "dead_letter");
}

/// The transitions to `failed` of the instances whose command a claim dead-lettered.
fn dead_letter_transitions(claimed: &[Claimed]) -> Vec<crate::hook::Transition> {
    claimed
        .iter()
        .filter(|c| c.exhausted && c.status == "failed")
        .map(|c| crate::hook::Transition {
            instance_id: c.instance_id,
            workflow: c.workflow.clone(),
            status: RunStatus::Failed,
        })
        .collect()
}

/// Runs the transition hook for the instances the executor loop's claim failed by a
/// dead letter, in a transaction of its own (the loop's claim is one statement; a
/// crash in between reports the change with the instance's next one).
async fn report_dead_letters(engine: &Engine, claimed: &[Claimed]) {
    let failed = dead_letter_transitions(claimed);
    if failed.is_empty() {
        return;
    }
    let result = async {
        let mut tx = engine.pool.begin().await?;
        crate::hook::run(&engine.hook, &mut tx, &failed).await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(target: "keel::durable::executor", error = %keel_store::StoreError::from(e),
            "the transition hook of a dead-lettered instance failed");
    }
}

/// [`settle!`] for a suspension: a recovery RETRY after `$13` seconds (`$14` attempts).
const SETTLE_SUSPENDED: &str = settle!(
    ", r AS (
    INSERT INTO durable_command (instance_id, kind, available_at, max_attempts,
                                 actor_kind, actor_reason, attribution_status)
    SELECT i.id, 'retry', now() + make_interval(secs => $13), $14,
           'SYSTEM', 'recovery', 'VERIFIED' FROM i
 RETURNING id
)"
);

/// [`settle!`] for a blocked wait with a deadline `$15`: its TIMER (`$14` attempts),
/// unless one at or before the deadline is queued.
const SETTLE_TIMER: &str = settle!(
    ", t AS (
    INSERT INTO durable_command (instance_id, kind, available_at, max_attempts,
                                 actor_kind, actor_reason, attribution_status)
    SELECT i.id, 'timer', $15, $14, 'SYSTEM', 'timer', 'VERIFIED' FROM i
     WHERE NOT EXISTS (
           SELECT 1 FROM durable_command x
            WHERE x.instance_id = i.id AND x.kind = 'timer' AND x.state = 'queued'
              AND x.id <> $12 AND x.available_at <= $15)
 RETURNING id
)"
);

async fn run(engine: Arc<Engine>, config: ExecutorConfig, cancel: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let _listener = config.listen.then(|| {
        AbortOnDrop(tokio::spawn(listen(
            engine.pool.clone(),
            wake.clone(),
            cancel.clone(),
        )))
    });
    let names = engine.registry.claim_set();
    let runner = Uuid::new_v4();
    let _heartbeat = AbortOnDrop(tokio::spawn(heartbeat(
        engine.pool.clone(),
        runner,
        names.clone(),
    )));
    let slot = Arc::new(SlotContext {
        engine: engine.clone(),
        renew_every: config.renew_every(&engine.config),
        renew: config.renew_leases,
        names: Arc::new(names.clone()),
        cancel: cancel.clone(),
        listen: config.listen,
        backlog: AtomicBool::new(true),
    });
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
        // With every slot busy (segments chain the commands their segment settles claim, so
        // slots may stay busy for long), still come round for the rescuer.
        let rescue_in = last_rescue.map_or(Duration::ZERO, |t| {
            config.poll_interval.saturating_sub(t.elapsed())
        });
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = tokio::time::sleep(rescue_in) => continue,
            () = cancel.cancelled() => break,
        };
        // Claim for every free slot in one statement.
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let wanted = permits.len();
        let claimed_at = Instant::now();
        let mut claim_at = None;
        let claimed = claim(&engine, &names, wanted).await.map(|(batch, at)| {
            claim_at = at;
            slot.backlog.store(batch.len() >= wanted, Ordering::Release);
            batch
        });
        match claimed {
            Ok(batch) if !batch.is_empty() => {
                let full = batch.len() >= wanted;
                report_dead_letters(&engine, &batch).await;
                for c in batch {
                    if c.exhausted {
                        dead_lettered(&c);
                        continue;
                    }
                    let Some(permit) = permits.pop() else { break };
                    m::claim_latency(&c.workflow, c.latency);
                    segments.spawn(segment(slot.clone(), c, claimed_at, permit, wake.clone()));
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
        match store::queue_next_due(&engine.pool, claim_at).await {
            Ok(store::NextDue { next, lease, depth }) => {
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
        // Wait for work: a notification, the next due command or lapsing lease (or the
        // poll interval), or a segment whose end may have made work (see `segment`).
        // Without a listener, every segment end is a reason to claim again.
        let until = tokio::time::Instant::now() + pause;
        let stop = loop {
            tokio::select! {
                () = wake.notified() => break false,
                () = tokio::time::sleep_until(until) => break false,
                Some(_) = segments.join_next() => if !config.listen { break false },
                () = cancel.cancelled() => break true,
            }
        };
        if stop {
            break;
        }
    }
    while segments.join_next().await.is_some() {}
    drop(_heartbeat);
    if let Err(e) = crate::version::runner_deregister(&engine.pool, runner).await {
        tracing::warn!(target: "keel::durable::executor", error = %keel_store::StoreError::from(e),
            "runner version record not removed; it lapses");
    }
}

/// Keeps this executor's row of `durable_runner_version` fresh (see [`crate::version`]).
async fn heartbeat(pool: sqlx::PgPool, runner: Uuid, names: ClaimSet) {
    let span = tracing::info_span!(target: "keel::durable::executor", "runner_heartbeat", %runner);
    let mut failures: u32 = 0;
    loop {
        let pause = match crate::version::runner_heartbeat(&pool, runner, &names)
            .instrument(span.clone())
            .await
        {
            Ok(()) => {
                failures = 0;
                crate::version::RUNNER_HEARTBEAT
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                m::runner_heartbeat_failed();
                tracing::warn!(target: "keel::durable::executor", parent: &span,
                    error = %keel_store::StoreError::from(e), "runner heartbeat failed");
                crate::config::Backoff {
                    base: Duration::from_millis(250),
                    cap: crate::version::RUNNER_HEARTBEAT,
                }
                .delay(failures)
            }
        };
        tokio::time::sleep(pause).await;
    }
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
    match store::commands_rescue(&engine.pool).await {
        Ok(n) => {
            if n > 0 {
                tracing::info!(target: "keel::durable::executor", commands = n,
                    "rescued commands whose lease lapsed");
            }
            n
        }
        Err(e) => {
            tracing::warn!(target: "keel::durable::executor", error = %keel_store::StoreError::from(e), "rescue failed");
            0
        }
    }
}

/// [`CLAIM`] with the database time it compared `available_at` with (`now()`, the same
/// inside the claim function), on one row even when nothing was claimed: the next-due
/// query counts every command that was not yet due for this claim, so one that fell due
/// since is not skipped.
const CLAIM_TIMED: &str = "\
SELECT t.claim_now, c.command_id, c.kind, c.attempt, c.exhausted, c.latency, c.instance_id,
       c.workflow, c.status, c.input, c.lease_token, c.cancel, c.recovery_attempts, c.db_now,
       c.version
  FROM (SELECT now() AS claim_now) t
  LEFT JOIN LATERAL durable_claim_versions($1, $2, $3, $4, $5::int4) c ON true";

/// A row of [`CLAIM_TIMED`]: the claim's time, and a claimed command unless none was.
#[derive(Debug, sqlx::FromRow)]
struct TimedClaimRow {
    claim_now: DateTime<Utc>,
    command_id: Option<i64>,
    kind: Option<String>,
    attempt: Option<i32>,
    exhausted: Option<bool>,
    latency: Option<f64>,
    instance_id: Option<Uuid>,
    workflow: Option<String>,
    status: Option<String>,
    input: Option<Value>,
    lease_token: Option<Uuid>,
    cancel: Option<bool>,
    recovery_attempts: Option<i32>,
    db_now: Option<DateTime<Utc>>,
    version: Option<i32>,
}

impl TimedClaimRow {
    /// The claimed command; `None` on the row of an empty claim.
    fn claimed(self) -> Option<Claimed> {
        Some(Claimed {
            command_id: self.command_id?,
            kind: self.kind?,
            attempt: self.attempt?,
            exhausted: self.exhausted?,
            latency: self.latency?,
            instance_id: self.instance_id?,
            workflow: self.workflow?,
            status: self.status?,
            input: self.input?,
            lease_token: self.lease_token,
            cancel: self.cancel?,
            recovery_attempts: self.recovery_attempts?,
            db_now: self.db_now?,
            version: self.version,
        })
    }
}

/// The loop's claim: the claimed commands and the claim's database time.
async fn claim(
    engine: &Engine,
    names: &ClaimSet,
    limit: usize,
) -> Result<(Vec<Claimed>, Option<DateTime<Utc>>)> {
    let rows = sqlx::query_as::<_, TimedClaimRow>(CLAIM_TIMED)
        .bind(&names.names)
        .bind(&names.min)
        .bind(&names.max)
        .bind(engine.config.lease.as_secs_f64())
        .bind(i32::try_from(limit).unwrap_or(i32::MAX))
        .fetch_all(&engine.pool)
        .await?;
    let at = rows.first().map(|r| r.claim_now);
    Ok((
        rows.into_iter()
            .filter_map(TimedClaimRow::claimed)
            .collect(),
        at,
    ))
}

/// How a segment ends: what its segment settle writes.
struct SegmentSettle {
    status: RunStatus,
    output: Option<Value>,
    error: Option<(String, bool, &'static str, Option<Value>)>,
    wait: Option<WaitDescription>,
    outcome: &'static str,
    /// The wake tag of a suspension ([`crate::StepError::Unavailable`]).
    wake: Option<String>,
}

impl SegmentSettle {
    fn new(status: RunStatus, outcome: &'static str) -> Self {
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
            ..Self::new(RunStatus::Failed, "failed")
        }
    }
}

enum Disposition {
    Settle(SegmentSettle),
    SettleCommand(&'static str),
    Release(&'static str),
    Abandon,
}

/// What a segment slot needs besides its command.
struct SlotContext {
    engine: Arc<Engine>,
    renew_every: Duration,
    renew: bool,
    /// The registered workflows, for claiming the next command with the segment settle.
    names: Arc<ClaimSet>,
    cancel: CancellationToken,
    /// The executor listens for notifications ([`ExecutorConfig::listen`]).
    listen: bool,
    /// The last claim (the loop's, or a segment settle's) got every command it asked
    /// for, so more may be queued: segment settles then claim their slot's next command.
    /// Once a claim comes back short, the queue was drained as of that claim; work that
    /// arrives later notifies (every command insert does, and every settle that may
    /// make a queued command claimable), so until then a segment settle claims nothing
    /// and a segment that ends does not send the loop to claim again (each would be an
    /// empty claim per settle batch and per segment: under a burst that the executor
    /// keeps pace with, most of its claims). Without a listener, always true in effect.
    backlog: AtomicBool,
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
async fn segment(
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
        plain = PLAIN_SETTLES.contains(&outcome);
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
const REFUNDED: &[&str] = &[DATABASE_UNAVAILABLE, JOURNAL_READ_FAILED];

/// The outcomes of a segment settled by [`finish`]'s plain settle statements (the
/// batch, or the single statements with a TIMER or RETRY, whose inserts notify).
const PLAIN_SETTLES: &[&str] = &["completed", "failed", "cancelled", "waiting", "suspended"];

/// One segment; returns its outcome and the next command when its segment settle claimed
/// one for this slot.
async fn run_segment(
    slot: &SlotContext,
    c: Claimed,
    claimed_at: Instant,
    want_next: Option<Arc<ClaimSet>>,
) -> (&'static str, Option<(Claimed, Instant)>, bool) {
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
            return ("no_token", None, false);
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
                ("settle_failed", None, false)
            }
        };
        tracing::Span::current().record("outcome", outcome);
        m::settled(&c.workflow, outcome);
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
            return Disposition::Settle(SegmentSettle::new(RunStatus::Cancelled, "cancelled"));
        }
        (RunStatus::Failed, _) => return Disposition::SettleCommand("stale"),
        (_, "cancel") => {
            return Disposition::Settle(SegmentSettle::new(RunStatus::Cancelled, "cancelled"));
        }
        _ => {}
    }
    if c.cancel {
        return Disposition::Settle(SegmentSettle::new(RunStatus::Cancelled, "cancelled"));
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
    let first_start = c.kind == "start" && c.attempt == 1;
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
                ..SegmentSettle::new(RunStatus::Waiting, "waiting")
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
                ..SegmentSettle::new(RunStatus::Suspended, "suspended")
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
                    ..SegmentSettle::new(RunStatus::Failed, "failed")
                })
            }
            Halt::VersionUnsupported(d) => Disposition::Settle(SegmentSettle {
                error: Some((
                    "VERSION_UNSUPPORTED".to_owned(),
                    false,
                    "a version gate met a recorded decision this code no longer supports (see detail)",
                    serde_json::to_value(*d).ok(),
                )),
                ..SegmentSettle::new(RunStatus::Failed, "failed")
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
                Disposition::Settle(SegmentSettle::new(RunStatus::Cancelled, "cancelled"))
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
            ..SegmentSettle::new(RunStatus::Completed, "completed")
        }),
        ErasedOutcome::Failed(v) => Disposition::Settle(SegmentSettle {
            error: Some((
                "WORKFLOW_FAILED".to_owned(),
                false,
                "the workflow returned its typed error (see detail)",
                Some(v),
            )),
            ..SegmentSettle::new(RunStatus::Failed, "failed")
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

/// The segment settle; a plain one may bring the slot's next command
/// (`want_next`: the workflows to claim from).
async fn finish(
    engine: &Engine,
    c: &Claimed,
    token: Uuid,
    disposition: Disposition,
    progress: Option<Value>,
    mut trail: crate::history::SegmentTrail,
    want_next: Option<Arc<ClaimSet>>,
) -> Result<(&'static str, Option<(Claimed, Instant)>, bool)> {
    let max_attempts = i32::try_from(engine.config.command_max_attempts).unwrap_or(i32::MAX);
    match disposition {
        Disposition::Abandon => Ok(("fenced", None, false)),
        Disposition::SettleCommand(outcome) => {
            let settled = store::command_settle_alone(
                &engine.pool,
                c.instance_id,
                token,
                c.command_id,
                outcome,
            )
            .await?;
            Ok((if settled { outcome } else { "fenced" }, None, false))
        }
        Disposition::Release(code) => {
            let attempt = u32::try_from(c.attempt).unwrap_or(1);
            let delay = engine.config.release_backoff.delay(attempt);
            store::command_release(
                &engine.pool,
                c.instance_id,
                token,
                c.command_id,
                delay.as_secs_f64(),
                code,
                REFUNDED.contains(&code),
            )
            .await?;
            Ok(("released", None, false))
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
            // The decision log: the segment's entries and its state change, appended
            // by the settle statement itself.
            if trail.prior.is_none() {
                trail.prior = crate::history::prior(&engine.pool, c.instance_id)
                    .await
                    .ok()
                    .flatten();
            }
            let history = {
                let prior_progress = trail
                    .prior
                    .as_ref()
                    .and_then(|p| p.history_state.as_ref())
                    .and_then(|st| st.get("progress").cloned());
                let end = match s.status {
                    RunStatus::Waiting => ("wait_entered", wait.clone().unwrap_or(Value::Null)),
                    RunStatus::Suspended => ("suspended", serde_json::json!({ "code": code })),
                    RunStatus::Failed => ("failed", serde_json::json!({ "code": code })),
                    RunStatus::Cancelled => ("cancelled", serde_json::json!({})),
                    _ => ("completed", serde_json::json!({})),
                };
                let after = crate::history::Projection {
                    status: s.status.as_str().to_owned(),
                    progress: trail.last_progress.clone().or(prior_progress),
                    wait: wait.clone(),
                    output: s.output.clone(),
                    error_code: code.clone(),
                    error_retryable: retryable,
                    error_message: message.map(str::to_owned),
                    error_detail: detail.clone(),
                };
                engine.settle_history(&c.workflow, &c.kind, trail, end, after)
            };
            let sql = match (s.status, timer_at) {
                (RunStatus::Suspended, _) => SETTLE_SUSPENDED,
                (RunStatus::Waiting, Some(_)) => SETTLE_TIMER,
                _ => {
                    let text = |v: Option<Value>, what| match v {
                        Some(v) => serde_json::to_string(&v)
                            .map(Some)
                            .map_err(|_| DurableError::Json { what }),
                        None => Ok(None),
                    };
                    let row = SettleRow {
                        instance_id: c.instance_id,
                        workflow: c.workflow.clone(),
                        token,
                        status: s.status.as_str(),
                        output: text(s.output, "output")?,
                        error_code: code,
                        error_retryable: retryable,
                        error_message: message,
                        error_detail: text(detail, "error detail")?,
                        wait: text(wait, "wait")?,
                        progress: text(progress, "progress")?,
                        outcome: s.outcome,
                        command_id: c.command_id,
                        history,
                        next: want_next,
                    };
                    let answer = match engine.segment_settles.submit(row).await {
                        Some(answer) => answer?,
                        None => {
                            return Err(DurableError::Store(keel_store::StoreError::Transient {
                                kind: keel_store::TransientKind::ConnectionLost,
                                sqlstate: None,
                            }));
                        }
                    };
                    let outcome = if answer.settled { s.outcome } else { "fenced" };
                    return Ok((outcome, answer.next, answer.drained));
                }
            };
            let mut tx = engine.pool.begin().await?;
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
                .bind(&history.entries)
                .bind(history.state.as_deref())
                .bind(history.journal)
                .bind(s.wake.as_deref())
                .fetch_one(&mut *tx)
                .await?;
            if settled == 1 {
                let t = [crate::hook::Transition {
                    instance_id: c.instance_id,
                    workflow: c.workflow.clone(),
                    status: s.status,
                }];
                crate::hook::run(&engine.hook, &mut tx, &t).await?;
            }
            tx.commit().await?;
            Ok((if settled == 1 { s.outcome } else { "fenced" }, None, false))
        }
    }
}
