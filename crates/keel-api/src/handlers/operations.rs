//! Operations: read one, its history, the list; approve, reject, retry, cancel.

use crate::ApiState;
use crate::dto::{
    EmptyRequest, Operation, OperationHistory, OperationHistoryEntry, OperationList, OperationState,
};
use crate::extract::{Authed, JsonBody, PreferWait, RawPath, parse_id};
use crate::page::{self, Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_workflows::Caller;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::*;

async fn decide(
    state: &ApiState,
    caller: Caller,
    id: &str,
    wait: Option<u64>,
    approved: bool,
) -> Result<Response, Problem> {
    let id = parse_id(id, "operation")?;
    let view = state.ops().decide_approval(caller, id, approved).await?;
    Ok(answer(state, caller, view, None, wait).await)
}

/// Approve an operation that waits for an approval.
///
/// Only by another API key of the same organization than the request's
/// (`409 APPROVAL_SAME_KEY`); the first decision wins; an operation that needs no
/// approval, was decided already or ended is `409 APPROVAL_NOT_PENDING`. Answers the
/// operation's status: `202` while it runs on, `200` once terminal (`Prefer: wait`
/// applies as for the other POSTs). No `Idempotency-Key` is needed.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/approve",
    tag = "operations",
    operation_id = "approveOperation",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "Operation id"),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(
        (status = 202, description = "Decision recorded; the operation runs on.", body = Operation, headers(("Location" = String, description = "`/v1/operations/{id}`"))),
        (status = 200, description = "Decision recorded; the operation is terminal.", body = Operation,
            headers(("Location" = String, description = "`/v1/operations/{id}`"), ("Preference-Applied" = String, description = "`wait=N`"))),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn approve(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    PreferWait(wait): PreferWait,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    decide(&state, caller, &id, wait, true).await
}

/// Reject an operation that waits for an approval (it then fails
/// `APPROVAL_REJECTED`). Same rules as approve.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/reject",
    tag = "operations",
    operation_id = "rejectOperation",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "Operation id"),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(
        (status = 202, description = "Decision recorded; the operation runs on.", body = Operation, headers(("Location" = String, description = "`/v1/operations/{id}`"))),
        (status = 200, description = "Decision recorded; the operation is terminal.", body = Operation,
            headers(("Location" = String, description = "`/v1/operations/{id}`"), ("Preference-Applied" = String, description = "`wait=N`"))),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn reject(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    PreferWait(wait): PreferWait,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    decide(&state, caller, &id, wait, false).await
}

/// Retry a failed (or suspended) operation.
///
/// The operation's workflow replays its journal: steps with a recorded result — landed
/// transactions included — are not run again; it resumes at the first step without
/// one. Anything but `failed` or `suspended` is `409 OPERATION_NOT_RETRYABLE`. Answers
/// the operation's status like approve (`202` / `200`, `Prefer: wait` applies). No
/// `Idempotency-Key` is needed: retrying a running operation is refused.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/retry",
    tag = "operations",
    operation_id = "retryOperation",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "Operation id"),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(
        (status = 202, description = "Retry recorded; the operation runs again.", body = Operation, headers(("Location" = String, description = "`/v1/operations/{id}`"))),
        (status = 200, description = "Retry recorded; the operation is terminal.", body = Operation,
            headers(("Location" = String, description = "`/v1/operations/{id}`"), ("Preference-Applied" = String, description = "`wait=N`"))),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn retry(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    PreferWait(wait): PreferWait,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "operation")?;
    let view = state.ops().retry(caller, id).await?;
    Ok(answer(&state, caller, view, None, wait).await)
}

/// Cancel an operation.
///
/// What a cancel does depends on how far the operation got:
/// - no transaction queued yet (the operation is `queued` behind another one of its
///   asset, waits for an approval, or has not reached its first write): it ends
///   `cancelled` and nothing reaches the chain;
/// - a transaction queued but not signed (in the queue, or waiting for funding): the
///   request is withdrawn and the operation ends `cancelled`;
/// - a transaction already signed: it cannot be unsent. The cancel is recorded
///   (`cancelRequestedAt`), no further write of the operation is queued, and the
///   operation runs to that transaction's verdict — it may still complete (a mint whose
///   transaction landed) or end `cancelled` before its next write.
///
/// `milestones.confirmed` always lists the writes that landed, and a `cancelled`
/// operation's `error` (code `CANCELLED`) says how many did. A `completed`, `failed` or
/// `cancelled` operation answers `409 OPERATION_ENDED`. Repeating a cancel is harmless.
/// Answers the operation's status like approve (`202` / `200`, `Prefer: wait` applies).
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/cancel",
    tag = "operations",
    operation_id = "cancelOperation",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "Operation id"),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(
        (status = 202, description = "Cancel recorded; the operation has not ended yet (a signed transaction runs to its verdict).", body = Operation, headers(("Location" = String, description = "`/v1/operations/{id}`"))),
        (status = 200, description = "Cancel recorded; the operation is terminal.", body = Operation,
            headers(("Location" = String, description = "`/v1/operations/{id}`"), ("Preference-Applied" = String, description = "`wait=N`"))),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    PreferWait(wait): PreferWait,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "operation")?;
    let view = state.ops().cancel(caller, id).await?;
    Ok(answer(&state, caller, view, None, wait).await)
}

