//! Random JSON (and random bytes) at every POST endpoint: never a 5xx.

use crate::common::{Env, RECIPIENT};
use axum::http::Method;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Number, Value};

const FIELDS: &[&str] = &[
    "name",
    "symbol",
    "decimals",
    "templateId",
    "initialPrice",
    "recipient",
    "amount",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(FIELDS).prop_map(str::to_owned),
        1 => ".{0,12}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        ".{0,24}".prop_map(Value::String),
        "-?[0-9]{0,40}(\\.[0-9]{0,40})?".prop_map(Value::String),
        Just(Value::String(RECIPIENT.to_owned())),
        Just(Value::String("default".to_owned())),
        Just(Value::String("a\u{0}b".to_owned())),
        "0x[0-9a-fA-F]{0,42}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 48, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An object with mostly real field names (so validation gets deep), or any value, or
/// raw bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec((key(), leaf()), 0..8)
            .prop_map(|kv| serde_json::to_vec(&Value::Object(kv.into_iter().collect())).unwrap()),
        3 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

#[test]
fn random_json_never_answers_5xx() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let env = rt.block_on(Env::new());
    let (asset, op) = rt.block_on(env.create_asset(&env.key_a, "prop-setup"));
    let endpoints = [
        "/v1/assets".to_owned(),
        format!("/v1/assets/{asset}/mint"),
        format!("/v1/assets/{asset}/transfer"),
        format!("/v1/assets/{asset}/pause"),
        format!("/v1/assets/{asset}/unpause"),
        format!("/v1/operations/{op}/approve"),
        format!("/v1/operations/{op}/reject"),
    ];
    let auth = format!("Bearer {}", env.key_a2);
    for uri in &endpoints {
        let mut runner = TestRunner::new(Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (
            body(),
            "[a-z0-9]{1,12}",
            // `wait=0` only: operations never end here, so any longer wait would only
            // slow the suite down.
            proptest::option::of(prop_oneof![Just("wait=0"), Just("wait=x, foo")]),
        );
        runner
            .run(&strategy, |(bytes, idem, prefer)| {
                let mut headers = vec![
                    ("authorization", auth.as_str()),
                    ("idempotency-key", idem.as_str()),
                ];
                if let Some(p) = prefer {
                    headers.push(("prefer", p));
                }
                let a = rt.block_on(env.send(
                    Method::POST,
                    uri,
                    &headers,
                    Some(("application/json", bytes)),
                ));
                if a.status.is_server_error() {
                    return Err(TestCaseError::fail(format!(
                        "{uri}: {} {:?}",
                        a.status, a.body
                    )));
                }
                if !a.status.is_success() {
                    prop_assert_eq!(a.header("content-type"), Some("application/problem+json"));
                    prop_assert!(!a.code().is_empty());
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{uri}: {e}"));
    }
}
