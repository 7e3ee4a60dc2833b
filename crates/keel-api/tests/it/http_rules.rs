//! Bad input, idempotency, tenant isolation and approval rules.

use crate::common::{Env, RECIPIENT, TEMPLATE, assert_problem, asset_body};
use axum::http::{Method, StatusCode};
use keel_api::ApiConfig;
use serde_json::{Value, json};
use uuid::Uuid;

/// One bad request and what it must answer.
struct Case {
    label: &'static str,
    method: Method,
    uri: String,
    auth: Option<String>,
    idem: Option<String>,
    content_type: &'static str,
    body: Option<Vec<u8>>,
    status: u16,
    code: &'static str,
    /// False for requests the OpenAPI document deliberately does not describe (an
    /// unknown route, a method a path does not have): their answer is checked against
    /// the `Problem` schema only.
    documented: bool,
}

fn case(label: &'static str, uri: &str, body: Value, status: u16, code: &'static str) -> Case {
    Case {
        label,
        method: Method::POST,
        uri: uri.to_owned(),
        auth: None,
        idem: Some(format!("idem-{label}")),
        content_type: "application/json",
        body: Some(serde_json::to_vec(&body).unwrap()),
        status,
        code,
        documented: true,
    }
}

fn raw(
    label: &'static str,
    uri: &str,
    ct: &'static str,
    body: &[u8],
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        content_type: ct,
        body: Some(body.to_vec()),
        ..case(label, uri, Value::Null, status, code)
    }
}

fn get(label: &'static str, uri: &str, status: u16, code: &'static str) -> Case {
    Case {
        method: Method::GET,
        idem: None,
        body: None,
        ..case(label, uri, Value::Null, status, code)
    }
}

fn with_asset(over: Value) -> Value {
    let mut b = asset_body("SECRETVALUE");
    for (k, v) in over.as_object().unwrap() {
        if v.is_null() {
            b.as_object_mut().unwrap().remove(k);
        } else {
            b[k] = v.clone();
        }
    }
    b
}

