//! The `/v1/api-keys` handlers: an organization's admin key lists, creates, revokes and
//! rotates the organization's keys. Annotated for the OpenAPI document.

use crate::ApiState;
use crate::dto::{
    ApiKey, ApiKeyList, ApiKeyWithToken, CreateApiKeyRequest, EmptyRequest, RotateApiKeyRequest,
};
use crate::extract::{Authed, Authorized, JsonBody, RawPath, parse_id};
use crate::page::{Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_workflows::Scopes;
use std::time::Duration;
use utoipa::IntoResponses;
use uuid::Uuid;

/// Errors of the `/v1/api-keys` routes (for the OpenAPI document; `403` is added with
/// every keyed route's scope by the document's fixups).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum KeyErrors {
    /// `INVALID_QUERY`, `INVALID_CURSOR` (list); `MALFORMED_JSON`, `JSON_TOO_DEEP`,
    /// `UNKNOWN_FIELD`, `INVALID_FIELD` (wrong JSON type, a missing or duplicate
    /// member), `MALFORMED_BODY`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing, invalid, revoked or rotated-away API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such key in the caller's organization (also for malformed ids
    /// and other organizations' keys).
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `API_KEY_REVOKED`: a revoked key cannot be rotated.
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// `PAYLOAD_TOO_LARGE`: the body exceeds the limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// `UNSUPPORTED_MEDIA_TYPE`: a body that is not `application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// `INVALID_FIELD`: a label that is empty, too long or has control characters; an
    /// `issuedTo` that is empty, too long or has control, separator or format
    /// characters; no scope, an unknown or repeated scope name; `expiresInSeconds`
    /// above 604800.
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// `SERVICE_UNAVAILABLE` (retryable): the database is unavailable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// The keyset position of a key in the list: `(createdAt, id)`.
type KeyCursor = (DateTime<Utc>, Uuid);

/// The organization's API keys, oldest first (revoked ones included, with
/// `revokedAt`). Secrets are never listed.
#[utoipa::path(
    get,
    path = "/v1/api-keys",
    tag = "api-keys",
    operation_id = "listApiKeys",
    params(PageParams),
    responses(
        (status = 200, description = "One page of keys.", body = ApiKeyList),
        KeyErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let after = page.cursor::<KeyCursor>()?;
    let rows = state.ops().api_keys(caller, after, limit + 1).await?;
    let page = Page::from_rows(rows, limit, |k| (k.created_at, k.id)).map(ApiKey::from);
    Ok(Json(ApiKeyList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// Create an API key of the caller's organization.
///
/// The answer holds the token — the only time it is shown; Keel stores its SHA-256.
/// The new key may hold only scopes the calling key holds (`403 INSUFFICIENT_SCOPE`
/// otherwise). Not idempotent: a repeated request creates another key (a replay could
/// not show the token again).
#[utoipa::path(
    post,
    path = "/v1/api-keys",
    tag = "api-keys",
    operation_id = "createApiKey",
    request_body(content = CreateApiKeyRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; `token` is shown this once.", body = ApiKeyWithToken),
        (status = 403, description = "`INSUFFICIENT_SCOPE`: the calling key lacks `admin`, or a scope the new key would hold.", body = Problem, content_type = "application/problem+json"),
        KeyErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    Authorized(credential): Authorized,
    JsonBody(body): JsonBody<CreateApiKeyRequest>,
) -> Result<Response, Problem> {
    let scopes = parse_scopes(&body.scopes)?;
    let created = state
        .ops()
        .create_api_key_issued(credential, &body.label, scopes, body.issued_to.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(ApiKeyWithToken::from(created))).into_response())
}

/// The scope set of `names`: 1 to 4 distinct scope names (`422 INVALID_FIELD`).
fn parse_scopes(names: &[String]) -> Result<Scopes, Problem> {
    let bad = || {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_FIELD",
            "field `scopes`: must be 1 to 4 distinct scopes out of read, operate, approve, admin",
        )
    };
    let mut set = Scopes::NONE;
    for name in names {
        let scope = keel_workflows::Scope::parse(name).ok_or_else(bad)?;
        if set.contains(scope) {
            return Err(bad());
        }
        set = set.with(scope);
    }
    if set.is_empty() {
        return Err(bad());
    }
    Ok(set)
}

/// Revoke an API key: both its secrets stop authenticating at once (the next request
/// with it answers `401`). The caller's own key may be revoked. Repeating is harmless:
/// the first `revokedAt` stays. The body is empty or `{}`.
#[utoipa::path(
    post,
    path = "/v1/api-keys/{id}/revoke",
    tag = "api-keys",
    operation_id = "revokeApiKey",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(("id" = Uuid, Path, description = "API key id")),
    responses(
        (status = 200, description = "The key, revoked.", body = ApiKey),
        KeyErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn revoke(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "api key")?;
    let key = state.ops().revoke_api_key(caller, id).await?;
    Ok(Json(ApiKey::from(key)).into_response())
}

/// Rotate an API key: a new secret for the same key (id, label and scopes stay).
///
/// The answer holds the new token, shown once. The old secret stops at once unless
/// `expiresInSeconds` (at most 604800, 7 days) gives it an overlap, during which both
/// work (`previousSecretExpiresAt`). Only one previous secret is kept: rotating again
/// during an overlap ends the older secret at once. A revoked key answers `409
/// API_KEY_REVOKED`. Not idempotent: each request issues a new secret.
#[utoipa::path(
    post,
    path = "/v1/api-keys/{id}/rotate",
    tag = "api-keys",
    operation_id = "rotateApiKey",
    request_body(content = RotateApiKeyRequest, content_type = "application/json", description = "Optional: an empty body, `{}`, or `{\"expiresInSeconds\": N}`."),
    params(("id" = Uuid, Path, description = "API key id")),
    responses(
        (status = 200, description = "Rotated; `token` is shown this once.", body = ApiKeyWithToken),
        KeyErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn rotate(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    JsonBody(body): JsonBody<RotateApiKeyRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "api key")?;
    let overlap = Duration::from_secs(body.expires_in_seconds.unwrap_or(0));
    let rotated = state.ops().rotate_api_key(caller, id, overlap).await?;
    Ok(Json(ApiKeyWithToken::from(rotated)).into_response())
}
