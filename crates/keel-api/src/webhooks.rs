//! Webhooks (issue 21): the `/v1/webhook-endpoints` routes over
//! [`keel_webhooks::Webhooks`], and the `data` of operations' webhook events, which is
//! this API's [`crate::dto::Operation`] as `GET /v1/operations/{id}` serves it (one
//! schema, in the OpenAPI document; the binary passes [`operation_renderer`] to
//! [`keel_workflows::OperationEvents`]).
//!
//! Bodies are read by the shared streaming body parser ([`crate::extract::JsonBody`],
//! as every other route): unknown members → `400 UNKNOWN_FIELD`, a duplicate member,
//! a missing one or a wrong JSON type → `400 INVALID_FIELD` naming the field, an
//! oversized body → `413 PAYLOAD_TOO_LARGE`; a value that breaks a rule (a refused URL,
//! an unknown event type, a long description) → `422 INVALID_FIELD`. Endpoints of other
//! organizations answer `404 NOT_FOUND`. Lists use the shared cursor pages
//! ([`crate::page`]).

use crate::ApiState;
use crate::extract::{Authed, Field, FieldKind, JsonBody, RequestBody};
use crate::page::{Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::{Query, RawPathParams, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_webhooks::{Endpoint, EndpointInput, WebhookError};
use keel_workflows::{OperationView, Renderer};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoResponses, ToSchema};
use uuid::Uuid;

/// The `data` of an `operation.*` webhook event: the operation view as the API's
/// `Operation` JSON.
pub fn operation_data(view: &OperationView) -> serde_json::Value {
    serde_json::to_value(crate::dto::Operation::from(view.clone())).unwrap_or_default()
}

/// [`operation_data`] as a [`Renderer`].
pub fn operation_renderer() -> Renderer {
    Arc::new(operation_data)
}

/// A webhook endpoint (its secret is never shown again after creation or rotation).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookEndpoint {
    /// Endpoint id.
    pub id: Uuid,
    /// Delivery URL.
    pub url: String,
    /// Free text.
    pub description: String,
    /// Subscribed event types (see `keel_webhooks::EVENT_TYPES`), or `*`.
    pub event_types: Vec<String>,
    /// Whether events are delivered.
    pub enabled: bool,
    /// Why Keel disabled it: `gone` (it answered 410) or `failing` (it failed for the
    /// whole retry window); null otherwise.
    pub disabled_reason: Option<String>,
    /// During a rotation overlap: when the previous secret stops signing.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<Endpoint> for WebhookEndpoint {
    fn from(e: Endpoint) -> Self {
        Self {
            id: e.id,
            url: e.url,
            description: e.description,
            event_types: e.event_types,
            enabled: e.enabled,
            disabled_reason: e.disabled_reason,
            previous_secret_expires_at: e.previous_secret_expires_at,
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// An endpoint with its signing secret (answer of create and rotate only).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookEndpointWithSecret {
    /// The endpoint.
    pub endpoint: WebhookEndpoint,
    /// The signing secret, `whsec_` + base64 of 32 bytes (Standard Webhooks). Shown
    /// only in this answer.
    pub secret: String,
}

/// A page of endpoints, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookEndpointList {
    /// The endpoints.
    pub data: Vec<WebhookEndpoint>,
    /// Whether more follow.
    pub has_more: bool,
    /// Pass back as `cursor` for the next page; null when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// `POST /v1/webhook-endpoints`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateWebhookEndpointRequest {
    /// An absolute `https` URL of at most 2048 bytes, without user info or fragment.
    /// Refused with `422 INVALID_FIELD` as well, by rules no schema can state: a host
    /// that does not resolve, or that is or resolves to a loopback, private,
    /// link-local or metadata address.
    #[schema(
        format = "uri",
        max_length = 2048,
        pattern = "^[Hh][Tt][Tt][Pp][Ss]://"
    )]
    pub url: String,
    /// 1 to 32 event types, or `["*"]`.
    #[schema(min_items = 1, max_items = 32)]
    pub event_types: Vec<String>,
    /// Free text, at most 256 printable (non-control) characters.
    #[schema(max_length = 256, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    #[serde(default)]
    pub description: Option<String>,
    /// Default true.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/webhook-endpoints/{id}`: the members given are changed.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateWebhookEndpointRequest {
    /// New URL (the rules of `CreateWebhookEndpointRequest.url`).
    #[schema(
        format = "uri",
        max_length = 2048,
        pattern = "^[Hh][Tt][Tt][Pp][Ss]://"
    )]
    #[serde(default)]
    pub url: Option<String>,
    /// New event types: 1 to 32, or `["*"]`.
    #[schema(min_items = 1, max_items = 32)]
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// New description: at most 256 printable (non-control) characters.
    #[schema(max_length = 256, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    #[serde(default)]
    pub description: Option<String>,
    /// Enable (resets the circuit breaker) or disable.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `POST /v1/webhook-endpoints/{id}/rotate-secret`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RotateSecretRequest {
    /// How long the previous secret keeps signing, seconds (0 to 604800, i.e. 7 days;
    /// absent or null: 86400). An integral JSON number such as `60.0` is the integer it
    /// denotes (as JSON Schema reads it).
    #[schema(minimum = 0, maximum = 604_800)]
    #[serde(default, deserialize_with = "crate::dto::integral_u64_opt")]
    pub overlap_seconds: Option<u64>,
}

