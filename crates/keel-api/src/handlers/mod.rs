//! The route handlers of the asset, token, operation, template and funding resources
//! and the health endpoints, one module per resource (others, such as `crate::keys` and
//! `crate::ledger`, have their own files); everything is re-exported here, so routes
//! and the OpenAPI document name `handlers::mint`, ... Each is annotated for the OpenAPI
//! document (`crate::openapi`). This module holds what they share: the error responses,
//! the answer of an accepted operation, and the query helpers.

use crate::ApiState;
use crate::dto::{Operation, OperationAccepted, status_url};
use crate::page::{self, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Datelike, Utc};
use keel_workflows::{Caller, MAX_WAIT, OperationView};
use serde::Deserialize;
use std::time::Duration;
use utoipa::{IntoParams, IntoResponses};
use uuid::Uuid;

mod assets;
mod funding;
mod health;
mod operations;
mod templates;
mod token_ops;

pub(crate) use assets::*;
pub(crate) use funding::*;
pub(crate) use health::*;
pub(crate) use operations::*;
pub(crate) use templates::*;
pub(crate) use token_ops::*;

/// Errors of the operation-creating POSTs (for the OpenAPI document).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum WriteErrors {
    /// `IDEMPOTENCY_KEY_REQUIRED`, `MALFORMED_JSON`, `JSON_TOO_DEEP`,
    /// `UNKNOWN_FIELD`, `INVALID_FIELD` (wrong type, missing field, a JSON number
    /// where a decimal string is expected), `MALFORMED_BODY`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such asset, operation or template in the caller's organization
    /// (also for malformed ids and other organizations' resources).
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `IDEMPOTENCY_CONFLICT` (the key was used with another request),
    /// `ASSET_NOT_READY`, `APPROVAL_NOT_PENDING`, `APPROVAL_SAME_KEY`, `APPROVAL_EXPIRED`
    /// (the approval deadline passed), `OPERATION_NOT_RETRYABLE` (not failed/suspended, or
    /// failed with a code a retry cannot change; `detail` names it), `OPERATION_ENDED`
    /// (cancel of an ended operation).
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// `PAYLOAD_TOO_LARGE`: the body exceeds the limit (default 256 KiB).
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// `UNSUPPORTED_MEDIA_TYPE`: a body that is not `application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// `INVALID_FIELD` (a rule of the operations service: lengths, zero amounts, the
    /// zero address, the key's length), `INVALID_ADDRESS`, `AMOUNT_MALFORMED`,
    /// `AMOUNT_NEGATIVE`, `AMOUNT_PRECISION_LOSS`, `AMOUNT_TOO_MANY_DIGITS`,
    /// `DECIMALS_OUT_OF_RANGE`, `CHAIN_NOT_CONFIGURED`, `UNKNOWN_ROLE` (grant-role,
    /// revoke-role).
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// `SERVICE_UNAVAILABLE` (retryable): the database or engine is unavailable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// The answers of the token-operation POSTs (mint, transfer, pause, unpause, burn,
/// grant-role, revoke-role) for the OpenAPI document: `202` while the operation runs, `200`
/// once it is terminal ([`answer`]).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum TokenOpAnswers {
    /// Accepted.
    #[response(
        status = 202,
        headers(("Location" = String, description = "`/v1/operations/{id}`"))
    )]
    Accepted(OperationAccepted),
    /// The operation is terminal.
    #[response(
        status = 200,
        headers(
            ("Location" = String, description = "`/v1/operations/{id}`"),
            ("Preference-Applied" = String, description = "`wait=N`")
        )
    )]
    Terminal(OperationAccepted),
}

/// Errors of the reads (for the OpenAPI document).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum ReadErrors {
    /// `INVALID_QUERY`: a query parameter is malformed (an integer outside its range, an
    /// unknown `state` or `kind`, a malformed `assetId` or RFC 3339 time, a `limit`
    /// outside 1 to 200); `UNKNOWN_QUERY_PARAMETER`: a parameter the route does not
    /// declare; `INVALID_CURSOR`: a `cursor` this list did not return.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such resource in the caller's organization.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `ASSET_NOT_READY`: the asset's token does not exist yet (balances);
    /// `INDEX_BEHIND` (retryable, with `Retry-After`): the Ledger Index did not reach
    /// `minBlock` within `waitSeconds`; `BLOCK_NOT_INDEXED`: `atBlock` (balances) is
    /// above the indexed tip.
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// `INVALID_ADDRESS` (balances).
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// `INDEX_UNAVAILABLE`, `SERVICE_UNAVAILABLE`, `INDEX_DEGRADED` (`minBlock` not
    /// reached and the chain's index is degraded: an operator must re-index it); all
    /// retryable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// Answers an accepted operation: `200` when it is terminal (at once, or within the
