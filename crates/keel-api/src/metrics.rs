//! HTTP metrics of the api role, recorded by one tower layer ([`layer`]) around every
//! route, plus the refusals only an extractor can see (auth reason, body size).
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `keel_api_requests_total` | counter | `route`, `method`, `status` |
//! | `keel_api_request_duration_seconds` | histogram (s) | `route`, `method`, `status` |
//! | `keel_api_requests_in_flight` | gauge | — |
//! | `keel_api_body_too_large_total` | counter | — |
//! | `keel_api_auth_failures_total` | counter | `reason` |
//! | `keel_api_rate_limited_total` | counter | `limit` |
//! | `keel_api_rate_limit_requests_per_second` | gauge (requests/s; 0 = off) | `limit` |
//! | `keel_api_rate_limit_burst` | gauge (requests) | `limit` |
//!
//! Label sets (all bounded): `route` is the matched route template (`/v1/assets/{id}`),
//! never the raw path, and `<unmatched>` for a request no route matched; `method` is
//! one of `GET`, `POST`, `PUT`, `PATCH`, `DELETE`, `HEAD`, `OPTIONS` or `other`;
//! `status` is the status class `1xx` … `5xx`; `reason` is one of [`AuthFailure`]'s
//! labels; `limit` is `key` or `organization` ([`crate::rate_limit::Which`]), never an
//! id. The rate-limit gauges are set when the API's configuration is set
//! ([`crate::ApiState::with_config`]); the counter's two series start at 0 then.

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;

/// The `route` label of a request no route matched.
pub const UNMATCHED_ROUTE: &str = "<unmatched>";

/// Why a request was refused `401 UNAUTHENTICATED`, or `403 INSUFFICIENT_SCOPE` (the
/// `reason` label of `keel_api_auth_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header (`missing`).
    Missing,
    /// The header is not `Bearer <token>` in visible ASCII (`malformed`).
    Malformed,
    /// The token names no active API key (`invalid`).
    Invalid,
    /// The key lacks the route's scope (`insufficient_scope`; answered `403`).
    InsufficientScope,
}

impl AuthFailure {
    /// The label value: `missing`, `malformed`, `invalid` or `insufficient_scope`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::Invalid => "invalid",
            Self::InsufficientScope => "insufficient_scope",
        }
    }
}

/// Counts one refused authentication.
pub(crate) fn auth_failed(reason: AuthFailure) {
    metrics::counter!("keel_api_auth_failures_total", "reason" => reason.label()).increment(1);
}

/// Counts one request refused `429 RATE_LIMITED` by `limit`.
pub(crate) fn rate_limited(limit: crate::rate_limit::Which) {
    metrics::counter!("keel_api_rate_limited_total", "limit" => limit.label()).increment(1);
}

/// Exports the configured rate limits (gauges; a rate of 0 is off) and starts the
/// refusal counter's series at 0.
pub(crate) fn rate_limits_configured(config: &crate::rate_limit::RateLimitConfig) {
    use crate::rate_limit::Which;
    for (which, limit) in [
        (Which::Key, config.per_key),
        (Which::Organization, config.per_organization),
    ] {
        let label = which.label();
        metrics::gauge!("keel_api_rate_limit_requests_per_second", "limit" => label)
            .set(f64::from(limit.requests_per_second));
        let burst = if limit.is_on() { limit.burst.max(1) } else { 0 };
        metrics::gauge!("keel_api_rate_limit_burst", "limit" => label).set(f64::from(burst));
        metrics::counter!("keel_api_rate_limited_total", "limit" => label).increment(0);
    }
}

/// Counts one body refused for exceeding the body limit.
pub(crate) fn body_too_large() {
    metrics::counter!("keel_api_body_too_large_total").increment(1);
}

/// Describes (`# HELP`, with units) every metric of this crate. Call once after the
/// recorder is installed.
pub fn describe_metrics() {
    use metrics::Unit;
    metrics::describe_counter!(
        "keel_api_requests_total",
        Unit::Count,
        "HTTP requests answered by the api role, by route template, method and status class."
    );
    metrics::describe_histogram!(
        "keel_api_request_duration_seconds",
        Unit::Seconds,
        "Time from receiving an HTTP request to its response head, in seconds, by route \
         template, method and status class."
    );
    metrics::describe_gauge!(
        "keel_api_requests_in_flight",
        Unit::Count,
        "HTTP requests the api role is currently handling."
    );
    metrics::describe_counter!(
        "keel_api_body_too_large_total",
        Unit::Count,
        "Request bodies refused with 413 for exceeding api.maxBodyBytes."
    );
    metrics::describe_counter!(
        "keel_api_auth_failures_total",
        Unit::Count,
        "Requests refused with 401 (reason missing, malformed, invalid) or 403 (reason insufficient_scope)."
    );
    metrics::describe_counter!(
        "keel_api_rate_limited_total",
        Unit::Count,
        "Requests refused with 429 RATE_LIMITED, by the limit that refused (key: the API key's, organization: the organization's); per api replica."
    );
    metrics::describe_gauge!(
        "keel_api_rate_limit_requests_per_second",
        Unit::Count,
        "Configured sustained rate of each request rate limit (key, organization), requests per second per api replica; 0 when the limit is off."
    );
    metrics::describe_gauge!(
        "keel_api_rate_limit_burst",
        Unit::Count,
        "Configured burst of each request rate limit (key, organization): requests admitted at once from a full bucket, per api replica; 0 when the limit is off."
    );
    metrics::describe_counter!(
        "keel_api_custody_webhooks_total",
        Unit::Count,
        "Custody-provider webhook deliveries by provider and result (woken, unmatched, refused, too_large, keys_unavailable, error)."
    );
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

fn status_class(status: u16) -> &'static str {
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

/// Decrements the in-flight gauge when the request ends, also when it is dropped.
struct InFlight;

impl InFlight {
    fn start() -> Self {
        metrics::gauge!("keel_api_requests_in_flight").increment(1.0);
        Self
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!("keel_api_requests_in_flight").decrement(1.0);
    }
}

/// The request-metrics middleware; install with
/// `axum::middleware::from_fn(metrics::layer)` through `Router::layer`, so the matched
/// route is known.
pub async fn layer(req: Request, next: Next) -> Response {
    let route: String = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED_ROUTE.to_owned(), |p| p.as_str().to_owned());
    let method = method_label(req.method());
    let _in_flight = InFlight::start();
    let started = Instant::now();
    let response = next.run(req).await;
    let status = status_class(response.status().as_u16());
    let labels = [
        ("route", route),
        ("method", method.to_owned()),
        ("status", status.to_owned()),
    ];
    metrics::counter!("keel_api_requests_total", &labels).increment(1);
    metrics::histogram!("keel_api_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_are_bounded() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(404), "4xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(999), "5xx");
    }

    #[test]
    fn unknown_methods_are_other() {
        assert_eq!(method_label(&Method::GET), "GET");
        let custom = Method::from_bytes(b"BREW").unwrap_or(Method::TRACE);
        assert_eq!(method_label(&custom), "other");
    }
}
