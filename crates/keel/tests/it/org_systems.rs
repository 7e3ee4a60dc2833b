//! Organization systems (issue 37 §1) end to end: deployments through the API, a runner
//! aborted at every step of the deployment (between the scope writes too), a
//! redeployment accepted while one is in flight, and the abandonment sweep finding
//! deployments whose execution is gone. After each, the Ledger Index's scope equals
//! what the chain (`SystemFactory.systemOf`) and the organization's record say.

use crate::e2e::{Stack, TemplateOpts, state, terminal};
use alloy::primitives::Address;
use anvil_tests::TestChain;
use keel_abi::bindings::{RegulatedToken, SystemFactory};
use keel_workflows::workflows::org_system::{CRASH_POINTS, onchain_organization_id};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;
use uuid::Uuid;

const WITHIN: Duration = Duration::from_secs(120);

async fn org_id(stack: &Stack, name: &str) -> Uuid {
    sqlx::query_scalar("SELECT id FROM organization WHERE name = $1")
        .bind(name)
        .fetch_one(stack.db.pool())
        .await
        .unwrap()
}

/// `POST /v1/organizations/{org}/system` on the stack's chain; the operation id.
async fn deploy(stack: &Stack, org: Uuid, idem: &str) -> String {
    let (status, view) = stack
        .post(
            &stack.key_a,
            &format!("/v1/organizations/{org}/system"),
            idem,
            json!({ "chainId": stack.chain.chain_id() }),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {view}");
    assert_eq!(view["kind"], "organization.system", "{view}");
    assert!(view["assetId"].is_null(), "{view}");
    view["id"].as_str().unwrap().to_owned()
}

async fn systems(stack: &Stack, org: Uuid) -> Vec<Value> {
    let (status, list) = stack
        .get(&stack.key_a, &format!("/v1/organizations/{org}/systems"))
        .await;
    assert_eq!(status, 200, "{list}");
    list["data"].as_array().unwrap().clone()
}

fn address(v: &Value) -> Option<Address> {
    v.as_str().map(|s| s.parse().unwrap())
}

/// The organization's asset factories in the live index scope.
async fn factories_in_scope(stack: &Stack, org: Uuid) -> BTreeSet<Address> {
    let rows: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT address FROM index_scope WHERE chain_id = $1 AND kind = 'asset_factory'
            AND organization = $2 AND removed_at IS NULL",
    )
    .bind(i64::try_from(stack.chain.chain_id()).unwrap())
    .bind(org.to_string())
    .fetch_all(stack.db.pool())
    .await
    .unwrap();
    rows.iter().map(|a| Address::from_slice(a)).collect()
}

async fn token_in_scope(stack: &Stack, token: Address) -> bool {
    sqlx::query_scalar(
        "SELECT count(*) = 1 FROM index_scope WHERE chain_id = $1 AND address = $2
            AND kind = 'asset_token' AND removed_at IS NULL",
    )
    .bind(i64::try_from(stack.chain.chain_id()).unwrap())
    .bind(token.as_slice())
    .fetch_one(stack.db.pool())
    .await
    .unwrap()
}

/// The invariant after every scenario: the organization carries exactly one system (the
/// one named `current`), `active`; the scope holds its factory (when enabled) and no
/// other factory of the organization; every system with contracts is recorded on chain
/// under its serial with the same addresses; nothing is left `deploying`.
async fn assert_consistent(stack: &Stack, org: Uuid, current: &str) -> Vec<Value> {
    let list = systems(stack, org).await;
    let carried: Vec<&Value> = list.iter().filter(|s| s["current"] == true).collect();
    assert_eq!(carried.len(), 1, "{list:?}");
    let carried = carried[0];
    assert_eq!(carried["id"], current, "{list:?}");
    assert_eq!(carried["state"], "active", "{list:?}");
    let want: BTreeSet<Address> = if carried["enabled"] == true {
        address(&carried["factoryAddress"]).into_iter().collect()
    } else {
        BTreeSet::new()
    };
    assert_eq!(factories_in_scope(stack, org).await, want, "{list:?}");
    let registry = SystemFactory::new(stack.contracts["systemFactory"], stack.chain.provider());
    for s in &list {
        assert_ne!(s["state"], "deploying", "{list:?}");
        if s["id"] != current {
            assert!(s["state"] == "replaced" || s["state"] == "failed", "{s}");
        }
        let on_chain = registry
            .systemOf(onchain_organization_id(org), s["serial"].as_u64().unwrap())
            .call()
            .await
            .unwrap();
        match address(&s["factoryAddress"]) {
            Some(factory) => {
                assert_eq!(on_chain.factory, factory, "{s}");
                assert_eq!(
                    Some(on_chain.registry),
                    address(&s["registryAddress"]),
                    "{s}"
                );
                assert_eq!(
                    Some(on_chain.compliance),
                    address(&s["complianceAddress"]),
                    "{s}"
                );
            }
            None => assert_eq!(on_chain.factory, Address::ZERO, "{s}"),
        }
    }
    list
}

