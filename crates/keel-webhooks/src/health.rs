//! Webhook health for Platform Status ([`webhook_health`]): endpoints by health, the
//! oldest undelivered delivery and the disabled endpoints. No URL, secret or payload.

use crate::Result;
use crate::store;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A disabled endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisabledEndpoint {
    /// The endpoint id.
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// Why it is disabled (a code such as `failing_72h`; `None`: by its owner).
    pub reason: Option<String>,
    /// When its row last changed.
    pub since: DateTime<Utc>,
}

/// Webhook health ([`webhook_health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookHealth {
    /// Enabled endpoints delivering normally.
    pub healthy: u64,
    /// Enabled endpoints whose deliveries fail (not yet tripped).
    pub failing: u64,
    /// Enabled endpoints whose circuit breaker is open.
    pub breaker_open: u64,
    /// Disabled endpoints.
    pub disabled: u64,
    /// Deliveries not yet delivered (pending).
    pub undelivered: u64,
    /// When the oldest of them was created.
    pub oldest_undelivered_at: Option<DateTime<Utc>>,
    /// The disabled endpoints, at most the `limit` asked for.
    pub disabled_list: Vec<DisabledEndpoint>,
}

/// Reads the [`WebhookHealth`], listing at most `limit` disabled endpoints.
///
/// # Errors
/// [`crate::WebhookError`] on database failure.
pub async fn webhook_health(db: &sqlx::PgPool, limit: u32) -> Result<WebhookHealth> {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let (healthy, failing, open, disabled, pending, oldest) = store::endpoints_health(db).await?;
    let list = store::endpoints_disabled(db, i64::from(limit.max(1))).await?;
    Ok(WebhookHealth {
        healthy: n(healthy),
        failing: n(failing),
        breaker_open: n(open),
        disabled: n(disabled),
        undelivered: n(pending),
        oldest_undelivered_at: oldest,
        disabled_list: list
            .into_iter()
            .map(|(id, organization_id, reason, since)| DisabledEndpoint {
                id,
                organization_id,
                reason,
                since,
            })
            .collect(),
    })
}
