//! Workflow versioning: upgrades while instances are in flight (docs/versioning.md).
//!
//! - **Code version.** A [`crate::Workflow`] declares the version of its code
//!   ([`crate::Workflow::VERSION`], default 1) and the oldest version it can still
//!   replay ([`crate::Workflow::MIN_VERSION`], default 1). An instance is pinned to the
//!   version it started with (`durable_instance.version`, migration 0058): the typed
//!   [`crate::Engine::start`] records `W::VERSION`; a start by name records the
//!   registered version, or nothing when this engine does not run the workflow, and the
//!   first runner that claims the START pins it to the top of its range.
//! - **Claim by version.** An executor claims only commands of instances pinned to a
//!   version in its range (`durable_claim_versions`): in a mixed fleet during a rolling
//!   deploy an old runner never runs an instance a new release started, and a new runner
//!   runs the old instances only while its code still covers their version. A command
//!   that no runner can run is never claimed, so it is **deferred**, never failed: it
//!   waits, with no attempt spent, for a runner that knows the version.
//! - **Visibility.** Each executor records the ranges it runs
//!   (`durable_runner_version`, a heartbeat every [`RUNNER_HEARTBEAT`]); an open
//!   instance whose version no executor seen within [`RUNNER_LIVENESS`] covers shows
//!   [`crate::InstanceStatus::awaiting_runner`], is listed by
//!   [`crate::Engine::version_waits`] ("waiting for a runner that knows version N") and
//!   counted by the gauge `keel_durable_instances_awaiting_runner{workflow}`
//!   ([`VersionWaitGauge`]).
//! - **Gates.** [`crate::WorkflowContext::version`] (the Temporal `GetVersion` / DBOS
//!   patch pattern) lets new code branch on whether an instance recorded a changed step
//!   shape; the decision is journaled (kind `version`). An incompatible change without a
//!   gate fails the instance with `DETERMINISM_VIOLATION` whose detail is a
//!   [`DeterminismDetail`]: the position, the journaled and the reached step, the
//!   instance's version and the code's version.
//! - **Retirement.** Raising `MIN_VERSION` retires the versions below it;
//!   [`crate::Engine::check_versions`] refuses (typed: [`crate::DurableError::VersionPinned`])
//!   while a live instance is still pinned to a retired version.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::context::{Halt, WorkflowContext};
use crate::workflow::Interrupt;

/// How often an executor refreshes its row of `durable_runner_version`.
pub const RUNNER_HEARTBEAT: Duration = Duration::from_secs(10);

/// An executor whose row was refreshed within this window counts as live for
/// [`crate::Engine::version_waits`] and [`crate::InstanceStatus::awaiting_runner`].
/// Three heartbeats: a runner that stopped without deregistering (a crash) stops
/// counting after at most this long.
pub const RUNNER_LIVENESS: Duration = Duration::from_secs(30);

/// Rows of runners not seen for this long are deleted by the heartbeat of any runner.
const RUNNER_FORGET: Duration = Duration::from_secs(24 * 3600);

/// The value [`crate::WorkflowContext::version`] returns for an instance that passed the
/// gate's position before the gate existed (its journal holds another entry there): the
/// code path from before the change.
pub const DEFAULT_VERSION: u32 = 0;

/// The journal kind of a version-gate decision.
pub(crate) const KIND: &str = "version";

/// Where a replay left its journal (the halt behind a `DETERMINISM_VIOLATION`):
/// `(kind, name)` pairs.
#[derive(Debug, Clone)]
pub(crate) struct Divergence {
    pub(crate) position: usize,
    pub(crate) journaled: (String, String),
    pub(crate) reached: (String, String),
}

impl Divergence {
    /// The typed detail, with the instance's and the code's versions.
    pub(crate) fn detail(
        &self,
        instance_version: Option<u32>,
        code_version: u32,
    ) -> DeterminismDetail {
        DeterminismDetail {
            position: u32::try_from(self.position).unwrap_or(u32::MAX),
            journaled: StepRef {
                kind: self.journaled.0.clone(),
                name: self.journaled.1.clone(),
            },
            reached: StepRef {
                kind: self.reached.0.clone(),
                name: self.reached.1.clone(),
            },
            instance_version,
            code_version,
        }
    }
}

