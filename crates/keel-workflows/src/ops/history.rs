//! The operation history read (issue 23, "Operation history"): the decision log of an
//! operation's workflow instance, scoped to the caller's organization.

use crate::error::Result;
use crate::ops::Ops;
use crate::tenancy::Caller;
use keel_durable::{DurableError, HistoryEntry};
use uuid::Uuid;

impl Ops {
    /// The history entries of operation `id` of the caller's organization, oldest
    /// first: those with `seq > after`, at most `fetch` (pass the page size + 1 to learn
    /// whether more follow), each with its actor, kind, time and the (redacted) state
    /// after it (see [`keel_durable::history`]). An operation whose workflow has not
    /// started yet, or whose instance retention deleted, has no entries.
    ///
    /// # Errors
    /// [`crate::OpsError::NotFound`] (no such operation in the caller's organization),
    /// the engine's and the store's failures.
    pub async fn operation_history(
        &self,
        caller: Caller,
        id: Uuid,
        after: i64,
        fetch: u32,
    ) -> Result<Vec<HistoryEntry>> {
        let op = self.operation_row(caller, id).await?;
        let Some(instance) = op.instance_id else {
            return Ok(Vec::new());
        };
        match self.engine.history(instance, after, i64::from(fetch)).await {
            Ok(page) => Ok(page.entries),
            Err(DurableError::InstanceNotFound(_)) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }
}
