//! The custody stage: requests of custody senders ([`crate::CustodySender`]) are
//! submitted to their provider and followed to a settlement verdict (the rules are in
//! `crate::custody`'s docs). Each due request is one independent step: an error defers
//! that request only (backoff), never the others.

mod observe;

use super::TxQueue;
use super::metrics;
use crate::custody::CustodySender;
use crate::store::{self, CustodyDueRow, CustodyObserved};
use crate::submission::{CancelReason, CustodyPhase};
use crate::verdict::{FailureCode, SettlementVerdict};
use crate::{Result, TxqError};
use alloy::primitives::{B256, Bytes, U256};
use futures::StreamExt;
use keel_custody::{
    CancelOutcome, ContractCall, CustodyError, Ending, ErrorClass, ExternalTxId,
    ProviderTransaction, ProviderTxId, StatusPhase, TxStatus,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Due custody requests read per pass.
const CUSTODY_BATCH: i64 = 256;
/// Custody requests stepped at once (each may wait on its provider).
const CUSTODY_IN_FLIGHT: usize = 16;

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The request settled.
    Settled,
    /// Its submission moved or was read.
    Moved,
}

/// The submission a due row carries.
struct Sub<'a> {
    id: Uuid,
    resubmission: i32,
    external: &'a str,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The failure code of a submission that ended without effect, by how it ended (as
/// its provider says: [`keel_custody::CustodyProvider::status_ending`]).
fn failure_code(ending: Option<Ending>) -> FailureCode {
    match ending {
        Some(Ending::Rejected) => FailureCode::CustodyRejected,
        Some(Ending::Blocked) => FailureCode::CustodyBlocked,
        Some(Ending::Cancelled) => FailureCode::CustodyCancelled,
        Some(Ending::Failed) | None => FailureCode::CustodyFailed,
    }
}

fn phase_label(p: StatusPhase) -> &'static str {
    match p {
        StatusPhase::PreBroadcast => "pre_broadcast",
        StatusPhase::AwaitingApproval => "awaiting_approval",
        StatusPhase::Broadcast => "broadcast",
        StatusPhase::Cancelling => "cancelling",
        StatusPhase::Completed => "completed",
        StatusPhase::Rejected => "rejected",
        StatusPhase::Unknown => "unknown",
    }
}

impl TxQueue {
    /// One custody pass: every due request of a custody sender (no submission yet, or
    /// its submission's next read is due) is stepped, [`CUSTODY_IN_FLIGHT`] at once.
    /// Returns how many settled.
    ///
    /// # Errors
    /// Store errors of the read of due requests; a failing request is logged, deferred
    /// and does not fail the pass.
    pub(super) async fn custody_round(&self, cancel: &CancellationToken) -> Result<usize> {
        if self.custody.is_empty() || cancel.is_cancelled() {
            return Ok(0);
        }
        let senders: Vec<Vec<u8>> = self.custody.keys().map(|a| a.to_vec()).collect();
        let due = store::custody_due(&self.db, self.chain_id, &senders, CUSTODY_BATCH).await?;
        let steps: Vec<_> = due
            .iter()
            .map(|row| self.custody_step(row, cancel))
            .collect();
        let results: Vec<Result<Option<Step>>> = futures::stream::iter(steps)
            .buffer_unordered(CUSTODY_IN_FLIGHT)
            .collect()
            .await;
        Ok(results
            .into_iter()
            .filter(|r| matches!(r, Ok(Some(Step::Settled))))
            .count())
    }

    /// One request: dispatch on its submission's phase; an error defers it.
    async fn custody_step(
        &self,
        row: &CustodyDueRow,
        cancel: &CancellationToken,
    ) -> Result<Option<Step>> {
        let Some(sender) = self.custody.get(&row.sender.0) else {
            return Ok(None);
        };
        let result = self.custody_dispatch(sender, row, cancel).await;
        match result {
            Ok(step) => Ok(step),
            Err(e) => {
                metrics::custody_step_failed(self.chain_id);
                tracing::warn!(target: "keel::txq", request = %row.id, error = %e,
                    "custody step failed; retrying later");
                if let Some(resubmission) = row.resubmission {
                    let polls = row.polls.unwrap_or(0);
                    // Best effort: a failed defer leaves the row due now (read again next pass).
                    let _ = store::custody_defer(
                        &self.db,
                        row.id,
                        resubmission,
                        ms(sender.backoff(polls)),
                        None,
                    )
                    .await;
                }
                Err(e)
            }
        }
    }

