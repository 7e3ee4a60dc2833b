//! Decisions on an accepted operation: approve or reject, retry, cancel.

use crate::error::{OpsError, Result};
use crate::ops::Ops;
use crate::ops::read::txq_err;
use crate::ops::view::OperationView;
use crate::store;
use crate::tenancy::Caller;
use crate::workflows::contract::{APPROVAL_SIGNAL, ApprovalDecision, OpFailure};
use keel_durable::{RunStatus, SignalReceipt};
use serde_json::Value;
use uuid::Uuid;

impl Ops {
    /// Cancels operation `id` of the caller's organization.
    ///
    /// What a cancel does depends on how far the operation got:
    /// - **no transaction queued yet** (queued behind another operation, waiting for an
    ///   approval, or before its first write): the operation ends `cancelled` and nothing
    ///   reaches the chain;
    /// - **a transaction queued but not signed** (waiting in the queue or for funding): the
    ///   request is withdrawn (verdict `WITHDRAWN`) and the operation ends `cancelled`;
    /// - **a transaction signed** (it may already be in a node's pool): it cannot be
    ///   unsent. The cancel is recorded (`cancelRequestedAt`), no further write of the
    ///   operation is queued, and the operation runs to that transaction's verdict: it
    ///   may still complete (a token operation whose only write landed) or end
    ///   `cancelled` before its next write (an asset creation);
    /// - in every case `milestones.confirmed` lists the writes that landed, and a
    ///   `cancelled` operation's `error` says how many did.
    ///
    /// Repeating a cancel is harmless (the current view again).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::OperationEnded`] when it is `completed`,
    /// `failed` or `cancelled`; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn cancel(&self, caller: Caller, id: Uuid) -> Result<OperationView> {
        let actor = self.actor(caller).await?;
        self.cancel_by(caller, id, &actor).await
    }

    /// [`Ops::cancel`] recorded by `actor` instead of the caller's key: for `keel ops
    /// cancel`, which acts in the operation's organization (`caller`) but is an
    /// operator's decision (`Actor::system("operator-cli")`).
    ///
    /// # Errors
    /// As [`Ops::cancel`].
    pub async fn cancel_by(
        &self,
        caller: Caller,
        id: Uuid,
        actor: &keel_durable::Actor,
    ) -> Result<OperationView> {
        let op = self.operation_row(caller, id).await?;
        if let Some(instance) = op.instance_id {
            let status = self.engine.status(instance).await?.status;
            if matches!(
                status,
                RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
            ) {
                return Err(OpsError::OperationEnded);
            }
        }
        // Under the row lock: waits for a step that is queueing a write right now, so
        // its request is linked (and seen below) before the flag is set.
        store::operation_cancel_request(&self.db, id).await?;
        let chain_id = self.operation_chain(caller, &op).await?;
        let withdrawal = keel_txq::withdraw_by_key_prefix(
            &self.db,
            chain_id,
            &format!("op/{id}/"),
            Some(&self.verdict_sink()),
        )
        .await
        .map_err(txq_err)?;
        if let Some(instance) = op.instance_id
            && withdrawal.in_flight.is_empty()
        {
            match self.engine.cancel_as(instance, actor).await {
                Ok(_) | Err(keel_durable::DurableError::InstanceEnded { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(
            target: "keel::ops",
            operation = %id,
            withdrawn = withdrawal.withdrawn.len(),
            in_flight = withdrawal.in_flight.len(),
            "operation cancel recorded"
        );
        self.operation(caller, id).await
    }

    /// Approves (`approved = true`) or rejects operation `id`. The decision must come
    /// from another API key of the same organization than the request's; the first
    /// decision wins.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::ApprovalSameKey`];
    /// [`OpsError::ApprovalNotPending`] when the operation needs no approval, was
    /// decided already, or ended; [`OpsError::ApprovalExpired`] after its deadline;
    /// [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn decide_approval(
        &self,
        caller: Caller,
        id: Uuid,
        approved: bool,
    ) -> Result<OperationView> {
        let op = self.operation_row(caller, id).await?;
        let Some(instance) = op.instance_id else {
            return Err(OpsError::ApprovalNotPending);
        };
        // The input names an approval deadline when the operation waits for one.
        let input = match self.engine.input(instance).await {
            Ok(v) => v,
            Err(keel_durable::DurableError::InstanceNotFound(_)) => {
                return Err(OpsError::ApprovalNotPending);
            }
            Err(e) => return Err(e.into()),
        };
        if input.get("approvalTtlSeconds").is_none_or(Value::is_null) {
            return Err(OpsError::ApprovalNotPending);
        }
        // A failed instance would keep the signal for a retry; a decision after the
        // operation ended (expired, rejected, cancelled) is refused instead.
        let current = self.engine.status(instance).await?;
        let failure_code = current
            .error
            .as_ref()
            .and_then(|e| e.detail.as_ref())
            .and_then(|d| d.get("code"))
            .and_then(Value::as_str);
        if failure_code == Some("APPROVAL_EXPIRED") {
            return Err(OpsError::ApprovalExpired);
        }
        if matches!(
            current.status,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        ) {
            return Err(OpsError::ApprovalNotPending);
        }
        // The deadline passed but the timer has not run yet: a signal recorded now would
        // lose against the deadline (see `wait_signal`), so refuse it instead of
        // answering 202 for a decision without effect. Database clock, as the engine.
        if let Some(deadline) = current
            .wait
            .as_ref()
            .filter(|w| w.name.as_deref() == Some(APPROVAL_SIGNAL))
            .and_then(|w| w.deadline)
        {
            let now = store::database_now(&self.db).await?;
            if now >= deadline {
                return Err(OpsError::ApprovalExpired);
            }
        }
        if caller.api_key_id == op.api_key_id {
            return Err(OpsError::ApprovalSameKey);
        }
        let decision = ApprovalDecision {
            approved,
            api_key_id: caller.api_key_id,
        };
        match self
            .engine
            .signal_as(
                instance,
                APPROVAL_SIGNAL,
                crate::ops::view::APPROVAL_DEDUPE_KEY,
                &decision,
                &self
                    .actor(caller)
                    .await?
                    .with_reason(crate::ops::view::approval_reason(approved)),
            )
            .await
        {
            Ok(SignalReceipt::Recorded) => {}
            Ok(SignalReceipt::Duplicate) => return Err(OpsError::ApprovalNotPending),
            Err(keel_durable::DurableError::InstanceEnded { .. }) => {
                return Err(OpsError::ApprovalNotPending);
            }
            Err(e) => return Err(e.into()),
        }
        self.operation(caller, id).await
    }

    /// Retries a `failed` operation (or hurries a `suspended` one): its workflow replays
    /// its journal, so every step with a recorded result — a landed transaction
    /// included — is not run again; it resumes at the first step without one.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::NotRetryable`] when the operation is not
    /// `failed` or `suspended`; [`OpsError::FailureNotRetryable`] when it failed with a
    /// code a retry cannot change; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn retry(&self, caller: Caller, id: Uuid) -> Result<OperationView> {
        let op = self.operation_row(caller, id).await?;
        let instance = op.instance_id.ok_or(OpsError::NotRetryable)?;
        let current = self.engine.status(instance).await?;
        if !matches!(current.status, RunStatus::Failed | RunStatus::Suspended) {
            return Err(OpsError::NotRetryable);
        }
        if current.status == RunStatus::Failed
            && let Some(e) = &current.error
        {
            // The workflow's typed failure says whether a retry can help; an engine-level
            // failure carries its own flag.
            let typed: Option<OpFailure> = e
                .detail
                .clone()
                .and_then(|d| serde_json::from_value(d).ok());
            let (code, retryable) = match typed {
                Some(f) => (f.code, f.retryable),
                None => (e.code.clone(), e.retryable),
            };
            if !retryable {
                return Err(OpsError::FailureNotRetryable { code });
            }
        }
        // Counted before the engine's retry, so the replay that the retry starts sees it
        // (in the workflow's retry gate, `workflows::send`).
        store::operation_retries_increment(&self.db, id).await?;
        let actor = self.actor(caller).await?;
        match self.engine.retry_as(instance, &actor).await {
            Ok(()) => {}
            Err(
                keel_durable::DurableError::NotRetryable { .. }
                | keel_durable::DurableError::InstanceEnded { .. },
            ) => return Err(OpsError::NotRetryable),
            Err(e) => return Err(e.into()),
        }
        self.operation(caller, id).await
    }
}
