//! The list routes (`GET /v1/operations`, `/v1/assets`, `/v1/templates`), timestamps,
//! typed results and addresses (issue 18 §2).
//!
//! These tests have no chain. So that operations reach every state, an executor runs
//! **stand-ins** registered under the runner's workflow names: `asset.create` records
//! addresses and completes; `asset.mint` completes; `asset.pause` fails; `asset.transfer`
//! waits for a signal; `asset.unpause` is not registered (it stays `running`, and later
//! operations of its asset are `queued` behind it). Everything else — the engine, the
//! database, the service and the router — is the real thing; the real workflows'
//! results are covered by the binary's e2e tests, which check every answer against the
//! same document (checksummed addresses included).

use crate::common::{Env, RECIPIENT, TEMPLATE, assert_problem, asset_body};
use alloy_primitives::{Address, B256};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use keel_durable::{
    Engine, EngineConfig, ExecutorConfig, ExecutorHandle, StepError, Workflow, WorkflowContext,
    WorkflowFailure,
};
use keel_workflows::tenancy::{Template, upsert_template};
use keel_workflows::workflows::{
    AssetCreateInput, AssetCreateOutput, OpFailure, TokenOpInput, TokenOpOutput,
};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

/// The issuer the `asset.create` stand-in records (Anvil's dev account 0, lowercase
/// here: the API serves it checksummed).
const ISSUER: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

/// The token address the stand-in records for `asset`: its 16 id bytes and four `0xab`.
fn token_of(asset: Uuid) -> Address {
    let mut b = [0xab_u8; 20];
    b[..16].copy_from_slice(asset.as_bytes());
    Address::from(b)
}

struct CreateStandIn(sqlx::PgPool);

impl Workflow for CreateStandIn {
    const NAME: &'static str = "asset.create";
    // The API pins a creation to the real workflow's version: the stand-in runs it.
    const VERSION: u32 = <keel_workflows::workflows::AssetCreate as Workflow>::VERSION;
    type Input = AssetCreateInput;
    type Output = AssetCreateOutput;
    type Error = OpFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: AssetCreateInput,
    ) -> Result<AssetCreateOutput, WorkflowFailure<OpFailure>> {
        let token = token_of(input.asset_id);
        let feed = Address::repeat_byte(0xfe);
        let issuer: Address = ISSUER.parse().unwrap();
        let db = self.0.clone();
        ctx.step("record", || {
            let db = db.clone();
            async move {
                keel_workflows::store::asset_addresses_set(
                    &db,
                    input.asset_id,
                    token.as_slice(),
                    feed.as_slice(),
                    issuer.as_slice(),
                )
                .await
                .map_err(|_| StepError::<OpFailure>::transient("DATABASE_UNAVAILABLE"))
            }
        })
        .await?
        .map_err(WorkflowFailure::Failed)?;
        ctx.set_progress(json!({ "phase": "done", "feed": feed, "token": token }));
        Ok(AssetCreateOutput {
            token,
            feed,
            indexed_block: 7,
        })
    }
}

/// `asset.mint` completes, `asset.pause` fails, `asset.transfer` waits for a signal.
macro_rules! token_stand_in {
    ($ty:ident, $name:literal, |$ctx:ident| $body:block) => {
        struct $ty;
        impl Workflow for $ty {
            const NAME: &'static str = $name;
            type Input = TokenOpInput;
            type Output = TokenOpOutput;
            type Error = OpFailure;

            async fn run(
                &self,
                $ctx: &mut WorkflowContext,
                _input: TokenOpInput,
            ) -> Result<TokenOpOutput, WorkflowFailure<OpFailure>> {
                $body
            }
        }
    };
}

token_stand_in!(MintStandIn, "asset.mint", |_ctx| {
    Ok(TokenOpOutput {
        tx_hash: B256::repeat_byte(0x3c),
        block: 8,
        indexed_block: 9,
    })
});
token_stand_in!(PauseStandIn, "asset.pause", |_ctx| {
    Err(WorkflowFailure::Failed(OpFailure::new(
        "EXECUTION_REVERTED",
        false,
        "the transaction reverted",
    )))
});
token_stand_in!(TransferStandIn, "asset.transfer", |ctx| {
    ctx.wait_signal::<Value>("tx.transfer", None).await?;
    Ok(TokenOpOutput {
        tx_hash: B256::repeat_byte(0x3d),
        block: 8,
        indexed_block: 9,
    })
});

