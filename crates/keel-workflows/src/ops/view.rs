//! The operation view (`GET /v1/operations/{id}`) and its projection from the stored
//! rows: the operation row, its instance's status and its linked queue requests.
//!
//! Rust names here follow the crate's vocabulary: a [`TxMilestone::link`] and a
//! [`WaitView::link`] are the operation's links to its queue requests (`<write>` or
//! `<write>#<attempt>`), which the wire format calls `step`.

use crate::error::{OpsError, Result};
use crate::ops::read::txq_err;
use crate::ops::{MAX_WAIT, Ops};
use crate::store::{self, OperationRow};
use crate::tenancy::Caller;
use crate::workflows::contract::{APPROVAL_SIGNAL, OpFailure, TX_SIGNAL_PREFIX};
use alloy::primitives::B256;
use chrono::{DateTime, Utc};
use keel_durable::{InstanceStatus, RunStatus};
use keel_txq::{RequestState, RequestView, SettlementVerdict};
use serde_json::Value;
use std::time::Duration;
use uuid::Uuid;

/// The state of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationState {
    /// Accepted; waits behind another operation of its asset (see
    /// [`OperationView::queued_behind`]).
    Queued,
    /// Accepted and being worked on (also: accepted, its instance not started yet).
    Running,
    /// Waiting for something outside Keel (see [`OperationView::wait`]).
    Waiting,
    /// Stopped on a transient failure; resumes by itself.
    Suspended,
    /// Ended successfully.
    Completed,
    /// Ended with a failure.
    Failed,
    /// Ended by cancellation.
    Cancelled,
}

impl OperationState {
    /// Whether the operation has ended (`completed`, `failed`, `cancelled`).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The lowercase name (`queued`, `running`, ...), as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Suspended => "suspended",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The status of an operation (`GET /v1/operations/{id}`).
#[derive(Debug, Clone, PartialEq)]
pub struct OperationView {
    /// Operation id.
    pub id: Uuid,
    /// `asset.create`, `asset.mint`, `asset.transfer`, `asset.pause`, `asset.unpause`,
    /// `asset.burn`, `asset.grant-role`, `asset.revoke-role`.
    pub kind: String,
    /// The asset.
    pub asset_id: Uuid,
    /// The state; `Queued` comes with [`OperationView::queued_behind`].
    pub state: OperationState,
    /// For a `queued` operation: the operation of the same asset it waits behind.
    pub queued_behind: Option<Uuid>,
    /// What a `waiting` operation waits for.
    pub wait: Option<WaitView>,
    /// When a cancel was requested (`POST /v1/operations/{id}/cancel`), if one was. A
    /// cancel cannot unsend a transaction that was already signed: such an operation
    /// runs to that transaction's verdict (and may still complete); `milestones.confirmed`
    /// always lists what landed.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// The four milestones.
    pub milestones: Milestones,
    /// The workflow's last progress snapshot.
    pub progress: Option<Value>,
    /// The result of a completed operation.
    pub result: Option<Value>,
    /// The failure of a failed operation (or the transient reason while suspended).
    pub error: Option<ErrorView>,
}

impl OperationView {
    /// Whether the operation has ended (`completed`, `failed`, `cancelled`); `queued`,
    /// `running`, `waiting` and `suspended` have not.
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }
}

/// What a waiting operation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitFor {
    /// An approval decision.
    Approval,
    /// A transaction's settlement.
    Transaction,
    /// Gas funds for the sender.
    Funding,
    /// A timer.
    Timer,
}

/// The wait of a waiting operation.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitView {
    /// What it waits for.
    pub waits_for: WaitFor,
    /// The deadline, when there is one: the approval deadline, the funding deadline (after
    /// it the transaction fails `FUNDING_DEADLINE_EXPIRED`), or the timer's fire time.
    pub until: Option<DateTime<Utc>>,
    /// The link whose transaction it waits for (wire name `step`).
    pub link: Option<String>,
    /// For a transaction wait: the error class of the last broadcast of that
    /// transaction that no node accepted (`internal`, `unavailable`, `rate_limited`,
    /// `nonce_too_high`, ...), while the transaction is unsettled; `None` when every
    /// broadcast went through so far.
    pub last_broadcast_error: Option<String>,
}

