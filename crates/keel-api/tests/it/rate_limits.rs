//! Request rate limits (`keel_api::rate_limit`) through the router over a real
//! database: a key over its limit answers `429 RATE_LIMITED` with `Retry-After` and
//! the RateLimit fields (and the answer matches the OpenAPI document) while a key of
//! another organization is served; an organization's keys share its budget; admitted
//! answers carry the fields; public routes are never limited.

use crate::common::{Answer, Env, assert_problem};
use axum::http::{Method, StatusCode};
use keel_api::ApiConfig;
use keel_api::rate_limit::{Limit, RateLimitConfig};

fn config(per_key: Limit, per_organization: Limit) -> ApiConfig {
    ApiConfig {
        rate_limits: RateLimitConfig {
            per_key,
            per_organization,
        },
        ..ApiConfig::default()
    }
}

fn assert_limited(a: &Answer, policy: &str, whose: &str) {
    assert_problem(a, 429, "RATE_LIMITED", "limited");
    assert_eq!(a.body["retryable"], true, "{:?}", a.body);
    let detail = a.body["detail"].as_str().unwrap();
    assert!(detail.starts_with(whose), "{detail}");
    let retry: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1, "Retry-After {retry}");
    assert_eq!(
        a.header("ratelimit"),
        Some(format!("\"{policy}\";r=0;t={retry}").as_str())
    );
    assert!(a.header("ratelimit-policy").is_some());
}

#[tokio::test]
async fn a_key_over_its_limit_is_refused_while_another_organization_is_served() {
    // One request a second, two at once; organizations unlimited.
    let env = Env::with_config(config(Limit::new(1, 2), Limit::OFF)).await;
    let first = env.get(&env.key_a, "/v1/assets").await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"api-key\";q=2;w=2")
    );
    assert_eq!(first.header("ratelimit"), Some("\"api-key\";r=1;t=1"));
    let second = env.get(&env.key_a, "/v1/assets").await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.header("ratelimit"), Some("\"api-key\";r=0;t=2"));
    let refused = env.get(&env.key_a, "/v1/assets").await;
    assert_limited(&refused, "api-key", "the API key's");
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"api-key\";q=2;w=2")
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    // A POST route is limited the same way, before its body is looked at.
    let refused = env
        .post(
            &env.key_a,
            "/v1/assets",
            Some("rl-1"),
            &serde_json::json!({}),
        )
        .await;
    assert_limited(&refused, "api-key", "the API key's");
    // Organization B's key, at the same moment.
    let other = env.get(&env.key_b, "/v1/assets").await;
    assert_eq!(other.status, StatusCode::OK, "{:?}", other.body);
    // A's second key has its own bucket (the organization is not limited).
    let sibling = env.get(&env.key_a2, "/v1/assets").await;
    assert_eq!(sibling.status, StatusCode::OK);
    // Public routes are never limited and carry no RateLimit fields.
    for _ in 0..20 {
        for path in ["/healthz", "/readyz", "/openapi.json"] {
            let a = env.send(Method::GET, path, &[], None).await;
            assert_eq!(a.status, StatusCode::OK, "{path}");
            assert!(a.header("ratelimit").is_none(), "{path}");
        }
    }
    // An unauthenticated request is not counted against anyone.
    let a = env.get("keel_sk_nope", "/v1/assets").await;
    assert_problem(&a, 401, "UNAUTHENTICATED", "bad key");
}

#[tokio::test]
async fn an_organizations_keys_share_its_budget() {
    let env = Env::with_config(config(Limit::new(100, 100), Limit::new(1, 2))).await;
    let a1 = env.get(&env.key_a, "/v1/assets").await;
    assert_eq!(a1.status, StatusCode::OK);
    assert_eq!(
        a1.header("ratelimit-policy"),
        Some("\"api-key\";q=100;w=1, \"organization\";q=2;w=2")
    );
    // The tighter of the two limits is reported.
    assert_eq!(a1.header("ratelimit"), Some("\"organization\";r=1;t=1"));
    let a2 = env.get(&env.key_a2, "/v1/assets").await;
    assert_eq!(a2.status, StatusCode::OK);
    for key in [&env.key_a, &env.key_a2] {
        let refused = env.get(key, "/v1/assets").await;
        assert_limited(&refused, "organization", "the organization's");
    }
    let other = env.get(&env.key_b, "/v1/assets").await;
    assert_eq!(other.status, StatusCode::OK);
}

#[tokio::test]
async fn without_limits_no_fields_are_sent() {
    let env = Env::new().await;
    for _ in 0..50 {
        let a = env.get(&env.key_a, "/v1/assets").await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(a.header("ratelimit").is_none());
        assert!(a.header("ratelimit-policy").is_none());
    }
}
