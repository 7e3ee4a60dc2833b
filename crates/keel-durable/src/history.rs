//! Operation history, the decision log (issue 23): append-only entries of what was
//! asked of an instance and what the engine decided, each with the actor of its
//! command and the change of the instance's published state as an RFC 6902 patch.
//!
//! ## Entries
//!
//! Entries are numbered `1, 2, ...` per instance with no gap (`seq`, allocated under the
//! instance's row lock from `durable_instance.history_seq`) and are written **in the
//! transaction of the change they log**:
//!
//! - the recording transactions of commands: `command_received` (a START, with a
//!   redacted copy of its input, or a SIGNAL, with its name), `cancel_requested`
//!   (a cancel of an instance a segment runs), `cancelled` (an immediate cancel), `retry`
//!   (a recorded retry; for a `failed` instance with the patch to `pending`);
//! - the segment settle (the one fenced statement that ends a segment): `timer_fired`
//!   (a TIMER command's segment) or `retry` (a RETRY command's segment) first, then one
//!   entry per journal entry the segment recorded (or replayed without a logged entry,
//!   see below): `step_recorded` (name, outcome `ok`/`err`, `durationMs`),
//!   `transaction_enqueued` (a step whose name starts with
//!   [`HistoryConfig::transaction_step_prefix`]), `timer_set` (a durable sleep's
//!   deadline), `signal_applied` / `verdict_received` (a consumed signal; a verdict when
//!   its name starts with [`HistoryConfig::verdict_signal_prefix`]), `timeout` (a wait
//!   whose deadline passed), `child_started`; and last the segment's end:
//!   `wait_entered`, `suspended`, `completed`, `failed` or `cancelled`, which carries the
//!   state change.
//!
//! So a segment that is lost (the process killed, the connection dropped, the lease
//! taken over) leaves **no** entry: its step results are journaled, and the segment that
//! runs the command again logs them (as replayed, without a duration) before its own.
//! `durable_instance.history_journal` counts the journal entries already logged.
//!
//! A command settled without running the body (stale, rejected or parked against an
//! ended or failed instance) and a released command log nothing; nor do the START of a
//! child instance or the SIGNAL a child's end records (both written in SQL by the
//! engine: the child's first segment logs its baseline, the parent logs the signal when
//! its segment applies it).
//!
//! ## State, patches, baselines and bounds
//!
//! The state is the instance's published projection: `{"status", "progress", "wait",
//! "output", "error"}` (absent members are `null` in the projection and left out here).
//! Each entry carries `patch` — an RFC 6902 patch (add, remove, replace only; computed
//! by the `json-patch` crate from the JSON values before and after, with no number
//! rounding: serde_json keeps integers, decimal strings stay strings) from the state
//! after the previous entry to the state after this one (`[]` when unchanged) — or a full
//! `baseline` instead: at the instance's START, at its first segment, whenever the
//! instance's entries cross a multiple of [`HistoryConfig::baseline_every`], after an
//! entry whose state was unknown, and when the patch's JSON is over
//! [`HistoryConfig::max_patch_bytes`] (default 65,536). A state over
//! [`HistoryConfig::max_state_bytes`] is not logged at all: the entry is marked
//! `truncated` (no patch, no baseline) and the next state-changing entry logs a
//! baseline. Applying the patches in order from the latest baseline reproduces the
//! stored state ([`Engine::history`] does it for every entry).
//!
//! ## Redaction
//!
//! Before anything is diffed or written, values are replaced by `"[redacted]"`:
//! at the JSON pointers a workflow declares ([`crate::Workflow::HISTORY_REDACT`],
//! relative to each of the start input, the progress, the output and the error detail),
//! and under every object member whose name is in [`HistoryConfig::denylist`]
//! (case-insensitive, at any depth; default `password`, `secret`, `privateKey`,
//! `private_key`, `mnemonic`, `seedPhrase`, `apiKey`, `api_key`, `authorization`). So no
//! logged form (input copy, patch, baseline) holds those values. The instance's own
//! columns are not redacted.
//!
//! Retention: entries go with their instance (`ON DELETE CASCADE`), when retention
//! deletes it (see [`crate::Retention`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value, json};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::actor::Actor;
use crate::context::JournalEntry;
use crate::engine::Engine;
use crate::error::{DurableError, Result};
use crate::status::CommandKind;

