//! The main job end to end: the `keel` binary's three roles as separate processes
//! against a real PostgreSQL and a real Anvil, driven through the Platform API.

use crate::common::otlp;
use crate::common::stack::Procs;

use alloy::primitives::{Address, B256};
use alloy::providers::Provider;
use alloy::rpc::types::Filter;
use alloy::sol_types::SolEvent;
use anvil_tests::TestChain;
use keel_abi::bindings::{AssetFactory, AssetToken, PriceFeed, PriceFeedFactory, PriceResolver};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The full stack ([`Procs`]) with organizations `acme` (two keys) and `other` (one),
/// template `std` on chain `local`, and the platform contracts by name.
pub(crate) struct Stack {
    procs: Procs,
    /// Two keys of organization `acme`, one of organization `other`.
    pub(crate) key_a: String,
    pub(crate) key_b: String,
    pub(crate) key_other: String,
    pub(crate) contracts: HashMap<String, Address>,
}

impl std::ops::Deref for Stack {
    type Target = Procs;
    fn deref(&self) -> &Procs {
        &self.procs
    }
}

impl std::ops::DerefMut for Stack {
    fn deref_mut(&mut self) -> &mut Procs {
        &mut self.procs
    }
}

/// Template options for `keel template set`.
#[derive(Default)]
pub(crate) struct TemplateOpts {
    pub(crate) approval_threshold: Option<&'static str>,
    pub(crate) approval_ttl_seconds: Option<u64>,
    pub(crate) funding_pause: bool,
}

impl Stack {
    pub(crate) async fn start(chain: TestChain, template: TemplateOpts) -> Stack {
        Self::start_with(chain, template, Vec::new()).await
    }

