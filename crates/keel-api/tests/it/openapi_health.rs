//! The committed OpenAPI document, liveness and readiness.

use crate::common::Env;
use axum::http::{Method, StatusCode};
use serde_json::json;
use std::sync::atomic::Ordering;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");

#[tokio::test]
async fn served_openapi_equals_the_committed_document() {
    let env = Env::new().await;
    let a = env.send(Method::GET, "/openapi.json", &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.body["openapi"], json!("3.1.0"));
    let served = String::from_utf8(a.raw).unwrap();
    assert_eq!(served, keel_api::openapi_json());
    if std::env::var_os("KEEL_UPDATE_OPENAPI").is_some() {
        std::fs::write(DOC, &served).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(DOC).unwrap_or_default();
    assert!(
        committed == served,
        "docs/openapi.json differs from the document the API serves; regenerate it with \
         `KEEL_UPDATE_OPENAPI=1 cargo nextest run -p keel-api served_openapi` (or `cargo test \
         -p keel-api --test it served_openapi`) and commit the result"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let env = Env::new().await;
    let h = env.send(Method::GET, "/healthz", &[], None).await;
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.body, json!({"status": "ok"}));
    let r = env.send(Method::GET, "/readyz", &[], None).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body, json!({"status": "ready"}));

    env.ready.store(false, Ordering::Release);
    let r = env.send(Method::GET, "/readyz", &[], None).await;
    crate::common::assert_problem(&r, 503, "NOT_READY", "flag down");
    assert_eq!(r.body["retryable"], json!(true));
    let h = env.send(Method::GET, "/healthz", &[], None).await;
    assert_eq!(h.status, StatusCode::OK);

    // A pending migration makes it unready too.
    env.ready.store(true, Ordering::Release);
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(env.db.pool())
    .await
    .unwrap();
    let r = env.send(Method::GET, "/readyz", &[], None).await;
    crate::common::assert_problem(&r, 503, "NOT_READY", "migration missing");
}

/// The response check refuses what the document does not declare: an unknown path, a
/// method or status a path lacks, an undeclared media type, a member the schema closes
/// out, a wrong type; and it accepts an `OperationAccepted` body (the `Operation`
/// members plus `created` and `statusUrl`).
#[test]
fn the_response_check_refuses_what_the_document_does_not_declare() {
    let doc = crate::common::doc();
    let id = "6f1c2a52-5b5e-4d43-9d1e-0c2f5d1e3a10";
    let accepted = json!({
        "id": id, "kind": "asset.create", "assetId": id, "state": "running",
        "queuedBehind": null, "wait": null, "cancelRequestedAt": null,
        "milestones": {"accepted": "2026-01-01T00:00:00Z", "submitted": [],
                       "confirmed": [], "indexed": null},
        "progress": null, "result": null, "error": null,
        "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z",
        "completedAt": null,
        "created": true, "statusUrl": format!("/v1/operations/{id}"),
    });
    let body = |v: &serde_json::Value| serde_json::to_vec(v).unwrap();
    let json_ct = Some("application/json");
    doc.check("POST", "/v1/assets", 202, json_ct, &body(&accepted))
        .unwrap();
    doc.check(
        "POST",
        &format!("/v1/assets/{id}/mint"),
        200,
        json_ct,
        &body(&accepted),
    )
    .unwrap();
    let mut extra = accepted.clone();
    extra["surprise"] = json!(1);
    let mut wrong = accepted.clone();
    wrong["created"] = json!("yes");
    let mut missing = accepted.clone();
    missing.as_object_mut().unwrap().remove("statusUrl");
    let refused = [
        ("POST", "/v1/assets".to_owned(), 202, json_ct, body(&extra)),
        ("POST", "/v1/assets".to_owned(), 202, json_ct, body(&wrong)),
        (
            "POST",
            "/v1/assets".to_owned(),
            202,
            json_ct,
            body(&missing),
        ),
        (
            "POST",
            "/v1/assets".to_owned(),
            202,
            Some("text/plain"),
            body(&accepted),
        ),
        (
            "POST",
            "/v1/assets".to_owned(),
            418,
            json_ct,
            body(&accepted),
        ),
        (
            "PUT",
            "/v1/assets".to_owned(),
            202,
            json_ct,
            body(&accepted),
        ),
        ("GET", "/v1/nope".to_owned(), 200, json_ct, body(&accepted)),
        (
            "GET",
            format!("/v1/operations/{id}"),
            200,
            json_ct,
            body(&accepted),
        ),
        (
            "GET",
            format!("/v1/operations/{id}"),
            200,
            json_ct,
            b"not json".to_vec(),
        ),
    ];
    for (method, uri, status, ct, b) in refused {
        assert!(
            doc.check(method, &uri, status, ct, &b).is_err(),
            "{method} {uri} {status} {ct:?} passed"
        );
    }
}

