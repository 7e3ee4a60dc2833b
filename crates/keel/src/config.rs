//! Keel's configuration: `config/default.toml`, an optional file, then environment
//! overrides `KEEL__SECTION__KEY`, loaded into typed structs and validated with errors
//! that name the offending key.

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use keel_store::StoreConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The defaults compiled into the binary (the text of `config/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");

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

/// One chain Keel works on (`[chains.<name>]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChainConfig {
    /// EIP-155 chain id (> 0).
    pub chain_id: u64,
    /// JSON-RPC upstream URLs, in failover order (at least one; http, https, ws or wss).
    /// They may embed provider API keys: printed only redacted.
    pub rpc_urls: Vec<String>,
    /// Blocks below the head after which a receipt is settled on chains without a
    /// `finalized` tag (default 1).
    #[serde(default = "default_confirmations")]
    pub confirmations: u64,
    /// Blocks below the head after which a block is final for the transaction queue
    /// (issue 32 §3): a request whose nonce another transaction took is re-signed at a
    /// fresh nonce only once that transaction is this deep; the bundler reports a user
    /// operation's inclusion only from a block this deep (issue 33). Absent (the default): the
    /// node's `finalized` block (64 blocks below the head on a node without the tag).
    /// 0 only for a local chain such as Anvil (the head is final).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finality_depth: Option<u64>,
    /// The upstream's WebSocket endpoint for `eth_subscribe("newHeads")` (`ws://` or
    /// `wss://`; optional, none by default). When set, the indexer's tip loop runs a
    /// round on every new head and polls only every `index.subscribedPollIntervalMs` as
    /// the safety net (a closed subscription is reopened with backoff). It may embed a
    /// provider API key: printed only redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ws_url: Option<String>,
    /// `[chains.<name>.custody]`: a custody provider account whose vault accounts send
    /// this chain's transactions for the templates that name them (absent: local keys
    /// only). See docs/custody.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custody: Option<ChainCustodyConfig>,
}

fn default_confirmations() -> u64 {
    1
}

/// The custody platform of a `[chains.<name>.custody]` section.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CustodyProviderKind {
    /// Fireblocks (REST API v1, webhooks v2), or `keel-custody-sim`.
    Fireblocks,
}

/// `[chains.<name>.custody]`: one provider account (workspace API user) and its vault
/// accounts (`vaults.<name>`), the senders a template can choose. Holds secret
/// *sources* (`env:NAME`, `file:PATH`), never secret values, so it may be printed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChainCustodyConfig {
    /// The provider (`fireblocks`).
    pub provider: CustodyProviderKind,
    /// The API origin without a path (`https://api.fireblocks.io`, or the simulator's).
    pub base_url: String,
    /// The API key (`env:NAME` or `file:PATH`).
    pub api_key: keel_custody::SecretSource,
    /// The API user's RSA private key, PEM (`env:NAME` or `file:PATH`).
    pub private_key: keel_custody::SecretSource,
    /// Sustained request rate of the account, requests per second (1..=10000;
    /// default 20).
    #[serde(default = "default_custody_rps")]
    pub requests_per_second: u32,
    /// Burst above the sustained rate, requests (default 20).
    #[serde(default = "default_custody_rps")]
    pub burst: u32,
    /// Timeout of one provider request, milliseconds (100..=600000; default 10000).
    #[serde(default = "default_custody_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The vault accounts, by name (the name a template's `--sender` gives). Each one
    /// is a sender of this chain: `vaultAccountId` (a string: quote it in an
    /// environment override, `'"7"'`), `assetId`, `address`, and the poll, budget,
    /// silent-drop (`silentDropAfterSecs = 0`: never) and clock-skew settings of
    /// `keel_txq::CustodySenderConfig`.
    #[serde(default)]
    pub vaults: BTreeMap<String, keel_txq::CustodySenderConfig>,
}

fn default_custody_rps() -> u32 {
    20
}
fn default_custody_timeout_ms() -> u64 {
    10_000
}

impl Config {
    /// The custody vault `vault` of chain `chain` as a template's sender (its name and
    /// configured address).
    ///
    /// # Errors
    /// [`ConfigError::UnknownSender`] when the chain has no such vault (or no custody
    /// section).
    pub fn template_sender(
        &self,
        chain: &str,
        vault: &str,
    ) -> Result<keel_workflows::tenancy::TemplateSender, ConfigError> {
        self.chains
            .get(chain)
            .and_then(|c| c.custody.as_ref())
            .and_then(|c| c.vaults.get(vault))
            .map(|v| keel_workflows::tenancy::TemplateSender {
                vault: vault.to_owned(),
                address: v.address,
            })
            .ok_or_else(|| ConfigError::UnknownSender {
                chain: chain.to_owned(),
                vault: vault.to_owned(),
            })
    }
}

impl ChainCustodyConfig {
    /// The adapter's configuration (the other adapter settings at their defaults).
    pub fn fireblocks(&self) -> keel_custody::FireblocksConfig {
        keel_custody::FireblocksConfig {
            requests_per_second: self.requests_per_second,
            burst: self.burst,
            request_timeout_ms: self.request_timeout_ms,
            ..keel_custody::FireblocksConfig::new(
                self.base_url.clone(),
                self.api_key.clone(),
                self.private_key.clone(),
            )
        }
    }
}