    /// [`Stack::start`] with `extra` environment variables for every process.
    pub(crate) async fn start_with(
        chain: TestChain,
        template: TemplateOpts,
        extra: Vec<(String, String)>,
    ) -> Stack {
        let mut env: Vec<(String, String)> = vec![
            // Webhook endpoints served by a receiver in the test (loopback, http).
            ("KEEL__WEBHOOKS__ALLOWHTTP".into(), "true".into()),
            (
                "KEEL__WEBHOOKS__ALLOWPRIVATEADDRESSES".into(),
                "true".into(),
            ),
            ("KEEL__WEBHOOKS__RETRYINITIALMS".into(), "200".into()),
        ];
        env.extend(extra);
        let mut procs = Procs::new(chain, tempfile::tempdir().unwrap(), env).await;
        procs.show_log("indexer-2");
        let mut stack = Stack {
            procs,
            key_a: String::new(),
            key_b: String::new(),
            key_other: String::new(),
            contracts: HashMap::new(),
        };
        stack.bootstrap();
        stack.cli(&["org", "create", "--name", "acme"]);
        stack.cli(&["org", "create", "--name", "other"]);
        stack.key_a = stack.cli(&["api-key", "create", "--org", "acme", "--label", "a"]);
        stack.key_b = stack.cli(&["api-key", "create", "--org", "acme", "--label", "b"]);
        stack.key_other = stack.cli(&["api-key", "create", "--org", "other", "--label", "o"]);
        let mut args = vec![
            "template",
            "set",
            "--org",
            "acme",
            "--id",
            "std",
            "--chain",
            "local",
            "--staleness-bound-seconds",
            "86400",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        if let Some(t) = template.approval_threshold {
            args.extend(["--mint-approval-threshold".to_owned(), t.to_owned()]);
        }
        if let Some(t) = template.approval_ttl_seconds {
            args.extend(["--approval-ttl-seconds".to_owned(), t.to_string()]);
        }
        if template.funding_pause {
            args.extend([
                "--funding-pause".to_owned(),
                "--funding-deadline-seconds".to_owned(),
                "600".to_owned(),
            ]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        stack.cli(&refs);
        // Every other chain the environment configures (`KEEL__CHAINS__<NAME>__CHAINID`)
        // is bootstrapped too, with a template of acme named after it.
        let others: Vec<String> = stack
            .env
            .iter()
            .filter_map(|(k, _)| {
                k.strip_prefix("KEEL__CHAINS__")
                    .and_then(|k| k.strip_suffix("__CHAINID"))
                    .filter(|name| *name != "LOCAL")
                    .map(str::to_ascii_lowercase)
            })
            .collect();
        for name in &others {
            stack.cli(&["chain", "bootstrap", "--chain", name, "--deploy-erc4337"]);
            stack.cli(&[
                "template",
                "set",
                "--org",
                "acme",
                "--id",
                name,
                "--chain",
                name,
                "--staleness-bound-seconds",
                "86400",
            ]);
        }
        let rows: Vec<(String, Vec<u8>)> =
            sqlx::query_as("SELECT name, address FROM platform_contract")
                .fetch_all(stack.db.pool())
                .await
                .unwrap();
        stack.contracts = rows
            .into_iter()
            .map(|(n, a)| (n, Address::from_slice(&a)))
            .collect();
        stack.start_roles().await;
        stack
    }

    /// Polls the operation (read with acme's first key) until `done(view)` holds.
    pub(crate) async fn await_op(
        &self,
        id: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        self.procs.await_op(&self.key_a, id, within, done).await
    }

    async fn create_asset(&self, idem: &str, symbol: &str) -> (String, String) {
        let (status, body) = self
            .post(
                &self.key_a,
                "/v1/assets",
                idem,
                json!({"name": format!("{symbol} Fund"), "symbol": symbol, "decimals": 6,
                       "templateId": "std", "initialPrice": "101.25"}),
            )
            .await;
        assert!(status == 202 || status == 200, "{status} {body}");
        (
            body["id"].as_str().unwrap().to_owned(),
            body["assetId"].as_str().unwrap().to_owned(),
        )
    }

    async fn logs_of<E: SolEvent>(&self, emitter: Address) -> Vec<alloy::rpc::types::Log> {
        self.chain
            .provider()
            .get_logs(
                &Filter::new()
                    .address(emitter)
                    .event_signature(E::SIGNATURE_HASH)
                    .from_block(0),
            )
            .await
            .unwrap()
    }
}

/// A webhook receiver in the test: every delivery's body in arrival order (answers 200).
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    received: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
}

impl Hooks {
    /// Starts the receiver and registers it as an endpoint of acme (every event type).
    pub(crate) async fn register(stack: &Stack) -> Hooks {
        let hooks = Hooks::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route(
                "/hook",
                axum::routing::post(
                    |axum::extract::State(h): axum::extract::State<Hooks>, body: String| async move {
                        h.received
                            .lock()
                            .unwrap()
                            .push(serde_json::from_str(&body).unwrap_or(Value::Null));
                        axum::http::StatusCode::OK
                    },
                ),
            )
            .with_state(hooks.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let (status, body) = stack
            .post(
                &stack.key_a,
                "/v1/webhook-endpoints",
                "hook-1",
                json!({"url": url, "eventTypes": ["*"]}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        hooks
    }

    /// The distinct events (first arrival of each id) of operation `op`, in arrival order.
    fn of(&self, op: &str) -> Vec<Value> {
        let mut seen = std::collections::HashSet::new();
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["data"]["id"] == op && seen.insert(e["id"].to_string()))
            .cloned()
            .collect()
    }

    /// Waits (probe, 50 ms apart) until operation `op` has an event that `done` accepts;
    /// returns its events.
    async fn until(&self, op: &str, what: &str, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = self.of(op);
            if events.iter().any(&done) {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} event of {op} arrived: {:?}",
                types(&events)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect()
}

/// The operation's webhook events arrived in the order of its changes: `accepted`
/// first; each transaction `submitted` (reported in the queue's transaction of its
/// first broadcast: the data shows it broadcast and not yet confirmed) before its
/// `transaction_settled`, then `confirmed`; the last state change `completed`.
fn check_operation_events(events: &[Value]) {
    let t = types(events);
    assert_eq!(t.first(), Some(&"operation.accepted"), "{t:?}");
    let submitted: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "operation.submitted")
        .collect();
    let settled = t
        .iter()
        .filter(|x| **x == "operation.transaction_settled")
        .count();
    assert!(!submitted.is_empty(), "{t:?}");
    assert_eq!(
        submitted.len(),
        settled,
        "one submitted per transaction: {t:?}"
    );
    for (i, e) in submitted.iter().enumerate() {
        let m = &e["data"]["milestones"];
        let steps = |k: &str| -> Vec<String> {
            m[k].as_array()
                .unwrap()
                .iter()
                .map(|x| x["step"].as_str().unwrap().to_owned())
                .collect()
        };
        let confirmed = steps("confirmed");
        let fresh: Vec<&Value> = m["submitted"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| !confirmed.contains(&x["step"].as_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            fresh.len(),
            1,
            "submitted #{i}: one transaction in flight: {e}"
        );
        assert_eq!(fresh[0]["broadcast"], true, "{e}");
    }
    // Per transaction: submitted, settled, confirmed, in this order.
    let mut expect = [
        "operation.submitted",
        "operation.transaction_settled",
        "operation.confirmed",
    ]
    .iter()
    .cycle();
    let mut next = expect.next().unwrap();
    for x in t.iter().filter(|x| {
        matches!(
            **x,
            "operation.submitted" | "operation.transaction_settled" | "operation.confirmed"
        )
    }) {
        assert_eq!(x, next, "{t:?}");
        next = expect.next().unwrap();
    }
    let last_state = events
        .iter()
        .rev()
        .find(|e| e["type"] == "operation.state_changed")
        .unwrap();
    assert_eq!(last_state["data"]["state"], "completed", "{t:?}");
}

pub(crate) fn state(v: &Value) -> &str {
    v["state"].as_str().unwrap_or("")
}

pub(crate) fn terminal(v: &Value) -> bool {
    matches!(state(v), "completed" | "failed" | "cancelled")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_mint_transfer_and_read_back_from_the_index() {
    // `finalized` = head − 2 (Anvil: 2 × slots per epoch), so the bootstrap's blocks are
    // settled when the indexer starts and go through planned history ranges.
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await
        .unwrap();
    let stack = Stack::start(chain, TemplateOpts::default()).await;
    let (op, asset) = stack.create_asset("create-1", "ACME").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let steps: Vec<&str> = view["milestones"]["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "create-feed",
            "deploy-token",
            "submit-observation",
            "set-bound",
            "unpause"
        ]
    );
    assert!(
        view["milestones"]["indexed"]["block"].as_u64().is_some(),
        "{view}"
    );

    let (status, a) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(a["status"], "active", "{a}");
    assert_eq!(a["paused"], false, "{a}");
    assert_eq!(a["stalenessBoundSeconds"], "86400");
    assert_eq!(a["latestObservation"]["answer"], "10125000000", "{a}");
    // The issuer is the operator (account 0), checksummed; every write of the creation
    // has its block and times.
    let operator = stack.chain.account(0).unwrap();
    assert_eq!(
        a["issuerAddress"].as_str(),
        Some(operator.to_checksum(None).as_str()),
        "{a}"
    );
    for m in view["milestones"]["submitted"].as_array().unwrap() {
        assert!(m["block"].as_u64().is_some(), "{m}");
        let broadcast = m["broadcastAt"].as_str().unwrap();
        let confirmed = m["confirmedAt"].as_str().unwrap();
        assert!(broadcast <= confirmed, "{m}");
    }
    assert_eq!(view["result"]["kind"], "asset.create", "{view}");
    assert_eq!(view["result"]["tokenAddress"], a["tokenAddress"], "{view}");
    assert!(view["completedAt"].as_str().is_some(), "{view}");
    let (status, list) = stack.get(&stack.key_a, "/v1/assets").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"][0]["id"], a["id"], "{list}");
    let (_, ops) = stack
        .get(
            &stack.key_a,
            &format!("/v1/operations?assetId={asset}&state=completed"),
        )
        .await;
    assert_eq!(ops["data"].as_array().map(Vec::len), Some(1), "{ops}");
    assert_eq!(ops["data"][0]["id"], view["id"], "{ops}");

    // Mint 1,234.5 tokens (6 decimals) to account 3 and read the balance back from the
    // index at the mint's block.
    let holder = stack.chain.account(3).unwrap();
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/mint"),
            "mint-1",
            json!({"recipient": holder.to_string(), "amount": "1234.5"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let mint_op = body["id"].as_str().unwrap().to_owned();
    let view = stack
        .await_op(&mint_op, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let block = view["result"]["block"].as_u64().unwrap();
    let (status, bal) = stack
        .get(
            &stack.key_a,
            &format!("/v1/assets/{asset}/balances/{holder}?minBlock={block}"),
        )
        .await;
    assert_eq!(status, 200, "{bal}");
    assert_eq!(bal["balance"], "1234.5");
    assert_eq!(bal["balanceBaseUnits"], "1234500000");

    // Same key, same body: the same operation, nothing new on chain.
    let (_, again) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/mint"),
            "mint-1",
            json!({"recipient": holder.to_string(), "amount": "1234.50"}),
        )
        .await;
    assert_eq!(again["id"], mint_op, "{again}");
    // Same key, other body: conflict.
    let (status, conflict) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/mint"),
            "mint-1",
            json!({"recipient": holder.to_string(), "amount": "1"}),
        )
        .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["code"], "IDEMPOTENCY_CONFLICT");

    // A transfer the issuer cannot cover reverts on chain: a failed operation with the
    // decoded reason.
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/transfer"),
            "transfer-too-much",
            json!({"recipient": holder.to_string(), "amount": "5"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let view = stack
        .await_op(
            body["id"].as_str().unwrap(),
            Duration::from_secs(60),
            terminal,
        )
        .await;
    assert_eq!(state(&view), "failed", "{view}");
    assert_eq!(view["error"]["code"], "EXECUTION_REVERTED", "{view}");
    assert_eq!(
        view["error"]["reason"], "ERC20InsufficientBalance",
        "{view}"
    );

    // Tenant isolation: the other organization sees none of it.
    let (status, _) = stack
        .get(&stack.key_other, &format!("/v1/assets/{asset}"))
        .await;
    assert_eq!(status, 404);
    let (status, _) = stack
        .get(&stack.key_other, &format!("/v1/operations/{op}"))
        .await;
    assert_eq!(status, 404);
    let mints = stack
        .logs_of::<AssetToken::Transfer>(a["tokenAddress"].as_str().unwrap().parse().unwrap())
        .await;
    assert_eq!(mints.len(), 1, "exactly one mint on chain");

    // The bootstrap's blocks lie below the first tip block: the indexer planned them as
    // history ranges, its history worker completed them, and the Directory's entries
    // from those blocks are in the index.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (open, done): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state <> 'completed'),
                    count(*) FILTER (WHERE state = 'completed') FROM index_range",
        )
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
        if open == 0 && done > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "history ranges: {open} open, {done} done"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let entries: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM index_directory_entry WHERE removed_at_block IS NULL",
    )
    .fetch_one(stack.db.pool())
    .await
    .unwrap();
    assert!(entries >= 4, "{entries} directory entries indexed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mints_above_the_threshold_wait_for_an_approval_by_another_key() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(
        chain,
        TemplateOpts {
            approval_threshold: Some("100"),
            approval_ttl_seconds: Some(600),
            ..TemplateOpts::default()
        },
    )
    .await;
    let (op, asset) = stack.create_asset("create-a", "APRV").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let holder = stack.chain.account(4).unwrap().to_string();
    let mint = |idem: &'static str| {
        let holder = holder.clone();
        let asset = asset.clone();
        let stack = &stack;
        async move {
            let (status, body) = stack
                .post(
                    &stack.key_a,
                    &format!("/v1/assets/{asset}/mint"),
                    idem,
                    json!({"recipient": holder, "amount": "500"}),
                )
                .await;
            assert!(status == 202 || status == 200, "{status} {body}");
            body["id"].as_str().unwrap().to_owned()
        }
    };
    // Approved by the second key.
    let approved = mint("big-1").await;
    let view = stack
        .await_op(&approved, Duration::from_secs(30), |v| {
            state(v) == "waiting"
        })
        .await;
    assert_eq!(view["wait"]["for"], "approval", "{view}");
    assert!(view["wait"]["until"].is_string(), "{view}");
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/operations/{approved}/approve"),
            "x",
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "APPROVAL_SAME_KEY");
    let (status, body) = stack
        .post(
            &stack.key_b,
            &format!("/v1/operations/{approved}/approve"),
            "y",
            json!({}),
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let view = stack
        .await_op(&approved, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    // Who started it and who approved it, from the keys that called (issue 23).
    let (status, view) = stack
        .get(&stack.key_a, &format!("/v1/operations/{approved}"))
        .await;
    assert_eq!(status, 200, "{view}");
    let who = &view["attribution"];
    assert_eq!(who["startedBy"]["actor"]["kind"], "SERVICE", "{view}");
    assert_eq!(who["startedBy"]["actor"]["status"], "VERIFIED", "{view}");
    assert_eq!(who["approval"]["decision"], "approved", "{view}");
    assert_eq!(who["approval"]["by"]["actor"]["kind"], "SERVICE", "{view}");
    assert_eq!(
        who["approval"]["by"]["actor"]["reason"], "approve",
        "{view}"
    );
    assert!(who["approval"]["by"]["at"].is_string(), "{view}");
    assert_ne!(
        who["approval"]["by"]["actor"]["id"], who["startedBy"]["actor"]["id"],
        "approved by the other key: {view}"
    );

    // Rejected.
    let rejected = mint("big-2").await;
    stack
        .await_op(&rejected, Duration::from_secs(30), |v| {
            state(v) == "waiting"
        })
        .await;
    let (status, body) = stack
        .post(
            &stack.key_b,
            &format!("/v1/operations/{rejected}/reject"),
            "z",
            json!({}),
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let view = stack
        .await_op(&rejected, Duration::from_secs(30), terminal)
        .await;
    assert_eq!(view["error"]["code"], "APPROVAL_REJECTED", "{view}");
    let (_, view) = stack
        .get(&stack.key_a, &format!("/v1/operations/{rejected}"))
        .await;
    assert_eq!(
        view["attribution"]["approval"]["decision"], "rejected",
        "{view}"
    );
    assert_eq!(
        view["attribution"]["approval"]["by"]["actor"]["reason"], "reject",
        "{view}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_approval_expires() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(
        chain,
        TemplateOpts {
            approval_threshold: Some("1"),
            approval_ttl_seconds: Some(2),
            ..TemplateOpts::default()
        },
    )
    .await;
    let (op, asset) = stack.create_asset("create-e", "EXPR").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let (_, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/mint"),
            "big-e",
            json!({"recipient": stack.chain.account(5).unwrap().to_string(), "amount": "2"}),
        )
        .await;
    let id = body["id"].as_str().unwrap().to_owned();
    let view = stack.await_op(&id, Duration::from_secs(30), terminal).await;
    assert_eq!(view["error"]["code"], "APPROVAL_EXPIRED", "{view}");
    let (status, body) = stack
        .post(
            &stack.key_b,
            &format!("/v1/operations/{id}/approve"),
            "late",
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "APPROVAL_EXPIRED", "{body}");
}

/// The runner is killed (SIGKILL) once in every phase of the creation; after each
/// restart the operation resumes, and afterwards the chain holds exactly one feed, one
/// token, one observation, one bound and one unpause, in fail-closed order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_in_every_feed_phase_step_deploys_everything_exactly_once() {
    let chain = TestChain::builder().block_time(1).start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let (op, _asset) = stack.create_asset("create-k", "KILL").await;
    let phases = [
        "create-feed",
        "deploy-token",
        "submit-observation",
        "set-bound",
        "unpause",
    ];
    for phase in phases {
        let view = stack
            .await_op(&op, Duration::from_secs(120), |v| {
                terminal(v) || {
                    let at = v["progress"]["phase"].as_str().unwrap_or("");
                    let ix = |p: &str| phases.iter().position(|x| *x == p);
                    matches!((ix(at), ix(phase)), (Some(a), Some(b)) if a >= b)
                        || at == "index"
                        || at == "done"
                }
            })
            .await;
        if terminal(&view) {
            break;
        }
        stack.kill9("runner");
        stack.spawn("runner");
    }
    let view = stack
        .await_op(&op, Duration::from_secs(180), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let feed_factory = stack.contracts["priceFeedFactory"];
    let factory = stack.contracts["assetFactory"];
    let resolver = stack.contracts["priceResolver"];
    let feeds = stack
        .logs_of::<PriceFeedFactory::FeedCreated>(feed_factory)
        .await;
    let tokens = stack.logs_of::<AssetFactory::AssetCreated>(factory).await;
    assert_eq!(feeds.len(), 1, "one feed");
    assert_eq!(tokens.len(), 1, "one token");
    let feed = Address::from_word(feeds[0].topics()[1]);
    let token = Address::from_word(tokens[0].topics()[2]);
    let observations = stack.logs_of::<PriceFeed::AnswerUpdated>(feed).await;
    let bounds = stack
        .logs_of::<PriceResolver::StalenessBoundSet>(resolver)
        .await;
    let unpauses = stack.logs_of::<AssetToken::Unpaused>(token).await;
    assert_eq!(observations.len(), 1, "one observation");
    assert_eq!(bounds.len(), 1, "one staleness bound");
    assert_eq!(unpauses.len(), 1, "one unpause");
    let pos = |l: &alloy::rpc::types::Log| (l.block_number.unwrap(), l.log_index.unwrap());
    assert!(
        pos(&bounds[0]) < pos(&unpauses[0]),
        "the bound lands before the unpause"
    );
    assert!(pos(&observations[0]) < pos(&bounds[0]));
    let _ = B256::ZERO;
}

async fn set_balance(stack: &Stack, who: Address, wei: u128) {
    let _: Value = stack
        .chain
        .provider()
        .raw_request(
            "anvil_setBalance".into(),
            (who, alloy::primitives::U256::from(wei)),
        )
        .await
        .unwrap();
}

/// With the template's funding pause, an operation whose operator cannot pay for gas
/// waits (`wait.for = funding`, listed under `/v1/funding-requests` with the amount to
/// send) and completes on its own once the operator is funded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfunded_operator_pauses_the_operation_until_funded() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(
        chain,
        TemplateOpts {
            funding_pause: true,
            ..TemplateOpts::default()
        },
    )
    .await;
    let hooks = Hooks::register(&stack).await;
    let (op, asset) = stack.create_asset("create-f", "FUND").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    // Its webhook events arrived at the receiver, in the order of its changes.
    let events = hooks
        .until(&op, "completed", |e| e["data"]["state"] == "completed")
        .await;
    check_operation_events(&events);
    let operator = stack.chain.account(0).unwrap();
    set_balance(&stack, operator, 0).await;
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/mint"),
            "mint-f",
            json!({"recipient": stack.chain.account(6).unwrap().to_string(), "amount": "7"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let id = body["id"].as_str().unwrap().to_owned();
    let view = stack
        .await_op(&id, Duration::from_secs(60), |v| {
            v["wait"]["for"] == "funding"
        })
        .await;
    assert_eq!(view["wait"]["step"], "mint", "{view}");
    // The funding request was reported while the operation waits for it.
    let events = hooks
        .until(&id, "funding_requested", |e| {
            e["type"] == "operation.funding_requested"
        })
        .await;
    let t = types(&events);
    assert!(!t.contains(&"operation.submitted"), "{t:?}");
    let asked = events
        .iter()
        .find(|e| e["type"] == "operation.funding_requested")
        .unwrap();
    assert_eq!(asked["data"]["wait"]["for"], "funding", "{asked}");
    assert_eq!(asked["data"]["wait"]["step"], "mint", "{asked}");
    let (status, list) = stack.get(&stack.key_a, "/v1/funding-requests").await;
    assert_eq!(status, 200, "{list}");
    let requests = list["fundingRequests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{list}");
    let required: u128 = requests[0]["requiredWei"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(required > 0);
    assert_eq!(
        requests[0]["address"].as_str().unwrap().to_lowercase(),
        operator.to_string().to_lowercase()
    );
    // The other organization sees no funding request of acme's.
    let (_, other) = stack.get(&stack.key_other, "/v1/funding-requests").await;
    assert_eq!(
        other["fundingRequests"].as_array().unwrap().len(),
        0,
        "{other}"
    );
    // A second mint of the same sender queues behind the funding wait, and the funding
    // view names it with the request it waits behind (issue 35 §4).
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/mint"),
            "mint-f2",
            json!({"recipient": stack.chain.account(7).unwrap().to_string(), "amount": "3"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let second = body["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let behind = loop {
        let (status, list) = stack.get(&stack.key_a, "/v1/funding-requests").await;
        assert_eq!(status, 200, "{list}");
        let q = list["queuedBehindFunding"].as_array().unwrap().clone();
        if !q.is_empty() {
            break (list, q);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second mint never showed as queued behind funding: {list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (list, q) = behind;
    assert_eq!(q.len(), 1, "{list}");
    assert_eq!(q[0]["operationId"], json!(second), "{list}");
    assert_eq!(q[0]["step"], "mint", "{list}");
    assert_eq!(q[0]["queuedBehind"], json!(id), "{list}");
    assert_eq!(
        q[0]["queuedBehindRequestId"], list["fundingRequests"][0]["requestId"],
        "{list}"
    );
    assert_eq!(
        q[0]["address"].as_str().unwrap().to_lowercase(),
        operator.to_string().to_lowercase()
    );
    let (_, other) = stack.get(&stack.key_other, "/v1/funding-requests").await;
    assert_eq!(
        other["queuedBehindFunding"].as_array().unwrap().len(),
        0,
        "{other}"
    );
    set_balance(&stack, operator, 10 * required).await;
    let view = stack.await_op(&id, Duration::from_secs(60), terminal).await;
    assert_eq!(state(&view), "completed", "{view}");
    let view = stack
        .await_op(&second, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let (_, list) = stack.get(&stack.key_a, "/v1/funding-requests").await;
    assert_eq!(list["queuedBehindFunding"], json!([]), "{list}");
    // accepted → ... → funding_requested → submitted → settled → confirmed → completed.
    let events = hooks
        .until(&id, "completed", |e| e["data"]["state"] == "completed")
        .await;
    check_operation_events(&events);
    let t = types(&events);
    let at = |x: &str| t.iter().position(|y| *y == x).unwrap();
    assert!(
        at("operation.funding_requested") < at("operation.submitted"),
        "{t:?}"
    );
}

/// Without the funding pause the same situation fails the operation `GAS_REQUIRED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfunded_operator_fails_gas_required_without_the_pause() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(chain, TemplateOpts::default()).await;
    let (op, asset) = stack.create_asset("create-g", "GASR").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    set_balance(&stack, stack.chain.account(0).unwrap(), 0).await;
    let (_, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/pause"),
            "pause-g",
            json!({}),
        )
        .await;
    let id = body["id"].as_str().unwrap().to_owned();
    let view = stack.await_op(&id, Duration::from_secs(60), terminal).await;
    assert_eq!(view["error"]["code"], "GAS_REQUIRED", "{view}");
    assert_eq!(view["error"]["retryable"], true, "{view}");
}

/// Two indexer processes: the one that owns the chain's tip ingest is killed (SIGKILL);
/// the other takes the chain over with a new epoch, and the index still equals the
/// chain's Transfer logs exactly (nothing lost, nothing doubled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tip_owner_is_replaced_by_the_other_indexer_without_gaps_or_duplicates() {
    let chain = TestChain::start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let (op, asset) = stack.create_asset("create-i", "IDXR").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let epoch_before: i64 = sqlx::query_scalar("SELECT owner_epoch FROM index_chain")
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
    // The second indexer joins; once both are live, whichever owns the chain's tip
    // ingest dies without any shutdown.
    stack.spawn_named("indexer-2", "indexer");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM cluster_replica WHERE role = 'indexer'
               AND heartbeat_at > now() - interval '1 second'",
        )
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
        if live == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "indexer-2 never became live");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let owner: String = sqlx::query_scalar(
        "SELECT r.host FROM index_chain c JOIN cluster_replica r ON r.id::text = c.owner_id",
    )
    .fetch_one(stack.db.pool())
    .await
    .unwrap();
    let (victim, survivor) = if owner == "indexer" {
        ("indexer", "indexer-2")
    } else {
        ("indexer-2", "indexer")
    };
    stack.kill9(victim);
    let holder = stack.chain.account(7).unwrap();
    let mut last_block = 0;
    for i in 0..3 {
        let (status, body) = stack
            .post(
                &stack.key_a,
                &format!("/v1/assets/{asset}/mint"),
                &format!("mint-i-{i}"),
                json!({"recipient": holder.to_string(), "amount": "10"}),
            )
            .await;
        assert!(status == 202 || status == 200, "{status} {body}");
        let view = stack
            .await_op(
                body["id"].as_str().unwrap(),
                Duration::from_secs(90),
                terminal,
            )
            .await;
        assert_eq!(state(&view), "completed", "{view}\n{}", stack.log(survivor));
        last_block = view["result"]["block"].as_u64().unwrap();
    }
    let epoch_after: i64 = sqlx::query_scalar("SELECT owner_epoch FROM index_chain")
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
    assert!(
        epoch_after > epoch_before,
        "ownership moved with a new epoch"
    );
    let owner_after: String = sqlx::query_scalar(
        "SELECT r.host FROM index_chain c JOIN cluster_replica r ON r.id::text = c.owner_id",
    )
    .fetch_one(stack.db.pool())
    .await
    .unwrap();
    assert_eq!(owner_after, survivor);
    let (status, bal) = stack
        .get(
            &stack.key_a,
            &format!("/v1/assets/{asset}/balances/{holder}?minBlock={last_block}"),
        )
        .await;
    assert_eq!(status, 200, "{bal}");
    assert_eq!(bal["balance"], "30");
    let (_, a) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    let token: Address = a["tokenAddress"].as_str().unwrap().parse().unwrap();
    let mut on_chain: Vec<(Vec<u8>, i64)> = stack
        .logs_of::<AssetToken::Transfer>(token)
        .await
        .iter()
        .map(|l| {
            (
                l.block_hash.unwrap().to_vec(),
                i64::try_from(l.log_index.unwrap()).unwrap(),
            )
        })
        .collect();
    let mut indexed: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT block_hash, log_index FROM index_transfer WHERE token = $1")
            .bind(token.as_slice())
            .fetch_all(stack.db.pool())
            .await
            .unwrap();
    on_chain.sort();
    indexed.sort();
    assert_eq!(
        indexed, on_chain,
        "the index equals the chain's Transfer logs"
    );
}

/// A creation that fails part-way (the operator ran out of gas money while the runner
/// was down, no funding pause) leaves the token paused with the landed hashes shown;
/// after funding, `POST /v1/operations/{id}/retry` resumes at the first write without a
/// recorded result: exactly one feed and one token exist afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_creation_retried_resumes_without_repeating_landed_writes() {
    let chain = TestChain::builder().block_time(1).start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let (op, asset) = stack.create_asset("create-r", "RTRY").await;
    // Killed while `deploy-token` is accepted by the node but not yet confirmed, so the
    // next write (`submit-observation`) cannot have been signed; the chain mines the
    // token without the runner, then the operator's balance goes to zero.
    let view = stack
        .await_op(&op, Duration::from_secs(60), |v| {
            v["milestones"]["submitted"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|m| m["step"] == "deploy-token" && m["broadcast"] == true)
            })
        })
        .await;
    stack.kill9("runner");
    let deploy: alloy::primitives::B256 = view["milestones"]["submitted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["step"] == "deploy-token")
        .and_then(|m| m["txHash"].as_str())
        .unwrap()
        .parse()
        .unwrap();
    let mined_by = Instant::now() + Duration::from_secs(60);
    while stack
        .chain
        .provider()
        .get_transaction_receipt(deploy)
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < mined_by, "deploy-token did not mine");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let operator = stack.chain.account(0).unwrap();
    let balance = stack.chain.provider().get_balance(operator).await.unwrap();
    set_balance(&stack, operator, 0).await;
    stack.spawn("runner");
    let view = stack.await_op(&op, Duration::from_secs(60), terminal).await;
    assert_eq!(state(&view), "failed", "{view}");
    assert_eq!(view["error"]["code"], "GAS_REQUIRED", "{view}");
    let landed: Vec<&str> = view["milestones"]["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["step"].as_str().unwrap())
        .collect();
    assert!(landed.contains(&"deploy-token"), "{view}");
    let (_, a) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    assert_eq!(a["status"], "failed", "{a}");
    // Not retryable while it runs; the same POST returns the failure, no new attempt.
    let (status, same) = stack
        .post(
            &stack.key_a,
            "/v1/assets",
            "create-r",
            json!({"name": "RTRY Fund", "symbol": "RTRY", "decimals": 6,
                   "templateId": "std", "initialPrice": "101.25"}),
        )
        .await;
    assert_eq!(status, 200, "{same}");
    assert_eq!(same["state"], "failed");
    set_balance(&stack, operator, balance.to::<u128>()).await;
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/operations/{op}/retry"),
            "r",
            json!({}),
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/operations/{op}/retry"),
            "r2",
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "OPERATION_NOT_RETRYABLE");
    let feeds = stack
        .logs_of::<PriceFeedFactory::FeedCreated>(stack.contracts["priceFeedFactory"])
        .await;
    let tokens = stack
        .logs_of::<AssetFactory::AssetCreated>(stack.contracts["assetFactory"])
        .await;
    assert_eq!((feeds.len(), tokens.len()), (1, 1));
}

impl Stack {
    /// Posts a token operation of `asset`; returns the operation id.
    pub(crate) async fn token_op(
        &self,
        asset: &str,
        what: &str,
        idem: &str,
        body: Value,
    ) -> String {
        let (status, view) = self
            .post(
                &self.key_a,
                &format!("/v1/assets/{asset}/{what}"),
                idem,
                body,
            )
            .await;
        assert!(status == 202 || status == 200, "{what}: {status} {view}");
        view["id"].as_str().unwrap().to_owned()
    }

    /// `POST /v1/operations/{id}/<action>` with key `key` and an empty body.
    async fn act(&self, key: &str, id: &str, action: &str) -> (u16, Value) {
        self.post(
            key,
            &format!("/v1/operations/{id}/{action}"),
            "act",
            json!({}),
        )
        .await
    }

    /// Creates an asset and waits until its creation completed; returns the asset id and
    /// its token address.
    pub(crate) async fn create_active_asset(&self, idem: &str, symbol: &str) -> (String, Address) {
        let (op, asset) = self.create_asset(idem, symbol).await;
        let created = self.await_op(&op, Duration::from_secs(120), terminal).await;
        assert_eq!(state(&created), "completed", "{created}");
        let token = created["result"]["tokenAddress"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        (asset, token)
    }
}

/// Issue 16, class 1: a business failure (a reverted transfer, a mint refused while
/// paused), an operation waiting for a human and a cancel never freeze the other
/// operations of the asset; retrying a failure a retry cannot change answers 409 with
/// the code; the chain holds exactly the writes that were meant to land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_waiting_operation_never_blocks_the_next_ones_of_its_asset() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(
        chain,
        TemplateOpts {
            approval_threshold: Some("100"),
            approval_ttl_seconds: Some(600),
            ..TemplateOpts::default()
        },
    )
    .await;
    let (asset, token) = stack.create_active_asset("create-w", "WEDG").await;
    let holder = stack.chain.account(4).unwrap().to_string();
    let to = |amount: &str| json!({"recipient": holder, "amount": amount});

    // The issuer holds nothing: the transfer reverts.
    let transfer = stack.token_op(&asset, "transfer", "t-1", to("1")).await;
    let view = stack
        .await_op(&transfer, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(view["error"]["code"], "EXECUTION_REVERTED", "{view}");
    let (status, body) = stack.act(&stack.key_a, &transfer, "retry").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "OPERATION_NOT_RETRYABLE", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("EXECUTION_REVERTED"),
        "{body}"
    );

    // The next operations of the asset run.
    let mint = stack.token_op(&asset, "mint", "m-1", to("5")).await;
    let view = stack
        .await_op(&mint, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");

    // A mint waiting for an approval does not hold back an emergency pause.
    let big = stack.token_op(&asset, "mint", "m-big", to("500")).await;
    stack
        .await_op(&big, Duration::from_secs(30), |v| {
            v["wait"]["for"] == "approval"
        })
        .await;
    let pause = stack.token_op(&asset, "pause", "p-1", json!({})).await;
    let view = stack
        .await_op(&pause, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let (_, big_view) = stack
        .get(&stack.key_a, &format!("/v1/operations/{big}"))
        .await;
    assert_eq!(state(&big_view), "waiting", "{big_view}");

    // Refused while paused, and the asset is not frozen by that failure.
    let refused = stack.token_op(&asset, "mint", "m-2", to("5")).await;
    let view = stack
        .await_op(&refused, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(view["error"]["code"], "EXECUTION_REVERTED", "{view}");
    assert_eq!(view["error"]["reason"], "EnforcedPause", "{view}");
    let unpause = stack.token_op(&asset, "unpause", "u-1", json!({})).await;
    let view = stack
        .await_op(&unpause, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");

    // Cancelling the mint that waits for its approval: nothing was queued, it ends.
    let (status, view) = stack.act(&stack.key_b, &big, "cancel").await;
    assert!(status == 200 || status == 202, "{status} {view}");
    let view = stack
        .await_op(&big, Duration::from_secs(30), terminal)
        .await;
    assert_eq!(state(&view), "cancelled", "{view}");
    assert_eq!(view["error"]["code"], "CANCELLED", "{view}");
    assert!(view["cancelRequestedAt"].is_string(), "{view}");
    assert_eq!(view["milestones"]["confirmed"].as_array().unwrap().len(), 0);
    let (status, body) = stack.act(&stack.key_b, &big, "approve").await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = stack.act(&stack.key_a, &mint, "cancel").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "OPERATION_ENDED", "{body}");
    let (status, body) = stack.act(&stack.key_a, &big, "cancel").await;
    assert_eq!(status, 409, "{body}");

    // On chain: one mint (5 base units × 10^6), no transfer from the issuer, and two
    // pauses and two unpauses (the creation's — the token is deployed paused — and ours).
    let transfers = stack.logs_of::<AssetToken::Transfer>(token).await;
    assert_eq!(transfers.len(), 1, "{transfers:?}");
    let t = AssetToken::Transfer::decode_log_data(transfers[0].data()).unwrap();
    assert_eq!(t.from, Address::ZERO);
    assert_eq!(t.value, alloy::primitives::U256::from(5_000_000u64));
    assert_eq!(stack.logs_of::<AssetToken::Paused>(token).await.len(), 2);
    assert_eq!(stack.logs_of::<AssetToken::Unpaused>(token).await.len(), 2);

    // Reads say when the chain's index is degraded (the marker the tip ingest writes
    // after a reorg below finality, set here directly).
    let (_, view) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    assert_eq!(view["indexDegraded"], false, "{view}");
    sqlx::query(
        "UPDATE index_chain SET degraded_at = now(), degraded_reason = 'reorg below finality',
                                degraded_block = 1",
    )
    .execute(stack.db.pool())
    .await
    .unwrap();
    let (_, view) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    assert_eq!(view["indexDegraded"], true, "{view}");
    let (_, view) = stack
        .get(
            &stack.key_a,
            &format!("/v1/assets/{asset}/balances/{holder}"),
        )
        .await;
    assert_eq!(view["indexDegraded"], true, "{view}");
}

/// Issue 16, class 1: a cancel withdraws a write that was queued but never signed (here
/// paused for funding, whose deadline the view shows in `wait.until`); nothing of it
/// reaches the chain, even after the operator is funded, and later operations run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_withdraws_an_unsigned_write_and_nothing_of_it_reaches_the_chain() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(
        chain,
        TemplateOpts {
            funding_pause: true,
            ..TemplateOpts::default()
        },
    )
    .await;
    let (asset, token) = stack.create_active_asset("create-c", "CANC").await;
    let operator = stack.chain.account(0).unwrap();
    let holder = stack.chain.account(6).unwrap().to_string();
    set_balance(&stack, operator, 0).await;
    let mint = stack
        .token_op(
            &asset,
            "mint",
            "m-c",
            json!({"recipient": holder, "amount": "7"}),
        )
        .await;
    let view = stack
        .await_op(&mint, Duration::from_secs(60), |v| {
            v["wait"]["for"] == "funding"
        })
        .await;
    assert!(
        view["wait"]["until"].is_string(),
        "the funding deadline: {view}"
    );
    // The operator's command, with the API's semantics.
    let printed: Value = serde_json::from_str(&stack.cli(&[
        "ops",
        "cancel",
        "--api-url",
        &stack.api,
        "--api-key",
        &stack.key_a,
        &mint,
    ]))
    .unwrap();
    assert_eq!(printed["id"], mint.as_str(), "{printed}");
    let view = stack
        .await_op(&mint, Duration::from_secs(30), terminal)
        .await;
    assert_eq!(state(&view), "cancelled", "{view}");
    assert!(
        view["error"]["detail"].as_str().unwrap().contains("none"),
        "{view}"
    );
    let (_, list) = stack.get(&stack.key_a, "/v1/funding-requests").await;
    assert_eq!(
        list["fundingRequests"].as_array().unwrap().len(),
        0,
        "{list}"
    );
    let withdrawn: Vec<(String, Value)> =
        sqlx::query_as("SELECT state, verdict FROM txq_request WHERE idempotency_key LIKE $1")
            .bind(format!("op/{mint}/%"))
            .fetch_all(stack.db.pool())
            .await
            .unwrap();
    assert_eq!(withdrawn.len(), 1, "{withdrawn:?}");
    assert_eq!(withdrawn[0].0, "settled");
    assert_eq!(withdrawn[0].1["code"], "WITHDRAWN", "{withdrawn:?}");

    // Funded again: the next mint lands, the cancelled one never does.
    set_balance(&stack, operator, 10u128.pow(20)).await;
    let next = stack
        .token_op(
            &asset,
            "mint",
            "m-c2",
            json!({"recipient": holder, "amount": "3"}),
        )
        .await;
    let view = stack
        .await_op(&next, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let transfers = stack.logs_of::<AssetToken::Transfer>(token).await;
    assert_eq!(transfers.len(), 1, "only the second mint: {transfers:?}");
    let t = AssetToken::Transfer::decode_log_data(transfers[0].data()).unwrap();
    assert_eq!(t.value, alloy::primitives::U256::from(3_000_000u64));
}

/// Issue 16, class 1: a cancel cannot unsend a signed transaction. The operation keeps
/// waiting for its verdict, completes when it lands, and says both that a cancel was
/// requested and what landed; it never reads `cancelled` with its write on chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_signing_runs_to_the_verdict_and_says_what_landed() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(chain, TemplateOpts::default()).await;
    let (asset, token) = stack.create_active_asset("create-s", "SIGN").await;
    let provider = stack.chain.provider().clone();
    let automine = |on: bool| {
        let provider = provider.clone();
        async move {
            let _: Value = provider
                .raw_request("evm_setAutomine".into(), (on,))
                .await
                .unwrap();
        }
    };
    automine(false).await;
    let holder = stack.chain.account(7).unwrap().to_string();
    let mint = stack
        .token_op(
            &asset,
            "mint",
            "m-s",
            json!({"recipient": holder, "amount": "9"}),
        )
        .await;
    stack
        .await_op(&mint, Duration::from_secs(60), |v| {
            v["milestones"]["submitted"]
                .as_array()
                .is_some_and(|s| s.iter().any(|m| m["broadcast"] == true))
        })
        .await;
    let (status, view) = stack.act(&stack.key_a, &mint, "cancel").await;
    assert_eq!(status, 202, "{view}");
    assert!(view["cancelRequestedAt"].is_string(), "{view}");
    assert_eq!(state(&view), "waiting", "{view}");
    automine(true).await;
    let _: Value = stack
        .chain
        .provider()
        .raw_request("evm_mine".into(), ())
        .await
        .unwrap();
    let view = stack
        .await_op(&mint, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    assert!(view["cancelRequestedAt"].is_string(), "{view}");
    assert_eq!(view["milestones"]["confirmed"][0]["step"], "mint", "{view}");
    assert_eq!(stack.logs_of::<AssetToken::Transfer>(token).await.len(), 1);
}

/// One sample line of the Prometheus text format: metric name and label pairs.
fn parse_sample(line: &str) -> (String, Vec<(String, String)>) {
    let head = line.rsplit_once(' ').map_or(line, |(h, _)| h);
    let Some((name, rest)) = head.split_once('{') else {
        return (head.to_owned(), Vec::new());
    };
    let mut labels = Vec::new();
    let mut rest = rest.trim_end_matches('}');
    while let Some((key, tail)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = tail.char_indices();
        let mut end = tail.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(n);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_owned(), value));
        rest = &tail[end..];
    }
    (name.to_owned(), labels)
}

/// Whether a label value looks unbounded: a UUID, a long hex string (hash, address,
/// key) or a URL.
fn unbounded_label(value: &str) -> bool {
    let hex = value.strip_prefix("0x").unwrap_or(value);
    let is_uuid = value.len() == 36
        && value.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    is_uuid
        || (hex.len() >= 16 && hex.chars().all(|c| c.is_ascii_hexdigit()))
        || value.contains("://")
}

/// The most series (label sets, `le` aside) one metric may have on one process. The
/// largest is `keel_durable_open_instances`: every workflow (18 operation kinds and
/// engine workflows) times its 4 open states, 72 series — bounded by fixed lists.
const MAX_SERIES_PER_METRIC: usize = 128;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_exports_described_bounded_histogram_metrics() {
    let chain = TestChain::builder().start().await.unwrap();
    let stack = Stack::start(chain, TemplateOpts::default()).await;
    // A small workload: an asset created, a refused key, a missing key, an unknown route.
    let (op, asset) = stack.create_asset("metrics-1", "MTRC").await;
    let view = stack
        .await_op(&op, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let (status, _) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}"))
        .await;
    assert_eq!(status, 200);
    let refused = stack
        .http
        .get(format!("{}/v1/assets", stack.api))
        .bearer_auth("not-a-key")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let missing = stack
        .http
        .get(format!("{}/v1/assets", stack.api))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 401);
    let unknown = stack
        .http
        .get(format!("{}/v1/no/such/{}", stack.api, uuid_like()))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    let mut exported: std::collections::HashSet<String> = Default::default();
    let mut reference: std::collections::BTreeMap<String, MetricRef> = Default::default();
    for role in ["api", "runner", "indexer"] {
        let port = stack.metrics[role];
        let text = stack
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut types: HashMap<String, String> = HashMap::new();
        let mut helps: std::collections::HashSet<String> = Default::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                types.insert(name.to_owned(), kind.to_owned());
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                helps.insert(name.to_owned());
                reference.entry(name.to_owned()).or_default().help = help.to_owned();
            }
        }
        for (name, kind) in &types {
            reference.entry(name.clone()).or_default().kind = kind.clone();
        }
        let mut series: HashMap<String, std::collections::HashSet<Vec<(String, String)>>> =
            HashMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name, labels) = parse_sample(line);
            let family = if types.contains_key(&name) {
                name.clone()
            } else {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| types.contains_key(*f)))
                    .unwrap_or(&name)
                    .to_owned()
            };
            for (key, value) in &labels {
                // `sender` is one of the configured operator addresses: bounded by
                // configuration, not by traffic.
                assert!(
                    key == "sender" || !unbounded_label(value),
                    "{role}: {name} has an unbounded label {key}={value:?}"
                );
            }
            let set: Vec<_> = labels.into_iter().filter(|(k, _)| k != "le").collect();
            let entry = reference.entry(family.clone()).or_default();
            for (k, _) in &set {
                if k != "deployment_id" {
                    entry.labels.insert(k.clone());
                }
            }
            series.entry(family).or_default().insert(set);
        }
        assert!(
            types.contains_key("keel_build_info"),
            "{role} exported no build info:\n{text}"
        );
        exported.extend(types.keys().cloned());
        for (name, kind) in &types {
            assert!(helps.contains(name), "{role}: {name} has no # HELP");
            assert_ne!(
                kind, "summary",
                "{role}: {name} is a summary, not a histogram"
            );
            match kind.as_str() {
                "counter" => assert!(name.ends_with("_total"), "{role}: counter {name}"),
                "histogram" => assert!(
                    ["_seconds", "_bytes", "_blocks", "_rows"]
                        .iter()
                        .any(|s| name.ends_with(s)),
                    "{role}: histogram {name} names no unit"
                ),
                _ => {}
            }
        }
        for (name, sets) in &series {
            assert!(
                sets.len() <= MAX_SERIES_PER_METRIC,
                "{role}: {name} has {} series",
                sets.len()
            );
        }
        if role == "api" {
            for needle in [
                "keel_api_requests_total{",
                "route=\"/v1/assets/{id}\"",
                "route=\"<unmatched>\"",
                "status=\"2xx\"",
                "keel_api_request_duration_seconds_bucket{",
                "keel_api_requests_in_flight",
                "keel_api_auth_failures_total{",
                "reason=\"invalid\"",
                "reason=\"missing\"",
            ] {
                assert!(text.contains(needle), "api metrics lack {needle}:\n{text}");
            }
        }
        // The two operator views the dashboard derives: workflows by state (every
        // registered workflow reported, zero or not) and the index lag.
        if role == "runner" {
            for needle in [
                "keel_durable_open_instances{",
                "workflow=\"asset.create\"",
                "workflow=\"asset.mint\"",
                "status=\"waiting\"",
            ] {
                assert!(
                    text.contains(needle),
                    "runner metrics lack {needle}:\n{text}"
                );
            }
        }
        if role == "indexer" {
            assert!(
                text.contains("keel_index_chain_head_block{"),
                "indexer metrics lack the chain head:\n{text}"
            );
        }
    }
    for name in dashboard_metrics() {
        assert!(
            exported.contains(&name),
            "the dashboard uses {name}, which no role exports"
        );
    }
    check_metrics_reference(&reference);
    // Log hygiene (issue 22): the whole run's logs of every role carry no API token,
    // no private key, no SQL text and no PostgreSQL "already exists, skipping" notice.
    let operator_key = stack
        .env
        .iter()
        .find(|(k, _)| k == "KEEL_OPERATOR_KEY")
        .map(|(_, v)| v.trim_start_matches("0x").to_owned())
        .unwrap();
    let sql = regex::Regex::new(
        r"(?i)\bselect\s.+\sfrom\s|\binsert\s+into\s|\bdelete\s+from\s|\bupdate\s+\w+\s+set\s",
    )
    .unwrap();
    for role in ["api", "runner", "indexer"] {
        let log = stack.log(role);
        assert!(!log.is_empty(), "{role} wrote no log");
        for (what, secret) in [
            ("key a", stack.key_a.as_str()),
            ("key b", stack.key_b.as_str()),
            ("key other", stack.key_other.as_str()),
            ("the operator key", operator_key.as_str()),
        ] {
            assert!(!log.contains(secret), "{role}'s log contains {what}");
        }
        assert!(
            !log.contains("keel_sk_"),
            "{role}'s log contains an API token"
        );
        assert!(
            !log.contains("already exists, skipping"),
            "{role}'s log has PostgreSQL's noise notice"
        );
        if let Some(m) = sql.find(&log) {
            panic!("{role}'s log contains SQL text: {:?}", m.as_str());
        }
    }
}