/// Waits until the sweep declared system `id` failed; its `failure`.
async fn swept(stack: &Stack, org: Uuid, id: &str) -> Value {
    stack
        .until(
            WITHIN,
            "the sweep declares the deployment failed",
            || async move {
                systems(stack, org)
                    .await
                    .iter()
                    .find(|s| s["id"] == id && s["state"] == "failed")
                    .map(|s| s["failure"].clone())
            },
        )
        .await
}

async fn completed(stack: &Stack, op: &str) -> Value {
    let done = stack.await_op(op, WITHIN, terminal).await;
    assert_eq!(state(&done), "completed", "{done}\n{}", stack.logs());
    done
}

/// A runner aborted (as by kill -9) at each of the deployment's steps — after its
/// transaction landed, after the addresses were recorded, after the settings step read
/// the organization's system, after it took the old system out of the scope, after it
/// put the new one in, and after it wrote the organization's record — and started again
/// finishes the redeployment with one system on chain per deployment; the scope holds
/// exactly the system the organization carries, and the asset of the first system
/// stays indexed after its factory left the scope. A redeployment accepted while
/// another is in flight runs after it and replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_at_every_step_of_a_redeployment_leaves_the_scope_equal_to_the_record() {
    let chain = TestChain::start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let org = org_id(&stack, "acme").await;

    // Another organization's id is not found; a chain that was not bootstrapped is refused.
    let other = org_id(&stack, "other").await;
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/organizations/{other}/system"),
            "sys-other",
            json!({ "chainId": stack.chain.chain_id() }),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{body}"
    );
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/organizations/{org}/system"),
            "sys-nochain",
            json!({ "chainId": 999_999 }),
        )
        .await;
    assert_eq!(status, 422, "{body}");

    let first = deploy(&stack, org, "sys-1").await;
    let done = completed(&stack, &first).await;
    assert!(done["result"]["replaced"].is_null(), "{done}");
    let list = assert_consistent(&stack, org, &first).await;
    let compliance1 = address(&list[0]["complianceAddress"]).unwrap();

    // An asset created now goes through the organization's factory: a RegulatedToken
    // bound to the system's compliance contract.
    let (asset, token) = stack.create_active_asset("create-reg-1", "REG1").await;
    let reg = RegulatedToken::new(token, stack.chain.provider());
    assert_eq!(reg.compliance().call().await.unwrap(), compliance1);
    assert!(token_in_scope(&stack, token).await);

    let mut previous = first.clone();
    for (i, point) in CRASH_POINTS.iter().enumerate() {
        stack.kill9("runner");
        stack.spawn_with(
            "runner",
            "runner",
            &[("KEEL_CRASH_AT".to_owned(), (*point).to_owned())],
        );
        let op = deploy(&stack, org, &format!("sys-crash-{i}")).await;
        let status = stack.await_exit("runner", WITHIN).await;
        assert!(!status.success(), "{point}: {status}");
        assert!(
            stack
                .log("runner")
                .contains(&format!("aborting at {point}")),
            "{point}\n{}",
            stack.logs()
        );
        stack.spawn("runner");
        let done = completed(&stack, &op).await;
        assert_eq!(
            done["result"]["replaced"],
            previous.as_str(),
            "{point}: {done}"
        );
        assert_consistent(&stack, org, &op).await;
        previous = op;
    }
    // Seven deployments, seven systems on chain, serials 1..=7.
    let list = systems(&stack, org).await;
    let serials: BTreeSet<u64> = list.iter().map(|s| s["serial"].as_u64().unwrap()).collect();
    assert_eq!(serials, (1..=7).collect(), "{list:?}");

    // The first system's token is still indexed: a mint through it shows in its holders.
    assert!(token_in_scope(&stack, token).await);
    let holder = stack.chain.account(4).unwrap();
    let mint = stack
        .token_op(
            &asset,
            "mint",
            "mint-reg-1",
            json!({"recipient": holder.to_string(), "amount": "5"}),
        )
        .await;
    completed(&stack, &mint).await;
    let (status, holders) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}/holders"))
        .await;
    assert_eq!(status, 200, "{holders}");
    assert!(
        holders["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["address"] == holder.to_string()),
        "{holders}"
    );

    // Two redeployments accepted while the runner is down run one after the other.
    stack.kill9("runner");
    let a = deploy(&stack, org, "sys-a").await;
    let b = deploy(&stack, org, "sys-b").await;
    stack.spawn("runner");
    let done_a = completed(&stack, &a).await;
    let done_b = completed(&stack, &b).await;
    // The later accepted wins whatever order their settings steps ran in: either `b`
    // replaced `a`, or `a` found `b` carried already and stayed out (superseded).
    if done_a["result"]["supersededBy"] == b.as_str() {
        assert!(done_a["result"]["replaced"].is_null(), "{done_a}");
        assert_eq!(done_b["result"]["replaced"], previous.as_str(), "{done_b}");
    } else {
        assert_eq!(done_a["result"]["replaced"], previous.as_str(), "{done_a}");
        assert_eq!(done_b["result"]["replaced"], a.as_str(), "{done_b}");
    }
    assert_consistent(&stack, org, &b).await;
}

