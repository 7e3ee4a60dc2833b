//! The transition hook: code of another crate that runs **inside the transaction that
//! changes an instance's status**, so what it writes (an outbox row: keel-webhooks'
//! events) commits with the change or not at all.
//!
//! Set one per engine with [`crate::Engine::set_transition_hook`]. It is called with
//! the instances whose status a transaction of the engine wrote:
//! - every segment settle (the batched plain settles, settle-and-claim-next, the
//!   suspension and timer settles): the status the segment ended in (`waiting`,
//!   `completed`, `failed`, `suspended`, `cancelled`, `pending`);
//! - [`crate::Engine::cancel`] of an instance no segment runs: `cancelled`;
//! - [`crate::Engine::retry`] of a failed instance: `pending`.
//!
//! The claim (`pending` → `running`) does not call it. The hook sees the new row
//! versions on the connection it is given (read the status with
//! [`crate::Engine::status_in`]). A hook error rolls the transaction back: a segment
//! settle then fails (its lease lapses and the segment runs again), an API call returns
//! the error. Keep it short: it runs under the instance's row lock.
//!
//! A failed hook call is counted in `keel_durable_transition_hook_failures_total{kind}`
//! (`kind`: `database` for a failed statement, `other`) and logged (WARN). When the
//! hook fails for a batch of segment settles, each settle of the batch is retried at
//! once in its own transaction (with the hook), so one instance whose hook call fails
//! does not hold back the others of its batch; only that instance's settle fails
//! ([`crate::DurableError::TransitionHook`]).

use crate::status::RunStatus;
use std::future::Future;
use std::pin::Pin;
use uuid::Uuid;

/// One status an engine transaction wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The instance.
    pub instance_id: Uuid,
    /// Its workflow's name.
    pub workflow: String,
    /// The status written.
    pub status: RunStatus,
}

/// Why a [`TransitionHook`] failed: a database error (kept, so the engine can tell a
/// rolled-back statement from a lost connection), or another failure (value-free).
#[derive(Debug, thiserror::Error)]
pub enum TransitionHookError {
    /// A statement of the hook failed.
    #[error("transition hook: database: {0}")]
    Database(#[from] sqlx::Error),
    /// Anything else.
    #[error("transition hook: {0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl TransitionHookError {
    /// The metric label of the failure: `database` or `other`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Database(_) => "database",
            Self::Other(_) => "other",
        }
    }

    /// As `sqlx::Error`, for the engine's API paths.
    pub(crate) fn into_sqlx(self) -> sqlx::Error {
        match self {
            Self::Database(e) => e,
            Self::Other(_) => sqlx::Error::Protocol("transition hook failed".to_owned()),
        }
    }
}

/// The future a [`TransitionHook`] returns.
pub type HookFuture<'c> =
    Pin<Box<dyn Future<Output = Result<(), TransitionHookError>> + Send + 'c>>;

/// Code run inside the engine's status-changing transactions (see the module docs).
pub trait TransitionHook: Send + Sync + 'static {
    /// Called on the transaction's connection with the transitions it wrote (one per
    /// instance, in the batch's order).
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        transitions: &'c [Transition],
    ) -> HookFuture<'c>;
}

/// The engine's hook slot (shared by an engine's clones and its segment settles).
pub(crate) type HookSlot = std::sync::Arc<std::sync::OnceLock<std::sync::Arc<dyn TransitionHook>>>;

/// Runs the hook of `slot`, if one is set and there are transitions; a failure is
/// counted (`keel_durable_transition_hook_failures_total{kind}`) and logged.
pub(crate) async fn call(
    slot: &HookSlot,
    conn: &mut sqlx::PgConnection,
    transitions: &[Transition],
) -> Result<(), TransitionHookError> {
    match slot.get() {
        Some(hook) if !transitions.is_empty() => {
            let r = hook.record(conn, transitions).await;
            if let Err(e) = &r {
                crate::metrics::hook_failed(e.kind());
                tracing::warn!(target: "keel::durable", kind = e.kind(), instances = transitions.len(),
                    error = %e, "transition hook failed; its transaction rolls back");
            }
            r
        }
        _ => Ok(()),
    }
}

/// [`call`], with the failure as `sqlx::Error` (the engine's API paths).
pub(crate) async fn run(
    slot: &HookSlot,
    conn: &mut sqlx::PgConnection,
    transitions: &[Transition],
) -> Result<(), sqlx::Error> {
    call(slot, conn, transitions)
        .await
        .map_err(TransitionHookError::into_sqlx)
}