/// `[custody]`: inbound provider webhooks (role `api`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustodySettings {
    /// The JWKS URL the webhooks of `POST /v1/custody/webhooks/fireblocks` are verified
    /// against (Fireblocks: `https://keys.fireblocks.io/.well-known/jwks.json`; the
    /// simulator: `<base>/.well-known/jwks.json`). Empty (default): the route answers
    /// 404.
    pub webhook_jwks_url: String,
}

/// `[durable]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DurableConfig {
    /// `durable.confirmationWatcher`.
    pub confirmation_watcher: ConfirmationWatcherConfig,
    /// `durable.sharding`.
    pub sharding: ShardingConfig,
    /// Execution lease of a workflow segment, milliseconds (1000..=600000; default
    /// 30000): a crashed runner's in-flight segment is resumed elsewhere this long
    /// after its last renewal.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Largest start input or signal payload, bytes of compact JSON (1024..=16777216;
    /// default 262144).
    #[serde(default = "default_max_payload_bytes")]
    pub max_payload_bytes: usize,
    /// Unconsumed signals one workflow instance may hold (1..=100000; default 100).
    #[serde(default = "default_max_open_signals")]
    pub max_open_signals: u32,
    /// Claims of one command before it is dead-lettered (1..=1000; default 5).
    #[serde(default = "default_command_max_attempts")]
    pub command_max_attempts: u32,
    /// Attempts of a transiently failing step body inside one segment (1..=100;
    /// default 3).
    #[serde(default = "default_step_attempts")]
    pub step_attempts: u32,
    /// `durable.executor`: the runner's workflow executor.
    #[serde(default)]
    pub executor: ExecutorSettings,
}

fn default_lease_ms() -> u64 {
    30_000
}
fn default_max_payload_bytes() -> usize {
    262_144
}
fn default_max_open_signals() -> u32 {
    100
}
fn default_command_max_attempts() -> u32 {
    5
}
fn default_step_attempts() -> u32 {
    3
}

/// `[durable.executor]`: the runner's durable executor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExecutorSettings {
    /// Workflow segments one runner executes concurrently (1..=1024; default 4).
    pub concurrency: usize,
    /// Poll interval when no notification arrives (the fallback for lost notifications
    /// and lapsed leases), milliseconds (10..=60000; default 1000).
    pub poll_interval_ms: u64,
    /// How often a running segment renews its lease, milliseconds; 0 (default): a
    /// third of `durable.leaseMs`. Otherwise 100 or more and shorter than the lease.
    pub renew_interval_ms: u64,
}

impl Default for ExecutorSettings {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll_interval_ms: 1_000,
            renew_interval_ms: 0,
        }
    }
}

/// `[txq]`: the runner's transaction queue, for every chain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TxqSettings {
    /// A broadcast transaction without a receipt for this long (while its sender had
    /// no new inclusion for as long) is replaced with bumped fees, milliseconds; 0
    /// disables fee bumping, otherwise 1000..=86400000 (default 30000).
    pub bump_after_ms: u64,
    /// Percent a replacement raises both the max fee and the priority fee by
    /// (10..=1000; default 12; geth and reth refuse replacements below +10 %).
    pub bump_percent: u64,
    /// Upper bound of the max fee per gas, gwei (1..=10000000; default 1000).
    pub max_fee_cap_gwei: u64,
    /// Percent added to a gas estimate for the gas limit (0..=1000; default 20).
    pub gas_limit_headroom_percent: u64,
    /// Queued requests signed per sender per pass (1..=100000; default 256).
    pub sign_batch: u32,
    /// Nonce recovery runs every this many queue ticks (1..=1000000; default 40).
    pub recovery_every_ticks: u64,
    /// Broadcasts refused for insufficient funds retried (with a funding pause) before
    /// the request fails `GAS_REQUIRED` (0..=10000; default 10).
    pub funding_broadcast_retries: u32,
    /// Broadcasts of one sender outstanding at once (1..=4096; default 16).
    pub broadcast_in_flight: usize,
    /// Broadcasts per JSON-RPC batch (1..=1024; default 16; 1 = one request each).
    pub broadcast_batch: usize,
}

impl Default for TxqSettings {
    fn default() -> Self {
        Self {
            bump_after_ms: 30_000,
            bump_percent: 12,
            max_fee_cap_gwei: 1_000,
            gas_limit_headroom_percent: 20,
            sign_batch: 256,
            recovery_every_ticks: 40,
            funding_broadcast_retries: 10,
            broadcast_in_flight: 16,
            broadcast_batch: 16,
        }
    }
}

/// `[index.history]`: the indexer's history workers (leased ranges below the tip).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HistorySettings {
    /// How long a claimed range stays leased, milliseconds (1000..=3600000; default
    /// 60000); renewed every third of it while its worker fetches.
    pub lease_ms: u64,
    /// Largest `eth_getLogs` span, blocks (1..=1000000; default 2000); halves on a
    /// "range too large" answer.
    pub max_span: u64,
    /// Retries of a rate-limited or unreachable `eth_getLogs` before the range is left
    /// to its lease (0..=100; default 5).
    pub retries: u32,
}

