//! SQL of the engine's API surface ([`crate::Engine`]: start, signal, cancel, retry,
//! status, purge, the idle report), by table: `durable_instance`, `durable_signal`,
//! `durable_command` (`migrations/0002_durable.sql`; the key rule of
//! `migrations/0016_durable_serialization_release.sql`). Every function takes an
//! executor, so callers compose them in one transaction; rows come back as `FromRow`
//! structs. Guarded updates say what they expect in their `WHERE` clause and return
//! whether a row matched.
//!
//! The executor's single statements are here too (the journal read, the segment settle
//! of a command that ran no body, release, rescue, lease renewal, the next-due query);
//! its batch statements (the claim, the segment settles, journal writes and the fence)
//! stay next to the combiners that bind them (`executor/claim.rs`, `executor/settle.rs`,
//! `context.rs`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::actor::Actor;
use crate::context::JournalEntry;
use crate::error::{DurableError, Result};
use crate::status::{
    CommandKind, CommandState, ErrorInfo, InstanceStatus, RunStatus, WaitDescription,
};

// ---------------------------------------------------------------------------------
// durable_instance
// ---------------------------------------------------------------------------------

/// A new instance for [`instances_insert_many`]. `input` is JSON text.
#[derive(Debug)]
pub(crate) struct NewInstance {
    pub id: Uuid,
    pub workflow: String,
    pub idempotency_key: String,
    pub input: String,
    pub serialization_key: Option<String>,
    /// Who recorded the start (stored on its START command).
    pub actor: Actor,
    /// The detail of its `command_received` history entry (JSON text: the redacted
    /// input copy, see [`crate::history`]).
    pub history_detail: String,
    /// The workflow version it is pinned to; `None`: pinned by its first claim.
    pub version: Option<i32>,
    /// The W3C `traceparent` of the span that started it (`None`: not tracing).
    pub trace_context: Option<String>,
}

/// Starts of concurrent callers in one statement: one instance and its START command
/// per row, idempotently by `(workflow, idempotency_key)`; a row whose key exists
/// inserts nothing (also a second row of the same key in the batch), and only the ids of
/// the inserted instances are returned. Rows are inserted in their submission order, so
/// `start_order` follows it. Each inserted instance gets its first history entry
/// (`command_received`, seq 1, with the START's actor and the baseline
/// [`crate::history`]'s initial state) in the same statement.
///
/// Returns sqlx's error unclassified: the start combiner tells a statement the server
/// rejected (nothing written; retried row by row) from a lost connection.
pub(crate) async fn instances_insert_many(
    db: impl PgExecutor<'_>,
    rows: &[NewInstance],
    max_attempts: i32,
) -> std::result::Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH req AS (
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                                 $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                                 $12::text[], $14::int4[], $15::text[])
                   WITH ORDINALITY AS t(id, workflow, idempotency_key, input, serialization_key,
                                        actor_kind, actor_id, actor_reason, on_behalf_of,
                                        attribution_status, history_detail, version,
                                        trace_context, idx)
        ), ins AS (
            INSERT INTO durable_instance (id, workflow, idempotency_key, input, serialization_key,
                                          history_seq, history_state, version, trace_context)
            SELECT id, workflow, idempotency_key, input::jsonb, serialization_key, 1, $13::jsonb,
                   version, trace_context
              FROM req ORDER BY idx
            ON CONFLICT (workflow, idempotency_key) DO NOTHING
         RETURNING id
        ), cmd AS (
            INSERT INTO durable_command (instance_id, kind, max_attempts, actor_kind, actor_id,
                                         actor_reason, on_behalf_of, attribution_status)
            SELECT ins.id, 'start', $6, req.actor_kind, req.actor_id, req.actor_reason,
                   req.on_behalf_of, req.attribution_status
              FROM ins JOIN req ON req.id = ins.id
         RETURNING id, instance_id
        ), h AS (
            INSERT INTO durable_history (instance_id, seq, kind, command_id, actor_kind, actor_id,
                                         actor_reason, on_behalf_of, attribution_status, detail,
                                         baseline)
            SELECT cmd.instance_id, 1, 'command_received', cmd.id, req.actor_kind, req.actor_id,
                   req.actor_reason, req.on_behalf_of, req.attribution_status,
                   req.history_detail::jsonb, $13::jsonb
              FROM cmd JOIN req ON req.id = cmd.instance_id
        )
        SELECT id FROM ins",
    )
    .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.workflow.as_str()).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.idempotency_key.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|r| r.input.as_str()).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.serialization_key.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(max_attempts)
    .bind(
        rows.iter()
            .map(|r| r.actor.kind().as_str())
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|r| r.actor.id()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.actor.reason()).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.actor.on_behalf_of_id())
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| r.actor.status().as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| r.history_detail.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(crate::history::initial_state())
    .bind(rows.iter().map(|r| r.version).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.trace_context.as_deref())
            .collect::<Vec<_>>(),
    )
    .fetch_all(db)
    .await
}