/// A test delivery was queued.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookTestQueued {
    /// The test event's id (its `webhook-id`).
    pub event_id: Uuid,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookAttempt {
    /// When it was made.
    pub attempted_at: DateTime<Utc>,
    /// The HTTP status, null without a response.
    pub http_status: Option<i32>,
    /// Milliseconds until the answer (or the error).
    pub latency_ms: i32,
    /// `timeout`, `connect`, `network`, `blocked_address`, `http_3xx`, `http_4xx`,
    /// `http_5xx`, `gone`; null on success.
    pub error_class: Option<String>,
    /// The retry it scheduled, if any.
    pub next_retry_at: Option<DateTime<Utc>>,
}

/// A delivery of an event to the endpoint.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookDelivery {
    /// Delivery id.
    pub id: Uuid,
    /// The event (its `webhook-id`).
    pub event_id: Uuid,
    /// The event type.
    pub event_type: String,
    /// `pending`, `succeeded`, `failed`, `cancelled`.
    pub state: String,
    /// A test delivery.
    pub test: bool,
    /// The next attempt, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Its attempts, oldest first.
    pub attempts: Vec<WebhookAttempt>,
}

/// A page of deliveries, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookDeliveryList {
    /// The deliveries.
    pub data: Vec<WebhookDelivery>,
    /// Whether more follow.
    pub has_more: bool,
    /// Pass back as `cursor` for the next page; null when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// Errors of the webhook endpoint routes (for the OpenAPI document).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum WebhookErrors {
    /// `MALFORMED_JSON`, `JSON_TOO_DEEP`, `UNKNOWN_FIELD`, `INVALID_FIELD` (not an
    /// object, a duplicate, missing or wrongly typed member, named), `INVALID_QUERY`,
    /// `UNKNOWN_QUERY_PARAMETER`, `INVALID_CURSOR`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such endpoint in the caller's organization.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    Unsupported(Problem),
    /// `INVALID_FIELD`: a value breaks a rule (a refused URL, an unknown event type).
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
}

fn problem(e: WebhookError) -> Problem {
    let unprocessable =
        |detail: String| Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "INVALID_FIELD", detail);
    match e {
        WebhookError::InvalidUrl { reason } => unprocessable(format!("field `url`: {reason}")),
        WebhookError::UnknownEventType => unprocessable(
            "field `eventTypes`: an event type is not one of the documented types or `*`"
                .to_owned(),
        ),
        WebhookError::InvalidField { field, reason } => {
            unprocessable(format!("field `{field}`: {reason}"))
        }
        WebhookError::NotFound => Problem::not_found("webhook endpoint"),
        WebhookError::Store(s) => Problem::from(keel_workflows::OpsError::Store(s)),
        _ => Problem::internal(),
    }
}

fn service(state: &ApiState) -> Result<&keel_webhooks::Webhooks, Problem> {
    state.webhooks().ok_or_else(|| Problem::not_found("route"))
}

fn endpoint_id(params: &RawPathParams) -> Result<Uuid, Problem> {
    params
        .iter()
        .find(|(k, _)| *k == "id")
        .and_then(|(_, v)| Uuid::parse_str(v).ok())
        .ok_or_else(|| Problem::not_found("webhook endpoint"))
}

