//! Withdrawing requests that were never signed: the queue's part of cancelling an
//! operation.
//!
//! A request that is `queued` or `waiting_funding` has no nonce and no signature yet, so
//! nothing of it can reach a chain: withdrawing settles it at once with
//! `Failed { code: FailureCode::Withdrawn }` (no attempts). A request that is `signed` or
//! `broadcast` cannot be taken back — its bytes may already be in a node's pool — so it
//! is reported as in flight and runs to its own verdict. The signing pass re-checks the
//! state of every request under its row lock (`txq_commit_signed`), so a request
//! withdrawn while a round prepared it is never signed.

use crate::queue::metrics;
use crate::settlement::{Settled, SettlementSink};
use crate::store;
use crate::verdict::{FailureCode, SettlementVerdict};
use crate::{Result, TxqError};
use keel_store::PgPool;
use keel_units::ChainId;
use uuid::Uuid;

/// What [`withdraw_by_key_prefix`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Withdrawal {
    /// Requests settled `Failed { code: FailureCode::Withdrawn }` by this call (never
    /// signed).
    pub withdrawn: Vec<Uuid>,
    /// Requests that were signed (possibly broadcast) and not settled: they cannot be
    /// withdrawn and will settle with their own verdict.
    pub in_flight: Vec<Uuid>,
}

/// Withdraws every unsigned request of `chain` whose idempotency key starts with
/// `key_prefix` (e.g. `op/<operation id>/`, the keys of one operation's steps) and
/// reports those already signed. Idempotent: a second call withdraws nothing more.
///
/// With a `sink`, the withdrawn requests are handed to it in the transaction that
/// settles them (as every settlement of the queue, see [`SettlementSink`]); a sink error
/// rolls the withdrawal back and is returned.
///
/// # Errors
/// [`TxqError::InvalidRequest`] for an empty prefix or a chain id above `i64::MAX`;
/// [`TxqError::Store`] when the database fails; [`TxqError::Sink`] when the sink fails.
/// Nothing is half-written: one transaction (the matching rows are locked first, then
/// settled in one statement, with the sink when there is one). A custody request that
/// has a submission at its provider is not withdrawn here (it may land): it is reported
/// in `in_flight` and marked, in the same transaction, to be cancelled at the provider
/// while it is not signed; the cancel confirmed, it settles `WITHDRAWN` (reason
/// `CANCELLED_AT_PROVIDER`); signed anyway, it runs to its chain verdict (issue 32 §5).
pub async fn withdraw_by_key_prefix(
    db: &PgPool,
    chain: ChainId,
    key_prefix: &str,
    sink: Option<&dyn SettlementSink>,
) -> Result<Withdrawal> {
    if key_prefix.is_empty() {
        return Err(TxqError::InvalidRequest("key_prefix"));
    }
    let chain_id = chain
        .to_db()
        .map_err(|_| TxqError::InvalidRequest("chain_id"))?;
    let verdict = SettlementVerdict::Failed {
        code: FailureCode::Withdrawn,
        reason: None,
        revert_data: None,
        attempts: Vec::new(),
    };
    let json = serde_json::to_value(&verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
    let rows = match sink {
        None => {
            let mut tx = db.begin().await?;
            store::requests_lock_by_key_prefix(&mut *tx, chain_id, key_prefix).await?;
            let rows = store::requests_withdraw_by_key_prefix(
                &mut *tx,
                chain_id,
                key_prefix,
                &json,
                verdict.kind(),
            )
            .await?;
            cancel_at_provider(&mut tx, &rows).await?;
            tx.commit().await?;
            rows
        }
        Some(sink) => {
            let mut tx = db.begin().await?;
            store::requests_lock_by_key_prefix(&mut *tx, chain_id, key_prefix).await?;
            let rows = store::requests_withdraw_by_key_prefix(
                &mut *tx,
                chain_id,
                key_prefix,
                &json,
                verdict.kind(),
            )
            .await?;
            let settled: Vec<Settled<'_>> = rows
                .iter()
                .filter(|r| r.withdrawn)
                .map(|r| Settled {
                    request_id: r.id,
                    idempotency_key: &r.idempotency_key,
                    verdict: &verdict,
                })
                .collect();
            if !settled.is_empty()
                && let Err(e) = sink.record(&mut tx, &settled).await
            {
                metrics::settlement_sink_failures(chain_id);
                return Err(e.into());
            }
            drop(settled);
            cancel_at_provider(&mut tx, &rows).await?;
            tx.commit().await?;
            rows
        }
    };
    let mut out = Withdrawal::default();
    for r in rows {
        if r.withdrawn {
            out.withdrawn.push(r.id);
        } else {
            out.in_flight.push(r.id);
        }
    }
    if !out.withdrawn.is_empty() {
        metrics::verdicts(chain_id, verdict.kind(), out.withdrawn.len());
    }
    Ok(out)
}

/// Marks the in-flight custody requests of `rows` to be cancelled at their provider
/// (those without a custody submission, and the ones already marked, are untouched).
async fn cancel_at_provider(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    rows: &[store::WithdrawRow],
) -> Result<()> {
    let in_flight: Vec<Uuid> = rows.iter().filter(|r| !r.withdrawn).map(|r| r.id).collect();
    if !in_flight.is_empty() {
        store::custody_withdraw_requested(&mut **tx, &in_flight).await?;
    }
    Ok(())
}
