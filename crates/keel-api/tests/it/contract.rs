//! The request contract every route keeps (issue 32 §9), proven over the route table
//! (`keel_api::scope::ROUTES`) and the document, so a new route is covered without a
//! new test: unknown query parameters are refused with a typed, documented `400`; every
//! route with a JSON body reads it with the one streaming body parser (duplicate
//! member → `400` naming it); every route with a body answers an oversized one with a
//! documented `413` problem.

use crate::common::{Env, assert_problem, doc};
use axum::http::Method;
use keel_api::scope::ROUTES;
use keel_workflows::Scope;
use serde_json::Value;

/// `template` with its path parameters filled with well-formed values.
fn concrete(template: &str) -> String {
    template
        .replace("{id}", "00000000-0000-4000-8000-000000000001")
        .replace("{address}", crate::common::RECIPIENT)
        .replace("{chain}", "31337")
        .replace(
            "{hash}",
            "0x0000000000000000000000000000000000000000000000000000000000000001",
        )
}

fn method(m: &str) -> Method {
    Method::from_bytes(m.to_uppercase().as_bytes()).unwrap()
}

async fn all_scopes(env: &Env) -> String {
    env.key_with(
        "org-a",
        &[Scope::Read, Scope::Operate, Scope::Approve, Scope::Admin],
    )
    .await
}

/// Every route of the table refuses a query parameter it does not declare with `400
/// UNKNOWN_QUERY_PARAMETER` (declared in the document for that operation, checked by
/// `Env::send`), naming the parameter but never its value — before its handler runs,
/// so nothing is read or written; and no parameter the document declares is refused as
/// unknown. (Before: `?atBlock=20` on the balance route answered the latest balance.)
#[tokio::test]
async fn every_route_refuses_an_unknown_query_parameter() {
    let env = Env::new().await;
    let key = all_scopes(&env).await;
    let auth = format!("Bearer {key}");
    let before = env.counts().await;
    let document: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    for route in ROUTES {
        let m = method(route.method);
        let path = concrete(route.path);
        let label = format!("{} {}", route.method, route.path);
        let headers = [
            ("authorization", auth.as_str()),
            ("idempotency-key", "contract-query"),
        ];
        // Known parameters first, then the unknown one (the first unknown answers).
        let declared = keel_api::scope::query_parameters(&m, route.path)
            .unwrap_or_else(|| panic!("{label}: not in the document"));
        let mut query: Vec<String> = declared.iter().map(|n| format!("{n}=1")).collect();
        query.push("atBlockX=SECRETVALUE".to_owned());
        let uri = format!("{path}?{}", query.join("&"));
        let a = env.send(m.clone(), &uri, &headers, None).await;
        assert_problem(&a, 400, "UNKNOWN_QUERY_PARAMETER", &label);
        let detail = a.body["detail"].as_str().unwrap();
        assert!(detail.contains("`atBlockX`"), "{label}: {detail}");
        let op = &document["paths"][route.path][route.method];
        assert!(
            op["responses"]["400"]["description"]
                .as_str()
                .is_some_and(|d| d.contains("UNKNOWN_QUERY_PARAMETER")),
            "{label}: the 400 answer does not name UNKNOWN_QUERY_PARAMETER"
        );
        // A name that is not plain text is not echoed either.
        let odd = format!("{path}?%3Cscript%3ESECRETVALUE=1");
        let a = env.send(m.clone(), &odd, &headers, None).await;
        assert_problem(&a, 400, "UNKNOWN_QUERY_PARAMETER", &label);
        assert!(
            !String::from_utf8_lossy(&a.raw).contains("script"),
            "{label}"
        );
        // Each declared parameter alone is never refused as unknown.
        for name in declared {
            let a = env
                .send_unchecked(m.clone(), &format!("{path}?{name}=1"), &headers, None)
                .await;
            assert_ne!(a.code(), "UNKNOWN_QUERY_PARAMETER", "{label}: {name}");
        }
    }
    assert_eq!(env.counts().await, before, "a refused request wrote");
    // The balance route reads `atBlock` now (it is declared).
    assert!(
        keel_api::scope::query_parameters(&Method::GET, "/v1/assets/{id}/balances/{address}")
            .unwrap()
            .iter()
            .any(|n| n == "atBlock")
    );
}

/// Routes whose body is not a JSON object of a schema: a JSON-RPC request (answered
/// with JSON-RPC errors, ERC-7769) and a provider webhook verified over its raw bytes.
/// They read the body through the same limit (`RawBody`), so they answer `413` alike.
const RAW_BODY_ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/chains/{chain}/bundler"),
    ("post", "/v1/custody/webhooks/fireblocks"),
];

