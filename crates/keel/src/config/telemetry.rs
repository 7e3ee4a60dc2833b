//! `[monitoring]`, `[telemetry]` (with `otlp`): metrics, logs, trace export.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

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
