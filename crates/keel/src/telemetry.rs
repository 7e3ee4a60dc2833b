//! Logging (tracing-subscriber) and metrics (Prometheus exporter), both stamped with
//! the deployment id.
//!
//! - Logs: human-readable on a terminal, one JSON object per line otherwise (or as
//!   configured). Every line carries `deployment_id` — a field of the JSON object, or a
//!   `deployment_id=<id>` prefix in human format — whatever span it was emitted in.
//! - PostgreSQL notices (sqlx logs them at INFO under [`PG_NOTICE_TARGET`]) are
//!   lowered to WARN unless the filter names that target ([`with_quiet_notices`]).
//! - Metrics: `GET /metrics` on `telemetry.metricsAddress`; every series carries the
//!   global label `deployment_id`. `keel_build_info{version, role}` is 1. The same
//!   listener answers `GET /healthz` (200 while the process runs) and `GET /readyz`
//!   ([`Readiness`]: 200 while the role is ready, else 503; the JSON body names the role
//!   and, for runner and indexer, the served and unserved chains).
//!
//! Every latency and size is a Prometheus **histogram** (`_bucket`/`_sum`/`_count`,
//! aggregatable across replicas), never a summary. Buckets by metric name; a full name
//! wins over a suffix:
//!
//! | metric (name or suffix) | buckets (upper bounds) |
//! | --- | --- |
//! | `keel_txq_time_to_broadcast_seconds`, `keel_txq_time_to_confirmation_seconds` | 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600 s |
//! | `keel_cluster_cron_cycle_duration_seconds`, `keel_durable_retention_pass_duration_seconds`, `keel_service_run_seconds` | 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600 s |
//! | `keel_api_request_duration_seconds` | 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 s |
//! | other `*_seconds` (durable claim latency and segment duration, …) | 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300 s |
//! | `*_bytes` | 256, 1 Ki, 4 Ki, 16 Ki, 64 Ki, 256 Ki, 1 Mi, 4 Mi, 16 Mi bytes |
//! | `*_blocks` (reorg depth) | 1, 2, 3, 5, 8, 13, 21, 34, 64, 128 blocks |
//! | `*_rows` (enqueue batch size) | 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000 rows |
//! | anything else | the `*_seconds` default above |

use crate::config::{ConfigError, LogFormat, TelemetryConfig};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
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

/// The target under which sqlx logs every PostgreSQL notice, at INFO (e.g. "relation
/// \"_sqlx_migrations\" already exists, skipping" on every start).
pub const PG_NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// `spec` with PostgreSQL's notices lowered to WARN (their INFO and DEBUG notices are
/// noise on every start), unless `spec` names [`PG_NOTICE_TARGET`] itself.
pub fn with_quiet_notices(spec: &str) -> String {
    if spec.contains(PG_NOTICE_TARGET) {
        spec.to_owned()
    } else if spec.trim().is_empty() {
        format!("info,{PG_NOTICE_TARGET}=warn")
    } else {
        format!("{spec},{PG_NOTICE_TARGET}=warn")
    }
}

fn filter(config: &TelemetryConfig) -> EnvFilter {
    let spec = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|s| EnvFilter::try_new(s).is_ok())
        .unwrap_or_else(|| config.log_filter.clone());
    EnvFilter::try_new(with_quiet_notices(&spec))
        .unwrap_or_else(|_| EnvFilter::new(with_quiet_notices("info")))
}

/// Installs the global tracing subscriber, writing to stderr.
///
/// # Errors
/// [`TelemetryError::AlreadyInstalled`] when a subscriber exists.
pub fn init_logging(config: &TelemetryConfig, deployment_id: &str) -> Result<(), TelemetryError> {
    init_logging_traced(config, deployment_id, None)
}