impl Default for HistorySettings {
    fn default() -> Self {
        Self {
            lease_ms: 60_000,
            max_span: 2_000,
            retries: 5,
        }
    }
}

/// `[chainHealth]`: how runner and indexer processes decide which chains they serve.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ChainHealthSettings {
    /// First delay before a chain that is unreachable (or not bootstrapped) is tried
    /// again, milliseconds (10..=600000; default 1000); doubles per failure.
    pub retry_initial_ms: u64,
    /// Largest such delay, milliseconds (>= retryInitialMs, <= 600000; default 30000).
    pub retry_max_ms: u64,
    /// How often a served chain is probed (`eth_chainId`), milliseconds (10..=600000;
    /// default 5000).
    pub probe_interval_ms: u64,
    /// Consecutive failed probes after which a served chain is no longer served (its
    /// singleton shards are handed on) (1..=1000; default 3).
    pub failures_before_unserved: u32,
}

impl Default for ChainHealthSettings {
    fn default() -> Self {
        Self {
            retry_initial_ms: 1_000,
            retry_max_ms: 30_000,
            probe_interval_ms: 5_000,
            failures_before_unserved: 3,
        }
    }
}

/// `[supervision]`: restarts of a process's critical tasks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SupervisionSettings {
    /// First delay before a critical task that ended is restarted, milliseconds
    /// (10..=600000; default 1000); doubles per consecutive restart.
    pub restart_initial_ms: u64,
    /// Largest restart delay, milliseconds (>= restartInitialMs, <= 600000; default
    /// 30000).
    pub restart_max_ms: u64,
    /// Consecutive restarts of one task (each within a minute of the last) after which
    /// the process exits non-zero instead (1..=1000; default 10).
    pub max_restarts: u32,
}

impl Default for SupervisionSettings {
    fn default() -> Self {
        Self {
            restart_initial_ms: 1_000,
            restart_max_ms: 30_000,
            max_restarts: 10,
        }
    }
}

/// `[durable.confirmationWatcher]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfirmationWatcherConfig {
    /// Receipt reconciliation interval per chain, in milliseconds; 50..=60000, default 250.
    pub interval_ms: u64,
}

/// `[durable.sharding]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShardingConfig {
    /// Shard modulus (> 0), identical on every role of a deployment.
    pub shards: u32,
}

/// `[cluster]`: shard ownership of runner and indexer replicas (keel-cluster).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// Heartbeat / reassignment / lock re-assertion period, milliseconds (50..=60000).
    pub refresh_interval_ms: u64,
    /// Heartbeat age after which a replica is not live, milliseconds (>= 3 refresh
    /// intervals).
    pub liveness_window_ms: u64,
    /// Host name recorded in `cluster_replica` (empty: the machine's host name).
    pub host: String,
}

impl ClusterConfig {
    /// The refresh interval.
    pub fn refresh_interval(&self) -> Duration {
        Duration::from_millis(self.refresh_interval_ms)
    }

    /// The liveness window.
    pub fn liveness_window(&self) -> Duration {
        Duration::from_millis(self.liveness_window_ms)
    }
}

/// `[retention]`: the daily retention pass of the runner role.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionSettings {
    /// Age in days after which settled commands and ended instances are deleted (>= 1).
    pub window_days: u32,
    /// Rows per batch (one transaction each), 1..=100000.
    pub batch_size: u32,
    /// Batches per table per pass (>= 1).
    pub max_batches_per_pass: u32,
    /// Wait bound on a dependent row's lock, milliseconds (10..=60000).
    pub lock_timeout_ms: u64,
    /// Hour of the day (UTC) of the daily pass, 0..=23.
    pub hour_utc: u32,
    /// Registry rows of replicas silent for this many liveness windows are deleted (>= 2).
    pub stale_replica_windows: u32,
}

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

/// `[monitoring]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MonitoringConfig {
    /// `monitoring.blockchainHealthCollector`.
    pub blockchain_health_collector: HealthCollectorConfig,
}

/// `[monitoring.blockchainHealthCollector]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCollectorConfig {
    /// Seconds between collections; default 60; values below 60 must divide 60 so
    /// cycles align with the minute.
    pub interval_seconds: u64,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable on a terminal, JSON otherwise.
    Auto,
    /// Always human-readable.
    Human,
    /// Always one JSON object per line.
    Json,
}

/// `[telemetry]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Log format.
    pub log_format: LogFormat,
    /// `tracing_subscriber::EnvFilter` directive (`RUST_LOG` wins when set).
    pub log_filter: String,
    /// Address of the Prometheus endpoint (`GET /metrics`), `host:port`; empty disables.
    pub metrics_address: String,
    /// `[telemetry.otlp]`: OpenTelemetry trace export (off by default).
    #[serde(default)]
    pub otlp: OtlpConfig,
}

