//! OpenTelemetry trace export of `keel run` to a local OTLP/HTTP receiver (binary
//! protobuf, decoded with the OTLP's own message types): the resource names the
//! service, its version and the deployment identity, and an API request's span
//! continues the caller's W3C `traceparent`.

use crate::common::{free_port, keel};

use crate::common::otlp;
use keel_store::testing::TestDatabase;
use otlp::{int_attr, receiver, string_attr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_spans_reach_the_otlp_receiver_with_the_deployment_identity_and_the_callers_trace() {
    let db = TestDatabase::create().await.unwrap();
    let cli = |args: &[&str]| {
        let out = keel()
            .args(args)
            .env("KEEL__DATABASE__URL", db.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    cli(&["migrate"]);
    cli(&["org", "create", "--name", "acme"]);
    let key = cli(&["api-key", "create", "--org", "acme", "--label", "a"]);

    let (otlp_port, received) = receiver().await;
    let api_port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = keel()
        .args(["run", "--role", "api", "--termination-grace-seconds", "5"])
        .env("KEEL__DATABASE__URL", db.url())
        .env("KEEL__API__LISTENADDRESS", format!("127.0.0.1:{api_port}"))
        .env("KEEL__TELEMETRY__METRICSADDRESS", "")
        .env("KEEL__TELEMETRY__LOGFORMAT", "json")
        .env("KEEL__DEPLOYMENTID", "otel-dep-1")
        .env("KEEL__CLUSTER__HOST", "api-host-1")
        .env(
            "KEEL__TELEMETRY__OTLP__ENDPOINT",
            format!("http://127.0.0.1:{otlp_port}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap();
    let api = format!("http://127.0.0.1:{api_port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{api}/readyz")).send().await
            && r.status().is_success()
        {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "keel exited early");
        assert!(Instant::now() < deadline, "api not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A caller's trace: the API's request span must join it.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_span = "00f067aa0ba902b7";
    let r = http
        .get(format!("{api}/v1/operations"))
        .bearer_auth(&key)
        .header("traceparent", format!("00-{trace_id}-{parent_span}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The batch processor exports within its schedule delay; probe until the span came.
    let want_trace = alloy::hex::decode(trace_id).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (resource, span) = loop {
        let found = received.lock().unwrap().iter().find_map(|req| {
            req.resource_spans.iter().find_map(|rs| {
                rs.scope_spans
                    .iter()
                    .flat_map(|ss| ss.spans.iter())
                    .find(|s| s.trace_id == want_trace && s.name.contains("/v1/operations"))
                    .map(|s| (rs.resource.clone().unwrap_or_default(), s.clone()))
            })
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no span of the caller's trace arrived; api log:\n{}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let attrs = &resource.attributes;
    assert_eq!(string_attr(attrs, "service.name"), Some("keel"));
    assert_eq!(
        string_attr(attrs, "service.version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(string_attr(attrs, "deployment.id"), Some("otel-dep-1"));
    assert_eq!(string_attr(attrs, "keel.role"), Some("api"));
    assert_eq!(string_attr(attrs, "host.name"), Some("api-host-1"));
    assert_eq!(int_attr(attrs, "process.pid"), Some(i64::from(child.id())));
    assert!(
        string_attr(attrs, "service.instance.id").is_some_and(|s| s.len() == 36),
        "{attrs:?}"
    );
    assert_eq!(span.name, "GET /v1/operations");
    assert_eq!(
        span.parent_span_id,
        alloy::hex::decode(parent_span).unwrap(),
        "the request span is a child of the caller's span"
    );
    assert_eq!(
        string_attr(&span.attributes, "http.route"),
        Some("/v1/operations")
    );
    assert_eq!(
        int_attr(&span.attributes, "http.response.status_code"),
        Some(200),
        "{:?}",
        span.attributes
    );
    // No secret in any exported attribute.
    let everything = format!("{:?}", received.lock().unwrap());
    assert!(!everything.contains(&key), "the API key was exported");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait().unwrap();
    assert!(out.success(), "exit status {out:?}");
}