/// The stand-ins' executor.
fn runner(env: &Env) -> ExecutorHandle {
    let pool = env.db.pool().clone();
    Engine::new(pool.clone(), EngineConfig::default())
        .unwrap()
        .register(CreateStandIn(pool))
        .register(MintStandIn)
        .register(PauseStandIn)
        .register(TransferStandIn)
        .spawn_executor(ExecutorConfig::default())
        .unwrap()
}

/// `POST path` with `Prefer: wait=30`; the answer's body.
async fn post_wait(env: &Env, key: &str, path: &str, idem: &str, body: &Value) -> Value {
    let auth = format!("Bearer {key}");
    let a = env
        .send(
            axum::http::Method::POST,
            path,
            &[
                ("authorization", &auth),
                ("idempotency-key", idem),
                ("prefer", "wait=30"),
            ],
            Some(("application/json", serde_json::to_vec(body).unwrap())),
        )
        .await;
    assert!(
        a.status == StatusCode::OK || a.status == StatusCode::ACCEPTED,
        "{path}: {:?}",
        a.body
    );
    a.body
}

/// Polls operation `id` until `done` holds (the engine's status is the probe).
async fn until(env: &Env, key: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let path = format!("/v1/operations/{id}");
    keel_store::testing::until(
        &format!("operation {id}"),
        Duration::from_secs(30),
        || async {
            let a = env.get(key, &path).await;
            if done(&a.body) {
                std::ops::ControlFlow::Break(a.body)
            } else {
                std::ops::ControlFlow::Continue(a.body)
            }
        },
    )
    .await
}

/// Creates an asset for `key` and waits until it is active; its id.
async fn active_asset(env: &Env, key: &str, idem: &str) -> String {
    let op = post_wait(env, key, "/v1/assets", idem, &asset_body("Alpha")).await;
    assert_eq!(op["state"], "completed", "{op}");
    op["assetId"].as_str().unwrap().to_owned()
}

/// Walks a list from `first` (a URI without `cursor`) page by page; every item's `id`
/// in order, and the number of pages.
async fn walk(env: &Env, key: &str, first: &str) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut uri = first.to_owned();
    let mut pages = 0;
    loop {
        let a = env.get(key, &uri).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}: {:?}", a.body);
        pages += 1;
        for item in a.body["data"].as_array().unwrap() {
            ids.push(item["id"].as_str().unwrap().to_owned());
        }
        let more = a.body["hasMore"].as_bool().unwrap();
        assert_eq!(more, !a.body["nextCursor"].is_null(), "{:?}", a.body);
        if !more {
            return (ids, pages);
        }
        let sep = if first.contains('?') { '&' } else { '?' };
        uri = format!(
            "{first}{sep}cursor={}",
            a.body["nextCursor"].as_str().unwrap()
        );
    }
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// A walk of the operation and asset lists lists every item that existed when it began
/// exactly once, in `(createdAt, id)` order, while new operations are accepted between
/// its pages; an item accepted during the walk is listed at most once.
#[tokio::test]
async fn a_walk_lists_every_item_once_while_items_are_added() {
    let env = Env::new().await;
    for i in 0..7 {
        env.create_asset(&env.key_a, &format!("before-{i}")).await;
    }
    for (route, limit) in [("/v1/operations", 2), ("/v1/assets", 3)] {
        let before = walk(&env, &env.key_a, &format!("{route}?limit=200"))
            .await
            .0;
        assert!(before.len() >= 7, "{route}");
        let mut ids = Vec::new();
        let mut uri = format!("{route}?limit={limit}");
        let mut created = 0;
        loop {
            let a = env.get(&env.key_a, &uri).await;
            let data = a.body["data"].as_array().unwrap();
            assert!(data.len() <= limit, "{:?}", a.body);
            let mut last: Option<(DateTime<Utc>, String)> = None;
            for item in data {
                let key = (
                    time(&item["createdAt"]),
                    item["id"].as_str().unwrap().to_owned(),
                );
                if let Some(l) = &last {
                    assert!(*l < key, "{route}: out of order");
                }
                last = Some(key.clone());
                ids.push(key);
            }
            // Another operation (and asset) accepted between two pages.
            env.create_asset(&env.key_a, &format!("{route}-during-{created}"))
                .await;
            created += 1;
            if !a.body["hasMore"].as_bool().unwrap() {
                break;
            }
            uri = format!(
                "{route}?limit={limit}&cursor={}",
                a.body["nextCursor"].as_str().unwrap()
            );
        }
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ids, "{route}: pages out of order");
        let unique: HashSet<&String> = ids.iter().map(|(_, id)| id).collect();
        assert_eq!(unique.len(), ids.len(), "{route}: an item listed twice");
        for id in &before {
            assert!(unique.contains(id), "{route}: {id} missing");
        }
    }
}

