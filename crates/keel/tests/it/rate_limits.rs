//! Request rate limits of the api role (`[api.rateLimit]`), as processes: the api role
//! against a real PostgreSQL with its limits from `KEEL__API__RATELIMIT__…` overrides.
//! A key over its per-key limit answers `429 RATE_LIMITED` with `Retry-After` and the
//! RateLimit fields while a key of another organization is served at the same moment,
//! and is served again after waiting the advertised `Retry-After`; an organization's
//! keys share the per-organization budget; the health routes are never limited; the
//! refusals are counted on the api's metrics endpoint.

use crate::common::stack::Procs;

use anvil_tests::TestChain;
use reqwest::header::HeaderMap;
use serde_json::Value;
use std::time::Duration;

/// The most requests a burst sends looking for its `429` (the limits below admit 3).
const BURST: usize = 20;

struct Stack {
    procs: Procs,
}

impl std::ops::Deref for Stack {
    type Target = Procs;
    fn deref(&self) -> &Procs {
        &self.procs
    }
}

impl Stack {
    /// `GET path` with `key`: status, headers and body, the answer checked against the
    /// served OpenAPI document.
    async fn get_with_headers(&self, key: &str, path: &str) -> (u16, HeaderMap, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.api))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let headers = r.headers().clone();
        let (status, body) = self.checked("GET", path, r).await;
        (status, headers, body)
    }

    /// Sends `GET /v1/assets` with `key` until it answers `429` (at most [`BURST`]
    /// requests, back to back); that answer, after checking every earlier one was a
    /// `200` carrying both RateLimit fields.
    async fn burst_until_limited(&self, key: &str) -> (HeaderMap, Value) {
        for _ in 0..BURST {
            let (status, headers, body) = self.get_with_headers(key, "/v1/assets").await;
            if status == 429 {
                return (headers, body);
            }
            assert_eq!(status, 200, "{body}");
            assert!(headers.contains_key("ratelimit"), "{headers:?}");
            assert!(headers.contains_key("ratelimit-policy"), "{headers:?}");
        }
        panic!(
            "{BURST} requests of one key were never limited\n{}",
            self.logs()
        );
    }

    /// Runs the api role (process `api`) with `limits` as `[api.rateLimit]` overrides and
    /// waits until it is ready.
    async fn serve(&mut self, limits: &[(&str, u32)]) {
        let extra: Vec<(String, String)> = limits
            .iter()
            .map(|(k, v)| (format!("KEEL__API__RATELIMIT__{k}"), v.to_string()))
            .collect();
        self.procs.spawn_with("api", "api", &extra);
        self.procs.await_ready().await;
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
}

/// Checks a `429 RATE_LIMITED` answer of `policy` ("api-key" / "organization") and
/// returns its `Retry-After` seconds.
fn assert_limited(headers: &HeaderMap, body: &Value, policy: &str, whose: &str) -> u64 {
    assert_eq!(body["code"], "RATE_LIMITED", "{body}");
    assert_eq!(body["status"], 429, "{body}");
    assert_eq!(body["retryable"], true, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.starts_with(whose), "{detail}");
    assert_eq!(header(headers, "content-type"), "application/problem+json");
    let retry: u64 = header(headers, "retry-after").parse().unwrap();
    assert!(retry >= 1, "Retry-After {retry}");
    assert_eq!(
        header(headers, "ratelimit"),
        format!("\"{policy}\";r=0;t={retry}")
    );
    assert!(
        header(headers, "ratelimit-policy").contains(&format!("\"{policy}\";q=")),
        "{headers:?}"
    );
    retry
}