/// The members of the endpoint bodies (create requires `url` and `eventTypes`).
const ENDPOINT_FIELDS: &[Field] = &[
    Field {
        name: "url",
        kind: FieldKind::Text,
    },
    // The service refuses more than 32 event types with `422 INVALID_FIELD` (a rule,
    // as an unknown type); the parser only bounds how many strings it keeps.
    Field {
        name: "eventTypes",
        kind: FieldKind::TextList { max_items: 256 },
    },
    Field {
        name: "description",
        kind: FieldKind::Text,
    },
    Field {
        name: "enabled",
        kind: FieldKind::Bool,
    },
];

impl RequestBody for CreateWebhookEndpointRequest {
    const FIELDS: &'static [Field] = ENDPOINT_FIELDS;
    const OPTIONAL: &'static [&'static str] = &["description", "enabled"];
}

impl RequestBody for UpdateWebhookEndpointRequest {
    const FIELDS: &'static [Field] = ENDPOINT_FIELDS;
    const OPTIONAL: &'static [&'static str] = &["url", "eventTypes", "description", "enabled"];
}

impl RequestBody for RotateSecretRequest {
    const FIELDS: &'static [Field] = &[Field {
        name: "overlapSeconds",
        kind: FieldKind::UnsignedInteger,
    }];
    const OPTIONAL: &'static [&'static str] = &["overlapSeconds"];
    const EMPTY_ALLOWED: bool = true;
}

/// The keyset of the webhook lists: `(created_at, id)`.
type Keyset = (DateTime<Utc>, Uuid);

fn page_query(
    q: Result<Query<PageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<(u32, Option<Keyset>), Problem> {
    let page = PageParams::from_query(q)?;
    Ok((page.limit()?, page.cursor::<Keyset>()?))
}

/// Register a webhook endpoint; the answer shows its signing secret, once.
#[utoipa::path(post, path = "/v1/webhook-endpoints", tag = "webhooks", operation_id = "createWebhookEndpoint",
    request_body(content = CreateWebhookEndpointRequest, content_type = "application/json"),
    responses((status = 201, description = "Created.", body = WebhookEndpointWithSecret), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn create(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    JsonBody(req): JsonBody<CreateWebhookEndpointRequest>,
) -> Result<Response, Problem> {
    let (e, secret) = service(&state)?
        .create(
            caller.organization_id,
            &EndpointInput {
                url: Some(req.url),
                description: req.description,
                event_types: Some(req.event_types),
                enabled: req.enabled,
            },
        )
        .await
        .map_err(problem)?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookEndpointWithSecret {
            endpoint: e.into(),
            secret,
        }),
    )
        .into_response())
}

/// The organization's webhook endpoints, oldest first.
#[utoipa::path(get, path = "/v1/webhook-endpoints", tag = "webhooks", operation_id = "listWebhookEndpoints",
    params(PageParams),
    responses((status = 200, description = "A page of endpoints.", body = WebhookEndpointList), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    q: Result<Query<PageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let (limit, after) = page_query(q)?;
    let rows = service(&state)?
        .list(caller.organization_id, after, i64::from(limit) + 1)
        .await
        .map_err(problem)?;
    let p = Page::from_rows(rows, limit, |e| (e.created_at, e.id)).map(WebhookEndpoint::from);
    Ok(Json(WebhookEndpointList {
        data: p.data,
        has_more: p.has_more,
        next_cursor: p.next_cursor,
    })
    .into_response())
}

/// One webhook endpoint.
#[utoipa::path(get, path = "/v1/webhook-endpoints/{id}", tag = "webhooks", operation_id = "getWebhookEndpoint",
    params(("id" = Uuid, Path, description = "Endpoint id")),
    responses((status = 200, description = "The endpoint.", body = WebhookEndpoint), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
) -> Result<Response, Problem> {
    let id = endpoint_id(&params)?;
    let e = service(&state)?
        .get(caller.organization_id, id)
        .await
        .map_err(problem)?;
    Ok(Json(WebhookEndpoint::from(e)).into_response())
}

