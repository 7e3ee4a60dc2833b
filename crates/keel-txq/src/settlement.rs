//! The settlement seam: every verdict is pushed to a [`SettlementSink`] inside the
//! database transaction that settles its request.
//!
//! Each path that moves a `txq_request` to `settled` (the confirmation pass, a failure
//! before or at signing or broadcast, an expired funding deadline, a withdrawal) runs
//! its guarded `UPDATE … RETURNING` and then [`SettlementSink::record`] with exactly the
//! rows that moved, on the same connection, and commits both together. A verdict
//! therefore reaches the sink exactly once, and only if it is stored: a request settled
//! already is not returned by the guarded update and is never passed again.
//!
//! A sink error rolls the transaction back: the request stays in its state and the
//! next pass settles it again (`keel_txq_settlement_sink_failures_total{chain_id}`, a
//! WARN). A batch whose sink call fails is retried request by request at once, so one
//! request the sink refuses does not hold back the others. Without a sink the queue
//! settles as before, one autocommit statement per settle.

use crate::verdict::SettlementVerdict;
use futures::future::BoxFuture;
use uuid::Uuid;

/// One request that moved to `settled` in the current transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled<'a> {
    /// The request's id (as returned by [`crate::TxQueue::enqueue`]).
    pub request_id: Uuid,
    /// Its idempotency key (unique per chain and sender).
    pub idempotency_key: &'a str,
    /// The verdict just stored in `txq_request.verdict`.
    pub verdict: &'a SettlementVerdict,
}

/// Receives every settlement inside the transaction that settles it.
///
/// `record` runs on `conn`, the connection of that transaction, after the settling
/// statement and before the commit: whatever it writes there commits with the verdicts,
/// or not at all. It must not commit or roll back itself, and should be quick (it
/// holds the settled rows' locks). `settled` holds only rows that moved in this
/// transaction, never one twice, and is never empty.
///
/// # Errors
/// Any [`SettlementSinkError`] rolls the settlement back; the queue settles the
/// requests again on a later pass (see the module docs).
pub trait SettlementSink: Send + Sync {
    /// Records `settled` on `conn` (see the trait docs).
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        settled: &'c [Settled<'c>],
    ) -> BoxFuture<'c, Result<(), SettlementSinkError>>;

    /// Records that settled requests lost their effect to a reorg (issue 32 §10): each
    /// had settled `confirmed` or `reverted` (passed to [`SettlementSink::record`] then),
    /// a reorg took its transaction out, and another transaction of its sender took its
    /// nonce on the final chain. `reorged[i].verdict` is the new verdict
    /// (`Failed { code: REORGED_OUT }`) just stored over the old one. Runs on `conn`, the
    /// transaction that stores it, under the same rules as `record`; an error rolls it
    /// back and a later pass tries again. The default records nothing.
    ///
    /// # Errors
    /// Any [`SettlementSinkError`] rolls the change back.
    fn reorged<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        reorged: &'c [Settled<'c>],
    ) -> BoxFuture<'c, Result<(), SettlementSinkError>> {
        let _ = (conn, reorged);
        Box::pin(async { Ok(()) })
    }
}

/// A [`SettlementSink`] failed: the settlement was rolled back. Value-free message; the
/// cause is the error's source.
#[derive(Debug, thiserror::Error)]
#[error("the settlement sink failed")]
pub struct SettlementSinkError {
    #[source]
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl SettlementSinkError {
    /// Wraps the sink's own error.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl From<sqlx::Error> for SettlementSinkError {
    fn from(e: sqlx::Error) -> Self {
        Self::new(e)
    }
}
