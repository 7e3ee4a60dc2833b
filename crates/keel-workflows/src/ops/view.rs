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
use crate::workflows::contract::{APPROVAL_SIGNAL, CANCELLED, OpFailure, TX_SIGNAL_PREFIX};
use alloy::primitives::B256;
use chrono::{DateTime, Utc};
use keel_durable::{Actor, ActorKind, Attribution, InstanceStatus, RunStatus};
use keel_txq::{FailureCode, RequestState, RequestView, SettlementVerdict};
use serde_json::Value;
use std::time::Duration;
use uuid::Uuid;

/// The view's error code for a write whose settled verdict a reorg took back for good
/// (the queue's `REORGED_OUT` verdict, issue 32 §10).
pub const REORGED_OUT: &str = "REORGED_OUT";

/// The state of an operation. Serialized (the webhook mark) as [`OperationState::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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
    /// The kind (`asset.create`, `asset.mint`, ...: [`crate::OperationKind::ALL`]).
    pub kind: crate::kinds::OperationKind,
    /// The asset; `None` for an operation on no asset (`organization.system`).
    pub asset_id: Option<Uuid>,
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
    /// When the operation was accepted (database clock; also `milestones.accepted`).
    pub created_at: DateTime<Utc>,
    /// When anything the view shows last changed: the operation row (a cancel), its
    /// workflow instance (state, wait, progress) or one of its queue requests.
    pub updated_at: DateTime<Utc>,
    /// When it reached its current terminal state (`completed`, `failed`,
    /// `cancelled`); `None` while it has not (a retried failure clears it).
    pub completed_at: Option<DateTime<Utc>>,
    /// Who started, approved or rejected, and cancelled it, and when: filled by
    /// [`Ops::operation`] (the single-operation read) from the engine's recorded
    /// commands; `None` in lists and events.
    pub attribution: Option<OperationAttribution>,
    /// The code version of the workflow the operation's instance is pinned to
    /// ([`keel_durable::Workflow::VERSION`] of the release that started it); `None`
    /// before its instance exists or is pinned (docs/versioning.md).
    pub workflow_version: Option<u32>,
    /// True while the operation is not terminal and no live runner can run its
    /// workflow version: it waits, deferred (not failed), for a runner that knows
    /// version [`OperationView::workflow_version`].
    pub awaiting_runner: bool,
}

/// A recorded decision of an operation and who made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedBy {
    /// Who (taken from the caller's authenticated context when it was recorded).
    pub actor: Actor,
    /// When it was recorded (database clock).
    pub at: DateTime<Utc>,
}

/// An approval decision and who made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRecord {
    /// Approved (`true`) or rejected.
    pub approved: bool,
    /// Who decided, and when.
    pub by: RecordedBy,
}

/// Who asked for what on an operation (issue 23, "Actor attribution").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OperationAttribution {
    /// Who started it (the key that posted the request).
    pub started: Option<RecordedBy>,
    /// The approval decision, once one was recorded.
    pub approval: Option<ApprovalRecord>,
    /// Who cancelled it, when a cancel reached its workflow.
    pub cancelled: Option<RecordedBy>,
    /// Who retried it, oldest first.
    pub retried: Vec<RecordedBy>,
}

/// The actor reason an approval signal is recorded with: `approve` or `reject` (the
/// route the approving key called, never the payload).
pub(crate) fn approval_reason(approved: bool) -> &'static str {
    if approved { "approve" } else { "reject" }
}

impl OperationAttribution {
    /// From the engine's record of the operation's instance: its START, the approval
    /// signal (dedupe key `approval-decision`), its CANCEL and RETRY commands. System
    /// retries (recovery after a suspension) are not listed.
    pub fn from_engine(a: &Attribution) -> Self {
        let by = |actor: &Actor, at: DateTime<Utc>| RecordedBy {
            actor: actor.clone(),
            at,
        };
        Self {
            started: a.start().map(|c| by(&c.actor, c.recorded_at)),
            approval: a.signal(APPROVAL_DEDUPE_KEY).map(|s| ApprovalRecord {
                approved: s.actor.reason() == Some(approval_reason(true)),
                by: by(&s.actor, s.recorded_at),
            }),
            cancelled: a.cancel().map(|c| by(&c.actor, c.recorded_at)),
            retried: a
                .commands
                .iter()
                .filter(|c| c.kind == "retry" && c.actor.kind() != ActorKind::System)
                .map(|c| by(&c.actor, c.recorded_at))
                .collect(),
        }
    }
}

