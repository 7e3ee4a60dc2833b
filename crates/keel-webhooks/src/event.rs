//! Events and the outbox write ([`emit_in`]).
//!
//! An event is written by the code that makes the change it reports, on that change's
//! open transaction: it commits with the change or not at all (no change unreported,
//! none reported that did not commit). [`emit_in`] fans it out to the organization's
//! enabled endpoints subscribed to its type (or `*`) as one `pending` delivery each, in
//! the same statement; when no endpoint subscribes, nothing is written.
//!
//! Payload (the request body): `{"id", "type", "createdAt", "organizationId", "data"}`;
//! `id` is also the `webhook-id` header (receivers dedupe by it), `createdAt` is
//! RFC 3339 UTC, `data` is the object the type documents (for `operation.*` the
//! Platform API's `Operation` schema, as `GET /v1/operations/{id}` shows it then).

use crate::error::{Result, WebhookError};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

/// Every event type (the closed list endpoints subscribe to; `*` is all of them).
///
/// | type | when | `data` |
/// |---|---|---|
/// | `operation.accepted` | an operation was accepted (milestone `accepted`) | `Operation` |
/// | `operation.state_changed` | its state changed (`running`, `waiting`, `suspended`, `completed`, `failed`, `cancelled`, ...) | `Operation` |
/// | `operation.approval_requested` | it waits for an approval decision | `Operation` |
/// | `operation.funding_requested` | it waits for gas funds (a funding request) | `Operation` |
/// | `operation.custody_approval_requested` | a transaction of it waits for an approval at the custody provider (`PENDING_AUTHORIZATION`; `wait.custody` names the provider's transaction) | `Operation` |
/// | `operation.submitted` | a transaction of it was signed/submitted (milestone `submitted`) | `Operation` |
/// | `operation.transaction_settled` | a settlement verdict of one of its transactions | `Operation` |
/// | `operation.transaction_reorged` | a reorg took a settled transaction of it out and another transaction took its nonce on the final chain: its verdict is now `failed` `REORGED_OUT`, its effect is absent | `Operation` |
/// | `operation.confirmed` | a transaction of it confirmed (milestone `confirmed`) | `Operation` |
/// | `operation.indexed` | the index reflects it (milestone `indexed`) | `Operation` |
/// | `distribution.batch_settled` | a batch of a distribution was paid (its transaction confirmed) | `{distributionId, batch, txHash, block, holders, amount, progress}` |
/// | `distribution.completed` | a distribution paid every payable holder | `{distributionId, progress}` |
/// | `webhook_endpoint.disabled` | Keel disabled an endpoint of the organization (HTTP 410, or failing for the whole retry window) | `{endpointId, reason}` |
/// | `webhook.test` | `POST /v1/webhook-endpoints/{id}/test` (to that endpoint only, marked as a test) | `{endpointId, test: true}` |
pub const EVENT_TYPES: &[&str] = &[
    OPERATION_ACCEPTED,
    OPERATION_STATE_CHANGED,
    OPERATION_APPROVAL_REQUESTED,
    OPERATION_FUNDING_REQUESTED,
    OPERATION_CUSTODY_APPROVAL_REQUESTED,
    OPERATION_SUBMITTED,
    OPERATION_TRANSACTION_SETTLED,
    OPERATION_TRANSACTION_REORGED,
    OPERATION_CONFIRMED,
    OPERATION_INDEXED,
    DISTRIBUTION_BATCH_SETTLED,
    DISTRIBUTION_COMPLETED,
    ENDPOINT_DISABLED,
    TEST,
];

/// See [`EVENT_TYPES`].
pub const OPERATION_ACCEPTED: &str = "operation.accepted";
/// See [`EVENT_TYPES`].
pub const OPERATION_STATE_CHANGED: &str = "operation.state_changed";
/// See [`EVENT_TYPES`].
pub const OPERATION_APPROVAL_REQUESTED: &str = "operation.approval_requested";
/// See [`EVENT_TYPES`].
pub const OPERATION_FUNDING_REQUESTED: &str = "operation.funding_requested";
/// See [`EVENT_TYPES`].
pub const OPERATION_CUSTODY_APPROVAL_REQUESTED: &str = "operation.custody_approval_requested";
/// See [`EVENT_TYPES`].
pub const OPERATION_SUBMITTED: &str = "operation.submitted";
/// See [`EVENT_TYPES`].
pub const OPERATION_TRANSACTION_SETTLED: &str = "operation.transaction_settled";
/// See [`EVENT_TYPES`].
pub const OPERATION_TRANSACTION_REORGED: &str = "operation.transaction_reorged";
/// See [`EVENT_TYPES`].
pub const OPERATION_CONFIRMED: &str = "operation.confirmed";
/// See [`EVENT_TYPES`].
pub const OPERATION_INDEXED: &str = "operation.indexed";
/// See [`EVENT_TYPES`]: one batch of a distribution was paid (its transaction
/// confirmed); `data` is the distribution's progress and the batch.
pub const DISTRIBUTION_BATCH_SETTLED: &str = "distribution.batch_settled";
/// See [`EVENT_TYPES`]: a distribution paid every payable holder (refused ones
/// listed in its payments); `data` is the distribution's final progress.
pub const DISTRIBUTION_COMPLETED: &str = "distribution.completed";
/// See [`EVENT_TYPES`].
pub const ENDPOINT_DISABLED: &str = "webhook_endpoint.disabled";
/// See [`EVENT_TYPES`].
pub const TEST: &str = "webhook.test";

/// The wildcard subscription.
pub const ALL_TYPES: &str = "*";

/// `ty` as the `&'static str` of [`EVENT_TYPES`] (a bounded metric label), or `None`.
pub fn known_type(ty: &str) -> Option<&'static str> {
    EVENT_TYPES.iter().copied().find(|t| *t == ty)
}

/// An event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent<'a> {
    /// The organization whose endpoints receive it.
    pub organization_id: Uuid,
    /// One of [`EVENT_TYPES`].
    pub event_type: &'static str,
    /// The operation it reports, if any: events of one operation are delivered to each
    /// endpoint in the order they were written.
    pub operation_id: Option<Uuid>,
    /// The `data` object.
    pub data: &'a Value,
}

/// The payload (request body) of an event.
pub fn payload(
    id: Uuid,
    event_type: &str,
    created_at: DateTime<Utc>,
    organization_id: Uuid,
    data: &Value,
) -> Value {
    json!({
        "id": id.to_string(),
        "type": event_type,
        "createdAt": created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "organizationId": organization_id.to_string(),
        "data": data,
    })
}

/// Writes `event` on `conn` (the open transaction of the change it reports) and one
/// `pending` delivery per enabled endpoint of its organization subscribed to its type;
/// returns how many deliveries were written (0: no endpoint subscribes, nothing was
/// written). Wakes the dispatchers (`NOTIFY keel_webhooks`, sent at commit).
///
/// # Errors
/// [`WebhookError::UnknownEventType`]; [`WebhookError::Store`] (the caller's
/// transaction should then roll back).
pub async fn emit_in(conn: &mut sqlx::PgConnection, event: &NewEvent<'_>) -> Result<u64> {
    if known_type(event.event_type).is_none() {
        return Err(WebhookError::UnknownEventType);
    }
    let id = Uuid::new_v4();
    let created_at = Utc::now();
    let body = payload(
        id,
        event.event_type,
        created_at,
        event.organization_id,
        event.data,
    );
    crate::store::event_fan_out(
        conn,
        id,
        event.organization_id,
        event.event_type,
        event.operation_id,
        &body,
        created_at,
    )
    .await
}
