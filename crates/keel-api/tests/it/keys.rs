//! The API key lifecycle under `/v1/api-keys`: list, create, revoke (the next request
//! answers 401), rotate (immediately, or with an overlap for the old secret), tenant
//! isolation, and the scope rules of key creation.

use crate::common::{Env, assert_problem};
use axum::http::{Method, StatusCode};
use keel_workflows::Scope;
use serde_json::{Value, json};
use uuid::Uuid;

fn is_token(v: &Value) -> bool {
    v.as_str().is_some_and(|t| {
        t.len() == 72 && t.starts_with("keel_sk_") && t[8..].bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// `GET /v1/assets` with `token`: the status (200 when the key works for reads).
async fn probe(env: &Env, token: &str) -> u16 {
    env.get(token, "/v1/assets").await.status.as_u16()
}

/// Creates a key through the API with `admin` and returns (id, token).
async fn create(env: &Env, admin: &str, label: &str, scopes: &[&str]) -> (Uuid, String) {
    let a = env
        .post(
            admin,
            "/v1/api-keys",
            None,
            &json!({"label": label, "scopes": scopes}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
    assert!(is_token(&a.body["token"]), "{:?}", a.body);
    let id = a.body["apiKey"]["id"].as_str().unwrap().parse().unwrap();
    (id, a.body["token"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn an_admin_key_lists_creates_and_revokes_and_a_revoked_key_answers_401_at_once() {
    let env = Env::new().await;
    let list = env.get(&env.key_a, "/v1/api-keys").await;
    assert_eq!(list.status, StatusCode::OK, "{:?}", list.body);
    let data = list.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "org A's two keys: {:?}", list.body);
    assert_eq!(list.body["hasMore"], json!(false));
    for k in data {
        // Keys from before scopes existed (and `create_api_key`) hold every scope.
        assert_eq!(k["scopes"], json!(["read", "operate", "approve", "admin"]));
        assert_eq!(k["revokedAt"], Value::Null);
    }
    assert!(!String::from_utf8_lossy(&list.raw).contains("keel_sk_"));

    let a = env
        .post(
            &env.key_a,
            "/v1/api-keys",
            None,
            &json!({"label": "ci reader", "scopes": ["read"]}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
    let key = &a.body["apiKey"];
    assert_eq!(key["label"], json!("ci reader"));
    assert_eq!(key["scopes"], json!(["read"]));
    assert_eq!(key["rotatedAt"], Value::Null);
    let id = key["id"].as_str().unwrap().to_owned();
    let token = a.body["token"].as_str().unwrap().to_owned();
    assert!(is_token(&a.body["token"]));

    assert_eq!(probe(&env, &token).await, 200);
    let write = env
        .post(
            &token,
            "/v1/assets",
            Some("k1"),
            &crate::common::asset_body("A"),
        )
        .await;
    assert_problem(&write, 403, "INSUFFICIENT_SCOPE", "read key writes");
    let list = env.get(&env.key_a, "/v1/api-keys").await;
    assert_eq!(list.body["data"].as_array().unwrap().len(), 3);
    assert!(!String::from_utf8_lossy(&list.raw).contains(&token));

    let revoked = env
        .post(
            &env.key_a,
            &format!("/v1/api-keys/{id}/revoke"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::OK, "{:?}", revoked.body);
    let revoked_at = revoked.body["revokedAt"].clone();
    assert!(revoked_at.is_string(), "{:?}", revoked.body);
    // The very next request with the revoked key.
    let a = env.get(&token, "/v1/assets").await;
    assert_problem(&a, 401, "UNAUTHENTICATED", "revoked key");
    // Repeating the revoke (with an empty body) keeps the first time.
    let again = env
        .send(
            Method::POST,
            &format!("/v1/api-keys/{id}/revoke"),
            &[("authorization", &format!("Bearer {}", env.key_a))],
            None,
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(again.body["revokedAt"], revoked_at);
    let list = env.get(&env.key_a, "/v1/api-keys").await;
    let listed = list.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == json!(id))
        .unwrap()
        .clone();
    assert_eq!(listed["revokedAt"], revoked_at);
    // Rotating a revoked key is refused.
    let r = env
        .post(
            &env.key_a,
            &format!("/v1/api-keys/{id}/rotate"),
            None,
            &json!({}),
        )
        .await;
    assert_problem(&r, 409, "API_KEY_REVOKED", "rotate revoked");

    // A key may revoke itself; its next request answers 401.
    let (admin_id, admin) = create(&env, &env.key_a, "self", &["admin", "read"]).await;
    let a = env
        .post(
            &admin,
            &format!("/v1/api-keys/{admin_id}/revoke"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_problem(
        &env.get(&admin, "/v1/api-keys").await,
        401,
        "UNAUTHENTICATED",
        "self",
    );
    assert_eq!(
        probe(&env, &env.key_a).await,
        200,
        "other keys are untouched"
    );
}

#[tokio::test]
async fn an_immediate_rotation_stops_the_old_secret_and_keeps_the_key() {
    let env = Env::new().await;
    let (id, old) = create(&env, &env.key_a, "svc", &["read", "admin"]).await;
    let a = env
        .post(
            &env.key_a,
            &format!("/v1/api-keys/{id}/rotate"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let new = a.body["token"].as_str().unwrap().to_owned();
    assert!(is_token(&a.body["token"]));
    assert_ne!(new, old);
    let key = &a.body["apiKey"];
    assert_eq!(key["id"], json!(id.to_string()), "the key's id stays");
    assert_eq!(key["scopes"], json!(["read", "admin"]), "its scopes stay");
    assert!(key["rotatedAt"].is_string());
    assert_eq!(key["previousSecretExpiresAt"], Value::Null);
    assert_problem(
        &env.get(&old, "/v1/assets").await,
        401,
        "UNAUTHENTICATED",
        "old",
    );
    assert_eq!(probe(&env, &new).await, 200);

    // A key may rotate itself (empty body); `expiresInSeconds: 0` is immediate too.
    let a = env
        .send(
            Method::POST,
            &format!("/v1/api-keys/{id}/rotate"),
            &[("authorization", &format!("Bearer {new}"))],
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let newer = a.body["token"].as_str().unwrap().to_owned();
    assert_problem(
        &env.get(&new, "/v1/assets").await,
        401,
        "UNAUTHENTICATED",
        "new",
    );
    let a = env
        .post(
            &newer,
            &format!("/v1/api-keys/{id}/rotate"),
            None,
            &json!({"expiresInSeconds": 0}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.body["apiKey"]["previousSecretExpiresAt"], Value::Null);
    assert_problem(
        &env.get(&newer, "/v1/assets").await,
        401,
        "UNAUTHENTICATED",
        "newer",
    );
    assert_eq!(probe(&env, a.body["token"].as_str().unwrap()).await, 200);
}

#[tokio::test]
async fn a_rotation_with_an_overlap_keeps_the_old_secret_until_the_overlap_ends() {
    let env = Env::new().await;
    let (id, first) = create(&env, &env.key_a, "svc", &["read"]).await;
    let rotate = |body: Value| {
        let env = &env;
        async move {
            env.post(
                &env.key_a,
                &format!("/v1/api-keys/{id}/rotate"),
                None,
                &body,
            )
            .await
        }
    };
    let a = rotate(json!({"expiresInSeconds": 3600})).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let second = a.body["token"].as_str().unwrap().to_owned();
    let until: chrono::DateTime<chrono::Utc> = a.body["apiKey"]["previousSecretExpiresAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let rotated: chrono::DateTime<chrono::Utc> = a.body["apiKey"]["rotatedAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!((until - rotated).num_seconds(), 3600);
    assert_eq!(
        probe(&env, &first).await,
        200,
        "old secret, within the overlap"
    );
    assert_eq!(probe(&env, &second).await, 200, "new secret");

    // A second rotation during the overlap: the oldest secret stops at once, the
    // one it replaces gets the new overlap.
    let a = rotate(json!({"expiresInSeconds": 60.0})).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let third = a.body["token"].as_str().unwrap().to_owned();
    assert_problem(
        &env.get(&first, "/v1/assets").await,
        401,
        "UNAUTHENTICATED",
        "first",
    );
    assert_eq!(probe(&env, &second).await, 200);
    assert_eq!(probe(&env, &third).await, 200);

    // The overlap ends (the clock is the database's: move the end into the past
    // instead of waiting for it).
    sqlx::query(
        "UPDATE api_key SET previous_secret_expires_at = now() - interval '1 second'
          WHERE id = $1",
    )
    .bind(id)
    .execute(env.db.pool())
    .await
    .unwrap();
    assert_problem(
        &env.get(&second, "/v1/assets").await,
        401,
        "UNAUTHENTICATED",
        "ended",
    );
    assert_eq!(probe(&env, &third).await, 200);
    let list = env.get(&env.key_a, "/v1/api-keys").await;
    let listed = list.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == json!(id.to_string()))
        .unwrap()
        .clone();
    assert_eq!(listed["previousSecretExpiresAt"], Value::Null);

    // A revoke during an overlap stops both secrets at once.
    let a = rotate(json!({"expiresInSeconds": 604_800})).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    let fourth = a.body["token"].as_str().unwrap().to_owned();
    assert_eq!(probe(&env, &third).await, 200);
    let r = env
        .post(
            &env.key_a,
            &format!("/v1/api-keys/{id}/revoke"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["previousSecretExpiresAt"], Value::Null);
    for t in [&third, &fourth] {
        assert_problem(
            &env.get(t, "/v1/assets").await,
            401,
            "UNAUTHENTICATED",
            "revoked",
        );
    }
}

#[tokio::test]
async fn rotation_bodies_are_checked() {
    let env = Env::new().await;
    let (id, _) = create(&env, &env.key_a, "svc", &["read"]).await;
    let uri = format!("/v1/api-keys/{id}/rotate");
    let cases: [(&[u8], u16, &str); 6] = [
        (br#"{"expiresInSeconds": 604801}"#, 422, "INVALID_FIELD"),
        (br#"{"expiresInSeconds": -1}"#, 400, "INVALID_FIELD"),
        (br#"{"expiresInSeconds": 1.5}"#, 400, "INVALID_FIELD"),
        (br#"{"expiresInSeconds": "60"}"#, 400, "INVALID_FIELD"),
        (
            br#"{"expiresInSeconds": 60, "SECRETVALUE": 1}"#,
            400,
            "UNKNOWN_FIELD",
        ),
        (
            br#"{"expiresInSeconds": 60, "expiresInSeconds": 0}"#,
            400,
            "INVALID_FIELD",
        ),
    ];
    for (body, status, code) in cases {
        let a = env.post_raw(&env.key_a, &uri, None, body).await;
        assert_problem(&a, status, code, &String::from_utf8_lossy(body));
    }
    // `null` is the same as absent.
    let a = env
        .post_raw(&env.key_a, &uri, None, br#"{"expiresInSeconds": null}"#)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.body["apiKey"]["previousSecretExpiresAt"], Value::Null);
}

#[tokio::test]
async fn other_organizations_key_ids_answer_404() {
    let env = Env::new().await;
    let (id_a, token_a) = create(&env, &env.key_a, "a-svc", &["read"]).await;
    for action in ["revoke", "rotate"] {
        let a = env
            .post(
                &env.key_b,
                &format!("/v1/api-keys/{id_a}/{action}"),
                None,
                &json!({}),
            )
            .await;
        assert_problem(&a, 404, "NOT_FOUND", action);
        let a = env
            .post(
                &env.key_b,
                &format!("/v1/api-keys/not-a-uuid/{action}"),
                None,
                &json!({}),
            )
            .await;
        assert_problem(&a, 404, "NOT_FOUND", action);
        let a = env
            .post(
                &env.key_a,
                &format!("/v1/api-keys/{}/{action}", Uuid::new_v4()),
                None,
                &json!({}),
            )
            .await;
        assert_problem(&a, 404, "NOT_FOUND", action);
    }
    assert_eq!(probe(&env, &token_a).await, 200, "org B changed nothing");
    let list = env.get(&env.key_b, "/v1/api-keys").await;
    let data = list.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "only org B's own key: {:?}", list.body);
    assert!(!data.iter().any(|k| k["id"] == json!(id_a.to_string())));
}

#[tokio::test]
async fn a_key_grants_only_scopes_it_holds_and_creation_bodies_are_checked() {
    let env = Env::new().await;
    let admin_only = env.key_with("org-a", &[Scope::Admin]).await;
    let a = env
        .post(
            &admin_only,
            "/v1/api-keys",
            None,
            &json!({"label": "x", "scopes": ["read"]}),
        )
        .await;
    assert_problem(&a, 403, "INSUFFICIENT_SCOPE", "escalation");
    let (_, t) = create(&env, &admin_only, "admin-2", &["admin"]).await;
    assert_problem(
        &env.get(&t, "/v1/assets").await,
        403,
        "INSUFFICIENT_SCOPE",
        "admin-only",
    );

    let cases: [(Value, u16, &str); 9] = [
        (
            json!({"label": "x", "scopes": ["write"]}),
            422,
            "INVALID_FIELD",
        ),
        (
            json!({"label": "x", "scopes": ["read", "read"]}),
            422,
            "INVALID_FIELD",
        ),
        (json!({"label": "x", "scopes": []}), 422, "INVALID_FIELD"),
        (
            json!({"label": "", "scopes": ["read"]}),
            422,
            "INVALID_FIELD",
        ),
        (
            json!({"label": "a\u{7}b", "scopes": ["read"]}),
            422,
            "INVALID_FIELD",
        ),
        (
            json!({"label": "x".repeat(256), "scopes": ["read"]}),
            422,
            "INVALID_FIELD",
        ),
        (json!({"scopes": ["read"]}), 400, "INVALID_FIELD"),
        (
            json!({"label": "x", "scopes": "read"}),
            400,
            "INVALID_FIELD",
        ),
        (
            json!({"label": "x", "scopes": ["read", "operate", "approve", "admin", "read"]}),
            400,
            "INVALID_FIELD",
        ),
    ];
    for (body, status, code) in cases {
        let a = env.post(&env.key_a, "/v1/api-keys", None, &body).await;
        assert_problem(&a, status, code, &body.to_string());
    }
    // Every refused request created nothing.
    let list = env.get(&env.key_a, "/v1/api-keys").await;
    assert_eq!(
        list.body["data"].as_array().unwrap().len(),
        4,
        "{:?}",
        list.body
    );
}

#[tokio::test]
async fn the_key_list_pages_with_a_cursor() {
    let env = Env::new().await;
    for i in 0..3 {
        create(&env, &env.key_a, &format!("k{i}"), &["read"]).await;
    }
    let mut seen = Vec::new();
    let mut uri = "/v1/api-keys?limit=2".to_owned();
    let mut pages = 0;
    loop {
        let a = env.get(&env.key_a, &uri).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        pages += 1;
        let data = a.body["data"].as_array().unwrap();
        assert!(data.len() <= 2);
        seen.extend(data.iter().map(|k| k["id"].as_str().unwrap().to_owned()));
        match a.body["nextCursor"].as_str() {
            Some(c) => {
                assert_eq!(a.body["hasMore"], json!(true));
                uri = format!("/v1/api-keys?limit=2&cursor={c}");
            }
            None => {
                assert_eq!(a.body["hasMore"], json!(false));
                break;
            }
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 5);
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 5, "no key twice: {seen:?}");
    let all = env.get(&env.key_a, "/v1/api-keys?limit=200").await;
    let in_order: Vec<String> = all.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(in_order, seen, "pages follow the list order");
    for (uri, code) in [
        ("/v1/api-keys?cursor=SECRETVALUE", "INVALID_CURSOR"),
        ("/v1/api-keys?limit=0", "INVALID_QUERY"),
        ("/v1/api-keys?limit=201", "INVALID_QUERY"),
        ("/v1/api-keys?limit=x", "INVALID_QUERY"),
    ] {
        assert_problem(&env.get(&env.key_a, uri).await, 400, code, uri);
    }
}

/// A key row as it was before migration 0029 (no scopes column given) holds every
/// scope: nothing that worked breaks.
#[tokio::test]
async fn keys_without_declared_scopes_hold_every_scope() {
    let env = Env::new().await;
    let pool = env.db.pool();
    let org = keel_workflows::tenancy::organization_by_name(pool, "org-a")
        .await
        .unwrap();
    let token = format!("keel_sk_{}", "ab".repeat(32));
    use sha2::Digest;
    let hash = sha2::Sha256::digest(token.as_bytes()).to_vec();
    sqlx::query(
        "INSERT INTO api_key (id, organization_id, label, secret_sha256) VALUES ($1, $2, 'old', $3)",
    )
    .bind(Uuid::new_v4())
    .bind(org)
    .bind(hash)
    .execute(pool)
    .await
    .unwrap();
    let credential = keel_workflows::tenancy::authenticate_credential(pool, &token)
        .await
        .unwrap();
    assert_eq!(credential.scopes, keel_workflows::Scopes::all());
    assert_eq!(probe(&env, &token).await, 200);
    assert_eq!(env.get(&token, "/v1/api-keys").await.status, StatusCode::OK);
}
