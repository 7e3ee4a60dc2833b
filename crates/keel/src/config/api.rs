//! `[api]` (with `status`): the Platform API.

use serde::{Deserialize, Serialize};

/// `[api]`: the Platform API (role `api`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiConfig {
    /// Listen address, `ip:port`.
    pub listen_address: String,
    /// Largest accepted request body, bytes (1024..=16777216; default 262144).
    pub body_limit_bytes: usize,
    /// `[api.status]`: what Platform Status flags.
    #[serde(default)]
    pub status: StatusSettings,
    /// `[api.rateLimit]`: per-API-key and per-organization request rate limits.
    #[serde(default)]
    pub rate_limit: RateLimitSettings,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen_address: "127.0.0.1:8080".to_owned(),
            body_limit_bytes: 262_144,
            status: StatusSettings::default(),
            rate_limit: RateLimitSettings::default(),
        }
    }
}

/// `[api.rateLimit]`: request rate limits of the keyed routes of the Platform API
/// (a GCRA bucket per API key and one per organization, shared by its keys; public
/// routes and the status page are never limited). Over a limit a request answers `429
/// RATE_LIMITED` with `Retry-After`. The limits are held in memory, **per api
/// replica**: N replicas admit up to N times these rates.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RateLimitSettings {
    /// Sustained requests per second of each API key (0..=1000000; 0 switches the
    /// per-key limit off; default 100).
    pub per_key_requests_per_second: u32,
    /// Requests one API key may send at once from a full bucket (1..=1000000; default
    /// 200).
    pub per_key_burst: u32,
    /// Sustained requests per second of each organization, all its keys together
    /// (0..=1000000; 0 switches the per-organization limit off; default 300).
    pub per_organization_requests_per_second: u32,
    /// Requests one organization's keys may send at once from a full bucket
    /// (1..=1000000; default 600).
    pub per_organization_burst: u32,
}

/// The largest accepted rate or burst of `[api.rateLimit]`.
pub(super) const MAX_RATE_LIMIT: u32 = 1_000_000;

impl Default for RateLimitSettings {
    fn default() -> Self {
        Self {
            per_key_requests_per_second: 100,
            per_key_burst: 200,
            per_organization_requests_per_second: 300,
            per_organization_burst: 600,
        }
    }
}

impl RateLimitSettings {
    /// The API's rate limits.
    pub fn to_config(self) -> keel_api::rate_limit::RateLimitConfig {
        use keel_api::rate_limit::{Limit, RateLimitConfig};
        RateLimitConfig {
            per_key: Limit::new(self.per_key_requests_per_second, self.per_key_burst),
            per_organization: Limit::new(
                self.per_organization_requests_per_second,
                self.per_organization_burst,
            ),
        }
    }
}

/// `[api.status]`: the thresholds of Platform Status (`GET /v1/status`, `/status`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StatusSettings {
    /// A workflow instance still `pending` (its start not run) after this many seconds
    /// is flagged (0..=86400; default 60).
    pub pending_threshold_secs: u64,
    /// An open workflow instance whose row has not changed for this many seconds is
    /// flagged as making no progress (1..=2592000; default 900).
    pub no_mutation_threshold_secs: u64,
}

impl Default for StatusSettings {
    fn default() -> Self {
        Self {
            pending_threshold_secs: 60,
            no_mutation_threshold_secs: 900,
        }
    }
}

impl StatusSettings {
    /// The API's status query.
    pub fn to_query(self) -> keel_workflows::ops::status::StatusQuery {
        keel_workflows::ops::status::StatusQuery {
            pending_threshold: std::time::Duration::from_secs(self.pending_threshold_secs),
            no_mutation_threshold: std::time::Duration::from_secs(self.no_mutation_threshold_secs),
            ..keel_workflows::ops::status::StatusQuery::default()
        }
    }
}
