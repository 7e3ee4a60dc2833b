//! Which scope each route requires: [`ROUTES`], the one table the authorization layer
//! ([`authorize`]) enforces and the OpenAPI document's `security` requirements are
//! generated from.
//!
//! Rules: `GET` routes need `read`; operation-creating `POST`s, retry and cancel need
//! `operate` (and so does creating a snapshot); approve and reject need `approve`; the `/v1/api-keys`,
//! `/v1/webhook-endpoints`, `/v1/status`, re-index routes and the organization systems' `POST`s (`/v1/organizations/{id}/system…`) need `admin`. `/healthz`, `/readyz` and `/openapi.json` are public.
//!
//! ## Adding a route
//! Add its line to [`ROUTES`] — method, the route template exactly as given to
//! `Router::route`, and its [`Access`] — next to the `.route(...)` call in
//! [`crate::router`]. Nothing else: the layer authenticates the key (`401
//! UNAUTHENTICATED`), refuses a key without the scope (`403 INSUFFICIENT_SCOPE`,
//! before any extractor or handler runs), admits the request against the key's and the
//! organization's rate limits (`429 RATE_LIMITED`; [`crate::rate_limit`]), refuses a query parameter the route's
//! document entry does not declare (`400 UNKNOWN_QUERY_PARAMETER`, naming it, never
//! its value; [`check_query`]), and hands the handler the caller
//! ([`crate::extract::Authed`], [`crate::extract::Authorized`]); the document gets the
//! route's `security` and its `403` answer. A served route missing from the table
//! answers `500 INTERNAL` to every request (fail closed), and the test
//! `every_documented_route_declares_its_scope` fails for a documented one.

use crate::ApiState;
use crate::problem::Problem;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keel_workflows::{Credential, Scope};
use std::sync::LazyLock;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without an API key.
    Public,
    /// An API key holding this scope.
    Key(Scope),
}

/// One line of the table: a method (lowercase, as the OpenAPI document's keys:
/// `get`, `post`, ...), a route template and its [`Access`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteAccess {
    /// The HTTP method, lowercase. (`HEAD` is served by `GET` routes and needs what
    /// `GET` needs.)
    pub method: &'static str,
    /// The route template as registered (`/v1/assets/{id}/mint`).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

const fn key(method: &'static str, path: &'static str, scope: Scope) -> RouteAccess {
    RouteAccess {
        method,
        path,
        access: Access::Key(scope),
    }
}

/// A public `POST`: the request authenticates itself (a provider webhook's signature).
const fn public_post(path: &'static str) -> RouteAccess {
    RouteAccess {
        method: "post",
        path,
        access: Access::Public,
    }
}

const fn public(path: &'static str) -> RouteAccess {
    RouteAccess {
        method: "get",
        path,
        access: Access::Public,
    }
}