/// The abandonment sweep: a deployment cancelled after its settings step had already
/// taken the old system out of the scope and put the new one in, and a deployment whose
/// durable execution was dropped after its contracts landed, are declared `failed`
/// (`EXECUTION_GONE`) by the runner's sweep, which takes them out of the scope and puts
/// the system the organization carries back; an operator switches a system off (out of
/// the scope, asset creations refused `SYSTEM_DISABLED`) and on again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_fails_deployments_whose_execution_is_gone_and_restores_the_scope() {
    let chain = TestChain::start().await.unwrap();
    let mut stack = Stack::start_with(
        chain,
        TemplateOpts::default(),
        vec![
            (
                "KEEL__ORGANIZATIONS__SWEEPINTERVALSECONDS".into(),
                "1".into(),
            ),
            (
                "KEEL__ORGANIZATIONS__ABANDONAFTERSECONDS".into(),
                "2".into(),
            ),
        ],
    )
    .await;
    let org = org_id(&stack, "acme").await;
    let first = deploy(&stack, org, "sys-1").await;
    completed(&stack, &first).await;
    assert_consistent(&stack, org, &first).await;

    // 1. Aborted after the settings step put the new system in the scope (the old one
    //    is out of it), then cancelled while no runner runs it.
    stack.kill9("runner");
    stack.spawn_with(
        "runner",
        "runner",
        &[(
            "KEEL_CRASH_AT".to_owned(),
            "org-system.new-in-scope".to_owned(),
        )],
    );
    let cancelled = deploy(&stack, org, "sys-cancelled").await;
    stack.await_exit("runner", WITHIN).await;
    let mid: BTreeSet<Address> = factories_in_scope(&stack, org).await;
    assert_eq!(
        mid.len(),
        1,
        "only the new factory is in the scope mid-step"
    );
    let (status, view) = stack
        .post(
            &stack.key_a,
            &format!("/v1/operations/{cancelled}/cancel"),
            "cancel",
            json!({}),
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {view}");
    stack.spawn("runner");
    let failure = swept(&stack, org, &cancelled).await;
    assert_eq!(failure, "EXECUTION_GONE");
    assert_consistent(&stack, org, &first).await;

    // 2. Aborted after its contracts were recorded; its durable execution is dropped.
    stack.kill9("runner");
    stack.spawn_with(
        "runner",
        "runner",
        &[("KEEL_CRASH_AT".to_owned(), "org-system.recorded".to_owned())],
    );
    let dropped = deploy(&stack, org, "sys-dropped").await;
    stack.await_exit("runner", WITHIN).await;
    let deleted = sqlx::query(
        "DELETE FROM durable_instance WHERE id = (SELECT instance_id FROM operation WHERE id = $1)",
    )
    .bind(Uuid::parse_str(&dropped).unwrap())
    .execute(stack.db.pool())
    .await
    .unwrap();
    assert_eq!(deleted.rows_affected(), 1);
    stack.spawn("runner");
    let failure = swept(&stack, org, &dropped).await;
    assert_eq!(failure, "EXECUTION_GONE");
    let list = assert_consistent(&stack, org, &first).await;
    let gone = list.iter().find(|s| s["id"] == dropped.as_str()).unwrap();
    assert!(
        gone["factoryAddress"].is_string(),
        "its contracts landed: {gone}"
    );

    // 3. A new deployment after the failures replaces the first system.
    let next = deploy(&stack, org, "sys-next").await;
    let done = completed(&stack, &next).await;
    assert_eq!(done["result"]["replaced"], first.as_str(), "{done}");
    let list = assert_consistent(&stack, org, &next).await;
    assert_eq!(
        list.iter().filter(|s| s["state"] == "failed").count(),
        2,
        "{list:?}"
    );

    // 4. The operator's switch: off takes the factory out of the scope and refuses
    //    asset creations; on puts it back.
    let path = format!("/v1/organizations/{org}/systems/{next}");
    let (status, off) = stack
        .post(&stack.key_a, &format!("{path}/disable"), "off", json!({}))
        .await;
    assert_eq!(
        (status, off["enabled"].as_bool()),
        (200, Some(false)),
        "{off}"
    );
    assert!(factories_in_scope(&stack, org).await.is_empty());
    let (status, refused) = stack
        .post(
            &stack.key_a,
            "/v1/assets",
            "create-off",
            json!({"name": "Off", "symbol": "OFF", "decimals": 6,
                   "templateId": "std", "initialPrice": "1"}),
        )
        .await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (409, Some("SYSTEM_DISABLED")),
        "{refused}"
    );
    let (status, on) = stack
        .post(&stack.key_a, &format!("{path}/enable"), "on", json!({}))
        .await;
    assert_eq!((status, on["enabled"].as_bool()), (200, Some(true)), "{on}");
    assert_consistent(&stack, org, &next).await;
    // A system whose contracts never landed has nothing to switch; an unknown one is 404.
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/organizations/{org}/systems/{}/disable", Uuid::new_v4()),
            "off-2",
            json!({}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
}

