//! The segment settle: one statement for every settle of a segment that ran a body (one
//! row, or the rows of concurrent segments combined by [`crate::batch`]), as River sends
//! single-row completions through its many-row query. Under the fence of each row's
//! lease token it writes the instance's new state, the command done, the open commands
//! of an instance that ended, the lease released, the segment's history entries, and
//! the follow-up commands: a suspension's recovery RETRY and the TIMER of a blocked wait
//! with a deadline.
//!
//! When rows ask for their slot's next command, the statement and one claim
//! ([`super::claim`]) for that many commands run in one transaction
//! (settle-and-claim-next: one commit instead of two, and the slot does not wait for
//! the executor loop).

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::claim::{self, Claimed, dead_letter_transitions, dead_lettered};
use super::outcome::Outcome;
use crate::batch::{BatchOp, Held, lost, rolled_back};
use crate::error::{DurableError, Result};
use crate::status::RunStatus;
use crate::version::ClaimSet;

/// The segment settle of `$1`..`$19` (parallel arrays, one element per row), each row
/// fenced by its own token; the rows whose token no longer matches change nothing and
/// are not returned. `extra` is the follow-up inserts (`follow_ups!`), only in the
/// variant that needs them: every `INSERT INTO durable_command`, even of zero rows,
/// fires the notifying statement trigger, which a batch of plain completions must not.
///
/// The segment's history entries (`history`, a JSON array, see [`crate::history`]) are
/// appended in the same statement, numbered after the instance's `history_seq`, with the
/// actor of the command, and the logged state and journal count are kept on the
/// instance: a fenced-out row writes no entry. `wake_tag` is kept for a suspension only.
///
/// It notifies once (`n`) when the release of any settled row may make a command
/// claimable for another executor: the instance has another queued command (in the
/// statement's snapshot), or may get one concurrently (open signals, a cancel request:
/// both are read from the row version this update wrote, which is the latest), or it
/// holds a serialization key (a later START may now run). The executor that ran the
/// segment hears it too; it claims again by itself only while its queue is backlogged
/// (see `SlotContext::backlog`). Two rows never touch the same command: a row's own
/// command and the queued commands of its own instance only, and at most one row per
/// instance matches its token.
macro_rules! settle_sql {
    ($extra:expr) => {
        concat!(
            "WITH req AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::bool[],
                         $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::int8[],
                         $13::text[], $14::text[], $15::int4[], $16::text[], $17::float8[],
                         $18::int4[], $19::timestamptz[])
           WITH ORDINALITY AS t(instance_id, token, status, output, error_code, error_retryable,
                                error_message, error_detail, wait, progress, outcome, command_id,
                                history, history_state, history_journal, wake_tag, recovery_secs,
                                max_attempts, timer_at, idx)
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
           history_state = req.history_state::jsonb, history_journal = req.history_journal,
           wake_tag = CASE WHEN req.status = 'suspended' THEN req.wake_tag END
      FROM req
     WHERE d.id = req.instance_id AND d.lease_token = req.token
 RETURNING req.idx, d.id, req.status, req.outcome, req.command_id, d.serialization_key,
           d.open_signals, d.cancel_requested_at, d.history_seq, req.history,
           req.recovery_secs, req.max_attempts, req.timer_at
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
)",
            $extra,
            ", n AS (
    SELECT pg_notify('keel_durable', '')
     WHERE EXISTS (
           SELECT 1 FROM i
            WHERE i.serialization_key IS NOT NULL OR i.open_signals > 0
               OR i.cancel_requested_at IS NOT NULL
               OR EXISTS (SELECT 1 FROM durable_command x
                           WHERE x.instance_id = i.id AND x.state = 'queued' AND x.id <> i.command_id))
)
SELECT i.idx, (SELECT count(*) FROM n) AS notified FROM i"
        )
    };
}

