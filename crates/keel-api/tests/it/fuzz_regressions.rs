//! Regressions found by `scripts/fuzz-api` (schemathesis against the served document): a
//! request the document calls valid is never refused for its shape, and a request refused
//! for its shape is one the document calls invalid.

use crate::common::{Env, assert_problem, asset_body};
use serde_json::{Value, json};

/// The served document's `CreateAssetRequest` schema, compiled (Draft 2020-12).
fn create_asset_schema() -> jsonschema::Validator {
    let doc: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let schema = doc["components"]["schemas"]["CreateAssetRequest"].clone();
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .unwrap()
}

/// schemathesis found `{"symbol": ""}` schema-valid yet refused (422 INVALID_FIELD): the
/// document declared no constraint on `name` and `symbol`. Now it declares the server's:
/// every name or symbol the server refuses is one the schema refuses, and the accepted
/// edge values are schema-valid.
#[tokio::test]
async fn create_asset_name_and_symbol_constraints_agree_with_the_document() {
    let env = Env::new().await;
    let schema = create_asset_schema();
    let refused: Vec<(&str, Value)> = vec![
        ("symbol", json!("")),
        ("symbol", json!("A".repeat(17))),
        ("symbol", json!("A-B")),
        ("symbol", json!("ÄB")),
        ("name", json!("")),
        ("name", json!("n".repeat(65))),
        ("name", json!("bell\u{7}")),
        ("name", json!("c1\u{85}")),
    ];
    for (i, (field, value)) in refused.into_iter().enumerate() {
        let mut body = asset_body("Alpha");
        body[field] = value.clone();
        assert!(
            !schema.is_valid(&body),
            "the document accepts {field} = {value:?}"
        );
        let a = env
            .post(&env.key_a, "/v1/assets", Some(&format!("fz-{i}")), &body)
            .await;
        assert_problem(&a, 422, "INVALID_FIELD", &format!("{field} = {value:?}"));
    }
    let accepted: Vec<(&str, Value)> = vec![
        ("symbol", json!("A".repeat(16))),
        ("symbol", json!("a1")),
        ("name", json!("n".repeat(64))),
        ("name", json!("Fonds Ünion — Class A")),
    ];
    for (i, (field, value)) in accepted.into_iter().enumerate() {
        let mut body = asset_body("Alpha");
        body[field] = value.clone();
        assert!(
            schema.is_valid(&body),
            "the document refuses {field} = {value:?}"
        );
        let a = env
            .post(&env.key_a, "/v1/assets", Some(&format!("ok-{i}")), &body)
            .await;
        assert_eq!(a.status.as_u16(), 202, "{field} = {value:?}: {:?}", a.body);
    }
}
