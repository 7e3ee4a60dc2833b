//! The rescuer: a maintenance service (in the spirit of River's job rescuer) that puts
//! back in the queue the running commands whose instance's lease lapsed (a crashed or
//! aborted executor, a segment whose settle failed), so that a claim hands them out
//! again. Each rescue spends nothing: the claim that takes the command again spends its
//! attempt, and a command whose attempts are spent is dead-lettered by that claim.
//!
//! It runs beside each executor loop ([`keel_service::run`], service `durable-rescuer`):
//! once at start, then every poll interval ([`crate::ExecutorConfig::poll_interval`]),
//! and at once when the loop pokes it (an empty claim while a lease is known to have
//! lapsed). When it requeued commands it wakes its loop to claim them.

use std::sync::Arc;

use keel_service::{BackgroundService, Report};
use tokio::sync::Notify;

use crate::store;

/// The expired-lease recovery of one executor (see the module docs).
pub(crate) struct Rescuer {
    pool: sqlx::PgPool,
    /// The executor loop's wake: notified after a rescue that requeued commands.
    claim: Arc<Notify>,
    /// Ends the rescuer's wait: the loop knows a lease has lapsed.
    poke: Arc<Notify>,
}

impl Rescuer {
    /// A rescuer of `pool`'s commands that wakes `claim` when it requeued any.
    pub(crate) fn new(pool: sqlx::PgPool, claim: Arc<Notify>) -> Self {
        Self {
            pool,
            claim,
            poke: Arc::new(Notify::new()),
        }
    }

    /// The handle that runs the rescuer at once (`notify_one`).
    pub(crate) fn poke(&self) -> Arc<Notify> {
        self.poke.clone()
    }
}

impl BackgroundService for Rescuer {
    type Error = keel_store::StoreError;

    fn name(&self) -> &'static str {
        "durable-rescuer"
    }

    /// One rescue statement ([`store::commands_rescue`]); reports the commands requeued.
    async fn run_once(&mut self) -> Result<Report, Self::Error> {
        let n = store::commands_rescue(&self.pool).await?;
        if n > 0 {
            tracing::info!(target: "keel::durable::executor", commands = n,
                "rescued commands whose lease lapsed");
            self.claim.notify_one();
        }
        Ok(Report::idle(n))
    }

    /// One statement: dropping it mid-way commits nothing or everything.
    fn cancel_safe(&self) -> bool {
        true
    }

    fn wake(&self) -> Option<&Notify> {
        Some(&self.poke)
    }
}
