//! The route handlers. Each is annotated for the OpenAPI document (`crate::openapi`).

use crate::ApiState;
use crate::dto::{
    Asset, AssetList, Balance, BurnRequest, CreateAssetRequest, EmptyRequest, FundingRequestList,
    Health, Operation, OperationAccepted, OperationHistory, OperationHistoryEntry, OperationList,
    OperationState, RoleRequest, Template, TemplateList, TokenAmountRequest, status_url,
};
use crate::extract::{
    Authed, IdempotencyKey, JsonBody, PreferWait, RawPath, parse_address, parse_id,
};
use crate::page::{self, Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Datelike, Utc};
use keel_workflows::{Caller, MAX_WAIT, NewAsset, OperationView, TokenRequest, TokenRole};
use serde::Deserialize;
use std::time::Duration;
use utoipa::{IntoParams, IntoResponses};
use uuid::Uuid;

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
async fn answer(
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

async fn token_op(
    state: &ApiState,
    caller: Caller,
    id: &str,
    key: &str,
    wait: Option<u64>,
    req: TokenRequest,
) -> Result<Response, Problem> {
    let asset_id = parse_id(id, "asset")?;
    let accepted = state
        .ops()
        .token_operation(caller, key, asset_id, &req)
        .await?;
    Ok(answer(
        state,
        caller,
        accepted.operation,
        Some(accepted.created),
        wait,
    )
    .await)
}

fn amount_request(body: TokenAmountRequest, mint: bool) -> Result<TokenRequest, Problem> {
    let recipient = parse_address(&body.recipient, "recipient")?;
    Ok(if mint {
        TokenRequest::Mint {
            recipient,
            amount: body.amount,
        }
    } else {
        TokenRequest::Transfer {
            recipient,
            amount: body.amount,
        }
    })
}

/// Mint tokens.
///
/// Starts `asset.mint` on an `active` asset (`409 ASSET_NOT_READY` before). Mints above
/// the template's threshold wait for an approval by another API key of the
/// organization. Operations of one asset run one at a time, in acceptance order. Same
/// idempotency and `Prefer: wait` rules as `POST /v1/assets`.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/mint",
    tag = "assets",
    operation_id = "mintAsset",
    request_body(content = TokenAmountRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn mint(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<TokenAmountRequest>,
) -> Result<Response, Problem> {
    let req = amount_request(body, true)?;
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Transfer tokens from the issuer's holdings.
///
/// Starts `asset.transfer` on an `active` asset. Same rules as mint (no approval).
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/transfer",
    tag = "assets",
    operation_id = "transferAsset",
    request_body(content = TokenAmountRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn transfer(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<TokenAmountRequest>,
) -> Result<Response, Problem> {
    let req = amount_request(body, false)?;
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Pause all balance changes of an asset.
///
/// Starts `asset.pause` on an `active` asset. The body is empty or `{}`.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/pause",
    tag = "assets",
    operation_id = "pauseAsset",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    token_op(&state, caller, &id, &key, wait, TokenRequest::Pause).await
}

/// Unpause balance changes of an asset.
///
/// Starts `asset.unpause` on an `active` asset. The body is empty or `{}`.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/unpause",
    tag = "assets",
    operation_id = "unpauseAsset",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn unpause(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    token_op(&state, caller, &id, &key, wait, TokenRequest::Unpause).await
}

/// Burn tokens: the issuer's own, or a holder's (forced burn).
///
/// Starts `asset.burn` on an `active` asset. Without `from`, the issuer (the asset's
/// operator account, which holds what it minted to itself or received) burns `amount`
/// of its own holdings (`AssetToken.burn`); more than it holds fails the operation
/// `EXECUTION_REVERTED` with reason `ERC20InsufficientBalance`. With `from`, a **forced
/// burn** (redemption) of that holder's tokens without its allowance
/// (`AssetToken.forcedBurn`): the issuer must hold the token's `burner` role (granted by
/// `POST /v1/assets/{id}/grant-role`; no account holds it at deployment), else the
/// operation fails `EXECUTION_REVERTED` with reason `AccessControlUnauthorizedAccount`;
/// above the holder's balance it fails with reason `ERC20InsufficientBalance`; while the
/// asset is paused, `EnforcedPause`. Burns above the template's mint approval threshold
/// wait for an approval by another API key of the organization, as mints do. The
/// result (`txHash`, `block`, `indexedBlock`) names the burn's transaction; the
/// milestone step is `burn` or `forced-burn`. A token deployed before `AssetToken` had
/// `forcedBurn` refuses a forced burn (`EXECUTION_REVERTED` without a reason). Same
/// idempotency and `Prefer: wait` rules as `POST /v1/assets`.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/burn",
    tag = "assets",
    operation_id = "burnAsset",
    request_body(content = BurnRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn burn(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<BurnRequest>,
) -> Result<Response, Problem> {
    let from = body
        .from
        .as_deref()
        .map(|a| parse_address(a, "from"))
        .transpose()?;
    let req = TokenRequest::Burn {
        from,
        amount: body.amount,
    };
    token_op(&state, caller, &id, &key, wait, req).await
}

fn role_request(body: RoleRequest, grant: bool) -> Result<TokenRequest, Problem> {
    let role: TokenRole = body.role.parse()?;
    let account = parse_address(&body.account, "account")?;
    Ok(if grant {
        TokenRequest::GrantRole { role, account }
    } else {
        TokenRequest::RevokeRole { role, account }
    })
}

/// Grant a role on the asset's token.
///
/// Starts `asset.grant-role` on an `active` asset: `AssetToken.grantRole(role,
/// account)`, sent by the issuer (the token's admin). Roles: `minter`, `pauser`,
/// `burner` (anything else is `422 UNKNOWN_ROLE`). When the template sets a mint
/// approval threshold, every role change waits for an approval by another API key of
/// the organization (a `minter` or `burner` grant enables mints or burns of any amount).
/// Granting a role the account holds lands without effect (`result.changed: false`).
/// The result adds `role`, `account` and `changed` to `txHash`, `block` and
/// `indexedBlock`. Same idempotency and `Prefer: wait` rules as `POST /v1/assets`.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/grant-role",
    tag = "assets",
    operation_id = "grantAssetRole",
    request_body(content = RoleRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn grant_role(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<RoleRequest>,
) -> Result<Response, Problem> {
    let req = role_request(body, true)?;
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Revoke a role on the asset's token.
///
/// Starts `asset.revoke-role`: `AssetToken.revokeRole(role, account)`. Same rules as
/// grant-role; revoking a role the account lacks lands without effect
/// (`result.changed: false`). Revoking the issuer's own `minter` or `pauser` role makes
/// Keel's later mints or pauses of the asset fail `EXECUTION_REVERTED`
/// (`AccessControlUnauthorizedAccount`) until it is granted again.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/revoke-role",
    tag = "assets",
    operation_id = "revokeAssetRole",
    request_body(content = RoleRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn revoke_role(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<RoleRequest>,
) -> Result<Response, Problem> {
    let req = role_request(body, false)?;
    token_op(&state, caller, &id, &key, wait, req).await
}

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

/// List the caller's asset templates, by id (paginated).
///
/// A template holds the server-side settings of the assets created from it (chain,
/// price decimals, staleness bound, approval threshold, funding pause); `POST
/// /v1/assets` names one by `templateId`.
#[utoipa::path(
    get,
    path = "/v1/templates",
    tag = "assets",
    operation_id = "listTemplates",
    params(PageParams),
    responses(
        (status = 200, description = "One page of the organization's templates.", body = TemplateList),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn templates(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let after: Option<String> = page.cursor()?;
    if after
        .as_deref()
        .is_some_and(|id| !keel_workflows::tenancy::valid_template_id(id))
    {
        return Err(page::invalid_cursor());
    }
    let rows = state
        .ops()
        .templates(caller, after.as_deref(), limit)
        .await?;
    let page = Page::from_rows(rows, limit, |t| t.template.id.clone()).map(Template::from);
    Ok(Json(TemplateList::from(page)).into_response())
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
/// funded, or fail `FUNDING_DEADLINE_EXPIRED` after `deadline`).
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
    })
    .into_response())
}

/// Liveness: `200 {"status":"ok"}` whenever the process serves HTTP.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    operation_id = "healthz",
    responses((status = 200, description = "The process serves.", body = Health))
)]
pub(crate) async fn healthz() -> Response {
    Json(Health {
        status: "ok".to_owned(),
    })
    .into_response()
}

/// Readiness: `200 {"status":"ready"}` when the process flagged itself ready, the
/// database answers `SELECT 1` and every embedded migration is applied (same version
/// and checksum); else `503 NOT_READY`.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    operation_id = "readyz",
    responses(
        (status = 200, description = "Ready to serve traffic.", body = Health),
        (status = 503, description = "`NOT_READY`: starting, shutting down, database unreachable or migrations pending.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn readyz(State(state): State<ApiState>) -> Response {
    let not_ready =
        |detail: &str| Problem::new(StatusCode::SERVICE_UNAVAILABLE, "NOT_READY", detail);
    if !state.is_ready() {
        return not_ready("the process is starting or shutting down").into_response();
    }
    match tokio::time::timeout(Duration::from_secs(3), state.ops().check_ready()).await {
        Ok(Ok(())) => Json(Health {
            status: "ready".to_owned(),
        })
        .into_response(),
        Ok(Err(reason)) => not_ready(&reason.to_string()).into_response(),
        Err(_) => not_ready("the database did not answer in time").into_response(),
    }
}

/// The OpenAPI 3.1 document (`docs/openapi.json`).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "health",
    operation_id = "openapi",
    responses((status = 200, description = "This document.", content_type = "application/json"))
)]
pub(crate) async fn openapi_json() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        crate::openapi_json(),
    )
        .into_response()
}