/// `[telemetry.otlp]`: OpenTelemetry trace export over OTLP/HTTP (binary protobuf) by
/// `keel run`. Off while `endpoint` is empty and `OTEL_EXPORTER_OTLP_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` are unset; `OTEL_SDK_DISABLED=true` turns it
/// off whatever is set. The other standard `OTEL_*` variables apply
/// (`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_TRACES_SAMPLER`, ...).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); spans are posted
    /// to `<endpoint>/v1/traces`. Empty (default): the `OTEL_*` variables decide.
    /// Printed only redacted (it may carry credentials).
    pub endpoint: String,
}

impl TelemetryConfig {
    /// The parsed metrics address, `None` when disabled.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for `telemetry.metricsAddress` when it is not `ip:port`.
    pub fn metrics_socket(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.metrics_address.is_empty() {
            return Ok(None);
        }
        self.metrics_address.parse().map(Some).map_err(|_| {
            invalid(
                "telemetry.metricsAddress",
                "must be ip:port, or empty to disable",
            )
        })
    }
}

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

/// `[operator]`: the account Keel sends transactions from (role `runner`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorConfig {
    /// Name of the environment variable holding the operator's hex private key: the
    /// shorthand of `signer = { kind = "env", var = … }`, used when `signer` is absent.
    pub key_env: String,
    /// `[operator.signer]`: the operator key of any kind ([`crate::signer::SignerConfig`]);
    /// absent: `keyEnv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<crate::signer::SignerConfig>,
    /// ERC-8021 attribution codes (schema 0), appended to every calldata.
    pub attribution_codes: Vec<String>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            key_env: "KEEL_OPERATOR_KEY".to_owned(),
            signer: None,
            attribution_codes: vec!["keel".to_owned()],
        }
    }
}

impl OperatorConfig {
    /// The operator key's configuration and the configuration key it comes from
    /// (`operator.signer`, or `operator.keyEnv` when no signer table is given).
    pub fn signer_config(&self) -> (crate::signer::SignerConfig, &'static str) {
        match &self.signer {
            Some(s) => (s.clone(), "operator.signer"),
            None => (
                crate::signer::SignerConfig::Env {
                    var: self.key_env.clone(),
                },
                "operator.keyEnv",
            ),
        }
    }
}

/// `[index]`: the Ledger Index (role `indexer`) and read-after-write waits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexSettings {
    /// Tip-ingest poll interval, milliseconds (50..=60000; default 100).
    pub poll_interval_ms: u64,
    /// Blocks after which a block is final (default 12); the hash window is twice this.
    pub finality_depth: u64,
    /// A workflow's read-after-write wait per step attempt, milliseconds (default 30000).
    pub read_after_write_wait_ms: u64,
    /// `eth_getLogs` requests a history worker keeps in flight per range (1..=64;
    /// default 4). Each counts against the upstream's rate limit.
    #[serde(default = "default_history_fetch_concurrency")]
    pub history_fetch_concurrency: usize,
    /// `index.history`.
    #[serde(default)]
    pub history: HistorySettings,
    /// The tip loop's fallback poll interval while a chain's `wsUrl` subscription wakes
    /// it on every new head, milliseconds (100..=600000; default 5000).
    #[serde(default = "default_subscribed_poll_interval_ms")]
    pub subscribed_poll_interval_ms: u64,
}

fn default_history_fetch_concurrency() -> usize {
    4
}

fn default_subscribed_poll_interval_ms() -> u64 {
    5_000
}

