//! The crate's error type.

use uuid::Uuid;

/// Errors of the durable engine. Messages are value-free: they name bounds, states,
/// codes and instance ids, never SQL text, payload values or secrets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    /// A database failure (classified by [`keel_store::StoreError`]).
    #[error(transparent)]
    Store(#[from] keel_store::StoreError),
    /// The segment's lease token no longer matches: another executor owns the instance.
    /// The write was rolled back and the segment abandoned.
    #[error("fenced out: the instance's execution lease belongs to another executor")]
    Fenced,
    /// `start` reused an idempotency key with a different input.
    #[error("idempotency key of workflow `{workflow}` was used with a different input")]
    IdempotencyConflict {
        /// The workflow name.
        workflow: String,
        /// The instance the key already names.
        instance_id: Uuid,
    },
    /// No instance with this id.
    #[error("instance {0} not found")]
    InstanceNotFound(Uuid),
    /// The instance has ended (`completed` or `cancelled`); signals, cancel and retry
    /// are refused.
    #[error("instance {instance_id} has ended ({status})")]
    InstanceEnded {
        /// The instance.
        instance_id: Uuid,
        /// Its terminal status.
        status: crate::RunStatus,
    },
    /// `retry` of an instance that is neither `failed` nor `suspended`.
    #[error(
        "instance {instance_id} is {status}: only failed or suspended instances can be retried"
    )]
    NotRetryable {
        /// The instance.
        instance_id: Uuid,
        /// Its status.
        status: crate::RunStatus,
    },
    /// The instance already holds the maximum number of unconsumed signals.
    #[error("instance {instance_id} holds the maximum of {limit} unconsumed signals")]
    SignalLimit {
        /// The instance.
        instance_id: Uuid,
        /// The configured limit (`maxOpenSignals`).
        limit: u32,
    },
    /// A payload, name or key is outside its bounds. Names the bound, never the value.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] crate::payload::BoundError),
    /// A value could not be encoded or decoded as JSON for the journal or an input.
    /// `what` names the place (e.g. `input`, `step result`), never the value.
    #[error("JSON encoding failed for {what}")]
    Json {
        /// Which value.
        what: &'static str,
    },
    /// The workflow is not registered with this engine.
    #[error("workflow `{0}` is not registered")]
    UnknownWorkflow(String),
    /// The configuration is invalid (names the key, never the value).
    #[error("invalid configuration `{key}`: {reason}")]
    Config {
        /// The configuration key.
        key: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// The transition hook ([`crate::TransitionHook`]) failed: the change was rolled
    /// back (a segment settle: its lease lapses and the segment runs again).
    #[error("the transition hook failed; the change was rolled back")]
    TransitionHook(#[source] crate::hook::TransitionHookError),
    /// [`crate::Engine::check_versions`]: the code retired versions (raised
    /// [`crate::Workflow::MIN_VERSION`]) that live instances are still pinned to. Names
    /// workflows, versions and counts only.
    #[error("retired workflow versions are still pinned by live instances: {}", pinned_list(.0))]
    VersionPinned(Vec<crate::PinnedVersion>),
    /// [`crate::Engine::await_idle`] timed out with runnable commands left.
    #[error("not idle: {0}")]
    NotIdle(Box<crate::IdleReport>),
}

fn pinned_list(pinned: &[crate::PinnedVersion]) -> String {
    pinned
        .iter()
        .map(|p| format!("{} v{} ({} instances)", p.workflow, p.version, p.instances))
        .collect::<Vec<_>>()
        .join(", ")
}

impl DurableError {
    /// True when retrying the same call later can succeed (transient database
    /// failures). Every other variant needs a different call or input.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Store(s) if s.is_retryable())
    }
}

impl From<sqlx::Error> for DurableError {
    fn from(err: sqlx::Error) -> Self {
        Self::Store(keel_store::StoreError::from(err))
    }
}

/// `Result` with [`DurableError`].
pub type Result<T, E = DurableError> = std::result::Result<T, E>;
