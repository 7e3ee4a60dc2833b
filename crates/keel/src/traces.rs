//! OpenTelemetry trace export of `keel run` (OTLP/HTTP, binary protobuf), off by
//! default (`telemetry.otlp.endpoint`, or the standard `OTEL_*` variables).
//!
//! - Every `tracing` span of the process (at the log filter's levels) is exported
//!   through `tracing-opentelemetry` by a batch span processor (its own thread;
//!   `OTEL_BSP_*` tune it). [`TraceExport::shutdown`] flushes what is left.
//! - The resource names the deployment: `service.name` = `keel`, `service.version`,
//!   `service.instance.id` (a fresh id per process), `deployment.id` (the configured
//!   `deploymentId`), `keel.role` (`api`, `runner`, `indexer`), `host.name` (the
//!   `cluster.host` recorded for the replica, when set) and `process.pid`; host name
//!   and pid are what `cluster_replica` and the status page show for the replica.
//!   `OTEL_RESOURCE_ATTRIBUTES` adds more.
//! - W3C trace context: the api role continues a request's `traceparent` ([`http_layer`]):
//!   its request span is a child of the caller's span, so a client's trace contains
//!   Keel's handling of the request.
//!
//! - One trace per operation, across processes and restarts: the instance row keeps
//!   the `traceparent` of the request that started it and the queue's request row that
//!   of the segment that enqueued it (migration 0060, [`keel_service::trace`]); the
//!   runner's `segment` spans and the queue's `txq.broadcast` / `txq.settle` spans
//!   continue them (`durable.continueTraces` is implied by export being on).

use crate::config::TelemetryConfig;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::time::Duration;

/// Errors while installing trace export.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The OTLP exporter could not be built (a malformed endpoint or header variable).
    #[error("OTLP trace exporter could not be built: {0}")]
    Exporter(String),
}

/// The standard variables that turn export on without `telemetry.otlp.endpoint`.
const ENDPOINT_VARS: &[&str] = &[
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether export is on for `config` and the environment: an endpoint configured or
/// one of the standard endpoint variables set, and `OTEL_SDK_DISABLED` not `true`.
pub fn enabled(config: &TelemetryConfig) -> bool {
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && (!config.otlp.endpoint.is_empty()
            || ENDPOINT_VARS
                .iter()
                .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty())))
}

/// Who this process is, for the telemetry resource.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The configured `deploymentId`.
    pub deployment_id: String,
    /// `api`, `runner` or `indexer`.
    pub role: &'static str,
    /// `cluster.host` (empty: not set).
    pub host: String,
}

/// An installed trace export: the provider whose tracer the subscriber's
/// OpenTelemetry layer uses.
#[derive(Debug)]
pub struct TraceExport {
    provider: SdkTracerProvider,
    instance_id: String,
}

impl TraceExport {
    /// Builds the exporter and provider when [`enabled`]; `Ok(None)` when off. Also
    /// installs the W3C trace-context propagator globally. Call outside any async
    /// runtime (the exporter's blocking HTTP client owns one).
    ///
    /// # Errors
    /// [`TraceError::Exporter`] when the exporter cannot be built.
    pub fn install(
        config: &TelemetryConfig,
        identity: &Identity,
    ) -> Result<Option<Self>, TraceError> {
        if !enabled(config) {
            return Ok(None);
        }
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(EXPORT_TIMEOUT);
        if !config.otlp.endpoint.is_empty() {
            let base = config.otlp.endpoint.trim_end_matches('/');
            builder = builder.with_endpoint(format!("{base}/v1/traces"));
        }
        let exporter = builder
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let instance_id = uuid::Uuid::new_v4().to_string();
        let mut attributes = vec![
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", instance_id.clone()),
            KeyValue::new("deployment.id", identity.deployment_id.clone()),
            KeyValue::new("keel.role", identity.role),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ];
        if !identity.host.is_empty() {
            attributes.push(KeyValue::new("host.name", identity.host.clone()));
        }
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("keel")
            .with_attributes(attributes)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_batch_exporter(exporter)
            .build();
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        Ok(Some(Self {
            provider,
            instance_id,
        }))
    }

    /// The tracer for the subscriber's OpenTelemetry layer.
    pub fn tracer(&self) -> opentelemetry_sdk::trace::Tracer {
        self.provider.tracer("keel")
    }

    /// The `service.instance.id` of this process.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Exports what is buffered and stops the exporter (blocks up to the export
    /// timeout). Call outside any async runtime.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("keel: trace export did not shut down cleanly: {e}");
        }
    }
}

/// Reads W3C `traceparent` / `tracestate` from request headers.
struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// Middleware of the api role: each request runs in a span `http.request` (fields
/// `http.request.method`, `http.route` — the route template, never the path with its
/// ids) whose parent is the request's W3C `traceparent` when it carries one. Without
/// trace export installed the span is an ordinary tracing span.
pub async fn http_layer(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let parent = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&HeaderExtractor(request.headers()))
    });
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!(
        target: "keel::api",
        "http.request",
        otel.name = format!("{} {route}", request.method()),
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
    );
    let _ = span.set_parent(parent);
    let response = next.run(request).instrument(span.clone()).await;
    // As i64: tracing-opentelemetry exports u64 fields as text.
    span.record(
        "http.response.status_code",
        i64::from(response.status().as_u16()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_is_off_by_default_and_on_with_an_endpoint() {
        let mut config = crate::config::Config::load_with_env(None, std::iter::empty())
            .unwrap()
            .telemetry;
        let from_env = ENDPOINT_VARS.iter().any(|v| std::env::var(v).is_ok())
            || std::env::var("OTEL_SDK_DISABLED").is_ok();
        if !from_env {
            assert!(!enabled(&config), "off by default");
            config.otlp.endpoint = "http://127.0.0.1:4318".into();
            assert!(enabled(&config));
        }
    }

    #[test]
    fn a_malformed_endpoint_names_the_key() {
        let dir = tempfile_dir();
        let path = dir.join("otlp.toml");
        std::fs::write(&path, "[telemetry.otlp]\nendpoint = \"localhost:4318\"\n").unwrap();
        let err =
            crate::config::Config::load_with_env(Some(&path), std::iter::empty()).unwrap_err();
        assert!(err.to_string().contains("telemetry.otlp.endpoint"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_endpoint_is_printed_redacted() {
        let env = [(
            "KEEL__TELEMETRY__OTLP__ENDPOINT".to_owned(),
            "https://user:s3cret-token@collector.example:4318/tenant".to_owned(),
        )];
        let config = crate::config::Config::load_with_env(None, env).unwrap();
        assert!(enabled(&config.telemetry) || std::env::var("OTEL_SDK_DISABLED").is_ok());
        let printed = config.redacted_toml();
        assert!(!printed.contains("s3cret-token"), "{printed}");
        assert!(printed.contains("collector.example:4318"), "{printed}");
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("keel-traces-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