/// The value of the sample of `metric` whose labels contain `label` in `text`.
fn sample(text: &str, metric: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_organizations_are_limited_separately_and_health_never() {
    let chain = TestChain::builder().start().await.unwrap();
    let mut stack = Stack {
        procs: Procs::new(chain, tempfile::tempdir().unwrap(), Vec::new()).await,
    };
    stack.cli(&["migrate"]);
    stack.cli(&["org", "create", "--name", "acme"]);
    stack.cli(&["org", "create", "--name", "globex"]);
    let key =
        |org: &str, label: &str| stack.cli(&["api-key", "create", "--org", org, "--label", label]);
    let (a, a2, b) = (key("acme", "a"), key("acme", "a2"), key("globex", "b"));

    // Per key: one request a second, three at once; organizations unlimited.
    stack
        .serve(&[
            ("PERKEYREQUESTSPERSECOND", 1),
            ("PERKEYBURST", 3),
            ("PERORGANIZATIONREQUESTSPERSECOND", 0),
        ])
        .await;
    let (headers, body) = stack.burst_until_limited(&a).await;
    let retry = assert_limited(&headers, &body, "api-key", "the API key's");
    assert_eq!(header(&headers, "ratelimit-policy"), "\"api-key\";q=3;w=3");
    // At the same moment, a key of another organization is served.
    let (status, headers, body) = stack.get_with_headers(&b, "/v1/assets").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "ratelimit"), "\"api-key\";r=2;t=1");
    // And so are the health routes, however often, without RateLimit fields.
    for _ in 0..BURST {
        for path in ["/healthz", "/readyz", "/openapi.json"] {
            let r = stack
                .http
                .get(format!("{}{path}", stack.api))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{path}");
            assert!(!r.headers().contains_key("ratelimit"), "{path}");
        }
    }
    // After the advertised wait (the bucket's real refill), key A is served again.
    tokio::time::sleep(Duration::from_secs(retry)).await;
    let (status, _, body) = stack.get_with_headers(&a, "/v1/assets").await;
    assert_eq!(status, 200, "after Retry-After: {body}");
    let metrics = stack.scrape("api").await;
    let limited = sample(&metrics, "keel_api_rate_limited_total", "limit=\"key\"");
    assert!(
        limited.is_some_and(|n| n >= 1.0),
        "no key refusal counted:\n{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "keel_api_rate_limited_total",
            "limit=\"organization\""
        ),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "keel_api_rate_limit_requests_per_second",
            "limit=\"key\""
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "keel_api_rate_limit_burst", "limit=\"key\""),
        Some(3.0),
        "{metrics}"
    );
    for id in [&a, &b] {
        assert!(!metrics.contains(id.as_str()));
    }

    // Per organization: keys nearly unlimited, the organization three at once.
    stack.procs.kill9("api");
    stack
        .serve(&[
            ("PERKEYREQUESTSPERSECOND", 1000),
            ("PERKEYBURST", 1000),
            ("PERORGANIZATIONREQUESTSPERSECOND", 1),
            ("PERORGANIZATIONBURST", 3),
        ])
        .await;
    // Acme's two keys share one budget: A spends part, A2 runs into the rest.
    let (status, headers, _) = stack.get_with_headers(&a, "/v1/assets").await;
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        "\"api-key\";q=1000;w=1, \"organization\";q=3;w=3"
    );
    assert_eq!(header(&headers, "ratelimit"), "\"organization\";r=2;t=1");
    let (headers, body) = stack.burst_until_limited(&a2).await;
    assert_limited(&headers, &body, "organization", "the organization's");
    let (status, headers, body) = stack.get_with_headers(&a, "/v1/assets").await;
    assert_eq!(status, 429, "{body}");
    assert_limited(&headers, &body, "organization", "the organization's");
    // Globex is served.
    let (status, _, body) = stack.get_with_headers(&b, "/v1/assets").await;
    assert_eq!(status, 200, "{body}");
    let metrics = stack.scrape("api").await;
    let limited = sample(
        &metrics,
        "keel_api_rate_limited_total",
        "limit=\"organization\"",
    );
    assert!(
        limited.is_some_and(|n| n >= 2.0),
        "organization refusals not counted:\n{metrics}"
    );
}

/// `[api.rateLimit]` loads its defaults, takes `KEEL__API__RATELIMIT__…` overrides
/// case-insensitively, and refuses out-of-range values naming the key.
#[test]
fn the_rate_limit_keys_load_and_validate() {
    use keel::config::Config;
    let load = |pairs: &[(&str, &str)]| {
        Config::load_with_env(
            None,
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>(),
        )
    };
    let defaults = load(&[]).unwrap().api.rate_limit;
    assert_eq!(
        (
            defaults.per_key_requests_per_second,
            defaults.per_key_burst,
            defaults.per_organization_requests_per_second,
            defaults.per_organization_burst
        ),
        (100, 200, 300, 600)
    );
    let off = load(&[("KEEL__API__RATELIMIT__PERKEYREQUESTSPERSECOND", "0")])
        .unwrap()
        .api
        .rate_limit;
    assert_eq!(off.per_key_requests_per_second, 0);
    assert!(!off.to_config().per_key.is_on());
    assert!(off.to_config().per_organization.is_on());
    for (var, value, key) in [
        (
            "KEEL__API__RATELIMIT__PERKEYBURST",
            "0",
            "api.rateLimit.perKeyBurst",
        ),
        (
            "KEEL__API__RATELIMIT__PERORGANIZATIONREQUESTSPERSECOND",
            "1000001",
            "api.rateLimit.perOrganizationRequestsPerSecond",
        ),
    ] {
        let e = load(&[(var, value)]).unwrap_err().to_string();
        assert!(e.contains(key), "{e}");
    }
    let e = load(&[("KEEL__API__RATELIMIT__PERMINUTE", "1")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key"), "{e}");
}