/// Sets `asset`'s compliance rules and waits until the operation completed.
async fn set_rules(stack: &Stack, asset: &str, idem: &str, rules: Value) {
    let (status, view) = try_op(stack, asset, "set-compliance", idem, rules).await;
    assert!(status == 202 || status == 200, "{view}");
    completed(stack, view["id"].as_str().unwrap()).await;
}

/// `POST` a token operation of `asset`; the answer's status and body.
async fn try_op(stack: &Stack, asset: &str, what: &str, idem: &str, body: Value) -> (u16, Value) {
    stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/{what}"),
            idem,
            body,
        )
        .await
}

/// Issue 37 §2: every rule of an asset's compliance contract — eligible holders only
/// (unregistered, attested ineligible, expired), a country deny list and allow list, a
/// per-holder maximum balance, a maximum holder count and a transfer lock-up — refuses
/// a mint or transfer at the API with its typed code (nothing accepted, no gas spent),
/// and a race that passes the pre-check (two mints accepted against the same balance)
/// ends on chain as a failed operation with the same code; the token's balances are
/// exactly what the accepted operations minted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compliance_rules_refuse_at_the_api_and_on_chain_with_the_same_code() {
    let chain = TestChain::start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let org = org_id(&stack, "acme").await;

    // An asset on the platform factory has no rules.
    let (plain, _) = stack.create_active_asset("create-plain", "PLN").await;
    let (status, body) = try_op(&stack, &plain, "set-compliance", "c-plain", json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("ASSET_NOT_REGULATED")),
        "{body}"
    );
    // No system yet: investors cannot be written.
    let chain_id = stack.chain.chain_id();
    let investor = |addr: Address, eligible: bool, country: &str, expires: u64| {
        json!({"chainId": chain_id, "address": addr.to_string(), "eligible": eligible,
               "countryCode": country, "expiresAt": expires})
    };
    let a = stack.chain.account(4).unwrap();
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/organizations/{org}/investors"),
            "inv-early",
            investor(a, true, "840", 0),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("SYSTEM_NOT_DEPLOYED")),
        "{body}"
    );

    let sys = deploy(&stack, org, "sys-1").await;
    completed(&stack, &sys).await;
    let (asset, token) = stack.create_active_asset("create-reg", "REG").await;

    // Investors: A (US), B (Germany), C (expired), D never registered, E ineligible.
    let b = stack.chain.account(5).unwrap();
    let c = stack.chain.account(6).unwrap();
    let d = stack.chain.account(7).unwrap();
    let e = stack.chain.account(8).unwrap();
    for (i, (addr, eligible, country, expires)) in [
        (a, true, "840", 0),
        (b, true, "276", 0),
        (c, true, "840", 1),
        (e, false, "840", 0),
    ]
    .into_iter()
    .enumerate()
    {
        let (status, view) = stack
            .post(
                &stack.key_a,
                &format!("/v1/organizations/{org}/investors"),
                &format!("inv-{i}"),
                investor(addr, eligible, country, expires),
            )
            .await;
        assert!(status == 202 || status == 200, "{view}");
        assert_eq!(view["kind"], "investor.set");
        completed(&stack, view["id"].as_str().unwrap()).await;
    }

    let refused = |status: u16, body: &Value, code: &str| {
        assert_eq!((status, body["code"].as_str()), (422, Some(code)), "{body}");
    };
    let mint = |to: Address, amount: &str| json!({"recipient": to.to_string(), "amount": amount});

    // Eligible holders only.
    set_rules(&stack, &asset, "r-1", json!({"eligibleOnly": true})).await;
    let (s, v) = try_op(&stack, &asset, "mint", "m-d", mint(d, "1")).await;
    refused(s, &v, "COMPLIANCE_NOT_ELIGIBLE");
    let (s, v) = try_op(&stack, &asset, "mint", "m-e", mint(e, "1")).await;
    refused(s, &v, "COMPLIANCE_NOT_ELIGIBLE");
    let (s, v) = try_op(&stack, &asset, "mint", "m-c", mint(c, "1")).await;
    refused(s, &v, "COMPLIANCE_EXPIRED");
    let ok = stack.token_op(&asset, "mint", "m-a", mint(a, "100")).await;
    completed(&stack, &ok).await;

    // Countries: a deny list, then an allow list.
    set_rules(
        &stack,
        &asset,
        "r-2",
        json!({"eligibleOnly": true, "countryMode": "deny", "countries": ["276"]}),
    )
    .await;
    let (s, v) = try_op(&stack, &asset, "mint", "m-b1", mint(b, "1")).await;
    refused(s, &v, "COMPLIANCE_COUNTRY_NOT_ALLOWED");
    set_rules(
        &stack,
        &asset,
        "r-3",
        json!({"countryMode": "allow", "countries": ["840", "250"]}),
    )
    .await;
    let (s, v) = try_op(&stack, &asset, "mint", "m-b2", mint(b, "1")).await;
    refused(s, &v, "COMPLIANCE_COUNTRY_NOT_ALLOWED");

    // A per-holder maximum (A holds 100).
    set_rules(&stack, &asset, "r-4", json!({"maxBalance": "150"})).await;
    let (s, v) = try_op(&stack, &asset, "mint", "m-a-max", mint(a, "51")).await;
    refused(s, &v, "COMPLIANCE_MAX_BALANCE");

    // A maximum holder count: A is the one holder.
    set_rules(&stack, &asset, "r-5", json!({"maxHolders": 1})).await;
    let (s, v) = try_op(&stack, &asset, "mint", "m-b3", mint(b, "1")).await;
    refused(s, &v, "COMPLIANCE_MAX_HOLDERS");
    let more = stack.token_op(&asset, "mint", "m-a-2", mint(a, "1")).await;
    completed(&stack, &more).await;

    // A lock-up: mints go on, transfers from the issuer's holdings are refused.
    let (_, view) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    let issuer: Address = view["issuerAddress"].as_str().unwrap().parse().unwrap();
    set_rules(
        &stack,
        &asset,
        "r-6",
        json!({"lockupUntil": 4_102_444_800u64}),
    )
    .await;
    let to_issuer = stack
        .token_op(&asset, "mint", "m-issuer", mint(issuer, "10"))
        .await;
    completed(&stack, &to_issuer).await;
    let (s, v) = try_op(&stack, &asset, "transfer", "t-a", mint(a, "1")).await;
    refused(s, &v, "COMPLIANCE_LOCKED_UP");

    // The race: two mints accepted against the same room under a maximum balance (the
    // runner is down, so both pass the pre-check at the same balance); the second is
    // refused on chain and fails with the same code.
    set_rules(&stack, &asset, "r-7", json!({"maxBalance": "171"})).await;
    stack.kill9("runner");
    let first = stack
        .token_op(&asset, "mint", "race-1", mint(a, "40"))
        .await;
    let second = stack
        .token_op(&asset, "mint", "race-2", mint(a, "40"))
        .await;
    stack.spawn("runner");
    completed(&stack, &first).await;
    let failed = stack.await_op(&second, WITHIN, terminal).await;
    assert_eq!(state(&failed), "failed", "{failed}");
    assert_eq!(
        failed["error"]["code"], "COMPLIANCE_MAX_BALANCE",
        "{failed}"
    );

    // On chain: exactly what the accepted operations minted.
    let reg = RegulatedToken::new(token, stack.chain.provider());
    let units =
        |n: u64| alloy::primitives::U256::from(n) * alloy::primitives::U256::from(1_000_000u64);
    assert_eq!(reg.balanceOf(a).call().await.unwrap(), units(141));
    assert_eq!(reg.balanceOf(issuer).call().await.unwrap(), units(10));
    for nobody in [b, c, d, e] {
        assert_eq!(
            reg.balanceOf(nobody).call().await.unwrap(),
            alloy::primitives::U256::ZERO
        );
    }
    assert_eq!(
        reg.holderCount().call().await.unwrap(),
        alloy::primitives::U256::from(2u64)
    );
}