/// One metric of the reference table `docs/metrics.md`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct MetricRef {
    kind: String,
    help: String,
    labels: std::collections::BTreeSet<String>,
}

fn metric_unit(name: &str, kind: &str) -> &'static str {
    for (suffix, unit) in [
        ("_seconds", "seconds"),
        ("_bytes", "bytes"),
        ("_blocks", "blocks"),
        ("_rows", "rows"),
    ] {
        if name.ends_with(suffix) || name.contains(&format!("{suffix}_")) {
            return unit;
        }
    }
    if name.ends_with("_block") {
        return "block number";
    }
    if kind == "counter" { "events" } else { "1" }
}

const METRICS_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");

/// Reads the table of `docs/metrics.md`: name → labels (and the rows as written).
fn documented_metrics(
    text: &str,
) -> std::collections::BTreeMap<String, (std::collections::BTreeSet<String>, String)> {
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `keel_")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let name = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_owned();
        let labels = cells
            .get(3)
            .map(|c| {
                c.split(", ")
                    .map(|l| l.trim_matches('`').to_owned())
                    .filter(|l| !l.is_empty() && l != "—")
                    .collect()
            })
            .unwrap_or_default();
        out.insert(name, (labels, line.to_owned()));
    }
    out
}

/// Every exported metric is in `docs/metrics.md` with its labels (the documented
/// fixed label set: a label outside it fails). `KEEL_UPDATE_METRICS=1` adds what this
/// run exported to the table (rows of metrics this run did not export are kept).
fn check_metrics_reference(found: &std::collections::BTreeMap<String, MetricRef>) {
    let text = std::fs::read_to_string(METRICS_DOC).unwrap_or_default();
    let mut documented = documented_metrics(&text);
    let update = std::env::var("KEEL_UPDATE_METRICS").as_deref() == Ok("1");
    let mut missing = Vec::new();
    for (name, m) in found
        .iter()
        .filter(|(n, m)| n.starts_with("keel_") && !m.kind.is_empty())
    {
        let row = || {
            let labels = if m.labels.is_empty() {
                "—".to_owned()
            } else {
                m.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "| `{name}` | {} | {} | {labels} | {} |",
                m.kind,
                metric_unit(name, &m.kind),
                m.help.replace('|', "\\|")
            )
        };
        match documented.get(name) {
            Some((labels, _)) if m.labels.is_subset(labels) => {}
            Some((labels, _)) if update => {
                documented.insert(
                    name.clone(),
                    (m.labels.union(labels).cloned().collect(), row()),
                );
            }
            Some((labels, _)) => missing.push(format!(
                "{name}: labels {:?} outside the documented {labels:?}",
                m.labels
            )),
            None if update => {
                documented.insert(name.clone(), (m.labels.clone(), row()));
            }
            None => missing.push(format!("{name} is not in docs/metrics.md")),
        }
    }
    if update {
        let mut doc = String::from(METRICS_HEADER);
        for (_, row) in documented.values() {
            doc.push_str(row);
            doc.push('\n');
        }
        std::fs::write(METRICS_DOC, doc).unwrap();
    } else {
        assert!(
            missing.is_empty(),
            "docs/metrics.md disagrees with the exported metrics (regenerate with \
             KEEL_UPDATE_METRICS=1):\n{}",
            missing.join("\n")
        );
    }
}