/// The follow-up commands of [`settle_sql!`]: the recovery RETRY of a suspension after
/// its row's `recovery_secs`, and the TIMER of a blocked wait at its deadline
/// (`timer_at`) unless one at or before the deadline is queued; both with the row's
/// `max_attempts`, recorded by the system.
macro_rules! follow_ups {
    () => {
        ", r AS (
    INSERT INTO durable_command (instance_id, kind, available_at, max_attempts,
                                 actor_kind, actor_reason, attribution_status)
    SELECT i.id, 'retry', now() + make_interval(secs => i.recovery_secs), i.max_attempts,
           'SYSTEM', 'recovery', 'VERIFIED' FROM i
     WHERE i.status = 'suspended'
 RETURNING id
), t AS (
    INSERT INTO durable_command (instance_id, kind, available_at, max_attempts,
                                 actor_kind, actor_reason, attribution_status)
    SELECT i.id, 'timer', i.timer_at, i.max_attempts, 'SYSTEM', 'timer', 'VERIFIED' FROM i
     WHERE i.status = 'waiting' AND i.timer_at IS NOT NULL
       AND NOT EXISTS (
           SELECT 1 FROM durable_command x
            WHERE x.instance_id = i.id AND x.kind = 'timer' AND x.state = 'queued'
              AND x.id <> i.command_id AND x.available_at <= i.timer_at)
 RETURNING id
)"
    };
}

/// The settle of rows that record no follow-up command.
const SETTLE: &str = settle_sql!("");

/// The settle of a batch with at least one suspension or timed wait.
const SETTLE_FOLLOW_UPS: &str = settle_sql!(follow_ups!());

/// One segment settle (a row of [`settle_sql!`]); JSON values as text.
#[derive(Debug)]
pub(crate) struct SettleRow {
    pub(crate) instance_id: Uuid,
    /// The instance's workflow (for the transition hook).
    pub(crate) workflow: String,
    pub(crate) token: Uuid,
    pub(crate) status: RunStatus,
    pub(crate) output: Option<String>,
    pub(crate) error_code: Option<String>,
    pub(crate) error_retryable: Option<bool>,
    pub(crate) error_message: Option<&'static str>,
    pub(crate) error_detail: Option<String>,
    pub(crate) wait: Option<String>,
    pub(crate) progress: Option<String>,
    pub(crate) outcome: Outcome,
    pub(crate) command_id: i64,
    /// The segment's history entries (JSON array text), the state logged after them
    /// (JSON text; `None`: unknown) and the journal entries logged.
    pub(crate) history: crate::history::SettleHistory,
    /// The wake tag of a suspension ([`crate::StepError::Unavailable`]).
    pub(crate) wake_tag: Option<String>,
    /// A suspension's recovery RETRY is due after this many seconds.
    pub(crate) recovery_secs: f64,
    /// The attempts of a follow-up command (RETRY or TIMER).
    pub(crate) max_attempts: i32,
    /// A blocked wait's deadline: its TIMER's fire time (database clock).
    pub(crate) timer_at: Option<DateTime<Utc>>,
    /// The slot wants its next command, of these workflows, claimed with the segment settle.
    pub(crate) next: Option<Arc<ClaimSet>>,
}

impl SettleRow {
    /// Whether the row records a follow-up command (a suspension's RETRY, a timed
    /// wait's TIMER): its batch needs [`SETTLE_FOLLOW_UPS`].
    fn has_follow_up(&self) -> bool {
        self.status == RunStatus::Suspended
            || (self.status == RunStatus::Waiting && self.timer_at.is_some())
    }
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

/// The segment settles of one engine's segments, combined into [`settle_sql!`]
/// statements. When rows ask for their slot's next command, the batch and one claim
/// for that many commands run in one transaction (settle-and-claim-next: one commit
/// instead of two, and the slot does not wait for the executor loop).
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
                .map(|(r, _)| crate::hook::Transition {
                    instance_id: r.instance_id,
                    workflow: r.workflow.clone(),
                    status: r.status,
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
        let sql = if rows.iter().any(SettleRow::has_follow_up) {
            SETTLE_FOLLOW_UPS
        } else {
            SETTLE
        };
        let settled: Vec<(i64, i64)> = sqlx::query_as(sql)
            .bind(rows.iter().map(|r| r.instance_id).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.token).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.status.as_str()).collect::<Vec<_>>())
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
            .bind(rows.iter().map(|r| r.outcome.as_str()).collect::<Vec<_>>())
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
            .bind(
                rows.iter()
                    .map(|r| r.wake_tag.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.recovery_secs).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.max_attempts).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.timer_at).collect::<Vec<_>>())
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
        let claim::Claim {
            claimed,
            unreadable,
            ..
        } = claim::claim(&mut *tx, names, self.lease_secs, want).await?;
        // A dead letter failed its instance in the claim: its transition is reported in
        // the same transaction.
        let failed = dead_letter_transitions(&claimed);
        crate::hook::call(&self.hook, &mut tx, &failed)
            .await
            .map_err(SettleFail::Hook)?;
        tx.commit().await?;
        claim::release_unreadable(conn, &unreadable, self.lease_secs).await;
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