/// The instance an idempotency key names, and whether its input equals the given one
/// (JSON equality).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KeyedInstance {
    pub id: Uuid,
    pub same_input: bool,
    pub status: RunStatus,
}

/// The instance of `(workflow, key)`, if any.
pub(crate) async fn instance_by_key(
    db: impl PgExecutor<'_>,
    workflow: &str,
    key: &str,
    input: &Value,
) -> Result<Option<KeyedInstance>> {
    Ok(sqlx::query_as(
        "SELECT id, input = $3 AS same_input, status
           FROM durable_instance WHERE workflow = $1 AND idempotency_key = $2",
    )
    .bind(workflow)
    .bind(key)
    .bind(input)
    .fetch_optional(db)
    .await?)
}

/// The columns of the status projection of `durable_instance i`. The blocker is looked
/// up for keyed `pending` instances only (the rule of `durable_claim`, migration 0016:
/// pending, running, suspended and timer-waiting instances hold their key; migration
/// 0069: except a never-started `pending` one that no live runner can run).
macro_rules! status_select {
    () => {
        "SELECT i.id, i.workflow, i.status, i.progress, i.wait, i.output, i.error_code,
                i.error_retryable, i.error_message, i.error_detail, i.created_at, i.updated_at,
                i.ended_at, i.cancel_requested_at, i.version,
                (i.ended_at IS NULL AND NOT EXISTS (
                    SELECT 1 FROM durable_runner_version r
                     WHERE r.workflow = i.workflow
                       -- crate::version::RUNNER_LIVENESS (a unit test keeps them equal)
                       AND r.seen_at > now() - interval '30 seconds'
                       AND (i.version IS NULL OR i.version BETWEEN r.min_version AND r.max_version)))
                    AS awaiting_runner,
                (i.ended_at IS NULL AND EXISTS (
                    SELECT 1 FROM durable_runner_version r
                     WHERE r.workflow = i.workflow AND r.seen_at > now() - interval '30 seconds')
                 AND NOT EXISTS (
                    SELECT 1 FROM durable_runner_version r
                     WHERE r.workflow = i.workflow
                       AND r.seen_at > now() - interval '30 seconds'
                       AND (i.version IS NULL OR i.version BETWEEN r.min_version AND r.max_version)))
                    AS version_deferred,
                CASE WHEN i.status = 'pending' AND i.serialization_key IS NOT NULL THEN
                    (SELECT p.id FROM durable_instance p
                      WHERE p.serialization_key = i.serialization_key
                        AND p.start_order < i.start_order
                        AND (p.status IN ('pending', 'running', 'suspended')
                             OR (p.status = 'waiting' AND p.wait->>'kind' = 'timer'))
                        AND NOT durable_deferred_unstarted(p.id, p.workflow, p.version, p.status)
                      ORDER BY p.status = 'pending', p.start_order LIMIT 1)
                END AS queued_behind"
    };
}

/// A `durable_instance` row as the status projection reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StatusRow {
    pub id: Uuid,
    pub workflow: String,
    pub status: RunStatus,
    pub progress: Option<Value>,
    pub wait: Option<Value>,
    pub output: Option<Value>,
    pub error_code: Option<String>,
    pub error_retryable: Option<bool>,
    pub error_message: Option<String>,
    pub error_detail: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub queued_behind: Option<Uuid>,
    pub version: Option<i32>,
    pub awaiting_runner: Option<bool>,
    pub version_deferred: Option<bool>,
}

impl TryFrom<StatusRow> for InstanceStatus {
    type Error = DurableError;

    fn try_from(r: StatusRow) -> Result<Self> {
        let wait = match r.wait {
            Some(w) => Some(
                serde_json::from_value::<WaitDescription>(w)
                    .map_err(|_| DurableError::Json { what: "wait" })?,
            ),
            None => None,
        };
        Ok(InstanceStatus {
            id: r.id,
            workflow: r.workflow,
            status: r.status,
            progress: r.progress,
            wait,
            output: r.output,
            error: r.error_code.map(|code| ErrorInfo {
                code,
                retryable: r.error_retryable.unwrap_or(false),
                message: r.error_message.unwrap_or_default(),
                detail: r.error_detail,
            }),
            created_at: r.created_at,
            updated_at: r.updated_at,
            ended_at: r.ended_at,
            cancel_requested_at: r.cancel_requested_at,
            queued_behind: r.queued_behind,
            version: r.version.and_then(|v| u32::try_from(v).ok()),
            awaiting_runner: r.awaiting_runner.unwrap_or(false),
            version_deferred: r.version_deferred.unwrap_or(false),
        })
    }
}