/// Change a webhook endpoint (the members given).
#[utoipa::path(patch, path = "/v1/webhook-endpoints/{id}", tag = "webhooks", operation_id = "updateWebhookEndpoint",
    params(("id" = Uuid, Path, description = "Endpoint id")),
    request_body(content = UpdateWebhookEndpointRequest, content_type = "application/json"),
    responses((status = 200, description = "The changed endpoint.", body = WebhookEndpoint), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn update(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
    JsonBody(req): JsonBody<UpdateWebhookEndpointRequest>,
) -> Result<Response, Problem> {
    let id = endpoint_id(&params)?;
    let e = service(&state)?
        .update(
            caller.organization_id,
            id,
            &EndpointInput {
                url: req.url,
                description: req.description,
                event_types: req.event_types,
                enabled: req.enabled,
            },
        )
        .await
        .map_err(problem)?;
    Ok(Json(WebhookEndpoint::from(e)).into_response())
}

/// Delete a webhook endpoint; its pending deliveries are cancelled.
#[utoipa::path(delete, path = "/v1/webhook-endpoints/{id}", tag = "webhooks", operation_id = "deleteWebhookEndpoint",
    params(("id" = Uuid, Path, description = "Endpoint id")),
    responses((status = 204, description = "Deleted."), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
) -> Result<Response, Problem> {
    let id = endpoint_id(&params)?;
    service(&state)?
        .delete(caller.organization_id, id)
        .await
        .map_err(problem)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Rotate the signing secret: the answer shows the new secret, once; the previous one
/// keeps signing (both signatures are sent) for `overlapSeconds`.
#[utoipa::path(post, path = "/v1/webhook-endpoints/{id}/rotate-secret", tag = "webhooks", operation_id = "rotateWebhookSecret",
    params(("id" = Uuid, Path, description = "Endpoint id")),
    request_body(content = RotateSecretRequest, content_type = "application/json", description = "Optional: an empty body or `{}` (the default overlap), or `{\"overlapSeconds\": N}`."),
    responses((status = 200, description = "Rotated.", body = WebhookEndpointWithSecret), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn rotate(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
    JsonBody(req): JsonBody<RotateSecretRequest>,
) -> Result<Response, Problem> {
    let id = endpoint_id(&params)?;
    let (e, secret) = service(&state)?
        .rotate_secret(
            caller.organization_id,
            id,
            req.overlap_seconds.map(Duration::from_secs),
        )
        .await
        .map_err(problem)?;
    Ok(Json(WebhookEndpointWithSecret {
        endpoint: e.into(),
        secret,
    })
    .into_response())
}

/// Send a test event (`webhook.test`, marked as a test) to this endpoint only.
#[utoipa::path(post, path = "/v1/webhook-endpoints/{id}/test", tag = "webhooks", operation_id = "testWebhookEndpoint",
    params(("id" = Uuid, Path, description = "Endpoint id")),
    request_body(content = crate::dto::EmptyRequest, content_type = "application/json", description = "Optional: an empty body or `{}`."),
    responses((status = 202, description = "Queued for delivery.", body = WebhookTestQueued), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn test(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
    JsonBody(_): JsonBody<crate::dto::EmptyRequest>,
) -> Result<Response, Problem> {
    let id = endpoint_id(&params)?;
    let event_id = service(&state)?
        .send_test(caller.organization_id, id)
        .await
        .map_err(problem)?;
    Ok((StatusCode::ACCEPTED, Json(WebhookTestQueued { event_id })).into_response())
}

/// The endpoint's deliveries, newest first, each with its attempts (time, HTTP status,
/// latency, error class, next retry).
#[utoipa::path(get, path = "/v1/webhook-endpoints/{id}/deliveries", tag = "webhooks", operation_id = "listWebhookDeliveries",
    params(("id" = Uuid, Path, description = "Endpoint id"), PageParams),
    responses((status = 200, description = "A page of deliveries.", body = WebhookDeliveryList), WebhookErrors),
    security(("bearer" = [])))]
pub(crate) async fn deliveries(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
    q: Result<Query<PageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let id = endpoint_id(&params)?;
    let (limit, before) = page_query(q)?;
    let rows = service(&state)?
        .deliveries(caller.organization_id, id, before, i64::from(limit) + 1)
        .await
        .map_err(problem)?;
    let p = Page::from_rows(rows, limit, |d| (d.delivery.created_at, d.delivery.id)).map(|d| {
        WebhookDelivery {
            id: d.delivery.id,
            event_id: d.delivery.event_id,
            event_type: d.delivery.event_type,
            state: d.delivery.state,
            test: d.delivery.is_test,
            next_attempt_at: d.delivery.next_attempt_at,
            created_at: d.delivery.created_at,
            attempts: d
                .attempts
                .into_iter()
                .map(|a| WebhookAttempt {
                    attempted_at: a.attempted_at,
                    http_status: a.http_status,
                    latency_ms: a.latency_ms,
                    error_class: a.error_class,
                    next_retry_at: a.next_retry_at,
                })
                .collect(),
        }
    });
    Ok(Json(WebhookDeliveryList {
        data: p.data,
        has_more: p.has_more,
        next_cursor: p.next_cursor,
    })
    .into_response())
}
