//! Liveness, readiness and the OpenAPI document.

use crate::ApiState;
use crate::dto::Health;
use crate::problem::Problem;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

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
