//! `[webhooks]`: outbound webhook delivery.

use serde::{Deserialize, Serialize};

/// `[webhooks]`: outbound webhook delivery (runner role), endpoint URL rules (api
/// role) and webhook audit retention (see `keel_webhooks`). Every key has a default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Whether the runner delivers webhooks (default true).
    pub enabled: bool,
    /// Allow `http://` endpoint URLs (local testing only; default false).
    pub allow_http: bool,
    /// Allow endpoints in loopback, private, link-local and metadata ranges (local
    /// testing only; default false).
    pub allow_private_addresses: bool,
    /// Whole-request timeout of an attempt, milliseconds (default 10000).
    pub request_timeout_ms: u64,
    /// TCP/TLS connect timeout of an attempt, milliseconds (default 5000).
    pub connect_timeout_ms: u64,
    /// Added to the two timeouts for the lease of a claimed delivery, milliseconds
    /// (default 30000): a runner that died mid-attempt leaves the delivery to another
    /// runner after the lease.
    pub lease_margin_ms: u64,
    /// Delay after the first failed attempt, milliseconds (default 5000); later delays
    /// triple up to `retryMaxMs`.
    pub retry_initial_ms: u64,
    /// Longest delay between attempts, milliseconds (default 8 h).
    pub retry_max_ms: u64,
    /// How long a delivery is retried, hours (default 72).
    pub retry_window_hours: u64,
    /// Attempts in flight per endpoint (default 4).
    pub per_endpoint_in_flight: u32,
    /// Audit retention window from `dispatch_settled_at`, days (default 30).
    pub retention_days: u32,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_http: false,
            allow_private_addresses: false,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            lease_margin_ms: 30_000,
            retry_initial_ms: 5_000,
            retry_max_ms: 8 * 3_600_000,
            retry_window_hours: 72,
            per_endpoint_in_flight: 4,
            retention_days: 30,
        }
    }
}

impl WebhookSettings {
    /// The library's settings.
    pub fn to_config(&self) -> keel_webhooks::WebhookConfig {
        use std::time::Duration;
        keel_webhooks::WebhookConfig {
            policy: keel_webhooks::UrlPolicy {
                allow_http: self.allow_http,
                allow_private: self.allow_private_addresses,
            },
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            lease_margin: Duration::from_millis(self.lease_margin_ms),
            retry_initial: Duration::from_millis(self.retry_initial_ms),
            retry_max: Duration::from_millis(self.retry_max_ms),
            window: Duration::from_secs(self.retry_window_hours * 3600),
            per_endpoint_in_flight: self.per_endpoint_in_flight,
            retention: Duration::from_secs(u64::from(self.retention_days) * 86_400),
            ..keel_webhooks::WebhookConfig::default()
        }
    }
}