const METRICS_HEADER: &str = "# Metrics reference

Every metric Keel's three roles export on `GET /metrics` (Prometheus text format) in the
end-to-end workload of `crates/keel/tests/it/e2e.rs`
(`every_role_exports_described_bounded_histogram_metrics`), which fails when a role
exports a metric missing here or a label outside the metric's labels below. Regenerate
(rows are added, none removed) with
`KEEL_UPDATE_METRICS=1 cargo nextest run -p keel -E 'test(every_role_exports)'`.

Every series also carries the global label `deployment_id`. Label values come from
fixed sets (states, outcomes, routes as templates, chain ids and operator addresses of
the configuration); never ids, hashes, organization addresses or URLs. Units: the
name's suffix (`_seconds`, `_bytes`, `_blocks`, `_rows`; `_total` counters count
events); `1` is a dimensionless count, ratio or state flag.

| name | type | unit | labels | meaning |
|---|---|---|---|---|
";

/// Every metric name in an expression of the shipped dashboard (`docs/grafana-dashboard.json`),
/// `_bucket`/`_sum`/`_count` stripped.
fn dashboard_metrics() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana-dashboard.json"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for panel in doc["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("keel_") {
                let tail = &rest[i..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                let name = &tail[..end];
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name);
                names.push(base.to_owned());
                rest = &tail[end..];
            }
        }
    }
    assert!(!names.is_empty(), "the dashboard names no metric");
    names
}