/// Accepted → submitted → confirmed → indexed.
#[derive(Debug, Clone, PartialEq)]
pub struct Milestones {
    /// When the operation was accepted.
    pub accepted: DateTime<Utc>,
    /// Every transaction signed (and, when `broadcast`, submitted), by link.
    pub submitted: Vec<TxMilestone>,
    /// Every transaction confirmed, by link.
    pub confirmed: Vec<TxMilestone>,
    /// The index block that reflects the operation, once read-after-write passed.
    pub indexed: Option<IndexedMilestone>,
}

/// A transaction of an operation.
#[derive(Debug, Clone, PartialEq)]
pub struct TxMilestone {
    /// The link (`create-feed`, `deploy-token`, `mint`, `mint#2`, ...; wire name `step`).
    pub link: String,
    /// The transaction hash (latest attempt; the mined one once confirmed).
    pub tx_hash: Option<B256>,
    /// The nonce.
    pub nonce: Option<u64>,
    /// Whether a node accepted it.
    pub broadcast: bool,
    /// The block, once confirmed.
    pub block: Option<u64>,
}

/// The indexed milestone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexedMilestone {
    /// The index block.
    pub block: u64,
}

/// A failure as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorView {
    /// Stable code (`EXECUTION_REVERTED`, `APPROVAL_EXPIRED`, `GAS_REQUIRED`, ...).
    pub code: String,
    /// Whether a retry can help.
    pub retryable: bool,
    /// Value-free description.
    pub detail: String,
    /// The decoded revert reason, when a transaction reverted.
    pub reason: Option<String>,
}

/// The view state of an instance status.
fn view_state(s: RunStatus) -> OperationState {
    match s {
        RunStatus::Pending | RunStatus::Running => OperationState::Running,
        RunStatus::Waiting => OperationState::Waiting,
        RunStatus::Suspended => OperationState::Suspended,
        RunStatus::Completed => OperationState::Completed,
        RunStatus::Failed => OperationState::Failed,
        RunStatus::Cancelled => OperationState::Cancelled,
        _ => OperationState::Running,
    }
}

/// One linked queue request of an operation: its link and the queue's view of it
/// ([`keel_txq::requests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedRequest {
    /// The link (`<write>` or `<write>#<attempt>`).
    pub link: String,
    /// The request as the queue reports it.
    pub request: RequestView,
}

/// The unsettled queue request of an operation, as a wait needs it.
struct Unsettled {
    link: String,
    state: RequestState,
    funding_deadline: Option<DateTime<Utc>>,
    last_broadcast_error: Option<String>,
}

