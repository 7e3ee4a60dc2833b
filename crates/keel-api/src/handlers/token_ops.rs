//! Token operations on an asset: mint, transfer, burn, pause, unpause, grant and revoke
//! a role (each accepted as an operation, answered by [`answer`]).

use crate::ApiState;
use crate::dto::{BurnRequest, EmptyRequest, RoleRequest, TokenAmountRequest};
use crate::extract::{
    Authed, IdempotencyKey, JsonBody, PreferWait, RawPath, parse_address, parse_id,
};
use crate::problem::Problem;
use axum::extract::State;
use axum::response::Response;
use keel_workflows::{Caller, TokenRequest, TokenRole};

use super::*;

pub(crate) async fn token_op(
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
