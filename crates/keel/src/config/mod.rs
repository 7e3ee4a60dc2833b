//! Keel's configuration: `config/default.toml`, an optional file, then environment
//! overrides `KEEL__SECTION__KEY`, loaded into typed structs and validated with errors
//! that name the offending key.
//!
//! One module per section: `chains` (`[chains.<name>]`, `[custody]`), `durable`,
//! `txq`, `index`, `cluster` (`[chainHealth]`, `[supervision]`, `[cluster]`,
//! `[retention]`), `webhooks`, `telemetry` (`[monitoring]`, `[telemetry]`),
//! `api`, `operator`, `profile` (chain profiles, `[chains.<name>.fees]`); `[aa]` is [`crate::aa::AaSettings`]. Loading and the
//! environment's key matching are in `load`, the cross-section rules in `validate`;
//! every type is re-exported here (`keel::config::ChainConfig`, ...).

mod api;
mod chains;
mod cluster;
mod durable;
mod index;
mod load;
mod operator;
mod profile;
mod telemetry;
mod txq;
mod validate;
mod webhooks;

pub use api::{ApiConfig, StatusSettings};
pub use chains::{ChainConfig, ChainCustodyConfig, CustodyProviderKind, CustodySettings};
pub use cluster::{
    ChainHealthSettings, ClusterConfig, OrganizationSettings, RetentionSettings,
    SupervisionSettings,
};
pub use durable::{ConfirmationWatcherConfig, DurableConfig, ExecutorSettings, ShardingConfig};
pub use index::{HistorySettings, IndexSettings};
pub use load::is_known_key;
pub use operator::OperatorConfig;
pub use profile::{
    ChainFees, ChainProfile, ChainSettings, FeeModelKind, PriorityFeeSetting, TipSource,
};
pub use telemetry::{
    HealthCollectorConfig, LogFormat, MonitoringConfig, OtlpConfig, TelemetryConfig,
};
pub use txq::TxqSettings;
pub use webhooks::WebhookSettings;

use keel_store::StoreConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The defaults compiled into the binary (the text of `config/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../../../../config/default.toml");

/// Prefix of environment overrides; sections are separated by `__`.
pub const ENV_PREFIX: &str = "KEEL__";

/// Configuration errors. Messages name the key and never contain the value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key failed to parse or has the wrong type, or is unknown.
    #[error("configuration key `{key}`: {reason}")]
    Parse {
        /// Dotted key path (`durable.confirmationWatcher.intervalMs`), or `<root>`.
        key: String,
        /// What is wrong, without the value.
        reason: String,
    },
    /// A value parsed but breaks a rule.
    #[error("configuration key `{key}`: {reason}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A template names a sender vault the chain's custody section does not configure
    /// (`keel template set --sender`).
    #[error(
        "unknown sender `{vault}`: no vault `chains.{chain}.custody.vaults.{vault}` in the configuration"
    )]
    UnknownSender {
        /// The chain's name.
        chain: String,
        /// The vault name asked for.
        vault: String,
    },
}

/// The process role. There is no combined role (see docs/architecture.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// HTTP Platform API: validation, idempotency keys, recording starts and signals, reads.
    Api,
    /// Durable workflow executor, transaction queue, watchers, scheduled singletons.
    Runner,
    /// Ledger Index: tip ingest and leased historical catch-up.
    Indexer,
}

impl Role {
    /// Lowercase name (`api`, `runner`, `indexer`), also the `role` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Api => "api",
            Role::Runner => "runner",
            Role::Indexer => "indexer",
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Names this installation on every log line and metric (1..=64 of `[A-Za-z0-9._-]`).
    pub deployment_id: String,
    /// The role from configuration; `keel run --role` overrides it.
    #[serde(default)]
    pub role: Option<Role>,
    /// `[database]`.
    pub database: StoreConfig,
    /// `[chains.<name>]`, by name.
    #[serde(default)]
    pub chains: BTreeMap<String, ChainConfig>,
    /// `[api]`.
    #[serde(default)]
    pub api: ApiConfig,
    /// `[operator]`.
    #[serde(default)]
    pub operator: OperatorConfig,
    /// `[index]`.
    #[serde(default)]
    pub index: IndexSettings,
    /// `[durable]`.
    pub durable: DurableConfig,
    /// `[txq]`.
    #[serde(default)]
    pub txq: TxqSettings,
    /// `[chainHealth]`.
    #[serde(default)]
    pub chain_health: ChainHealthSettings,
    /// `[supervision]`.
    #[serde(default)]
    pub supervision: SupervisionSettings,
    /// `[cluster]`.
    pub cluster: ClusterConfig,
    /// `[retention]`.
    pub retention: RetentionSettings,
    /// `[organizations]`.
    #[serde(default)]
    pub organizations: OrganizationSettings,
    /// `[monitoring]`.
    pub monitoring: MonitoringConfig,
    /// `[telemetry]`.
    pub telemetry: TelemetryConfig,
    /// `[webhooks]`.
    #[serde(default)]
    pub webhooks: WebhookSettings,
    /// `[aa]` (ERC-4337, see [`crate::aa`]).
    #[serde(default)]
    pub aa: crate::aa::AaSettings,
    /// `[custody]`: inbound custody-provider webhooks (the providers themselves are
    /// per chain: `chains.<name>.custody`).
    #[serde(default)]
    pub custody: CustodySettings,
}

fn invalid(key: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

impl Config {
    /// The configuration as TOML with secrets redacted: database password, and RPC
    /// URLs reduced to scheme, host and port (providers put API keys in paths and
    /// query strings).
    pub fn redacted_toml(&self) -> String {
        let mut copy = self.clone();
        copy.database.url = copy.database.redacted_url();
        if !copy.telemetry.otlp.endpoint.is_empty() {
            copy.telemetry.otlp.endpoint = redact_rpc_url(&copy.telemetry.otlp.endpoint);
        }
        for chain in copy.chains.values_mut() {
            for url in &mut chain.rpc_urls {
                *url = redact_rpc_url(url);
            }
            if let Some(ws) = &mut chain.ws_url {
                *ws = redact_rpc_url(ws);
            }
        }
        toml::to_string_pretty(&copy)
            .unwrap_or_else(|_| "# configuration could not be rendered\n".to_owned())
    }
}

/// `scheme://host:port` of an RPC URL, with `/***` when a path, query or credentials
/// were present.
pub fn redact_rpc_url(url: &str) -> String {
    let Some(idx) = url.find("://") else {
        return "***".to_owned();
    };
    let (scheme, rest) = (&url[..idx], &url[idx + 3..]);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let had_secret_room =
        authority.contains('@') || authority_end < rest.len() && rest.len() > authority_end + 1;
    if had_secret_room {
        format!("{scheme}://{host}/***")
    } else {
        format!("{scheme}://{host}")
    }
}
