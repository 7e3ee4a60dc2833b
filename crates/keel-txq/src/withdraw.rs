//! Withdrawing requests that were never signed: the queue's part of cancelling an
//! operation.
//!
//! A request that is `queued` or `waiting_funding` has no nonce and no signature yet, so
//! nothing of it can reach a chain: withdrawing settles it at once with
//! `Failed { code: "WITHDRAWN" }` (no attempts). A request that is `signed` or
//! `broadcast` cannot be taken back — its bytes may already be in a node's pool — so it
//! is reported as in flight and runs to its own verdict. The signing pass re-checks the
//! state of every request under its row lock (`txq_commit_signed`), so a request
//! withdrawn while a round prepared it is never signed.

use crate::store;
use crate::verdict::SettlementVerdict;
use crate::{Result, TxqError};
use keel_store::PgPool;
use keel_units::ChainId;
use uuid::Uuid;

/// The verdict code of a withdrawn request.
pub const WITHDRAWN: &str = "WITHDRAWN";

/// What [`withdraw_by_key_prefix`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Withdrawal {
    /// Requests settled `Failed { code: "WITHDRAWN" }` by this call (never signed).
    pub withdrawn: Vec<Uuid>,
    /// Requests that were signed (possibly broadcast) and not settled: they cannot be
    /// withdrawn and will settle with their own verdict.
    pub in_flight: Vec<Uuid>,
}

/// Withdraws every unsigned request of `chain` whose idempotency key starts with
/// `key_prefix` (e.g. `op/<operation id>/`, the keys of one operation's steps) and
/// reports those already signed. Idempotent: a second call withdraws nothing more.
///
/// # Errors
/// [`TxqError::InvalidRequest`] for an empty prefix or a chain id above `i64::MAX`;
/// [`TxqError::Store`] when the database fails (nothing is half-written: one statement).
pub async fn withdraw_by_key_prefix(
    db: &PgPool,
    chain: ChainId,
    key_prefix: &str,
) -> Result<Withdrawal> {
    if key_prefix.is_empty() {
        return Err(TxqError::InvalidRequest("key_prefix"));
    }
    let chain_id = i64::try_from(chain.get()).map_err(|_| TxqError::InvalidRequest("chain_id"))?;
    let verdict = SettlementVerdict::Failed {
        code: WITHDRAWN.to_owned(),
        reason: None,
        revert_data: None,
        attempts: Vec::new(),
    };
    let json = serde_json::to_value(&verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
    let rows =
        store::requests_withdraw_by_key_prefix(db, chain_id, key_prefix, &json, verdict.kind())
            .await?;
    let mut out = Withdrawal::default();
    for (id, withdrawn) in rows {
        if withdrawn {
            out.withdrawn.push(id);
        } else {
            out.in_flight.push(id);
        }
    }
    if !out.withdrawn.is_empty() {
        metrics::counter!("keel_txq_verdicts_total", "chain_id" => chain.get().to_string(), "kind" => verdict.kind())
            .increment(out.withdrawn.len() as u64);
    }
    Ok(out)
}