/// What replaces a redacted value in the history.
pub const REDACTED: &str = "[redacted]";

/// The most entries one [`Engine::history`] call returns.
pub const HISTORY_PAGE_LIMIT: i64 = 500;

/// Settings of the decision log (set with [`Engine::with_history_config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// A full baseline at least every this many entries of an instance (default 50,
    /// at least 1).
    pub baseline_every: u32,
    /// A patch whose JSON is longer than this many bytes is replaced by a baseline
    /// (default 65,536).
    pub max_patch_bytes: usize,
    /// A state whose JSON is longer than this many bytes is not logged: the entry is
    /// marked truncated (default 1,048,576).
    pub max_state_bytes: usize,
    /// Object member names whose values are redacted at any depth (case-insensitive).
    pub denylist: Vec<String>,
    /// A step whose name starts with this is logged as `transaction_enqueued`
    /// (default `"enqueue "`, the transaction queue steps of keel-workflows).
    pub transaction_step_prefix: String,
    /// A consumed signal whose name starts with this is logged as `verdict_received`
    /// (default `"tx."`, the settlement verdict signals of keel-workflows).
    pub verdict_signal_prefix: String,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            baseline_every: 50,
            max_patch_bytes: 65_536,
            max_state_bytes: 1 << 20,
            denylist: [
                "password",
                "secret",
                "privateKey",
                "private_key",
                "mnemonic",
                "seedPhrase",
                "apiKey",
                "api_key",
                "authorization",
            ]
            .into_iter()
            .map(str::to_owned)
            .collect(),
            transaction_step_prefix: "enqueue ".to_owned(),
            verdict_signal_prefix: "tx.".to_owned(),
        }
    }
}

/// Redacts `v` in place: the values at `pointers` (RFC 6901, relative to `v`) and under
/// denylisted member names at any depth become [`REDACTED`]. Iterative (no recursion on
/// the value's depth).
pub fn redact(v: &mut Value, pointers: &[&str], denylist: &[String]) {
    for p in pointers {
        if let Some(slot) = v.pointer_mut(p) {
            *slot = Value::String(REDACTED.to_owned());
        }
    }
    if denylist.is_empty() {
        return;
    }
    let mut stack: Vec<&mut Value> = vec![v];
    while let Some(cur) = stack.pop() {
        match cur {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    if denylist.iter().any(|d| d.eq_ignore_ascii_case(k)) {
                        *child = Value::String(REDACTED.to_owned());
                    } else {
                        stack.push(child);
                    }
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            _ => {}
        }
    }
}

/// The published state of an instance as the history logs it (before redaction).
#[derive(Debug, Clone, Default)]
pub(crate) struct Projection {
    pub status: String,
    pub progress: Option<Value>,
    pub wait: Option<Value>,
    pub output: Option<Value>,
    pub error_code: Option<String>,
    pub error_retryable: Option<bool>,
    pub error_message: Option<String>,
    pub error_detail: Option<Value>,
}

impl Projection {
    /// The redacted state object.
    pub(crate) fn state(self, pointers: &[&str], config: &HistoryConfig) -> Value {
        let mut m = Map::new();
        m.insert("status".to_owned(), Value::String(self.status));
        let mut put = |k: &str, v: Option<Value>, redacted: bool| {
            if let Some(mut v) = v.filter(|v| !v.is_null()) {
                if redacted {
                    redact(&mut v, pointers, &config.denylist);
                }
                m.insert(k.to_owned(), v);
            }
        };
        put("progress", self.progress, true);
        put("wait", self.wait, false);
        put("output", self.output, true);
        if let Some(code) = self.error_code {
            let mut detail = self.error_detail.unwrap_or(Value::Null);
            if !detail.is_null() {
                redact(&mut detail, pointers, &config.denylist);
            }
            let mut e = Map::new();
            e.insert("code".to_owned(), Value::String(code));
            if let Some(r) = self.error_retryable {
                e.insert("retryable".to_owned(), Value::Bool(r));
            }
            if let Some(msg) = self.error_message {
                e.insert("message".to_owned(), Value::String(msg));
            }
            if !detail.is_null() {
                e.insert("detail".to_owned(), detail);
            }
            m.insert("error".to_owned(), Value::Object(e));
        }
        Value::Object(m)
    }
}

