//! Logging (tracing-subscriber) and metrics (Prometheus exporter), both stamped with
//! the deployment id.
//!
//! - Logs: human-readable on a terminal, one JSON object per line otherwise (or as
//!   configured). Every line carries `deployment_id` — a field of the JSON object, or a
//!   `deployment_id=<id>` prefix in human format — whatever span it was emitted in.
//! - Metrics: `GET /metrics` on `telemetry.metricsAddress`; every series carries the
//!   global label `deployment_id`. `keel_build_info{version, role}` is 1. The same
//!   listener answers `GET /healthz` (200 while the process runs) and `GET /readyz`
//!   ([`Readiness`]: 200 while the role is ready, else 503; the JSON body names the role
//!   and, for runner and indexer, the served and unserved chains).

use crate::config::{ConfigError, LogFormat, TelemetryConfig};
use metrics_exporter_prometheus::PrometheusHandle;
use std::fmt;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
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

/// The bound telemetry endpoint ([`init_metrics`]), served by [`serve_endpoint`].
#[derive(Debug)]
pub struct MetricsEndpoint {
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
}

impl MetricsEndpoint {
    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }
}

/// Binds the telemetry endpoint (when configured) and installs the global metrics
/// recorder with the `deployment_id` label; records `keel_build_info`. Must run inside a
/// tokio runtime. Serve it with [`serve_endpoint`].
///
/// # Errors
/// [`TelemetryError::Metrics`] when the address cannot be bound or the recorder not
/// installed, [`TelemetryError::Config`] for a malformed address.
pub async fn init_metrics(
    config: &TelemetryConfig,
    deployment_id: &str,
    role: &'static str,
) -> Result<Option<MetricsEndpoint>, TelemetryError> {
    let Some(addr) = config.metrics_socket()? else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        tracing::error!(target: "keel::telemetry", error = %e, "metrics endpoint failed");
        TelemetryError::Metrics
    })?;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .add_global_label("deployment_id", deployment_id)
        .install_recorder()
        .map_err(|e| {
            tracing::error!(target: "keel::telemetry", error = %e, "metrics recorder failed");
            TelemetryError::Metrics
        })?;
    describe_metrics();
    metrics::gauge!("keel_build_info", "version" => env!("CARGO_PKG_VERSION"), "role" => role)
        .set(1.0);
    Ok(Some(MetricsEndpoint { listener, handle }))
}

/// What `GET /readyz` on the telemetry endpoint reports.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The role (`api`, `runner`, `indexer`).
    pub role: &'static str,
    /// True while the role serves (set once started, cleared first on shutdown).
    pub ready: Arc<AtomicBool>,
    /// The chains of a runner or indexer.
    pub chains: Option<crate::chains::ChainSet>,
    /// For an indexer: the database, to report chains whose Ledger Index is degraded.
    pub index_db: Option<sqlx::PgPool>,
}

impl Readiness {
    /// The `/readyz` status and JSON body: `{"status": "ready"|"not ready"|"degraded",
    /// "role": …, "chains": {"served": [{"name", "chainId"}], "unserved": [...]},
    /// "indexDegraded": ["<chainId>", …]}` (`chains` only for runner and indexer,
    /// `indexDegraded` only for an indexer). An indexer with a degraded chain (a reorg
    /// below the finalized block stopped its tip ingest) answers not ready (`degraded`)
    /// until the chain is re-indexed; so does one whose database cannot be read.
    pub async fn body(&self) -> (bool, serde_json::Value) {
        let mut ready = self.ready.load(Ordering::SeqCst);
        let mut body = serde_json::json!({
            "status": if ready { "ready" } else { "not ready" },
            "role": self.role,
        });
        if let Some(chains) = &self.chains {
            body["chains"] = serde_json::to_value(chains.report()).unwrap_or_default();
        }
        if let Some(db) = &self.index_db {
            match keel_index::read::degraded_chains(db).await {
                Ok(degraded) => {
                    let ids: Vec<String> =
                        degraded.iter().map(|h| h.chain.get().to_string()).collect();
                    if !ids.is_empty() && ready {
                        ready = false;
                        body["status"] = "degraded".into();
                    }
                    body["indexDegraded"] = ids.into();
                }
                Err(_) => {
                    ready = false;
                    body["status"] = "not ready".into();
                }
            }
        }
        (ready, body)
    }
}

/// How often the metrics recorder's upkeep (histogram buckets) runs.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Serves `GET /metrics`, `GET /healthz` and `GET /readyz` on `endpoint` until
/// `shutdown` fires. The returned handle resolves when serving ended, with the
/// server's I/O error if it failed.
pub fn serve_endpoint(
    endpoint: MetricsEndpoint,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> JoinHandle<Result<(), std::io::Error>> {
    use axum::routing::get;
    let MetricsEndpoint { listener, handle } = endpoint;
    let upkeep = handle.clone();
    let upkeep_stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tokio::select! {
                () = upkeep_stop.cancelled() => break,
                _ = tick.tick() => upkeep.run_upkeep(),
            }
        }
    });
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move { handle.render() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    let (ready, body) = readiness.body().await;
                    let status = if ready {
                        axum::http::StatusCode::OK
                    } else {
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    };
                    (status, axum::Json(body))
                }
            }),
        );
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
    })
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
