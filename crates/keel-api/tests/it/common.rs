//! Shared setup: a migrated database, two organizations with keys and templates, an
//! engine without executors, and the router.

use crate::doc_check::DocCheck;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use keel_api::{ApiConfig, ApiState, router};
use keel_durable::{Engine, EngineConfig};
use keel_store::testing::TestDatabase;
use keel_workflows::Ops;
use keel_workflows::Scope;
use keel_workflows::tenancy::{
    Template, create_api_key, create_api_key_with_scopes, create_organization,
    organization_by_name, upsert_template,
};
use serde_json::{Value, json};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, LazyLock};
use tower::ServiceExt;
use uuid::Uuid;

pub(crate) const TEMPLATE: &str = "default";
pub(crate) const RECIPIENT: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";

pub(crate) struct Env {
    pub(crate) db: TestDatabase,
    pub(crate) app: Router,
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) engine: Engine,
    /// Organization A's first key.
    pub(crate) key_a: String,
    /// Organization A's second key (approvals).
    pub(crate) key_a2: String,
    /// Organization B's key.
    pub(crate) key_b: String,
}

/// The answer of one request.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Value,
    pub(crate) raw: Vec<u8>,
}

impl Answer {
    pub(crate) fn code(&self) -> &str {
        self.body.get("code").and_then(Value::as_str).unwrap_or("")
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn template(id: &str) -> Template {
    Template {
        id: id.to_owned(),
        chain_id: 31337,
        price_decimals: 8,
        staleness_bound_seconds: 3600,
        mint_approval_threshold: Some("1000".to_owned()),
        approval_ttl_seconds: 600,
        funding_pause: false,
        funding_deadline_seconds: 3600,
        sender: None,
        forced_transfer_skips_compliance: false,
        batch_max_recipients: keel_workflows::tenancy::DEFAULT_BATCH_MAX_RECIPIENTS,
    }
}

impl Env {
    pub(crate) async fn new() -> Self {
        Self::with_config(ApiConfig::default()).await
    }

    pub(crate) async fn with_config(config: ApiConfig) -> Self {
        Self::build(
            config,
            keel_webhooks::UrlPolicy {
                allow_http: true,
                allow_private: true,
            },
        )
        .await
    }

    /// An env whose webhook endpoints follow `policy` (the others allow loopback `http`).
    pub(crate) async fn with_webhook_policy(policy: keel_webhooks::UrlPolicy) -> Self {
        Self::build(ApiConfig::default(), policy).await
    }

    async fn build(config: ApiConfig, policy: keel_webhooks::UrlPolicy) -> Self {
        let db = TestDatabase::create().await.unwrap();
        let pool = db.pool().clone();
        keel_store::migrate(&pool).await.unwrap();
        let org_a = create_organization(&pool, "org-a").await.unwrap();
        let org_b = create_organization(&pool, "org-b").await.unwrap();
        let key_a = create_api_key(&pool, org_a, "a1").await.unwrap().token;
        let key_a2 = create_api_key(&pool, org_a, "a2").await.unwrap().token;
        let key_b = create_api_key(&pool, org_b, "b1").await.unwrap().token;
        upsert_template(&pool, org_a, &template(TEMPLATE))
            .await
            .unwrap();
        upsert_template(&pool, org_b, &template(TEMPLATE))
            .await
            .unwrap();
        let engine = Engine::new(pool.clone(), EngineConfig::default()).unwrap();
        // Webhooks (issue 21): loopback http endpoints allowed for most tests.
        let webhooks = keel_webhooks::Webhooks::new(
            pool.clone(),
            keel_webhooks::WebhookConfig {
                policy,
                ..keel_webhooks::WebhookConfig::default()
            },
        );
        let ops = Ops::new(pool, engine.clone());
        let ready = Arc::new(AtomicBool::new(true));
        let app = router(
            ApiState::new(ops, ready.clone())
                .with_config(config)
                .with_webhooks(webhooks),
        );
        Self {
            db,
            app,
            ready,
            engine,
            key_a,
            key_a2,
            key_b,
        }
    }

    /// From now on, Platform Status reads chain heads from `nodes` (issue 32 §7), with
    /// `config`.
    pub(crate) fn serve_chain_heads(
        &mut self,
        config: ApiConfig,
        nodes: Vec<Arc<keel_chain::UpstreamPool>>,
    ) {
        let ops = Ops::new(self.db.pool().clone(), self.engine.clone());
        self.app = router(
            ApiState::new(ops, self.ready.clone())
                .with_config(config)
                .with_chain_heads(nodes),
        );
    }

    /// Serves the user-operation routes (issue 20) through `service` from now on.
    pub(crate) fn serve_user_operations(&mut self, service: keel_aa::service::AaService) {
        let ops = Ops::new(self.db.pool().clone(), self.engine.clone());
        self.app = router(ApiState::new(ops, self.ready.clone()).with_user_operations(service));
    }

    /// Sends one request. `body` bytes are sent as given; `content_type` when given.
    /// Fails the test unless the answer matches the OpenAPI document (its path, method
    /// and status declared, its body valid against the declared schema).
    pub(crate) async fn send(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, Vec<u8>)>,
    ) -> Answer {
        let a = self
            .send_unchecked(method.clone(), uri, headers, body)
            .await;
        if let Err(e) = doc().check(
            method.as_str(),
            uri,
            a.status.as_u16(),
            a.header("content-type"),
            &a.raw,
        ) {
            panic!("the answer disagrees with the OpenAPI document: {e}");
        }
        a
    }

    /// Sends one request without checking the answer against the OpenAPI document: only
    /// for requests the document deliberately does not describe (unknown paths or
    /// methods).
    pub(crate) async fn send_unchecked(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, Vec<u8>)>,
    ) -> Answer {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = match body {
            Some((ct, bytes)) => {
                if !ct.is_empty() {
                    b = b.header("content-type", ct);
                }
                b.body(Body::from(bytes)).unwrap()
            }
            None => b.body(Body::empty()).unwrap(),
        };
        let res = self.app.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let raw = res.into_body().collect().await.unwrap().to_bytes().to_vec();
        let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
            raw,
        }
    }

    /// `GET uri` with `key`.
    pub(crate) async fn get(&self, key: &str, uri: &str) -> Answer {
        let auth = format!("Bearer {key}");
        self.send(Method::GET, uri, &[("authorization", &auth)], None)
            .await
    }

    /// `POST uri` with `key`, an optional `Idempotency-Key` and a JSON body.
    pub(crate) async fn post(
        &self,
        key: &str,
        uri: &str,
        idem: Option<&str>,
        body: &Value,
    ) -> Answer {
        let auth = format!("Bearer {key}");
        let mut h = vec![("authorization", auth.as_str())];
        if let Some(k) = idem {
            h.push(("idempotency-key", k));
        }
        self.send(
            Method::POST,
            uri,
            &h,
            Some(("application/json", serde_json::to_vec(body).unwrap())),
        )
        .await
    }

    /// Creates an asset for `key` (must be accepted) and returns (asset id, operation id).
    pub(crate) async fn create_asset(&self, key: &str, idem: &str) -> (Uuid, Uuid) {
        let a = self
            .post(key, "/v1/assets", Some(idem), &asset_body("Alpha"))
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        let asset: Uuid = a.body["assetId"].as_str().unwrap().parse().unwrap();
        let op: Uuid = a.body["id"].as_str().unwrap().parse().unwrap();
        (asset, op)
    }

    /// A new key of organization `org` (`org-a` or `org-b`) holding `scopes`; its token.
    pub(crate) async fn key_with(&self, org: &str, scopes: &[Scope]) -> String {
        let pool = self.db.pool();
        let org = organization_by_name(pool, org).await.unwrap();
        let label = format!("test-{}", Uuid::new_v4());
        create_api_key_with_scopes(pool, org, &label, scopes.iter().copied().collect())
            .await
            .unwrap()
            .token
    }

    /// `POST uri` with `key` and raw JSON bytes (no `Idempotency-Key` unless `idem`).
    pub(crate) async fn post_raw(
        &self,
        key: &str,
        uri: &str,
        idem: Option<&str>,
        body: &[u8],
    ) -> Answer {
        let auth = format!("Bearer {key}");
        let mut h = vec![("authorization", auth.as_str())];
        if let Some(k) = idem {
            h.push(("idempotency-key", k));
        }
        self.send(
            Method::POST,
            uri,
            &h,
            Some(("application/json", body.to_vec())),
        )
        .await
    }

    /// (operations, assets) rows.
    pub(crate) async fn counts(&self) -> (i64, i64) {
        let ops: i64 = sqlx::query_scalar("SELECT count(*) FROM operation")
            .fetch_one(self.db.pool())
            .await
            .unwrap();
        let assets: i64 = sqlx::query_scalar("SELECT count(*) FROM asset")
            .fetch_one(self.db.pool())
            .await
            .unwrap();
        (ops, assets)
    }
}

