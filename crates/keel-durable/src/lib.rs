//! # keel-durable
//!
//! Keel's durable workflow engine on PostgreSQL: **code-first workflows with a
//! journal**, executed through **recorded commands**.
//!
//! - A [`Workflow`] is a type with a stable name, serde `Input`/`Output`/`Error` and an
//!   async body that receives a [`WorkflowContext`].
//! - [`WorkflowContext::step`] journals a step's result — success value **or typed
//!   error** — before the body continues; on replay the journaled result is returned
//!   without running the step. A different step at a journal position is a
//!   determinism violation: the instance fails with `DETERMINISM_VIOLATION`. Steps are
//!   at-least-once: a step interrupted before its result committed runs again.
//!   Transient step failures ([`StepError::Transient`]) are retried inside the step with
//!   capped backoff; when the attempts are exhausted nothing is journaled and the
//!   instance is `suspended`, with a recovery RETRY scheduled with capped exponential
//!   backoff.
//! - [`WorkflowContext::sleep`] / [`WorkflowContext::sleep_until`] are durable timers on
//!   the database clock; [`WorkflowContext::wait_signal`] waits for a signal with an
//!   optional [`Deadline`]; [`WorkflowContext::now`], [`WorkflowContext::uuid`] and
//!   [`WorkflowContext::random`] are journaled; [`WorkflowContext::set_progress`] feeds
//!   the status projection.
//! - Child workflows: [`WorkflowContext::start_child`] (journaled, keyed under the
//!   parent) and [`WorkflowContext::await_child`] (a wait on the signal the child's end
//!   records).
//! - [`Engine`]: idempotent [`Engine::start`] (by workflow and idempotency key, with an
//!   optional serialization key), [`Engine::signal`], [`Engine::cancel`],
//!   [`Engine::retry`], [`Engine::status`], the probe [`Engine::await_idle`], the
//!   retention hook [`Engine::purge`], and [`Engine::spawn_executor`].
//! - Typed reads and writes for other crates, so that none reads the engine's tables:
//!   [`Engine::statuses`] (many status projections in one statement),
//!   [`Engine::input`] (an instance's start input), [`Engine::signal_in`] (a signal
//!   recorded inside the caller's transaction, refusals returned without aborting it),
//!   and [`Engine::await_terminal`] (wakes on a notification when an instance becomes
//!   `completed`, `failed` or `cancelled`; one shared `LISTEN` connection per engine).
//!   The SQL of the API surface is in the `store` module, by table.
//! - [`hook`]: the transition hook ([`Engine::set_transition_hook`]), run inside every
//!   transaction that writes an instance's status (the outbox of keel-webhooks).
//! - [`actor`] attribution: every recorded command and signal carries the [`Actor`] that
//!   recorded it (`USER`, `SERVICE`, `SYSTEM` with a reason, or `NONE`), passed by the
//!   recording caller from its authenticated context ([`StartOptions::actor`],
//!   [`Engine::signal_as`], [`Engine::signal_in_as`], [`Engine::cancel_as`],
//!   [`Engine::retry_as`]), never read from a payload; the engine's own TIMER, recovery
//!   RETRY and child commands are `SYSTEM`; [`Engine::attribution`] reads them back.
//! - [`history`], the decision log: append-only entries of every command received and
//!   every decision of a segment (steps, waits, signals, timers, completion, failure,
//!   cancel, retry), written in the transaction that makes the change, each with its
//!   actor and the state change as an RFC 6902 patch (or a baseline), redacted before
//!   writing; [`Engine::history`] reads them with the state at each entry.
//! - [`version`]: workflow versioning. A workflow declares [`Workflow::VERSION`] and
//!   [`Workflow::MIN_VERSION`]; an instance is pinned to the version it started with;
//!   executors claim only instances of versions they run (the others wait, deferred,
//!   for a runner that knows their version: [`InstanceStatus::awaiting_runner`],
//!   [`Engine::version_waits`]); [`WorkflowContext::changed`] and
//!   [`WorkflowContext::version`] are journaled patch gates; [`Engine::check_versions`]
//!   refuses a retired version that live instances still pin. See docs/versioning.md.
//! - [`Retention`]: the retention pass (batched, `SKIP LOCKED`, one short transaction per
//!   batch) that the cluster's daily cron runs; returns a [`RetentionReport`].
//!
//! ## Execution model
//!
//! Everything that changes an instance is a command in its queue (`durable_command`:
//! START, SIGNAL, TIMER, RETRY, CANCEL). An executor claims commands in one statement
//! (the `durable_claim` function: it walks the queue in (available_at, id) order and
//! locks each candidate with `FOR UPDATE SKIP LOCKED`, stopping after one per free
//! segment slot, so its cost does not grow with the backlog): the oldest available ones
//! whose instance holds no live lease and that no earlier runnable command of the same
//! instance precedes (so a batch never holds two commands of one instance); each
//! instance gets a new lease token and expiry (its execution lock) and each command
//! `attempt + 1`. The executor then runs one **segment** per command: it replays the
//! body from the start against the journal (not read for a START on its first attempt:
//! nothing can have been journaled yet) until the body completes, fails, or blocks on a
//! wait, and ends it with its **segment settle**: the command and the instance's status
//! in one fenced statement.
//! Every journal write checks the lease token in the statement that makes it
//! (`WHERE id = .. AND lease_token = ..`, with the instance row share-locked, or updated
//! to renew the lease when a third of it has passed since the last renewal): no match
//! means another executor owns the instance, the write is not made and the segment is
//! abandoned. A task renews the lease while a long step runs. A crashed executor's
//! lease lapses; its running command is queued again at its position by the rescuer
//! (a `keel-service` maintenance service beside each executor, `durable-rescuer`: run at
//! least once per poll interval, and at once when its executor's claim comes back empty
//! after a lease has lapsed) and claimed again; a command whose attempts exceed `commandMaxAttempts` is
//! dead-lettered (`state = 'dead'`, listed by the probe), and its instance, unless it
//! had ended or failed, is failed with `ATTEMPTS_EXHAUSTED` (retryable) in the same
//! statement, so that no instance is ever left without a command that would run it (a
//! retry resumes it from its journal; migration 0069). A segment released because the
//! database failed transiently (`DATABASE_UNAVAILABLE`, `JOURNAL_READ_FAILED`) gets
//! its claim's attempt back: only crashes, panics and non-transient failures spend
//! attempts.
//!
//! **Group commit.** Within one process, the journal writes of all running segments,
//! their segment settles (one statement for one row or many; a suspension's recovery
//! RETRY and a timed wait's TIMER are follow-up inserts of the same statement), and
//! concurrent [`Engine::start`] calls are each combined into multi-row statements (leader/follower: while one statement is in flight the
//! next rows queue, and go as one statement when it returns). Each row keeps its own
//! fence (a row whose token no longer matches is refused and its segment stops, exactly
//! as alone), and each caller waits for the commit of the statement holding its row:
//! a step's result is durable before the body continues. A batch that the server
//! rejects is retried row by row, so one failing row never fails another. While an
//! executor's queue is backlogged (its last claim got every command it asked for), a
//! segment settle that frees a segment slot also claims the slot's next command in the
//! same transaction (settle-and-claim-next); once a claim comes back short, the executor
//! claims again on a notification (or its timers) rather than after every segment.
//!
//! Executors wake on `LISTEN keel_durable` (a trigger notifies on every recorded command;
//! a segment settle notifies when its release may make a command claimable for another
//! executor: the instance has queued commands, open signals, a cancel request or a
//! serialization key), on a timer for the earliest future command or lease expiry
//! (database clock), and on a poll interval. A dropped LISTEN connection is
//! re-established and followed by a claim pass.
//!
//! ## Run states
//!
//! `pending` → `running` → `waiting` / `suspended` → … → `completed` | `failed` |
//! `cancelled`. `completed` and `cancelled` are **ended**: signals, cancel and retry are
//! refused with [`DurableError::InstanceEnded`]. `failed` can be retried (the body
//! replays against its journal) or cancelled.
//!
//! ## Terminal-state notification
//!
//! [`Engine::await_terminal`] marks the instance it waits for (`terminal_watched`,
//! migration 0021); a trigger then sends `pg_notify('keel_durable_terminal', <id>)`
//! ([`TERMINAL_CHANNEL`]) at the commit that makes a marked instance `completed`,
//! `failed` or `cancelled`, whichever path did it. Unmarked instances send nothing:
//! PostgreSQL serializes the commits of notifying transactions, and every segment settle
//! that ends an instance would otherwise join that line.
//!
//! ## Serialization keys
//!
//! Instances sharing a serialization key start one at a time, in start order. An
//! instance **holds** its key while it is `pending`, `running`, `suspended` (a
//! suspension interrupted a step that its recovery replays, and may write) or waiting on
//! a durable timer (`ctx.sleep`, a pause the body chose); it releases it when it ends
//! (`completed`, `failed`, `cancelled`) and while it waits for a **signal** (an approval,
//! a transaction verdict, funding: the outside world). So a business failure, or a wait
//! for a human, never blocks the instances behind it. A retried
//! `failed` instance is `pending` again and holds the key until its RETRY runs.
//! [`InstanceStatus::queued_behind`] names the instance a blocked `pending` one waits
//! behind (migration 0016).
//!
//! An instance **no runner can run yet** does not hold its key (migrations 0068, 0069):
//! a `pending` instance whose START was never claimed (its body never ran, so it wrote
//! and sent nothing) and that is deferred by its version (runners of its workflow are
//! live, none of them, nor the claiming executor, covers its pinned version: a newer
//! release's instance during a rollback) is skipped, and the instances after it that a
//! runner can run start in their order. With no live runner of the workflow at all,
//! nothing is skipped. It keeps its place in start order: once a runner that
//! knows its version is live it holds the key again and starts before every instance of
//! its key that has not started yet. An instance that already ran a segment keeps its
//! key even when no live runner can run it (it may be part-way through its writes).
//!
//! ## Waking suspended instances
//!
//! A step that fails with [`StepError::Unavailable`] (a transient failure whose end a
//! known event announces, named by a **wake tag** such as `chain:31337`) suspends its
//! instance like any transient failure, with the tag recorded (migration 0068);
//! [`Engine::wake_suspended`] gives every instance suspended with that tag a RETRY due
//! now (recorded `SYSTEM` with the caller's reason) in place of its recovery RETRY, so
//! the work resumes as soon as the event happens rather than at its recovery backoff.
//!
//! ## What each command does when its instance has ended or failed
//!
//! | command | instance `completed` | instance `cancelled` | instance `failed` |
//! |---|---|---|---|
//! | START  | settled `stale` | settled `cancelled` | settled `stale` |
//! | SIGNAL | settled `rejected` (the signal stays unconsumed) | settled `cancelled` | settled `parked`: the signal is kept and consumed after a retry |
//! | TIMER  | settled `stale` | settled `cancelled` | settled `stale` (a retry that blocks at the wait records a new timer for the journaled deadline) |
//! | RETRY  | settled `stale` | settled `cancelled` | settled `stale`: [`Engine::retry`] sets the instance `pending` before it records the RETRY, which then runs a segment |
//! | CANCEL | settled `stale` | settled `cancelled` | cancels the instance |
//!
//! When a segment ends an instance, its other queued commands are settled in the same
//! statement with outcome `instance_completed` / `instance_cancelled` /
//! `instance_failed` (for `failed`, CANCEL and RETRY commands are kept). A cancel of an
//! instance with no running segment settles its open commands `cancelled` at once.
//!
//! ## Wait rules
//!
//! A signal recorded before the body reaches `wait_signal` is kept and consumed there,
//! in recording order. With a deadline, the earliest unconsumed signal of that name
//! recorded no later than the deadline wins even when the executor runs late; when
//! none exists and the database clock has passed the deadline, `Expired` is journaled.
//! `recorded_at` is read under the instance's row lock, so a wait that decided
//! `Expired` never meets an earlier-recorded signal afterwards.
//!
//! ## Bounds
//!
//! Start inputs and signal payloads: at most `maxPayloadBytes` (default 262,144, minimum
//! 1,024) and 64 levels; names and keys 1 to 255 characters; checked before any lock or
//! write by the non-recursive validators of [`payload`]. Errors name the bound, never
//! the value.
//!
//! ## Performance
//!
//! `scripts/bench-durable` runs N workflows (3 journaled no-op steps and a zero sleep)
//! with 1 and 2 executor processes and the same workload on DBOS Transact for Rust;
//! figures and what bounds them are in `benches/README.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod actor;
mod batch;
#[cfg(test)]
mod batch_tests;
mod config;
mod context;
mod engine;
mod error;
mod executor;
mod health;
pub mod history;
pub mod hook;
pub mod metrics;
pub mod payload;
mod retention;
mod status;
mod store;
mod stored;
mod terminal;
pub mod version;
mod workflow;

