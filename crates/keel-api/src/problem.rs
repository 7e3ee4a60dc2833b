//! `application/problem+json` error answers (RFC 9457) with Keel's stable codes.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_workflows::OpsError;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The `Retry-After` value (seconds) of every `503` answer.
pub const RETRY_AFTER_SECONDS: &str = "2";

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer: an RFC 9457 problem document with Keel's extension members
/// `code` (stable, machine-readable) and `retryable`.
///
/// `detail` never carries request values, SQL or secrets: it names the rule that was
/// broken (and at most the name of a field of Keel's own schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "type": "urn:keel:problem:IDEMPOTENCY_CONFLICT",
    "title": "Conflict",
    "status": 409,
    "code": "IDEMPOTENCY_CONFLICT",
    "retryable": false,
    "detail": "the idempotency key was used with a different request"
}))]
pub struct Problem {
    /// `urn:keel:problem:<code>`.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// The HTTP status's reason phrase (`Conflict`, `Not Found`, ...).
    pub title: String,
    /// The HTTP status code, repeated.
    pub status: u16,
    /// Stable machine-readable code: one of `x-error-codes` of this schema (also
    /// `docs/error-codes.md`), which lists every code with its HTTP status and meaning.
    pub code: String,
    /// Whether the same request may succeed later (true for 503 answers, `409
    /// INDEX_BEHIND` and `429 RATE_LIMITED`; those carry `Retry-After`).
    pub retryable: bool,
    /// Value-free description of what was wrong.
    pub detail: String,
}

impl Problem {
    /// A problem with `status`, `code` and a value-free `detail`; `retryable` is true
    /// exactly for 503.
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        Self {
            problem_type: format!("urn:keel:problem:{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            code: code.to_owned(),
            retryable: status == StatusCode::SERVICE_UNAVAILABLE,
            detail: detail.into(),
        }
    }