impl WorkflowContext {
    /// The version of its workflow this instance is pinned to: the
    /// [`crate::Workflow::VERSION`] of the code that started it (1 for instances started
    /// before versioning). Constant for the instance's life, so branching on it is
    /// deterministic; it is not journaled.
    pub fn workflow_version(&self) -> u32 {
        self.pinned_version
    }

    /// A patch gate (DBOS `patch` / Temporal `GetVersion` with the workflow's versions):
    /// true when this instance takes the code path that workflow version `since`
    /// introduced at this point. The decision is journaled (kind `version`, named
    /// `change_id`), so every replay, by any later release, takes the same path:
    ///
    /// - the journal records this gate here: its recorded decision;
    /// - the journal records something else here (the instance passed this point under
    ///   code that had no gate): false, and nothing is consumed;
    /// - the journal ends here (the body reaches the gate for the first time): true
    ///   exactly when the instance is pinned to `since` or later
    ///   ([`WorkflowContext::workflow_version`]), recorded. An instance started by older
    ///   code keeps its old path to the end, also past gates it reaches only now.
    ///
    /// Code without the gate (an older release, or a later one that removed it) steps
    /// over the recorded decision on replay. `change_id` is 1 to 255 characters, unique
    /// within the body.
    pub async fn changed(&mut self, change_id: &str, since: u32) -> Result<bool, Interrupt> {
        let live = u32::from(self.pinned_version >= since);
        Ok(self.gate(change_id, 0, 1, live).await? == 1)
    }

    /// A version gate (Temporal's `GetVersion(changeId, min, max)`): which variant
    /// `min..=max` of the code at this point the instance runs; [`DEFAULT_VERSION`] (0)
    /// is the code from before the gate existed. Journaled like
    /// [`WorkflowContext::changed`]:
    ///
    /// - the journal records this gate here: its recorded variant;
    /// - the journal records something else here: [`DEFAULT_VERSION`] (not consumed);
    /// - the journal ends here: `max` when the instance is pinned to the code's current
    ///   [`crate::Workflow::VERSION`] (it was started by this code), otherwise `min` (an
    ///   instance started by older code keeps the oldest variant this code supports, so
    ///   runners of its own release replay it too); recorded.
    ///
    /// A variant outside `min..=max` (the code retired it) fails the instance with
    /// `VERSION_UNSUPPORTED` and a [`VersionGateDetail`]; retire a variant only when no
    /// live instance recorded it.
    pub async fn version(&mut self, change_id: &str, min: u32, max: u32) -> Result<u32, Interrupt> {
        let live = if self.pinned_version >= self.code_version {
            max
        } else {
            min
        };
        self.gate(change_id, min, max, live).await
    }

    async fn gate(
        &mut self,
        change_id: &str,
        min: u32,
        max: u32,
        live: u32,
    ) -> Result<u32, Interrupt> {
        self.check()?;
        self.check_name(change_id)?;
        let recorded = match self.journal.get(self.cursor) {
            Some(e) if e.kind == KIND && e.name == change_id => {
                let v = e.result.clone();
                self.cursor += 1;
                self.decode_ok::<u32>(v)?
            }
            Some(_) => DEFAULT_VERSION,
            None => {
                let v = self
                    .append(KIND, change_id, Some(serde_json::json!({ "ok": live })))
                    .await?;
                self.decode_ok::<u32>(v)?
            }
        };
        if min > max || !(min..=max).contains(&recorded) {
            let detail = VersionGateDetail {
                change_id: change_id.to_owned(),
                recorded,
                min,
                max,
            };
            return Err(self.halt(Halt::VersionUnsupported(Box::new(detail))));
        }
        Ok(recorded)
    }
}

/// The versions of one workflow that a runner can run: `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRange {
    /// The oldest version the code still replays ([`crate::Workflow::MIN_VERSION`]).
    pub min: u32,
    /// The version of the code, recorded on the instances it starts
    /// ([`crate::Workflow::VERSION`]).
    pub max: u32,
}

impl VersionRange {
    /// Whether `version` is in the range.
    pub fn contains(self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }
}

/// What an executor claims: the registered workflows and, per workflow, its version
/// range (parallel vectors, the arguments of `durable_claim_versions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ClaimSet {
    pub(crate) names: Vec<String>,
    pub(crate) min: Vec<i32>,
    pub(crate) max: Vec<i32>,
}