#[tokio::test]
async fn every_bad_input_class_answers_its_code_and_writes_nothing() {
    let env = Env::new().await;
    let (asset, op) = env.create_asset(&env.key_a, "setup").await;
    let before = env.counts().await;
    let mint = format!("/v1/assets/{asset}/mint");
    let transfer = format!("/v1/assets/{asset}/transfer");
    let pause = format!("/v1/assets/{asset}/pause");
    let deep = "[".repeat(65) + &"]".repeat(65);
    let very_deep = "[".repeat(100_000);
    let big = format!(
        "{{\"name\":\"{}\",\"symbol\":\"A\",\"decimals\":1,\"templateId\":\"t\",\"initialPrice\":\"1\"}}",
        "SECRETVALUE".repeat(30_000)
    );
    let mut cases = vec![
        // auth
        Case {
            auth: Some(String::new()),
            ..case(
                "no auth",
                "/v1/assets",
                asset_body("a"),
                401,
                "UNAUTHENTICATED",
            )
        },
        Case {
            auth: Some("Bearer keel_sk_SECRETVALUE".into()),
            ..case(
                "bad token",
                "/v1/assets",
                asset_body("a"),
                401,
                "UNAUTHENTICATED",
            )
        },
        Case {
            auth: Some(format!("Bearer keel_sk_{}", "0".repeat(64))),
            ..case(
                "unknown token",
                "/v1/assets",
                asset_body("a"),
                401,
                "UNAUTHENTICATED",
            )
        },
        Case {
            auth: Some(format!("Basic {}", env.key_a)),
            ..case(
                "basic scheme",
                "/v1/assets",
                asset_body("a"),
                401,
                "UNAUTHENTICATED",
            )
        },
        // idempotency key
        Case {
            idem: None,
            ..case(
                "no idempotency key",
                "/v1/assets",
                asset_body("a"),
                400,
                "IDEMPOTENCY_KEY_REQUIRED",
            )
        },
        Case {
            idem: Some(String::new()),
            ..case(
                "empty idempotency key",
                "/v1/assets",
                asset_body("a"),
                422,
                "INVALID_FIELD",
            )
        },
        Case {
            idem: Some("k".repeat(256)),
            ..case(
                "long idempotency key",
                "/v1/assets",
                asset_body("a"),
                422,
                "INVALID_FIELD",
            )
        },
        Case {
            idem: None,
            ..case(
                "mint without key",
                &mint,
                json!({"recipient": RECIPIENT, "amount": "1"}),
                400,
                "IDEMPOTENCY_KEY_REQUIRED",
            )
        },
        // body
        raw(
            "too large",
            "/v1/assets",
            "application/json",
            big.as_bytes(),
            413,
            "PAYLOAD_TOO_LARGE",
        ),
        raw(
            "too deep",
            "/v1/assets",
            "application/json",
            deep.as_bytes(),
            400,
            "JSON_TOO_DEEP",
        ),
        raw(
            "very deep",
            "/v1/assets",
            "application/json",
            very_deep.as_bytes(),
            400,
            "JSON_TOO_DEEP",
        ),
        raw(
            "malformed",
            "/v1/assets",
            "application/json",
            b"{\"name\": \"SECRETVALUE",
            400,
            "MALFORMED_JSON",
        ),
        raw(
            "trailing garbage",
            "/v1/assets",
            "application/json",
            b"{} SECRETVALUE",
            400,
            "MALFORMED_JSON",
        ),
        raw(
            "not utf-8",
            "/v1/assets",
            "application/json",
            b"{\"name\":\"\xff\xfe\"}",
            400,
            "MALFORMED_JSON",
        ),
        raw(
            "empty body",
            "/v1/assets",
            "application/json",
            b"",
            400,
            "MALFORMED_JSON",
        ),
        raw(
            "array body",
            "/v1/assets",
            "application/json",
            b"[\"SECRETVALUE\"]",
            400,
            "INVALID_FIELD",
        ),
        raw(
            "text/plain",
            "/v1/assets",
            "text/plain",
            br#"{"name":"x"}"#,
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        raw(
            "no content type",
            "/v1/assets",
            "",
            br#"{"name":"x"}"#,
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        case(
            "unknown field",
            "/v1/assets",
            with_asset(json!({"SECRETVALUE": "SECRETVALUE"})),
            400,
            "UNKNOWN_FIELD",
        ),
        case(
            "missing field",
            "/v1/assets",
            with_asset(json!({"symbol": null})),
            400,
            "INVALID_FIELD",
        ),
        case(
            "wrong type",
            "/v1/assets",
            with_asset(json!({"decimals": "6"})),
            400,
            "INVALID_FIELD",
        ),
        case(
            "null field",
            "/v1/assets",
            with_asset(json!({"templateId": []})),
            400,
            "INVALID_FIELD",
        ),
        case(
            "negative decimals",
            "/v1/assets",
            with_asset(json!({"decimals": -1})),
            400,
            "INVALID_FIELD",
        ),
        case(
            "fractional decimals",
            "/v1/assets",
            with_asset(json!({"decimals": 1.5})),
            400,
            "INVALID_FIELD",
        ),
        case(
            "price as number",
            "/v1/assets",
            with_asset(json!({"initialPrice": 1.25})),
            400,
            "INVALID_FIELD",
        ),
        // rules of the operations service
        case(
            "decimals 37",
            "/v1/assets",
            with_asset(json!({"decimals": 37})),
            422,
            "DECIMALS_OUT_OF_RANGE",
        ),
        // An integral JSON number is the integer it denotes (JSON Schema's reading).
        case(
            "decimals 37.0",
            "/v1/assets",
            with_asset(json!({"decimals": 37.0})),
            422,
            "DECIMALS_OUT_OF_RANGE",
        ),
        case(
            "decimals 300",
            "/v1/assets",
            with_asset(json!({"decimals": 300})),
            422,
            "DECIMALS_OUT_OF_RANGE",
        ),
        case(
            "malformed price",
            "/v1/assets",
            with_asset(json!({"initialPrice": "1.2.SECRETVALUE"})),
            422,
            "AMOUNT_MALFORMED",
        ),
        case(
            "negative price",
            "/v1/assets",
            with_asset(json!({"initialPrice": "-1"})),
            422,
            "AMOUNT_NEGATIVE",
        ),
        case(
            "over-precise price",
            "/v1/assets",
            with_asset(json!({"initialPrice": "1.123456789"})),
            422,
            "AMOUNT_PRECISION_LOSS",
        ),
        case(
            "zero price",
            "/v1/assets",
            with_asset(json!({"initialPrice": "0"})),
            422,
            "INVALID_FIELD",
        ),
        case(
            "bad symbol",
            "/v1/assets",
            with_asset(json!({"symbol": "SECRET-VALUE"})),
            422,
            "INVALID_FIELD",
        ),
        case(
            "empty name",
            "/v1/assets",
            with_asset(json!({"name": ""})),
            422,
            "INVALID_FIELD",
        ),
        case(
            "NUL in template id",
            "/v1/assets",
            with_asset(json!({"templateId": "a\u{0}b"})),
            404,
            "NOT_FOUND",
        ),
        case(
            "template id pattern",
            "/v1/assets",
            with_asset(json!({"templateId": "SECRETVALUE"})),
            404,
            "NOT_FOUND",
        ),
        case(
            "NUL in name",
            "/v1/assets",
            with_asset(json!({"name": "a\u{0}b"})),
            422,
            "INVALID_FIELD",
        ),
        get(
            "huge minBlock",
            &format!("/v1/assets/{asset}?minBlock=18446744073709551615"),
            400,
            "INVALID_QUERY",
        ),
        // The document's int64 maximum (2^63-1) is enforced on every query integer.
        get(
            "minBlock above int64",
            &format!("/v1/assets/{asset}?minBlock=9223372036854775808"),
            400,
            "INVALID_QUERY",
        ),
        get(
            "waitSeconds above int64",
            &format!("/v1/assets/{asset}?waitSeconds=9223372036854775808"),
            400,
            "INVALID_QUERY",
        ),
        get(
            "balance waitSeconds above int64",
            &format!("/v1/assets/{asset}/balances/{RECIPIENT}?waitSeconds=9223372036854775808"),
            400,
            "INVALID_QUERY",
        ),
        get(
            "chainId above int64",
            "/v1/funding-requests?chainId=9223372036854775808",
            400,
            "INVALID_QUERY",
        ),
        case(
            "unknown template",
            "/v1/assets",
            with_asset(json!({"templateId": "nope"})),
            404,
            "NOT_FOUND",
        ),
        // token operations
        case(
            "bad address",
            &mint,
            json!({"recipient": "0xSECRETVALUE", "amount": "1"}),
            422,
            "INVALID_ADDRESS",
        ),
        case(
            "bad checksum",
            &mint,
            json!({"recipient": "0x70997970c51812dc3A010C7d01b50e0d17dc79C8", "amount": "1"}),
            422,
            "INVALID_ADDRESS",
        ),
        case(
            "address without 0x",
            &transfer,
            json!({"recipient": "70997970c51812dc3a010c7d01b50e0d17dc79c8", "amount": "1"}),
            422,
            "INVALID_ADDRESS",
        ),
        case(
            "address as number",
            &mint,
            json!({"recipient": 12, "amount": "1"}),
            400,
            "INVALID_FIELD",
        ),
        case(
            "zero address",
            &mint,
            json!({"recipient": "0x0000000000000000000000000000000000000000", "amount": "1"}),
            422,
            "INVALID_FIELD",
        ),
        case(
            "amount as number",
            &mint,
            json!({"recipient": RECIPIENT, "amount": 1}),
            400,
            "INVALID_FIELD",
        ),
        case(
            "amount as float",
            &transfer,
            json!({"recipient": RECIPIENT, "amount": 0.1}),
            400,
            "INVALID_FIELD",
        ),
        case(
            "malformed amount",
            &mint,
            json!({"recipient": RECIPIENT, "amount": "1e5"}),
            422,
            "AMOUNT_MALFORMED",
        ),
        case(
            "negative amount",
            &mint,
            json!({"recipient": RECIPIENT, "amount": "-5"}),
            422,
            "AMOUNT_NEGATIVE",
        ),
        case(
            "over-precise amount",
            &mint,
            json!({"recipient": RECIPIENT, "amount": "1.0000001"}),
            422,
            "AMOUNT_PRECISION_LOSS",
        ),
        case(
            "zero amount",
            &transfer,
            json!({"recipient": RECIPIENT, "amount": "0"}),
            422,
            "INVALID_FIELD",
        ),
        case(
            "mint unknown field",
            &mint,
            json!({"recipient": RECIPIENT, "amount": "1", "to": "x"}),
            400,
            "UNKNOWN_FIELD",
        ),
        case(
            "pause with a field",
            &pause,
            json!({"reason": "SECRETVALUE"}),
            400,
            "UNKNOWN_FIELD",
        ),
        raw(
            "pause text body",
            &pause,
            "",
            b"SECRETVALUE",
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        case(
            "non-uuid asset",
            "/v1/assets/SECRETVALUE/mint",
            json!({"recipient": RECIPIENT, "amount": "1"}),
            404,
            "NOT_FOUND",
        ),
        case(
            "unknown asset",
            &format!("/v1/assets/{}/mint", Uuid::new_v4()),
            json!({"recipient": RECIPIENT, "amount": "1"}),
            404,
            "NOT_FOUND",
        ),
        case(
            "unknown asset pause",
            &format!("/v1/assets/{}/unpause", Uuid::new_v4()),
            json!({}),
            404,
            "NOT_FOUND",
        ),
        Case {
            idem: None,
            ..case(
                "approve non-uuid",
                "/v1/operations/xyz/approve",
                json!({}),
                404,
                "NOT_FOUND",
            )
        },
        Case {
            idem: None,
            ..case(
                "reject unknown",
                &format!("/v1/operations/{}/reject", Uuid::new_v4()),
                json!({}),
                404,
                "NOT_FOUND",
            )
        },
        // reads
        get(
            "non-uuid asset read",
            "/v1/assets/SECRETVALUE",
            404,
            "NOT_FOUND",
        ),
        get(
            "non-uuid operation read",
            "/v1/operations/12",
            404,
            "NOT_FOUND",
        ),
        get(
            "negative minBlock",
            &format!("/v1/assets/{asset}?minBlock=-1"),
            400,
            "INVALID_QUERY",
        ),
        get(
            "text minBlock",
            &format!("/v1/assets/{asset}?minBlock=SECRETVALUE"),
            400,
            "INVALID_QUERY",
        ),
        get(
            "bad holder",
            &format!("/v1/assets/{asset}/balances/0xSECRETVALUE"),
            422,
            "INVALID_ADDRESS",
        ),
        get(
            "bad funding chain",
            "/v1/funding-requests?chainId=x",
            400,
            "INVALID_QUERY",
        ),
        Case {
            documented: false,
            ..get("unknown route", "/v1/nope", 404, "NOT_FOUND")
        },
        Case {
            method: Method::DELETE,
            documented: false,
            ..get("wrong method", "/v1/assets", 405, "METHOD_NOT_ALLOWED")
        },
        Case {
            method: Method::PUT,
            documented: false,
            ..get(
                "wrong method on op",
                &format!("/v1/operations/{op}"),
                405,
                "METHOD_NOT_ALLOWED",
            )
        },
    ];
    for c in cases.drain(..) {
        let auth = c
            .auth
            .clone()
            .unwrap_or_else(|| format!("Bearer {}", env.key_a));
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if !auth.is_empty() {
            headers.push(("authorization", &auth));
        }
        if let Some(k) = &c.idem {
            headers.push(("idempotency-key", k));
        }
        let body = c.body.clone().map(|b| (c.content_type, b));
        let a = if c.documented {
            env.send(c.method.clone(), &c.uri, &headers, body).await
        } else {
            let a = env
                .send_unchecked(c.method.clone(), &c.uri, &headers, body)
                .await;
            if let Err(e) = crate::common::doc().check_problem(&a.raw) {
                panic!("{}: {e}", c.label);
            }
            a
        };
        assert_problem(&a, c.status, c.code, c.label);
        if c.status == 401 {
            assert_eq!(a.header("www-authenticate"), Some("Bearer"), "{}", c.label);
        }
        assert_eq!(env.counts().await, before, "{} wrote rows", c.label);
    }
}

#[tokio::test]
async fn the_body_limit_is_configurable() {
    let env = Env::with_config(ApiConfig {
        max_body_bytes: 1024,
        ..ApiConfig::default()
    })
    .await;
    let a = env
        .post(
            &env.key_a,
            "/v1/assets",
            Some("k"),
            &asset_body(&"x".repeat(2000)),
        )
        .await;
    assert_problem(&a, 413, "PAYLOAD_TOO_LARGE", "1 KiB limit");
    assert_eq!(env.counts().await, (0, 0));
    // Under the limit it passes the limit and reaches the service's rules.
    let a = env
        .post(&env.key_a, "/v1/assets", Some("k"), &asset_body("x"))
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn idempotency_same_key_same_operation_other_body_conflict() {
    let env = Env::new().await;
    let first = env
        .post(
            &env.key_a,
            "/v1/assets",
            Some("key-1"),
            &asset_body("Alpha"),
        )
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    assert_eq!(first.body["created"], json!(true));
    assert_eq!(first.body["state"], json!("running"));
    assert_eq!(first.body["kind"], json!("asset.create"));
    let id = first.body["id"].as_str().unwrap().to_owned();
    let url = format!("/v1/operations/{id}");
    assert_eq!(first.body["statusUrl"], json!(url));
    assert_eq!(first.header("location"), Some(url.as_str()));
    // The served body matches the documented shape.
    let _: keel_api::dto::OperationAccepted = serde_json::from_value(first.body.clone()).unwrap();
    let mut op_only = first.body.clone();
    op_only.as_object_mut().unwrap().remove("created");
    op_only.as_object_mut().unwrap().remove("statusUrl");
    let _: keel_api::dto::Operation = serde_json::from_value(op_only).unwrap();

    let second = env
        .post(
            &env.key_a,
            "/v1/assets",
            Some("key-1"),
            &asset_body("Alpha"),
        )
        .await;
    assert_eq!(second.status, StatusCode::ACCEPTED);
    assert_eq!(second.body["id"], json!(id));
    assert_eq!(second.body["created"], json!(false));
    assert_eq!(env.counts().await, (1, 1));

    let other = env
        .post(&env.key_a, "/v1/assets", Some("key-1"), &asset_body("Beta"))
        .await;
    assert_problem(&other, 409, "IDEMPOTENCY_CONFLICT", "other body");
    assert_eq!(env.counts().await, (1, 1));

    // The same key in another organization is another operation.
    let b = env
        .post(
            &env.key_b,
            "/v1/assets",
            Some("key-1"),
            &asset_body("Alpha"),
        )
        .await;
    assert_eq!(b.status, StatusCode::ACCEPTED);
    assert_ne!(b.body["id"], json!(id));

    // GET answers the same operation.
    let g = env.get(&env.key_a, &url).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.body["id"], json!(id));
    let _: keel_api::dto::Operation = serde_json::from_value(g.body.clone()).unwrap();

    // A replayed key whose operation ended answers 200 with it.
    let instance: Uuid = sqlx::query_scalar("SELECT instance_id FROM operation WHERE id = $1")
        .bind(Uuid::parse_str(&id).unwrap())
        .fetch_one(env.db.pool())
        .await
        .unwrap();
    env.engine.cancel(instance).await.unwrap();
    let replay = env
        .post(
            &env.key_a,
            "/v1/assets",
            Some("key-1"),
            &asset_body("Alpha"),
        )
        .await;
    assert_eq!(replay.status, StatusCode::OK, "{:?}", replay.body);
    assert_eq!(replay.body["state"], json!("cancelled"));
    assert_eq!(replay.body["created"], json!(false));
    assert_eq!(replay.header("preference-applied"), None);
    // With a wait preference, a terminal answer says it applied (capped at 60).
    let auth = format!("Bearer {}", env.key_a);
    let replay = env
        .send(
            Method::POST,
            "/v1/assets",
            &[
                ("authorization", &auth),
                ("idempotency-key", "key-1"),
                ("prefer", "wait=600"),
            ],
            Some((
                "application/json",
                serde_json::to_vec(&asset_body("Alpha")).unwrap(),
            )),
        )
        .await;
    assert_eq!(replay.status, StatusCode::OK);
    assert_eq!(replay.header("preference-applied"), Some("wait=60"));
}

#[tokio::test]
async fn prefer_wait_answers_202_when_the_operation_does_not_end() {
    let env = Env::new().await;
    let auth = format!("Bearer {}", env.key_a);
    let body = serde_json::to_vec(&asset_body("Alpha")).unwrap();
    for (key, prefer) in [
        ("w1", "wait=1"),
        ("w2", "wait=SECRETVALUE"),
        ("w3", "respond-async, wait=\"1\""),
    ] {
        let started = std::time::Instant::now();
        let a = env
            .send(
                Method::POST,
                "/v1/assets",
                &[
                    ("authorization", &auth),
                    ("idempotency-key", key),
                    ("prefer", prefer),
                ],
                Some(("application/json; charset=utf-8", body.clone())),
            )
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{prefer}: {:?}", a.body);
        assert_eq!(a.header("preference-applied"), None, "{prefer}");
        assert!(a.header("location").is_some());
        if prefer.contains('1') {
            assert!(
                started.elapsed() >= std::time::Duration::from_millis(900),
                "{prefer}"
            );
        }
    }
}

#[tokio::test]
async fn tenants_see_only_their_own_resources() {
    let env = Env::new().await;
    let (asset, op) = env.create_asset(&env.key_a, "a-1").await;
    // A sees its own.
    let a = env.get(&env.key_a, "/v1/assets").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body["data"].as_array().unwrap().len(), 1);
    assert_eq!(a.body["hasMore"], json!(false));
    let _: keel_api::dto::AssetList = serde_json::from_value(a.body.clone()).unwrap();
    let a = env.get(&env.key_a, &format!("/v1/assets/{asset}")).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.body["status"], json!("creating"));
    assert_eq!(a.body["templateId"], json!(TEMPLATE));
    let _: keel_api::dto::Asset = serde_json::from_value(a.body.clone()).unwrap();
    // B does not.
    let b = env.get(&env.key_b, "/v1/assets").await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(
        b.body,
        json!({"data": [], "hasMore": false, "nextCursor": null})
    );
    let b = env.get(&env.key_b, "/v1/operations").await;
    assert_eq!(b.body["data"], json!([]));
    for uri in [
        format!("/v1/assets/{asset}"),
        format!("/v1/operations/{op}"),
        format!("/v1/assets/{asset}/balances/{RECIPIENT}"),
    ] {
        let b = env.get(&env.key_b, &uri).await;
        assert_problem(&b, 404, "NOT_FOUND", &uri);
    }
    let before = env.counts().await;
    let m = env
        .post(
            &env.key_b,
            &format!("/v1/assets/{asset}/mint"),
            Some("b-1"),
            &json!({"recipient": RECIPIENT, "amount": "1"}),
        )
        .await;
    assert_problem(&m, 404, "NOT_FOUND", "B mints A's asset");
    let p = env
        .post(
            &env.key_b,
            &format!("/v1/assets/{asset}/pause"),
            Some("b-2"),
            &json!({}),
        )
        .await;
    assert_problem(&p, 404, "NOT_FOUND", "B pauses A's asset");
    let r = env
        .post(
            &env.key_b,
            &format!("/v1/operations/{op}/approve"),
            None,
            &json!({}),
        )
        .await;
    assert_problem(&r, 404, "NOT_FOUND", "B approves A's operation");
    assert_eq!(env.counts().await, before);
    let f = env.get(&env.key_b, "/v1/funding-requests").await;
    assert_eq!(f.status, StatusCode::OK);
    assert_eq!(
        f.body,
        json!({"fundingRequests": [], "entryPointDeposits": [], "queuedBehindFunding": []})
    );
}

#[tokio::test]
async fn approval_and_readiness_rules_without_a_chain() {
    let env = Env::new().await;
    let (asset, op) = env.create_asset(&env.key_a, "c-1").await;
    for (key, path) in [
        (&env.key_a2, "approve"),
        (&env.key_a2, "reject"),
        (&env.key_a, "approve"),
    ] {
        let a = env
            .post(
                key,
                &format!("/v1/operations/{op}/{path}"),
                None,
                &json!({}),
            )
            .await;
        assert_problem(&a, 409, "APPROVAL_NOT_PENDING", path);
    }
    // An empty body is accepted on approve (and refused the same way here).
    let auth = format!("Bearer {}", env.key_a2);
    let a = env
        .send(
            Method::POST,
            &format!("/v1/operations/{op}/approve"),
            &[("authorization", &auth)],
            None,
        )
        .await;
    assert_problem(&a, 409, "APPROVAL_NOT_PENDING", "empty approve");
    let before = env.counts().await;
    for (path, body) in [
        ("mint", json!({"recipient": RECIPIENT, "amount": "1"})),
        ("mint", json!({"recipient": RECIPIENT, "amount": "5000"})),
        ("transfer", json!({"recipient": RECIPIENT, "amount": "1.5"})),
        ("pause", json!({})),
        ("unpause", json!({})),
    ] {
        let a = env
            .post(
                &env.key_a,
                &format!("/v1/assets/{asset}/{path}"),
                Some(&format!("t-{path}-{body}")),
                &body,
            )
            .await;
        assert_problem(&a, 409, "ASSET_NOT_READY", path);
    }
    assert_eq!(env.counts().await, before);
    let b = env
        .get(
            &env.key_a,
            &format!("/v1/assets/{asset}/balances/{RECIPIENT}"),
        )
        .await;
    assert_problem(
        &b,
        409,
        "ASSET_NOT_READY",
        "balance before the token exists",
    );
    // minBlock waits (bounded) and answers a retryable 409 with Retry-After when the index
    // is behind (the request names a block the index has not reached: not a 5xx).
    let started = std::time::Instant::now();
    let b = env
        .get(
            &env.key_a,
            &format!("/v1/assets/{asset}?minBlock=5&waitSeconds=1"),
        )
        .await;
    assert_problem(&b, 409, "INDEX_BEHIND", "minBlock");
    assert_eq!(b.body["retryable"], json!(true));
    assert!(
        b.headers.contains_key("retry-after"),
        "INDEX_BEHIND carries Retry-After: {:?}",
        b.headers
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    let f = env
        .get(&env.key_a, "/v1/funding-requests?chainId=31337")
        .await;
    assert_eq!(f.status, StatusCode::OK);
    assert_eq!(
        f.body,
        json!({"fundingRequests": [], "entryPointDeposits": [], "queuedBehindFunding": []})
    );
}

/// Issue 18 §4: the bodies of burn, grant-role and revoke-role are checked before
/// anything is written (an unknown role is `422 UNKNOWN_ROLE`, the zero address as a
/// forced burn's holder or a role's account is `422 INVALID_FIELD`, bad shapes are
/// `400`), and a well-formed request on an asset whose creation has not completed is
/// `409 ASSET_NOT_READY`. Every answer is checked against the OpenAPI document.
#[tokio::test]
async fn burn_and_role_requests_are_checked_before_anything_is_written() {
    let env = Env::new().await;
    let (asset, _) = env.create_asset(&env.key_a, "c-1").await;
    let before = env.counts().await;
    let zero = "0x0000000000000000000000000000000000000000";
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "grant-role",
            "grant admin",
            json!({"role": "admin", "account": RECIPIENT}),
            422,
            "UNKNOWN_ROLE",
        ),
        (
            "revoke-role",
            "revoke Minter",
            json!({"role": "Minter", "account": RECIPIENT}),
            422,
            "UNKNOWN_ROLE",
        ),
        (
            "grant-role",
            "role missing",
            json!({"account": RECIPIENT}),
            400,
            "INVALID_FIELD",
        ),
        (
            "grant-role",
            "role a number",
            json!({"role": 1, "account": RECIPIENT}),
            400,
            "INVALID_FIELD",
        ),
        (
            "grant-role",
            "bad account",
            json!({"role": "minter", "account": "0x12"}),
            422,
            "INVALID_ADDRESS",
        ),
        (
            "revoke-role",
            "zero account",
            json!({"role": "pauser", "account": zero}),
            422,
            "INVALID_FIELD",
        ),
        (
            "grant-role",
            "extra member",
            json!({"role": "burner", "account": RECIPIENT, "x": 1}),
            400,
            "UNKNOWN_FIELD",
        ),
        ("burn", "amount missing", json!({}), 400, "INVALID_FIELD"),
        (
            "burn",
            "amount a number",
            json!({"amount": 5}),
            400,
            "INVALID_FIELD",
        ),
        (
            "burn",
            "zero amount",
            json!({"amount": "0"}),
            422,
            "INVALID_FIELD",
        ),
        (
            "burn",
            "too precise",
            json!({"amount": "0.0000001"}),
            422,
            "AMOUNT_PRECISION_LOSS",
        ),
        (
            "burn",
            "bad from",
            json!({"amount": "1", "from": "SECRETVALUE"}),
            422,
            "INVALID_ADDRESS",
        ),
        (
            "burn",
            "zero from",
            json!({"amount": "1", "from": zero}),
            422,
            "INVALID_FIELD",
        ),
        (
            "burn",
            "issuer burn",
            json!({"amount": "1"}),
            409,
            "ASSET_NOT_READY",
        ),
        (
            "burn",
            "null from",
            json!({"amount": "1", "from": null}),
            409,
            "ASSET_NOT_READY",
        ),
        (
            "burn",
            "forced burn",
            json!({"amount": "1", "from": RECIPIENT}),
            409,
            "ASSET_NOT_READY",
        ),
        (
            "grant-role",
            "grant burner",
            json!({"role": "burner", "account": RECIPIENT}),
            409,
            "ASSET_NOT_READY",
        ),
        (
            "revoke-role",
            "revoke minter",
            json!({"role": "minter", "account": RECIPIENT}),
            409,
            "ASSET_NOT_READY",
        ),
    ];
    for (path, label, body, status, code) in cases {
        let a = env
            .post(
                &env.key_a,
                &format!("/v1/assets/{asset}/{path}"),
                Some(&format!("k-{label}")),
                &body,
            )
            .await;
        assert_problem(&a, status, code, label);
    }
    // Without an Idempotency-Key; for another organization's asset.
    let a = env
        .post(
            &env.key_a,
            &format!("/v1/assets/{asset}/burn"),
            None,
            &json!({"amount": "1"}),
        )
        .await;
    assert_problem(&a, 400, "IDEMPOTENCY_KEY_REQUIRED", "no key");
    let a = env
        .post(
            &env.key_b,
            &format!("/v1/assets/{asset}/grant-role"),
            Some("k-other"),
            &json!({"role": "minter", "account": RECIPIENT}),
        )
        .await;
    assert_problem(&a, 404, "NOT_FOUND", "another organization's asset");
    assert_eq!(env.counts().await, before);
}