/// The state a new instance starts with (logged as the START entry's baseline).
pub(crate) fn initial_state() -> Value {
    json!({ "status": "pending" })
}

/// How an entry carries the state change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delta {
    /// `patch = []`.
    Unchanged,
    /// An RFC 6902 patch (JSON array).
    Patch(Value),
    /// The full state.
    Baseline(Value),
    /// Too large to log.
    Truncated,
}

/// An entry to append (the write side).
#[derive(Debug, Clone)]
pub(crate) struct NewEntry {
    pub kind: &'static str,
    pub detail: Value,
    pub delta: Delta,
}

impl NewEntry {
    pub(crate) fn unchanged(kind: &'static str, detail: Value) -> Self {
        Self {
            kind,
            detail,
            delta: Delta::Unchanged,
        }
    }

    /// The wire form the settle statements read (`kind`, `detail`, `patch`,
    /// `baseline`, `truncated`).
    fn to_json(&self) -> Value {
        let (patch, baseline, truncated) = match &self.delta {
            Delta::Unchanged => (json!([]), Value::Null, false),
            Delta::Patch(p) => (p.clone(), Value::Null, false),
            Delta::Baseline(b) => (Value::Null, b.clone(), false),
            Delta::Truncated => (Value::Null, Value::Null, true),
        };
        json!({
            "kind": self.kind,
            "detail": self.detail,
            "patch": patch,
            "baseline": baseline,
            "truncated": truncated,
        })
    }
}

/// The delta from `before` (the logged state after the previous entry; `None`: unknown)
/// to `after` (redacted), under the size bounds; `force_baseline` logs the full state.
/// Returns the delta and the state to remember as logged (`None` after a truncation).
pub(crate) fn delta(
    config: &HistoryConfig,
    before: Option<&Value>,
    after: Value,
    force_baseline: bool,
) -> (Delta, Option<Value>) {
    let state_len = serde_json::to_vec(&after).map_or(usize::MAX, |v| v.len());
    if state_len > config.max_state_bytes {
        return (Delta::Truncated, None);
    }
    let Some(before) = before.filter(|_| !force_baseline) else {
        return (Delta::Baseline(after.clone()), Some(after));
    };
    if *before == after {
        return (Delta::Unchanged, Some(after));
    }
    let patch = json_patch::diff(before, &after);
    match serde_json::to_value(&patch) {
        Ok(p)
            if serde_json::to_vec(&p).map_or(usize::MAX, |v| v.len()) <= config.max_patch_bytes =>
        {
            (Delta::Patch(p), Some(after))
        }
        _ => (Delta::Baseline(after.clone()), Some(after)),
    }
}

/// Applies an entry's stored delta to the reconstructed state (`None`: unknown).
fn apply(
    state: Option<Value>,
    patch: Option<&Value>,
    baseline: Option<&Value>,
    truncated: bool,
) -> Option<Value> {
    if truncated {
        return None;
    }
    if let Some(b) = baseline {
        return Some(b.clone());
    }
    let mut state = state?;
    let ops: json_patch::Patch = serde_json::from_value(patch?.clone()).ok()?;
    json_patch::patch(&mut state, &ops).ok()?;
    Some(state)
}

// ---------------------------------------------------------------------------------
// The segment's trail
// ---------------------------------------------------------------------------------

/// What the history knew of an instance when its segment began.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Prior {
    /// The state after the latest entry (redacted); `None`: unknown.
    pub history_state: Option<Value>,
    /// Journal entries already logged.
    pub history_journal: i32,
    /// The last sequence used.
    pub history_seq: i64,
}

