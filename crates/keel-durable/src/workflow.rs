//! The programming model: [`Workflow`], its failure type, step errors, signal outcomes,
//! and the type-erased registry the executor runs from.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::WorkflowContext;

/// A durable workflow: a type with a stable name and an async body.
///
/// The body must be deterministic given its input and the values the context returns:
/// every external effect or non-deterministic read goes through a context call
/// ([`WorkflowContext::step`], [`WorkflowContext::now`], ...), whose result is journaled
/// and returned unchanged on replay.
///
/// ```
/// use keel_durable::{StepError, Workflow, WorkflowContext, WorkflowFailure};
///
/// struct Greet;
///
/// impl Workflow for Greet {
///     const NAME: &'static str = "demo.greet";
///     type Input = String;
///     type Output = String;
///     type Error = String;
///
///     async fn run(
///         &self,
///         ctx: &mut WorkflowContext,
///         name: String,
///     ) -> Result<String, WorkflowFailure<String>> {
///         // The outer `?` propagates interruptions; the inner result is the step's
///         // journaled outcome (here turned into the workflow's failure).
///         let greeting = ctx
///             .step("greet", || {
///                 let name = name.clone();
///                 async move { Ok::<_, StepError<String>>(format!("hello {name}")) }
///             })
///             .await?
///             .map_err(WorkflowFailure::Failed)?;
///         ctx.sleep(std::time::Duration::from_secs(60)).await?;
///         Ok(greeting)
///     }
/// }
/// ```
pub trait Workflow: Send + Sync + 'static {
    /// Stable name, e.g. `asset.create` (1 to 255 characters). Renaming it orphans
    /// existing instances.
    const NAME: &'static str;
    /// The version of this code (at least 1; default 1), recorded on the instances it
    /// starts: raise it when the body changes the steps it journals, and branch on
    /// [`WorkflowContext::version`] or [`WorkflowContext::workflow_version`] so that
    /// instances started by older code keep their recorded path (docs/versioning.md).
    const VERSION: u32 = 1;
    /// The oldest version this code can still replay (at least 1, at most
    /// [`Workflow::VERSION`]; default 1). An executor claims only instances pinned to
    /// `MIN_VERSION..=VERSION`; raising it retires the versions below, which
    /// [`crate::Engine::check_versions`] refuses while a live instance is pinned to one.
    const MIN_VERSION: u32 = 1;
    /// The start input (stored as JSON with the instance).
    type Input: Serialize + DeserializeOwned + Send + 'static;
    /// The result of a completed instance (stored as JSON).
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// The typed failure of a failed instance (stored as JSON, `error.detail`).
    type Error: Serialize + DeserializeOwned + Send + 'static;
    /// JSON pointers (RFC 6901) whose values the operation history never holds (a
    /// recipient's personal reference, ...): redacted to `"[redacted]"` in the start
    /// input copy, the progress, the output and the error detail before anything is
    /// logged (see [`crate::history`]). Default: none.
    const HISTORY_REDACT: &'static [&'static str] = &[];

    /// The body. Propagate context interruptions with `?` (they convert into
    /// [`WorkflowFailure::Interrupted`]); return [`WorkflowFailure::Failed`] to fail the
    /// instance with the typed error.
    fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: Self::Input,
    ) -> impl Future<Output = Result<Self::Output, WorkflowFailure<Self::Error>>> + Send;
}

/// Why a workflow body did not return an output.
#[derive(Debug)]
pub enum WorkflowFailure<E> {
    /// The workflow decided to fail with its typed error: the instance becomes `failed`
    /// with code `WORKFLOW_FAILED` and the error as `detail`.
    Failed(E),
    /// A context call interrupted the body (it blocks on a wait, was fenced out,
    /// cancelled, suspended, or detected a determinism violation). The engine knows
    /// why; the body only has to return it.
    Interrupted(Interrupt),
}

impl<E> From<Interrupt> for WorkflowFailure<E> {
    fn from(i: Interrupt) -> Self {
        Self::Interrupted(i)
    }
}

/// An opaque marker: the segment must stop here. The engine records the reason in the
/// context; a body that swallows it still stops at its next context call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupt(pub(crate) ());

impl std::fmt::Display for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("workflow segment interrupted")
    }
}

impl std::error::Error for Interrupt {}

/// The error of one attempt of a step body.
#[derive(Debug)]
pub enum StepError<E> {
    /// A definite, typed failure: journaled as the step's result (`{"err": ...}`) and
    /// returned as `Err(E)` now and on every replay.
    Failed(E),
    /// A transient failure ("unable to determine"): retried inside the step with capped
    /// backoff; nothing is journaled. When the attempts are exhausted the instance is
    /// `suspended` and recovered later with capped exponential backoff. `code` is a
    /// value-free reason code (stored as the instance's error code while suspended).
    Transient {
        /// Reason code, e.g. `RPC_UNAVAILABLE`.
        code: &'static str,
    },
    /// A transient failure whose end a known event announces (a chain becoming served,
    /// a resource coming back): retried and suspended exactly as
    /// [`StepError::Transient`], and the suspended instance carries `wake` as its wake
    /// tag, so that [`crate::Engine::wake_suspended`] with that tag resumes it at once
    /// when the event comes instead of at its next recovery backoff (which keeps
    /// running as a fallback).
    Unavailable {
        /// Reason code, e.g. `CHAIN_UNAVAILABLE`.
        code: &'static str,
        /// The wake tag (1 to 255 characters, value-free: e.g. `chain:31337`).
        wake: String,
    },
}

