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
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen_address: "127.0.0.1:8080".to_owned(),
            body_limit_bytes: 262_144,
            status: StatusSettings::default(),
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