/// Projects the view of operation `op` from its instance's `status` (none before the
/// instance started), its linked queue requests `txs` (in link order) and the
/// operation it is queued behind (when the instance is pending behind another of its
/// serialization key).
///
/// - `state`: `queued` when pending behind another operation, else the instance's
///   status (`running` before it started);
/// - `wait`: from the instance's wait: the approval signal → `approval`; a `tx.<link>`
///   signal → `funding` (deadline: the request's funding deadline) when that request
///   waits for funding, else `transaction` (with its last broadcast error); anything
///   else → `timer`;
/// - `milestones`: a request with a transaction hash is `submitted` (`broadcast` when
///   a node accepted it or it mined); a confirmed verdict is `confirmed` with its block;
///   `indexed` is the output's `indexedBlock`;
/// - `error`: the workflow's typed [`OpFailure`] (or the engine's error); a cancelled
///   operation without one says how many of its transactions landed.
pub fn project(
    op: &OperationRow,
    status: Option<&InstanceStatus>,
    txs: Vec<LinkedRequest>,
    queued_behind: Option<Uuid>,
) -> OperationView {
    let mut submitted = Vec::new();
    let mut confirmed = Vec::new();
    let mut unsettled: Option<Unsettled> = None;
    for LinkedRequest { link, request: t } in txs {
        let verdict = t.verdict;
        let (mined_tx_hash, block) = match &verdict {
            Some(SettlementVerdict::Confirmed {
                hash: tx_hash,
                block,
                ..
            })
            | Some(SettlementVerdict::Reverted {
                hash: tx_hash,
                block,
                ..
            }) => (Some(*tx_hash), Some(*block)),
            _ => (None, None),
        };
        let tx_hash = mined_tx_hash.or(t.last_hash);
        let nonce = t.nonce;
        if t.state != RequestState::Settled {
            unsettled = Some(Unsettled {
                link: link.clone(),
                state: t.state,
                funding_deadline: t.funding_deadline,
                last_broadcast_error: t.last_broadcast_error.clone(),
            });
        }
        if tx_hash.is_some() {
            submitted.push(TxMilestone {
                link: link.clone(),
                tx_hash,
                nonce,
                broadcast: t.state == RequestState::Broadcast || block.is_some(),
                block: None,
            });
        }
        if matches!(verdict, Some(SettlementVerdict::Confirmed { .. })) {
            confirmed.push(TxMilestone {
                link,
                tx_hash,
                nonce,
                broadcast: true,
                block,
            });
        }
    }
    let queued_behind = queued_behind.filter(|_| {
        status.is_some_and(|s| s.status == RunStatus::Pending && s.queued_behind.is_some())
    });
    let state = if queued_behind.is_some() {
        OperationState::Queued
    } else {
        status
            .map(|s| view_state(s.status))
            .unwrap_or(OperationState::Running)
    };
    let wait = status
        .and_then(|s| s.wait.as_ref())
        .filter(|_| state == OperationState::Waiting)
        .map(|w| {
            let name = w.name.as_deref().unwrap_or("");
            if name == APPROVAL_SIGNAL {
                WaitView {
                    waits_for: WaitFor::Approval,
                    until: w.deadline,
                    link: None,
                    last_broadcast_error: None,
                }
            } else if let Some(link) = name.strip_prefix(TX_SIGNAL_PREFIX) {
                let pending = unsettled.as_ref().filter(|u| u.link == link);
                match pending {
                    Some(u) if u.state == RequestState::WaitingFunding => WaitView {
                        waits_for: WaitFor::Funding,
                        until: u.funding_deadline,
                        link: Some(link.to_owned()),
                        last_broadcast_error: None,
                    },
                    _ => WaitView {
                        waits_for: WaitFor::Transaction,
                        until: w.deadline,
                        link: Some(link.to_owned()),
                        last_broadcast_error: pending.and_then(|u| u.last_broadcast_error.clone()),
                    },
                }
            } else {
                WaitView {
                    waits_for: WaitFor::Timer,
                    until: w.deadline,
                    link: None,
                    last_broadcast_error: None,
                }
            }
        });
    let indexed = status
        .and_then(|s| s.output.as_ref())
        .and_then(|o| o.get("indexedBlock"))
        .and_then(Value::as_u64)
        .map(|block| IndexedMilestone { block });
    let landed = confirmed.len();
    let cancelled = status.is_some_and(|s| s.status == RunStatus::Cancelled);
    let error = status.and_then(|s| s.error.as_ref()).map(|e| {
        let typed: Option<OpFailure> = e
            .detail
            .clone()
            .and_then(|d| serde_json::from_value(d).ok());
        match typed {
            Some(f) => ErrorView {
                code: f.code,
                retryable: f.retryable,
                detail: f.detail,
                reason: f.reason,
            },
            None => ErrorView {
                code: e.code.clone(),
                retryable: e.retryable,
                detail: e.message.clone(),
                reason: None,
            },
        }
    });
    // A cancelled operation always says whether any of its writes landed.
    let error = error.or_else(|| {
        cancelled.then(|| ErrorView {
            code: "CANCELLED".to_owned(),
            retryable: false,
            detail: if landed == 0 {
                "the operation was cancelled; none of its transactions landed".to_owned()
            } else {
                format!(
                    "the operation was cancelled after {landed} of its transactions had landed (see milestones.confirmed)"
                )
            },
            reason: None,
        })
    });
    OperationView {
        id: op.id,
        kind: op.kind.clone(),
        asset_id: op.asset_id,
        state,
        queued_behind,
        wait,
        cancel_requested_at: op.cancel_requested_at,
        milestones: Milestones {
            accepted: op.created_at,
            submitted,
            confirmed,
            indexed,
        },
        progress: status.and_then(|s| s.progress.clone()),
        result: status.and_then(|s| s.output.clone()),
        error,
    }
}