/// The status row of one instance.
pub(crate) async fn instance_status(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<StatusRow>> {
    Ok(sqlx::query_as(concat!(
        status_select!(),
        " FROM durable_instance i WHERE i.id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// The status rows of `ids`, in the order of `ids` (an id given twice comes twice);
/// unknown ids are left out. One statement.
pub(crate) async fn instance_statuses(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
) -> Result<Vec<StatusRow>> {
    Ok(sqlx::query_as(concat!(
        status_select!(),
        " FROM unnest($1::uuid[]) WITH ORDINALITY AS w(id, idx)
          JOIN durable_instance i ON i.id = w.id
         ORDER BY w.idx"
    ))
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// One row of the open-instance census: how many instances of `workflow` are in
/// `status` (an open status: `pending`, `running`, `waiting`, `suspended`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CensusRow {
    pub workflow: String,
    pub status: RunStatus,
    pub count: i64,
}

/// The open instances (not ended) counted by workflow and status, in that order; one
/// index-only scan of `durable_instance_open`.
pub(crate) async fn instances_open_census(db: impl PgExecutor<'_>) -> Result<Vec<CensusRow>> {
    Ok(sqlx::query_as(
        "SELECT workflow, status, count(*) AS count FROM durable_instance
          WHERE ended_at IS NULL GROUP BY workflow, status ORDER BY workflow, status",
    )
    .fetch_all(db)
    .await?)
}

/// The start input of an instance.
pub(crate) async fn instance_input(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<Value>> {
    Ok(
        sqlx::query_scalar("SELECT input FROM durable_instance WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// The stored status of an instance, read without a lock.
pub(crate) async fn instance_run_status(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<RunStatus>> {
    Ok(
        sqlx::query_scalar("SELECT status FROM durable_instance WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// An instance read under its row lock.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct LockedInstance {
    pub status: RunStatus,
    /// The instance's workflow.
    pub workflow: String,
    /// A segment holds a live lease (`lease_expires_at > now()`).
    pub leased: bool,
}

/// Locks an instance's row (`FOR UPDATE`, until the transaction ends) and reads its
/// status and whether a segment holds a live lease.
pub(crate) async fn instance_lock(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<LockedInstance>> {
    Ok(sqlx::query_as(
        "SELECT status, workflow, coalesce(lease_expires_at > now(), false) AS leased
           FROM durable_instance WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Counts one more open signal, guarded: only while the instance has not ended
/// (`completed`, `cancelled`) and holds fewer than `limit` open signals. Takes the
/// instance's row lock (held until the transaction ends): signals of one instance
/// serialize here, and the bound holds under any isolation level. False: no row
/// matched (not found, ended or at the limit) and nothing was locked or written.
pub(crate) async fn instance_open_signal(
    db: impl PgExecutor<'_>,
    id: Uuid,
    limit: i32,
) -> Result<bool> {
    let counted: Option<Uuid> = sqlx::query_scalar(
        "UPDATE durable_instance SET open_signals = open_signals + 1, updated_at = now()
          WHERE id = $1 AND status NOT IN ('completed', 'cancelled') AND open_signals < $2
      RETURNING id",
    )
    .bind(id)
    .bind(limit)
    .fetch_optional(db)
    .await?;
    Ok(counted.is_some())
}

/// Takes back an open signal counted by [`instance_open_signal`] in the same
/// transaction (its signal turned out to be a duplicate).
pub(crate) async fn instance_unopen_signal(db: impl PgExecutor<'_>, id: Uuid) -> Result<()> {
    sqlx::query(
        "UPDATE durable_instance SET open_signals = greatest(open_signals - 1, 0) WHERE id = $1",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

/// Marks a cancel request on an instance that has not ended (the first request's time
/// is kept). Guarded; false: no such instance, or it has ended.
pub(crate) async fn instance_request_cancel(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE durable_instance
            SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
          WHERE id = $1 AND status NOT IN ('completed', 'cancelled')",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Cancels an instance that has not ended, at once: `cancelled`, ended now, its wait
/// and lease cleared (clearing the token also fences out an executor whose lease lapsed
/// and that has not noticed yet). Guarded; false: no such instance, or it has ended.
pub(crate) async fn instance_cancel(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE durable_instance
            SET status = 'cancelled', ended_at = now(), wait = NULL,
                cancel_requested_at = coalesce(cancel_requested_at, now()),
                lease_token = NULL, lease_expires_at = NULL, updated_at = now()
          WHERE id = $1 AND status NOT IN ('completed', 'cancelled')",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets a `failed` instance `pending` again, its failure cleared (the retry path).
/// Guarded; false: no such instance, or it is not `failed`.
pub(crate) async fn instance_reset_failed(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE durable_instance
            SET status = 'pending', ended_at = NULL, error_code = NULL,
                error_retryable = NULL, error_message = NULL, error_detail = NULL,
                updated_at = now()
          WHERE id = $1 AND status = 'failed'",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks an instance `terminal_watched` (migration 0021: from now on, a change of its
/// status to `completed`, `failed` or `cancelled` notifies
/// [`crate::TERMINAL_CHANNEL`]). Guarded: writes (and locks the row) only when the mark
/// is not set yet; the row lock makes it serialize with a concurrent segment settle of
/// the instance. A claim that met the lock skipped the instance's command (`SKIP
/// LOCKED`), so when the instance has a queued command the executors are woken
/// (`keel_durable`) for another claim, as a segment settle's release does. False: no
/// such instance, or marked already.
pub(crate) async fn instance_watch_terminal(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    #[derive(sqlx::FromRow)]
    struct Marked {
        marked: i64,
        notified: i64,
    }
    let r: Marked = sqlx::query_as(
        "WITH m AS (
            UPDATE durable_instance SET terminal_watched = true
             WHERE id = $1 AND NOT terminal_watched
         RETURNING id
         ), n AS (
            SELECT pg_notify('keel_durable', '') FROM m
             WHERE EXISTS (SELECT 1 FROM durable_command x
                            WHERE x.instance_id = m.id AND x.state = 'queued')
         )
         SELECT (SELECT count(*) FROM m) AS marked, (SELECT count(*) FROM n) AS notified",
    )
    .bind(id)
    .fetch_one(db)
    .await?;
    if r.notified > 0 {
        tracing::debug!(target: "keel::durable::api", instance_id = %id,
            "marked watched with a queued command: executors woken");
    }
    Ok(r.marked == 1)
}

/// Deletes up to `batch` ended (`completed`/`cancelled`) instances that ended more than
/// `older_secs` seconds ago and have no open command (with their journal, signals and
/// commands, by `ON DELETE CASCADE`); rows locked by others are skipped. Returns the
/// count.
pub(crate) async fn instances_purge(
    db: impl PgExecutor<'_>,
    older_secs: f64,
    batch: i64,
) -> Result<u64> {
    Ok(sqlx::query(
        "WITH i AS (
            SELECT id FROM durable_instance x
             WHERE status IN ('completed', 'cancelled') AND ended_at < now() - make_interval(secs => $1)
               AND NOT EXISTS (SELECT 1 FROM durable_command c
                                WHERE c.instance_id = x.id AND c.state IN ('queued', 'running'))
             ORDER BY ended_at LIMIT $2 FOR UPDATE SKIP LOCKED)
         DELETE FROM durable_instance d USING i WHERE d.id = i.id",
    )
    .bind(older_secs)
    .bind(batch)
    .execute(db)
    .await?
    .rows_affected())
}

// ---------------------------------------------------------------------------------
// durable_signal
// ---------------------------------------------------------------------------------

/// Whether the instance holds a signal with this dedupe key (consumed or not).
pub(crate) async fn signal_exists(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    dedupe_key: &str,
) -> Result<bool> {
    let id: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM durable_signal WHERE instance_id = $1 AND dedupe_key = $2",
    )
    .bind(instance_id)
    .bind(dedupe_key)
    .fetch_optional(db)
    .await?;
    Ok(id.is_some())
}

/// Records a signal unless its dedupe key exists (`ON CONFLICT DO NOTHING`: a
/// duplicate fails no statement); returns whether it was inserted. `recorded_at` is
/// read with `clock_timestamp()`, so when the caller holds the instance's row lock a
/// wait that decided "expired" under that lock never sees a signal recorded before its
/// deadline later.
pub(crate) async fn signal_insert(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    name: &str,
    payload: &Value,
    dedupe_key: &str,
    actor: &Actor,
) -> Result<bool> {
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, recorded_at,
                                    actor_kind, actor_id, actor_reason, on_behalf_of,
                                    attribution_status)
         VALUES ($1, $2, $3, $4, clock_timestamp(), $5, $6, $7, $8, $9)
         ON CONFLICT (instance_id, dedupe_key) DO NOTHING
      RETURNING id",
    )
    .bind(instance_id)
    .bind(name)
    .bind(payload)
    .bind(dedupe_key)
    .bind(actor.kind().as_str())
    .bind(actor.id())
    .bind(actor.reason())
    .bind(actor.on_behalf_of_id())
    .bind(actor.status().as_str())
    .fetch_optional(db)
    .await?;
    Ok(inserted.is_some())
}

// ---------------------------------------------------------------------------------
// durable_command
// ---------------------------------------------------------------------------------

/// Queues a command for an instance (the API's: SIGNAL, RETRY, CANCEL; START goes with
/// its instance, TIMER with a segment settle), available now, recorded by `actor`. The
/// statement trigger `durable_command_notify` wakes the executors at commit.
pub(crate) async fn command_insert(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    kind: CommandKind,
    max_attempts: i32,
    actor: &Actor,
) -> Result<i64> {
    let id = sqlx::query_scalar(
        "INSERT INTO durable_command (instance_id, kind, max_attempts, actor_kind, actor_id,
                                      actor_reason, on_behalf_of, attribution_status)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         RETURNING id",
    )
    .bind(instance_id)
    .bind(kind)
    .bind(max_attempts)
    .bind(actor.kind().as_str())
    .bind(actor.id())
    .bind(actor.reason())
    .bind(actor.on_behalf_of_id())
    .bind(actor.status().as_str())
    .fetch_one(db)
    .await?;
    Ok(id)
}

/// Wakes the suspended instances whose wake tag is `tag` (migration 0068): each gets a
/// RETRY due now, recorded as `SYSTEM` with reason `reason`, and its recovery RETRY
/// that is not due yet is settled `superseded` (the new one replaces it; a suspension
/// of the woken segment schedules the next). An instance whose RETRY is already due or
/// running gets nothing. Returns the instances woken.
pub(crate) async fn instances_wake(
    db: impl PgExecutor<'_>,
    tag: &str,
    reason: &str,
    max_attempts: i32,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "\
WITH s AS (
    SELECT i.id FROM durable_instance i
     WHERE i.status = 'suspended' AND i.wake_tag = $1
       AND NOT EXISTS (SELECT 1 FROM durable_command x
                        WHERE x.instance_id = i.id AND x.kind = 'retry'
                          AND (x.state = 'running' OR (x.state = 'queued' AND x.available_at <= now())))
       FOR UPDATE OF i SKIP LOCKED
), old AS (
    UPDATE durable_command x SET state = 'done', outcome = 'superseded', completed_at = now()
      FROM s
     WHERE x.instance_id = s.id AND x.kind = 'retry' AND x.state = 'queued'
 RETURNING x.id
), r AS (
    INSERT INTO durable_command (instance_id, kind, max_attempts, actor_kind, actor_reason,
                                 attribution_status)
    SELECT s.id, 'retry', $3, 'SYSTEM', $2, 'VERIFIED' FROM s
 RETURNING id
)
SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM old)",
    )
    .bind(tag)
    .bind(reason)
    .bind(max_attempts)
    .fetch_one(db)
    .await?)
}

/// Records an immediate cancel (no segment ran, so the instance was cancelled in the
/// caller's transaction): a CANCEL command already settled `cancelled`, so that who
/// cancelled is kept like any other command's actor.
pub(crate) async fn command_insert_settled_cancel(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    max_attempts: i32,
    actor: &Actor,
) -> Result<i64> {
    let id = sqlx::query_scalar(
        "INSERT INTO durable_command (instance_id, kind, max_attempts, state, outcome,
                                      completed_at, actor_kind, actor_id, actor_reason,
                                      on_behalf_of, attribution_status)
         VALUES ($1, 'cancel', $2, 'done', 'cancelled', now(), $3, $4, $5, $6, $7)
         RETURNING id",
    )
    .bind(instance_id)
    .bind(max_attempts)
    .bind(actor.kind().as_str())
    .bind(actor.id())
    .bind(actor.reason())
    .bind(actor.on_behalf_of_id())
    .bind(actor.status().as_str())
    .fetch_one(db)
    .await?;
    Ok(id)
}

/// A recorded command as [`crate::Engine::attribution`] reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CommandActorRow {
    pub id: i64,
    pub kind: CommandKind,
    pub state: CommandState,
    pub outcome: Option<String>,
    pub created_at: DateTime<Utc>,
    pub actor_kind: String,
    pub actor_id: Option<String>,
    pub actor_reason: Option<String>,
    pub on_behalf_of: Option<String>,
    pub attribution_status: String,
}

/// The commands of an instance with their actors, oldest first (at most `limit`).
pub(crate) async fn commands_with_actors(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    limit: i64,
) -> Result<Vec<CommandActorRow>> {
    Ok(sqlx::query_as(
        "SELECT id, kind, state, outcome, created_at, actor_kind, actor_id, actor_reason,
                on_behalf_of, attribution_status
           FROM durable_command WHERE instance_id = $1 ORDER BY id LIMIT $2",
    )
    .bind(instance_id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// A recorded signal as [`crate::Engine::attribution`] reads it (no payload).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SignalActorRow {
    pub id: i64,
    pub name: String,
    pub dedupe_key: String,
    pub recorded_at: DateTime<Utc>,
    pub consumed_seq: Option<i32>,
    pub actor_kind: String,
    pub actor_id: Option<String>,
    pub actor_reason: Option<String>,
    pub on_behalf_of: Option<String>,
    pub attribution_status: String,
}

/// The signals of an instance with their actors, in recording order (at most `limit`).
pub(crate) async fn signals_with_actors(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    limit: i64,
) -> Result<Vec<SignalActorRow>> {
    Ok(sqlx::query_as(
        "SELECT id, name, dedupe_key, recorded_at, consumed_seq, actor_kind, actor_id,
                actor_reason, on_behalf_of, attribution_status
           FROM durable_signal WHERE instance_id = $1 ORDER BY recorded_at, id LIMIT $2",
    )
    .bind(instance_id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Settles every open (`queued`, `running`) command of an instance as `cancelled`;
/// returns the count.
pub(crate) async fn commands_cancel_open(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE durable_command SET state = 'done', outcome = 'cancelled', completed_at = now()
          WHERE instance_id = $1 AND state IN ('queued', 'running')",
    )
    .bind(instance_id)
    .execute(db)
    .await?
    .rows_affected())
}

/// Deletes up to `batch` settled (`done`) commands completed more than `older_secs`
/// seconds ago; rows locked by others are skipped. Returns the count.
pub(crate) async fn commands_purge(
    db: impl PgExecutor<'_>,
    older_secs: f64,
    batch: i64,
) -> Result<u64> {
    Ok(sqlx::query(
        "WITH c AS (
            SELECT id FROM durable_command
             WHERE state = 'done' AND completed_at < now() - make_interval(secs => $1)
             ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED)
         DELETE FROM durable_command d USING c WHERE d.id = c.id",
    )
    .bind(older_secs)
    .bind(batch)
    .execute(db)
    .await?
    .rows_affected())
}

/// Runnable commands: running, or queued and available.
pub(crate) async fn commands_runnable(db: impl PgExecutor<'_>) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM durable_command
          WHERE state = 'running' OR (state = 'queued' AND available_at <= now())",
    )
    .fetch_one(db)
    .await?)
}

/// A command the idle report lists.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ListedCommand {
    pub id: i64,
    pub instance_id: Uuid,
    pub kind: CommandKind,
    pub state: CommandState,
    pub attempt: i32,
    pub available_at: DateTime<Utc>,
    pub last_error: Option<String>,
    /// `available_at > now()`: deferred.
    pub future: bool,
}

/// Dead commands, queued ones not yet available, and runnable ones available for more
/// than `stuck_secs` seconds; at most 1,000, by id.
pub(crate) async fn commands_listed(
    db: impl PgExecutor<'_>,
    stuck_secs: f64,
) -> Result<Vec<ListedCommand>> {
    Ok(sqlx::query_as(
        "SELECT id, instance_id, kind, state, attempt, available_at, last_error,
                available_at > now() AS future
           FROM durable_command
          WHERE state = 'dead'
             OR (state = 'queued' AND available_at > now())
             OR (state IN ('queued', 'running') AND available_at <= now() - make_interval(secs => $1))
          ORDER BY id LIMIT 1000",
    )
    .bind(stuck_secs)
    .fetch_all(db)
    .await?)
}

// ---------------------------------------------------------------------------------
// The executor's single statements (its batch statements stay in `executor/` and
// `context.rs`, next to the combiners that bind them). Errors are sqlx's, unclassified,
// as the executor logs or classifies them itself.
// ---------------------------------------------------------------------------------

/// The W3C `traceparent` recorded with an instance (`None`: none recorded, or no such
/// instance).
pub(crate) async fn instance_trace_context(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> std::result::Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT trace_context FROM durable_instance WHERE id = $1")
        .bind(instance_id)
        .fetch_optional(db)
        .await
        .map(Option::flatten)
}

/// The journal of an instance, in journal order.
pub(crate) async fn journal_entries(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> std::result::Result<Vec<JournalEntry>, sqlx::Error> {
    sqlx::query_as(
        "SELECT kind, name, result FROM durable_journal WHERE instance_id = $1 ORDER BY seq",
    )
    .bind(instance_id)
    .fetch_all(db)
    .await
}

/// Counts of the single segment settle statements.
#[derive(Debug, sqlx::FromRow)]
struct SettleCounts {
    /// 1 when the fence matched; 0: fenced out, nothing written.
    settled: i64,
    /// 1 when executors were notified.
    notified: i64,
}

/// The segment settle of a command that ran no body (see the ended-instance table):
/// settles only the command with `outcome` (the instance is unchanged), releases the
/// lease, and notifies. Fenced by `token`; false: fenced out, nothing written.
pub(crate) async fn command_settle_alone(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    token: Uuid,
    command_id: i64,
    outcome: &str,
) -> Result<bool> {
    let r: SettleCounts = sqlx::query_as(
        "\
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
SELECT (SELECT count(*) FROM i) AS settled, (SELECT count(*) FROM n) AS notified",
    )
    .bind(instance_id)
    .bind(token)
    .bind(command_id)
    .bind(outcome)
    .fetch_one(db)
    .await?;
    debug_assert!(r.notified <= r.settled);
    Ok(r.settled == 1)
}

/// Puts the command back with a backoff of `delay_secs` after an infrastructure failure
/// (`last_error = code`; the claim's attempt kept, or given back when `refund`: a
/// transient database failure is not the command's fault) and releases the lease.
/// Fenced by `token`. Returns the commands put back (0: fenced out).
pub(crate) async fn command_release(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    token: Uuid,
    command_id: i64,
    delay_secs: f64,
    code: &str,
    refund: bool,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "\
WITH i AS (
    UPDATE durable_instance SET lease_token = NULL, lease_expires_at = NULL
     WHERE id = $1 AND lease_token = $2
 RETURNING id
), c AS (
    UPDATE durable_command
       SET state = 'queued', available_at = now() + make_interval(secs => $4), last_error = $5,
           -- A START keeps at least 1: a claim at attempt 1 is taken for the instance's
           -- first ever (its journal is not read), which a START that ran is not.
           attempt = CASE WHEN $6 THEN greatest(durable_command.attempt - 1,
                                                CASE WHEN durable_command.kind = 'start' THEN 1 ELSE 0 END)
                          ELSE durable_command.attempt END
      FROM i WHERE durable_command.id = $3
 RETURNING durable_command.id
)
SELECT count(*) FROM c",
    )
    .bind(instance_id)
    .bind(token)
    .bind(command_id)
    .bind(delay_secs)
    .bind(code)
    .bind(refund)
    .fetch_one(db)
    .await?)
}

/// The rescuer: a running command whose instance's lease lapsed (its executor crashed
/// or stalled) is queued again at its original position, its attempt kept (the next
/// claim spends one). A stalled executor that wakes later is fenced out by the new
/// token of whoever claims next. Returns the commands queued again.
pub(crate) async fn commands_rescue(
    db: impl PgExecutor<'_>,
) -> std::result::Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "\
UPDATE durable_command c SET state = 'queued'
  FROM durable_instance i
 WHERE c.state = 'running' AND i.id = c.instance_id
   AND (i.lease_expires_at IS NULL OR i.lease_expires_at <= now())",
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// Renews a segment's lease for `lease_secs`, fenced by `token`: `None` when fenced out,
/// else whether a cancel was requested.
pub(crate) async fn instance_renew_lease(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    token: Uuid,
    lease_secs: f64,
) -> std::result::Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar(
        "\
UPDATE durable_instance SET lease_expires_at = now() + make_interval(secs => $3)
 WHERE id = $1 AND lease_token = $2
RETURNING cancel_requested_at IS NOT NULL",
    )
    .bind(instance_id)
    .bind(token)
    .bind(lease_secs)
    .fetch_optional(db)
    .await
}

/// What the executor loop waits for (database clock).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct NextDue {
    /// Seconds to the earliest queued command that was not due at the given time (zero
    /// or negative: due since).
    pub next: Option<f64>,
    /// Seconds to the earliest lease expiry (negative when one has lapsed).
    pub lease: Option<f64>,
    /// Queued commands.
    pub depth: i64,
}

/// Seconds to the earliest queued command that was not due at `after` (the database
/// time of the executor's last claim; `None`: now), to the earliest lease expiry, and
/// the queue depth. A command that fell due between that claim and this query was not
/// seen by the claim: it comes back as due (zero or negative), not skipped.
pub(crate) async fn queue_next_due(
    db: impl PgExecutor<'_>,
    after: Option<DateTime<Utc>>,
) -> Result<NextDue> {
    Ok(sqlx::query_as(
        "\
SELECT extract(epoch FROM (SELECT min(available_at) FROM durable_command
                            WHERE state = 'queued' AND available_at > coalesce($1, now()))
                       - now())::float8 AS next,
       extract(epoch FROM (SELECT min(lease_expires_at) FROM durable_instance
                            WHERE lease_expires_at IS NOT NULL) - now())::float8 AS lease,
       (SELECT count(*) FROM durable_command WHERE state = 'queued') AS depth",
    )
    .bind(after)
    .fetch_one(db)
    .await?)
}

// ---------------------------------------------------------------------------------
// Platform Status (health.rs): value-free reads of the projection
// ---------------------------------------------------------------------------------

/// Instances counted by workflow and status (every status, ended ones included).
pub(crate) async fn instances_state_counts(db: impl PgExecutor<'_>) -> Result<Vec<CensusRow>> {
    Ok(sqlx::query_as(
        "SELECT workflow, status, count(*) AS count FROM durable_instance
          GROUP BY workflow, status ORDER BY workflow, status",
    )
    .fetch_all(db)
    .await?)
}

/// One instance as Platform Status lists it: id, workflow, status and times only (no
/// input, output or error text).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct HealthInstanceRow {
    pub id: Uuid,
    pub workflow: String,
    pub idempotency_key: String,
    pub status: RunStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The oldest (by `created_at`) open instance per (workflow, status) among `running`,
/// `waiting` and `suspended`.
pub(crate) async fn instances_oldest_open(
    db: impl PgExecutor<'_>,
) -> Result<Vec<HealthInstanceRow>> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT ON (workflow, status) id, workflow, idempotency_key, status, created_at, updated_at
           FROM durable_instance
          WHERE ended_at IS NULL AND status IN ('running', 'waiting', 'suspended')
          ORDER BY workflow, status, created_at, id",
    )
    .fetch_all(db)
    .await?)
}

