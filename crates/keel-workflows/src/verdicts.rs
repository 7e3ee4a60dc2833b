//! Verdict delivery: each settlement verdict of an operation's write reaches its
//! workflow instance as the signal `tx.<link>`, **in the transaction that settles the
//! queue request** ([`keel_txq::SettlementSink`]).
//!
//! The enqueue step writes the queue request and its `operation_tx` link in one
//! transaction ([`keel_txq::TxQueue::enqueue_in`]), so a request can never settle
//! before its link exists; the queue then calls [`VerdictSink`] with every request that
//! moved to `settled`, on the settling connection, and the signal (deduplicated by the
//! queue request id) commits with the verdict or not at all. A crash anywhere leaves
//! either both or neither: no poll, no "delivered" stamp, no second copy.
//!
//! - A request no operation made (no link) is ignored.
//! - An instance that ended (a cancelled operation) takes no signal: the verdict is
//!   dropped (counted), the settlement commits.
//! - A signal already recorded under the request id (a delivery repeated by an
//!   upgrade's catch-up) is a no-op.
//! - Any other failure (database, the instance's open-signal bound) fails the sink:
//!   the queue rolls the settlement back and settles again on a later pass.
//!
//! With [`VerdictSink::with_events`], each verdict's webhook events are written in the
//! same settling transaction (see [`crate::events`]).
//!
//! Metric: `keel_workflows_verdicts_delivered_total{outcome}` (`delivered`,
//! `duplicate`, `dropped`).

use crate::store;
use futures::future::BoxFuture;
use keel_durable::{DurableError, Engine, SignalReceipt};
use keel_txq::{Settled, SettlementSink, SettlementSinkError, SettlementVerdict};
use std::collections::HashMap;
use uuid::Uuid;

/// The reason a verdict's signal is recorded with: `SYSTEM` / `settlement` (the
/// transaction queue's settlement, which records the signal in its own transaction,
/// not a caller). Signals recorded before issue 32 read `verdict-relay`.
pub const VERDICT_REASON: &str = "settlement";

/// The settlement sink of keel-workflows: records each verdict as its workflow's signal
/// in the settling transaction. Register it on every [`keel_txq::TxQueue`] that runs
/// operations' requests ([`keel_txq::TxQueue::set_settlement_sink`]) and pass it to
/// [`keel_txq::withdraw_by_key_prefix`].
#[derive(Clone)]
pub struct VerdictSink {
    engine: Engine,
    events: Option<crate::events::OperationEvents>,
}

impl std::fmt::Debug for VerdictSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerdictSink").finish_non_exhaustive()
    }
}

impl VerdictSink {
    /// A sink that signals instances of `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            events: None,
        }
    }

    /// The sink, also writing each verdict's webhook events
    /// (`operation.transaction_settled` and what changed, see [`crate::events`]) in the
    /// settling transaction.
    #[must_use]
    pub fn with_events(mut self, events: crate::events::OperationEvents) -> Self {
        self.events = Some(events);
        self
    }
}

/// Why a verdict could not be recorded (value-free).
#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    #[error("database: {0}")]
    Store(#[from] keel_store::StoreError),
    #[error("engine: {0}")]
    Engine(#[from] DurableError),
    #[error("the verdict did not serialize")]
    Json,
    #[error("webhook events: {0}")]
    Events(#[from] crate::OpsError),
}

impl SettlementSink for VerdictSink {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        settled: &'c [Settled<'c>],
    ) -> BoxFuture<'c, Result<(), SettlementSinkError>> {
        Box::pin(async move {
            deliver(&self.engine, self.events.as_ref(), conn, settled)
                .await
                .map_err(SettlementSinkError::new)
        })
    }

    /// A settled verdict a reorg took back (`REORGED_OUT`, issue 32 §10): the
    /// operation's workflow has moved on with the earlier verdict, so no signal is
    /// recorded; with events, `operation.transaction_reorged` is written in the same
    /// transaction (its `data` shows the transaction's new verdict). Counted in
    /// `keel_workflows_verdicts_reorged_total`.
    fn reorged<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        reorged: &'c [Settled<'c>],
    ) -> BoxFuture<'c, Result<(), SettlementSinkError>> {
        Box::pin(async move {
            let ids: Vec<Uuid> = reorged.iter().map(|s| s.request_id).collect();
            let links = store::operation_tx_by_requests(&mut *conn, &ids)
                .await
                .map_err(SettlementSinkError::new)?;
            for link in links {
                metrics::counter!("keel_workflows_verdicts_reorged_total").increment(1);
                tracing::error!(target: "keel::workflows", instance = %link.instance_id, request = %link.txq_request_id,
                    "a settled transaction of an operation was reorged out (REORGED_OUT): its effect is absent");
                if let Some(events) = &self.events {
                    events
                        .emit_reorged(&mut *conn, link.instance_id)
                        .await
                        .map_err(SettlementSinkError::new)?;
                }
            }
            Ok(())
        })
    }
}

async fn deliver(
    engine: &Engine,
    events: Option<&crate::events::OperationEvents>,
    conn: &mut sqlx::PgConnection,
    settled: &[Settled<'_>],
) -> Result<(), DeliveryError> {
    let ids: Vec<Uuid> = settled.iter().map(|s| s.request_id).collect();
    // Ordered by instance: two settling transactions lock instances in one order.
    let links = store::operation_tx_by_requests(&mut *conn, &ids).await?;
    let verdicts: HashMap<Uuid, &SettlementVerdict> =
        settled.iter().map(|s| (s.request_id, s.verdict)).collect();
    for link in links {
        let Some(verdict) = verdicts.get(&link.txq_request_id) else {
            continue;
        };
        let payload = serde_json::to_value(verdict).map_err(|_| DeliveryError::Json)?;
        let outcome = match engine
            .signal_in_as(
                &mut *conn,
                link.instance_id,
                &link.signal_name,
                &link.txq_request_id.to_string(),
                &payload,
                &keel_durable::Actor::system(VERDICT_REASON),
            )
            .await
        {
            Ok(SignalReceipt::Recorded) => "delivered",
            Ok(_) => "duplicate",
            Err(DurableError::InstanceEnded { .. } | DurableError::InstanceNotFound(_)) => {
                "dropped"
            }
            Err(e) => return Err(e.into()),
        };
        metrics::counter!("keel_workflows_verdicts_delivered_total", "outcome" => outcome)
            .increment(1);
        if let Some(events) = events {
            events
                .emit_for_instance(&mut *conn, link.instance_id, true)
                .await?;
        }
    }
    Ok(())
}
