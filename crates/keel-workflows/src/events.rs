//! Webhook events of operations (issue 21), written **in the transaction of the change
//! they report** through [`keel_webhooks::emit_in`]:
//!
//! | where | transaction | events |
//! |---|---|---|
//! | [`crate::Ops::create_asset`], [`crate::Ops::token_operation`] | the one inserting the operation | `operation.accepted` |
//! | [`OperationEvents`] as the engine's [`keel_durable::TransitionHook`] | every segment settle, cancel and retry of an operation's instance | what changed (below) |
//! | [`crate::VerdictSink`] | the queue's settling transaction | `operation.transaction_settled`, and what changed |
//! | [`crate::VerdictSink`] (`reorged`) | the queue's transaction replacing a settled verdict with `REORGED_OUT` (issue 32 §10) | `operation.transaction_reorged` |
//! | [`OperationEvents`] as the queue's [`keel_txq::ProgressSink`] | the queue's transaction recording a first broadcast or opening a funding request | `operation.submitted`, `operation.funding_requested` (when the operation waits for that transaction), and what changed |
//!
//! "What changed" compares the operation's view (projected on the transaction's own
//! connection, so it shows the change) with what its events reported so far (the
//! operation's `webhook_mark`, updated in the same transaction): a new state →
//! `operation.state_changed`; a new wait for an approval → `operation.approval_requested`,
//! for gas funds → `operation.funding_requested`, for an approval at the custody provider
//! → `operation.custody_approval_requested` (reported by the queue's custody pass through
//! the progress sink when it first reads the wait); a new link in `milestones.submitted`
//! that a node accepted (`broadcast`) → `operation.submitted`, in `milestones.confirmed` →
//! `operation.confirmed`; the
//! `indexed` milestone → `operation.indexed`. Every event's `data` is the view as
//! rendered by the [`Renderer`] (the binary passes the Platform API's `Operation` DTO,
//! so `data` has the schema of `GET /v1/operations/{id}`).
//!
//! Events of one operation are written under its operation row's lock
//! ([`store::operation_webhook_mark_lock`], taken before the view is read), so their
//! order is their commit order and each change is reported once. Lock order: queue
//! requests, then instances, then operations (each writer takes the operations in
//! instance order), so the writers do not deadlock one another.
//!
//! When the queue's progress sink call fails (the queue then records the change
//! without it), the `submitted` milestone or the funding wait is reported with the
//! operation's next change (its verdict at the latest): the mark still lacks it.

use crate::error::{OpsError, Result};
use crate::ops::view::{LinkedRequest, OperationState, OperationView, WaitFor, project};
use crate::store::{self, OperationEventContext};
use crate::workflows::WORKFLOWS;
use keel_durable::{
    Engine, HookFuture, InstanceStatus, Transition, TransitionHook, TransitionHookError,
};
use keel_webhooks::event as ev;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use uuid::Uuid;

/// Renders an operation view as the `data` of its events (the API's `Operation` JSON).
pub type Renderer = Arc<dyn Fn(&OperationView) -> Value + Send + Sync>;

/// The emitter of operations' webhook events; also the engine's transition hook
/// (register with [`Engine::set_transition_hook`]).
#[derive(Clone)]
pub struct OperationEvents {
    engine: Engine,
    render: Renderer,
}

impl std::fmt::Debug for OperationEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationEvents").finish_non_exhaustive()
    }
}

/// What an operation's events reported so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    state: Option<OperationState>,
    wait: Option<WaitFor>,
    submitted: Vec<String>,
    confirmed: Vec<String>,
    indexed: bool,
}

impl Mark {
    fn of(v: &OperationView) -> Self {
        Self {
            state: Some(v.state),
            wait: v.wait.as_ref().map(|w| w.waits_for),
            // Submitted: a node accepted it (the queue's first broadcast) or it mined.
            submitted: v
                .milestones
                .submitted
                .iter()
                .filter(|t| t.broadcast)
                .map(|t| t.link.clone())
                .collect(),
            confirmed: v
                .milestones
                .confirmed
                .iter()
                .map(|t| t.link.clone())
                .collect(),
            indexed: v.milestones.indexed.is_some(),
        }
    }

