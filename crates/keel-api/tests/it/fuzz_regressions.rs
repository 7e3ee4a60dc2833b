//! Regressions found by `scripts/fuzz-api` (schemathesis against the served document): a
//! request the document calls valid is never refused for its shape, and a request refused
//! for its shape is one the document calls invalid.

use crate::common::{Env, assert_problem, asset_body};
use axum::http::Method;
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

/// The served document's component schema `name`, compiled (Draft 2020-12).
fn component(name: &str) -> jsonschema::Validator {
    let doc: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let schema = doc["components"]["schemas"][name].clone();
    assert!(schema.is_object(), "no schema {name}");
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .unwrap()
}

/// A decimal string of `n` digits `d`.
fn digits(d: char, n: usize) -> String {
    std::iter::repeat_n(d, n).collect()
}

/// schemathesis found `amount: "0"` schema-valid yet refused (422) on mint, transfer and
/// burn, and the zero address likewise: the document now declares a non-zero amount of at
/// most 78 digits before and after the point, and a non-zero address. Every refused value
/// is schema-invalid and answers 422; every schema-valid edge value passes the request
/// checks (the asset is still being created, so the answer is `409 ASSET_NOT_READY`).
#[tokio::test]
async fn token_amount_and_address_constraints_agree_with_the_document() {
    let env = Env::new().await;
    let (asset, _) = env.create_asset(&env.key_a, "fz-asset").await;
    let holder = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";
    let zero = "0x0000000000000000000000000000000000000000";
    let mint = component("TokenAmountRequest");
    let burn = component("BurnRequest");
    let role = component("RoleRequest");
    let refused_amounts = [
        "0".to_owned(),
        "000".to_owned(),
        "0.0".to_owned(),
        "00.000".to_owned(),
        digits('1', 79),
        format!("1.{}", digits('0', 79)),
        "-1".to_owned(),
        ".5".to_owned(),
        "5.".to_owned(),
        "1e3".to_owned(),
    ];
    let mut n = 0;
    let mut post = |path: &'static str, body: Value| {
        n += 1;
        let idem = format!("fz-{n}");
        let uri = format!("/v1/assets/{asset}/{path}");
        let env = &env;
        async move { env.post(&env.key_a, &uri, Some(&idem), &body).await }
    };
    for amount in &refused_amounts {
        for (path, schema, body) in [
            (
                "mint",
                &mint,
                json!({"recipient": holder, "amount": amount}),
            ),
            (
                "transfer",
                &mint,
                json!({"recipient": holder, "amount": amount}),
            ),
            ("burn", &burn, json!({"amount": amount})),
        ] {
            assert!(
                !schema.is_valid(&body),
                "the document accepts {path} {amount:?}"
            );
            let a = post(path, body).await;
            assert_eq!(a.status.as_u16(), 422, "{path} {amount:?}: {:?}", a.body);
        }
    }
    for amount in ["1", "0.000001", "007", "12.5", "1.000000"] {
        for (path, schema, body) in [
            (
                "mint",
                &mint,
                json!({"recipient": holder, "amount": amount}),
            ),
            (
                "transfer",
                &mint,
                json!({"recipient": holder, "amount": amount}),
            ),
            ("burn", &burn, json!({"amount": amount, "from": holder})),
        ] {
            assert!(
                schema.is_valid(&body),
                "the document refuses {path} {amount:?}"
            );
            let a = post(path, body).await;
            assert_problem(&a, 409, "ASSET_NOT_READY", &format!("{path} {amount:?}"));
        }
    }
    for (path, schema, body) in [
        ("mint", &mint, json!({"recipient": zero, "amount": "1"})),
        ("transfer", &mint, json!({"recipient": zero, "amount": "1"})),
        ("burn", &burn, json!({"amount": "1", "from": zero})),
        (
            "grant-role",
            &role,
            json!({"role": "minter", "account": zero}),
        ),
        (
            "revoke-role",
            &role,
            json!({"role": "pauser", "account": zero}),
        ),
    ] {
        assert!(
            !schema.is_valid(&body),
            "the document accepts {path} {body}"
        );
        let a = post(path, body).await;
        assert_problem(&a, 422, "INVALID_FIELD", &format!("{path} zero address"));
    }
    let one = "0x0000000000000000000000000000000000000001";
    for (path, schema, body) in [
        ("mint", &mint, json!({"recipient": one, "amount": "1"})),
        (
            "grant-role",
            &role,
            json!({"role": "burner", "account": one}),
        ),
    ] {
        assert!(schema.is_valid(&body), "the document refuses {path} {body}");
        let a = post(path, body).await;
        assert_problem(&a, 409, "ASSET_NOT_READY", &format!("{path} {one}"));
    }
}