/// Every route of the Platform API with what it requires.
pub const ROUTES: &[RouteAccess] = &[
    key("get", "/v1/assets", Scope::Read),
    key("post", "/v1/assets", Scope::Operate),
    key("get", "/v1/assets/{id}", Scope::Read),
    key("post", "/v1/assets/{id}/mint", Scope::Operate),
    key("post", "/v1/assets/{id}/transfer", Scope::Operate),
    key("post", "/v1/assets/{id}/pause", Scope::Operate),
    key("post", "/v1/assets/{id}/unpause", Scope::Operate),
    key("post", "/v1/assets/{id}/burn", Scope::Operate),
    key("post", "/v1/assets/{id}/grant-role", Scope::Operate),
    key("post", "/v1/assets/{id}/revoke-role", Scope::Operate),
    key("post", "/v1/assets/{id}/set-compliance", Scope::Operate),
    key("post", "/v1/assets/{id}/freeze", Scope::Operate),
    key("post", "/v1/assets/{id}/unfreeze", Scope::Operate),
    key("post", "/v1/assets/{id}/forced-transfer", Scope::Operate),
    key("post", "/v1/assets/{id}/recover", Scope::Operate),
    key("post", "/v1/assets/{id}/batch-mint", Scope::Operate),
    key("post", "/v1/assets/{id}/batch-transfer", Scope::Operate),
    key("get", "/v1/assets/{id}/balances/{address}", Scope::Read),
    key("get", "/v1/assets/{id}/holders", Scope::Read),
    key(
        "get",
        "/v1/assets/{id}/holders/{address}/transfers",
        Scope::Read,
    ),
    key("get", "/v1/assets/{id}/transfers", Scope::Read),
    key("get", "/v1/assets/{id}/supply", Scope::Read),
    key("post", "/v1/assets/{id}/snapshots", Scope::Operate),
    key("get", "/v1/assets/{id}/snapshots", Scope::Read),
    key("get", "/v1/assets/{id}/snapshots/{snapshotId}", Scope::Read),
    key(
        "get",
        "/v1/assets/{id}/snapshots/{snapshotId}/holders",
        Scope::Read,
    ),
    key(
        "get",
        "/v1/assets/{id}/snapshots/{snapshotId}/export",
        Scope::Read,
    ),
    key("get", "/v1/assets/{id}/distributions", Scope::Read),
    key("post", "/v1/distributions", Scope::Operate),
    key("post", "/v1/organizations/{id}/system", Scope::Admin),
    key("get", "/v1/organizations/{id}/systems", Scope::Read),
    key("post", "/v1/organizations/{id}/investors", Scope::Operate),
    key(
        "post",
        "/v1/organizations/{id}/systems/{systemId}/enable",
        Scope::Admin,
    ),
    key(
        "post",
        "/v1/organizations/{id}/systems/{systemId}/disable",
        Scope::Admin,
    ),
    key("get", "/v1/distributions/{id}", Scope::Read),
    key("post", "/v1/distributions/{id}/pause", Scope::Operate),
    key("post", "/v1/distributions/{id}/resume", Scope::Operate),
    key("get", "/v1/distributions/{id}/payments", Scope::Read),
    key("get", "/v1/operations", Scope::Read),
    key("get", "/v1/templates", Scope::Read),
    key("get", "/v1/operations/{id}", Scope::Read),
    key("get", "/v1/operations/{id}/history", Scope::Read),
    key("post", "/v1/operations/{id}/approve", Scope::Approve),
    key("post", "/v1/operations/{id}/reject", Scope::Approve),
    key("post", "/v1/operations/{id}/retry", Scope::Operate),
    key("post", "/v1/operations/{id}/cancel", Scope::Operate),
    key("get", "/v1/funding-requests", Scope::Read),
    key("get", "/v1/api-keys", Scope::Admin),
    key("post", "/v1/api-keys", Scope::Admin),
    key("post", "/v1/api-keys/{id}/revoke", Scope::Admin),
    key("post", "/v1/api-keys/{id}/rotate", Scope::Admin),
    key("get", "/v1/webhook-endpoints", Scope::Admin),
    key("post", "/v1/webhook-endpoints", Scope::Admin),
    key("get", "/v1/webhook-endpoints/{id}", Scope::Admin),
    key("patch", "/v1/webhook-endpoints/{id}", Scope::Admin),
    key("delete", "/v1/webhook-endpoints/{id}", Scope::Admin),
    key(
        "post",
        "/v1/webhook-endpoints/{id}/rotate-secret",
        Scope::Admin,
    ),
    key("post", "/v1/webhook-endpoints/{id}/test", Scope::Admin),
    key("get", "/v1/webhook-endpoints/{id}/deliveries", Scope::Admin),
    key("get", "/v1/status", Scope::Admin),
    key("post", "/v1/chains/{chain}/index/reindex", Scope::Admin),
    // ERC-4337 user operations (issue 20).
    key("post", "/v1/chains/{chain}/bundler", Scope::Operate),
    key("post", "/v1/user-operations", Scope::Operate),
    key("get", "/v1/user-operations/{hash}", Scope::Read),
    // Authenticated by the provider's webhook signature, not an API key (issue 19).
    public_post("/v1/custody/webhooks/fireblocks"),
    public("/healthz"),
    public("/readyz"),
    public("/openapi.json"),
];