/// A UUID-shaped path segment (the unmatched route must not leak it into a label).
fn uuid_like() -> &'static str {
    "0b9d2c4e-8f6a-4c1e-9d3b-7a5e2f1c0d4b"
}

/// The block of a completed operation's write (`result.block`).
fn result_block(view: &Value) -> u64 {
    view["result"]["block"].as_u64().unwrap()
}

/// The steps of a view's confirmed milestones.
fn confirmed_steps(view: &Value) -> Vec<String> {
    view["milestones"]["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["step"].as_str().unwrap().to_owned())
        .collect()
}

/// `n` whole tokens of 6 decimals, in base units.
fn units(n: u64) -> alloy::primitives::U256 {
    alloy::primitives::U256::from(n * 1_000_000)
}

/// Issue 18 §4: the issuer burns its own tokens exactly once across a duplicated
/// request, a runner killed mid-burn and a replay of the same key; a forced burn of a
/// holder's tokens fails typed without the `burner` role, works once the issuer holds
/// it and fails typed above the holder's balance; a minter role is granted and revoked
/// (checked with `hasRole`), a repeated grant lands without effect; an unknown role is
/// `422 UNKNOWN_ROLE`; the index shows the supply afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burns_forced_burns_and_role_changes_land_once_and_fail_typed() {
    // One block a second: the runner can be killed while the burn is in flight.
    let chain = TestChain::builder().block_time(1).start().await.unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let (asset, token_address) = stack.create_active_asset("create-b", "BURN").await;
    let token = AssetToken::new(token_address, stack.chain.provider().clone());
    let issuer = stack.chain.account(0).unwrap();
    let holder = stack.chain.account(3).unwrap();
    let grantee = stack.chain.account(5).unwrap();
    for (idem, to, amount) in [("m-issuer", issuer, "1000"), ("m-holder", holder, "100")] {
        let id = stack
            .token_op(
                &asset,
                "mint",
                idem,
                json!({"recipient": to.to_string(), "amount": amount}),
            )
            .await;
        let view = stack.await_op(&id, Duration::from_secs(90), terminal).await;
        assert_eq!(state(&view), "completed", "{view}");
    }

    // The issuer's burn, sent twice at once with one key: one operation. The indexer is
    // stopped first, so the burn cannot end before the runner is killed below: at the
    // latest it waits in its read-after-write.
    stack.kill9("indexer");
    let path = format!("/v1/assets/{asset}/burn");
    let body = json!({"amount": "250"});
    let ((s1, a1), (s2, a2)) = tokio::join!(
        stack.post(&stack.key_a, &path, "burn-1", body.clone()),
        stack.post(&stack.key_a, &path, "burn-1", body.clone()),
    );
    assert!(s1 == 202 && s2 == 202, "{s1} {a1} {s2} {a2}");
    assert_eq!(a1["id"], a2["id"], "{a1} {a2}");
    assert_eq!(a1["kind"], "asset.burn");
    let burn = a1["id"].as_str().unwrap().to_owned();
    // Killed (SIGKILL) while the burn is in flight (its write being sent or awaiting
    // its verdict, or landed and awaiting the index), restarted: the burn completes.
    let view = stack
        .await_op(&burn, Duration::from_secs(60), |v| {
            terminal(v) || matches!(v["progress"]["phase"].as_str(), Some("burn" | "index"))
        })
        .await;
    assert!(!terminal(&view), "the burn ended before the kill: {view}");
    stack.kill9("runner");
    stack.spawn("runner");
    stack.spawn("indexer");
    let view = stack
        .await_op(&burn, Duration::from_secs(90), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(confirmed_steps(&view), ["burn"]);
    // The same key once more: the same operation, terminal (200), nothing new.
    let (status, again) = stack.post(&stack.key_a, &path, "burn-1", body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], burn.as_str());
    assert_eq!(again["created"], false);
    let (status, conflict) = stack
        .post(&stack.key_a, &path, "burn-1", json!({"amount": "251"}))
        .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["code"], "IDEMPOTENCY_CONFLICT");
    let burns: Vec<_> = stack
        .logs_of::<AssetToken::Transfer>(token_address)
        .await
        .iter()
        .map(|l| AssetToken::Transfer::decode_log_data(l.data()).unwrap())
        .filter(|t| t.to == Address::ZERO)
        .collect();
    assert_eq!(burns.len(), 1, "exactly one burn on chain: {burns:?}");
    assert_eq!((burns[0].from, burns[0].value), (issuer, units(250)));
    assert_eq!(token.balanceOf(issuer).call().await.unwrap(), units(750));
    assert_eq!(token.totalSupply().call().await.unwrap(), units(850));

    // A forced burn without the burner role: a typed failed operation.
    let forced = |idem: &'static str, amount: &'static str| {
        let (stack, asset) = (&stack, &asset);
        async move {
            let id = stack
                .token_op(
                    asset,
                    "burn",
                    idem,
                    json!({"amount": amount, "from": holder.to_string()}),
                )
                .await;
            stack.await_op(&id, Duration::from_secs(90), terminal).await
        }
    };
    let view = forced("fb-1", "10").await;
    assert_eq!(state(&view), "failed", "{view}");
    assert_eq!(view["error"]["code"], "EXECUTION_REVERTED", "{view}");
    assert_eq!(
        view["error"]["reason"], "AccessControlUnauthorizedAccount",
        "{view}"
    );

    // The issuer grants itself the burner role; the forced burn then works.
    let role = |what: &'static str, idem: &'static str, role: &'static str, who: Address| {
        let (stack, asset) = (&stack, &asset);
        async move {
            let id = stack
                .token_op(
                    asset,
                    what,
                    idem,
                    json!({"role": role, "account": who.to_string()}),
                )
                .await;
            let view = stack.await_op(&id, Duration::from_secs(90), terminal).await;
            assert_eq!(state(&view), "completed", "{what} {role}: {view}");
            view
        }
    };
    let burner = token.BURNER_ROLE().call().await.unwrap();
    let view = role("grant-role", "g-burner", "burner", issuer).await;
    assert_eq!(view["kind"], "asset.grant-role");
    assert_eq!(view["result"]["role"], "burner", "{view}");
    assert_eq!(view["result"]["changed"], true, "{view}");
    assert_eq!(confirmed_steps(&view), ["grant-role"]);
    assert!(token.hasRole(burner, issuer).call().await.unwrap());
    let view = forced("fb-2", "10").await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(confirmed_steps(&view), ["forced-burn"]);
    assert_eq!(token.balanceOf(holder).call().await.unwrap(), units(90));
    let forced_logs = stack.logs_of::<AssetToken::ForcedBurn>(token_address).await;
    assert_eq!(forced_logs.len(), 1);
    // Above the holder's balance: the revert surfaces typed, nothing changes.
    let view = forced("fb-3", "1000").await;
    assert_eq!(state(&view), "failed", "{view}");
    assert_eq!(view["error"]["code"], "EXECUTION_REVERTED", "{view}");
    assert_eq!(
        view["error"]["reason"], "ERC20InsufficientBalance",
        "{view}"
    );
    assert_eq!(token.balanceOf(holder).call().await.unwrap(), units(90));

    // Grant, repeated grant (no effect) and revoke of a minter role, checked on chain.
    let minter = token.MINTER_ROLE().call().await.unwrap();
    assert!(!token.hasRole(minter, grantee).call().await.unwrap());
    let view = role("grant-role", "g-minter", "minter", grantee).await;
    assert_eq!(view["result"]["changed"], true, "{view}");
    assert_eq!(
        view["result"]["account"]
            .as_str()
            .unwrap()
            .parse::<Address>()
            .unwrap(),
        grantee
    );
    assert!(token.hasRole(minter, grantee).call().await.unwrap());
    let view = role("grant-role", "g-minter-2", "minter", grantee).await;
    assert_eq!(view["result"]["changed"], false, "{view}");
    assert!(token.hasRole(minter, grantee).call().await.unwrap());
    let view = role("revoke-role", "r-minter", "minter", grantee).await;
    assert_eq!(view["kind"], "asset.revoke-role");
    assert_eq!(view["result"]["changed"], true, "{view}");
    assert_eq!(confirmed_steps(&view), ["revoke-role"]);
    assert!(!token.hasRole(minter, grantee).call().await.unwrap());
    assert!(
        token.hasRole(minter, issuer).call().await.unwrap(),
        "the issuer keeps its own minter role"
    );
    let last = result_block(&view);

    // A role the token does not know: 422 with its code, nothing accepted.
    let (status, body) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/grant-role"),
            "g-admin",
            json!({"role": "admin", "account": grantee.to_string()}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "UNKNOWN_ROLE", "{body}");

    // The index: 1000 + 100 − 250 − 10.
    let (status, a) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}?minBlock={last}"))
        .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["supply"], "840", "{a}");
    let (_, bal) = stack
        .get(
            &stack.key_a,
            &format!("/v1/assets/{asset}/balances/{holder}?minBlock={last}"),
        )
        .await;
    assert_eq!(bal["balance"], "90", "{bal}");
}