/// Filters combine (state, kind, asset, created range); each state the API shows can
/// be listed; other organizations' operations are never listed, even by asset id.
#[tokio::test]
async fn filters_combine_and_stay_in_the_organization() {
    let env = Env::new().await;
    let _runner = runner(&env);
    let a1 = active_asset(&env, &env.key_a, "c-1").await;
    let a2 = active_asset(&env, &env.key_a, "c-2").await;
    let b1 = active_asset(&env, &env.key_b, "c-b").await;
    let mint = json!({"recipient": RECIPIENT, "amount": "5"});
    let m1 = post_wait(
        &env,
        &env.key_a,
        &format!("/v1/assets/{a1}/mint"),
        "m-1",
        &mint,
    )
    .await;
    assert_eq!(m1["state"], "completed", "{m1}");
    let p1 = post_wait(
        &env,
        &env.key_a,
        &format!("/v1/assets/{a1}/pause"),
        "p-1",
        &json!({}),
    )
    .await;
    assert_eq!(p1["state"], "failed", "{p1}");
    let t1 = post_wait(
        &env,
        &env.key_a,
        &format!("/v1/assets/{a1}/transfer"),
        "t-1",
        &mint,
    )
    .await;
    let t1 = until(&env, &env.key_a, t1["id"].as_str().unwrap(), |v| {
        v["state"] == "waiting"
    })
    .await;
    let u1 = env
        .post(
            &env.key_a,
            &format!("/v1/assets/{a1}/unpause"),
            Some("u-1"),
            &json!({}),
        )
        .await
        .body;
    let m2 = env
        .post(
            &env.key_a,
            &format!("/v1/assets/{a1}/mint"),
            Some("m-2"),
            &mint,
        )
        .await
        .body;
    let m2 = until(&env, &env.key_a, m2["id"].as_str().unwrap(), |v| {
        v["state"] == "queued"
    })
    .await;
    let m3 = post_wait(
        &env,
        &env.key_a,
        &format!("/v1/assets/{a2}/mint"),
        "m-3",
        &mint,
    )
    .await;
    let mb = post_wait(
        &env,
        &env.key_b,
        &format!("/v1/assets/{b1}/mint"),
        "m-b",
        &mint,
    )
    .await;
    assert_eq!(mb["state"], "completed");

    let id = |v: &Value| v["id"].as_str().unwrap().to_owned();
    let list = |q: String| {
        let env = &env;
        async move { walk(env, &env.key_a, &format!("/v1/operations{q}")).await.0 }
    };
    let all = list(String::new()).await;
    assert_eq!(all.len(), 2 + 6, "two creations and six token operations");
    assert!(
        !all.contains(&id(&mb)),
        "another organization's operation listed"
    );
    assert_eq!(
        list("?state=completed&kind=asset.mint".into()).await,
        vec![id(&m1), id(&m3)]
    );
    assert_eq!(
        list(format!("?state=completed&kind=asset.mint&assetId={a1}")).await,
        vec![id(&m1)]
    );
    assert_eq!(list("?state=failed".into()).await, vec![id(&p1)]);
    assert_eq!(list("?state=waiting".into()).await, vec![id(&t1)]);
    assert_eq!(list("?state=running".into()).await, vec![id(&u1)]);
    assert_eq!(list("?state=queued".into()).await, vec![id(&m2)]);
    assert!(list("?state=cancelled".into()).await.is_empty());
    assert_eq!(list(format!("?assetId={a2}")).await.len(), 2);
    assert_eq!(
        list("?kind=asset.create&state=completed".into())
            .await
            .len(),
        2
    );
    // Another organization's asset: nothing, not an error.
    assert!(list(format!("?assetId={b1}")).await.is_empty());
    let b_list = walk(&env, &env.key_b, "/v1/operations").await.0;
    assert_eq!(b_list.len(), 2);
    assert!(b_list.iter().all(|i| !all.contains(i)));
    // The created range: strictly after the pause's and strictly before the third mint's.
    let after = p1["createdAt"].as_str().unwrap().replace('+', "%2B");
    let before = m3["createdAt"].as_str().unwrap().replace('+', "%2B");
    assert_eq!(
        list(format!("?createdAfter={after}&createdBefore={before}")).await,
        vec![id(&t1), id(&u1), id(&m2)]
    );
    assert_eq!(
        list(format!("?createdAfter={after}&kind=asset.mint&limit=1")).await,
        vec![id(&m2), id(&m3)]
    );
}