    async fn custody_dispatch(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        cancel: &CancellationToken,
    ) -> Result<Option<Step>> {
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let (Some(resubmission), Some(external), Some(phase)) =
            (row.resubmission, row.external_tx_id.as_deref(), row.phase)
        else {
            // No submission yet: the first one.
            let external = ExternalTxId::derive(&row.id.to_string(), 0)
                .map_err(|_| TxqError::InvalidRequest("external_tx_id"))?;
            let sub = Sub {
                id: row.id,
                resubmission: 0,
                external: external.as_str(),
            };
            return self.custody_create(sender, row, &sub, cancel).await;
        };
        let sub = Sub {
            id: row.id,
            resubmission,
            external,
        };
        match phase {
            // Withdrawn before any create went out with this external id: nothing is at
            // the provider, so nothing can land.
            CustodyPhase::Ready if row.cancel_reason == Some(CancelReason::Withdrawn) => {
                let verdict = SettlementVerdict::Failed {
                    code: FailureCode::Withdrawn,
                    reason: None,
                    revert_data: None,
                    attempts: Vec::new(),
                };
                self.custody_settle(&sub, &verdict).await
            }
            CustodyPhase::Ready => self.custody_create(sender, row, &sub, cancel).await,
            CustodyPhase::Creating => {
                // A create was (maybe) sent by a process that died or was stopped before
                // its answer was recorded: in doubt from now on, and absence provable
                // only once the provider's in-doubt window has passed.
                store::custody_in_doubt(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    self.doubt_ms(sender),
                    0,
                )
                .await?;
                metrics::custody_create(self.chain_id, "in_doubt");
                tracing::info!(target: "keel::txq", request = %sub.id, "custody create found in doubt after a restart");
                Ok(Some(Step::Moved))
            }
            CustodyPhase::InDoubt => self.custody_lookup(sender, row, &sub, cancel).await,
            CustodyPhase::Submitted | CustodyPhase::Cancelling => {
                self.custody_poll(sender, row, &sub, phase, cancel).await
            }
            CustodyPhase::Superseded | CustodyPhase::Done => Ok(None),
        }
    }

    /// Milliseconds from now until a lookup's `None` proves a create absent: the
    /// provider's in-doubt window ([`keel_custody::CustodyProvider::in_doubt_window`])
    /// plus the configured clock skew.
    fn doubt_ms(&self, sender: &CustodySender) -> i64 {
        ms(sender.provider.in_doubt_window() + sender.skew)
    }

    /// Commits the submission as `creating` (under the request's row lock, only while
    /// it is `queued`), then sends the create; records what came back.
    async fn custody_create(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        sub: &Sub<'_>,
        cancel: &CancellationToken,
    ) -> Result<Option<Step>> {
        if cancel.is_cancelled() {
            return Ok(None);
        }
        // A request a provider's contract call cannot carry (a contract creation, a
        // value that is no U256) never reaches the provider.
        let to = row.to_address.map(|a| a.0);
        let value: Option<U256> = row.value_wei.parse().ok();
        let (Some(to), Some(value)) = (to, value) else {
            let verdict = SettlementVerdict::Failed {
                code: FailureCode::CustodyRefused,
                reason: Some("not a contract call".to_owned()),
                revert_data: None,
                attempts: Vec::new(),
            };
            return Ok(self
                .settle(sub.id, &verdict)
                .await?
                .then_some(Step::Settled));
        };
        let call = ContractCall {
            vault: sender.vault.clone(),
            asset: sender.asset.clone(),
            to,
            calldata: Bytes::from(row.calldata.clone()),
            value,
            external_tx_id: ExternalTxId::new(sub.external)
                .map_err(|_| TxqError::InvalidRequest("external_tx_id"))?,
            note: format!("keel txq request {}", sub.id),
        };
        let mut tx = self.db.begin().await?;
        if !store::request_lock_queued(&mut tx, sub.id).await? {
            return Ok(None);
        }
        store::custody_insert(
            &mut *tx,
            sub.id,
            sub.resubmission,
            sub.external,
            sender.provider.name(),
        )
        .await?;
        if !store::custody_move(
            &mut *tx,
            sub.id,
            sub.resubmission,
            CustodyPhase::Ready,
            CustodyPhase::Creating,
        )
        .await?
        {
            return Ok(None);
        }
        tx.commit().await?;
        match sender.provider.create_contract_call(&call).await {
            Ok(created) => {
                metrics::custody_create(self.chain_id, "created");
                let seen = CustodyObserved {
                    provider_tx_id: created.id.as_str(),
                    status: created.status.as_str(),
                    sub_status: None,
                    rank: i16::from(sender.provider.status_rank(&created.status)),
                    tx_hash: None,
                    next_ms: ms(sender.poll),
                    woken_at: row.woken_at,
                };
                store::custody_observed(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    CustodyPhase::Creating,
                    CustodyPhase::Submitted,
                    &seen,
                )
                .await?;
                tracing::info!(target: "keel::txq", request = %sub.id, resubmission = sub.resubmission,
                    status = created.status.as_str(), "custody transaction created");
                Ok(Some(Step::Moved))
            }
            Err(e) => self.custody_create_failed(sender, sub, &e).await,
        }
    }