impl ClaimSet {
    pub(crate) fn new(ranges: &HashMap<&'static str, VersionRange>) -> Self {
        let mut entries: Vec<(&str, VersionRange)> = ranges.iter().map(|(k, v)| (*k, *v)).collect();
        entries.sort_by_key(|(name, _)| *name);
        let mut set = Self::default();
        for (name, r) in entries {
            set.names.push(name.to_owned());
            set.min.push(i32::try_from(r.min).unwrap_or(i32::MAX));
            set.max.push(i32::try_from(r.max).unwrap_or(i32::MAX));
        }
        set
    }
}

/// The detail (`error.detail`) of a `DETERMINISM_VIOLATION`: where the body left its
/// journal. Names code identifiers (step kinds and names, versions), never a step's
/// result or an input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeterminismDetail {
    /// The journal position (0-based) where the body and the journal differ.
    pub position: u32,
    /// What the journal records there: `kind` (`step`, `wait`, `sleep`, `version`, ...)
    /// and `name`.
    pub journaled: StepRef,
    /// What the body asked for there (for a child started with another input: the
    /// same kind and name as `journaled`).
    pub reached: StepRef,
    /// The version the instance is pinned to (the code version it started with).
    pub instance_version: Option<u32>,
    /// The version of the code that replayed it ([`crate::Workflow::VERSION`]).
    pub code_version: u32,
}

/// A journal entry's kind and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRef {
    /// `step`, `now`, `uuid`, `random`, `sleep`, `wait`, `signal`, `child`, `version`.
    pub kind: String,
    /// The step, signal, child key or change id (empty for `now`, `uuid`, ...).
    pub name: String,
}

/// The detail (`error.detail`) of a `VERSION_UNSUPPORTED` failure: a
/// [`crate::WorkflowContext::version`] gate whose recorded decision the code no longer
/// supports (it was retired from the gate's `min..=max`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionGateDetail {
    /// The gate's change id.
    pub change_id: String,
    /// The decision the instance recorded ([`DEFAULT_VERSION`] when it passed the
    /// position before the gate existed).
    pub recorded: u32,
    /// The oldest decision the code supports.
    pub min: u32,
    /// The newest decision (what new instances record).
    pub max: u32,
}

/// Open instances of one workflow version that no live runner can run
/// ([`crate::Engine::version_waits`]): "waiting for a runner that knows version N".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionWait {
    /// The workflow.
    pub workflow: String,
    /// The version they are pinned to; `None`: not pinned yet (no live runner runs the
    /// workflow at all).
    pub version: Option<u32>,
    /// How many open instances (instances).
    pub instances: u64,
    /// When the oldest of them was started (database clock).
    pub oldest_created_at: DateTime<Utc>,
}

/// Live instances pinned to a version below a workflow's `MIN_VERSION` (a retired
/// version), as [`crate::DurableError::VersionPinned`] reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedVersion {
    /// The workflow.
    pub workflow: String,
    /// The retired version still pinned.
    pub version: u32,
    /// Instances not `completed` or `cancelled` pinned to it (a `failed` one counts: a
    /// retry would replay it).
    pub instances: u64,
}

// ---------------------------------------------------------------------------------
// SQL: durable_runner_version and the version reads of durable_instance (0058).
// ---------------------------------------------------------------------------------