    /// The event types from `self` (reported) to `new`, in the order they are written.
    fn changes(&self, new: &Self, verdict: bool) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.state.is_none() {
            out.push(ev::OPERATION_ACCEPTED);
        }
        let fresh = |old: &[String], new: &[String]| new.iter().any(|l| !old.contains(l));
        if fresh(&self.submitted, &new.submitted) {
            out.push(ev::OPERATION_SUBMITTED);
        }
        if verdict {
            out.push(ev::OPERATION_TRANSACTION_SETTLED);
        }
        if fresh(&self.confirmed, &new.confirmed) {
            out.push(ev::OPERATION_CONFIRMED);
        }
        if self.state.is_some() && self.state != new.state {
            out.push(ev::OPERATION_STATE_CHANGED);
        }
        if new.wait != self.wait {
            match new.wait {
                Some(WaitFor::Approval) => out.push(ev::OPERATION_APPROVAL_REQUESTED),
                Some(WaitFor::Funding) => out.push(ev::OPERATION_FUNDING_REQUESTED),
                Some(WaitFor::CustodyApproval) => {
                    out.push(ev::OPERATION_CUSTODY_APPROVAL_REQUESTED);
                }
                Some(WaitFor::Transaction | WaitFor::Timer | WaitFor::Runner | WaitFor::Resume)
                | None => {}
            }
        }
        if new.indexed && !self.indexed {
            out.push(ev::OPERATION_INDEXED);
        }
        out
    }
}

fn webhook_err(e: keel_webhooks::WebhookError) -> OpsError {
    match e {
        keel_webhooks::WebhookError::Store(s) => OpsError::Store(s),
        _ => OpsError::Store(keel_store::StoreError::Decode),
    }
}

impl OperationEvents {
    /// An emitter reading instances of `engine`, rendering views with `render`.
    pub fn new(engine: Engine, render: Renderer) -> Self {
        Self { engine, render }
    }

    /// The linked requests of an operation, read on `conn`.
    async fn linked_in(
        conn: &mut sqlx::PgConnection,
        operation_id: Uuid,
    ) -> Result<Vec<LinkedRequest>> {
        let links = store::operation_tx_links(&mut *conn, operation_id).await?;
        let ids: Vec<Uuid> = links.iter().map(|l| l.txq_request_id).collect();
        let requests = keel_txq::requests(&mut *conn, &ids)
            .await
            .map_err(crate::ops::read::txq_err)?;
        Ok(links
            .into_iter()
            .filter_map(|l| {
                let request = requests.iter().find(|r| r.id == l.txq_request_id)?.clone();
                Some(LinkedRequest {
                    link: l.link,
                    request,
                })
            })
            .collect())
    }