/// The dedupe key of an operation's approval signal (the first decision wins).
pub(crate) const APPROVAL_DEDUPE_KEY: &str = "approval-decision";

impl OperationView {
    /// Whether the operation has ended (`completed`, `failed`, `cancelled`); `queued`,
    /// `running`, `waiting` and `suspended` have not.
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }
}

/// What a waiting operation waits for. Serialized (the webhook mark) as
/// [`WaitFor::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitFor {
    /// An approval decision.
    Approval,
    /// A transaction's settlement.
    Transaction,
    /// Gas funds for the sender.
    Funding,
    /// A timer.
    Timer,
    /// A custody sender's transaction waits for an approval at the custody provider
    /// (`PENDING_AUTHORIZATION`, third-party manual approval); decided there, not in Keel.
    CustodyApproval,
    /// A runner that knows the operation's workflow version
    /// ([`OperationView::workflow_version`]): no live runner can run it (a release was
    /// rolled back). It is deferred, not failed, and does not hold its asset's queue.
    Runner,
    /// A paused distribution waits for `POST /v1/distributions/{id}/resume`.
    Resume,
}

impl WaitFor {
    /// The wire name (`approval`, `transaction`, `funding`, `timer`,
    /// `custody_approval`, `runner`, `resume`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approval => "approval",
            Self::Transaction => "transaction",
            Self::Funding => "funding",
            Self::Timer => "timer",
            Self::CustodyApproval => "custody_approval",
            Self::Runner => "runner",
            Self::Resume => "resume",
        }
    }
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
    /// For a transaction of a custody sender: the provider's last status (Fireblocks
    /// name, `PENDING_AUTHORIZATION`, `QUEUED`, `CONFIRMING`, ...) and sub-status, and
    /// the provider's transaction id; `None` for local-key senders.
    pub custody: Option<CustodyWait>,
}

/// What a wait shows of a custody submission ([`WaitView::custody`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustodyWait {
    /// The provider's bounded name (`fireblocks`).
    pub provider: String,
    /// The provider's transaction id, once known.
    pub provider_tx_id: Option<String>,
    /// The provider's last status, once read.
    pub status: Option<String>,
    /// The provider's last sub-status, when given.
    pub sub_status: Option<String>,
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
    /// The block it mined in, once the queue recorded its receipt (confirmed or
    /// reverted).
    pub block: Option<u64>,
    /// When a node first accepted the transaction (`None` while no node has).
    pub broadcast_at: Option<DateTime<Utc>>,
    /// When the queue recorded its confirmation (the receipt at its confirmation
    /// depth), once confirmed.
    pub confirmed_at: Option<DateTime<Utc>>,
}

/// The indexed milestone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexedMilestone {
    /// The index block.
    pub block: u64,
    /// When the read-after-write passed: the operation's completion (its last step).
    pub at: Option<DateTime<Utc>>,
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

/// What the operator must do for a suspension code that needs one, in place of the
/// engine's generic "recovery is scheduled": `INDEX_DEGRADED` (the read-after-write
/// waits for a chain whose Ledger Index is marked degraded).
fn operator_detail(code: &str) -> Option<&'static str> {
    match code {
        "INDEX_DEGRADED" => Some(
            "the chain's Ledger Index is degraded (a reorg replaced a block Keel had recorded \
             as finalized) and will not reach this operation's block until an operator \
             re-indexes the chain: `keel index reindex --chain NAME` or \
             `POST /v1/chains/{chainId}/index/reindex`; the operation then resumes by \
             itself (or retry it)",
        ),
        _ => None,
    }
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
    custody: Option<keel_txq::CustodyView>,
}