const ERROR_CODES_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/error-codes.md");

/// `docs/error-codes.md` is the table of `keel_api::codes::ERROR_CODES`; the served
/// document carries the same table (`Problem.x-error-codes`) and its codes as the
/// `enum` of `Problem.code`.
#[test]
fn error_codes_doc_is_current() {
    let generated = keel_api::codes::error_codes_markdown();
    let doc: serde_json::Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let problem = &doc["components"]["schemas"]["Problem"];
    let table = problem["x-error-codes"].as_array().unwrap();
    assert_eq!(table.len(), keel_api::codes::ERROR_CODES.len());
    for (row, e) in table.iter().zip(keel_api::codes::ERROR_CODES) {
        assert_eq!(
            row,
            &json!({"code": e.code, "status": e.status, "meaning": e.meaning})
        );
        assert!(
            generated.contains(&format!("| `{}` | {} |", e.code, e.status)),
            "{e:?}"
        );
    }
    assert_eq!(
        problem["properties"]["code"]["enum"],
        json!(keel_api::codes::codes())
    );
    if std::env::var_os("KEEL_UPDATE_ERROR_CODES").is_some() {
        std::fs::write(ERROR_CODES_DOC, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(ERROR_CODES_DOC).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/error-codes.md differs from keel_api::codes::ERROR_CODES; regenerate it with \
         `KEEL_UPDATE_ERROR_CODES=1 cargo nextest run -p keel-api error_codes` and commit \
         the result"
    );
}

/// The document declares the constraints the server enforces: `maximum` 2^63-1 on every
/// `int64` query parameter, 1 to 255 characters on `Idempotency-Key`, the address
/// pattern on a path address; and an integral JSON number (`25.0`, an `integer` to JSON
/// Schema) is accepted for `decimals`.
#[tokio::test]
async fn declared_constraints_and_the_server_agree() {
    let doc: serde_json::Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let mut seen = (0, 0, 0);
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for p in op["parameters"].as_array().into_iter().flatten() {
                let schema = &p["schema"];
                if p["in"] == "query" && schema["format"] == "int64" {
                    assert_eq!(schema["maximum"], json!(i64::MAX), "{p}");
                    seen.0 += 1;
                }
                if p["in"] == "header" && p["name"] == "Idempotency-Key" {
                    assert_eq!(schema["minLength"], json!(1), "{p}");
                    assert_eq!(schema["maxLength"], json!(255), "{p}");
                    seen.1 += 1;
                }
                if p["in"] == "path" && p["name"] == "address" {
                    assert_eq!(schema["pattern"], json!("^0x[0-9a-fA-F]{40}$"), "{p}");
                    seen.2 += 1;
                }
            }
        }
    }
    assert!(seen.0 >= 5 && seen.1 >= 5 && seen.2 >= 1, "{seen:?}");

    let env = Env::new().await;
    let mut body = crate::common::asset_body("Alpha");
    body["decimals"] = json!(25.0);
    let a = env
        .post(&env.key_a, "/v1/assets", Some("k-25"), &body)
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    let asset = a.body["assetId"].as_str().unwrap();
    let got = env.get(&env.key_a, &format!("/v1/assets/{asset}")).await;
    assert_eq!(got.status, StatusCode::OK, "{:?}", got.body);
    assert_eq!(got.body["decimals"], json!(25), "{:?}", got.body);
}