impl Prior {
    /// A new instance's, before its first segment (as the START recorded it).
    pub(crate) fn initial() -> Self {
        Self {
            history_state: Some(initial_state()),
            history_journal: 0,
            history_seq: 1,
        }
    }
}

/// One journal entry as the history logs it.
#[derive(Debug, Clone)]
pub(crate) struct TrailStep {
    pub kind: String,
    pub name: String,
    /// `ok` / `err` for a step; `received` / `expired` for a signal; the deadline for a
    /// sleep; the child id for a child.
    pub result: Value,
    /// Milliseconds the step's body took (steps run in this segment only).
    pub duration_ms: Option<u64>,
    /// Replayed from a segment that logged nothing (it was lost).
    pub replayed: bool,
}

impl TrailStep {
    pub(crate) fn from_journal(e: &JournalEntry) -> Self {
        Self {
            kind: e.kind.clone(),
            name: e.name.clone(),
            result: summarize(&e.kind, &e.result),
            duration_ms: None,
            replayed: true,
        }
    }
}

/// The value-free part of a journal result the history keeps.
pub(crate) fn summarize(kind: &str, result: &Value) -> Value {
    match kind {
        "step" => Value::String(
            if result.get("ok").is_some() {
                "ok"
            } else {
                "err"
            }
            .to_owned(),
        ),
        "signal" => Value::String(
            if result
                .get("ok")
                .is_some_and(|v| v.get("received").is_some())
            {
                "received"
            } else {
                "expired"
            }
            .to_owned(),
        ),
        "sleep" | "child" => result.get("ok").cloned().unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

/// What a segment leaves for its history entries: the prior log position (read at the
/// segment's start), the journal entries replayed without an entry, the ones recorded
/// now, and the latest progress the body set.
#[derive(Debug, Default)]
pub(crate) struct SegmentTrail {
    /// The progress the body set that no journal write carried yet (the settle writes
    /// it).
    pub progress: Option<Value>,
    pub prior: Option<Prior>,
    pub steps: Vec<TrailStep>,
    pub journal_len: i32,
    pub last_progress: Option<Value>,
}

/// The entries of a segment settle and the history bookkeeping it writes.
#[derive(Debug)]
pub(crate) struct SettleHistory {
    /// JSON array text of the entries (see [`NewEntry::to_json`]).
    pub entries: String,
    /// The state after the last entry (JSON text), `None` when unknown.
    pub state: Option<String>,
    /// Journal entries logged after this settle.
    pub journal: i32,
}

impl Engine {
    /// The entries of a segment that ends with `end` (the final entry's kind and detail)
    /// and the projection `after` (before redaction).
    pub(crate) fn settle_history(
        &self,
        workflow: &str,
        command_kind: CommandKind,
        trail: SegmentTrail,
        end: (&'static str, Value),
        after: Projection,
    ) -> SettleHistory {
        let cfg = &self.history;
        let pointers = self.registry.history_redact(workflow);
        let prior = trail.prior.unwrap_or(Prior {
            history_state: None,
            history_journal: 0,
            history_seq: 0,
        });
        let mut entries: Vec<NewEntry> = Vec::with_capacity(trail.steps.len() + 2);
        match command_kind {
            CommandKind::Timer => entries.push(NewEntry::unchanged("timer_fired", json!({}))),
            CommandKind::Retry => {
                entries.push(NewEntry::unchanged("retry", json!({ "stage": "resumed" })));
            }
            // A START, SIGNAL or CANCEL is told by the entries it leads to.
            CommandKind::Start | CommandKind::Signal | CommandKind::Cancel => {}
        }
        for s in trail.steps {
            let mut detail = Map::new();
            let kind = match s.kind.as_str() {
                "step" => {
                    detail.insert("name".to_owned(), Value::String(s.name.clone()));
                    detail.insert("outcome".to_owned(), s.result);
                    if let Some(ms) = s.duration_ms {
                        detail.insert("durationMs".to_owned(), json!(ms));
                    }
                    if s.name.starts_with(&cfg.transaction_step_prefix) {
                        "transaction_enqueued"
                    } else {
                        "step_recorded"
                    }
                }
                "sleep" => {
                    detail.insert("deadline".to_owned(), s.result);
                    "timer_set"
                }
                "signal" => {
                    let expired = s.result.as_str() == Some("expired");
                    detail.insert("name".to_owned(), Value::String(s.name.clone()));
                    if expired {
                        "timeout"
                    } else if s.name.starts_with(&cfg.verdict_signal_prefix) {
                        "verdict_received"
                    } else {
                        "signal_applied"
                    }
                }
                "child" => {
                    detail.insert("key".to_owned(), Value::String(s.name.clone()));
                    detail.insert("childId".to_owned(), s.result);
                    "child_started"
                }
                // now, uuid, random and a signal wait's deadline decide nothing.
                _ => continue,
            };
            if s.replayed {
                detail.insert("replayed".to_owned(), Value::Bool(true));
            }
            entries.push(NewEntry::unchanged(kind, Value::Object(detail)));
        }
        let n = i64::try_from(entries.len())
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let every = i64::from(cfg.baseline_every.max(1));
        let crosses = prior.history_seq / every != (prior.history_seq + n) / every;
        let force = command_kind == CommandKind::Start || crosses;
        let (delta, logged) = delta(
            cfg,
            prior.history_state.as_ref(),
            after.state(pointers, cfg),
            force,
        );
        entries.push(NewEntry {
            kind: end.0,
            detail: end.1,
            delta,
        });
        let entries = Value::Array(entries.iter().map(NewEntry::to_json).collect()).to_string();
        SettleHistory {
            entries,
            state: logged.map(|v| v.to_string()),
            journal: trail.journal_len.max(prior.history_journal),
        }
    }

    /// The redacted copy of a start input the START entry carries.
    pub(crate) fn history_input(&self, workflow: &str, input: &Value) -> Value {
        let mut v = input.clone();
        redact(
            &mut v,
            self.registry.history_redact(workflow),
            &self.history.denylist,
        );
        json!({ "command": "start", "input": v })
    }
}

// ---------------------------------------------------------------------------------
// SQL (durable_history and the history columns of durable_instance, migration 0056)
// ---------------------------------------------------------------------------------

/// The log position of an instance at the start of its segment.
pub(crate) async fn prior(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> std::result::Result<Option<Prior>, sqlx::Error> {
    sqlx::query_as(
        "SELECT history_state, history_journal, history_seq FROM durable_instance WHERE id = $1",
    )
    .bind(instance_id)
    .fetch_optional(db)
    .await
}

/// Appends one entry in a recording transaction (the instance's row is locked by the
/// statement, until the transaction ends), recorded by `actor` for `command_id`.
/// `state`: the state to remember as logged after it, when the entry changes it.
pub(crate) async fn append_recorded(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    command_id: Option<i64>,
    actor: &Actor,
    entry: &NewEntry,
    state: Option<Option<&Value>>,
) -> Result<()> {
    let e = entry.to_json();
    sqlx::query(
        "WITH s AS (
            UPDATE durable_instance
               SET history_seq = history_seq + 1,
                   history_state = CASE WHEN $10 THEN $11::jsonb ELSE history_state END
             WHERE id = $1
         RETURNING history_seq
         )
         INSERT INTO durable_history (instance_id, seq, kind, command_id, actor_kind, actor_id,
                                      actor_reason, on_behalf_of, attribution_status, detail,
                                      patch, baseline, truncated)
         SELECT $1, s.history_seq, $2, $3, $4, $5, $6, $7, $8, $9->'detail',
                NULLIF($9->'patch', 'null'::jsonb), NULLIF($9->'baseline', 'null'::jsonb),
                ($9->>'truncated')::boolean
           FROM s",
    )
    .bind(instance_id)
    .bind(entry.kind)
    .bind(command_id)
    .bind(actor.kind().as_str())
    .bind(actor.id())
    .bind(actor.reason())
    .bind(actor.on_behalf_of_id())
    .bind(actor.status().as_str())
    .bind(&e)
    .bind(state.is_some())
    .bind(state.flatten())
    .execute(db)
    .await?;
    Ok(())
}

#[derive(Debug, sqlx::FromRow)]
struct ProjectionRow {
    workflow: String,
    status: String,
    progress: Option<Value>,
    wait: Option<Value>,
    output: Option<Value>,
    error_code: Option<String>,
    error_retryable: Option<bool>,
    error_message: Option<String>,
    error_detail: Option<Value>,
    history_state: Option<Value>,
}

impl Engine {
    /// Appends the entry of a recorded change of an instance's state (an immediate
    /// cancel, a retry of a failed instance), on the caller's transaction, after the
    /// change: reads the projection and the logged state, and logs the patch.
    pub(crate) async fn log_state_change(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
        command_id: Option<i64>,
        actor: &Actor,
        kind: &'static str,
        detail: Value,
    ) -> Result<()> {
        let row: Option<ProjectionRow> = sqlx::query_as(
            "SELECT workflow, status, progress, wait, output, error_code, error_retryable,
                    error_message, error_detail, history_state
               FROM durable_instance WHERE id = $1",
        )
        .bind(instance_id)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Err(DurableError::InstanceNotFound(instance_id));
        };
        let pointers = self.registry.history_redact(&row.workflow);
        let after = Projection {
            status: row.status,
            progress: row.progress,
            wait: row.wait,
            output: row.output,
            error_code: row.error_code,
            error_retryable: row.error_retryable,
            error_message: row.error_message,
            error_detail: row.error_detail,
        }
        .state(pointers, &self.history);
        let (delta, logged) = delta(&self.history, row.history_state.as_ref(), after, false);
        let entry = NewEntry {
            kind,
            detail,
            delta,
        };
        append_recorded(
            &mut *conn,
            instance_id,
            command_id,
            actor,
            &entry,
            Some(logged.as_ref()),
        )
        .await
    }
}

// ---------------------------------------------------------------------------------
// The read side
// ---------------------------------------------------------------------------------

/// One entry of an instance's history, as [`Engine::history`] returns it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// 1-based, per instance, with no gap.
    pub seq: i64,
    /// What happened (see the module docs): `command_received`, `step_recorded`,
    /// `wait_entered`, `completed`, ...
    pub kind: String,
    /// When its transaction wrote it (database clock).
    pub recorded_at: DateTime<Utc>,
    /// The command it belongs to (`None` when that command is unknown).
    pub command_id: Option<i64>,
    /// The actor of that command.
    pub actor: Actor,
    /// Value-free facts: names, outcome kinds, `durationMs`, codes; a START's redacted
    /// input.
    pub detail: Value,
    /// The RFC 6902 patch from the previous entry's state (`None` when the entry holds
    /// a baseline or was truncated).
    pub patch: Option<Value>,
    /// Whether the entry holds a full baseline of the state.
    pub baseline: bool,
    /// Whether the state change was too large to log.
    pub truncated: bool,
    /// The (redacted) state after this entry, reconstructed from the latest baseline
    /// and the patches since; `None` when unknown (after a truncation, until the next
    /// baseline).
    pub state: Option<Value>,
}

/// A page of [`Engine::history`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryPage {
    /// Entries in `seq` order.
    pub entries: Vec<HistoryEntry>,
    /// Pass as `after` for the next page; `None` at the end.
    pub next_after: Option<i64>,
}