/// What `method` on route template `path` requires, if the table declares it.
pub fn access(method: &Method, path: &str) -> Option<Access> {
    let method = if method == Method::HEAD {
        Method::GET.as_str()
    } else {
        method.as_str()
    };
    ROUTES
        .iter()
        .find(|r| r.method.eq_ignore_ascii_case(method) && r.path == path)
        .map(|r| r.access)
}

/// The query parameters each documented operation declares: (method, route template,
/// parameter names), read once from the OpenAPI document, so what a route accepts
/// and what the document says it accepts are one list.
static QUERY_PARAMETERS: LazyLock<Vec<(String, String, Vec<String>)>> = LazyLock::new(|| {
    use utoipa::openapi::path::ParameterIn;
    let doc = crate::openapi();
    let mut out = Vec::new();
    for (path, item) in &doc.paths.paths {
        let ops = [
            ("get", item.get.as_ref()),
            ("post", item.post.as_ref()),
            ("put", item.put.as_ref()),
            ("patch", item.patch.as_ref()),
            ("delete", item.delete.as_ref()),
        ];
        for (method, op) in ops {
            let Some(op) = op else { continue };
            let names = op
                .parameters
                .iter()
                .flatten()
                .filter(|p| p.parameter_in == ParameterIn::Query)
                .map(|p| p.name.clone())
                .collect();
            out.push((method.to_owned(), path.clone(), names));
        }
    }
    out
});

/// The query parameter names the document declares for `method` on route template
/// `path` (`HEAD` as `GET`); `None` for an undocumented route.
pub fn query_parameters(method: &Method, path: &str) -> Option<&'static [String]> {
    let method = if method == Method::HEAD {
        Method::GET.as_str()
    } else {
        method.as_str()
    };
    QUERY_PARAMETERS
        .iter()
        .find(|(m, p, _)| m.eq_ignore_ascii_case(method) && p == path)
        .map(|(_, _, names)| names.as_slice())
}

/// A parameter name short and plain enough to be named in a problem's `detail`
/// (a name is the client's text too: anything else is only counted, never echoed).
fn nameable(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'[' | b']'))
}

/// Refuses a query string naming a parameter the route does not declare: `400
/// UNKNOWN_QUERY_PARAMETER`, naming the parameter (when its name is plain text of at
/// most 64 characters) and the accepted ones, never a value. A query that cannot be
/// decoded at all is `400 INVALID_QUERY`. An undocumented route accepts nothing.
///
/// # Errors
/// The problem above.
pub fn check_query(method: &Method, template: &str, query: Option<&str>) -> Result<(), Problem> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(());
    };
    let accepted = query_parameters(method, template).unwrap_or(&[]);
    let malformed = || Problem::bad_request("INVALID_QUERY", "the query string is malformed");
    let uri: axum::http::Uri = format!("/?{query}").parse().map_err(|_| malformed())?;
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map_err(|_| malformed())?;
    let Some((name, _)) = pairs.iter().find(|(n, _)| !accepted.contains(n)) else {
        return Ok(());
    };
    let listed = if accepted.is_empty() {
        "this route accepts no query parameters".to_owned()
    } else {
        format!("accepted: {}", accepted.join(", "))
    };
    let detail = if nameable(name) {
        format!("query parameter `{name}` is not accepted by this route ({listed})")
    } else {
        format!("a query parameter is not accepted by this route ({listed})")
    };
    Err(Problem::bad_request("UNKNOWN_QUERY_PARAMETER", detail))
}

/// `403 INSUFFICIENT_SCOPE` for a key without `scope`.
pub fn insufficient_scope(scope: Scope) -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        "INSUFFICIENT_SCOPE",
        format!("the API key lacks the `{scope}` scope this route requires"),
    )
}