/// The request body schema of an operation, `$ref` resolved.
fn body_schema<'a>(document: &'a Value, op: &'a Value) -> Option<&'a Value> {
    let schema = op.pointer("/requestBody/content/application~1json/schema")?;
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => document.pointer(&r.replacen('#', "", 1)),
        None => Some(schema),
    }
}

/// Every route with a request body in the document: a JSON-object body goes through
/// the one streaming parser — a member given twice answers `400 INVALID_FIELD` naming
/// it (`UNKNOWN_FIELD` where the schema has no members), whatever the values — and an
/// oversized body answers `413 PAYLOAD_TOO_LARGE` as `application/problem+json`, which
/// the document declares for that operation (`Env::send`). (Before: the webhook
/// endpoint routes took the last duplicate and answered a text/plain `413`.)
#[tokio::test]
async fn every_route_with_a_body_uses_the_one_body_parser() {
    let env = Env::new().await;
    let key = all_scopes(&env).await;
    let auth = format!("Bearer {key}");
    let before = env.counts().await;
    let document: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let mut json_routes = 0;
    let mut body_routes = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (m, op) in item.as_object().unwrap() {
            if op.get("requestBody").is_none() {
                continue;
            }
            body_routes += 1;
            let label = format!("{m} {path}");
            let uri = concrete(path);
            let headers = [
                ("authorization", auth.as_str()),
                ("idempotency-key", "contract-body"),
            ];
            // Oversized: one byte over the default limit.
            let big = format!(
                "{{\"a\":\"{}\"}}",
                "x".repeat(keel_api::DEFAULT_MAX_BODY_BYTES)
            );
            let a = env
                .send(
                    method(m),
                    &uri,
                    &headers,
                    Some(("application/json", big.into_bytes())),
                )
                .await;
            assert_problem(&a, 413, "PAYLOAD_TOO_LARGE", &label);
            if RAW_BODY_ROUTES.contains(&(m.as_str(), path.as_str())) {
                continue;
            }
            json_routes += 1;
            let schema = body_schema(&document, op)
                .unwrap_or_else(|| panic!("{label}: no application/json body schema"));
            let first = schema["properties"]
                .as_object()
                .and_then(|p| p.keys().next().cloned());
            let (name, code) = match &first {
                Some(n) => (n.as_str(), "INVALID_FIELD"),
                None => ("a", "UNKNOWN_FIELD"),
            };
            for (one, two) in [("1", "\"x\""), ("\"x\"", "1"), ("null", "null")] {
                let body = format!("{{\"{name}\":{one},\"{name}\":{two}}}");
                let a = env
                    .send(
                        method(m),
                        &uri,
                        &headers,
                        Some(("application/json", body.into_bytes())),
                    )
                    .await;
                assert_problem(&a, 400, code, &label);
                if first.is_some() {
                    let detail = a.body["detail"].as_str().unwrap();
                    assert!(
                        detail.contains(&format!("`{name}`: appears more than once")),
                        "{label}: {detail}"
                    );
                }
            }
        }
    }
    assert!(body_routes >= 20, "only {body_routes} routes with a body");
    assert_eq!(body_routes - json_routes, RAW_BODY_ROUTES.len());
    assert_eq!(env.counts().await, before, "a refused request wrote");
    // Every documented operation declares 405 (the path exists, not the method).
    for (path, item) in document["paths"].as_object().unwrap() {
        for (m, op) in item.as_object().unwrap() {
            assert!(op["responses"].get("405").is_some(), "{m} {path}: no 405");
        }
    }
    let _ = doc();
}