impl<E> StepError<E> {
    /// A transient failure with a reason code.
    pub fn transient(code: &'static str) -> Self {
        Self::Transient { code }
    }

    /// A transient failure that the event named by the wake tag `wake` ends (see
    /// [`StepError::Unavailable`]).
    pub fn unavailable(code: &'static str, wake: impl Into<String>) -> Self {
        Self::Unavailable {
            code,
            wake: wake.into(),
        }
    }
}

impl<E> From<E> for StepError<E> {
    fn from(e: E) -> Self {
        Self::Failed(e)
    }
}

/// The result of [`WorkflowContext::wait_signal`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalOutcome<T> {
    /// The earliest signal of that name recorded no later than the deadline.
    Received(T),
    /// The deadline passed (database clock) before any such signal was recorded.
    Expired,
}

/// The result of [`WorkflowContext::await_child`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildOutcome<O> {
    /// The child completed with this output.
    Completed(O),
    /// The child was cancelled.
    Cancelled,
    /// The deadline passed first (the child keeps running).
    Expired,
}

/// A child instance started by [`WorkflowContext::start_child`].
#[derive(Debug)]
pub struct ChildHandle<W> {
    pub(crate) instance_id: uuid::Uuid,
    pub(crate) _workflow: std::marker::PhantomData<fn() -> W>,
}

impl<W> Clone for ChildHandle<W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W> Copy for ChildHandle<W> {}

impl<W> ChildHandle<W> {
    /// The child's instance id.
    pub fn instance_id(&self) -> uuid::Uuid {
        self.instance_id
    }
}

/// What the erased body returned.
pub(crate) enum ErasedOutcome {
    Completed(Value),
    Failed(Value),
    Interrupted,
    /// The stored input does not decode into `W::Input`.
    InputIncompatible,
    /// Output or error did not encode.
    EncodeFailed,
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(crate) trait ErasedWorkflow: Send + Sync {
    fn run<'a>(
        &'a self,
        ctx: &'a mut WorkflowContext,
        input: Value,
    ) -> BoxFuture<'a, ErasedOutcome>;
}

struct Erased<W>(W);

impl<W: Workflow> ErasedWorkflow for Erased<W> {
    fn run<'a>(
        &'a self,
        ctx: &'a mut WorkflowContext,
        input: Value,
    ) -> BoxFuture<'a, ErasedOutcome> {
        Box::pin(async move {
            let Ok(input) = serde_json::from_value::<W::Input>(input) else {
                return ErasedOutcome::InputIncompatible;
            };
            match self.0.run(ctx, input).await {
                Ok(out) => match serde_json::to_value(out) {
                    Ok(v) => ErasedOutcome::Completed(v),
                    Err(_) => ErasedOutcome::EncodeFailed,
                },
                Err(WorkflowFailure::Failed(e)) => match serde_json::to_value(e) {
                    Ok(v) => ErasedOutcome::Failed(v),
                    Err(_) => ErasedOutcome::EncodeFailed,
                },
                Err(WorkflowFailure::Interrupted(_)) => ErasedOutcome::Interrupted,
            }
        })
    }
}

/// The workflows an engine's executors can run, by name, with their version ranges.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    pub(crate) by_name: HashMap<&'static str, Arc<dyn ErasedWorkflow>>,
    /// [`Workflow::HISTORY_REDACT`] of each registered workflow.
    pub(crate) redact: HashMap<&'static str, &'static [&'static str]>,
    pub(crate) versions: HashMap<&'static str, crate::version::VersionRange>,
}

impl Registry {
    pub(crate) fn insert<W: Workflow>(&mut self, w: W) {
        self.by_name.insert(W::NAME, Arc::new(Erased(w)));
        self.redact.insert(W::NAME, W::HISTORY_REDACT);
        // Out-of-range constants are clamped (1 <= min <= max) rather than refused: the
        // builder cannot fail.
        let max = W::VERSION.max(1);
        let min = W::MIN_VERSION.clamp(1, max);
        self.versions
            .insert(W::NAME, crate::version::VersionRange { min, max });
    }

    /// The version range of a registered workflow.
    pub(crate) fn range(&self, name: &str) -> Option<crate::version::VersionRange> {
        self.versions.get(name).copied()
    }

    /// What this registry's executors claim.
    pub(crate) fn claim_set(&self) -> crate::version::ClaimSet {
        crate::version::ClaimSet::new(&self.versions)
    }

    /// The history redaction pointers of a workflow (none when unregistered).
    pub(crate) fn history_redact(&self, name: &str) -> &'static [&'static str] {
        self.redact.get(name).copied().unwrap_or(&[])
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.by_name.keys().map(|s| (*s).to_owned()).collect()
    }
}