pub use actor::{
    Actor, ActorKind, Attribution, AttributionStatus, MAX_ACTOR_CHARS, RecordedCommand,
    RecordedSignal, UNPRINTABLE, sanitize as sanitize_actor_text,
};
pub use config::{Backoff, EngineConfig, ExecutorConfig};
pub use context::{Deadline, WorkflowContext};
pub use engine::{
    ATTRIBUTION_LIMIT, CancelOutcome, Engine, PurgeCounts, SignalReceipt, StartOptions, Started,
};
pub use error::{DurableError, Result};
pub use executor::{CHANNEL, ExecutorHandle};
pub use health::{DeadLetter, HealthInstance, HealthQuery, StateCount, WorkflowHealth};
pub use history::{HISTORY_PAGE_LIMIT, HistoryConfig, HistoryEntry, HistoryPage};
pub use hook::{HookFuture, Transition, TransitionHook, TransitionHookError};
pub use metrics::OpenCensusGauge;
pub use retention::{Retention, RetentionConfig, RetentionReport};
pub use status::{
    CommandKind, CommandState, CommandSummary, ErrorInfo, IdleReport, InstanceStatus, OpenCount,
    RunStatus, WaitDescription, WaitKind,
};
pub use stored::UnknownStoredValue;
pub use terminal::TERMINAL_CHANNEL;
pub use version::{
    DEFAULT_VERSION, DeterminismDetail, PinnedVersion, StepRef, VersionGateDetail, VersionRange,
    VersionWait, VersionWaitGauge,
};
pub use workflow::{
    ChildHandle, ChildOutcome, Interrupt, SignalOutcome, StepError, Workflow, WorkflowFailure,
};

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_histogram!(
        "keel_durable_claim_latency_seconds",
        ::metrics::Unit::Seconds,
        "Time from a durable command's available_at to its claim (seconds)."
    );
    ::metrics::describe_counter!(
        "keel_durable_commands_settled_total",
        ::metrics::Unit::Count,
        "Durable commands settled (count)."
    );
    ::metrics::describe_counter!(
        "keel_durable_undecodable_values_total",
        ::metrics::Unit::Count,
        "Stored values of a closed set (instance status, command kind or state) this build does not know, by column; their rows were refused (count)."
    );
    ::metrics::describe_counter!(
        "keel_durable_dead_letters_total",
        ::metrics::Unit::Count,
        "Durable commands moved to the dead-letter state (count)."
    );
    ::metrics::describe_gauge!(
        "keel_durable_queue_depth",
        ::metrics::Unit::Count,
        "Queued durable commands, sampled when an executor goes idle (commands)."
    );
    ::metrics::describe_gauge!(
        "keel_durable_open_instances",
        ::metrics::Unit::Count,
        "Workflow instances not yet ended, by workflow and status (pending, running, waiting, suspended), from the database census (instances)."
    );
    ::metrics::describe_gauge!(
        "keel_durable_instances_awaiting_runner",
        ::metrics::Unit::Count,
        "Open workflow instances whose version no live runner can run, by workflow; their commands wait for a runner that knows the version (instances)."
    );
    ::metrics::describe_counter!(
        "keel_durable_retention_batches_total",
        ::metrics::Unit::Count,
        "Retention delete batches run (count)."
    );
    ::metrics::describe_counter!(
        "keel_durable_retention_deleted_rows_total",
        ::metrics::Unit::Count,
        "Rows deleted by retention (rows)."
    );
    ::metrics::describe_counter!(
        "keel_durable_retention_failures_total",
        ::metrics::Unit::Count,
        "Retention passes that failed (count)."
    );
    ::metrics::describe_histogram!(
        "keel_durable_retention_pass_duration_seconds",
        ::metrics::Unit::Seconds,
        "Duration of one retention pass (seconds)."
    );
    ::metrics::describe_gauge!(
        "keel_durable_retention_remaining_eligible_rows",
        ::metrics::Unit::Count,
        "Rows past retention still to delete (rows)."
    );
    ::metrics::describe_counter!(
        "keel_durable_runner_heartbeat_failures_total",
        ::metrics::Unit::Count,
        "Failed refreshes of an executor's runner version record (durable_runner_version); retried with backoff (count)."
    );
    ::metrics::describe_histogram!(
        "keel_durable_segment_duration_seconds",
        ::metrics::Unit::Seconds,
        "Duration of one workflow segment, claim to settle (seconds)."
    );
    ::metrics::describe_counter!(
        "keel_durable_steps_total",
        ::metrics::Unit::Count,
        "Durable workflow steps executed (count)."
    );
    ::metrics::describe_counter!(
        "keel_durable_transition_hook_failures_total",
        ::metrics::Unit::Count,
        "Transition hook calls that failed, by kind (database, other); their transactions rolled back (count)."
    );
}
