//! Assets: create, list, read one, and a holder's balance.

use crate::ApiState;
use crate::dto::{Asset, AssetList, Balance, CreateAssetRequest, OperationAccepted};
use crate::extract::{
    Authed, IdempotencyKey, JsonBody, PreferWait, RawPath, parse_address, parse_id,
};
use crate::page::{Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use keel_workflows::NewAsset;
use serde::Deserialize;
use utoipa::IntoParams;

use super::*;

/// Create an asset.
///
/// Starts the `asset.create` workflow (token, price feed, first observation, staleness
/// bound, unpause, index read-after-write). The chain, price resolver and staleness
/// bound come from the named template. Idempotent by `Idempotency-Key`: the same key
/// with the same body returns the same operation (`created: false`), whatever its
/// state — a failure included; with another body it is `409 IDEMPOTENCY_CONFLICT`.
#[utoipa::path(
    post,
    path = "/v1/assets",
    tag = "assets",
    operation_id = "createAsset",
    request_body(content = CreateAssetRequest, content_type = "application/json"),
    params(
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters, unique per request within the organization."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60): answer 200 if the operation ends within that time, else 202. Other preferences and malformed values are ignored."),
    ),
    responses(
        (status = 202, description = "Accepted; the operation runs asynchronously. `Location` is the status URL.", body = OperationAccepted,
            headers(("Location" = String, description = "`/v1/operations/{id}`"))),
        (status = 200, description = "The operation is terminal (a replayed key, or it ended within `Prefer: wait`).", body = OperationAccepted,
            headers(("Location" = String, description = "`/v1/operations/{id}`"), ("Preference-Applied" = String, description = "`wait=N` when a wait preference was honoured"))),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create_asset(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<CreateAssetRequest>,
) -> Result<Response, Problem> {
    if !template_id_well_formed(&body.template_id) {
        // No template can have this id (and it must not reach SQL: e.g. a NUL byte).
        return Err(Problem::not_found("template"));
    }
    let req = NewAsset {
        name: body.name,
        symbol: body.symbol,
        decimals: body.decimals,
        template_id: body.template_id,
        initial_price: body.initial_price,
    };
    let accepted = state.ops().create_asset(caller, &key, &req).await?;
    Ok(answer(
        &state,
        caller,
        accepted.operation,
        Some(accepted.created),
        wait,
    )
    .await)
}

/// Whether `id` matches the template id pattern `^[a-z0-9][a-z0-9._-]{0,63}$`.
fn template_id_well_formed(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || (i > 0 && matches!(b, b'.' | b'_' | b'-'))
        })
}

/// List the caller's assets, oldest first, with their index state (paginated).
#[utoipa::path(
    get,
    path = "/v1/assets",
    tag = "assets",
    operation_id = "listAssets",
    params(PageParams),
    responses(
        (status = 200, description = "One page of the organization's assets.", body = AssetList),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn assets(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let after = time_id_cursor(&page)?;
    let rows = state.ops().assets(caller, after, limit).await?;
    let page = Page::from_rows(rows, limit, keel_workflows::AssetView::key).map(Asset::from);
    Ok(Json(AssetList::from(page)).into_response())
}

/// One asset: identity, status, addresses, and from the Ledger Index its supply, paused
/// state, staleness bound and latest observation.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}",
    tag = "assets",
    operation_id = "getAsset",
    params(("id" = Uuid, Path, description = "Asset id"), MinBlockQuery),
    responses(
        (status = 200, description = "The asset.", body = Asset),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn asset(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    q: Result<Query<MinBlockQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let q = block_query(q)?;
    let id = parse_id(&id, "asset")?;
    let view = state
        .ops()
        .asset(caller, id, q.min_block, q.wait(&state))
        .await?;
    Ok(Json(Asset::from(view)).into_response())
}

/// A holder's balance of an asset, from the Ledger Index.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/balances/{address}",
    tag = "assets",
    operation_id = "getBalance",
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("address" = String, Path, description = "Holder: `0x` + 40 hex digits"),
        BalanceQuery,
    ),
    responses(
        (status = 200, description = "The balance.", body = Balance),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn balance(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, address)): RawPath<(String, String)>,
    q: Result<Query<BalanceQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let q = query(q)?;
    int64_query(q.min_block)?;
    int64_query(q.wait_seconds)?;
    int64_query(q.at_block)?;
    let wait = MinBlockQuery {
        min_block: q.min_block,
        wait_seconds: q.wait_seconds,
    }
    .wait(&state);
    let id = parse_id(&id, "asset")?;
    let holder = parse_address(&address, "address")?;
    let view = state
        .ops()
        .balance(caller, id, holder, q.at_block, q.min_block, wait)
        .await?;
    Ok(Json(Balance::from(view)).into_response())
}

/// Query of the balance read: read-after-write (`minBlock`, `waitSeconds`) and the
/// record date (`atBlock`).
#[derive(Debug, Clone, Copy, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(crate) struct BalanceQuery {
    /// Wait until the Ledger Index has committed this block before reading
    /// (`409 INDEX_BEHIND`, retryable, when it does not within the wait; `503
    /// INDEX_DEGRADED` when the chain's index is degraded and needs a re-index).
    min_block: Option<u64>,
    /// How long to wait for `minBlock`, seconds (default 10, capped at 60).
    wait_seconds: Option<u64>,
    /// The record date: the balance as of this block (every canonical transfer at or
    /// below it), as `GET /v1/assets/{id}/holders?atBlock=N`. Default: the indexed tip.
    /// Above the indexed tip: `409 BLOCK_NOT_INDEXED`.
    at_block: Option<u64>,
}
