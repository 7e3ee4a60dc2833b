//! The verdict relay: delivers each settled transaction-queue verdict of an operation
//! step to its workflow instance as a signal.
//!
//! `operation_tx` links a step to its queue request and instance. A pass selects
//! undelivered links whose request is `settled`, records the verdict as the signal
//! `tx.<step>` with the queue request id as the dedupe key, then stamps
//! `delivered_at`. A crash between the two repeats the signal, which the engine
//! deduplicates; a signal recorded before the workflow reaches its wait is kept and
//! consumed there. An instance that ended (cancelled) no longer takes signals: its
//! links are stamped too.

use keel_durable::{DurableError, Engine};
use serde_json::Value;
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Links delivered per pass at most.
pub const RELAY_BATCH: i64 = 200;

/// Why a relay pass failed (it is retried at the next tick).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The database failed.
    #[error("database: {0}")]
    Store(#[from] keel_store::StoreError),
    /// The engine refused or failed.
    #[error("engine: {0}")]
    Engine(#[from] DurableError),
}

impl From<sqlx::Error> for RelayError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// One relay pass: delivers up to [`RELAY_BATCH`] settled verdicts. Returns how many
/// links were stamped delivered.
///
/// # Errors
/// [`RelayError`]; links not stamped are retried next pass.
pub async fn relay_pass(db: &PgPool, engine: &Engine) -> Result<usize, RelayError> {
    let rows: Vec<(Uuid, String, Uuid, String, Uuid, Value)> = sqlx::query_as(
        "SELECT ot.operation_id, ot.step, ot.instance_id, ot.signal_name, ot.txq_request_id, r.verdict
           FROM operation_tx ot JOIN txq_request r ON r.id = ot.txq_request_id
          WHERE ot.delivered_at IS NULL AND r.state = 'settled'
          ORDER BY ot.created_at LIMIT $1",
    )
    .bind(RELAY_BATCH)
    .fetch_all(db)
    .await?;
    let mut delivered = 0;
    for (operation_id, step, instance_id, signal, request_id, verdict) in rows {
        let outcome = engine
            .signal(instance_id, &signal, &request_id.to_string(), &verdict)
            .await;
        let kind = match outcome {
            Ok(_) => "delivered",
            Err(DurableError::InstanceEnded { .. } | DurableError::InstanceNotFound(_)) => {
                "dropped"
            }
            Err(e) => return Err(e.into()),
        };
        sqlx::query(
            "UPDATE operation_tx SET delivered_at = now() WHERE operation_id = $1 AND step = $2",
        )
        .bind(operation_id)
        .bind(&step)
        .execute(db)
        .await?;
        metrics::counter!("keel_workflows_verdicts_relayed_total", "outcome" => kind).increment(1);
        delivered += 1;
    }
    Ok(delivered)
}

/// Runs relay passes every `interval` (immediately again after a full batch) until
/// `stop` fires.
pub async fn run_relay(db: PgPool, engine: Engine, interval: Duration, stop: CancellationToken) {
    use tracing::Instrument;
    async move {
        while !stop.is_cancelled() {
            let full = match relay_pass(&db, &engine).await {
                Ok(n) => n as i64 >= RELAY_BATCH,
                Err(e) => {
                    tracing::warn!(target: "keel::workflows::relay", error = %e, "relay pass failed; retrying");
                    false
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
    .instrument(tracing::info_span!("verdict_relay"))
    .await;
}