    /// Writes the events of what changed in operation `ctx` (see the module docs) on
    /// `conn`, with its instance's `status` (none before it started); `verdict`: a
    /// settlement verdict of one of its transactions is part of the change. Returns the
    /// event types written (also when no endpoint subscribes).
    pub(crate) async fn emit(
        &self,
        conn: &mut sqlx::PgConnection,
        ctx: &OperationEventContext,
        status: Option<&InstanceStatus>,
        verdict: bool,
    ) -> Result<Vec<&'static str>> {
        // Nothing to build for an organization without endpoints (its mark stays as it
        // is: an endpoint added later gets what changes from then on, starting with an
        // `operation.accepted` for an operation it had not heard of).
        if !keel_webhooks::store::organization_has_endpoints(&mut *conn, ctx.organization_id)
            .await
            .map_err(webhook_err)?
        {
            return Ok(Vec::new());
        }
        // The operation's lock first: a concurrent writer of its events waits here, and
        // reads the state (and the mark) this one commits.
        let Some(mark) = store::operation_webhook_mark_lock(&mut *conn, ctx.id).await? else {
            return Ok(Vec::new());
        };
        let Some(op) = store::operation_get(&mut *conn, ctx.organization_id, ctx.id).await? else {
            return Ok(Vec::new());
        };
        let txs = Self::linked_in(conn, op.id).await?;
        let queued_behind = match status.and_then(|s| s.queued_behind) {
            Some(instance) => store::operation_id_by_instance(&mut *conn, instance).await?,
            None => None,
        };
        let view = project(&op, status, txs, queued_behind);
        let old: Mark = match mark.map(serde_json::from_value::<Mark>).transpose() {
            Ok(m) => m.unwrap_or_default(),
            Err(_) => {
                // An unreadable mark (written by a build with other states or waits):
                // said and counted, then read as "nothing reported", so this change's
                // events are written again (webhooks are at least once) and the mark is
                // rewritten; the operation is never held.
                tracing::warn!(operation = %op.id, "unreadable webhook mark; reporting anew");
                metrics::counter!("keel_webhook_mark_unreadable_total").increment(1);
                Mark::default()
            }
        };
        let new = Mark::of(&view);
        let types = old.changes(&new, verdict);
        if types.is_empty() {
            return Ok(types);
        }
        let data = (self.render)(&view);
        for t in &types {
            keel_webhooks::emit_in(
                conn,
                &keel_webhooks::NewEvent {
                    organization_id: ctx.organization_id,
                    event_type: t,
                    operation_id: Some(op.id),
                    data: &data,
                },
            )
            .await
            .map_err(webhook_err)?;
        }
        let mark = serde_json::to_value(&new)
            .map_err(|_| OpsError::Store(keel_store::StoreError::Decode))?;
        store::operation_webhook_mark_set(&mut *conn, op.id, &mark).await?;
        Ok(types)
    }

    /// The event context of the operation whose instance is `instance_id`: by the
    /// operation's instance link, else (the link is written after the start, so a fast
    /// first segment can settle before it) by the `operationId` of the instance's input.
    async fn context_of(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
    ) -> Result<Option<OperationEventContext>> {
        if let Some(c) = store::operation_event_context_by_instance(&mut *conn, instance_id).await?
        {
            return Ok(Some(c));
        }
        let input = self.engine.input_in(conn, instance_id).await?;
        let Some(id) = input
            .get("operationId")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            return Ok(None);
        };
        Ok(store::operation_event_context(&mut *conn, id).await?)
    }

    /// The events of a change of instance `instance_id` (on `conn`, in the change's
    /// transaction); nothing for an instance no operation runs.
    pub(crate) async fn emit_for_instance(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
        verdict: bool,
    ) -> Result<Vec<&'static str>> {
        let Some(ctx) = self.context_of(conn, instance_id).await? else {
            return Ok(Vec::new());
        };
        let status = self.engine.status_in(conn, instance_id).await?;
        self.emit(conn, &ctx, Some(&status), verdict).await
    }
}

impl OperationEvents {
    /// Writes `operation.transaction_reorged` for the operation whose instance is
    /// `instance_id` (on `conn`, in the queue's transaction that replaced a settled
    /// verdict of one of its transactions with `REORGED_OUT`), its `data` the view as
    /// it is now (the transaction's verdict included). Nothing for an instance no
    /// operation runs or an organization without endpoints. Returns whether it wrote.
    pub(crate) async fn emit_reorged(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
    ) -> Result<bool> {
        let Some(ctx) = self.context_of(conn, instance_id).await? else {
            return Ok(false);
        };
        if !keel_webhooks::store::organization_has_endpoints(&mut *conn, ctx.organization_id)
            .await
            .map_err(webhook_err)?
        {
            return Ok(false);
        }
        // The operation's lock first (the order of its events is their commit order).
        if store::operation_webhook_mark_lock(&mut *conn, ctx.id)
            .await?
            .is_none()
        {
            return Ok(false);
        }
        let Some(op) = store::operation_get(&mut *conn, ctx.organization_id, ctx.id).await? else {
            return Ok(false);
        };
        let status = self.engine.status_in(conn, instance_id).await?;
        let txs = Self::linked_in(conn, op.id).await?;
        let view = project(&op, Some(&status), txs, None);
        let data = (self.render)(&view);
        keel_webhooks::emit_in(
            conn,
            &keel_webhooks::NewEvent {
                organization_id: ctx.organization_id,
                event_type: ev::OPERATION_TRANSACTION_REORGED,
                operation_id: Some(op.id),
                data: &data,
            },
        )
        .await
        .map_err(webhook_err)?;
        Ok(true)
    }
}

