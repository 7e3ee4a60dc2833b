//! # keel-webhooks
//!
//! Outbound webhooks (issue 21): every operation state change, milestone, settlement
//! verdict, approval request and funding request is written as an event **in the
//! transaction of the change** ([`emit_in`]: the outbox), delivered to the
//! organization's subscribed endpoints by the runner role's [`Dispatcher`] — signed
//! per Standard Webhooks ([`sign`]), retried with capped exponential backoff and jitter
//! over about 3 days ([`WebhookConfig::retry_delay`]), in order per (endpoint,
//! operation), behind a per-endpoint circuit breaker — and kept as audit evidence for
//! a window that starts at `dispatch_settled_at` ([`retention`]).
//!
//! - [`event`]: the closed list of event types ([`EVENT_TYPES`]), the payload, [`emit_in`].
//! - [`endpoints`]: [`Webhooks`], what the Platform API's `/v1/webhook-endpoints` call.
//! - [`deliver`]: [`Dispatcher`], the delivery service, and its metrics.
//! - [`guard`]: the endpoint URL rules (https; no loopback, private, link-local or
//!   metadata addresses unless allowed), checked at registration and at delivery.
//! - [`sign`]: secrets (`whsec_…`) and signatures (`v1,…`).
//! - [`retention`]: the audit retention pass.
//! - [`store`]: every SQL statement on the tables of `migrations/0032_webhooks.sql`.
//!
//! ## Delivery guarantees
//! At least once: an event can arrive more than once (a retry after a lost 2xx, a lapsed
//! lease after a crash), always with the same `webhook-id`; receivers dedupe by it.
//! Within one endpoint, the events of one operation arrive in the order they were
//! written (a later one is not sent before the earlier one succeeded or was given up).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod config;
pub mod deliver;
pub mod endpoints;
mod error;
pub mod event;
pub mod guard;
mod health;
pub mod retention;
pub mod sign;
pub mod store;

pub use config::WebhookConfig;
pub use deliver::Dispatcher;
pub use endpoints::{Delivery, Endpoint, EndpointInput, Webhooks};
pub use error::{Result, WebhookError};
pub use event::{EVENT_TYPES, NewEvent, emit_in};
pub use guard::UrlPolicy;
pub use health::{DisabledEndpoint, UnhealthyEndpoint, WebhookHealth, webhook_health};
pub use retention::{WebhookRetentionReport, retention_pass};

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "keel_webhooks_deliveries_total",
        Unit::Count,
        "Webhook delivery attempts by event type and verdict (succeeded, retry, failed, gone)."
    );
    describe_histogram!(
        "keel_webhooks_attempt_duration_seconds",
        Unit::Seconds,
        "Latency of one webhook delivery attempt (seconds), by verdict."
    );
    describe_histogram!(
        "keel_webhooks_delivery_lag_seconds",
        Unit::Seconds,
        "From a webhook event's write (the state change's commit) to its successful delivery (seconds)."
    );
    describe_counter!(
        "keel_webhooks_retries_total",
        Unit::Count,
        "Webhook delivery attempts after the first, by event type."
    );
    describe_counter!(
        "keel_webhooks_endpoints_disabled_total",
        Unit::Count,
        "Webhook endpoints Keel disabled, by reason (gone, failing)."
    );
    describe_gauge!(
        "keel_webhooks_oldest_pending_age_seconds",
        Unit::Seconds,
        "Age of the oldest webhook event not yet dispatch-settled (seconds; 0 when none)."
    );
}