#[derive(Debug, sqlx::FromRow)]
struct EntryRow {
    seq: i64,
    kind: String,
    recorded_at: DateTime<Utc>,
    command_id: Option<i64>,
    actor_kind: String,
    actor_id: Option<String>,
    actor_reason: Option<String>,
    on_behalf_of: Option<String>,
    attribution_status: String,
    detail: Value,
    patch: Option<Value>,
    baseline: Option<Value>,
    truncated: bool,
}

/// Entries of an instance with `seq` in `(after, upto)`, in order, at most `limit`.
async fn entries_between(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    after: i64,
    upto: i64,
    limit: i64,
) -> std::result::Result<Vec<EntryRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT seq, kind, recorded_at, command_id, actor_kind, actor_id, actor_reason,
                on_behalf_of, attribution_status, detail, patch, baseline, truncated
           FROM durable_history
          WHERE instance_id = $1 AND seq > $2 AND seq < $3
          ORDER BY seq LIMIT $4",
    )
    .bind(instance_id)
    .bind(after)
    .bind(upto)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The latest entry before `before` that holds a baseline or was truncated.
async fn anchor_before(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
    before: i64,
) -> std::result::Result<Option<(i64, Option<Value>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT seq, baseline FROM durable_history
          WHERE instance_id = $1 AND seq < $2 AND (baseline IS NOT NULL OR truncated)
          ORDER BY seq DESC LIMIT 1",
    )
    .bind(instance_id)
    .bind(before)
    .fetch_optional(db)
    .await
}

