//! `/v1/webhook-endpoints`: create (secret once), list pages, get, change, rotate with
//! overlap, test delivery, deliveries, delete; bad input is a typed 4xx; other
//! organizations see 404. Every answer is checked against the OpenAPI document.

use crate::common::Env;
use axum::http::Method;
use serde_json::json;

async fn call(
    env: &Env,
    key: &str,
    method: Method,
    uri: &str,
    body: Option<serde_json::Value>,
) -> crate::common::Answer {
    let auth = format!("Bearer {key}");
    let body = body.map(|b| ("application/json", serde_json::to_vec(&b).unwrap()));
    env.send(method, uri, &[("authorization", &auth)], body)
        .await
}

#[tokio::test]
async fn webhook_endpoints_lifecycle() {
    let env = Env::new().await;
    let created = call(
        &env,
        &env.key_a,
        Method::POST,
        "/v1/webhook-endpoints",
        Some(json!({"url": "http://127.0.0.1:9/hook", "eventTypes": ["*"], "description": "ops"})),
    )
    .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert!(
        created.body["secret"]
            .as_str()
            .unwrap()
            .starts_with("whsec_")
    );
    let id = created.body["endpoint"]["id"].as_str().unwrap().to_owned();
    for n in 0..2 {
        let a = call(
            &env,
            &env.key_a,
            Method::POST,
            "/v1/webhook-endpoints",
            Some(json!({"url": format!("http://127.0.0.1:9/h{n}"), "eventTypes": ["operation.accepted"]})),
        )
        .await;
        assert_eq!(a.status, 201);
    }
    // Pages.
    let page = env.get(&env.key_a, "/v1/webhook-endpoints?limit=2").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.body["data"].as_array().unwrap().len(), 2);
    assert_eq!(page.body["hasMore"], true);
    assert!(
        page.body["data"][0].get("secret").is_none(),
        "the secret is shown once"
    );
    let cursor = page.body["nextCursor"].as_str().unwrap().to_owned();
    let rest = env
        .get(
            &env.key_a,
            &format!("/v1/webhook-endpoints?limit=2&cursor={cursor}"),
        )
        .await;
    assert_eq!(rest.body["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest.body["hasMore"], false);
    assert_eq!(
        env.get(&env.key_a, "/v1/webhook-endpoints?cursor=%25")
            .await
            .code(),
        "INVALID_CURSOR"
    );
    // Other organizations: nothing.
    let b = env.get(&env.key_b, "/v1/webhook-endpoints").await;
    assert!(b.body["data"].as_array().unwrap().is_empty());
    assert_eq!(
        env.get(&env.key_b, &format!("/v1/webhook-endpoints/{id}"))
            .await
            .status,
        404
    );
    // Bad input.
    // (The shared body parser: an unknown member is `UNKNOWN_FIELD`, a missing or
    // wrongly typed one `INVALID_FIELD` naming it, as on every route.)
    for (body, status, code, names) in [
        (
            json!({"url": "ftp://x", "eventTypes": ["*"]}),
            422,
            "INVALID_FIELD",
            "`url`",
        ),
        (
            json!({"url": "http://127.0.0.1:9/x", "eventTypes": ["nope"]}),
            422,
            "INVALID_FIELD",
            "`eventTypes`",
        ),
        (
            json!({"url": "http://127.0.0.1:9/x"}),
            400,
            "INVALID_FIELD",
            "`eventTypes`",
        ),
        (
            json!({"url": "http://127.0.0.1:9/x", "eventTypes": ["*"], "extra": 1}),
            400,
            "UNKNOWN_FIELD",
            "accepted: url, eventTypes, description, enabled",
        ),
        (
            json!({"url": 7, "eventTypes": ["*"]}),
            400,
            "INVALID_FIELD",
            "`url`",
        ),
        (
            json!({"url": "http://127.0.0.1:9/x", "eventTypes": ["*"], "enabled": "yes"}),
            400,
            "INVALID_FIELD",
            "`enabled`",
        ),
    ] {
        let a = call(
            &env,
            &env.key_a,
            Method::POST,
            "/v1/webhook-endpoints",
            Some(body.clone()),
        )
        .await;
        assert_eq!(a.status, status, "{body}: {:?}", a.body);
        assert_eq!(a.code(), code, "{body}");
        let detail = a.body["detail"].as_str().unwrap();
        assert!(detail.contains(names), "{body}: {detail}");
    }
    // Change, rotate, test, deliveries.
    let changed = call(
        &env,
        &env.key_a,
        Method::PATCH,
        &format!("/v1/webhook-endpoints/{id}"),
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(changed.status, 200);
    assert_eq!(changed.body["enabled"], false);
    let rotated = call(
        &env,
        &env.key_a,
        Method::POST,
        &format!("/v1/webhook-endpoints/{id}/rotate-secret"),
        Some(json!({"overlapSeconds": 3600})),
    )
    .await;
    assert_eq!(rotated.status, 200);
    assert_ne!(rotated.body["secret"], created.body["secret"]);
    assert!(rotated.body["endpoint"]["previousSecretExpiresAt"].is_string());
    let too_long = call(
        &env,
        &env.key_a,
        Method::POST,
        &format!("/v1/webhook-endpoints/{id}/rotate-secret"),
        Some(json!({"overlapSeconds": 9_000_000})),
    )
    .await;
    assert_eq!(too_long.status, 422);
    let test = call(
        &env,
        &env.key_a,
        Method::POST,
        &format!("/v1/webhook-endpoints/{id}/test"),
        None,
    )
    .await;
    assert_eq!(test.status, 202);
    let deliveries = env
        .get(
            &env.key_a,
            &format!("/v1/webhook-endpoints/{id}/deliveries"),
        )
        .await;
    assert_eq!(deliveries.status, 200);
    let d = &deliveries.body["data"][0];
    assert_eq!(d["eventId"], test.body["eventId"]);
    assert_eq!(d["test"], true);
    assert_eq!(d["state"], "pending");
    // Delete.
    let del = call(
        &env,
        &env.key_a,
        Method::DELETE,
        &format!("/v1/webhook-endpoints/{id}"),
        None,
    )
    .await;
    assert_eq!(del.status, 204);
    assert_eq!(
        env.get(&env.key_a, &format!("/v1/webhook-endpoints/{id}"))
            .await
            .status,
        404
    );
    let again = call(
        &env,
        &env.key_a,
        Method::DELETE,
        &format!("/v1/webhook-endpoints/{id}"),
        None,
    )
    .await;
    assert_eq!(again.status, 404);
    assert_eq!(again.code(), "NOT_FOUND");
}