/// `pending` instances created more than `older_than_secs` ago (database clock), oldest
/// first, at most `limit`, with the total count.
pub(crate) async fn instances_pending_over(
    db: impl PgExecutor<'_>,
    older_than_secs: f64,
    limit: i64,
) -> Result<(i64, Vec<HealthInstanceRow>)> {
    let rows: Vec<CountedRow> = sqlx::query_as(
        "SELECT count(*) OVER (), id, workflow, idempotency_key, status, created_at, updated_at
           FROM durable_instance
          WHERE ended_at IS NULL AND status = 'pending'
            AND created_at < now() - make_interval(secs => $1)
          ORDER BY created_at, id LIMIT $2",
    )
    .bind(older_than_secs)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(split_counted(rows))
}

/// Open (not ended) instances whose row has not changed for more than
/// `older_than_secs` (database clock), least recently changed first, at most `limit`,
/// with the total count.
pub(crate) async fn instances_unchanged_over(
    db: impl PgExecutor<'_>,
    older_than_secs: f64,
    limit: i64,
) -> Result<(i64, Vec<HealthInstanceRow>)> {
    let rows: Vec<CountedRow> = sqlx::query_as(
        "SELECT count(*) OVER (), id, workflow, idempotency_key, status, created_at, updated_at
           FROM durable_instance
          WHERE ended_at IS NULL AND updated_at < now() - make_interval(secs => $1)
          ORDER BY updated_at, id LIMIT $2",
    )
    .bind(older_than_secs)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(split_counted(rows))
}