/// Every route whose body takes an amount or a price (found in the document: a body
/// member `amount` or `initialPrice`) refuses more fractional digits than the asset's
/// decimals (the template's price decimals for a price) with `422
/// AMOUNT_PRECISION_LOSS`, trailing zeros included, as the document and
/// docs/error-codes.md say; exactly the decimals pass the amount checks. (Before:
/// `"1.0000000"` on a 6-decimals token was accepted.)
#[tokio::test]
async fn every_amount_route_refuses_digits_beyond_the_decimals() {
    let env = Env::new().await;
    // A 6-decimals asset (`asset_body`), still being created: an amount that passes
    // every request check answers `409 ASSET_NOT_READY`.
    let (asset, _) = env.create_asset(&env.key_a, "amounts-setup").await;
    let document: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let mut routes = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (m, op) in item.as_object().unwrap() {
            let Some(schema) = body_schema(&document, op) else {
                continue;
            };
            for member in ["amount", "initialPrice"] {
                if schema["properties"].get(member).is_some() {
                    routes.push((m.clone(), path.clone(), member));
                }
            }
        }
    }
    routes.sort();
    let names: Vec<String> = routes.iter().map(|(_, p, _)| p.clone()).collect();
    assert_eq!(
        names,
        [
            "/v1/assets",
            "/v1/assets/{id}/burn",
            "/v1/assets/{id}/forced-transfer",
            "/v1/assets/{id}/freeze",
            "/v1/assets/{id}/mint",
            "/v1/assets/{id}/transfer",
            "/v1/assets/{id}/unfreeze"
        ],
        "the amount routes changed: extend this test's bodies"
    );
    for (i, (m, path, member)) in routes.iter().enumerate() {
        assert_eq!(m, "post");
        let uri = path.replace("{id}", &asset.to_string());
        // The decimals of the value's unit: the asset's 6, the template's 8 price decimals.
        let decimals = if *member == "initialPrice" { 8 } else { 6 };
        let body = |v: &str| amount_body(member, path, v);
        for (j, refused) in [
            format!("1.{}", "0".repeat(decimals + 1)),
            format!("1.{}1", "0".repeat(decimals)),
            format!("12.5{}", "0".repeat(decimals)),
        ]
        .iter()
        .enumerate()
        {
            let a = env
                .post(&env.key_a, &uri, Some(&format!("p{i}-{j}")), &body(refused))
                .await;
            assert_problem(
                &a,
                422,
                "AMOUNT_PRECISION_LOSS",
                &format!("{path} {refused}"),
            );
        }
        let exact = format!("1.{}", "0".repeat(decimals));
        let a = env
            .post(&env.key_a, &uri, Some(&format!("ok{i}")), &body(&exact))
            .await;
        let want = if *member == "initialPrice" { 202 } else { 409 };
        assert_eq!(a.status.as_u16(), want, "{path} {exact}: {:?}", a.body);
    }
}

/// Every operation that declares a required header refuses a request without it with
/// one of the answers a missing header calls for (400, 401, 403, 406, 415 or 422, as
/// schemathesis's ST203 check), never a 404 — also where the route's service is not
/// configured. (Before: the custody webhook route answered 404 to an unsigned delivery
/// when no custody provider was configured.)
#[tokio::test]
async fn a_missing_required_header_is_refused_on_every_route() {
    let env = Env::new().await;
    let key = all_scopes(&env).await;
    let auth = format!("Bearer {key}");
    let document: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let mut checked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (m, op) in item.as_object().unwrap() {
            let required: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "header" && p["required"] == true)
                .filter_map(|p| p["name"].as_str())
                .collect();
            for header in required {
                let label = format!("{m} {path} without {header}");
                let mut headers = vec![("authorization", auth.as_str())];
                if !header.eq_ignore_ascii_case("idempotency-key") {
                    headers.push(("idempotency-key", "contract-header"));
                }
                let a = env
                    .send(
                        method(m),
                        &concrete(path),
                        &headers,
                        Some(("application/json", b"{}".to_vec())),
                    )
                    .await;
                assert!(
                    [400, 401, 403, 406, 415, 422].contains(&a.status.as_u16()),
                    "{label}: {} {:?}",
                    a.status,
                    a.body
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 9, "only {checked} required headers");
    // The custody route without a provider: unsigned → 401, signed → 404 (declared).
    let uri = "/v1/custody/webhooks/fireblocks";
    let json = Some(("application/json", b"{}".to_vec()));
    let a = env.send(Method::POST, uri, &[], json.clone()).await;
    assert_problem(&a, 401, "CUSTODY_WEBHOOK_UNVERIFIED", "unsigned");
    let signed = [("fireblocks-webhook-signature", "e30..c2ln")];
    let a = env.send(Method::POST, uri, &signed, json).await;
    assert_problem(&a, 404, "NOT_FOUND", "signed, not configured");
}

/// A body of `path` with `value` as its `member` (`amount` or `initialPrice`).
fn amount_body(member: &str, path: &str, value: &str) -> Value {
    if member == "initialPrice" {
        let mut b = crate::common::asset_body("Alpha");
        b["initialPrice"] = Value::from(value);
        return b;
    }
    if path.ends_with("/burn") {
        serde_json::json!({"amount": value})
    } else if path.ends_with("/freeze") || path.ends_with("/unfreeze") {
        serde_json::json!({"account": crate::common::RECIPIENT, "amount": value})
    } else if path.ends_with("/forced-transfer") {
        serde_json::json!({"from": crate::common::RECIPIENT,
            "recipient": "0x00000000000000000000000000000000000000b2", "amount": value})
    } else {
        serde_json::json!({"recipient": crate::common::RECIPIENT, "amount": value})
    }
}