/// Timestamps are present and ordered; `completedAt` exactly on terminal operations;
/// each kind's result has its shape; the asset shows its issuer (checksummed, as every
/// address: `doc_check` refuses any other form).
#[tokio::test]
async fn timestamps_results_and_the_issuer() {
    let env = Env::new().await;
    let _runner = runner(&env);
    let a1 = active_asset(&env, &env.key_a, "c-1").await;
    let mint = json!({"recipient": RECIPIENT, "amount": "5"});
    post_wait(
        &env,
        &env.key_a,
        &format!("/v1/assets/{a1}/mint"),
        "m-1",
        &mint,
    )
    .await;
    post_wait(
        &env,
        &env.key_a,
        &format!("/v1/assets/{a1}/pause"),
        "p-1",
        &json!({}),
    )
    .await;
    env.post(
        &env.key_a,
        &format!("/v1/assets/{a1}/unpause"),
        Some("u-1"),
        &json!({}),
    )
    .await;

    let page = env.get(&env.key_a, "/v1/operations").await.body;
    let ops = page["data"].as_array().unwrap();
    assert_eq!(ops.len(), 4);
    let mut kinds = HashMap::new();
    for op in ops {
        let created = time(&op["createdAt"]);
        assert_eq!(created, time(&op["milestones"]["accepted"]));
        assert!(created <= time(&op["updatedAt"]), "{op}");
        let terminal =
            ["completed", "failed", "cancelled"].contains(&op["state"].as_str().unwrap());
        assert_eq!(terminal, !op["completedAt"].is_null(), "{op}");
        if terminal {
            assert!(created <= time(&op["completedAt"]), "{op}");
            assert!(time(&op["completedAt"]) <= time(&op["updatedAt"]), "{op}");
        }
        if op["state"] == "completed" {
            assert_eq!(op["result"]["kind"], op["kind"], "{op}");
        } else {
            assert!(op["result"].is_null(), "{op}");
        }
        kinds.insert(op["kind"].as_str().unwrap().to_owned(), op.clone());
    }
    let create = &kinds["asset.create"];
    let token = keel_api::dto::address_text(token_of(a1.parse().unwrap()));
    assert_eq!(create["result"]["tokenAddress"], token.as_str());
    assert_eq!(create["result"]["indexedBlock"], 7);
    assert_eq!(
        create["progress"]["token"],
        token.as_str(),
        "progress checksummed"
    );
    assert_eq!(create["milestones"]["indexed"]["block"], 7);
    assert_eq!(create["milestones"]["indexed"]["at"], create["completedAt"]);
    let minted = &kinds["asset.mint"];
    assert_eq!(minted["result"]["block"], 8);
    assert_eq!(minted["result"]["txHash"], format!("0x{}", "3c".repeat(32)));
    assert_eq!(kinds["asset.pause"]["error"]["code"], "EXECUTION_REVERTED");

    let asset = env.get(&env.key_a, &format!("/v1/assets/{a1}")).await.body;
    let issuer: Address = ISSUER.parse().unwrap();
    assert_eq!(
        asset["issuerAddress"],
        keel_api::dto::address_text(issuer).as_str()
    );
    assert_eq!(asset["tokenAddress"], token.as_str());
    assert!(time(&asset["createdAt"]) <= time(&asset["updatedAt"]));
    assert!(
        time(&asset["updatedAt"]) >= time(&create["completedAt"]),
        "the asset's record changed when its creation completed"
    );
    let listed = env.get(&env.key_a, "/v1/assets").await.body;
    assert_eq!(listed["data"][0], asset);
}