impl Default for IndexSettings {
    fn default() -> Self {
        Self {
            poll_interval_ms: 100,
            finality_depth: 12,
            read_after_write_wait_ms: 30_000,
            history_fetch_concurrency: default_history_fetch_concurrency(),
            history: HistorySettings::default(),
            subscribed_poll_interval_ms: default_subscribed_poll_interval_ms(),
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

/// The rules of `[chains.<chain>.custody]` and its vaults (keys named in full).
fn validate_custody(chain: &str, c: &ChainCustodyConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("chains.{chain}.custody.{k}");
    let origin = c
        .base_url
        .strip_prefix("https://")
        .or_else(|| c.base_url.strip_prefix("http://"));
    if !origin.is_some_and(|rest| !rest.is_empty() && !rest.trim_end_matches('/').contains('/')) {
        return Err(invalid(
            &key("baseUrl"),
            "must be an http:// or https:// origin without a path",
        ));
    }
    if !(1..=10_000).contains(&c.requests_per_second) {
        return Err(invalid(
            &key("requestsPerSecond"),
            "must be within 1..=10000",
        ));
    }
    if !(1..=10_000).contains(&c.burst) {
        return Err(invalid(&key("burst"), "must be within 1..=10000"));
    }
    if !(100..=600_000).contains(&c.request_timeout_ms) {
        return Err(invalid(
            &key("requestTimeoutMs"),
            "must be within 100..=600000 milliseconds",
        ));
    }
    let mut addresses = std::collections::BTreeSet::new();
    for (name, v) in &c.vaults {
        let vkey = |k: &str| format!("chains.{chain}.custody.vaults.{name}.{k}");
        if !keel_workflows::tenancy::valid_template_id(name) {
            return Err(invalid(
                &format!("chains.{chain}.custody.vaults.{name}"),
                "a vault's name must match ^[a-z0-9][a-z0-9._-]{0,63}$",
            ));
        }
        if keel_custody::VaultAccountId::new(v.vault_account_id.clone()).is_err() {
            return Err(invalid(
                &vkey("vaultAccountId"),
                "must be 1..255 characters of [A-Za-z0-9._:-]",
            ));
        }
        if keel_custody::AssetId::new(v.asset_id.clone()).is_err() {
            return Err(invalid(
                &vkey("assetId"),
                "must be 1..255 characters of [A-Za-z0-9._:-]",
            ));
        }
        if v.address.is_zero() {
            return Err(invalid(&vkey("address"), "must not be the zero address"));
        }
        if !addresses.insert(v.address) {
            return Err(invalid(&vkey("address"), "two vaults share an address"));
        }
        if v.poll_interval_ms == 0 || v.poll_interval_ms > 3_600_000 {
            return Err(invalid(
                &vkey("pollIntervalMs"),
                "must be within 1..=3600000 milliseconds",
            ));
        }
        if v.max_poll_interval_ms < v.poll_interval_ms || v.max_poll_interval_ms > 3_600_000 {
            return Err(invalid(
                &vkey("maxPollIntervalMs"),
                "must be at least pollIntervalMs and at most 3600000 milliseconds",
            ));
        }
        if v.poll_budget_secs == 0 {
            return Err(invalid(&vkey("pollBudgetSecs"), "must be at least 1"));
        }
        if v.clock_skew_secs > 3_600 {
            return Err(invalid(&vkey("clockSkewSecs"), "must be within 0..=3600"));
        }
    }
    Ok(())
}

fn invalid(key: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Key paths of the default configuration, for matching environment variables (which
/// are case-insensitive) to the camelCase keys.
fn known_paths() -> Vec<Vec<String>> {
    fn walk(prefix: &[String], table: &toml::Table, out: &mut Vec<Vec<String>>) {
        for (k, v) in table {
            let mut path = prefix.to_vec();
            path.push(k.clone());
            if let toml::Value::Table(t) = v {
                walk(&path, t, out);
            }
            out.push(path);
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = DEFAULT_TOML.parse::<toml::Table>() {
        walk(&[], &table, &mut out);
    }
    // Keys that are optional and commented out in the defaults.
    out.push(vec!["role".to_owned()]);
    for key in [
        "chainId",
        "rpcUrls",
        "confirmations",
        "finalityDepth",
        "wsUrl",
        "custody",
    ] {
        out.push(vec!["chains".to_owned(), "*".to_owned(), key.to_owned()]);
    }
    // `[aa.sponsorship]` policies (optional tables, commented out in the defaults).
    for table in [
        vec!["aa", "sponsorship", "default"],
        vec!["aa", "sponsorship", "organizations", "*"],
    ] {
        let table: Vec<String> = table.into_iter().map(str::to_owned).collect();
        for key in [
            "accounts",
            "targets",
            "maxGasPerOperation",
            "dailyBudgetWei",
        ] {
            let mut path = table.clone();
            path.push(key.to_owned());
            out.push(path);
        }
        out.push(table);
    }
    out.extend(custody_paths());
    // Signer tables (`[operator.signer]`, `[aa.sponsorSigner]`), optional.
    for table in [vec!["operator", "signer"], vec!["aa", "sponsorSigner"]] {
        let table: Vec<String> = table.into_iter().map(str::to_owned).collect();
        for key in crate::signer::SIGNER_KEYS {
            let mut path = table.clone();
            path.push((*key).to_owned());
            out.push(path);
        }
        out.push(table);
    }
    out
}

/// The optional custody keys (`chains.<name>.custody.…`, `custody.…`), for environment
/// overrides; a vault's name is any segment (`*`).
fn custody_paths() -> Vec<Vec<String>> {
    let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut out = vec![path(&["custody"]), path(&["custody", "webhookJwksUrl"])];
    for key in [
        "provider",
        "baseUrl",
        "apiKey",
        "privateKey",
        "requestsPerSecond",
        "burst",
        "requestTimeoutMs",
        "vaults",
    ] {
        out.push(path(&["chains", "*", "custody", key]));
    }
    for key in [
        "vaultAccountId",
        "assetId",
        "address",
        "pollIntervalMs",
        "maxPollIntervalMs",
        "pollBudgetSecs",
        "silentDropAfterSecs",
        "clockSkewSecs",
    ] {
        out.push(path(&["chains", "*", "custody", "vaults", "*", key]));
    }
    out
}

/// Whether `key` (dotted, e.g. `durable.executor.pollIntervalMs`) names a key or
/// section of the configuration; any name is accepted for a chain (`chains.<name>.…`).
pub fn is_known_key(key: &str) -> bool {
    let segments: Vec<&str> = key.split('.').collect();
    let mut known = known_paths();
    known.push(vec!["chains".to_owned(), "*".to_owned()]);
    known.iter().any(|path| {
        path.len() == segments.len()
            && path.iter().zip(&segments).enumerate().all(|(i, (k, s))| {
                k == s
                    || (k == "*" && !s.is_empty())
                    || (i == 1 && path[0] == "chains" && !s.is_empty())
            })
    })
}

/// An environment value as TOML when it parses as one (`500`, `true`,
/// `["http://a", "http://b"]`, `"quoted"`), else as the plain string; an address
/// (`0x` + 40 hex digits) is always the string.
fn env_value(raw: &str) -> toml::Value {
    // An address (`0x` + 40 hex digits) is text, though TOML reads a small one as a
    // hex integer.
    if raw.len() == 42 && raw.starts_with("0x") && raw[2..].bytes().all(|b| b.is_ascii_hexdigit()) {
        return toml::Value::String(raw.to_owned());
    }
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Maps an environment key (`durable.confirmationwatcher.intervalms`, already split on
/// `__` and lowercased) to its canonical camelCase path, segment by segment; segments
/// without a known spelling (a chain's name) are kept as written.
fn canonical_key(lower: &str, known: &[Vec<String>]) -> String {
    let mut out: Vec<String> = Vec::new();
    for segment in lower.split('.') {
        let depth = out.len();
        let matched = known.iter().find_map(|path| {
            let prefix_ok = path.len() > depth
                && path[..depth]
                    .iter()
                    .zip(&out)
                    .all(|(k, o)| k == "*" || k == o);
            (prefix_ok && path[depth].eq_ignore_ascii_case(segment) && path[depth] != "*")
                .then(|| path[depth].clone())
        });
        out.push(matched.unwrap_or_else(|| segment.to_owned()));
    }
    out.join(".")
}

impl Config {
    /// Loads defaults, then `file` when given, then `KEEL__…` variables from the
    /// process environment, and validates the result.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// [`Config::load`] with an explicit environment (tests).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key.
    pub fn load_with_env(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(invalid("--config", "file does not exist"));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let known = known_paths();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let key = canonical_key(&rest.to_ascii_lowercase().replace("__", "."), &known);
            figment = figment.merge(Serialized::default(&key, env_value(&value)));
        }
        let config: Config = figment.extract().map_err(|e| {
            let key = if e.path.is_empty() {
                "<root>".to_owned()
            } else {
                e.path.join(".")
            };
            let reason = match &e.kind {
                figment::error::Kind::UnknownField(field, _) => format!("unknown key `{field}`"),
                figment::error::Kind::MissingField(field) => format!("missing key `{field}`"),
                figment::error::Kind::InvalidType(actual, expected) => {
                    format!(
                        "expected {expected}, found {}",
                        actual.to_string().split(' ').next().unwrap_or("value")
                    )
                }
                figment::error::Kind::InvalidValue(_, expected) => format!("expected {expected}"),
                figment::error::Kind::UnknownVariant(_, expected) => {
                    format!("expected one of {}", expected.join(", "))
                }
                _ => "invalid value".to_owned(),
            };
            ConfigError::Parse { key, reason }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every rule that types alone do not express.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let id_ok = !self.deployment_id.is_empty()
            && self.deployment_id.len() <= 64
            && self
                .deployment_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !id_ok {
            return Err(invalid(
                "deploymentId",
                "must be 1..=64 characters of [A-Za-z0-9._-]",
            ));
        }
        self.database.validate().map_err(|e| match e {
            keel_store::StoreError::Config { key, reason } => invalid(key, reason),
            _ => invalid("database", "invalid"),
        })?;
        for (name, chain) in &self.chains {
            let key = |k: &str| format!("chains.{name}.{k}");
            if chain.chain_id == 0 {
                return Err(invalid(&key("chainId"), "must be greater than 0 (EIP-155)"));
            }
            if chain.rpc_urls.is_empty() {
                return Err(invalid(&key("rpcUrls"), "needs at least one URL"));
            }
            for url in &chain.rpc_urls {
                let ok = ["http://", "https://", "ws://", "wss://"]
                    .iter()
                    .any(|s| url.starts_with(s) && url.len() > s.len());
                if !ok {
                    return Err(invalid(
                        &key("rpcUrls"),
                        "each URL must be http(s):// or ws(s)://",
                    ));
                }
            }
            if let Some(ws) = &chain.ws_url {
                let ok = ["ws://", "wss://"]
                    .iter()
                    .any(|s| ws.starts_with(s) && ws.len() > s.len());
                if !ok {
                    return Err(invalid(&key("wsUrl"), "must be ws:// or wss://"));
                }
            }
        }
        for (name, chain) in &self.chains {
            if let Some(custody) = &chain.custody {
                validate_custody(name, custody)?;
            }
        }
        let jwks = &self.custody.webhook_jwks_url;
        if !(jwks.is_empty() || jwks.starts_with("http://") || jwks.starts_with("https://")) {
            return Err(invalid(
                "custody.webhookJwksUrl",
                "must be an http:// or https:// URL, or empty to disable",
            ));
        }
        let mut ids: Vec<u64> = self.chains.values().map(|c| c.chain_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("chains", "two chains share a chainId"));
        }
        if self.api.listen_address.parse::<SocketAddr>().is_err() {
            return Err(invalid("api.listenAddress", "must be ip:port"));
        }
        if !(1024..=16_777_216).contains(&self.api.body_limit_bytes) {
            return Err(invalid(
                "api.bodyLimitBytes",
                "must be within 1024..=16777216",
            ));
        }
        if self.api.status.pending_threshold_secs > 86_400 {
            return Err(invalid(
                "api.status.pendingThresholdSecs",
                "must be within 0..=86400",
            ));
        }
        if !(1..=2_592_000).contains(&self.api.status.no_mutation_threshold_secs) {
            return Err(invalid(
                "api.status.noMutationThresholdSecs",
                "must be within 1..=2592000",
            ));
        }
        if !(1..=64).contains(&self.index.history_fetch_concurrency) {
            return Err(invalid(
                "index.historyFetchConcurrency",
                "must be within 1..=64",
            ));
        }
        if !(100..=600_000).contains(&self.index.subscribed_poll_interval_ms) {
            return Err(invalid(
                "index.subscribedPollIntervalMs",
                "must be within 100..=600000 milliseconds",
            ));
        }
        if !(50..=60_000).contains(&self.index.poll_interval_ms) {
            return Err(invalid(
                "index.pollIntervalMs",
                "must be within 50..=60000 milliseconds",
            ));
        }
        if self.index.read_after_write_wait_ms == 0 {
            return Err(invalid("index.readAfterWriteWaitMs", "must be positive"));
        }
        let interval = self.durable.confirmation_watcher.interval_ms;
        if !(50..=60_000).contains(&interval) {
            return Err(invalid(
                "durable.confirmationWatcher.intervalMs",
                "must be within 50..=60000 milliseconds",
            ));
        }
        if !(1_000..=600_000).contains(&self.durable.lease_ms) {
            return Err(invalid(
                "durable.leaseMs",
                "must be within 1000..=600000 milliseconds",
            ));
        }
        let d = &self.durable;
        if !(1_024..=16_777_216).contains(&d.max_payload_bytes) {
            return Err(invalid(
                "durable.maxPayloadBytes",
                "must be within 1024..=16777216",
            ));
        }
        if !(1..=100_000).contains(&d.max_open_signals) {
            return Err(invalid(
                "durable.maxOpenSignals",
                "must be within 1..=100000",
            ));
        }
        if !(1..=1_000).contains(&d.command_max_attempts) {
            return Err(invalid(
                "durable.commandMaxAttempts",
                "must be within 1..=1000",
            ));
        }
        if !(1..=100).contains(&d.step_attempts) {
            return Err(invalid("durable.stepAttempts", "must be within 1..=100"));
        }
        let e = &d.executor;
        if !(1..=1_024).contains(&e.concurrency) {
            return Err(invalid(
                "durable.executor.concurrency",
                "must be within 1..=1024",
            ));
        }
        if !(10..=60_000).contains(&e.poll_interval_ms) {
            return Err(invalid(
                "durable.executor.pollIntervalMs",
                "must be within 10..=60000 milliseconds",
            ));
        }
        if e.renew_interval_ms != 0
            && (e.renew_interval_ms < 100 || e.renew_interval_ms >= d.lease_ms)
        {
            return Err(invalid(
                "durable.executor.renewIntervalMs",
                "must be 0 (a third of durable.leaseMs), or at least 100 and below durable.leaseMs",
            ));
        }
        let q = &self.txq;
        if q.bump_after_ms != 0 && !(1_000..=86_400_000).contains(&q.bump_after_ms) {
            return Err(invalid(
                "txq.bumpAfterMs",
                "must be 0 (no fee bumping) or within 1000..=86400000 milliseconds",
            ));
        }
        if !(10..=1_000).contains(&q.bump_percent) {
            return Err(invalid(
                "txq.bumpPercent",
                "must be within 10..=1000 (geth and reth refuse replacements below +10 %)",
            ));
        }
        if !(1..=10_000_000).contains(&q.max_fee_cap_gwei) {
            return Err(invalid(
                "txq.maxFeeCapGwei",
                "must be within 1..=10000000 gwei",
            ));
        }
        if q.gas_limit_headroom_percent > 1_000 {
            return Err(invalid(
                "txq.gasLimitHeadroomPercent",
                "must be within 0..=1000",
            ));
        }
        if !(1..=100_000).contains(&q.sign_batch) {
            return Err(invalid("txq.signBatch", "must be within 1..=100000"));
        }
        if !(1..=1_000_000).contains(&q.recovery_every_ticks) {
            return Err(invalid(
                "txq.recoveryEveryTicks",
                "must be within 1..=1000000",
            ));
        }
        if q.funding_broadcast_retries > 10_000 {
            return Err(invalid(
                "txq.fundingBroadcastRetries",
                "must be within 0..=10000",
            ));
        }
        if !(1..=4_096).contains(&q.broadcast_in_flight) {
            return Err(invalid("txq.broadcastInFlight", "must be within 1..=4096"));
        }
        if !(1..=1_024).contains(&q.broadcast_batch) {
            return Err(invalid("txq.broadcastBatch", "must be within 1..=1024"));
        }
        let h = &self.index.history;
        if !(1_000..=3_600_000).contains(&h.lease_ms) {
            return Err(invalid(
                "index.history.leaseMs",
                "must be within 1000..=3600000 milliseconds",
            ));
        }
        if !(1..=1_000_000).contains(&h.max_span) {
            return Err(invalid(
                "index.history.maxSpan",
                "must be within 1..=1000000 blocks",
            ));
        }
        if h.retries > 100 {
            return Err(invalid("index.history.retries", "must be within 0..=100"));
        }
        let c = &self.chain_health;
        if !(10..=600_000).contains(&c.retry_initial_ms) {
            return Err(invalid(
                "chainHealth.retryInitialMs",
                "must be within 10..=600000 milliseconds",
            ));
        }
        if c.retry_max_ms < c.retry_initial_ms || c.retry_max_ms > 600_000 {
            return Err(invalid(
                "chainHealth.retryMaxMs",
                "must be at least chainHealth.retryInitialMs and at most 600000 milliseconds",
            ));
        }
        if !(10..=600_000).contains(&c.probe_interval_ms) {
            return Err(invalid(
                "chainHealth.probeIntervalMs",
                "must be within 10..=600000 milliseconds",
            ));
        }
        if !(1..=1_000).contains(&c.failures_before_unserved) {
            return Err(invalid(
                "chainHealth.failuresBeforeUnserved",
                "must be within 1..=1000",
            ));
        }
        let v = &self.supervision;
        if !(10..=600_000).contains(&v.restart_initial_ms) {
            return Err(invalid(
                "supervision.restartInitialMs",
                "must be within 10..=600000 milliseconds",
            ));
        }
        if v.restart_max_ms < v.restart_initial_ms || v.restart_max_ms > 600_000 {
            return Err(invalid(
                "supervision.restartMaxMs",
                "must be at least supervision.restartInitialMs and at most 600000 milliseconds",
            ));
        }
        if !(1..=1_000).contains(&v.max_restarts) {
            return Err(invalid(
                "supervision.maxRestarts",
                "must be within 1..=1000",
            ));
        }
        if self.durable.sharding.shards == 0 {
            return Err(invalid("durable.sharding.shards", "must be greater than 0"));
        }
        if self.durable.sharding.shards > 65_536 {
            return Err(invalid("durable.sharding.shards", "must be at most 65536"));
        }
        let refresh = self.cluster.refresh_interval_ms;
        if !(50..=60_000).contains(&refresh) {
            return Err(invalid(
                "cluster.refreshIntervalMs",
                "must be within 50..=60000 milliseconds",
            ));
        }
        if self.cluster.liveness_window_ms < refresh.saturating_mul(3) {
            return Err(invalid(
                "cluster.livenessWindowMs",
                "must be at least three times cluster.refreshIntervalMs",
            ));
        }
        if self.cluster.host.len() > 255 {
            return Err(invalid("cluster.host", "must be at most 255 bytes"));
        }
        let r = &self.retention;
        if r.window_days == 0 || r.window_days > 36_500 {
            return Err(invalid(
                "retention.windowDays",
                "must be within 1..=36500 days",
            ));
        }
        if !(1..=100_000).contains(&r.batch_size) {
            return Err(invalid("retention.batchSize", "must be within 1..=100000"));
        }
        if r.max_batches_per_pass == 0 {
            return Err(invalid("retention.maxBatchesPerPass", "must be at least 1"));
        }
        if !(10..=60_000).contains(&r.lock_timeout_ms) {
            return Err(invalid(
                "retention.lockTimeoutMs",
                "must be within 10..=60000 milliseconds",
            ));
        }
        if r.hour_utc > 23 {
            return Err(invalid("retention.hourUtc", "must be within 0..=23"));
        }
        if r.stale_replica_windows < 2 {
            return Err(invalid(
                "retention.staleReplicaWindows",
                "must be at least 2",
            ));
        }
        let secs = self.monitoring.blockchain_health_collector.interval_seconds;
        if secs == 0 || (secs < 60 && 60 % secs != 0) {
            return Err(invalid(
                "monitoring.blockchainHealthCollector.intervalSeconds",
                "must be at least 60, or a divisor of 60 below it",
            ));
        }
        match &self.operator.signer {
            Some(signer) => signer.validate("operator.signer")?,
            None if self.operator.key_env.is_empty() => {
                return Err(invalid(
                    "operator.keyEnv",
                    "must name an environment variable",
                ));
            }
            None => {}
        }
        self.aa.validate()?;
        self.telemetry.metrics_socket()?;
        let otlp = &self.telemetry.otlp.endpoint;
        if !(otlp.is_empty() || otlp.starts_with("http://") || otlp.starts_with("https://")) {
            return Err(invalid(
                "telemetry.otlp.endpoint",
                "must be an http:// or https:// URL, or empty to disable",
            ));
        }
        Ok(())
    }

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