/// An operation's status: state, wait, milestones, progress, result and error.
#[utoipa::path(
    get,
    path = "/v1/operations/{id}",
    tag = "operations",
    operation_id = "getOperation",
    params(("id" = Uuid, Path, description = "Operation id")),
    responses(
        (status = 200, description = "The operation's status.", body = Operation),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn operation(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "operation")?;
    let view = state.ops().operation(caller, id).await?;
    Ok(Json(Operation::from(view)).into_response())
}

/// An operation's history, oldest first (paginated): every command received and every
/// decision of its workflow, with who asked, when, and the state after each entry.
#[utoipa::path(
    get,
    path = "/v1/operations/{id}/history",
    tag = "operations",
    operation_id = "getOperationHistory",
    params(("id" = Uuid, Path, description = "Operation id"), PageParams),
    responses(
        (status = 200, description = "One page of the operation's history.", body = OperationHistory),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn operation_history(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "operation")?;
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let after = page.cursor::<i64>()?.unwrap_or(0);
    if after < 0 {
        return Err(page::invalid_cursor());
    }
    let rows = state
        .ops()
        .operation_history(caller, id, after, limit + 1)
        .await?;
    let page = Page::from_rows(rows, limit, |e| e.seq).map(OperationHistoryEntry::from);
    Ok(Json(OperationHistory::from(page)).into_response())
}

/// Filters of the operation list (each one given must hold); its pagination is
/// [`PageParams`].
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(crate) struct OperationsQuery {
    /// Only operations in this state.
    #[param(value_type = Option<OperationState>)]
    state: Option<String>,
    /// Only operations of this kind (`asset.create`, `asset.mint`, `asset.transfer`,
    /// `asset.pause`, `asset.unpause`).
    #[param(value_type = Option<String>)]
    kind: Option<String>,
    /// Only operations of this asset.
    #[param(value_type = Option<Uuid>)]
    asset_id: Option<String>,
    /// Only operations accepted strictly after this instant (RFC 3339, e.g.
    /// `2026-12-01T00:00:00Z`).
    #[param(value_type = Option<DateTime<Utc>>)]
    created_after: Option<String>,
    /// Only operations accepted strictly before this instant (RFC 3339).
    #[param(value_type = Option<DateTime<Utc>>)]
    created_before: Option<String>,
}

fn rfc3339_query(v: Option<&str>, param: &str) -> Result<Option<DateTime<Utc>>, Problem> {
    v.map(|t| {
        DateTime::parse_from_rfc3339(t)
            .map(|t| t.with_timezone(&Utc))
            .ok()
            .filter(storable_instant)
            .ok_or_else(|| bad_query(param))
    })
    .transpose()
}

impl OperationsQuery {
    fn filter(&self) -> Result<keel_workflows::OperationFilter, Problem> {
        let state = self
            .state
            .as_deref()
            .map(|s| {
                serde_json::from_value::<OperationState>(serde_json::Value::from(s))
                    .map(svc_state)
                    .map_err(|_| bad_query("state"))
            })
            .transpose()?;
        let kind = self
            .kind
            .as_deref()
            .map(|k| keel_workflows::OperationKind::from_name(k).map_err(|_| bad_query("kind")))
            .transpose()?;
        let asset_id = self
            .asset_id
            .as_deref()
            .map(|a| Uuid::parse_str(a).map_err(|_| bad_query("assetId")))
            .transpose()?;
        Ok(keel_workflows::OperationFilter {
            state,
            kind,
            asset_id,
            created_after: rfc3339_query(self.created_after.as_deref(), "createdAfter")?,
            created_before: rfc3339_query(self.created_before.as_deref(), "createdBefore")?,
        })
    }
}

fn svc_state(s: OperationState) -> keel_workflows::OperationState {
    use keel_workflows::OperationState as S;
    match s {
        OperationState::Queued => S::Queued,
        OperationState::Running => S::Running,
        OperationState::Waiting => S::Waiting,
        OperationState::Suspended => S::Suspended,
        OperationState::Completed => S::Completed,
        OperationState::Failed => S::Failed,
        OperationState::Cancelled => S::Cancelled,
    }
}

/// List the caller's operations, oldest first, filtered by state, kind, asset and
/// acceptance time (paginated).
///
/// Every filter given must hold; pass the same filters with `cursor`. Without `state`
/// a page is one index range scan. With `state` (which changes as operations run),
/// one request examines at most 1,000 operations: a page may then hold fewer than
/// `limit` items — even none — with `hasMore: true`; follow `nextCursor` until it is
/// null. An operation is listed at most once in a walk of the pages; one accepted
/// while the walk runs is listed if it sorts after the current page.
#[utoipa::path(
    get,
    path = "/v1/operations",
    tag = "operations",
    operation_id = "listOperations",
    params(OperationsQuery, PageParams),
    responses(
        (status = 200, description = "One page of the organization's operations.", body = OperationList),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn operations(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    q: Result<Query<OperationsQuery>, QueryRejection>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let q = q.map(|Query(q)| q).map_err(|_| invalid_query())?;
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let filter = q.filter()?;
    let after = time_id_cursor(&page)?;
    let list = state
        .ops()
        .operations(caller, &filter, after, limit)
        .await?;
    let page = match list.resume_after {
        // The scan budget ran out before a full page matched: continue after the last
        // operation examined.
        Some(key) => Page {
            data: list.operations,
            has_more: true,
            next_cursor: Some(page::encode_cursor(&key)),
        },
        None => Page::from_rows(list.operations, limit, keel_workflows::OperationView::key),
    };
    Ok(Json(OperationList::from(page.map(Operation::from))).into_response())
}