/// `GET /v1/templates` pages through the organization's templates by id with their
/// timestamps; a replaced template keeps `createdAt` and moves `updatedAt`.
#[tokio::test]
async fn templates_are_listed_by_id_with_their_timestamps() {
    let env = Env::new().await;
    let org_a: Uuid = sqlx::query_scalar("SELECT id FROM organization WHERE name = 'org-a'")
        .fetch_one(env.db.pool())
        .await
        .unwrap();
    let t = |id: &str| Template {
        id: id.to_owned(),
        chain_id: 31337,
        price_decimals: 8,
        staleness_bound_seconds: 60,
        mint_approval_threshold: None,
        approval_ttl_seconds: 60,
        funding_pause: true,
        funding_deadline_seconds: 60,
        sender: None,
        forced_transfer_skips_compliance: false,
        batch_max_recipients: keel_workflows::tenancy::DEFAULT_BATCH_MAX_RECIPIENTS,
    };
    for id in ["zeta", "alpha", "mid.1"] {
        upsert_template(env.db.pool(), org_a, &t(id)).await.unwrap();
    }
    let (ids, pages) = walk(&env, &env.key_a, "/v1/templates?limit=2").await;
    assert_eq!(ids, vec!["alpha", TEMPLATE, "mid.1", "zeta"]);
    assert_eq!(pages, 2);
    let (b, _) = walk(&env, &env.key_b, "/v1/templates").await;
    assert_eq!(b, vec![TEMPLATE]);
    let first = env.get(&env.key_a, "/v1/templates?limit=1").await.body;
    let before = first["data"][0].clone();
    assert_eq!(before["id"], "alpha");
    assert_eq!(before["fundingPause"], true);
    assert!(before["mintApprovalThreshold"].is_null());
    upsert_template(env.db.pool(), org_a, &t("alpha"))
        .await
        .unwrap();
    let after = env.get(&env.key_a, "/v1/templates?limit=1").await.body["data"][0].clone();
    assert_eq!(after["createdAt"], before["createdAt"]);
    assert!(time(&after["updatedAt"]) > time(&before["updatedAt"]));
}

/// Bad `limit`, `cursor` and filter values answer `400` with a typed code and write or
/// read nothing else; a cursor of one list is refused by another.
#[tokio::test]
async fn bad_list_parameters_are_typed_400s() {
    let env = Env::new().await;
    env.create_asset(&env.key_a, "k-1").await;
    env.create_asset(&env.key_a, "k-2").await;
    let template_cursor = keel_api::page::encode_cursor(&"alpha");
    let asset_page = env.get(&env.key_a, "/v1/assets?limit=1").await.body;
    let asset_cursor = asset_page["nextCursor"].as_str().unwrap().to_owned();
    let far_past = keel_api::page::encode_cursor(&("-5000-01-01T00:00:00Z", Uuid::nil()));
    let bad_template = keel_api::page::encode_cursor(&"Not A Template");
    let cases: Vec<(String, &str)> = vec![
        ("/v1/operations?limit=0".into(), "INVALID_QUERY"),
        ("/v1/operations?limit=201".into(), "INVALID_QUERY"),
        ("/v1/operations?limit=ten".into(), "INVALID_QUERY"),
        ("/v1/operations?limit=-1".into(), "INVALID_QUERY"),
        ("/v1/assets?limit=99999999999".into(), "INVALID_QUERY"),
        ("/v1/templates?limit=0".into(), "INVALID_QUERY"),
        ("/v1/operations?state=done".into(), "INVALID_QUERY"),
        ("/v1/operations?state=Completed".into(), "INVALID_QUERY"),
        ("/v1/operations?kind=asset.melt".into(), "INVALID_QUERY"),
        ("/v1/operations?assetId=not-a-uuid".into(), "INVALID_QUERY"),
        (
            "/v1/operations?createdAfter=yesterday".into(),
            "INVALID_QUERY",
        ),
        (
            "/v1/operations?createdBefore=2026-13-01T00:00:00Z".into(),
            "INVALID_QUERY",
        ),
        (
            "/v1/operations?createdAfter=2026-12-01".into(),
            "INVALID_QUERY",
        ),
        (
            "/v1/operations?state=running&state=failed".into(),
            "INVALID_QUERY",
        ),
        ("/v1/operations?cursor=%25%25".into(), "INVALID_CURSOR"),
        ("/v1/operations?cursor=SECRETVALUE".into(), "INVALID_CURSOR"),
        (
            format!("/v1/operations?cursor={template_cursor}"),
            "INVALID_CURSOR",
        ),
        (
            format!("/v1/operations?cursor={far_past}"),
            "INVALID_CURSOR",
        ),
        (
            format!("/v1/templates?cursor={asset_cursor}"),
            "INVALID_CURSOR",
        ),
        (
            format!("/v1/templates?cursor={bad_template}"),
            "INVALID_CURSOR",
        ),
        (
            format!("/v1/assets?cursor={}", "A".repeat(600)),
            "INVALID_CURSOR",
        ),
    ];
    for (uri, code) in cases {
        let a = env.get(&env.key_a, &uri).await;
        assert_problem(&a, 400, code, &uri);
    }
    // A cursor of the asset list is the same keyset as the operation list's: accepted
    // (it is a position, not an authority), and still scoped to the caller.
    let a = env
        .get(&env.key_b, &format!("/v1/operations?cursor={asset_cursor}"))
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body["data"], json!([]));
    let unauth = env
        .send(axum::http::Method::GET, "/v1/operations", &[], None)
        .await;
    assert_problem(&unauth, 401, "UNAUTHENTICATED", "no key");
}

