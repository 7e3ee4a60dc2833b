//! Status vocabulary: run states, waits, failures, the status projection and the
//! probe's report.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// The run state of an instance (`durable_instance.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Started, its START command not yet run.
    Pending,
    /// A segment is (or was last) running.
    Running,
    /// Blocked on a signal or a timer; see [`InstanceStatus::wait`].
    Waiting,
    /// A step's transient retries were exhausted; a recovery RETRY is scheduled with
    /// capped exponential backoff.
    Suspended,
    /// Ended with an output.
    Completed,
    /// The body failed (typed error, determinism violation, incompatible journal). Can
    /// be retried (resumes from the journal) or cancelled.
    Failed,
    /// Ended by cancel.
    Cancelled,
}

crate::stored::stored_text!(RunStatus, "durable_instance.status");

impl RunStatus {
    /// Every status (`migrations/0002_durable.sql`'s CHECK), in lifecycle order.
    pub const ALL: [RunStatus; 7] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Suspended,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// The stored text.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Suspended => "suspended",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses the stored text; `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// `completed` or `cancelled`: nothing will change the instance any more (signals,
    /// cancel and retry are refused). `failed` is not ended: it can be retried or
    /// cancelled.
    pub fn is_ended(self) -> bool {
        matches!(self, Self::Completed | Self::Cancelled)
    }

    /// `completed`, `failed` or `cancelled`: the run has come to a result (these are the
    /// states with an [`InstanceStatus::ended_at`], and what
    /// [`crate::Engine::await_terminal`] waits for). Unlike [`RunStatus::is_ended`] it
    /// includes `failed`, which a retry can still resume.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a command (`durable_command.kind`, the CHECK of
/// `migrations/0002_durable.sql`): what it asks of its instance's next segment.
/// Stored, and serialized, as the snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CommandKind {
    /// Run the instance from its start (recorded with the instance).
    Start,
    /// A signal was recorded for it.
    Signal,
    /// A durable timer (a sleep, a wait's deadline) fired.
    Timer,
    /// Resume it: a retry of a failed instance, a suspension's recovery, a wake.
    Retry,
    /// Cancel it.
    Cancel,
}

crate::stored::stored_text!(CommandKind, "durable_command.kind");

impl CommandKind {
    /// Every kind.
    pub const ALL: [CommandKind; 5] = [
        CommandKind::Start,
        CommandKind::Signal,
        CommandKind::Timer,
        CommandKind::Retry,
        CommandKind::Cancel,
    ];

    /// The stored text: `start`, `signal`, `timer`, `retry`, `cancel`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Signal => "signal",
            Self::Timer => "timer",
            Self::Retry => "retry",
            Self::Cancel => "cancel",
        }
    }
}

impl std::fmt::Display for CommandKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a command is (`durable_command.state`, the CHECK of
/// `migrations/0002_durable.sql`). Stored, and serialized, as the snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CommandState {
    /// Waiting to be claimed (possibly not yet available).
    Queued,
    /// Claimed: a segment runs it under its instance's lease.
    Running,
    /// Settled (its outcome says how).
    Done,
    /// Dead-lettered: its attempts were spent.
    Dead,
}

crate::stored::stored_text!(CommandState, "durable_command.state");

impl CommandState {
    /// Every state.
    pub const ALL: [CommandState; 4] = [
        CommandState::Queued,
        CommandState::Running,
        CommandState::Done,
        CommandState::Dead,
    ];

    /// The stored text: `queued`, `running`, `done`, `dead`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Dead => "dead",
        }
    }
}

impl std::fmt::Display for CommandState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a waiting instance waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WaitKind {
    /// A signal (`name` is the signal name), possibly with a deadline.
    Signal,
    /// A durable timer (`ctx.sleep`); `deadline` is its fire time.
    Timer,
}

/// The wait description of a waiting instance (`durable_instance.wait`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitDescription {
    /// Signal or timer.
    pub kind: WaitKind,
    /// The signal name, for signal waits.
    pub name: Option<String>,
    /// Database-clock deadline, when there is one.
    pub deadline: Option<DateTime<Utc>>,
}

