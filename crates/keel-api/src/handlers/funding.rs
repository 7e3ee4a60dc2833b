//! Funding requests: the open ones of the caller's operations.

use crate::ApiState;
use crate::dto::FundingRequestList;
use crate::extract::Authed;
use crate::problem::Problem;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;

use super::*;

/// Filter of the funding requests.
#[derive(Debug, Clone, Copy, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(crate) struct FundingQuery {
    /// Only this EIP-155 chain.
    chain_id: Option<u64>,
}

/// The open funding requests of the caller's operations (transactions paused until
/// their sender holds enough native currency for gas; they resume by themselves once
/// funded, or fail `FUNDING_DEADLINE_EXPIRED` after `deadline`), and every transaction
/// of the caller's held up behind one (`queuedBehindFunding`).
#[utoipa::path(
    get,
    path = "/v1/funding-requests",
    tag = "operations",
    operation_id = "listFundingRequests",
    params(FundingQuery),
    responses(
        (status = 200, description = "Open funding requests, oldest first.", body = FundingRequestList),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn funding_requests(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    q: Result<Query<FundingQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let q = query(q)?;
    int64_query(q.chain_id)?;
    let open = state.ops().funding_requests(caller, q.chain_id).await?;
    let blocked = state
        .ops()
        .funding_queued_behind(caller, q.chain_id)
        .await?;
    let deposits = match state.user_operations() {
        Some(aa) => aa
            .deposit_requests(q.chain_id)
            .await
            .map_err(|_| crate::user_ops::unavailable())?,
        None => Vec::new(),
    };
    Ok(Json(FundingRequestList {
        funding_requests: open.into_iter().map(Into::into).collect(),
        entry_point_deposits: deposits.into_iter().map(Into::into).collect(),
        queued_behind_funding: blocked.into_iter().map(Into::into).collect(),
    })
    .into_response())
}