/// Issue 18 §4: with a mint approval threshold, burns above it and every role change
/// wait for an approval by another key (a rejected grant leaves the role ungranted);
/// a burn below it does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burns_above_the_threshold_and_role_changes_wait_for_an_approval() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(
        chain,
        TemplateOpts {
            approval_threshold: Some("100"),
            approval_ttl_seconds: Some(600),
            ..TemplateOpts::default()
        },
    )
    .await;
    let (asset, token_address) = stack.create_active_asset("create-ab", "ABRN").await;
    let token = AssetToken::new(token_address, stack.chain.provider().clone());
    let issuer = stack.chain.account(0).unwrap();
    let grantee = stack.chain.account(6).unwrap();
    let approved = |id: String| {
        let stack = &stack;
        async move {
            let view = stack
                .await_op(&id, Duration::from_secs(30), |v| state(v) == "waiting")
                .await;
            assert_eq!(view["wait"]["for"], "approval", "{view}");
            let (status, body) = stack.act(&stack.key_a, &id, "approve").await;
            assert_eq!(status, 409, "{body}");
            assert_eq!(body["code"], "APPROVAL_SAME_KEY");
            let (status, body) = stack.act(&stack.key_b, &id, "approve").await;
            assert!(status == 200 || status == 202, "{status} {body}");
            let view = stack.await_op(&id, Duration::from_secs(60), terminal).await;
            assert_eq!(state(&view), "completed", "{view}");
        }
    };
    let mint = stack
        .token_op(
            &asset,
            "mint",
            "m-1",
            json!({"recipient": issuer.to_string(), "amount": "600"}),
        )
        .await;
    approved(mint).await;

    // Above the threshold: waits, then burns once approved.
    let big = stack
        .token_op(&asset, "burn", "b-big", json!({"amount": "500"}))
        .await;
    approved(big).await;
    assert_eq!(token.balanceOf(issuer).call().await.unwrap(), units(100));
    // At the threshold: no approval.
    let small = stack
        .token_op(&asset, "burn", "b-small", json!({"amount": "100"}))
        .await;
    let view = stack
        .await_op(&small, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(token.totalSupply().call().await.unwrap(), units(0));

    // A role change always waits when the template has a threshold.
    let minter = token.MINTER_ROLE().call().await.unwrap();
    let body = json!({"role": "minter", "account": grantee.to_string()});
    let rejected = stack
        .token_op(&asset, "grant-role", "g-1", body.clone())
        .await;
    let view = stack
        .await_op(&rejected, Duration::from_secs(30), |v| {
            state(v) == "waiting"
        })
        .await;
    assert_eq!(view["wait"]["for"], "approval", "{view}");
    let (status, body_r) = stack.act(&stack.key_b, &rejected, "reject").await;
    assert!(status == 200 || status == 202, "{status} {body_r}");
    let view = stack
        .await_op(&rejected, Duration::from_secs(30), terminal)
        .await;
    assert_eq!(view["error"]["code"], "APPROVAL_REJECTED", "{view}");
    assert!(!token.hasRole(minter, grantee).call().await.unwrap());
    let granted = stack.token_op(&asset, "grant-role", "g-2", body).await;
    approved(granted).await;
    assert!(token.hasRole(minter, grantee).call().await.unwrap());
    let revoked = stack
        .token_op(
            &asset,
            "revoke-role",
            "r-1",
            json!({"role": "minter", "account": grantee.to_string()}),
        )
        .await;
    approved(revoked).await;
    assert!(!token.hasRole(minter, grantee).call().await.unwrap());
}

