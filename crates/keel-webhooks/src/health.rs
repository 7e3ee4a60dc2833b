//! Webhook health for Platform Status ([`webhook_health`]): endpoints by health, the
//! oldest undelivered delivery, the failing and breaker-open endpoints by id and the
//! disabled endpoints. No URL, secret or payload.

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

/// An enabled endpoint whose deliveries fail, or whose circuit breaker is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnhealthyEndpoint {
    /// The endpoint id.
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// True while its circuit breaker is open (deliveries are held); false when its
    /// deliveries fail but the breaker has not tripped (or closed again).
    pub breaker_open: bool,
    /// Since when its deliveries fail.
    pub failing_since: Option<DateTime<Utc>>,
    /// Failed deliveries in a row.
    pub consecutive_failures: u32,
    /// Until when the breaker holds deliveries, while it is open.
    pub breaker_open_until: Option<DateTime<Utc>>,
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
    /// The failing and breaker-open endpoints (breaker open first, then the longest
    /// failing), at most the `limit` asked for.
    pub unhealthy_list: Vec<UnhealthyEndpoint>,
}

/// Reads the [`WebhookHealth`], listing at most `limit` disabled endpoints and at most
/// `limit` failing or breaker-open ones.
///
/// # Errors
/// [`crate::WebhookError`] on database failure.
pub async fn webhook_health(db: &sqlx::PgPool, limit: u32) -> Result<WebhookHealth> {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let (healthy, failing, open, disabled, pending, oldest) = store::endpoints_health(db).await?;
    let list = store::endpoints_disabled(db, i64::from(limit.max(1))).await?;
    let unhealthy = store::endpoints_unhealthy(db, i64::from(limit.max(1))).await?;
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
        unhealthy_list: unhealthy
            .into_iter()
            .map(|r| UnhealthyEndpoint {
                id: r.id,
                organization_id: r.organization_id,
                breaker_open: r.breaker_open,
                failing_since: r.failing_since,
                consecutive_failures: u32::try_from(r.consecutive_failures).unwrap_or(0),
                breaker_open_until: r.breaker_open_until,
            })
            .collect(),
    })
}