/// [`init_logging`], and with `tracer` every span (at the filter's levels) is also
/// exported through OpenTelemetry ([`crate::traces`]).
///
/// # Errors
/// [`TelemetryError::AlreadyInstalled`] when a subscriber exists.
pub fn init_logging_traced(
    config: &TelemetryConfig,
    deployment_id: &str,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) -> Result<(), TelemetryError> {
    let json = is_json(config.log_format);
    let otel = tracer.map(|t| tracing_opentelemetry::layer().with_tracer(t));
    let registry = tracing_subscriber::registry()
        .with(filter(config))
        .with(otel);
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
    let handle = histogram_buckets(PrometheusBuilder::new())
        .map_err(|e| {
            tracing::error!(target: "keel::telemetry", error = %e, "metrics buckets invalid");
            TelemetryError::Metrics
        })?
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

/// Latencies inside the process: sub-millisecond to minutes (the default bucket set).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];
/// HTTP request durations of the api role.
const REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Times that wait for a chain (broadcast, confirmation): 100 ms to an hour.
const CHAIN_WAIT_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];
/// Durations of jobs and periodic runs: 10 ms to an hour.
const JOB_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Sizes in bytes: 256 B to 16 MiB, powers of 4.
const BYTE_BUCKETS: &[f64] = &[
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
];
/// Reorg depths in blocks.
const BLOCK_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 64.0, 128.0];
/// Batch sizes in rows.
const ROW_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// Configures the histogram buckets of every metric family (the table in the module
/// docs), so no distribution renders as a summary.
fn histogram_buckets(
    builder: PrometheusBuilder,
) -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    let full = |name: &str| Matcher::Full(name.to_owned());
    let suffix = |name: &str| Matcher::Suffix(name.to_owned());
    builder
        .set_buckets(LATENCY_BUCKETS)?
        .set_buckets_for_metric(suffix("_seconds"), LATENCY_BUCKETS)?
        .set_buckets_for_metric(full("keel_api_request_duration_seconds"), REQUEST_BUCKETS)?
        .set_buckets_for_metric(
            full("keel_txq_time_to_broadcast_seconds"),
            CHAIN_WAIT_BUCKETS,
        )?
        .set_buckets_for_metric(
            full("keel_txq_time_to_confirmation_seconds"),
            CHAIN_WAIT_BUCKETS,
        )?
        .set_buckets_for_metric(
            full("keel_cluster_cron_cycle_duration_seconds"),
            JOB_BUCKETS,
        )?
        .set_buckets_for_metric(
            full("keel_durable_retention_pass_duration_seconds"),
            JOB_BUCKETS,
        )?
        .set_buckets_for_metric(full("keel_service_run_seconds"), JOB_BUCKETS)?
        .set_buckets_for_metric(suffix("_bytes"), BYTE_BUCKETS)?
        .set_buckets_for_metric(suffix("_blocks"), BLOCK_BUCKETS)?
        .set_buckets_for_metric(suffix("_rows"), ROW_BUCKETS)
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
    keel_aa::describe_metrics();
    keel_api::metrics::describe_metrics();
    keel_chain::describe_metrics();
    keel_cluster::describe_metrics();
    keel_durable::describe_metrics();
    keel_index::describe_metrics();
    keel_service::describe_metrics();
    keel_txq::describe_metrics();
    keel_webhooks::describe_metrics();
    keel_workflows::describe_metrics();
    metrics::describe_counter!(
        "keel_chain_unreachable_total",
        metrics::Unit::Count,
        "Times chain health found a chain unreachable (count)."
    );
    metrics::describe_counter!(
        "keel_critical_task_failures_total",
        metrics::Unit::Count,
        "Critical tasks that ended and were not restarted (count)."
    );
    metrics::describe_counter!(
        "keel_critical_task_restarts_total",
        metrics::Unit::Count,
        "Restarts of supervised critical tasks (count)."
    );
    metrics::describe_gauge!(
        "keel_chain_served",
        metrics::Unit::Count,
        "1 while this process serves the chain, else 0 (boolean)."
    );
    metrics::describe_gauge!(
        "keel_build_info",
        metrics::Unit::Count,
        "Always 1; labels carry the version and the role of this process."
    );
    metrics::describe_gauge!(
        "keel_ready",
        metrics::Unit::Count,
        "1 while this process serves its role, 0 while starting or draining."
    );
}

#[cfg(test)]
mod notice_tests {
    use super::*;

    #[test]
    fn postgres_notices_are_lowered_unless_named() {
        assert_eq!(
            with_quiet_notices("info"),
            "info,sqlx::postgres::notice=warn"
        );
        assert_eq!(
            with_quiet_notices("debug,sqlx::postgres::notice=info"),
            "debug,sqlx::postgres::notice=info"
        );
        assert_eq!(with_quiet_notices(""), "info,sqlx::postgres::notice=warn");
        assert!(EnvFilter::try_new(with_quiet_notices("keel=debug")).is_ok());
    }
}

#[cfg(test)]
mod unit_audit {
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use std::sync::Mutex;

    /// Records every `describe_*` call: (name, unit, help).
    #[derive(Default)]
    struct Descriptions(Mutex<Vec<(String, Option<Unit>, String)>>);

    impl Descriptions {
        fn push(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.0
                .lock()
                .unwrap()
                .push((key.as_str().to_owned(), unit, help.to_string()));
        }
    }

    impl Recorder for Descriptions {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.push(key, unit, help);
        }
        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.push(key, unit, help);
        }
        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.push(key, unit, help);
        }
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// Every metric any crate describes names its unit, and the unit agrees with the
    /// name's suffix (`_seconds` seconds, `_bytes` bytes, `_total` a count).
    #[test]
    fn every_described_metric_names_its_unit() {
        let recorder = Descriptions::default();
        metrics::with_local_recorder(&recorder, super::describe_metrics);
        let all = recorder.0.into_inner().unwrap();
        assert!(all.len() >= 40, "only {} metrics described", all.len());
        let mut wrong = Vec::new();
        for (name, unit, help) in &all {
            let expected = if name.ends_with("_seconds") {
                Some(Unit::Seconds)
            } else if name.ends_with("_bytes") {
                Some(Unit::Bytes)
            } else if name.ends_with("_total") {
                Some(Unit::Count)
            } else {
                None
            };
            match (unit, expected) {
                (None, _) => wrong.push(format!("{name}: no unit")),
                (Some(u), Some(e)) if *u != e => wrong.push(format!(
                    "{name}: unit {} but the name says {}",
                    u.as_str(),
                    e.as_str()
                )),
                _ => {}
            }
            if help.trim().is_empty() {
                wrong.push(format!("{name}: no description"));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
