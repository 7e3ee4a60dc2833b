//! Workflow health for Platform Status: what the persisted projection
//! (`durable_instance`, `durable_command`) says about stuck and dead work, read with
//! [`crate::Engine::workflow_health`]. Value-free: ids, workflow names, states and
//! times only — never an input, output, payload or error message.

use crate::error::Result;
use crate::status::RunStatus;
use crate::store;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

/// What [`crate::Engine::workflow_health`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthQuery {
    /// A `pending` instance older than this (since `created_at`) is listed as over the
    /// pending threshold: its START has not run (no runner serves its workflow, or the
    /// runners are saturated).
    pub pending_threshold: Duration,
    /// An open instance whose row has not changed for longer than this is listed as
    /// over the no-mutation threshold (alive in the database, making no progress).
    pub no_mutation_threshold: Duration,
    /// At most this many instances per list (and dead letters); at least 1.
    pub limit: u32,
}

impl Default for HealthQuery {
    fn default() -> Self {
        Self {
            pending_threshold: Duration::from_secs(60),
            no_mutation_threshold: Duration::from_secs(900),
            limit: 20,
        }
    }
}

/// How many instances of one workflow are in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    /// The workflow name (a registered, fixed set).
    pub workflow: String,
    /// The status.
    pub status: RunStatus,
    /// Instances.
    pub count: u64,
}

/// One instance as workflow health lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthInstance {
    /// The instance id (the operation id for the asset workflows).
    pub id: Uuid,
    /// Its workflow.
    pub workflow: String,
    /// The idempotency key it was started with (for the asset workflows: the
    /// operation id).
    pub idempotency_key: String,
    /// Its status.
    pub status: RunStatus,
    /// When it was started (database clock).
    pub created_at: DateTime<Utc>,
    /// When its row last changed (database clock).
    pub updated_at: DateTime<Utc>,
}

/// A dead-lettered command: the engine gave up claiming it after its attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The instance the command belongs to.
    pub instance_id: Uuid,
    /// Its workflow.
    pub workflow: String,
    /// The command kind (`start`, `signal`, `timer`, `retry`, `cancel`).
    pub kind: String,
    /// The value-free code of its last failed attempt.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: DateTime<Utc>,
}

/// Workflow health ([`crate::Engine::workflow_health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowHealth {
    /// Instances by workflow and status (all statuses; ended instances until retention
    /// purges them).
    pub counts: Vec<StateCount>,
    /// The oldest `running`, `waiting` and `suspended` instance of each workflow (one
    /// per (workflow, status) that has any).
    pub oldest: Vec<HealthInstance>,
    /// How many instances are over the pending threshold.
    pub over_pending: u64,
    /// The oldest of them, at most [`HealthQuery::limit`].
    pub over_pending_list: Vec<HealthInstance>,
    /// How many open instances are over the no-mutation threshold.
    pub over_no_mutation: u64,
    /// The least recently changed of them, at most [`HealthQuery::limit`].
    pub over_no_mutation_list: Vec<HealthInstance>,
    /// How many commands are dead-lettered.
    pub dead_letters: u64,
    /// The most recent of them, at most [`HealthQuery::limit`].
    pub dead_letter_list: Vec<DeadLetter>,
}

fn instance(r: store::HealthInstanceRow) -> Result<HealthInstance> {
    Ok(HealthInstance {
        id: r.id,
        status: r.status,
        workflow: r.workflow,
        idempotency_key: r.idempotency_key,
        created_at: r.created_at,
        updated_at: r.updated_at,
    })
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

pub(crate) async fn read(pool: &sqlx::PgPool, q: HealthQuery) -> Result<WorkflowHealth> {
    let limit = i64::from(q.limit.max(1));
    let counts = store::instances_state_counts(pool)
        .await?
        .into_iter()
        .map(|r| {
            Ok(StateCount {
                status: r.status,
                workflow: r.workflow,
                count: count(r.count),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let oldest = store::instances_oldest_open(pool)
        .await?
        .into_iter()
        .map(instance)
        .collect::<Result<Vec<_>>>()?;
    let (over_pending, pending) =
        store::instances_pending_over(pool, q.pending_threshold.as_secs_f64(), limit).await?;
    let (over_no_mutation, unchanged) =
        store::instances_unchanged_over(pool, q.no_mutation_threshold.as_secs_f64(), limit).await?;
    let (dead_letters, dead) = store::commands_dead(pool, limit).await?;
    Ok(WorkflowHealth {
        counts,
        oldest,
        over_pending: count(over_pending),
        over_pending_list: pending.into_iter().map(instance).collect::<Result<_>>()?,
        over_no_mutation: count(over_no_mutation),
        over_no_mutation_list: unchanged.into_iter().map(instance).collect::<Result<_>>()?,
        dead_letters: count(dead_letters),
        dead_letter_list: dead
            .into_iter()
            .map(|d| DeadLetter {
                instance_id: d.instance_id,
                workflow: d.workflow,
                kind: d.kind.as_str().to_owned(),
                last_error: d.last_error,
                dead_at: d.completed_at,
            })
            .collect(),
    })
}