/// A failure as shown in the status projection. `message` is value-free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// Stable code: `WORKFLOW_FAILED`, `DETERMINISM_VIOLATION` (detail: a
    /// [`crate::DeterminismDetail`]), `VERSION_UNSUPPORTED` (detail: a
    /// [`crate::VersionGateDetail`]), `JOURNAL_INCOMPATIBLE`, `INPUT_INCOMPATIBLE`,
    /// `ENCODE_FAILED`, `INVALID_NAME`, or (while suspended) the step's transient reason
    /// code.
    pub code: String,
    /// Whether a retry can help.
    pub retryable: bool,
    /// Framework text naming no value.
    pub message: String,
    /// The workflow's typed error, for `WORKFLOW_FAILED`; the typed detail of a
    /// `DETERMINISM_VIOLATION` or `VERSION_UNSUPPORTED`.
    pub detail: Option<Value>,
}

/// One line of the open-instance census ([`crate::Engine::open_census`]): how many
/// instances of a workflow are in one open status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenCount {
    /// Workflow name.
    pub workflow: String,
    /// An open status: `Pending`, `Running`, `Waiting` or `Suspended`.
    pub status: RunStatus,
    /// Instances in that status (instances).
    pub count: u64,
}

/// The status projection of an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// Instance id.
    pub id: Uuid,
    /// Workflow name.
    pub workflow: String,
    /// Run state.
    pub status: RunStatus,
    /// Last progress snapshot (`ctx.set_progress`).
    pub progress: Option<Value>,
    /// What it waits for, while `waiting`.
    pub wait: Option<WaitDescription>,
    /// The output, when `completed`.
    pub output: Option<Value>,
    /// The failure, when `failed` (or the transient reason while `suspended`).
    pub error: Option<ErrorInfo>,
    /// Creation time (database clock).
    pub created_at: DateTime<Utc>,
    /// When the instance's row last changed (database clock): its status, wait,
    /// progress, signals or lease.
    pub updated_at: DateTime<Utc>,
    /// End time, when `completed`, `failed` or `cancelled`.
    pub ended_at: Option<DateTime<Utc>>,
    /// When a cancel was requested ([`crate::Engine::cancel`]), if one was.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// For a `pending` instance whose START cannot run yet: the instance that holds its
    /// serialization key (a `running`, `suspended` or timer-waiting one first, else the
    /// earliest `pending` one before it). `None` otherwise.
    pub queued_behind: Option<Uuid>,
    /// The version of its workflow the instance is pinned to (the
    /// [`crate::Workflow::VERSION`] of the code that started it; 1 for instances started
    /// before versioning); `None` until its first claim when it was started by name on
    /// a node that does not run the workflow. See [`crate::version`].
    pub version: Option<u32>,
    /// True while the instance is open (not `completed`, `failed` or `cancelled`) and no
    /// runner seen within [`crate::version::RUNNER_LIVENESS`] can run its version:
    /// "waiting for a runner that knows version N". Its commands are deferred, not
    /// failed; a runner whose code covers the version runs them.
    pub awaiting_runner: bool,
    /// [`InstanceStatus::awaiting_runner`] while a runner of its workflow **is** live
    /// (one that does not know its version: a release was rolled back, or is rolling
    /// out): the instance is deferred by its version, not by a missing runner.
    pub version_deferred: bool,
}

/// One command listed by the probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSummary {
    /// Command id.
    pub id: i64,
    /// Its instance.
    pub instance_id: Uuid,
    /// `start`, `signal`, `timer`, `retry` or `cancel`.
    pub kind: String,
    /// `queued`, `running` or `dead`.
    pub state: String,
    /// Attempts spent.
    pub attempt: i32,
    /// When it is (or was) available (database clock).
    pub available_at: DateTime<Utc>,
    /// Last failure code, if any.
    pub last_error: Option<String>,
}

/// The probe's view of the command queue ([`crate::Engine::await_idle`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleReport {
    /// Runnable commands left (queued and available, or running).
    pub runnable: i64,
    /// Queued commands not yet available (future timers, backoffs).
    pub deferred: Vec<CommandSummary>,
    /// Dead-lettered commands.
    pub dead: Vec<CommandSummary>,
    /// Runnable commands available for longer than `stuck_after`.
    pub stuck: Vec<CommandSummary>,
}

impl std::fmt::Display for IdleReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} runnable, {} deferred, {} dead, {} stuck",
            self.runnable,
            self.deferred.len(),
            self.dead.len(),
            self.stuck.len()
        )
    }
}
