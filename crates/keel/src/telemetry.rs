//! Logging (tracing-subscriber) and metrics (Prometheus exporter), both stamped with
//! the deployment id.
//!
//! - Logs: human-readable on a terminal, one JSON object per line otherwise (or as
//!   configured). Every line carries `deployment_id` — a field of the JSON object, or a
//!   `deployment_id=<id>` prefix in human format — whatever span it was emitted in.
//! - Metrics: `GET /metrics` on `telemetry.metricsAddress`; every series carries the
//!   global label `deployment_id`. `keel_build_info{version, role}` is 1.

use crate::config::{ConfigError, LogFormat, TelemetryConfig};
use std::fmt;
use std::io::IsTerminal;
use std::net::SocketAddr;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, prelude::*};

/// Errors while installing telemetry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Prometheus endpoint could not be started (address in use?).
    #[error("metrics endpoint could not start on the configured address")]
    Metrics,
    /// A global subscriber or recorder was already installed.
    #[error("telemetry was already installed in this process")]
    AlreadyInstalled,
}

/// Wraps a formatter and stamps `deployment_id` onto every line.
struct Stamped<F> {
    deployment_id: String,
    json: bool,
    inner: F,
}

impl<S, N, F> FormatEvent<S, N> for Stamped<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        if !self.json {
            write!(writer, "deployment_id={} ", self.deployment_id)?;
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                // The id is validated to [A-Za-z0-9._-], so it needs no JSON escaping.
                write!(
                    writer,
                    "{{\"deployment_id\":\"{}\",{rest}",
                    self.deployment_id
                )
            }
            None => writer.write_str(&line),
        }
    }
}

/// Whether `format` resolves to JSON in this process.
pub fn is_json(format: LogFormat) -> bool {
    match format {
        LogFormat::Json => true,
        LogFormat::Human => false,
        LogFormat::Auto => !std::io::stdout().is_terminal(),
    }
}

fn filter(config: &TelemetryConfig) -> EnvFilter {
    EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log_filter))
        .unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Installs the global tracing subscriber, writing to stderr.
///
/// # Errors
/// [`TelemetryError::AlreadyInstalled`] when a subscriber exists.
pub fn init_logging(config: &TelemetryConfig, deployment_id: &str) -> Result<(), TelemetryError> {
    let json = is_json(config.log_format);
    let registry = tracing_subscriber::registry().with(filter(config));
    let result = if json {
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .fmt_fields(JsonFields::new())
            .event_format(Stamped {
                deployment_id: deployment_id.to_owned(),
                json: true,
                inner: tracing_subscriber::fmt::format()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false),
            });
        registry.with(layer).try_init()
    } else {
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .event_format(Stamped {
                deployment_id: deployment_id.to_owned(),
                json: false,
                inner: tracing_subscriber::fmt::format(),
            });
        registry.with(layer).try_init()
    };
    result.map_err(|_| TelemetryError::AlreadyInstalled)
}

/// Starts the Prometheus endpoint (when configured) and installs the global metrics
/// recorder with the `deployment_id` label; records `keel_build_info`. Must run inside a
/// tokio runtime. Returns the bound address.
///
/// # Errors
/// [`TelemetryError::Metrics`] when the endpoint cannot start,
/// [`TelemetryError::Config`] for a malformed address.
pub fn init_metrics(
    config: &TelemetryConfig,
    deployment_id: &str,
    role: &'static str,
) -> Result<Option<SocketAddr>, TelemetryError> {
    let Some(addr) = config.metrics_socket()? else {
        return Ok(None);
    };
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .add_global_label("deployment_id", deployment_id)
        .install()
        .map_err(|e| {
            tracing::error!(target: "keel::telemetry", error = %e, "metrics endpoint failed");
            TelemetryError::Metrics
        })?;
    describe_metrics();
    metrics::gauge!("keel_build_info", "version" => env!("CARGO_PKG_VERSION"), "role" => role)
        .set(1.0);
    Ok(Some(addr))
}

fn describe_metrics() {
    metrics::describe_gauge!(
        "keel_build_info",
        "Always 1; labels carry the version and the role of this process."
    );
    metrics::describe_gauge!(
        "keel_ready",
        "1 while this process serves its role, 0 while starting or draining."
    );
}