/// schemathesis found `initialPrice` zero, or too large for the feed, schema-valid yet
/// refused: the document declares a non-zero price of at most 78 digits per part and
/// describes the two rules that depend on the template (its price decimals; the feed's
/// answer at most 2^127-1), which answer 422 for a schema-valid price.
#[tokio::test]
async fn create_asset_initial_price_constraints_agree_with_the_document() {
    let env = Env::new().await;
    let schema = create_asset_schema();
    let refused = [
        "0".to_owned(),
        "0.00000000".to_owned(),
        digits('1', 79),
        format!("1.{}", digits('1', 79)),
        "-1".to_owned(),
    ];
    for (i, price) in refused.iter().enumerate() {
        let mut body = asset_body("Alpha");
        body["initialPrice"] = json!(price);
        assert!(!schema.is_valid(&body), "the document accepts {price:?}");
        let a = env
            .post(&env.key_a, "/v1/assets", Some(&format!("fp-{i}")), &body)
            .await;
        assert_eq!(a.status.as_u16(), 422, "{price:?}: {:?}", a.body);
    }
    // The test template has 8 price decimals: the largest price the feed holds has 30
    // integer digits (i128::MAX / 10^8 is about 1.7e30).
    for (i, price) in ["0.00000001", "007.5", &digits('9', 30)].iter().enumerate() {
        let mut body = asset_body("Alpha");
        body["initialPrice"] = json!(price);
        assert!(schema.is_valid(&body), "the document refuses {price:?}");
        let a = env
            .post(&env.key_a, "/v1/assets", Some(&format!("fq-{i}")), &body)
            .await;
        assert_eq!(a.status.as_u16(), 202, "{price:?}: {:?}", a.body);
    }
    // Schema-valid, refused by the template's rules (documented in the description).
    let doc: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let described = doc["components"]["schemas"]["CreateAssetRequest"]["properties"]
        ["initialPrice"]["description"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(described.contains("AMOUNT_PRECISION_LOSS") && described.contains("2^127-1"));
    for (i, (price, code)) in [
        ("0.000000001", "AMOUNT_PRECISION_LOSS"),
        (digits('9', 31).as_str(), "INVALID_FIELD"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body = asset_body("Alpha");
        body["initialPrice"] = json!(price);
        assert!(schema.is_valid(&body));
        let a = env
            .post(&env.key_a, "/v1/assets", Some(&format!("fr-{i}")), &body)
            .await;
        assert_problem(&a, 422, code, price);
    }
}

/// schemathesis found webhook endpoint bodies schema-valid yet refused: a URL that is not
/// an absolute https URL, `eventTypes` empty or longer than 32, `overlapSeconds` above
/// 604800, and the rotate-secret body (the server took an empty one; the document called
/// it required). The document now declares them; with the default URL policy (https
/// only) the server and the document agree on each edge.
#[tokio::test]
async fn webhook_endpoint_constraints_agree_with_the_document() {
    let env = Env::with_webhook_policy(keel_webhooks::UrlPolicy::default()).await;
    let create = component("CreateWebhookEndpointRequest");
    let update = component("UpdateWebhookEndpointRequest");
    let rotate = component("RotateSecretRequest");
    // A public IP literal: accepted without a DNS lookup.
    let url = "https://93.184.215.14/hooks/keel";
    let types = |n: usize| json!(vec!["operation.accepted"; n]);
    let call = |method: Method, uri: String, body: Option<Value>| {
        let env = &env;
        async move {
            let auth = format!("Bearer {}", env.key_a);
            let body = body.map(|b| ("application/json", serde_json::to_vec(&b).unwrap()));
            env.send(method, &uri, &[("authorization", &auth)], body)
                .await
        }
    };
    let refused = [
        json!({"url": "http://93.184.215.14/h", "eventTypes": ["*"]}),
        json!({"url": "ftp://93.184.215.14/h", "eventTypes": ["*"]}),
        json!({"url": "hooks.example/h", "eventTypes": ["*"]}),
        json!({"url": format!("https://93.184.215.14/{}", "a".repeat(2048)), "eventTypes": ["*"]}),
        json!({"url": url, "eventTypes": []}),
        json!({"url": url, "eventTypes": types(33)}),
        json!({"url": url, "eventTypes": ["*"], "description": "d".repeat(257)}),
        json!({"url": url, "eventTypes": ["*"], "description": "bell\u{7}"}),
    ];
    for body in refused {
        assert!(!create.is_valid(&body), "the document accepts {body}");
        let a = call(
            Method::POST,
            "/v1/webhook-endpoints".into(),
            Some(body.clone()),
        )
        .await;
        assert_problem(&a, 422, "INVALID_FIELD", &body.to_string());
    }
    let accepted = [
        json!({"url": url, "eventTypes": ["*"]}),
        json!({"url": "HTTPS://93.184.215.14:8443/h?x=1", "eventTypes": types(32)}),
        json!({"url": url, "eventTypes": types(1), "description": "d".repeat(256)}),
    ];
    let mut id = String::new();
    for body in accepted {
        assert!(create.is_valid(&body), "the document refuses {body}");
        let a = call(
            Method::POST,
            "/v1/webhook-endpoints".into(),
            Some(body.clone()),
        )
        .await;
        assert_eq!(a.status, 201, "{body}: {:?}", a.body);
        id = a.body["endpoint"]["id"].as_str().unwrap().to_owned();
    }
    let endpoint = format!("/v1/webhook-endpoints/{id}");
    for body in [
        json!({"eventTypes": []}),
        json!({"eventTypes": types(33)}),
        json!({"url": "http://93.184.215.14/h"}),
    ] {
        assert!(!update.is_valid(&body), "the document accepts {body}");
        let a = call(Method::PATCH, endpoint.clone(), Some(body.clone())).await;
        assert_problem(&a, 422, "INVALID_FIELD", &body.to_string());
    }
    for body in [
        json!({"eventTypes": types(32)}),
        json!({"url": url, "description": ""}),
    ] {
        assert!(update.is_valid(&body), "the document refuses {body}");
        let a = call(Method::PATCH, endpoint.clone(), Some(body.clone())).await;
        assert_eq!(a.status, 200, "{body}: {:?}", a.body);
    }
    // rotate-secret: the body is optional in the document and on the server.
    let doc: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let body_decl =
        &doc["paths"]["/v1/webhook-endpoints/{id}/rotate-secret"]["post"]["requestBody"];
    assert_eq!(body_decl["required"], json!(false), "{body_decl}");
    let rotate_uri = format!("{endpoint}/rotate-secret");
    let a = call(Method::POST, rotate_uri.clone(), None).await;
    assert_eq!(a.status, 200, "empty body: {:?}", a.body);
    for body in [
        json!({}),
        json!({"overlapSeconds": 604_800}),
        json!({"overlapSeconds": 60.0}),
        json!({"overlapSeconds": null}),
    ] {
        assert!(rotate.is_valid(&body), "the document refuses {body}");
        let a = call(Method::POST, rotate_uri.clone(), Some(body.clone())).await;
        assert_eq!(a.status, 200, "{body}: {:?}", a.body);
    }
    let body = json!({"overlapSeconds": 604_801});
    assert!(!rotate.is_valid(&body));
    let a = call(Method::POST, rotate_uri.clone(), Some(body)).await;
    assert_problem(&a, 422, "INVALID_FIELD", "overlapSeconds 604801");
}

/// schemathesis found `GET /v1/assets/{id}?minBlock=N` answering `503 INDEX_BEHIND` (a
/// 5xx for a request the server handled). It is a `409` with `Retry-After` now, as the
/// document and the error-code list say.
#[tokio::test]
async fn index_behind_is_a_documented_409() {
    let doc: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let codes = doc["components"]["schemas"]["Problem"]["x-error-codes"]
        .as_array()
        .unwrap();
    let entry = codes.iter().find(|c| c["code"] == "INDEX_BEHIND").unwrap();
    assert_eq!(entry["status"], json!(409));
    for path in ["/v1/assets/{id}", "/v1/assets/{id}/balances/{address}"] {
        let conflict = doc["paths"][path]["get"]["responses"]["409"]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(conflict.contains("INDEX_BEHIND"), "{path}: {conflict}");
    }
}

/// schemathesis found `POST /v1/user-operations` refusing schema-valid input: the
/// document declared `userOperation` as a bare object, so `{}` was valid yet refused
/// (422). The document now declares the ERC-7769 shape (`UserOperationJson`): a real
/// user operation, and keel-aa's own serialization of it, are schema-valid; an empty
/// or partial one and a decimal quantity are schema-invalid, and the server's
/// deserializer (whose refusal the route answers `422 INVALID_FIELD`) refuses them too.
#[test]
fn user_operation_shape_agrees_with_the_document() {
    let doc: Value = serde_json::from_str(&keel_api::openapi_json()).unwrap();
    let op_schema = &doc["components"]["schemas"]["UserOperationJson"];
    assert!(
        op_schema["required"].as_array().unwrap().len() >= 8,
        "{op_schema}"
    );
    let op = json!({
        "sender": "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
        "nonce": "0x0",
        "callData": "0x",
        "callGasLimit": "0x186a0",
        "verificationGasLimit": "0x186a0",
        "preVerificationGas": "0xc350",
        "maxFeePerGas": "0x3b9aca00",
        "maxPriorityFeePerGas": "0x3b9aca00",
        "signature": "0x00"
    });
    let parsed: keel_aa::UserOperation = serde_json::from_value(op.clone()).unwrap();
    let round = serde_json::to_value(&parsed).unwrap();
    let body = |op: Value| {
        json!({
            "chainId": 31337,
            "entryPoint": "0x4337084d9e255ff0702461cf8895ce9e3b5ff108",
            "userOperation": op
        })
    };
    let schema = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&json!({
            "$ref": "#/components/schemas/SubmitUserOperationRequest",
            "components": doc["components"].clone()
        }))
        .unwrap();
    assert!(schema.is_valid(&body(op.clone())), "a real user operation");
    assert!(schema.is_valid(&body(round)), "keel-aa's own serialization");
    let mut decimal = op.clone();
    decimal["nonce"] = json!("12");
    for bad in [json!({}), json!({"sender": op["sender"]}), decimal] {
        assert!(!schema.is_valid(&body(bad.clone())), "schema-valid: {bad}");
        assert!(
            serde_json::from_value::<keel_aa::UserOperation>(bad.clone()).is_err(),
            "the server reads {bad}"
        );
    }
}