/// Reads the bearer token of `Authorization` and authenticates it (`401
/// UNAUTHENTICATED` when missing, malformed, unknown, revoked or rotated away).
async fn authenticate(headers: &HeaderMap, state: &ApiState) -> Result<Credential, Problem> {
    use crate::metrics::{AuthFailure, auth_failed};
    let refuse = |reason: AuthFailure| {
        auth_failed(reason);
        Problem::unauthenticated()
    };
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| refuse(AuthFailure::Missing))?;
    let value = value.to_str().map_err(|_| refuse(AuthFailure::Malformed))?;
    let (scheme, token) = value
        .trim()
        .split_once(' ')
        .ok_or_else(|| refuse(AuthFailure::Malformed))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(refuse(AuthFailure::Malformed));
    }
    match state.ops().authenticate_credential(token.trim()).await {
        Ok(credential) => Ok(credential),
        Err(keel_workflows::OpsError::Unauthenticated) => Err(refuse(AuthFailure::Invalid)),
        Err(e) => Err(e.into()),
    }
}

/// The authorization layer (installed with `Router::route_layer`, so it runs only for
/// matched routes): looks the matched route up in [`ROUTES`], lets public routes pass,
/// and for the others authenticates the key, checks its scope, admits the request
/// against the rate limits ([`crate::rate_limit`]: `429` when over one, else the
/// answer carries the `RateLimit` fields) and stores the
/// [`Credential`] in the request's extensions for the handler's extractors. The key is
/// read from the database on every request (no cache).
pub async fn authorize(State(state): State<ApiState>, mut req: Request, next: Next) -> Response {
    let template = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let Some(access) = template.as_deref().and_then(|t| access(req.method(), t)) else {
        tracing::error!(
            route = template.as_deref().unwrap_or("<unmatched>"),
            method = %req.method(),
            "the route is missing from keel_api::scope::ROUTES; refusing"
        );
        return Problem::internal().into_response();
    };
    let query_ok = |req: &Request| {
        check_query(
            req.method(),
            template.as_deref().unwrap_or(""),
            req.uri().query(),
        )
    };
    match access {
        Access::Public => match query_ok(&req) {
            Ok(()) => next.run(req).await,
            Err(p) => p.into_response(),
        },
        Access::Key(scope) => match authenticate(req.headers(), &state).await {
            Ok(credential) if credential.scopes.contains(scope) => {
                // The key's limit, then the organization's ([`crate::rate_limit`]).
                let admitted = match state.rate_limits().check(&credential.caller) {
                    Ok(admitted) => admitted,
                    Err(limited) => return limited.into_response(),
                };
                let mut res = match query_ok(&req) {
                    Err(p) => p.into_response(),
                    Ok(()) => {
                        req.extensions_mut().insert(credential);
                        next.run(req).await
                    }
                };
                if let Some(admitted) = admitted {
                    admitted.apply(&mut res);
                }
                res
            }
            Ok(_) => {
                crate::metrics::auth_failed(crate::metrics::AuthFailure::InsufficientScope);
                insufficient_scope(scope).into_response()
            }
            Err(p) => p.into_response(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every documented operation has a line in the table and every line is
    /// documented; keyed routes follow the rules (GET → read, `/v1/api-keys` and
    /// `/v1/webhook-endpoints` (signing secrets) and `/v1/status` → admin,
    /// approve/reject → approve, other POSTs → operate), and the document states each
    /// keyed route's scope as its `security` requirement and answers `403`.
    #[test]
    fn every_documented_route_declares_its_scope() {
        let doc: serde_json::Value = serde_json::from_str(&crate::openapi_json()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        let mut documented = 0;
        for (path, item) in paths {
            for (method, op) in item.as_object().unwrap() {
                let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let access = access(&method, path)
                    .unwrap_or_else(|| panic!("{method} {path} declares no scope in ROUTES"));
                documented += 1;
                match access {
                    Access::Public => assert!(op.get("security").is_none(), "{method} {path}"),
                    Access::Key(scope) => {
                        let expected = if path.starts_with("/v1/api-keys")
                            || path.starts_with("/v1/webhook-endpoints")
                            || path == "/v1/status"
                            || path.ends_with("/index/reindex")
                            || (path.starts_with("/v1/organizations/")
                                && path.contains("/system")
                                && method == Method::POST)
                        {
                            Scope::Admin
                        } else if method == Method::GET {
                            Scope::Read
                        } else if path.ends_with("/approve") || path.ends_with("/reject") {
                            Scope::Approve
                        } else {
                            Scope::Operate
                        };
                        assert_eq!(scope, expected, "{method} {path}");
                        assert_eq!(
                            op["security"],
                            serde_json::json!([{"bearer": [scope.as_str()]}]),
                            "{method} {path}"
                        );
                        assert!(op["responses"].get("403").is_some(), "{method} {path}");
                        assert!(op["responses"].get("401").is_some(), "{method} {path}");
                    }
                }
            }
        }
        assert_eq!(
            documented,
            ROUTES.len(),
            "a line of ROUTES is not documented"
        );
    }

    /// Every operation kind (keel-workflows' one list) has its `POST` route in the
    /// table, under the operate scope, and documented with the operation id its route
    /// starts: a new kind without its handler, route or scope line fails here.
    #[test]
    fn every_operation_kind_has_its_route() {
        let doc: serde_json::Value = serde_json::from_str(&crate::openapi_json()).unwrap();
        for kind in keel_workflows::OperationKind::ALL {
            let route = kind.route();
            // An organization's own system is an administrator's decision (issue 37).
            let scope = if *kind == keel_workflows::OperationKind::OrgSystemDeploy {
                Scope::Admin
            } else {
                Scope::Operate
            };
            assert_eq!(
                access(&Method::POST, &route),
                Some(Access::Key(scope)),
                "{kind}: POST {route}"
            );
            assert!(
                doc["paths"][route.as_str()]["post"].is_object(),
                "{kind}: POST {route} is not documented"
            );
        }
    }

    /// A parameter the document declares passes; any other is named (when plain) and
    /// its value never appears; a name that is not plain text is not echoed.
    #[test]
    fn unknown_query_parameters_are_named_never_their_values() {
        let balance = "/v1/assets/{id}/balances/{address}";
        assert!(check_query(&Method::GET, balance, Some("atBlock=20&minBlock=3")).is_ok());
        assert!(check_query(&Method::GET, balance, None).is_ok());
        let p = check_query(&Method::GET, balance, Some("atBlock=1&fromBlock=SECRET")).unwrap_err();
        assert_eq!(
            (p.status, p.code.as_str()),
            (400, "UNKNOWN_QUERY_PARAMETER")
        );
        assert!(p.detail.contains("`fromBlock`"), "{p:?}");
        assert!(p.detail.contains("atBlock"), "{p:?}");
        assert!(!p.detail.contains("SECRET"), "{p:?}");
        let p = check_query(&Method::GET, "/healthz", Some("%3Cb%3E=1")).unwrap_err();
        assert!(!p.detail.contains("<b>"), "{p:?}");
        let long = format!("{}=1", "a".repeat(65));
        let p = check_query(&Method::GET, "/healthz", Some(&long)).unwrap_err();
        assert!(!p.detail.contains(&"a".repeat(65)), "{p:?}");
        // HEAD reads what GET reads.
        assert!(check_query(&Method::HEAD, balance, Some("atBlock=1")).is_ok());
    }

    #[test]
    fn head_needs_what_get_needs() {
        assert_eq!(
            access(&Method::HEAD, "/v1/assets"),
            Some(Access::Key(Scope::Read))
        );
        assert_eq!(access(&Method::DELETE, "/v1/assets"), None);
    }
}