    /// What a failed create leaves: in doubt (look up), ready again (nothing reached
    /// the provider), or a `CUSTODY_REFUSED` verdict (the provider refused the call).
    async fn custody_create_failed(
        &self,
        sender: &CustodySender,
        sub: &Sub<'_>,
        e: &CustodyError,
    ) -> Result<Option<Step>> {
        match e.class() {
            ErrorClass::InDoubt | ErrorClass::Duplicate => {
                metrics::custody_create(self.chain_id, "in_doubt");
                tracing::info!(target: "keel::txq", request = %sub.id, error = e.code(),
                    "custody create in doubt; looking it up by external id");
                store::custody_in_doubt(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    self.doubt_ms(sender),
                    0,
                )
                .await?;
                Ok(Some(Step::Moved))
            }
            ErrorClass::Retryable => {
                // Nothing was taken by the provider (a connect failure, 429s that
                // outlasted the adapter's retries): the same create later.
                metrics::custody_create(self.chain_id, "retry");
                let wait = match e {
                    CustodyError::RateLimited {
                        retry_after: Some(d),
                    } => (*d).max(sender.poll),
                    _ => sender.poll,
                };
                store::custody_defer(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    ms(wait),
                    Some(CustodyPhase::Creating),
                )
                .await?;
                Ok(Some(Step::Moved))
            }
            _ => match e {
                CustodyError::Refused { .. } | CustodyError::InvalidInput { .. } => {
                    metrics::custody_create(self.chain_id, "refused");
                    let verdict = SettlementVerdict::Failed {
                        code: FailureCode::CustodyRefused,
                        reason: Some(e.code().to_owned()),
                        revert_data: None,
                        attempts: Vec::new(),
                    };
                    self.custody_settle(sub, &verdict).await
                }
                _ => {
                    // Credentials or configuration: the operator must act; the request
                    // stays visible and is retried at the slowest interval.
                    metrics::custody_create(self.chain_id, "config");
                    tracing::warn!(target: "keel::txq", request = %sub.id, error = %e,
                        "custody create refused for credentials or configuration; retrying later");
                    store::custody_defer(
                        &self.db,
                        sub.id,
                        sub.resubmission,
                        ms(sender.max_poll),
                        Some(CustodyPhase::Creating),
                    )
                    .await?;
                    Ok(None)
                }
            },
        }
    }

    /// In doubt: look the create up by external id. `Some` adopts it; `None` proves
    /// absence only after `absent_after` (then the same external id is created again);
    /// before that, look again later.
    async fn custody_lookup(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        sub: &Sub<'_>,
        cancel: &CancellationToken,
    ) -> Result<Option<Step>> {
        let external = ExternalTxId::new(sub.external)
            .map_err(|_| TxqError::InvalidRequest("external_tx_id"))?;
        let found = sender
            .provider
            .get_by_external_id(&external)
            .await
            .map_err(custody_err)?;
        match found {
            Some(ptx) => {
                tracing::info!(target: "keel::txq", request = %sub.id, status = ptx.status.as_str(),
                    "custody create found by external id");
                self.custody_observe(sender, row, sub, CustodyPhase::InDoubt, &ptx, cancel)
                    .await
            }
            None if row.absent_proven == Some(true) => {
                // Proven absent: the create never took effect and no longer can.
                tracing::info!(target: "keel::txq", request = %sub.id,
                    "custody create proven absent; creating again with the same external id");
                if store::custody_move(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    CustodyPhase::InDoubt,
                    CustodyPhase::Ready,
                )
                .await?
                {
                    self.custody_create(sender, row, sub, cancel).await
                } else {
                    Ok(None)
                }
            }
            None => {
                store::custody_defer(&self.db, sub.id, sub.resubmission, ms(sender.poll), None)
                    .await?;
                Ok(Some(Step::Moved))
            }
        }
    }

    /// A submission the provider has: read its status (by provider id) and act on it.
    async fn custody_poll(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        sub: &Sub<'_>,
        phase: CustodyPhase,
        cancel: &CancellationToken,
    ) -> Result<Option<Step>> {
        // The provider said COMPLETED and the hash is persisted: only the chain is left.
        if let (Some(hash), Some(status)) = (row.tx_hash, row.status.as_deref())
            && sender.provider.status_phase(&TxStatus::parse(status)) == StatusPhase::Completed
        {
            let hash = hash.0;
            return self.custody_chain(sender, row, sub, hash).await;
        }
        let Some(pid) = row.provider_tx_id.as_deref() else {
            return Ok(None);
        };
        let pid = ProviderTxId::new(pid).map_err(|_| TxqError::InvalidRequest("provider_tx_id"))?;
        let ptx = sender.provider.get(&pid).await.map_err(custody_err)?;
        self.custody_observe(sender, row, sub, phase, &ptx, cancel)
            .await
    }
}

/// Marks a settled request's submission `done` (from any live phase).
async fn mark_done(q: &TxQueue, sub: &Sub<'_>) -> Result<()> {
    for from in [
        CustodyPhase::Submitted,
        CustodyPhase::Creating,
        CustodyPhase::InDoubt,
        CustodyPhase::Cancelling,
        CustodyPhase::Ready,
    ] {
        if store::custody_move(&q.db, sub.id, sub.resubmission, from, CustodyPhase::Done).await? {
            break;
        }
    }
    Ok(())
}

/// A provider error as the queue's error.
fn custody_err(e: CustodyError) -> TxqError {
    TxqError::Custody(e)
}
