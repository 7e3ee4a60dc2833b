//! The page's credential (see the [module docs](super)): bearer header or the
//! `keel_status` cookie, the login form, login, logout, and the page handler.

use crate::ApiState;
use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_workflows::Scope;
use serde::Deserialize;

use super::*;

/// The page's cookie.
pub const COOKIE: &str = "keel_status";

/// How long the page's cookie lives, seconds (8 h).
pub const COOKIE_MAX_AGE_SECS: u64 = 28_800;

/// Why the page refuses a credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    Missing,
    Invalid,
    NotAdmin,
}

pub(super) fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim().to_owned())
}

pub(super) fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

pub(super) async fn check_admin(state: &ApiState, token: Option<String>) -> Result<(), Refusal> {
    let token = token.filter(|t| !t.is_empty()).ok_or(Refusal::Missing)?;
    match state.ops().authenticate_credential(&token).await {
        Ok(c) if c.scopes.contains(Scope::Admin) => Ok(()),
        Ok(_) => Err(Refusal::NotAdmin),
        Err(_) => Err(Refusal::Invalid),
    }
}

pub(super) fn page_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

pub(super) fn login_page(status: StatusCode, refusal: Refusal) -> Response {
    let message = match refusal {
        Refusal::Missing => "Sign in with an API key that holds the admin scope.",
        Refusal::Invalid => "The key is unknown, revoked or rotated away.",
        Refusal::NotAdmin => "The key lacks the admin scope.",
    };
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Keel status: sign in</title>\
<style>{CSS}</style></head><body><h1>Keel Platform Status</h1><p class=\"warn\">{message}</p>\
<form method=\"post\" action=\"/status/login\"><label>API key <input type=\"password\" name=\"key\" \
autocomplete=\"off\" required></label> <button type=\"submit\">Sign in</button></form></body></html>"
    );
    page_headers((status, body).into_response())
}

/// The login form's body.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    key: String,
}

/// `POST /status/login`: checks the key (admin scope) and sets the page's cookie.
pub(crate) async fn login(State(state): State<ApiState>, Form(form): Form<LoginForm>) -> Response {
    let token = form.key.trim().to_owned();
    match check_admin(&state, Some(token.clone())).await {
        Ok(()) => {
            // A token is `keel_<base64url>` (checked by authentication): cookie-safe.
            let cookie = format!(
                "{COOKIE}={token}; HttpOnly; SameSite=Lax; Path=/status; Max-Age={COOKIE_MAX_AGE_SECS}"
            );
            let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/status")]).into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(refusal) => login_page(StatusCode::UNAUTHORIZED, refusal),
    }
}

/// `POST /status/logout`: clears the page's cookie.
pub(crate) async fn logout() -> Response {
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/status")]).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("keel_status=; HttpOnly; SameSite=Lax; Path=/status; Max-Age=0"),
    );
    r
}

/// `GET /status`: the page (bearer header or cookie; else the login form).
pub(crate) async fn page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let token = bearer_token(&headers).or_else(|| cookie_token(&headers));
    if let Err(refusal) = check_admin(&state, token).await {
        let status = if refusal == Refusal::NotAdmin {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::UNAUTHORIZED
        };
        return login_page(status, refusal);
    }
    match read(&state).await {
        Ok(status) => page_headers((StatusCode::OK, render(&status)).into_response()),
        Err(e) => {
            tracing::warn!(target: "keel::api::status", code = e.code(), "platform status read failed");
            page_headers(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Keel status</title>\
<style>{CSS}</style></head><body><h1>Keel Platform Status</h1><p class=\"bad\">The database did not answer ({}). Reload to retry.</p></body></html>",
                        esc(e.code())
                    ),
                )
                    .into_response(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cookie_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; keel_status=keel_abc ; b=2"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("keel_abc"));
        h.insert(header::COOKIE, HeaderValue::from_static("keel_statusx=1"));
        assert_eq!(cookie_token(&h), None);
    }
}
