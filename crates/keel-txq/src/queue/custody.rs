//! The custody stage: requests of custody senders ([`crate::CustodySender`]) are
//! submitted to their provider and followed to a settlement verdict (the rules are in
//! `crate::custody`'s docs). Each due request is one independent step: an error defers
//! that request only (backoff), never the others.

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

    /// Acts on a read of the provider (see the module docs of `crate::custody`).
    async fn custody_observe(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        sub: &Sub<'_>,
        from: CustodyPhase,
        ptx: &ProviderTransaction,
        cancel: &CancellationToken,
    ) -> Result<Option<Step>> {
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let phase = sender.provider.status_phase(&ptx.status);
        // A cancel confirmed by the provider (a rejected end of kind `Cancelled`).
        let cancelled = phase == StatusPhase::Rejected
            && sender.provider.status_ending(&ptx.status) == Some(Ending::Cancelled);
        metrics::custody_status(self.chain_id, phase_label(phase));
        let mut hash = ptx.tx_hash;
        if phase == StatusPhase::Completed && hash.is_none() {
            // Lost hash: the provider completed, the answer carrying the hash did not
            // come with this read. Recover it through the external id lookup.
            let external = ExternalTxId::new(sub.external)
                .map_err(|_| TxqError::InvalidRequest("external_tx_id"))?;
            hash = sender
                .provider
                .get_by_external_id(&external)
                .await
                .map_err(custody_err)?
                .and_then(|t| t.tx_hash);
            if hash.is_some() {
                metrics::custody_lost_hash_recovered(self.chain_id);
                tracing::info!(target: "keel::txq", request = %sub.id, "custody hash recovered by external id");
            } else {
                tracing::warn!(target: "keel::txq", request = %sub.id,
                    "custody transaction completed without a hash; reading again later");
            }
        }
        // A cancel accepted for a silent drop that the provider overtook (it signed
        // after all) is followed like any other submission.
        let to = match (from, phase) {
            (CustodyPhase::Cancelling, StatusPhase::Rejected) if cancelled => {
                CustodyPhase::Cancelling
            }
            (
                CustodyPhase::Cancelling,
                StatusPhase::PreBroadcast | StatusPhase::AwaitingApproval | StatusPhase::Cancelling,
            ) => CustodyPhase::Cancelling,
            _ => CustodyPhase::Submitted,
        };
        let polls = row.polls.unwrap_or(0);
        let hash_bytes = hash.map(|h| h.0);
        let seen = CustodyObserved {
            provider_tx_id: ptx.id.as_str(),
            status: ptx.status.as_str(),
            sub_status: ptx.sub_status.as_ref().map(|s| s.as_str()),
            rank: i16::from(sender.provider.status_rank(&ptx.status)),
            tx_hash: hash_bytes.as_ref().map(|h| h.as_slice()),
            next_ms: ms(sender.backoff(polls)),
            woken_at: row.woken_at,
        };
        // The first read of an approval wait is announced to the progress sink in the
        // transaction that records it.
        let announce = phase == StatusPhase::AwaitingApproval
            && row.status.as_deref() != Some(ptx.status.as_str());
        if !self
            .custody_record_observed(sub, from, to, &seen, announce, &row.idempotency_key)
            .await?
        {
            return Ok(None);
        }
        // The chain decides once there is a hash (a FAILED with a hash is a revert).
        if let Some(h) = hash
            && matches!(
                phase,
                StatusPhase::Broadcast | StatusPhase::Completed | StatusPhase::Rejected
            )
        {
            return self.custody_chain(sender, row, sub, h).await;
        }
        // Keel's own cancels (issue 32 §5), while the provider has not signed: a
        // withdrawn request (its operation was cancelled), or an approval wait past the
        // vault's deadline.
        if to == CustodyPhase::Submitted && hash.is_none() {
            // Seconds in the status read now (0 when it just changed).
            let in_status = if row.status.as_deref() == Some(ptx.status.as_str()) {
                row.status_secs.unwrap_or(0.0)
            } else {
                0.0
            };
            let reason = match phase {
                StatusPhase::PreBroadcast | StatusPhase::AwaitingApproval
                    if row.cancel_reason == Some(CancelReason::Withdrawn) =>
                {
                    Some(CancelReason::Withdrawn)
                }
                StatusPhase::AwaitingApproval
                    if sender
                        .approval_deadline
                        .is_some_and(|d| in_status >= d.as_secs_f64()) =>
                {
                    Some(CancelReason::ApprovalExpired)
                }
                _ => None,
            };
            if let Some(reason) = reason {
                return self.custody_cancel_for(sender, sub, &ptx.id, reason).await;
            }
        }
        let organization_scoped = crate::organization_scoped(&row.idempotency_key);
        match phase {
            // A cancel Keel asked for, confirmed: the request's typed outcome.
            StatusPhase::Rejected
                if from == CustodyPhase::Cancelling && cancelled && row.cancel_reason.is_some() =>
            {
                let verdict = if row.cancel_reason == Some(CancelReason::ApprovalExpired) {
                    tracing::warn!(target: "keel::txq", request = %sub.id,
                        "custody approval never came within the deadline; cancelled at the provider");
                    SettlementVerdict::Failed {
                        code: FailureCode::CustodyApprovalExpired,
                        reason: Some("APPROVAL_DEADLINE_PASSED".to_owned()),
                        revert_data: None,
                        attempts: Vec::new(),
                    }
                } else {
                    tracing::info!(target: "keel::txq", request = %sub.id,
                        "withdrawn custody transaction cancelled at the provider");
                    SettlementVerdict::Failed {
                        code: FailureCode::Withdrawn,
                        reason: Some("CANCELLED_AT_PROVIDER".to_owned()),
                        revert_data: None,
                        attempts: Vec::new(),
                    }
                };
                self.custody_settle(sub, &verdict).await
            }
            StatusPhase::Rejected
                if from == CustodyPhase::Cancelling && cancelled && organization_scoped =>
            {
                self.custody_resubmit(sender, sub).await
            }
            StatusPhase::Rejected if from == CustodyPhase::Cancelling && cancelled => {
                // A platform-scoped write cancelled after its poll budget ran out: the
                // cancel is confirmed, nothing reached the chain, and it fails typed.
                let verdict = SettlementVerdict::Failed {
                    code: FailureCode::CustodyTimedOut,
                    reason: Some("POLL_BUDGET_EXCEEDED".to_owned()),
                    revert_data: None,
                    attempts: Vec::new(),
                };
                tracing::warn!(target: "keel::txq", request = %sub.id,
                    "platform-scoped custody transaction never broadcast within its poll budget; cancelled, failing it");
                self.custody_settle(sub, &verdict).await
            }
            StatusPhase::Rejected => {
                let verdict = SettlementVerdict::Failed {
                    code: failure_code(sender.provider.status_ending(&ptx.status)),
                    reason: ptx.sub_status.as_ref().map(|s| s.as_str().to_owned()),
                    revert_data: None,
                    attempts: Vec::new(),
                };
                tracing::info!(target: "keel::txq", request = %sub.id, status = ptx.status.as_str(),
                    "custody transaction rejected at the provider");
                self.custody_settle(sub, &verdict).await
            }
            StatusPhase::PreBroadcast
                if to == CustodyPhase::Submitted
                    && organization_scoped
                    && sender
                        .silent_drop_after
                        .is_some_and(|d| row.status_secs.unwrap_or(0.0) >= d.as_secs_f64()) =>
            {
                self.custody_cancel_dropped(sub, &ptx.id, sender).await
            }
            // A platform-scoped write is not recovered automatically: past the poll
            // budget, still pre-broadcast without a hash, it is cancelled at the
            // provider and (once the cancel is confirmed) fails `CUSTODY_TIMED_OUT`.
            StatusPhase::PreBroadcast
                if to == CustodyPhase::Submitted
                    && !organization_scoped
                    && row.age_secs.unwrap_or(0.0) >= sender.budget.as_secs_f64() =>
            {
                self.custody_check_budget(sender, row, sub).await?;
                self.custody_cancel_dropped(sub, &ptx.id, sender).await
            }
            StatusPhase::AwaitingApproval => Ok(Some(Step::Moved)),
            _ => {
                self.custody_check_budget(sender, row, sub).await?;
                Ok(Some(Step::Moved))
            }
        }
    }

    /// Records a read of the provider ([`store::custody_observed`]); with `announce`
    /// and a progress sink, in one transaction with the sink's
    /// [`crate::Progress::CustodyApprovalRequested`]. A failing sink does not hold the
    /// request back: the read is recorded without it (the operation's next change
    /// reports the wait), counted and logged as every progress sink failure.
    async fn custody_record_observed(
        &self,
        sub: &Sub<'_>,
        from: CustodyPhase,
        to: CustodyPhase,
        seen: &CustodyObserved<'_>,
        announce: bool,
        idempotency_key: &str,
    ) -> Result<bool> {
        if let (true, Some(sink)) = (announce, &self.progress_sink) {
            let mut tx = self.db.begin().await?;
            if !store::custody_observed(&mut *tx, sub.id, sub.resubmission, from, to, seen).await? {
                return Ok(false);
            }
            let progress = [crate::Progress::CustodyApprovalRequested {
                request_id: sub.id,
                idempotency_key,
            }];
            match sink.record(&mut tx, &progress).await {
                Ok(()) => {
                    tx.commit().await?;
                    return Ok(true);
                }
                Err(e) => {
                    drop(tx);
                    metrics::progress_sink_failures(self.chain_id, "custody_approval");
                    tracing::warn!(target: "keel::txq", request = %sub.id, error = %e,
                        "progress sink failed for a custody approval wait; recording it without the sink");
                }
            }
        }
        store::custody_observed(&self.db, sub.id, sub.resubmission, from, to, seen).await
    }

    /// Flags the submission once when it outlived the poll budget (WARN + metric).
    async fn custody_check_budget(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        sub: &Sub<'_>,
    ) -> Result<()> {
        if row.budget_exceeded != Some(true)
            && row.age_secs.unwrap_or(0.0) >= sender.budget.as_secs_f64()
            && store::custody_budget_exceeded(&self.db, sub.id, sub.resubmission).await?
        {
            metrics::custody_budget_exceeded(self.chain_id);
            tracing::warn!(target: "keel::txq", request = %sub.id, resubmission = sub.resubmission,
                status = row.status.as_deref().unwrap_or(""),
                "custody transaction exceeded its poll budget; still following it");
        }
        Ok(())
    }

    /// Silent drop: ask the provider to cancel. Accepted → `cancelling` (the
    /// resubmission waits for a read that shows `CANCELLED`); declined → keep
    /// following it (it was signed after all).
    async fn custody_cancel_dropped(
        &self,
        sub: &Sub<'_>,
        pid: &ProviderTxId,
        sender: &CustodySender,
    ) -> Result<Option<Step>> {
        match sender.provider.cancel(pid).await.map_err(custody_err)? {
            CancelOutcome::Accepted => {
                tracing::warn!(target: "keel::txq", request = %sub.id, resubmission = sub.resubmission,
                    "custody transaction silently dropped at the provider; cancel accepted");
                store::custody_move(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    CustodyPhase::Submitted,
                    CustodyPhase::Cancelling,
                )
                .await?;
                store::custody_defer(&self.db, sub.id, sub.resubmission, 0, None).await?;
            }
            CancelOutcome::Declined => {
                tracing::info!(target: "keel::txq", request = %sub.id,
                    "custody cancel declined; following the transaction");
            }
        }
        Ok(Some(Step::Moved))
    }

    /// Asks the provider to cancel a submission Keel no longer wants signed (`reason`:
    /// [`CancelReason::Withdrawn`] or [`CancelReason::ApprovalExpired`]). Accepted → `cancelling` with the reason
    /// (the request settles once a read shows `CANCELLED`); declined → keep following it
    /// (the provider signed after all: its chain verdict says what landed).
    async fn custody_cancel_for(
        &self,
        sender: &CustodySender,
        sub: &Sub<'_>,
        pid: &ProviderTxId,
        reason: CancelReason,
    ) -> Result<Option<Step>> {
        match sender.provider.cancel(pid).await.map_err(custody_err)? {
            CancelOutcome::Accepted => {
                tracing::info!(target: "keel::txq", request = %sub.id, resubmission = sub.resubmission,
                    reason = reason.as_str(), "custody transaction cancel accepted by the provider");
                store::custody_cancelling(
                    &self.db,
                    sub.id,
                    sub.resubmission,
                    CustodyPhase::Submitted,
                    reason,
                )
                .await?;
            }
            CancelOutcome::Declined => {
                tracing::warn!(target: "keel::txq", request = %sub.id, reason = reason.as_str(),
                    "custody cancel declined by the provider; following the transaction to its verdict");
            }
        }
        Ok(Some(Step::Moved))
    }

    /// A confirmed cancel: the submission is superseded by resubmission n + 1 (a new
    /// external id, the same calldata), created on the next pass.
    async fn custody_resubmit(
        &self,
        sender: &CustodySender,
        sub: &Sub<'_>,
    ) -> Result<Option<Step>> {
        let next = u32::try_from(sub.resubmission + 1)
            .map_err(|_| TxqError::InvalidRequest("resubmission"))?;
        let external = ExternalTxId::derive(&sub.id.to_string(), next)
            .map_err(|_| TxqError::InvalidRequest("external_tx_id"))?;
        let mut tx = self.db.begin().await?;
        let moved = store::custody_supersede(
            &mut tx,
            sub.id,
            sub.resubmission,
            external.as_str(),
            sender.provider.name(),
        )
        .await?;
        tx.commit().await?;
        if moved {
            metrics::custody_resubmitted(self.chain_id);
            tracing::info!(target: "keel::txq", request = %sub.id, resubmission = next,
                "custody cancel confirmed; resubmitting");
        }
        Ok(Some(Step::Moved))
    }

    /// The chain's verdict for `hash`: a receipt at the confirmation depth settles
    /// (`confirmed` or `reverted`); otherwise the request stays in flight.
    async fn custody_chain(
        &self,
        sender: &CustodySender,
        row: &CustodyDueRow,
        sub: &Sub<'_>,
        hash: B256,
    ) -> Result<Option<Step>> {
        let head = self.chain.block_number().await?;
        let receipt = self
            .chain
            .receipts(&[hash])
            .await?
            .into_iter()
            .next()
            .flatten();
        let Some(receipt) = receipt else {
            self.custody_check_budget(sender, row, sub).await?;
            return Ok(Some(Step::Moved));
        };
        let Some(block) = receipt.block_number else {
            return Ok(Some(Step::Moved));
        };
        if head.saturating_sub(block) + 1 < self.config.confirmations {
            store::custody_defer(&self.db, sub.id, sub.resubmission, ms(sender.poll), None).await?;
            return Ok(Some(Step::Moved));
        }
        let verdict = if receipt.status() {
            SettlementVerdict::Confirmed {
                block,
                hash,
                gas_used: receipt.gas_used,
                effective_gas_price: receipt.effective_gas_price.to_string(),
                attempts: Vec::new(),
            }
        } else {
            SettlementVerdict::Reverted {
                block,
                hash,
                reason: None,
                revert_data: None,
                attempts: Vec::new(),
            }
        };
        self.custody_settle(sub, &verdict).await
    }

    /// Settles the request (through the settlement sink, when set) and marks the
    /// submission `done`.
    async fn custody_settle(
        &self,
        sub: &Sub<'_>,
        verdict: &SettlementVerdict,
    ) -> Result<Option<Step>> {
        if !self.settle(sub.id, verdict).await? {
            return Ok(None);
        }
        mark_done(self, sub).await?;
        Ok(Some(Step::Settled))
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