impl Ops {
    /// The queue requests operation `operation_id` linked, in link order, as the
    /// transaction queue reports them.
    ///
    /// # Errors
    /// [`OpsError::Store`] (the database failed or a stored verdict did not decode).
    pub async fn linked_requests(&self, operation_id: Uuid) -> Result<Vec<LinkedRequest>> {
        let links = store::operation_tx_links(&self.db, operation_id).await?;
        let ids: Vec<Uuid> = links.iter().map(|l| l.txq_request_id).collect();
        let mut requests = keel_txq::requests(&self.db, &ids)
            .await
            .map_err(txq_err)?
            .into_iter();
        // `requests` keeps the order of `ids` and every linked request exists (the
        // link references it).
        Ok(links
            .into_iter()
            .filter_map(|l| {
                let request = requests.find(|r| r.id == l.txq_request_id)?;
                Some(LinkedRequest {
                    link: l.link,
                    request,
                })
            })
            .collect())
    }

    /// The status of operation `id` of the caller's organization.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`] /
    /// [`OpsError::Engine`].
    pub async fn operation(&self, caller: Caller, id: Uuid) -> Result<OperationView> {
        let op = self.operation_row(caller, id).await?;
        let status = match op.instance_id {
            Some(instance) => Some(self.engine.status(instance).await?),
            None => None,
        };
        let txs = self.linked_requests(op.id).await?;
        let queued_behind = match status.as_ref().and_then(|s| s.queued_behind) {
            Some(instance) => store::operation_id_by_instance(&self.db, instance).await?,
            None => None,
        };
        Ok(project(&op, status.as_ref(), txs, queued_behind))
    }

    /// Waits up to `wait` (capped at [`MAX_WAIT`]) for operation `id` to end; returns
    /// its status either way.
    ///
    /// # Errors
    /// As [`Ops::operation`].
    pub async fn operation_wait(
        &self,
        caller: Caller,
        id: Uuid,
        wait: Duration,
    ) -> Result<OperationView> {
        let op = self.operation_row(caller, id).await?;
        // Woken by the engine's notification when the instance ends (no poll here).
        if let Some(instance) = op.instance_id {
            self.engine
                .await_terminal(instance, wait.min(MAX_WAIT))
                .await?;
        }
        self.operation(caller, id).await
    }

