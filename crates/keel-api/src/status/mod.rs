//! Platform Status (issue 22): `GET /v1/status` (JSON, an `admin` key) and the
//! server-rendered page `/status` (HTML with a little inline CSS; no script, nothing
//! loaded from elsewhere), both from [`keel_workflows::Ops::platform_status`], which
//! reads the database only: every api replica shows the same.
//!
//! ## The page's credential
//! An operator's browser cannot set an `Authorization` header, so the page takes the
//! admin key either way:
//! - `Authorization: Bearer <key>` (curl, a proxy that injects it);
//! - the cookie `keel_status`, set by the page's own login form: `GET /status`
//!   without a valid credential answers `401` with a form; `POST /status/login`
//!   (`key=<api key>`, form-encoded) checks the key (it must hold the `admin` scope)
//!   and answers `303` to `/status` with `Set-Cookie: keel_status=<key>; HttpOnly;
//!   SameSite=Lax; Path=/status; Max-Age=28800`; `POST /status/logout` clears it.
//!
//! The cookie holds the key itself (no server-side session: any replica accepts it,
//! and a revoked key stops working at the next request). It is not marked `Secure`
//! because Keel serves plain HTTP behind the TLS terminator; serve `/status` only over
//! HTTPS. The page sends `Content-Security-Policy: default-src 'none'; style-src
//! 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'`, `Cache-Control:
//! no-store` and `Referrer-Policy: no-referrer`.
//!
//! The page routes are outside [`crate::scope::ROUTES`] (they are not part of the
//! JSON API and its document) and check the credential themselves.
//!
//! Modules: `model` (the JSON view model), `view` (from keel-workflows' view), `auth`
//! (cookie and bearer credential, login, logout, the page handler), `render` (the HTML
//! and its escaping), `css` (the inline style sheet).

use crate::ApiState;
use crate::extract::Authed;
use crate::problem::Problem;
use axum::Json;
use axum::extract::State;
use keel_workflows::OpsError;
use utoipa::IntoResponses;

mod auth;
mod css;
mod model;
mod render;
mod view;

pub use auth::*;
use css::*;
pub use model::*;
use render::*;
use view::*;

/// Errors of `GET /v1/status` (for the OpenAPI document; `403` is added by the
/// document's fixups).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum StatusErrors {
    /// `UNAUTHENTICATED`: missing, invalid, revoked or rotated-away API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `SERVICE_UNAVAILABLE`: the database failed; retry.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

async fn read(state: &ApiState) -> Result<PlatformStatus, OpsError> {
    let view = state.ops().platform_status(state.config().status).await?;
    let cfg = state.config().index_status;
    let heads = read_heads(state, &view, cfg.head_read_timeout).await;
    Ok(PlatformStatus::of(&view, &heads, cfg))
}

/// `GET /v1/status`: the Platform Status ([`PlatformStatus`]) from the database.
#[utoipa::path(get, path = "/v1/status", tag = "status", operation_id = "getPlatformStatus",
    responses((status = 200, description = "The platform's state, read from the database (any api replica answers the same).", body = PlatformStatus), StatusErrors),
    security(("bearer" = [])))]
pub(crate) async fn get_status(
    State(state): State<ApiState>,
    Authed(_): Authed,
) -> Result<Json<PlatformStatus>, Problem> {
    Ok(Json(read(&state).await?))
}