/// Projects the view of operation `op` from its instance's `status` (none before the
/// instance started), its linked queue requests `txs` (in link order) and the
/// operation it is queued behind (when the instance is pending behind another of its
/// serialization key).
///
/// - `state`: `queued` when pending behind another operation, else the instance's
///   status (`running` before it started);
/// - `wait`: from the instance's wait: the approval signal → `approval`; a paused
///   distribution's resume signal → `resume`; a `tx.<link>`
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
    let mut custody_cancels: Vec<(String, String)> = Vec::new();
    let mut reorged_out: Vec<String> = Vec::new();
    let mut updated_at = op
        .created_at
        .max(op.cancel_requested_at.unwrap_or(op.created_at));
    if let Some(s) = status {
        updated_at = updated_at.max(s.updated_at);
    }
    for LinkedRequest { link, request: t } in txs {
        updated_at = updated_at.max(t.updated_at);
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
                custody: t.custody.clone(),
            });
        }
        if let Some(c) = &t.custody
            && c.status.as_deref() == Some("CANCELLED")
        {
            custody_cancels.push((
                c.provider.clone(),
                c.provider_tx_id.clone().unwrap_or_default(),
            ));
        }
        if let Some(SettlementVerdict::Failed {
            code: FailureCode::ReorgedOut,
            ..
        }) = &verdict
        {
            reorged_out.push(link.clone());
        }
        let is_confirmed = matches!(verdict, Some(SettlementVerdict::Confirmed { .. }));
        let confirmed_at = t.settled_at.filter(|_| is_confirmed);
        if tx_hash.is_some() {
            submitted.push(TxMilestone {
                link: link.clone(),
                tx_hash,
                nonce,
                broadcast: t.state == RequestState::Broadcast || block.is_some(),
                block,
                broadcast_at: t.broadcast_at,
                confirmed_at,
            });
        }
        if is_confirmed {
            confirmed.push(TxMilestone {
                link,
                tx_hash,
                nonce,
                broadcast: true,
                block,
                broadcast_at: t.broadcast_at,
                confirmed_at,
            });
        }
    }
    let queued_behind = queued_behind.filter(|_| {
        status.is_some_and(|s| s.status == RunStatus::Pending && s.queued_behind.is_some())
    });
    // An operation deferred by its version (runners of its workflow are live, none knows
    // its version: a release was rolled back) that no segment holds waits for a runner,
    // and says so: `waiting` with `for: runner`, not `running` with no wait.
    let awaiting_runner = status.is_some_and(|s| {
        s.version_deferred && matches!(s.status, RunStatus::Pending | RunStatus::Running)
    });
    let state = if awaiting_runner {
        OperationState::Waiting
    } else if queued_behind.is_some() {
        OperationState::Queued
    } else {
        status
            .map(|s| view_state(s.status))
            .unwrap_or(OperationState::Running)
    };
    let runner_wait = awaiting_runner.then_some(WaitView {
        waits_for: WaitFor::Runner,
        until: None,
        link: None,
        last_broadcast_error: None,
        custody: None,
    });
    let wait = status
        .and_then(|s| s.wait.as_ref())
        .filter(|_| state == OperationState::Waiting && !awaiting_runner)
        .map(|w| {
            let name = w.name.as_deref().unwrap_or("");
            if name == APPROVAL_SIGNAL {
                WaitView {
                    waits_for: WaitFor::Approval,
                    until: w.deadline,
                    link: None,
                    last_broadcast_error: None,
                    custody: None,
                }
            } else if name == crate::workflows::distribution::RESUME_SIGNAL {
                WaitView {
                    waits_for: WaitFor::Resume,
                    until: None,
                    link: None,
                    last_broadcast_error: None,
                    custody: None,
                }
            } else if let Some(link) = name.strip_prefix(TX_SIGNAL_PREFIX) {
                let pending = unsettled.as_ref().filter(|u| u.link == link);
                let custody = pending.and_then(|u| u.custody.as_ref());
                let custody_wait = custody.map(|c| CustodyWait {
                    provider: c.provider.clone(),
                    provider_tx_id: c.provider_tx_id.clone(),
                    status: c.status.clone(),
                    sub_status: c.sub_status.clone(),
                });
                match pending {
                    Some(u) if u.state == RequestState::WaitingFunding => WaitView {
                        waits_for: WaitFor::Funding,
                        until: u.funding_deadline,
                        link: Some(link.to_owned()),
                        last_broadcast_error: None,
                        custody: None,
                    },
                    _ if custody.is_some_and(|c| c.awaiting_approval) => WaitView {
                        waits_for: WaitFor::CustodyApproval,
                        until: w.deadline,
                        link: Some(link.to_owned()),
                        last_broadcast_error: None,
                        custody: custody_wait,
                    },
                    _ => WaitView {
                        waits_for: WaitFor::Transaction,
                        until: w.deadline,
                        link: Some(link.to_owned()),
                        last_broadcast_error: pending.and_then(|u| u.last_broadcast_error.clone()),
                        custody: custody_wait,
                    },
                }
            } else {
                WaitView {
                    waits_for: WaitFor::Timer,
                    until: w.deadline,
                    link: None,
                    last_broadcast_error: None,
                    custody: None,
                }
            }
        });
    let indexed = status
        .and_then(|s| s.output.as_ref())
        .and_then(|o| o.get("indexedBlock"))
        .and_then(Value::as_u64)
        .map(|block| IndexedMilestone {
            block,
            at: status.and_then(|s| s.ended_at),
        });
    let wait = wait.or(runner_wait);
    let landed = confirmed.len();
    let landed_text = if landed == 0 {
        "none of its transactions landed".to_owned()
    } else {
        format!("{landed} of its transactions landed (see milestones.confirmed)")
    };
    let cancelled = status.is_some_and(|s| s.status == RunStatus::Cancelled);
    // A custody transaction of it that its provider cancelled (a cancel before signing
    // reaches the provider, issue 32 §5): the outcome names it.
    let custody_cancelled = custody_cancels
        .iter()
        .map(|(provider, id)| {
            format!("; its {provider} transaction {id} was cancelled at the provider")
        })
        .collect::<String>();
    // The error is the outcome of the state the view shows: a running or waiting
    // instance shows none (a previous attempt's error is stale once it runs again).
    let error = status
        .filter(|_| {
            matches!(
                state,
                OperationState::Failed | OperationState::Cancelled | OperationState::Suspended
            )
        })
        .and_then(|s| s.error.as_ref())
        .map(|e| {
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
                    detail: operator_detail(&e.code).unwrap_or(&e.message).to_owned(),
                    code: e.code.clone(),
                    retryable: e.retryable,
                    reason: None,
                },
            }
        });
    // One rule for every path (issue 32 §6): a cancelled or failed operation's error
    // says what landed. A cancelled one always reads `CANCELLED` (an error its instance
    // kept from before the cancel, e.g. the suspension `INDEX_BEHIND` "recovery is
    // scheduled", is no longer true and is named only as what it had stopped with); a
    // failed one keeps its code and says what landed after its detail.
    let error = if cancelled {
        let before = error
            .filter(|e| e.code != CANCELLED)
            .map(|e| format!(" (it had stopped with {})", e.code))
            .unwrap_or_default();
        Some(ErrorView {
            code: CANCELLED.to_owned(),
            retryable: false,
            detail: if landed == 0 {
                format!(
                    "the operation was cancelled{before}; none of its transactions landed{custody_cancelled}"
                )
            } else {
                format!(
                    "the operation was cancelled{before} after {landed} of its transactions had landed (see milestones.confirmed){custody_cancelled}"
                )
            },
            reason: None,
        })
    } else if state == OperationState::Failed {
        error.map(|e| ErrorView {
            detail: format!("{}; {landed_text}", e.detail),
            ..e
        })
    } else {
        error
    };
    // A write whose settled verdict a reorg took back for good (`REORGED_OUT`, issue 32
    // §10: another transaction took its nonce on the final chain) is absent from the
    // chain whatever the instance's state says: the view names it, whatever else it
    // shows. Keel re-sends nothing (docs/architecture.md): the caller decides.
    let error = if reorged_out.is_empty() || cancelled {
        error
    } else {
        let links = reorged_out.join(", ");
        Some(ErrorView {
            code: REORGED_OUT.to_owned(),
            retryable: false,
            detail: format!(
                "a reorg took back the transaction of {links} after its verdict and another \
                 transaction took its nonce on the final chain: its effect is absent; Keel \
                 does not re-send it (post the operation again with a new Idempotency-Key); \
                 {landed_text}"
            ),
            reason: None,
        })
    };
    OperationView {
        id: op.id,
        kind: op.kind,
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
        created_at: op.created_at,
        updated_at,
        completed_at: status
            .and_then(|s| s.ended_at)
            .filter(|_| state.is_terminal()),
        attribution: None,
        workflow_version: status.and_then(|s| s.version),
        awaiting_runner: status.is_some_and(|s| s.awaiting_runner),
    }
}

