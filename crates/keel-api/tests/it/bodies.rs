//! Duplicate members, in every body type at its route: one answer (`400 INVALID_FIELD`
//! naming the member) whichever copy comes first, whatever the copies hold — a bad
//! value first and a good one last included, which the old parser accepted. Values
//! nested inside a member answer the same whatever the order of their own duplicates.

use crate::common::{Env, RECIPIENT, TEMPLATE, assert_problem};
use serde_json::Value;
use uuid::Uuid;

/// A body type at one route: its members (name, a valid value, a refused value) as
/// JSON text.
struct BodyType {
    label: &'static str,
    uri: String,
    members: Vec<(&'static str, String, &'static str)>,
}

/// `{"k":v,...}` from raw member texts, in the given order (duplicates kept).
fn object(members: &[(&str, &str)]) -> Vec<u8> {
    let inner: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    format!("{{{}}}", inner.join(",")).into_bytes()
}

fn body_types(asset: Uuid, key: Uuid) -> Vec<BodyType> {
    let recipient = format!("\"{RECIPIENT}\"");
    vec![
        BodyType {
            label: "CreateAssetRequest",
            uri: "/v1/assets".to_owned(),
            members: vec![
                ("name", "\"Alpha\"".into(), "5"),
                ("symbol", "\"ALP\"".into(), "\"A-B\""),
                ("decimals", "6".into(), "300"),
                ("templateId", format!("\"{TEMPLATE}\""), "[]"),
                ("initialPrice", "\"1.25\"".into(), "1.25"),
            ],
        },
        BodyType {
            label: "TokenAmountRequest (mint)",
            uri: format!("/v1/assets/{asset}/mint"),
            members: vec![
                ("recipient", recipient.clone(), "\"0x12\""),
                ("amount", "\"1\"".into(), "1"),
            ],
        },
        BodyType {
            label: "TokenAmountRequest (transfer)",
            uri: format!("/v1/assets/{asset}/transfer"),
            members: vec![
                ("recipient", recipient, "null"),
                ("amount", "\"1\"".into(), "\"-1\""),
            ],
        },
        BodyType {
            label: "CreateApiKeyRequest",
            uri: "/v1/api-keys".to_owned(),
            members: vec![
                ("label", "\"ci\"".into(), "5"),
                ("scopes", "[\"read\"]".into(), "[\"write\"]"),
            ],
        },
        BodyType {
            label: "RotateApiKeyRequest",
            uri: format!("/v1/api-keys/{key}/rotate"),
            members: vec![("expiresInSeconds", "60".into(), "604801")],
        },
    ]
}

#[tokio::test]
async fn duplicate_members_get_one_answer_in_every_body_type() {
    let env = Env::new().await;
    let (asset, _) = env.create_asset(&env.key_a, "dup-setup").await;
    let key = Uuid::new_v4();
    let before = env.counts().await;
    for t in body_types(asset, key) {
        for (i, (name, good, bad)) in t.members.iter().enumerate() {
            let others: Vec<(&str, &str)> = t
                .members
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, (n, g, _))| (*n, g.as_str()))
                .collect();
            let nested_dup = r#"{"d":1,"d":2}"#;
            let with = |front: &[(&str, &str)], back: &[(&str, &str)]| {
                let mut m: Vec<(&str, &str)> = front.to_vec();
                m.extend(others.iter().copied());
                m.extend(back.iter().copied());
                object(&m)
            };
            let variants = [
                ("bad first", with(&[(name, bad), (name, good)], &[])),
                ("bad last", with(&[], &[(name, good), (name, bad)])),
                ("split good/bad", with(&[(name, good)], &[(name, bad)])),
                ("split bad/good", with(&[(name, bad)], &[(name, good)])),
                ("both good", with(&[(name, good), (name, good)], &[])),
                (
                    "nested first",
                    with(&[(name, nested_dup), (name, good)], &[]),
                ),
                (
                    "nested last",
                    with(&[], &[(name, good), (name, nested_dup)]),
                ),
            ];
            let mut answers = Vec::new();
            for (variant, body) in variants {
                let label = format!("{} {name}: {variant}", t.label);
                let a = env.post_raw(&env.key_a, &t.uri, Some(&label), &body).await;
                assert_problem(&a, 400, "INVALID_FIELD", &label);
                let detail = a.body["detail"].as_str().unwrap_or("");
                assert!(
                    detail.contains(&format!("`{name}`")) && detail.contains("more than once"),
                    "{label}: {detail}"
                );
                answers.push(a.body);
            }
            assert!(
                answers.windows(2).all(|w| w[0] == w[1]),
                "{} {name}: answers differ: {answers:?}",
                t.label
            );

            // A duplicate nested inside a member (a value of the wrong JSON type): the
            // same answer whichever copy is last.
            let mut orders: Vec<Value> = Vec::new();
            for nested in [
                r#"{"d":1,"d":2}"#,
                r#"{"d":2,"d":1}"#,
                r#"{"d":{"e":1,"e":[]}}"#,
            ] {
                let body = with(&[(name, nested)], &[]);
                let label = format!("{} {name}: nested {nested}", t.label);
                let a = env.post_raw(&env.key_a, &t.uri, Some(&label), &body).await;
                assert_problem(&a, 400, "INVALID_FIELD", &label);
                orders.push(a.body);
            }
            assert!(
                orders.windows(2).all(|w| w[0] == w[1]),
                "{} {name}: {orders:?}",
                t.label
            );
        }
    }
    // A member unknown to the schema, repeated, is unknown in any order (also in the
    // bodies that accept no members).
    let empty_routes = [
        format!("/v1/assets/{asset}/pause"),
        format!("/v1/assets/{asset}/unpause"),
        format!("/v1/api-keys/{key}/revoke"),
        "/v1/assets".to_owned(),
    ];
    for uri in &empty_routes {
        let mut answers = Vec::new();
        for body in [
            &br#"{"SECRETVALUE":1,"SECRETVALUE":2}"#[..],
            br#"{"SECRETVALUE":2,"SECRETVALUE":1}"#,
            br#"{"SECRETVALUE":{"d":1,"d":1}}"#,
        ] {
            let a = env
                .post_raw(&env.key_a, uri, Some("dup-unknown"), body)
                .await;
            assert_problem(&a, 400, "UNKNOWN_FIELD", uri);
            answers.push(a.body);
        }
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "{uri}: {answers:?}"
        );
    }
    assert_eq!(env.counts().await, before, "no refused body wrote anything");
    let keys = env.get(&env.key_a, "/v1/api-keys").await;
    assert_eq!(
        keys.body["data"].as_array().unwrap().len(),
        2,
        "no key was created"
    );
}