/// One trace per operation, carried by the rows: a mint accepted while no runner runs
/// (the caller's `traceparent` on the request) is executed by a runner started
/// afterwards, a process that never saw the request; its workflow segments and the
/// queue's broadcast and settlement of the mint's transaction are spans of the
/// caller's trace, exported by the runner with its own resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operations_trace_runs_from_the_request_through_a_restarted_runner_to_the_settlement() {
    use opentelemetry_proto::tonic::trace::v1::Span;
    let (otlp_port, received) = otlp::receiver().await;
    let chain = TestChain::start().await.unwrap();
    let mut stack = Stack::start_with(
        chain,
        TemplateOpts::default(),
        vec![
            (
                "KEEL__TELEMETRY__OTLP__ENDPOINT".into(),
                format!("http://127.0.0.1:{otlp_port}"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
            ("RUST_LOG".into(), "info".into()),
        ],
    )
    .await;
    let (create, asset) = stack.create_asset("trace-create", "TRC").await;
    let view = stack
        .await_op(&create, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");

    // No runner: the request is only accepted (its context goes into the rows).
    stack.kill9("runner");
    let trace_id = "5af7183fb1d4cf5f8a8e7c1a2b3c4d5e";
    let caller_span = "b7ad6b7169203331";
    let holder = stack.chain.account(3).unwrap();
    let r = stack
        .http
        .post(format!("{}/v1/assets/{asset}/mint", stack.api))
        .bearer_auth(&stack.key_a)
        .header("Idempotency-Key", "trace-mint")
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({"recipient": holder.to_string(), "amount": "5"}))
        .send()
        .await
        .unwrap();
    let (status, accepted) = stack
        .checked("POST", &format!("/v1/assets/{asset}/mint"), r)
        .await;
    assert!(status == 202 || status == 200, "{status} {accepted}");
    let mint = accepted["id"].as_str().unwrap().to_owned();

    stack.spawn("runner");
    let view = stack
        .await_op(&mint, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");

    // Every span of the caller's trace, with the role of the process that exported it.
    let want = alloy::hex::decode(trace_id).unwrap();
    let spans_of_trace = || -> Vec<(String, Span)> {
        received
            .lock()
            .unwrap()
            .iter()
            .flat_map(|req| req.resource_spans.iter())
            .flat_map(|rs| {
                let role = rs
                    .resource
                    .as_ref()
                    .and_then(|r| otlp::string_attr(&r.attributes, "keel.role"))
                    .unwrap_or_default()
                    .to_owned();
                rs.scope_spans
                    .iter()
                    .flat_map(|ss| ss.spans.iter())
                    .filter(|s| s.trace_id == want)
                    .map(move |s| (role.clone(), s.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let has = |spans: &[(String, Span)], role: &str, name: &str, outcome: Option<&str>| {
        spans.iter().any(|(r, s)| {
            r == role
                && s.name == name
                && outcome.is_none_or(|o| otlp::string_attr(&s.attributes, "outcome") == Some(o))
        })
    };
    // The batch processors export within their schedule delay: probe until every
    // expected span came.
    let deadline = Instant::now() + Duration::from_secs(60);
    let spans = loop {
        let spans = spans_of_trace();
        if has(&spans, "api", "POST /v1/assets/{id}/mint", None)
            && has(&spans, "runner", "segment", None)
            && has(&spans, "runner", "txq.broadcast", Some("accepted"))
            && has(&spans, "runner", "txq.settle", Some("confirmed"))
        {
            break spans;
        }
        let names: Vec<(String, String)> = spans
            .iter()
            .map(|(r, s)| (r.clone(), s.name.clone()))
            .collect();
        assert!(
            Instant::now() < deadline,
            "the mint's trace is incomplete: {names:?}\nrunner log:\n{}",
            stack.log("runner")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The request span is the caller's child; every runner span of the trace has a
    // parent (none starts a trace of its own).
    let request = spans
        .iter()
        .find(|(_, s)| s.name == "POST /v1/assets/{id}/mint")
        .unwrap();
    assert_eq!(
        request.1.parent_span_id,
        alloy::hex::decode(caller_span).unwrap()
    );
    for (role, s) in &spans {
        if role == "runner" {
            assert!(!s.parent_span_id.is_empty(), "{} has no parent", s.name);
        }
    }
    // The creation ran before, with no caller trace: none of its spans is in this one.
    let segments = spans
        .iter()
        .filter(|(r, s)| r == "runner" && s.name == "segment")
        .count();
    assert!(segments >= 1);
}

/// The senders (tx `from`) of every confirmed write of `view`, in order.
async fn confirmed_senders(stack: &Stack, view: &Value) -> Vec<Address> {
    let mut out = Vec::new();
    for m in view["milestones"]["confirmed"].as_array().unwrap() {
        let hash: B256 = m["txHash"].as_str().unwrap().parse().unwrap();
        let tx = stack
            .chain
            .provider()
            .get_transaction_by_hash(hash)
            .await
            .unwrap()
            .unwrap();
        out.push(tx.inner.signer());
    }
    out
}

/// Issue 35 §2, a signer pool per chain: with two pool senders besides the operator,
/// new assets get the pool's senders in turn as issuers (every write of an asset's
/// creation and its later operations come from its issuer, each sender on its own
/// nonce stream); a pool sender's token also gives the operator DEFAULT_ADMIN_ROLE.
/// Platform Status lists every registered sender with its balance, and `keel signer
/// list` lists the pool. A retired pool sender (its key removed from the runner) never
/// wedges its asset: its operations are sent by the operator, which can grant itself
/// the roles it needs, while the other assets go on on their own senders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_pool_spreads_assets_over_its_senders_and_keeps_each_assets_writes_on_its_sender()
{
    let chain = TestChain::start().await.unwrap();
    let hex = |i: usize| {
        format!(
            "0x{}",
            alloy::hex::encode(chain.signer(i).unwrap().to_bytes())
        )
    };
    let pool_env = |names: &[(&str, usize)]| -> Vec<(String, String)> {
        let mut env = Vec::new();
        for (name, i) in names {
            let upper = name.to_uppercase();
            env.push((
                format!("KEEL__CHAINS__LOCAL__SENDERS__{upper}__KIND"),
                "env".to_owned(),
            ));
            env.push((
                format!("KEEL__CHAINS__LOCAL__SENDERS__{upper}__VAR"),
                format!("KEEL_POOL_KEY_{upper}"),
            ));
            env.push((format!("KEEL_POOL_KEY_{upper}"), hex(*i)));
        }
        env
    };
    let (operator, s1, s2) = (
        chain.account(0).unwrap(),
        chain.account(8).unwrap(),
        chain.account(9).unwrap(),
    );
    let extra = pool_env(&[("s1", 8), ("s2", 9)]);
    let mut stack = Stack::start_with(chain, TemplateOpts::default(), extra).await;

    // `keel signer list` names the pool senders on their chain.
    let list = stack.cli(&["signer", "list"]);
    for (name, address) in [("sender:s1", s1), ("sender:s2", s2)] {
        assert!(
            list.lines()
                .any(|l| l.starts_with(name) && l.contains(&address.to_string())),
            "{list}"
        );
    }

    // Three assets: one per sender of the pool, in turn (operator, s1, s2).
    let mut assets = Vec::new();
    for (i, symbol) in ["PLA", "PLB", "PLC"].iter().enumerate() {
        let (op, asset) = stack.create_asset(&format!("pool-{i}"), symbol).await;
        let view = stack
            .await_op(&op, Duration::from_secs(120), terminal)
            .await;
        assert_eq!(state(&view), "completed", "{view}");
        let (_, a) = stack
            .get(&stack.key_a, &format!("/v1/assets/{asset}"))
            .await;
        let issuer: Address = a["issuerAddress"].as_str().unwrap().parse().unwrap();
        let token: Address = a["tokenAddress"].as_str().unwrap().parse().unwrap();
        let senders = confirmed_senders(&stack, &view).await;
        assert!(
            senders.iter().all(|s| *s == issuer),
            "every creation write comes from the asset's issuer {issuer}: {senders:?}"
        );
        let steps = confirmed_steps(&view);
        assert_eq!(
            steps.contains(&"grant-admin".to_owned()),
            issuer != operator,
            "{steps:?}"
        );
        assets.push((asset, issuer, token));
    }
    let issuers: Vec<Address> = assets.iter().map(|(_, i, _)| *i).collect();
    assert_eq!(issuers, vec![operator, s1, s2], "round-robin over the pool");
    for (_, issuer, token) in &assets {
        let t = AssetToken::new(*token, stack.chain.provider());
        let admin = t.DEFAULT_ADMIN_ROLE().call().await.unwrap();
        assert!(t.hasRole(admin, *issuer).call().await.unwrap());
        assert!(
            t.hasRole(admin, operator).call().await.unwrap(),
            "the operator administers every asset"
        );
    }

    // Later operations of an asset are sent by its issuer.
    for (i, (asset, issuer, _)) in assets.iter().enumerate() {
        let id = stack
            .token_op(
                asset,
                "mint",
                &format!("pool-mint-{i}"),
                json!({"recipient": stack.chain.account(6).unwrap().to_string(), "amount": "5"}),
            )
            .await;
        let view = stack.await_op(&id, Duration::from_secs(90), terminal).await;
        assert_eq!(state(&view), "completed", "{view}");
        assert_eq!(
            confirmed_senders(&stack, &view).await,
            vec![*issuer],
            "{view}"
        );
    }

    // Platform Status lists each sender of the pool with its balance.
    let (status, page) = stack.get(&stack.key_a, "/v1/status").await;
    assert_eq!(status, 200, "{page}");
    let queue = page["queue"].as_array().unwrap();
    for who in [operator, s1, s2] {
        let row = queue
            .iter()
            .find(|q| q["sender"].as_str() == Some(who.to_checksum(None).as_str()))
            .unwrap_or_else(|| panic!("{who} missing from {page}"));
        let balance: u128 = row["balanceWei"].as_str().unwrap().parse().unwrap();
        assert!(balance > 0, "{row}");
        assert_eq!(row["depth"], 0, "{row}");
    }

    // s2 retired: the runner restarts without its key. Its asset's operations go to
    // the operator (DEFAULT_ADMIN_ROLE from creation): it grants itself the minter role
    // and mints; s1's asset still mints from s1.
    stack.kill9("runner");
    stack
        .env
        .retain(|(k, _)| !k.contains("SENDERS__S2") && k != "KEEL_POOL_KEY_S2");
    stack.spawn("runner");
    let (asset_c, _, token_c) = assets[2].clone();
    let id = stack
        .token_op(
            &asset_c,
            "grant-role",
            "pool-grant",
            json!({"role": "minter", "account": operator.to_string()}),
        )
        .await;
    let view = stack.await_op(&id, Duration::from_secs(90), terminal).await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(confirmed_senders(&stack, &view).await, vec![operator]);
    let id = stack
        .token_op(
            &asset_c,
            "mint",
            "pool-mint-c2",
            json!({"recipient": stack.chain.account(6).unwrap().to_string(), "amount": "2"}),
        )
        .await;
    let view = stack.await_op(&id, Duration::from_secs(90), terminal).await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(confirmed_senders(&stack, &view).await, vec![operator]);
    let id = stack
        .token_op(
            &assets[1].0,
            "mint",
            "pool-mint-b2",
            json!({"recipient": stack.chain.account(6).unwrap().to_string(), "amount": "2"}),
        )
        .await;
    let view = stack.await_op(&id, Duration::from_secs(90), terminal).await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(confirmed_senders(&stack, &view).await, vec![s1]);
    let t = AssetToken::new(token_c, stack.chain.provider());
    assert_eq!(
        t.balanceOf(stack.chain.account(6).unwrap())
            .call()
            .await
            .unwrap(),
        units(7),
        "asset C: 5 minted by s2, 2 by the operator, nothing twice"
    );
}

/// The transactions of an operation's confirmed milestones, read from `provider`'s chain.
async fn confirmed_transactions(
    provider: &alloy::providers::DynProvider,
    view: &Value,
) -> Vec<alloy::rpc::types::Transaction> {
    let mut out = Vec::new();
    for m in view["milestones"]["confirmed"].as_array().unwrap() {
        let hash: B256 = m["txHash"].as_str().unwrap().parse().unwrap();
        out.push(
            provider
                .get_transaction_by_hash(hash)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

/// The queue's settled writes on `chain_id` whose watch has not ended (their block not
/// final for the chain yet).
async fn unfinal_writes(stack: &Stack, chain_id: u64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM txq_request
          WHERE chain_id = $1 AND state = 'settled' AND final_at IS NULL
            AND verdict_kind IN ('confirmed', 'reverted')",
    )
    .bind(chain_id as i64)
    .fetch_one(stack.db.pool())
    .await
    .unwrap()
}

/// The block the index recorded as finalized on `chain_id`.
async fn index_finalized(stack: &Stack, chain_id: u64) -> Option<u64> {
    let f: Option<i64> =
        sqlx::query_scalar("SELECT finalized_number FROM index_chain WHERE chain_id = $1")
            .bind(chain_id as i64)
            .fetch_optional(stack.db.pool())
            .await
            .unwrap()
            .flatten();
    f.map(|f| f as u64)
}

/// Issue 35 §3, chain profiles: one runner and one indexer serve two chains with
/// different profiles. Chain `local` (profile `anvil`: EIP-1559 fees, the head final
/// for the queue, `eth_subscribe` on its RPC port) and chain `second` (legacy
/// `gasPrice` fees, finality 3 blocks deep for the queue and for the index in place of
/// Anvil's `finalized` tag). Each chain's writes are priced by its model (type-2 vs
/// type-0 transactions); a settled write on `local` is final at once while one on
/// `second` stays watched until three more blocks; the index records `second`'s
/// finality 3 blocks below its head while `local` follows the node's tag (head − 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_chains_with_different_profiles_and_finality_are_served_by_one_runner_and_indexer() {
    let chain = TestChain::start().await.unwrap();
    let second = TestChain::builder().chain_id(31_338).start().await.unwrap();
    let extra: Vec<(String, String)> = [
        ("KEEL__CHAINS__LOCAL__PROFILE", "anvil".to_owned()),
        ("KEEL__CHAINS__SECOND__CHAINID", "31338".to_owned()),
        (
            "KEEL__CHAINS__SECOND__RPCURLS",
            format!("[\"{}\"]", second.endpoint()),
        ),
        ("KEEL__CHAINS__SECOND__FINALITYDEPTH", "3".to_owned()),
        ("KEEL__CHAINS__SECOND__INDEXFINALITYDEPTH", "3".to_owned()),
        ("KEEL__CHAINS__SECOND__FEES__MODEL", "legacy".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let stack = Stack::start_with(chain, TemplateOpts::default(), extra).await;

    let (op_a, _) = stack.create_asset("profiles-a", "PRA").await;
    let (status, body) = stack
        .post(
            &stack.key_a,
            "/v1/assets",
            "profiles-b",
            json!({"name": "PRB Fund", "symbol": "PRB", "decimals": 6,
                   "templateId": "second", "initialPrice": "101.25"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let op_b = body["id"].as_str().unwrap().to_owned();
    let view_a = stack
        .await_op(&op_a, Duration::from_secs(120), terminal)
        .await;
    let view_b = stack
        .await_op(&op_b, Duration::from_secs(120), terminal)
        .await;
    assert_eq!(state(&view_a), "completed", "{view_a}");
    assert_eq!(state(&view_b), "completed", "{view_b}");

    // Each chain's writes are priced by its own fee model.
    let txs_a = confirmed_transactions(stack.chain.provider(), &view_a).await;
    let txs_b = confirmed_transactions(second.provider(), &view_b).await;
    assert!(!txs_a.is_empty() && !txs_b.is_empty());
    for tx in &txs_a {
        assert_eq!(tx.inner.tx_type(), alloy::consensus::TxType::Eip1559);
    }
    for tx in &txs_b {
        assert_eq!(tx.inner.tx_type(), alloy::consensus::TxType::Legacy);
        assert_eq!(
            alloy::consensus::Transaction::chain_id(tx.inner.inner()),
            Some(31_338),
            "EIP-155 replay protection"
        );
    }

    // The queue's finality per chain: nothing has mined on `second` since its last write,
    // so that write is not 3 blocks deep yet; `local`'s head is final.
    assert!(unfinal_writes(&stack, 31_338).await > 0);
    stack
        .until(Duration::from_secs(60), "local's writes final", || async {
            (unfinal_writes(&stack, 31_337).await == 0).then_some(())
        })
        .await;
    assert!(
        unfinal_writes(&stack, 31_338).await > 0,
        "second's last write is not 3 blocks deep"
    );
    alloy::providers::ext::AnvilApi::anvil_mine(second.provider(), Some(12), None)
        .await
        .unwrap();
    stack
        .until(Duration::from_secs(60), "second's writes final", || async {
            (unfinal_writes(&stack, 31_338).await == 0).then_some(())
        })
        .await;

    // The index's finality per chain: `second` 3 below its head (refreshed every 8
    // blocks of head movement, so at most 8 behind that), `local` the node's tag.
    let head_b = second.block_number().await.unwrap();
    stack
        .until(
            Duration::from_secs(60),
            "second's index finality 3 below its head",
            || async {
                index_finalized(&stack, 31_338)
                    .await
                    .filter(|f| f + 3 + 8 >= head_b && f + 3 <= head_b)
            },
        )
        .await;
    let head_a = stack.chain.block_number().await.unwrap();
    let f_a = index_finalized(&stack, 31_337).await.unwrap_or(0);
    assert!(
        f_a <= head_a.saturating_sub(64),
        "local follows the node's finalized tag: {f_a} at head {head_a}"
    );
    // The anvil profile's indexer follows `local` over eth_subscribe on the RPC port
    // (heads received on it); `second` sets no WebSocket endpoint.
    let text = stack.scrape("indexer").await;
    let heads = |chain_id: u64| {
        text.lines()
            .find(|l| {
                l.starts_with("keel_chain_head_subscription_heads_total{")
                    && l.contains(&format!("chain_id=\"{chain_id}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert!(heads(31_337).is_some_and(|n| n > 0.0), "{text}");
    assert_eq!(heads(31_338), None, "{text}");
}