impl TransitionHook for OperationEvents {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        transitions: &'c [Transition],
    ) -> HookFuture<'c> {
        Box::pin(async move {
            // In instance order: operations' rows are locked in the order every writer
            // of events uses (see the module docs).
            let mut ids: Vec<Uuid> = transitions
                .iter()
                .filter(|t| WORKFLOWS.contains(&t.workflow.as_str()))
                .map(|t| t.instance_id)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                self.emit_for_instance(conn, id, false)
                    .await
                    .map_err(|e| TransitionHookError::Other(Box::new(e)))?;
            }
            Ok(())
        })
    }
}

/// The queue's progress: a first broadcast can be the operation's `submitted`
/// milestone, an opened funding request its funding wait (see the module docs).
impl keel_txq::ProgressSink for OperationEvents {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        progress: &'c [keel_txq::Progress<'c>],
    ) -> futures::future::BoxFuture<'c, std::result::Result<(), keel_txq::ProgressSinkError>> {
        Box::pin(async move {
            let ids: Vec<Uuid> = progress
                .iter()
                .map(keel_txq::Progress::request_id)
                .collect();
            // Ordered by instance (the lock order).
            let links = store::operation_tx_by_requests(&mut *conn, &ids)
                .await
                .map_err(keel_txq::ProgressSinkError::new)?;
            let mut instances: Vec<Uuid> = links.iter().map(|l| l.instance_id).collect();
            instances.dedup();
            for instance in instances {
                self.emit_for_instance(&mut *conn, instance, false)
                    .await
                    .map_err(keel_txq::ProgressSinkError::new)?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(state: &str) -> Mark {
        Mark {
            state: Some(serde_json::from_value(serde_json::json!(state)).unwrap()),
            ..Mark::default()
        }
    }

    #[test]
    fn changes_name_what_is_new() {
        let none = Mark::default();
        assert_eq!(
            none.changes(&mark("running"), false),
            [ev::OPERATION_ACCEPTED]
        );
        let waiting = Mark {
            wait: Some(WaitFor::Approval),
            ..mark("waiting")
        };
        assert_eq!(
            mark("running").changes(&waiting, false),
            [
                ev::OPERATION_STATE_CHANGED,
                ev::OPERATION_APPROVAL_REQUESTED
            ]
        );
        assert!(waiting.changes(&waiting, false).is_empty());
        // Issue 32 §5: an approval wait at the custody provider is announced.
        let custody = Mark {
            wait: Some(WaitFor::CustodyApproval),
            ..mark("waiting")
        };
        assert_eq!(
            Mark {
                wait: Some(WaitFor::Transaction),
                ..mark("waiting")
            }
            .changes(&custody, false),
            [ev::OPERATION_CUSTODY_APPROVAL_REQUESTED]
        );
        let confirmed = Mark {
            submitted: vec!["mint".into()],
            confirmed: vec!["mint".into()],
            ..mark("running")
        };
        assert_eq!(
            mark("running").changes(&confirmed, true),
            [
                ev::OPERATION_SUBMITTED,
                ev::OPERATION_TRANSACTION_SETTLED,
                ev::OPERATION_CONFIRMED
            ]
        );
        let indexed = Mark {
            indexed: true,
            ..mark("completed")
        };
        assert_eq!(
            confirmed.changes(&indexed, false),
            [ev::OPERATION_STATE_CHANGED, ev::OPERATION_INDEXED]
        );
    }
}
