//! Acting on a read of the provider: the status's phase decides whether the request
//! settles (a rejection, a confirmed cancel, the chain's verdict once a hash is known),
//! is cancelled at the provider (silent drop, approval deadline, withdrawal), is
//! resubmitted, or is read again later; and the chain's verdict for a custody hash.

use super::*;

impl TxQueue {
    /// Acts on a read of the provider (see the module docs of `crate::custody`).
    pub(super) async fn custody_observe(
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
    pub(super) async fn custody_chain(
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
    pub(super) async fn custody_settle(
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