/// The checker of the document the router serves (`keel_api::openapi_json()`, which
/// `served_openapi_equals_the_committed_document` compares with `/openapi.json` and
/// `docs/openapi.json`).
pub(crate) fn doc() -> &'static DocCheck {
    static DOC: LazyLock<DocCheck> =
        LazyLock::new(|| DocCheck::new(serde_json::from_str(&keel_api::openapi_json()).unwrap()));
    &DOC
}

pub(crate) fn asset_body(name: &str) -> Value {
    json!({
        "name": name, "symbol": "ALP", "decimals": 6,
        "templateId": TEMPLATE, "initialPrice": "1.25"
    })
}

/// Asserts a problem answer: status, code, media type, the members, and that no
/// `marker` of the request is echoed.
pub(crate) fn assert_problem(a: &Answer, status: u16, code: &str, label: &str) {
    assert_eq!(a.status.as_u16(), status, "{label}: {:?}", a.body);
    assert_eq!(a.code(), code, "{label}: {:?}", a.body);
    assert_eq!(
        a.header("content-type"),
        Some("application/problem+json"),
        "{label}"
    );
    for member in ["type", "title", "status", "code", "retryable", "detail"] {
        assert!(a.body.get(member).is_some(), "{label}: missing {member}");
    }
    assert_eq!(
        a.body["status"].as_u64(),
        Some(u64::from(status)),
        "{label}"
    );
    let text = String::from_utf8_lossy(&a.raw);
    assert!(
        !text.contains("SECRETVALUE"),
        "{label}: echoed a value: {text}"
    );
}