/// `Prefer: wait` time, capped at [`MAX_WAIT`]), else `202`; `Location` names the status
/// URL; `Preference-Applied: wait=N` when a wait preference was honoured for a `200`.
pub(crate) async fn answer(
    state: &ApiState,
    caller: Caller,
    mut view: OperationView,
    created: Option<bool>,
    wait: Option<u64>,
) -> Response {
    let applied = wait.map(|w| w.min(MAX_WAIT.as_secs()));
    if let Some(secs) = applied
        && secs > 0
        && !view.is_terminal()
    {
        match state
            .ops()
            .operation_wait(caller, view.id, Duration::from_secs(secs))
            .await
        {
            Ok(v) => view = v,
            // The operation was accepted: answer 202 and let the client poll.
            Err(e) => tracing::warn!(code = e.code(), "Prefer: wait could not be honoured"),
        }
    }
    let terminal = view.is_terminal();
    let status = if terminal {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let url = status_url(view.id);
    let mut res = match created {
        Some(created) => (status, Json(OperationAccepted::new(view, created))).into_response(),
        None => (status, Json(Operation::from(view))).into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&url) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    if terminal
        && let Some(n) = applied
        && let Ok(v) = HeaderValue::from_str(&format!("wait={n}"))
    {
        res.headers_mut().insert("preference-applied", v);
    }
    res
}

fn bad_query(param: &str) -> Problem {
    Problem::bad_request(
        "INVALID_QUERY",
        format!("query parameter `{param}` is malformed"),
    )
}

/// Whether `t` is an instant the database holds and RFC 3339 writes (years 1 to 9999).
fn storable_instant(t: &DateTime<Utc>) -> bool {
    (1..=9999).contains(&t.year())
}

/// Decodes a `(created_at, id)` keyset cursor.
fn time_id_cursor(page: &PageParams) -> Result<Option<(DateTime<Utc>, Uuid)>, Problem> {
    let Some(key) = page.cursor::<(DateTime<Utc>, Uuid)>()? else {
        return Ok(None);
    };
    if !storable_instant(&key.0) {
        return Err(page::invalid_cursor());
    }
    Ok(Some(key))
}

/// Read-after-write parameters of the asset reads.
#[derive(Debug, Clone, Copy, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(crate) struct MinBlockQuery {
    /// Wait until the Ledger Index has committed this block before reading
    /// (`409 INDEX_BEHIND`, retryable, when it does not within the wait; `503
    /// INDEX_DEGRADED` when the chain's index is degraded and needs a re-index).
    min_block: Option<u64>,
    /// How long to wait for `minBlock`, seconds (default 10, capped at 60).
    wait_seconds: Option<u64>,
}

impl MinBlockQuery {
    fn wait(&self, state: &ApiState) -> Duration {
        self.wait_seconds
            .map(Duration::from_secs)
            .unwrap_or(state.config().min_block_wait)
            .min(MAX_WAIT)
    }
}

fn invalid_query() -> Problem {
    Problem::bad_request(
        "INVALID_QUERY",
        "a query parameter is malformed (integers must be non-negative and at most 2^63-1)",
    )
}

pub(crate) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Problem> {
    q.map(|Query(t)| t).map_err(|_| invalid_query())
}

/// Refuses a query integer above 2^63-1, the `maximum` the document declares for every
/// `int64` query parameter (the database and JSON clients hold them as signed 64-bit).
pub(crate) fn int64_query(v: Option<u64>) -> Result<(), Problem> {
    if v.is_some_and(|v| i64::try_from(v).is_err()) {
        return Err(invalid_query());
    }
    Ok(())
}

fn block_query(q: Result<Query<MinBlockQuery>, QueryRejection>) -> Result<MinBlockQuery, Problem> {
    let q = query(q)?;
    int64_query(q.min_block)?;
    int64_query(q.wait_seconds)?;
    Ok(q)
}