/// The keyset position of an operation in its lists: `(created_at, id)`.
pub type OperationKey = (DateTime<Utc>, Uuid);

impl OperationView {
    /// Its position in the operation lists ([`Ops::operations`]).
    pub fn key(&self) -> OperationKey {
        (self.created_at, self.id)
    }
}

/// The filters of [`Ops::operations`]; every one given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationFilter {
    /// Only operations in this state (as [`OperationView::state`] shows it).
    pub state: Option<OperationState>,
    /// Only this kind.
    pub kind: Option<crate::kinds::OperationKind>,
    /// Only operations of this asset.
    pub asset_id: Option<Uuid>,
    /// Only operations accepted strictly after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only operations accepted strictly before this instant.
    pub created_before: Option<DateTime<Utc>>,
}

/// One call's share of an operation list ([`Ops::operations`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OperationList {
    /// Matching operations in keyset order, at most `limit + 1` (an extra one only says
    /// that more follow).
    pub operations: Vec<OperationView>,
    /// Set when a `state` filter examined [`OPERATION_SCAN_BUDGET`] rows before it found
    /// `limit + 1` matches: the key of the last row examined. More may follow; the next
    /// call continues after it.
    pub resume_after: Option<OperationKey>,
}

/// Most operation rows one [`Ops::operations`] call examines for a `state` filter (the
/// state is the engine's, so it is matched on the rows of the other filters' index scan,
/// in batches of [`OPERATION_SCAN_BATCH`]).
pub const OPERATION_SCAN_BUDGET: usize = 1000;

