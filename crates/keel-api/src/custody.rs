//! Inbound custody-provider webhooks (issue 19): `POST /v1/custody/webhooks/fireblocks`.
//!
//! The signature is the authentication (no API key): the body is read as raw bytes
//! (the router's body limit applies first), verified as a detached JWS RS512 against
//! the provider's cached JWKS ([`keel_custody::WebhookVerifier`]). A missing or bad
//! signature answers `401 CUSTODY_WEBHOOK_UNVERIFIED` and records nothing; a body above
//! the verifier's limit `413 PAYLOAD_TOO_LARGE`; keys that cannot be fetched `503
//! CUSTODY_KEYS_UNAVAILABLE` (the provider redelivers).
//!
//! A verified event is only a **wake-up hint**: its transaction's live submission in
//! the queue becomes due for a read at once ([`keel_workflows::Ops::custody_wake`]), and the
//! queue's custody pass then reads the provider. The body is never taken as the truth,
//! so duplicated, reordered, delayed or replayed events cannot change any state: each
//! one at most causes one more read of the provider. An event for a transaction the
//! queue does not follow is acknowledged (`matched: false`).
//!
//! Metrics: `keel_api_custody_webhooks_total{provider, result}` (`result`: `woken`,
//! `unmatched`, `refused`, `too_large`, `keys_unavailable`, `error`). A database failure
//! answers `503 SERVICE_UNAVAILABLE`.

use crate::ApiState;
use crate::problem::Problem;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use keel_custody::webhook::SIGNATURE_HEADER;
use keel_custody::{WebhookError, WebhookVerifier};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// What the Fireblocks webhook route needs: the verifier of the provider account (the
/// wake-up goes through the operations service, [`keel_workflows::Ops::custody_wake`]).
/// Cheap to clone.
#[derive(Clone)]
pub struct CustodyWebhooks {
    verifier: Arc<WebhookVerifier>,
}

impl std::fmt::Debug for CustodyWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustodyWebhooks").finish_non_exhaustive()
    }
}

impl CustodyWebhooks {
    /// The route's state: `verifier` for the provider account's webhooks.
    pub fn new(verifier: Arc<WebhookVerifier>) -> Self {
        Self { verifier }
    }
}

/// The answer to a verified delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustodyWebhookAck {
    /// Always true: the delivery was verified and acknowledged.
    pub received: bool,
    /// Whether a transaction the queue follows was woken for a read of the provider.
    pub matched: bool,
}

fn count(result: &'static str) {
    ::metrics::counter!("keel_api_custody_webhooks_total", "provider" => "fireblocks", "result" => result)
        .increment(1);
}

/// `401 CUSTODY_WEBHOOK_UNVERIFIED`.
fn unverified() -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "CUSTODY_WEBHOOK_UNVERIFIED",
        "the webhook signature could not be verified",
    )
}

/// Receives a Fireblocks webhook v2 delivery: verified by its detached JWS
/// (`Fireblocks-Webhook-Signature`, RS512, the provider's JWKS) over the raw body; a
/// verified event wakes the queue's read of its transaction at the provider (the body
/// is a hint, never the truth). No API key: the signature authenticates.
#[utoipa::path(
    post,
    path = "/v1/custody/webhooks/fireblocks",
    tag = "custody",
    operation_id = "receiveFireblocksWebhook",
    request_body(content = String, content_type = "application/json",
        description = "A Fireblocks webhook v2 event, exactly as sent (verified over the raw bytes)."),
    params(("Fireblocks-Webhook-Signature" = String, Header,
        description = "Detached compact JWS (`<protected>..<signature>`), RS512, `kid` of the provider's JWKS.")),
    responses(
        (status = 200, description = "Verified and acknowledged.", body = CustodyWebhookAck),
        (status = 401, description = "`CUSTODY_WEBHOOK_UNVERIFIED`: missing, malformed or wrong signature, unknown key, or not a webhook v2 event; nothing recorded.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`NOT_FOUND`: custody webhooks are not configured (a signed delivery; an unsigned one is 401 whether or not they are).", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`PAYLOAD_TOO_LARGE`: the body exceeds the limit.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`CUSTODY_KEYS_UNAVAILABLE`: the provider's keys could not be fetched; redeliver later.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn fireblocks_webhook(
    State(state): State<ApiState>,
    headers: HeaderMap,
    crate::extract::RawBody(body): crate::extract::RawBody,
) -> Result<Response, Problem> {
    let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    // An unsigned delivery is refused as such whether or not the route is configured
    // (the header is required by the document; schemathesis ST203).
    if signature.is_none_or(str::is_empty) {
        count("refused");
        return Err(unverified());
    }
    let Some(custody) = state.custody_webhooks() else {
        return Err(Problem::not_found("route"));
    };
    let event = match custody.verifier.verify(signature, &body).await {
        Ok(event) => event,
        Err(WebhookError::BodyTooLarge) => {
            count("too_large");
            return Err(Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                "the request body exceeds the limit",
            ));
        }
        Err(WebhookError::KeysUnavailable) => {
            count("keys_unavailable");
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "CUSTODY_KEYS_UNAVAILABLE",
                "the provider's webhook keys could not be fetched",
            ));
        }
        Err(e) => {
            count("refused");
            tracing::info!(target: "keel::api", reason = e.code(), "custody webhook refused");
            return Err(unverified());
        }
    };
    let tx = event.transaction().ok();
    let provider_tx_id = tx
        .as_ref()
        .map(|t| t.id.as_str().to_owned())
        .or_else(|| event.resource_id.clone());
    let external_tx_id = tx
        .as_ref()
        .and_then(|t| t.external_tx_id.as_ref())
        .map(|e| e.as_str().to_owned());
    let matched = match state
        .ops()
        .custody_wake(provider_tx_id.as_deref(), external_tx_id.as_deref())
        .await
    {
        Ok(m) => m,
        Err(e) => {
            count("error");
            tracing::warn!(target: "keel::api", error = %e, "custody webhook wake-up failed");
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "SERVICE_UNAVAILABLE",
                "the wake-up could not be recorded; redeliver later",
            ));
        }
    };
    count(if matched { "woken" } else { "unmatched" });
    Ok(Json(CustodyWebhookAck {
        received: true,
        matched,
    })
    .into_response())
}