/// The holder row of `holder` in `asset`'s holders page at the indexed tip.
async fn holder_row(stack: &Stack, asset: &str, holder: Address) -> Option<Value> {
    let (status, page) = stack
        .get(
            &stack.key_a,
            &format!("/v1/assets/{asset}/holders?limit=100"),
        )
        .await;
    assert_eq!(status, 200, "{page}");
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["address"].as_str().unwrap().parse::<Address>().unwrap() == holder)
        .cloned()
}

/// Issue 37 §3, the agent operations of a regulated asset end to end: a partial freeze
/// (the holders page shows the frozen amount), a forced transfer that releases frozen
/// tokens, an address freeze that makes a later mint fail on chain with
/// `ADDRESS_FROZEN`, an unfreeze above the frozen amount failing
/// `INVALID_FROZEN_AMOUNT`, a batch mint in one transaction, a batch transfer, bad batch
/// bodies refused, and a wallet recovery with the runner aborted (as by kill -9) after
/// each of its three writes — each write is sent once, the balance, the frozen amount
/// and the registry entry end on the new wallet, and the index agrees with the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_operations_freeze_force_batch_and_recover_exactly_once() {
    use alloy::providers::Provider;
    use alloy::sol_types::SolEvent;
    use keel_abi::bindings::IdentityRegistry;
    use keel_workflows::workflows::RECOVER_CRASH_POINTS;
    let chain = TestChain::start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let org = org_id(&stack, "acme").await;
    let sys = deploy(&stack, org, "sys-1").await;
    completed(&stack, &sys).await;
    let (asset, token) = stack.create_active_asset("create-reg", "AGT").await;
    let chain_id = stack.chain.chain_id();
    let [a, b, c, r1, r2, r3] = [4, 5, 6, 7, 8, 9].map(|i| stack.chain.account(i).unwrap());
    for (i, addr) in [a, b, c].into_iter().enumerate() {
        let (status, view) = stack
            .post(
                &stack.key_a,
                &format!("/v1/organizations/{org}/investors"),
                &format!("inv-{i}"),
                json!({"chainId": chain_id, "address": addr.to_string(), "eligible": true,
                       "countryCode": "840", "expiresAt": 0}),
            )
            .await;
        assert!(status == 202 || status == 200, "{view}");
        completed(&stack, view["id"].as_str().unwrap()).await;
    }
    set_rules(&stack, &asset, "rules", json!({"eligibleOnly": true})).await;
    let units =
        |n: u64| alloy::primitives::U256::from(n) * alloy::primitives::U256::from(1_000_000u64);
    let run = |what: &'static str, idem: &'static str, body: Value| {
        let stack = &stack;
        let asset = asset.clone();
        async move {
            let (status, view) = try_op(stack, &asset, what, idem, body).await;
            assert!(status == 202 || status == 200, "{what}: {view}");
            stack
                .await_op(view["id"].as_str().unwrap(), WITHIN, terminal)
                .await
        }
    };
    let ok = |v: &Value| assert_eq!(state(v), "completed", "{v}");

    // A batch mint: three recipients, one transaction.
    let batch = run(
        "batch-mint",
        "bm-1",
        json!({"recipients": [a.to_string(), b.to_string(), c.to_string()],
               "amounts": ["100", "50", "5"]}),
    )
    .await;
    ok(&batch);
    let reg = RegulatedToken::new(token, stack.chain.provider().clone());
    assert_eq!(reg.balanceOf(a).call().await.unwrap(), units(100));
    assert_eq!(reg.balanceOf(b).call().await.unwrap(), units(50));
    assert_eq!(reg.balanceOf(c).call().await.unwrap(), units(5));
    let tx: alloy::primitives::B256 = batch["result"]["txHash"].as_str().unwrap().parse().unwrap();
    let receipt = stack
        .chain
        .provider()
        .get_transaction_receipt(tx)
        .await
        .unwrap()
        .unwrap();
    let mints = receipt
        .inner
        .logs()
        .iter()
        .filter(|l| l.topic0() == Some(&RegulatedToken::Transfer::SIGNATURE_HASH))
        .count();
    assert_eq!(mints, 3, "one transaction carries the three mints");
    // Bad batch bodies: lists of different lengths, an empty batch, the zero address.
    for (i, body) in [
        json!({"recipients": [a.to_string()], "amounts": ["1", "2"]}),
        json!({"recipients": [], "amounts": []}),
        json!({"recipients": [Address::ZERO.to_string()], "amounts": ["1"]}),
    ]
    .into_iter()
    .enumerate()
    {
        let (status, v) = try_op(&stack, &asset, "batch-mint", &format!("bad-{i}"), body).await;
        assert!(status == 400 || status == 422, "{v}");
        assert_eq!(v["code"], "INVALID_FIELD", "{v}");
    }
    // A batch to an unregistered address is refused before acceptance.
    let (status, v) = try_op(
        &stack,
        &asset,
        "batch-mint",
        "bm-unreg",
        json!({"recipients": [a.to_string(), r1.to_string()], "amounts": ["1", "1"]}),
    )
    .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (422, Some("COMPLIANCE_NOT_ELIGIBLE")),
        "{v}"
    );

    // A partial freeze: the holders page shows it.
    ok(&run(
        "freeze",
        "fz-a",
        json!({"account": a.to_string(), "amount": "30"}),
    )
    .await);
    assert_eq!(reg.frozenAmount(a).call().await.unwrap(), units(30));
    let row = holder_row(&stack, &asset, a).await.unwrap();
    assert_eq!(
        (row["frozenBalance"].as_str(), row["frozen"].as_bool()),
        (Some("30"), Some(false)),
        "{row}"
    );
    // An unfreeze above the frozen amount fails typed on chain; nothing changes.
    let over = run(
        "unfreeze",
        "uf-over",
        json!({"account": a.to_string(), "amount": "31"}),
    )
    .await;
    assert_eq!(
        (state(&over), over["error"]["code"].as_str()),
        ("failed", Some("INVALID_FROZEN_AMOUNT")),
        "{over}"
    );
    // A forced transfer of 80 (70 free): 10 frozen tokens are released.
    ok(&run(
        "forced-transfer",
        "ft-1",
        json!({"from": a.to_string(), "recipient": b.to_string(), "amount": "80"}),
    )
    .await);
    assert_eq!(reg.balanceOf(a).call().await.unwrap(), units(20));
    assert_eq!(reg.frozenAmount(a).call().await.unwrap(), units(20));
    let row = holder_row(&stack, &asset, a).await.unwrap();
    assert_eq!(
        (row["balance"].as_str(), row["frozenBalance"].as_str()),
        (Some("20"), Some("20")),
        "{row}"
    );
    // A forced transfer to an unregistered address is refused (compliance applies).
    let (status, v) = try_op(
        &stack,
        &asset,
        "forced-transfer",
        "ft-unreg",
        json!({"from": b.to_string(), "recipient": r1.to_string(), "amount": "1"}),
    )
    .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (422, Some("COMPLIANCE_NOT_ELIGIBLE")),
        "{v}"
    );

    // An address freeze: a mint to it fails on chain with ADDRESS_FROZEN.
    ok(&run("freeze", "fz-b", json!({"account": b.to_string()})).await);
    assert!(reg.isFrozen(b).call().await.unwrap());
    assert_eq!(holder_row(&stack, &asset, b).await.unwrap()["frozen"], true);
    let refused = run(
        "mint",
        "m-b",
        json!({"recipient": b.to_string(), "amount": "1"}),
    )
    .await;
    assert_eq!(
        (state(&refused), refused["error"]["code"].as_str()),
        ("failed", Some("ADDRESS_FROZEN")),
        "{refused}"
    );
    ok(&run("unfreeze", "uf-b", json!({"account": b.to_string()})).await);
    assert!(!reg.isFrozen(b).call().await.unwrap());
    assert_eq!(
        holder_row(&stack, &asset, b).await.unwrap()["frozen"],
        false
    );

    // A batch transfer from the issuer's holdings (minted to it first).
    let (_, view) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    let issuer: Address = view["issuerAddress"].as_str().unwrap().parse().unwrap();
    let (status, v) = stack
        .post(
            &stack.key_a,
            &format!("/v1/organizations/{org}/investors"),
            "inv-issuer",
            json!({"chainId": chain_id, "address": issuer.to_string(), "eligible": true,
                   "countryCode": "840", "expiresAt": 0}),
        )
        .await;
    assert!(status == 202 || status == 200, "{v}");
    completed(&stack, v["id"].as_str().unwrap()).await;
    ok(&run(
        "mint",
        "m-issuer",
        json!({"recipient": issuer.to_string(), "amount": "10"}),
    )
    .await);
    ok(&run(
        "batch-transfer",
        "bt-1",
        json!({"recipients": [a.to_string(), c.to_string()], "amounts": ["3", "4"]}),
    )
    .await);
    assert_eq!(reg.balanceOf(issuer).call().await.unwrap(), units(3));
    assert_eq!(reg.balanceOf(a).call().await.unwrap(), units(23));
    assert_eq!(reg.balanceOf(c).call().await.unwrap(), units(9));

    // Wallet recovery with the runner aborted after each of its writes: a → r1 (abort
    // after the registry copy), r1 → r2 (after the recovery), r2 → r3 (after the
    // removal). Each chain of recoveries carries the balance and the frozen amount on.
    let registry: Vec<u8> = sqlx::query_scalar(
        "SELECT registry FROM organization_system WHERE organization_id = $1 AND state = 'active'",
    )
    .bind(org)
    .fetch_one(stack.db.pool())
    .await
    .unwrap();
    let registry = IdentityRegistry::new(
        Address::from_slice(&registry),
        stack.chain.provider().clone(),
    );
    let mut lost = a;
    for (i, (point, replacement)) in RECOVER_CRASH_POINTS.iter().zip([r1, r2, r3]).enumerate() {
        stack.kill9("runner");
        stack.spawn_with(
            "runner",
            "runner",
            &[("KEEL_CRASH_AT".to_owned(), (*point).to_owned())],
        );
        let (status, view) = try_op(
            &stack,
            &asset,
            "recover",
            ["rc-1", "rc-2", "rc-3"][i],
            json!({"lostWallet": lost.to_string(), "newWallet": replacement.to_string()}),
        )
        .await;
        assert!(status == 202 || status == 200, "{view}");
        let exit = stack.await_exit("runner", WITHIN).await;
        assert!(!exit.success(), "{point}: {exit}");
        assert!(
            stack
                .log("runner")
                .contains(&format!("aborting at {point}")),
            "{point}\n{}",
            stack.logs()
        );
        stack.spawn("runner");
        completed(&stack, view["id"].as_str().unwrap()).await;
        assert_eq!(
            reg.balanceOf(lost).call().await.unwrap(),
            alloy::primitives::U256::ZERO,
            "{point}"
        );
        assert_eq!(
            reg.balanceOf(replacement).call().await.unwrap(),
            units(23),
            "{point}"
        );
        assert_eq!(
            reg.frozenAmount(replacement).call().await.unwrap(),
            units(20),
            "{point}"
        );
        assert_eq!(
            reg.frozenAmount(lost).call().await.unwrap(),
            alloy::primitives::U256::ZERO
        );
        assert!(
            registry
                .investorOf(replacement)
                .call()
                .await
                .unwrap()
                .registered,
            "{point}"
        );
        assert!(
            !registry.investorOf(lost).call().await.unwrap().registered,
            "{point}"
        );
        let row = holder_row(&stack, &asset, replacement).await.unwrap();
        assert_eq!(
            (row["balance"].as_str(), row["frozenBalance"].as_str()),
            (Some("23"), Some("20")),
            "{row}"
        );
        assert!(holder_row(&stack, &asset, lost).await.is_none(), "{point}");
        // Each of the three writes was queued once.
        let op: Uuid = view["id"].as_str().unwrap().parse().unwrap();
        let writes: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM operation_tx t JOIN txq_request q ON q.id = t.txq_request_id
              WHERE t.operation_id = $1 AND q.verdict_kind = 'confirmed'",
        )
        .bind(op)
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
        assert_eq!(writes, 3, "{point}");
        lost = replacement;
    }
    // Supply on chain equals what was minted (nothing done twice).
    assert_eq!(reg.totalSupply().call().await.unwrap(), units(165));
}