/// Rows fetched per batch of a `state`-filtered scan.
pub const OPERATION_SCAN_BATCH: usize = 200;

/// The state a status shows before the blocker's operation is looked up (`queued` is
/// confirmed by [`project`]).
fn coarse_state(status: Option<&InstanceStatus>) -> OperationState {
    match status {
        Some(s) if s.status == RunStatus::Pending && s.queued_behind.is_some() => {
            OperationState::Queued
        }
        Some(s) => view_state(s.status),
        None => OperationState::Running,
    }
}

impl Ops {
    /// The caller's operations matching `filter`, oldest first (`(created_at, id)`),
    /// after the keyset position `after` (exclusive) when given: at most `limit + 1` of
    /// them, so the caller can tell whether more follow. Other organizations' operations
    /// are never read. Without a `state` filter this is one index range scan of
    /// `limit + 1` rows; with one, see [`OperationList::resume_after`].
    ///
    /// # Errors
    /// [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn operations(
        &self,
        caller: Caller,
        filter: &OperationFilter,
        after: Option<OperationKey>,
        limit: u32,
    ) -> Result<OperationList> {
        let want = limit as usize + 1;
        let sql = store::OperationListFilter {
            kind: filter.kind,
            asset_id: filter.asset_id,
            created_after: filter.created_after,
            created_before: filter.created_before,
        };
        let org = caller.organization_id;
        let Some(state) = filter.state else {
            let rows = store::operation_list(&self.db, org, &sql, after, want as i64).await?;
            return Ok(OperationList {
                operations: self.operation_views(rows, None).await?,
                resume_after: None,
            });
        };
        let mut operations = Vec::new();
        let mut cursor = after;
        let mut scanned = 0;
        loop {
            let batch = OPERATION_SCAN_BATCH
                .max(want - operations.len())
                .min(OPERATION_SCAN_BUDGET - scanned)
                .max(1);
            let rows = store::operation_list(&self.db, org, &sql, cursor, batch as i64).await?;
            let fetched = rows.len();
            scanned += fetched;
            if let Some(last) = rows.last() {
                cursor = Some((last.created_at, last.id));
            }
            operations.extend(self.operation_views(rows, Some(state)).await?);
            if operations.len() >= want || fetched < batch {
                operations.truncate(want);
                return Ok(OperationList {
                    operations,
                    resume_after: None,
                });
            }
            if scanned >= OPERATION_SCAN_BUDGET {
                return Ok(OperationList {
                    operations,
                    resume_after: cursor,
                });
            }
        }
    }

    /// The views of `rows` (in order), from batched reads: one engine status read, one
    /// read of their links, one queue read and one blocker lookup. With `state`, only
    /// the operations in that state (the others' links are not read).
    async fn operation_views(
        &self,
        rows: Vec<OperationRow>,
        state: Option<OperationState>,
    ) -> Result<Vec<OperationView>> {
        use std::collections::HashMap;
        let instances: Vec<Uuid> = rows.iter().filter_map(|r| r.instance_id).collect();
        let statuses: HashMap<Uuid, InstanceStatus> = self
            .engine
            .statuses(&instances)
            .await?
            .into_iter()
            .map(|s| (s.id, s))
            .collect();
        let status_of = |r: &OperationRow| r.instance_id.and_then(|i| statuses.get(&i));
        let rows: Vec<OperationRow> = rows
            .into_iter()
            .filter(|r| state.is_none_or(|w| coarse_state(status_of(r)) == w))
            .collect();
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let links = store::operation_tx_links_of(&self.db, &ids).await?;
        let request_ids: Vec<Uuid> = links.iter().map(|l| l.txq_request_id).collect();
        let requests: HashMap<Uuid, RequestView> = keel_txq::requests(&self.db, &request_ids)
            .await
            .map_err(txq_err)?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let blockers: Vec<Uuid> = rows
            .iter()
            .filter_map(|r| status_of(r).and_then(|s| s.queued_behind))
            .collect();
        let blocker_ops: HashMap<Uuid, Uuid> = if blockers.is_empty() {
            HashMap::new()
        } else {
            store::operation_ids_by_instances(&self.db, &blockers)
                .await?
                .into_iter()
                .collect()
        };
        let mut by_op: HashMap<Uuid, Vec<LinkedRequest>> = HashMap::new();
        for l in links {
            if let Some(request) = requests.get(&l.txq_request_id) {
                by_op
                    .entry(l.operation_id)
                    .or_default()
                    .push(LinkedRequest {
                        link: l.link,
                        request: request.clone(),
                    });
            }
        }
        Ok(rows
            .iter()
            .map(|r| {
                let status = status_of(r);
                let behind = status
                    .and_then(|s| s.queued_behind)
                    .and_then(|b| blocker_ops.get(&b).copied());
                project(r, status, by_op.remove(&r.id).unwrap_or_default(), behind)
            })
            .filter(|v| state.is_none_or(|w| v.state == w))
            .collect())
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
        let mut view = project(&op, status.as_ref(), txs, queued_behind);
        if let Some(instance) = op.instance_id {
            match self.engine.attribution(instance).await {
                Ok(a) => view.attribution = Some(OperationAttribution::from_engine(&a)),
                // Removed by retention between the two reads: no attribution to show.
                Err(keel_durable::DurableError::InstanceNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(view)
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

    /// Issue 32 §2: an operation suspended on a degraded chain's index says what the
    /// operator must do, not the engine's "recovery is scheduled".
    #[test]
    fn index_degraded_says_what_the_operator_must_do() {
        let detail = operator_detail("INDEX_DEGRADED").unwrap();
        assert!(detail.contains("keel index reindex"), "{detail}");
        assert!(detail.contains("/index/reindex"), "{detail}");
        assert_eq!(operator_detail("INDEX_BEHIND"), None);
    }

    fn op_row() -> OperationRow {
        OperationRow {
            id: Uuid::new_v4(),
            kind: crate::kinds::OperationKind::AssetMint,
            asset_id: Some(Uuid::new_v4()),
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
            updated_at: Utc::now(),
            ended_at: None,
            cancel_requested_at: None,
            queued_behind: None,
            version: Some(1),
            awaiting_runner: false,
            version_deferred: false,
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
                created_at: Utc::now(),
                updated_at: Utc::now(),
                broadcast_at: None,
                settled_at: (state == RequestState::Settled).then(Utc::now),
                final_at: None,
                custody: None,
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

    /// A custody transaction waiting for an approval at the provider is a wait of kind
    /// `custody_approval` with the provider's status; once the provider moved on it is a
    /// transaction wait that still shows the provider's status.
    #[test]
    fn a_custody_approval_at_the_provider_is_its_own_wait_kind() {
        let status = instance(RunStatus::Waiting, Some("tx.mint"));
        let custody = |st: &str, awaiting: bool| keel_txq::CustodyView {
            request_id: Uuid::new_v4(),
            provider: "fireblocks".into(),
            resubmission: 0,
            external_tx_id: "keel.x.0".into(),
            provider_tx_id: Some("p-1".into()),
            phase: "submitted".into(),
            status: Some(st.into()),
            sub_status: None,
            tx_hash: None,
            awaiting_approval: awaiting,
            budget_exceeded: false,
            polls: 1,
        };
        let mut waiting = tx(RequestState::Queued, None);
        waiting.request.custody = Some(custody("PENDING_AUTHORIZATION", true));
        let wait = project(&op_row(), Some(&status), vec![waiting], None)
            .wait
            .unwrap();
        assert_eq!(wait.waits_for, WaitFor::CustodyApproval);
        assert_eq!(wait.link.as_deref(), Some("mint"));
        let c = wait.custody.unwrap();
        assert_eq!(c.status.as_deref(), Some("PENDING_AUTHORIZATION"));
        assert_eq!(c.provider_tx_id.as_deref(), Some("p-1"));

        let mut moving = tx(RequestState::Queued, None);
        moving.request.custody = Some(custody("CONFIRMING", false));
        let wait = project(&op_row(), Some(&status), vec![moving], None)
            .wait
            .unwrap();
        assert_eq!(wait.waits_for, WaitFor::Transaction);
        assert_eq!(wait.custody.unwrap().status.as_deref(), Some("CONFIRMING"));

        // A local-key transaction has no custody detail.
        let wait = project(
            &op_row(),
            Some(&status),
            vec![tx(RequestState::Signed, None)],
            None,
        )
        .wait
        .unwrap();
        assert_eq!(wait.custody, None);
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

    fn confirmed() -> LinkedRequest {
        tx(
            RequestState::Settled,
            Some(SettlementVerdict::Confirmed {
                block: 9,
                hash: B256::repeat_byte(7),
                gas_used: 21_000,
                effective_gas_price: "1".into(),
                attempts: vec![],
            }),
        )
    }

    /// Issue 32 §6: an operation cancelled while its instance was suspended on
    /// `INDEX_BEHIND` after its mint landed reads `CANCELLED` saying the mint landed,
    /// not the stale `INDEX_BEHIND` "recovery is scheduled" (the immediate cancel keeps
    /// the instance's last error).
    #[test]
    fn a_cancel_of_a_suspended_operation_says_what_landed_not_the_stale_error() {
        let mut status = instance(RunStatus::Cancelled, None);
        status.error = Some(keel_durable::ErrorInfo {
            code: "INDEX_BEHIND".into(),
            retryable: true,
            message: "a step's transient retries were exhausted; recovery is scheduled".into(),
            detail: None,
        });
        let view = project(&op_row(), Some(&status), vec![confirmed()], None);
        let e = view.error.unwrap();
        assert_eq!(e.code, "CANCELLED");
        assert!(!e.retryable);
        assert!(
            e.detail.contains("after 1 of its transactions had landed"),
            "{}",
            e.detail
        );
        assert!(
            e.detail.contains("stopped with INDEX_BEHIND"),
            "{}",
            e.detail
        );
        assert!(!e.detail.contains("recovery is scheduled"), "{}", e.detail);
    }

    /// Issue 32 §10: a completed operation whose write a reorg took back for good
    /// (`REORGED_OUT`) says so with the code and the write, and counts nothing landed.
    #[test]
    fn a_completed_operation_whose_write_was_reorged_out_says_so() {
        let status = instance(RunStatus::Completed, None);
        let view = project(&op_row(), Some(&status), vec![confirmed()], None);
        assert_eq!(view.error, None);
        let reorged = tx(
            RequestState::Settled,
            Some(SettlementVerdict::Failed {
                code: FailureCode::ReorgedOut,
                reason: None,
                revert_data: None,
                attempts: vec![],
            }),
        );
        let view = project(&op_row(), Some(&status), vec![reorged], None);
        assert_eq!(view.state, OperationState::Completed);
        let e = view.error.unwrap();
        assert_eq!(e.code, REORGED_OUT);
        assert!(!e.retryable);
        assert!(
            e.detail.contains("none of its transactions landed"),
            "{}",
            e.detail
        );
        assert!(view.milestones.confirmed.is_empty());
    }

    /// A failed operation's error says what landed, after its own detail.
    #[test]
    fn a_failed_operation_says_what_landed() {
        let mut status = instance(RunStatus::Failed, None);
        status.error = Some(keel_durable::ErrorInfo {
            code: "WORKFLOW_FAILED".into(),
            retryable: false,
            message: "the workflow returned its typed error (see detail)".into(),
            detail: Some(
                serde_json::json!({"code": "INDEX_TIMEOUT", "retryable": true,
                "detail": "the index did not reach the block", "reason": null}),
            ),
        });
        let view = project(&op_row(), Some(&status), vec![confirmed()], None);
        let e = view.error.unwrap();
        assert_eq!(e.code, "INDEX_TIMEOUT");
        assert!(
            e.detail.starts_with("the index did not reach the block"),
            "{}",
            e.detail
        );
        assert!(
            e.detail.contains("1 of its transactions landed"),
            "{}",
            e.detail
        );
        let view = project(&op_row(), Some(&status), vec![], None);
        assert!(
            view.error
                .unwrap()
                .detail
                .contains("none of its transactions landed")
        );
    }

    /// A running instance (a retry or a recovery claimed it) shows no error: the
    /// previous attempt's is stale. A suspended one shows its reason.
    #[test]
    fn a_running_operation_shows_no_stale_error() {
        let mut status = instance(RunStatus::Running, None);
        status.error = Some(keel_durable::ErrorInfo {
            code: "CHAIN_UNAVAILABLE".into(),
            retryable: true,
            message: "recovery is scheduled".into(),
            detail: None,
        });
        assert_eq!(project(&op_row(), Some(&status), vec![], None).error, None);
        status.status = RunStatus::Suspended;
        let e = project(&op_row(), Some(&status), vec![], None)
            .error
            .unwrap();
        assert_eq!(e.code, "CHAIN_UNAVAILABLE");
    }

    /// A version-deferred operation (runners live, none knows its version) reads
    /// `waiting` for a `runner`, not `running` with no wait; one merely without any
    /// runner keeps its state (and `awaiting_runner`).
    #[test]
    fn a_version_deferred_operation_waits_for_a_runner() {
        let mut status = instance(RunStatus::Pending, None);
        status.awaiting_runner = true;
        status.version_deferred = true;
        let view = project(&op_row(), Some(&status), vec![], None);
        assert_eq!(view.state, OperationState::Waiting);
        assert_eq!(view.wait.unwrap().waits_for, WaitFor::Runner);
        assert!(view.awaiting_runner);
        status.version_deferred = false;
        let view = project(&op_row(), Some(&status), vec![], None);
        assert_eq!(view.state, OperationState::Running);
        assert_eq!(view.wait, None);
    }

    #[test]
    fn attribution_names_starter_approver_canceller_and_manual_retries() {
        use keel_durable::{RecordedCommand, RecordedSignal};
        let at = Utc::now();
        let cmd = |id, kind: &str, actor: Actor| RecordedCommand {
            id,
            kind: kind.to_owned(),
            state: "done".to_owned(),
            outcome: None,
            recorded_at: at,
            actor,
        };
        let signal = |key: &str, actor: Actor| RecordedSignal {
            id: 1,
            name: APPROVAL_SIGNAL.to_owned(),
            dedupe_key: key.to_owned(),
            recorded_at: at,
            consumed: true,
            actor,
        };
        let a = Attribution {
            commands: vec![
                cmd(1, "start", Actor::service("k1")),
                cmd(2, "signal", Actor::service("k2")),
                cmd(3, "retry", Actor::system("recovery")),
                cmd(4, "retry", Actor::service("k1")),
                cmd(5, "cancel", Actor::service("k3")),
            ],
            signals: vec![signal(
                APPROVAL_DEDUPE_KEY,
                Actor::service("k2").with_reason(approval_reason(false)),
            )],
        };
        let v = OperationAttribution::from_engine(&a);
        assert_eq!(v.started.unwrap().actor.id(), Some("k1"));
        let approval = v.approval.unwrap();
        assert!(!approval.approved, "rejected");
        assert_eq!(approval.by.actor.id(), Some("k2"));
        assert_eq!(v.cancelled.unwrap().actor.id(), Some("k3"));
        assert_eq!(v.retried.len(), 1, "the recovery retry is not listed");
        let approved = Attribution {
            signals: vec![signal(
                APPROVAL_DEDUPE_KEY,
                Actor::service("k2").with_reason(approval_reason(true)),
            )],
            ..Attribution::default()
        };
        assert!(
            OperationAttribution::from_engine(&approved)
                .approval
                .unwrap()
                .approved
        );
        assert_eq!(
            OperationAttribution::from_engine(&Attribution::default()),
            OperationAttribution::default()
        );
    }
}