/// Records (or refreshes) the ranges `runner` runs, and forgets runners not seen for a
/// day.
pub(crate) async fn runner_heartbeat(
    pool: &PgPool,
    runner: Uuid,
    set: &ClaimSet,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH up AS (
            INSERT INTO durable_runner_version (runner_id, workflow, min_version, max_version)
            SELECT $1, w, lo, hi FROM unnest($2::text[], $3::int4[], $4::int4[]) AS t(w, lo, hi)
            ON CONFLICT (runner_id, workflow) DO UPDATE
               SET min_version = EXCLUDED.min_version, max_version = EXCLUDED.max_version,
                   seen_at = now()
         )
         DELETE FROM durable_runner_version
          WHERE seen_at < now() - make_interval(secs => $5)",
    )
    .bind(runner)
    .bind(&set.names)
    .bind(&set.min)
    .bind(&set.max)
    .bind(RUNNER_FORGET.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes `runner`'s rows (a clean shutdown).
pub(crate) async fn runner_deregister(pool: &PgPool, runner: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM durable_runner_version WHERE runner_id = $1")
        .bind(runner)
        .execute(pool)
        .await?;
    Ok(())
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct VersionWaitRow {
    pub(crate) workflow: String,
    pub(crate) version: Option<i32>,
    pub(crate) instances: i64,
    pub(crate) oldest_created_at: DateTime<Utc>,
}

/// Open instances by workflow and version that no runner seen within
/// [`RUNNER_LIVENESS`] covers.
pub(crate) async fn instances_awaiting_runner(
    db: impl PgExecutor<'_>,
) -> Result<Vec<VersionWaitRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT i.workflow, i.version, count(*) AS instances, min(i.created_at) AS oldest_created_at
           FROM durable_instance i
          WHERE i.ended_at IS NULL
            AND NOT EXISTS (
                SELECT 1 FROM durable_runner_version r
                 WHERE r.workflow = i.workflow AND r.seen_at > now() - make_interval(secs => $1)
                   AND (i.version IS NULL OR i.version BETWEEN r.min_version AND r.max_version))
          GROUP BY i.workflow, i.version
          ORDER BY i.workflow, i.version",
    )
    .bind(RUNNER_LIVENESS.as_secs_f64())
    .fetch_all(db)
    .await
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PinnedRow {
    pub(crate) workflow: String,
    pub(crate) version: i32,
    pub(crate) instances: i64,
}

/// Instances not `completed` or `cancelled` of `workflows[k]` pinned below `min[k]`.
pub(crate) async fn instances_pinned_below(
    db: impl PgExecutor<'_>,
    set: &ClaimSet,
) -> Result<Vec<PinnedRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT i.workflow, i.version, count(*) AS instances
           FROM unnest($1::text[], $2::int4[]) AS w(name, lo)
           JOIN durable_instance i ON i.workflow = w.name AND i.version < w.lo
          WHERE i.status NOT IN ('completed', 'cancelled')
          GROUP BY i.workflow, i.version
          ORDER BY i.workflow, i.version",
    )
    .bind(&set.names)
    .bind(&set.min)
    .fetch_all(db)
    .await
}

/// Exports [`crate::Engine::version_waits`] as the gauge
/// `keel_durable_instances_awaiting_runner{workflow}` (open instances that no live
/// runner can run, all versions summed: the label set stays the registered workflow
/// names). A workflow reported before and absent now reads 0.
#[derive(Debug, Default)]
pub struct VersionWaitGauge {
    reported: std::collections::BTreeSet<String>,
}

impl VersionWaitGauge {
    /// A gauge that reports 0 for each of `workflows` until a wait appears.
    pub fn new<'a>(workflows: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            reported: workflows.into_iter().map(str::to_owned).collect(),
        }
    }

    /// Sets the gauge from one report.
    pub fn export(&mut self, waits: &[VersionWait]) {
        let mut sums: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for w in waits {
            *sums.entry(w.workflow.clone()).or_default() += w.instances;
        }
        for workflow in self.reported.iter() {
            if !sums.contains_key(workflow) {
                metrics::gauge!("keel_durable_instances_awaiting_runner", "workflow" => workflow.clone())
                    .set(0.0);
            }
        }
        for (workflow, n) in sums {
            metrics::gauge!("keel_durable_instances_awaiting_runner", "workflow" => workflow.clone())
                .set(n as f64);
            self.reported.insert(workflow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_projection_uses_the_runner_liveness_window() {
        // `store::status_select!` spells the window as a literal interval.
        assert_eq!(RUNNER_LIVENESS, Duration::from_secs(30));
    }

    #[test]
    fn a_claim_set_is_sorted_by_name_with_parallel_ranges() {
        let ranges = HashMap::from([
            ("b.flow", VersionRange { min: 2, max: 3 }),
            ("a.flow", VersionRange { min: 1, max: 1 }),
        ]);
        let set = ClaimSet::new(&ranges);
        assert_eq!(set.names, ["a.flow", "b.flow"]);
        assert_eq!((set.min, set.max), (vec![1, 2], vec![1, 3]));
        assert!(VersionRange { min: 2, max: 3 }.contains(3));
        assert!(!VersionRange { min: 2, max: 3 }.contains(1));
    }
}