    /// 400 with `code`.
    pub fn bad_request(code: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    /// 401 `UNAUTHENTICATED`.
    pub fn unauthenticated() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            "missing or invalid API key",
        )
    }

    /// 404 `NOT_FOUND` for `what` (`asset`, `operation`, `route`).
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("{what} not found"),
        )
    }

    /// 500 `INTERNAL` (a bug: a handler panicked). Never carries the panic message.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "internal error",
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// The HTTP status of a service error: `401` unauthenticated; `403` a scope the key
/// lacks; `404` not found (also another organization's resource); `409` conflicts with
/// the resource's state (idempotency conflict, asset not ready, approval not pending /
/// same key / expired, not retryable, ended, a revoked key, a block the Ledger Index has
/// not reached: `atBlock` or, retryable with `Retry-After`, `minBlock`); `413` an input
/// over the engine's payload bounds; `422` invalid fields, amounts and an unconfigured
/// chain; `503` unavailable dependencies (retryable).
pub fn ops_status(e: &OpsError) -> StatusCode {
    match e {
        OpsError::Unauthenticated => StatusCode::UNAUTHORIZED,
        OpsError::InsufficientScope => StatusCode::FORBIDDEN,
        OpsError::NotFound { .. } => StatusCode::NOT_FOUND,
        OpsError::IdempotencyConflict
        | OpsError::AssetNotReady
        | OpsError::ApprovalNotPending
        | OpsError::NotRetryable
        | OpsError::FailureNotRetryable { .. }
        | OpsError::ApprovalExpired
        | OpsError::OperationEnded
        | OpsError::ApiKeyRevoked
        | OpsError::BlockNotIndexed { .. }
        | OpsError::SnapshotNotFinal
        | OpsError::SystemDisabled
        | OpsError::SystemNotDeployed
        | OpsError::AssetNotRegulated
        // The request names a block the index has not reached (as BLOCK_NOT_INDEXED):
        // a 409 with `Retry-After`, not a 5xx — the server is not failing.
        | OpsError::IndexBehind
        | OpsError::ApprovalSameKey => StatusCode::CONFLICT,
        OpsError::InvalidField { .. }
        | OpsError::Amount { .. }
        | OpsError::ChainNotConfigured
        | OpsError::ComplianceRefused { .. }
        | OpsError::BatchTooLarge { .. }
        | OpsError::UnknownRole => StatusCode::UNPROCESSABLE_ENTITY,
        // The engine's refusals are told apart by their codes.
        OpsError::Engine(_) => match e.code() {
            "PAYLOAD_TOO_LARGE_OR_DEEP" => StatusCode::PAYLOAD_TOO_LARGE,
            "IDEMPOTENCY_CONFLICT" => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        },
        OpsError::Index(_) | OpsError::Store(_) | OpsError::IndexDegraded => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        // A variant added later: unavailable when a retry can help, else a bug.
        _ if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<OpsError> for Problem {
    fn from(e: OpsError) -> Self {
        let status = ops_status(&e);
        if status.is_server_error() {
            tracing::warn!(code = e.code(), error = %e, "operations service unavailable");
        }
        let mut p = Self::new(status, e.code(), e.detail());
        p.retryable = e.is_retryable();
        p
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut res = (status, body).into_response();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        // RFC 9110 §10.2.3: every 503 tells the client when to come back, and so does a
        // retryable 409 (`INDEX_BEHIND`: the index has not reached `minBlock` yet).
        if status == StatusCode::SERVICE_UNAVAILABLE
            || (status == StatusCode::CONFLICT && self.retryable)
        {
            res.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_durable::DurableError;
    use keel_durable::payload::BoundError;

    /// Every service error answers its documented status, retryable exactly for 503 and
    /// `INDEX_BEHIND` (409).
    #[test]
    fn service_errors_map_to_their_statuses() {
        let cases: Vec<(OpsError, u16)> = vec![
            (OpsError::Unauthenticated, 401),
            (OpsError::NotFound { what: "asset" }, 404),
            (OpsError::IdempotencyConflict, 409),
            (OpsError::AssetNotReady, 409),
            (OpsError::ApprovalSameKey, 409),
            (OpsError::ApprovalNotPending, 409),
            (OpsError::NotRetryable, 409),
            (
                OpsError::FailureNotRetryable {
                    code: "EXECUTION_REVERTED".into(),
                },
                409,
            ),
            (OpsError::ApprovalExpired, 409),
            (OpsError::OperationEnded, 409),
            (OpsError::InsufficientScope, 403),
            (OpsError::ApiKeyRevoked, 409),
            (
                OpsError::InvalidField {
                    field: "name",
                    reason: "r",
                },
                422,
            ),
            (
                OpsError::Amount {
                    field: "amount",
                    source: keel_units::UnitsError::Negative,
                },
                422,
            ),
            (OpsError::ChainNotConfigured, 422),
            (
                OpsError::Engine(DurableError::InvalidInput(BoundError::TooLarge {
                    what: "input",
                    limit: 1,
                })),
                413,
            ),
            (
                OpsError::Engine(DurableError::IdempotencyConflict {
                    workflow: "asset.mint".into(),
                    instance_id: uuid::Uuid::nil(),
                }),
                409,
            ),
            (OpsError::Engine(DurableError::Fenced), 503),
            (OpsError::IndexBehind, 409),
            (OpsError::IndexDegraded, 503),
            (OpsError::BlockNotIndexed { indexed: None }, 409),
            (OpsError::SnapshotNotFinal, 409),
            (OpsError::SystemDisabled, 409),
            (OpsError::SystemNotDeployed, 409),
            (OpsError::AssetNotRegulated, 409),
            (
                OpsError::ComplianceRefused {
                    code: "COMPLIANCE_NOT_ELIGIBLE",
                },
                422,
            ),
            (OpsError::BatchTooLarge { max: 100 }, 422),
            (OpsError::Store(keel_store::StoreError::Decode), 503),
        ];
        for (e, status) in cases {
            let code = e.code();
            let p = Problem::from(e);
            assert_eq!(p.status, status, "{code}");
            assert_eq!(p.code, code);
            assert_eq!(
                p.retryable,
                status == 503 || code == "INDEX_BEHIND",
                "{code}"
            );
        }
    }
}