/// Whether the instance exists.
async fn instance_exists(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> std::result::Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM durable_instance WHERE id = $1)")
        .bind(instance_id)
        .fetch_one(db)
        .await
}

impl Engine {
    /// The history of an instance, oldest first: the entries with `seq > after`, at most
    /// `limit` (1 to [`HISTORY_PAGE_LIMIT`]), each with its actor and the state after it
    /// (reconstructed from the latest baseline before the page and the patches since,
    /// in one read transaction).
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::InvalidInput`] is not used
    /// (the limit is clamped), [`DurableError::Store`].
    pub async fn history(&self, instance_id: Uuid, after: i64, limit: i64) -> Result<HistoryPage> {
        let limit = limit.clamp(1, HISTORY_PAGE_LIMIT);
        let after = after.max(0);
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        if !instance_exists(&mut *tx, instance_id).await? {
            return Err(DurableError::InstanceNotFound(instance_id));
        }
        let mut rows = entries_between(&mut *tx, instance_id, after, i64::MAX, limit + 1).await?;
        let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
        rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        // The state before the page: from the latest anchor before it, patched forward.
        let mut state: Option<Value> = None;
        if let Some(first) = rows.first().map(|r| r.seq)
            && let Some((anchor, baseline)) = anchor_before(&mut *tx, instance_id, first).await?
        {
            state = baseline;
            let mut from = anchor;
            loop {
                let chunk = entries_between(&mut *tx, instance_id, from, first, 1000).await?;
                let Some(last) = chunk.last().map(|r| r.seq) else {
                    break;
                };
                for r in &chunk {
                    state = apply(state, r.patch.as_ref(), r.baseline.as_ref(), r.truncated);
                }
                from = last;
            }
        }
        tx.commit().await?;
        let mut entries = Vec::with_capacity(rows.len());
        for r in rows {
            state = apply(state, r.patch.as_ref(), r.baseline.as_ref(), r.truncated);
            entries.push(HistoryEntry {
                seq: r.seq,
                kind: r.kind,
                recorded_at: r.recorded_at,
                command_id: r.command_id,
                actor: Actor::from_columns(
                    &r.actor_kind,
                    r.actor_id,
                    r.actor_reason,
                    r.on_behalf_of,
                    &r.attribution_status,
                ),
                detail: r.detail,
                baseline: r.baseline.is_some(),
                patch: r.patch,
                truncated: r.truncated,
                state: state.clone(),
            });
        }
        let next_after = if more {
            entries.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(HistoryPage {
            entries,
            next_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HistoryConfig {
        HistoryConfig::default()
    }

    #[test]
    fn redaction_replaces_pointers_and_denylisted_members_at_any_depth() {
        let mut v = json!({"recipientRef": "alice", "a": [{"Password": "p", "x": 1}], "b": {"apiKey": "k"}});
        redact(&mut v, &["/recipientRef"], &cfg().denylist);
        assert_eq!(
            v,
            json!({"recipientRef": REDACTED, "a": [{"Password": REDACTED, "x": 1}], "b": {"apiKey": REDACTED}})
        );
    }

    #[test]
    fn patches_hold_only_add_remove_replace_and_keep_decimal_strings() {
        let before = json!({"status": "running", "progress": {"amount": "1.000000000000000001", "n": 1, "gone": true}});
        let after = json!({"status": "waiting", "progress": {"amount": "1.000000000000000002", "n": 1.0, "new": [1]}});
        let (d, logged) = delta(&cfg(), Some(&before), after.clone(), false);
        let Delta::Patch(p) = d else {
            panic!("expected a patch, got {d:?}")
        };
        for op in p.as_array().into_iter().flatten() {
            let o = op["op"].as_str().unwrap_or_default();
            assert!(["add", "remove", "replace"].contains(&o), "{op}");
            if o == "remove" {
                assert!(op.get("value").is_none(), "a remove carries no value: {op}");
            }
        }
        assert!(p.to_string().contains("\"1.000000000000000002\""), "{p}");
        // 1 becoming 1.0 is a change.
        assert!(p.to_string().contains("/progress/n"), "{p}");
        assert_eq!(logged, Some(after.clone()));
        assert_eq!(apply(Some(before), Some(&p), None, false), Some(after));
    }

    #[test]
    fn size_bounds_turn_big_patches_into_baselines_and_big_states_into_truncation() {
        let mut c = cfg();
        c.max_patch_bytes = 64;
        c.max_state_bytes = 256;
        let before = json!({"status": "running"});
        let big = json!({"status": "running", "progress": {"blob": "x".repeat(100)}});
        assert!(matches!(
            delta(&c, Some(&before), big.clone(), false).0,
            Delta::Baseline(_)
        ));
        let huge = json!({"status": "running", "progress": {"blob": "x".repeat(300)}});
        assert_eq!(
            delta(&c, Some(&before), huge, false),
            (Delta::Truncated, None)
        );
        assert_eq!(
            delta(&c, None, before.clone(), false).0,
            Delta::Baseline(before.clone())
        );
        assert_eq!(
            delta(&c, Some(&before), before.clone(), false).0,
            Delta::Unchanged
        );
    }

    /// Property: for random sequences of states, applying the logged deltas in order
    /// from the latest baseline reproduces every state (a deterministic xorshift
    /// generator, so a failure reproduces).
    #[test]
    fn replaying_deltas_reproduces_every_state() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut c = cfg();
        c.max_patch_bytes = 200;
        for _ in 0..200 {
            let mut logged: Option<Value> = None;
            let mut rebuilt: Option<Value> = None;
            for step in 0..20 {
                let mut m = Map::new();
                m.insert(
                    "status".into(),
                    json!(["running", "waiting", "completed"][(next() % 3) as usize]),
                );
                if next() % 2 == 0 {
                    let mut p = Map::new();
                    for k in 0..(next() % 6) {
                        let v = match next() % 4 {
                            0 => json!(next() % 10),
                            1 => json!(format!("{}.{}", next() % 100, next() % 1000)),
                            2 => json!((0..(next() % 4)).map(|i| i * 2).collect::<Vec<_>>()),
                            _ => json!("y".repeat((next() % 80) as usize)),
                        };
                        p.insert(format!("k{k}"), v);
                    }
                    m.insert("progress".into(), Value::Object(p));
                }
                let state = Value::Object(m);
                let (d, l) = delta(&c, logged.as_ref(), state.clone(), step == 0);
                let (patch, baseline) = match &d {
                    Delta::Unchanged => (Some(json!([])), None),
                    Delta::Patch(p) => (Some(p.clone()), None),
                    Delta::Baseline(b) => (None, Some(b.clone())),
                    Delta::Truncated => (None, None),
                };
                rebuilt = apply(
                    rebuilt,
                    patch.as_ref(),
                    baseline.as_ref(),
                    d == Delta::Truncated,
                );
                assert_eq!(rebuilt.as_ref(), Some(&state));
                logged = l;
            }
        }
    }
}