/// The document's checker refuses an address that is not EIP-55 checksummed (so every
/// answer checked by `doc_check` in these tests and the e2e tests has checksummed
/// addresses), and accepts the checksummed form.
#[test]
fn the_document_check_refuses_lowercase_addresses() {
    let doc = crate::common::doc();
    let check = |addr: &str| {
        // `Balance` holds an address; its schema admits both cases.
        let body = json!({
            "assetId": Uuid::nil(), "address": addr, "balance": "1",
            "balanceBaseUnits": "1", "indexedBlock": 1, "block": 1, "finalized": false,
            "indexDegraded": false, "indexRebuilding": false
        });
        doc.check(
            "GET",
            &format!("/v1/assets/{}/balances/{addr}", Uuid::nil()),
            200,
            Some("application/json"),
            &serde_json::to_vec(&body).unwrap(),
        )
    };
    let lower = RECIPIENT.to_lowercase();
    let e = check(&lower).unwrap_err();
    assert!(e.contains("not EIP-55 checksummed"), "{e}");
    check(RECIPIENT).unwrap();
}

/// Issue 23: a key issued to a named person records its commands as `USER`; the
/// operation's history lists every entry oldest first with its actor and state, pages
/// by cursor, stays in the organization, and refuses a foreign cursor.
#[tokio::test]
async fn history_of_an_operation_started_by_a_key_issued_to_a_person() {
    let env = Env::new().await;
    let _runner = runner(&env);
    let created = env
        .post(
            &env.key_a,
            "/v1/api-keys",
            None,
            &json!({"label": "alice's key", "scopes": ["read", "operate"], "issuedTo": "employee-4711"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    assert_eq!(
        created.body["apiKey"]["issuedTo"], "employee-4711",
        "{:?}",
        created.body
    );
    let token = created.body["token"].as_str().unwrap().to_owned();
    let op = post_wait(&env, &token, "/v1/assets", "h-1", &asset_body("Alpha")).await;
    assert_eq!(op["state"], "completed", "{op}");
    let id = op["id"].as_str().unwrap();
    let view = env.get(&token, &format!("/v1/operations/{id}")).await;
    assert_eq!(
        view.body["attribution"]["startedBy"]["actor"]["kind"], "USER",
        "{:?}",
        view.body
    );
    assert_eq!(
        view.body["attribution"]["startedBy"]["actor"]["id"],
        "employee-4711"
    );

    // Page through the history two entries at a time.
    let mut entries: Vec<Value> = Vec::new();
    let mut uri = format!("/v1/operations/{id}/history?limit=2");
    loop {
        let a = env.get(&token, &uri).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}: {:?}", a.body);
        entries.extend(a.body["data"].as_array().unwrap().iter().cloned());
        match a.body["nextCursor"].as_str() {
            Some(c) => uri = format!("/v1/operations/{id}/history?limit=2&cursor={c}"),
            None => break,
        }
    }
    assert!(entries.len() >= 3, "{entries:?}");
    let seqs: Vec<i64> = entries.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    assert_eq!(entries[0]["kind"], "command_received");
    assert_eq!(entries[0]["actor"]["kind"], "USER");
    assert_eq!(entries[0]["actor"]["id"], "employee-4711");
    assert_eq!(entries[0]["actor"]["status"], "VERIFIED");
    let last = entries.last().unwrap();
    assert_eq!(last["kind"], "completed", "{entries:?}");
    assert_eq!(last["state"]["status"], "completed", "{last}");
    assert!(
        entries.iter().any(|e| e["kind"] == "step_recorded"),
        "{entries:?}"
    );

    // Another organization's key: not found; a foreign cursor: a typed 400.
    let other = env
        .get(&env.key_b, &format!("/v1/operations/{id}/history"))
        .await;
    assert_problem(
        &other,
        404,
        "NOT_FOUND",
        "history of another organization's operation",
    );
    let bad = env
        .get(
            &token,
            &format!("/v1/operations/{id}/history?cursor=bm90LWpzb24"),
        )
        .await;
    assert_problem(&bad, 400, "INVALID_CURSOR", "history with a foreign cursor");
    let bad = env
        .get(&token, &format!("/v1/operations/{id}/history?limit=0"))
        .await;
    assert_problem(&bad, 400, "INVALID_QUERY", "history with limit 0");
    // An `issuedTo` with a control character: a typed 422, nothing created.
    let refused = env
        .post(
            &env.key_a,
            "/v1/api-keys",
            None,
            &json!({"label": "x", "scopes": ["read"], "issuedTo": "bob\u{202e}"}),
        )
        .await;
    assert_problem(
        &refused,
        422,
        "INVALID_FIELD",
        "issuedTo with a bidi override",
    );
}

/// Issue 23, DEGRADED: a request authenticated, but when its command is recorded the
/// key's identity can no longer be fully established (the key was revoked in between):
/// the actor keeps the best-known kind and id, with status `DEGRADED`.
#[tokio::test]
async fn an_actor_whose_key_was_revoked_before_recording_is_degraded() {
    let env = Env::new().await;
    let pool = env.db.pool();
    let org = keel_workflows::tenancy::organization_by_name(pool, "org-a")
        .await
        .unwrap();
    let scopes = keel_workflows::Scopes::all();
    let person =
        keel_workflows::tenancy::create_api_key_issued(pool, org, "p", scopes, Some("employee-9"))
            .await
            .unwrap();
    let service = keel_workflows::tenancy::create_api_key_issued(pool, org, "s", scopes, None)
        .await
        .unwrap();
    let caller = |id| keel_workflows::Caller {
        organization_id: org,
        api_key_id: id,
    };
    let verified = keel_workflows::tenancy::caller_actor(pool, caller(person.id))
        .await
        .unwrap();
    assert_eq!(verified.kind(), keel_durable::ActorKind::User);
    assert_eq!(verified.id(), Some("employee-9"));
    assert_eq!(verified.status(), keel_durable::AttributionStatus::Verified);
    let s = keel_workflows::tenancy::caller_actor(pool, caller(service.id))
        .await
        .unwrap();
    assert_eq!(s.kind(), keel_durable::ActorKind::Service);
    assert_eq!(s.status(), keel_durable::AttributionStatus::Verified);
    for id in [person.id, service.id] {
        keel_workflows::tenancy::revoke_api_key(pool, org, id)
            .await
            .unwrap();
    }
    let p = keel_workflows::tenancy::caller_actor(pool, caller(person.id))
        .await
        .unwrap();
    assert_eq!(
        (p.kind(), p.id()),
        (keel_durable::ActorKind::User, Some("employee-9"))
    );
    assert_eq!(p.status(), keel_durable::AttributionStatus::Degraded);
    let s = keel_workflows::tenancy::caller_actor(pool, caller(service.id))
        .await
        .unwrap();
    let sid = service.id.to_string();
    assert_eq!(
        (s.kind(), s.id()),
        (keel_durable::ActorKind::Service, Some(sid.as_str()))
    );
    assert_eq!(s.status(), keel_durable::AttributionStatus::Degraded);
    // A stored issuedTo that does not survive sanitizing (written outside the service).
    let raw = keel_workflows::tenancy::create_api_key_issued(pool, org, "r", scopes, None)
        .await
        .unwrap();
    sqlx::query("UPDATE api_key SET issued_to = 'eve' || chr(8238) WHERE id = $1")
        .bind(raw.id)
        .execute(pool)
        .await
        .unwrap();
    let r = keel_workflows::tenancy::caller_actor(pool, caller(raw.id))
        .await
        .unwrap();
    assert_eq!(
        (r.kind(), r.id()),
        (keel_durable::ActorKind::User, Some("eve"))
    );
    assert_eq!(r.status(), keel_durable::AttributionStatus::Degraded);
}
