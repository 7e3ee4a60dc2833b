//! Scopes: every route of `keel_api::scope::ROUTES` refuses a key without its scope
//! (`403 INSUFFICIENT_SCOPE`, before anything else is checked) and admits a key that
//! holds only that scope; plus the matrix on real resources.

use crate::common::{Env, RECIPIENT, assert_problem, asset_body};
use axum::http::{Method, StatusCode};
use keel_api::scope::{Access, ROUTES};
use keel_workflows::Scope;
use serde_json::json;
use uuid::Uuid;

/// `path` with its parameters filled: a fresh id for `{id}`, an address for `{address}`.
fn concrete(path: &str) -> String {
    path.replace("{id}", &Uuid::new_v4().to_string())
        .replace("{address}", RECIPIENT)
        .replace("{chain}", "31337")
        .replace("{hash}", &format!("0x{}", "ab".repeat(32)))
}

#[tokio::test]
async fn every_route_enforces_its_declared_scope() {
    let env = Env::new().await;
    let mut only = Vec::new();
    let mut all_but = Vec::new();
    for s in Scope::ALL {
        only.push((s, env.key_with("org-a", &[s]).await));
        let rest: Vec<Scope> = Scope::ALL.into_iter().filter(|o| *o != s).collect();
        all_but.push((s, env.key_with("org-a", &rest).await));
    }
    let token =
        |keys: &[(Scope, String)], s: Scope| keys.iter().find(|(k, _)| *k == s).unwrap().1.clone();
    let mut keyed = 0;
    for route in ROUTES {
        let method = Method::from_bytes(route.method.to_uppercase().as_bytes()).unwrap();
        let uri = concrete(route.path);
        let label = format!("{} {}", route.method, route.path);
        let send = |key: Option<String>| {
            let env = &env;
            let method = method.clone();
            let uri = uri.clone();
            async move {
                let auth = key.map(|k| format!("Bearer {k}"));
                let mut h = vec![("idempotency-key", "scope-test")];
                if let Some(a) = &auth {
                    h.push(("authorization", a.as_str()));
                }
                let body = (method == Method::POST).then(|| ("application/json", b"{}".to_vec()));
                env.send(method, &uri, &h, body).await
            }
        };
        match route.access {
            Access::Public if method == Method::POST => {
                // A public POST authenticates itself (a custody webhook's signature):
                // the authorization layer lets it through to the route's own answer.
                let a = send(None).await;
                assert!(
                    a.code() != "UNAUTHENTICATED" && a.code() != "INSUFFICIENT_SCOPE",
                    "{label}: {:?}",
                    a.body
                );
            }
            Access::Public => {
                let a = send(None).await;
                assert!(a.status.is_success(), "{label}: {:?}", a.body);
            }
            Access::Key(scope) => {
                keyed += 1;
                let a = send(None).await;
                assert_problem(&a, 401, "UNAUTHENTICATED", &label);
                let a = send(Some(token(&all_but, scope))).await;
                assert_problem(&a, 403, "INSUFFICIENT_SCOPE", &label);
                let a = send(Some(token(&only, scope))).await;
                assert!(
                    a.status != StatusCode::FORBIDDEN && a.status != StatusCode::UNAUTHORIZED,
                    "{label} with only `{scope}`: {} {:?}",
                    a.status,
                    a.body
                );
            }
        }
    }
    assert!(keyed >= 18, "{keyed}");
}

#[tokio::test]
async fn the_scope_matrix_on_real_resources() {
    let env = Env::new().await;
    let read = env.key_with("org-a", &[Scope::Read]).await;
    let operate = env.key_with("org-a", &[Scope::Operate]).await;
    let approve = env.key_with("org-a", &[Scope::Approve]).await;
    let admin = env.key_with("org-a", &[Scope::Admin]).await;
    let read_operate = env.key_with("org-a", &[Scope::Read, Scope::Operate]).await;

    // operate: creates and mints, but cannot read them back.
    let (asset, op) = env.create_asset(&operate, "m-create").await;
    assert_problem(
        &env.get(&operate, &format!("/v1/operations/{op}")).await,
        403,
        "INSUFFICIENT_SCOPE",
        "operate reads",
    );
    let mint = json!({"recipient": RECIPIENT, "amount": "5000"});
    let a = env
        .post(
            &read_operate,
            &format!("/v1/assets/{asset}/mint"),
            Some("m-mint"),
            &mint,
        )
        .await;
    // The asset is still `creating` (no runner): the scope admitted the request.
    assert_problem(&a, 409, "ASSET_NOT_READY", "read+operate mints");

    // read: reads, never writes.
    assert_eq!(
        env.get(&read, &format!("/v1/operations/{op}")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        env.get(&read, &format!("/v1/assets/{asset}")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        env.get(&read, "/v1/funding-requests").await.status,
        StatusCode::OK
    );
    for (uri, body) in [
        ("/v1/assets".to_owned(), asset_body("X")),
        (format!("/v1/assets/{asset}/pause"), json!({})),
        (format!("/v1/operations/{op}/cancel"), json!({})),
        (format!("/v1/operations/{op}/approve"), json!({})),
        (
            "/v1/api-keys".to_owned(),
            json!({"label": "x", "scopes": ["read"]}),
        ),
    ] {
        let a = env.post(&read, &uri, Some("m-read"), &body).await;
        assert_problem(&a, 403, "INSUFFICIENT_SCOPE", &uri);
    }

    // approve: decides, nothing else. (The operation waits for no approval here.)
    let a = env
        .post(
            &approve,
            &format!("/v1/operations/{op}/approve"),
            None,
            &json!({}),
        )
        .await;
    assert_problem(&a, 409, "APPROVAL_NOT_PENDING", "approve decides");
    let a = env
        .post(
            &approve,
            &format!("/v1/operations/{op}/cancel"),
            None,
            &json!({}),
        )
        .await;
    assert_problem(&a, 403, "INSUFFICIENT_SCOPE", "approve cancels");

    // admin: manages keys, nothing else.
    assert_eq!(env.get(&admin, "/v1/api-keys").await.status, StatusCode::OK);
    assert_problem(
        &env.get(&admin, "/v1/assets").await,
        403,
        "INSUFFICIENT_SCOPE",
        "admin reads",
    );
    // Without admin, no key management, even with every other scope.
    let no_admin = env
        .key_with("org-a", &[Scope::Read, Scope::Operate, Scope::Approve])
        .await;
    assert_problem(
        &env.get(&no_admin, "/v1/api-keys").await,
        403,
        "INSUFFICIENT_SCOPE",
        "no admin",
    );

    // The scope is checked before the body and the headers: nothing was written by a
    // refused request.
    let before = env.counts().await;
    let a = env.post_raw(&read, "/v1/assets", None, b"{not json").await;
    assert_problem(&a, 403, "INSUFFICIENT_SCOPE", "refused before the body");
    assert_eq!(env.counts().await, before);
}