type CountedRow = (
    i64,
    Uuid,
    String,
    String,
    RunStatus,
    DateTime<Utc>,
    DateTime<Utc>,
);

fn split_counted(rows: Vec<CountedRow>) -> (i64, Vec<HealthInstanceRow>) {
    let total = rows.first().map_or(0, |r| r.0);
    let rows = rows
        .into_iter()
        .map(
            |(_, id, workflow, idempotency_key, status, created_at, updated_at)| {
                HealthInstanceRow {
                    id,
                    workflow,
                    idempotency_key,
                    status,
                    created_at,
                    updated_at,
                }
            },
        )
        .collect();
    (total, rows)
}

/// A dead-lettered command (its attempts exhausted), value-free.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DeadCommandRow {
    pub instance_id: Uuid,
    pub workflow: String,
    pub kind: CommandKind,
    pub last_error: Option<String>,
    pub completed_at: DateTime<Utc>,
}

/// The dead-lettered commands: their count and the `limit` most recent (one scan of the
/// partial index `durable_command_dead`).
pub(crate) async fn commands_dead(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> Result<(i64, Vec<DeadCommandRow>)> {
    type DeadRow = (
        i64,
        Uuid,
        String,
        CommandKind,
        Option<String>,
        DateTime<Utc>,
    );
    let rows: Vec<DeadRow> = sqlx::query_as(
        "SELECT count(*) OVER (), c.instance_id, i.workflow, c.kind, c.last_error, c.completed_at
           FROM durable_command c JOIN durable_instance i ON i.id = c.instance_id
          WHERE c.state = 'dead'
          ORDER BY c.completed_at DESC, c.id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    let total = rows.first().map_or(0, |r| r.0);
    let rows = rows
        .into_iter()
        .map(
            |(_, instance_id, workflow, kind, last_error, completed_at)| DeadCommandRow {
                instance_id,
                workflow,
                kind,
                last_error,
                completed_at,
            },
        )
        .collect();
    Ok((total, rows))
}