    /// The row of operation `id` of the caller's organization.
    pub(crate) async fn operation_row(&self, caller: Caller, id: Uuid) -> Result<OperationRow> {
        store::operation_get(&self.db, caller.organization_id, id)
            .await?
            .ok_or(OpsError::NotFound { what: "operation" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_durable::{WaitDescription, WaitKind};

    fn op_row() -> OperationRow {
        OperationRow {
            id: Uuid::new_v4(),
            kind: "asset.mint".into(),
            asset_id: Uuid::new_v4(),
            request_sha256: vec![],
            api_key_id: Uuid::new_v4(),
            instance_id: Some(Uuid::new_v4()),
            created_at: Utc::now(),
            cancel_requested_at: None,
        }
    }

    fn instance(status: RunStatus, wait: Option<&str>) -> InstanceStatus {
        InstanceStatus {
            id: Uuid::new_v4(),
            workflow: "asset.mint".into(),
            status,
            progress: None,
            wait: wait.map(|name| WaitDescription {
                kind: WaitKind::Signal,
                name: Some(name.to_owned()),
                deadline: None,
            }),
            output: None,
            error: None,
            created_at: Utc::now(),
            ended_at: None,
            cancel_requested_at: None,
            queued_behind: None,
        }
    }

    fn tx(state: RequestState, verdict: Option<SettlementVerdict>) -> LinkedRequest {
        LinkedRequest {
            link: "mint".into(),
            request: RequestView {
                id: Uuid::new_v4(),
                state,
                nonce: Some(3),
                verdict,
                last_hash: Some(B256::repeat_byte(7)),
                funding_deadline: None,
                last_broadcast_error: None,
            },
        }
    }

    /// A transaction wait shows the last broadcast error class of the unsettled request;
    /// a funding wait shows the funding deadline in `until`.
    #[test]
    fn transaction_and_funding_waits_carry_their_error_class_and_deadline() {
        let status = instance(RunStatus::Waiting, Some("tx.mint"));
        let mut signed = tx(RequestState::Signed, None);
        signed.request.last_broadcast_error = Some("internal".into());
        let view = project(&op_row(), Some(&status), vec![signed], None);
        let wait = view.wait.unwrap();
        assert_eq!(wait.waits_for, WaitFor::Transaction);
        assert_eq!(wait.link.as_deref(), Some("mint"));
        assert_eq!(wait.last_broadcast_error.as_deref(), Some("internal"));

        let deadline = Utc::now() + chrono::Duration::seconds(600);
        let mut funding = tx(RequestState::WaitingFunding, None);
        funding.request.funding_deadline = Some(deadline);
        let view = project(&op_row(), Some(&status), vec![funding], None);
        let wait = view.wait.unwrap();
        assert_eq!(wait.waits_for, WaitFor::Funding);
        assert_eq!(wait.until, Some(deadline));
    }

    /// A pending instance blocked by another of its key reads `queued` with the blocking
    /// operation; a pending one that is not blocked reads `running`.
    #[test]
    fn a_blocked_pending_operation_reads_queued_behind_the_blocker() {
        let blocker = Uuid::new_v4();
        let mut status = instance(RunStatus::Pending, None);
        status.queued_behind = Some(Uuid::new_v4());
        let view = project(&op_row(), Some(&status), vec![], Some(blocker));
        assert_eq!(view.state, OperationState::Queued);
        assert_eq!(view.queued_behind, Some(blocker));
        status.queued_behind = None;
        let view = project(&op_row(), Some(&status), vec![], None);
        assert_eq!(view.state, OperationState::Running);
        assert_eq!(view.queued_behind, None);
    }

    /// A cancelled operation always says how many of its writes landed.
    #[test]
    fn a_cancelled_operation_says_what_landed() {
        let status = instance(RunStatus::Cancelled, None);
        let view = project(&op_row(), Some(&status), vec![], None);
        let e = view.error.unwrap();
        assert_eq!(e.code, "CANCELLED");
        assert!(e.detail.contains("none"), "{}", e.detail);
        let confirmed = SettlementVerdict::Confirmed {
            block: 9,
            hash: B256::repeat_byte(7),
            gas_used: 21_000,
            effective_gas_price: "1".into(),
            attempts: vec![],
        };
        let view = project(
            &op_row(),
            Some(&status),
            vec![tx(RequestState::Settled, Some(confirmed))],
            None,
        );
        assert_eq!(view.state, OperationState::Cancelled);
        assert_eq!(view.milestones.confirmed.len(), 1);
        assert_eq!(view.milestones.confirmed[0].block, Some(9));
        assert_eq!(
            view.milestones.confirmed[0].tx_hash,
            Some(B256::repeat_byte(7))
        );
        let e = view.error.unwrap();
        assert!(
            e.detail.contains("after 1 of its transactions"),
            "{}",
            e.detail
        );
    }
}
