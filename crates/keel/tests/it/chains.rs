//! Chains a process cannot reach (issue 16, class 3) and supervised critical tasks
//! (class 5a), with the `keel` binary as processes against a real PostgreSQL and real
//! Anvil nodes.
//!
//! - An indexer started while its chain's RPC port is closed keeps retrying and serves
//!   the chain (readiness, gauge, tip ingest) once the port opens.
//! - A runner started while its chain's RPC port is closed sends once it opens.
//! - Of two runners, one with a closed RPC port, the healthy one sends the chain's
//!   transactions: the other declines the `txq/<chainId>` shard.
//! - A critical task that keeps ending (tip ingest on a reorg deeper than its window)
//!   is restarted with an ERROR naming it, then the process exits non-zero.

use crate::common::{free_port, keel};

use alloy::primitives::{Address, Bytes};
use anvil_tests::TestChain;
use keel_store::testing::TestDatabase;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHAIN_ID: u64 = 31337;

/// Forwards every TCP connection to 127.0.0.1:`port` to 127.0.0.1:`target` (the chain's
/// RPC port "opens" when this starts). Aborting the returned task closes the port and
/// every forwarded connection (they live in its `JoinSet`).
async fn forward(port: u16, target: u16) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            connections.spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

fn base_env(db: &TestDatabase, rpc: &str) -> Vec<(String, String)> {
    vec![
        ("KEEL__DATABASE__URL".into(), db.url().to_owned()),
        ("KEEL__CHAINS__LOCAL__CHAINID".into(), CHAIN_ID.to_string()),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS".into(),
            format!("[\"{rpc}\"]"),
        ),
        ("KEEL__TELEMETRY__LOGFORMAT".into(), "json".into()),
        ("KEEL__TELEMETRY__METRICSADDRESS".into(), String::new()),
        ("KEEL__DURABLE__SHARDING__SHARDS".into(), "4".into()),
        (
            "KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS".into(),
            "100".into(),
        ),
        // Lock deadline 250 ms: a shared 2-core machine under load overran 100 ms.
        ("KEEL__CLUSTER__REFRESHINTERVALMS".into(), "500".into()),
        ("KEEL__CLUSTER__LIVENESSWINDOWMS".into(), "2500".into()),
        ("KEEL__INDEX__POLLINTERVALMS".into(), "100".into()),
        ("KEEL__CHAINHEALTH__RETRYINITIALMS".into(), "100".into()),
        ("KEEL__CHAINHEALTH__RETRYMAXMS".into(), "500".into()),
        ("KEEL__CHAINHEALTH__PROBEINTERVALMS".into(), "500".into()),
    ]
}

fn spawn(role: &str, env: &[(String, String)], log: &Path) -> Child {
    let file = std::fs::File::create(log).unwrap();
    keel()
        .args(["run", "--role", role, "--termination-grace-seconds", "5"])
        .envs(env.iter().cloned())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap()
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

async fn wait_exit(mut child: Child) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap()
}

async fn wait_for<F, Fut>(
    what: &str,
    bound: Duration,
    log: &Path,
    mut alive: Option<&mut Child>,
    mut check: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    loop {
        if let Some(child) = alive.as_deref_mut() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the process exited while waiting for: {what}\n--- log\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if check().await {
            return;
        }
        assert!(
            t0.elapsed() < bound,
            "timed out waiting for: {what}\n--- log\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn readyz(port: u16) -> Option<Value> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .ok()?;
    r.json().await.ok()
}

fn lists(body: &Value, which: &str, chain_id: u64) -> bool {
    body["chains"][which]
        .as_array()
        .is_some_and(|a| a.iter().any(|c| c["chainId"] == chain_id))
}

async fn served_gauge(port: u16, role: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| {
            l.starts_with("keel_chain_served{")
                && l.contains(&format!("chain_id=\"{CHAIN_ID}\""))
                && l.contains(&format!("role=\"{role}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// An indexer started while its chain's RPC port is closed stays up, reports the chain
/// unserved (readiness body, `keel_chain_served` 0), and once the port opens serves it:
/// readiness and the gauge say so and the tip ingest indexes the chain. When the port
/// closes again the chain stops being served (its tip shard declined) and is served
/// again when it reopens. Before the fix the chain was skipped for the life of the
/// process.
#[tokio::test]
async fn an_indexer_serves_a_chain_once_its_rpc_port_opens() {
    let db = TestDatabase::create().await.unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("indexer.log");
    let rpc_port = free_port();
    let metrics_port = free_port();
    let mut env = base_env(&db, &format!("http://127.0.0.1:{rpc_port}"));
    env.push((
        "KEEL__TELEMETRY__METRICSADDRESS".into(),
        format!("127.0.0.1:{metrics_port}"),
    ));
    let mut indexer = spawn("indexer", &env, &log);

    wait_for(
        "the indexer is ready with the chain unserved",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            readyz(metrics_port).await.is_some_and(|b| {
                b["status"] == "ready"
                    && lists(&b, "unserved", CHAIN_ID)
                    && !lists(&b, "served", CHAIN_ID)
            })
        },
    )
    .await;
    assert_eq!(served_gauge(metrics_port, "indexer").await, Some(0.0));
    let chain = keel_units::ChainId(CHAIN_ID);
    assert!(
        keel_index::read::indexed_tip(db.pool(), chain)
            .await
            .unwrap()
            .is_none()
    );

    // The port opens: Anvil comes up behind it.
    let anvil = TestChain::start().await.unwrap();
    let forwarder = forward(rpc_port, anvil.port()).await;
    wait_for(
        "the indexer serves the chain",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            readyz(metrics_port)
                .await
                .is_some_and(|b| lists(&b, "served", CHAIN_ID) && !lists(&b, "unserved", CHAIN_ID))
        },
    )
    .await;
    assert_eq!(served_gauge(metrics_port, "indexer").await, Some(1.0));
    anvil.mine().await.unwrap();
    wait_for(
        "the tip ingest indexes the chain",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            keel_index::read::indexed_tip(db.pool(), chain)
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("chain unreachable; retrying"), "{stderr}");

    // The port closes again: after `failuresBeforeUnserved` failed probes the chain is
    // no longer served (its tip singleton's shard is declined), and it is retried: when
    // the port opens once more it is served again.
    forwarder.abort();
    let _ = forwarder.await;
    wait_for(
        "the indexer reports the chain unserved again",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            readyz(metrics_port)
                .await
                .is_some_and(|b| lists(&b, "unserved", CHAIN_ID) && !lists(&b, "served", CHAIN_ID))
        },
    )
    .await;
    assert_eq!(served_gauge(metrics_port, "indexer").await, Some(0.0));
    // The decline is recorded with the replica's next heartbeat.
    let tip_shard = keel_cluster::shard_of(format!("index-tip/{CHAIN_ID}").as_bytes(), 4);
    let want = vec![i32::try_from(tip_shard).unwrap()];
    wait_for(
        "the indexer declines the tip singleton's shard",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            let declined: Vec<i32> =
                sqlx::query_scalar("SELECT declined_shards FROM cluster_replica")
                    .fetch_one(db.pool())
                    .await
                    .unwrap();
            declined == want
        },
    )
    .await;
    let _forwarder = forward(rpc_port, anvil.port()).await;
    wait_for(
        "the indexer serves the chain again",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            readyz(metrics_port)
                .await
                .is_some_and(|b| lists(&b, "served", CHAIN_ID))
        },
    )
    .await;
    // A chain whose index is degraded (the marker tip ingest writes after a reorg below
    // the finalized block, set here directly) makes the indexer not ready, naming it.
    sqlx::query(
        "UPDATE index_chain SET degraded_at = now(), degraded_reason = 'reorg below finality',
                                degraded_block = 1",
    )
    .execute(db.pool())
    .await
    .unwrap();
    wait_for(
        "the indexer reports the degraded chain",
        Duration::from_secs(30),
        &log,
        Some(&mut indexer),
        || async {
            readyz(metrics_port).await.is_some_and(|b| {
                b["status"] == "degraded"
                    && b["indexDegraded"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|c| c == &CHAIN_ID.to_string()))
            })
        },
    )
    .await;
    sigterm(&indexer);
    let status = wait_exit(indexer).await;
    assert!(status.success(), "exit {status:?}");
}

/// Advisory locks of the workflow group held by the replica registered as `host`.
async fn workflow_locks_of(pool: &sqlx::PgPool, host: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT l.objid::bigint FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
           JOIN cluster_replica r ON a.application_name = 'keel-cluster/workflow/' || r.id::text
          WHERE l.locktype = 'advisory' AND l.granted AND r.host = $1
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          ORDER BY 1",
    )
    .bind(host)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Two runners, one given a closed RPC port: the broken one starts first and owns every
/// shard, then the healthy one joins. The broken runner declines the `txq/31337` shard
/// (recorded in its registry row), the healthy one takes it and sends: a transaction
/// request recorded for the chain is confirmed. Readiness of each lists the chain as
/// served or unserved. Before the fix the broken runner kept the shard about half the
/// time, and then no process sent the chain's transactions.
#[tokio::test]
async fn of_two_runners_the_one_that_reaches_the_chain_sends() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let logs = tempfile::tempdir().unwrap();
    let key0 = format!(
        "0x{}",
        alloy::hex::encode(chain.signer(0).unwrap().to_bytes())
    );
    let mut good = base_env(&db, chain.endpoint().as_str());
    good.push(("KEEL_OPERATOR_KEY".into(), key0.clone()));
    good.push(("KEEL_DEPLOYER_KEY".into(), key0.clone()));
    let out = keel()
        .args(["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"])
        .envs(good.iter().cloned())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Port 1: nothing listens there (a port picked free could be taken by another
    // test's Anvil meanwhile).
    let closed = 1;
    let broken_metrics = free_port();
    let healthy_metrics = free_port();
    let mut broken = base_env(&db, &format!("http://127.0.0.1:{closed}"));
    broken.push(("KEEL_OPERATOR_KEY".into(), key0.clone()));
    broken.push(("KEEL__CLUSTER__HOST".into(), "broken".into()));
    broken.push((
        "KEEL__TELEMETRY__METRICSADDRESS".into(),
        format!("127.0.0.1:{broken_metrics}"),
    ));
    let mut healthy = good.clone();
    healthy.push(("KEEL__CLUSTER__HOST".into(), "healthy".into()));
    healthy.push((
        "KEEL__TELEMETRY__METRICSADDRESS".into(),
        format!("127.0.0.1:{healthy_metrics}"),
    ));

    let broken_log = logs.path().join("broken.log");
    let healthy_log = logs.path().join("healthy.log");
    let mut broken_proc = spawn("runner", &broken, &broken_log);
    wait_for(
        "the broken runner owns every shard",
        Duration::from_secs(30),
        &broken_log,
        Some(&mut broken_proc),
        || async { workflow_locks_of(pool, "broken").await.len() == 4 },
    )
    .await;
    let mut healthy_proc = spawn("runner", &healthy, &healthy_log);
    let txq_shard = i64::from(keel_cluster::shard_of(
        format!("txq/{CHAIN_ID}").as_bytes(),
        4,
    ));
    wait_for(
        "the healthy runner holds the txq shard",
        Duration::from_secs(30),
        &healthy_log,
        Some(&mut healthy_proc),
        || async {
            workflow_locks_of(pool, "healthy")
                .await
                .contains(&txq_shard)
        },
    )
    .await;
    let declined: Vec<i32> =
        sqlx::query_scalar("SELECT declined_shards FROM cluster_replica WHERE host = 'broken'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(
        declined.contains(&i32::try_from(txq_shard).unwrap()),
        "{declined:?}\n--- broken\n{}",
        std::fs::read_to_string(&broken_log).unwrap_or_default()
    );

    // A transaction request for the chain (recorded through the queue's own API, as a
    // workflow step does): the healthy runner's queue loop signs, sends and confirms it.
    let node = Arc::new(
        keel_chain::UpstreamPool::new(
            keel_units::ChainId(CHAIN_ID),
            keel_chain::UpstreamConfig::new(vec![chain.endpoint().to_string()]),
        )
        .unwrap(),
    );
    let queue =
        keel_txq::TxQueue::new(pool.clone(), node, keel_txq::TxQueueConfig::default()).unwrap();
    let id = queue
        .enqueue(&keel_txq::TxRequest {
            sender: chain.account(0).unwrap(),
            idempotency_key: "two-runners-1".into(),
            to: Some(Address::repeat_byte(0x11)),
            value: keel_units::Wei::new(alloy::primitives::U256::from(1u64)),
            data: Bytes::new(),
            gas_limit: Some(21_000),
            authorization_list: Vec::new(),
        })
        .await
        .unwrap();
    wait_for(
        "the request is confirmed",
        Duration::from_secs(60),
        &healthy_log,
        Some(&mut healthy_proc),
        || async {
            matches!(
                queue.status(id).await.unwrap().verdict,
                Some(keel_txq::SettlementVerdict::Confirmed { .. })
            )
        },
    )
    .await;
    let b = readyz(broken_metrics).await.unwrap();
    assert!(lists(&b, "unserved", CHAIN_ID), "{b}");
    let h = readyz(healthy_metrics).await.unwrap();
    assert!(lists(&h, "served", CHAIN_ID), "{h}");
    assert_eq!(served_gauge(broken_metrics, "runner").await, Some(0.0));
    assert_eq!(served_gauge(healthy_metrics, "runner").await, Some(1.0));
    sigterm(&broken_proc);
    sigterm(&healthy_proc);
    assert!(wait_exit(broken_proc).await.success());
    assert!(wait_exit(healthy_proc).await.success());
}

/// A runner started while its chain's RPC port is closed (the chain bootstrapped
/// through the open endpoint beforehand) reports the chain unserved, and once the port
/// opens serves it: its queue loop takes the `txq/31337` singleton and a recorded
/// transaction request is confirmed. Before the fix the runner skipped the chain for the
/// life of the process and nothing sent the request.
#[tokio::test]
async fn a_runner_serves_a_chain_once_its_rpc_port_opens() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("runner.log");
    let key0 = format!(
        "0x{}",
        alloy::hex::encode(chain.signer(0).unwrap().to_bytes())
    );
    let mut open = base_env(&db, chain.endpoint().as_str());
    open.push(("KEEL_DEPLOYER_KEY".into(), key0.clone()));
    let out = keel()
        .args(["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"])
        .envs(open.iter().cloned())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rpc_port = free_port();
    let metrics_port = free_port();
    let mut env = base_env(&db, &format!("http://127.0.0.1:{rpc_port}"));
    env.push(("KEEL_OPERATOR_KEY".into(), key0));
    env.push((
        "KEEL__TELEMETRY__METRICSADDRESS".into(),
        format!("127.0.0.1:{metrics_port}"),
    ));
    let mut runner = spawn("runner", &env, &log);
    wait_for(
        "the runner is ready with the chain unserved",
        Duration::from_secs(30),
        &log,
        Some(&mut runner),
        || async {
            readyz(metrics_port)
                .await
                .is_some_and(|b| b["status"] == "ready" && lists(&b, "unserved", CHAIN_ID))
        },
    )
    .await;
    assert_eq!(served_gauge(metrics_port, "runner").await, Some(0.0));
    let node = Arc::new(
        keel_chain::UpstreamPool::new(
            keel_units::ChainId(CHAIN_ID),
            keel_chain::UpstreamConfig::new(vec![chain.endpoint().to_string()]),
        )
        .unwrap(),
    );
    let queue =
        keel_txq::TxQueue::new(pool.clone(), node, keel_txq::TxQueueConfig::default()).unwrap();
    let id = queue
        .enqueue(&keel_txq::TxRequest {
            sender: chain.account(0).unwrap(),
            idempotency_key: "late-chain-1".into(),
            to: Some(Address::repeat_byte(0x22)),
            value: keel_units::Wei::new(alloy::primitives::U256::from(1u64)),
            data: Bytes::new(),
            gas_limit: Some(21_000),
            authorization_list: Vec::new(),
        })
        .await
        .unwrap();

    let _forwarder = forward(rpc_port, chain.port()).await;
    wait_for(
        "the runner serves the chain",
        Duration::from_secs(30),
        &log,
        Some(&mut runner),
        || async {
            readyz(metrics_port)
                .await
                .is_some_and(|b| lists(&b, "served", CHAIN_ID))
        },
    )
    .await;
    assert_eq!(served_gauge(metrics_port, "runner").await, Some(1.0));
    wait_for(
        "the request is confirmed",
        Duration::from_secs(60),
        &log,
        Some(&mut runner),
        || async {
            matches!(
                queue.status(id).await.unwrap().verdict,
                Some(keel_txq::SettlementVerdict::Confirmed { .. })
            )
        },
    )
    .await;
    sigterm(&runner);
    assert!(wait_exit(runner).await.success());
}

/// Issue 32 §4: a runner started while its chain's RPC port is closed suspends the
/// chain's work with `CHAIN_UNAVAILABLE` (retryable; the chain *is* configured, so not
/// `CHAIN_NOT_CONFIGURED`), and when the port opens the work resumes through the wake
/// of the chain becoming served, not through its recovery backoff: the recovery RETRY
/// is pushed an hour out (what 1 s doubling to 300 s reaches after a long outage, and
/// more), the operation completes anyway, and the RETRY that resumed it is the one
/// recorded as `SYSTEM` / `chain-served` (the recovery one was superseded, never ran).
/// Before the fix it waited out the backoff (the test times out).
#[tokio::test]
async fn work_suspended_on_an_unreachable_chain_resumes_when_the_chain_is_served() {
    use keel_durable::RunStatus;
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("runner.log");
    let key0 = format!(
        "0x{}",
        alloy::hex::encode(chain.signer(0).unwrap().to_bytes())
    );
    let mut open = base_env(&db, chain.endpoint().as_str());
    open.push(("KEEL_DEPLOYER_KEY".into(), key0.clone()));
    let out = keel()
        .args(["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"])
        .envs(open.iter().cloned())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The indexer reaches the chain (the creation reads its events from the index).
    let indexer = spawn("indexer", &open, &logs.path().join("indexer.log"));
    let rpc_port = free_port();
    let metrics_port = free_port();
    let mut env = base_env(&db, &format!("http://127.0.0.1:{rpc_port}"));
    env.push(("KEEL_OPERATOR_KEY".into(), key0));
    env.push((
        "KEEL__TELEMETRY__METRICSADDRESS".into(),
        format!("127.0.0.1:{metrics_port}"),
    ));
    let mut runner = spawn("runner", &env, &log);
    wait_for(
        "the runner is ready with the chain unserved",
        Duration::from_secs(30),
        &log,
        Some(&mut runner),
        || async {
            readyz(metrics_port)
                .await
                .is_some_and(|b| b["status"] == "ready" && lists(&b, "unserved", CHAIN_ID))
        },
    )
    .await;

    // Work on the chain, accepted through the operations service.
    let org = keel_workflows::tenancy::create_organization(pool, "o")
        .await
        .unwrap();
    let key = keel_workflows::tenancy::create_api_key(pool, org, "k")
        .await
        .unwrap();
    keel_workflows::tenancy::upsert_template(
        pool,
        org,
        &keel_workflows::tenancy::Template {
            id: "std".to_owned(),
            chain_id: CHAIN_ID,
            price_decimals: 8,
            staleness_bound_seconds: 86_400,
            mint_approval_threshold: None,
            approval_ttl_seconds: 600,
            funding_pause: false,
            funding_deadline_seconds: 3600,
            sender: None,
            forced_transfer_skips_compliance: false,
            batch_max_recipients: keel_workflows::tenancy::DEFAULT_BATCH_MAX_RECIPIENTS,
        },
    )
    .await
    .unwrap();
    let engine =
        keel_durable::Engine::new(pool.clone(), keel_durable::EngineConfig::default()).unwrap();
    let ops = keel_workflows::Ops::new(pool.clone(), engine.clone());
    let caller = keel_workflows::Caller {
        organization_id: org,
        api_key_id: key.id,
    };
    let accepted = ops
        .create_asset(
            caller,
            "late-chain",
            &keel_workflows::NewAsset {
                name: "Late".to_owned(),
                symbol: "LATE".to_owned(),
                decimals: 6,
                template_id: "std".to_owned(),
                initial_price: "1.25".to_owned(),
            },
        )
        .await
        .unwrap();
    let instance: uuid::Uuid =
        sqlx::query_scalar("SELECT instance_id FROM operation WHERE id = $1")
            .bind(accepted.operation.id)
            .fetch_one(pool)
            .await
            .unwrap();
    // Suspended on the chain, typed and retryable; and its recovery backoff has grown
    // past any test's patience (the recovery RETRY pushed an hour out, while it is the
    // suspension's queued RETRY).
    wait_for(
        "the creation suspends on the unreachable chain and its RETRY is pushed out",
        Duration::from_secs(30),
        &log,
        Some(&mut runner),
        || async {
            sqlx::query(
                "UPDATE durable_command c SET available_at = now() + interval '1 hour'
                   FROM durable_instance i
                  WHERE c.instance_id = $1 AND c.kind = 'retry' AND c.state = 'queued'
                    AND i.id = c.instance_id AND i.status = 'suspended'
                    AND i.error_code = 'CHAIN_UNAVAILABLE' AND i.error_retryable",
            )
            .bind(instance)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected()
                == 1
        },
    )
    .await;
    let view = ops.operation(caller, accepted.operation.id).await.unwrap();
    let error = view.error.unwrap();
    assert_eq!(error.code, "CHAIN_UNAVAILABLE");
    assert!(error.retryable);

    // The chain comes back.
    let _forwarder = forward(rpc_port, chain.port()).await;
    wait_for(
        "the creation completes",
        Duration::from_secs(90),
        &log,
        Some(&mut runner),
        || async { engine.status(instance).await.unwrap().status == RunStatus::Completed },
    )
    .await;
    let attribution = engine.attribution(instance).await.unwrap();
    let retries: Vec<(Option<String>, Option<String>)> = attribution
        .commands
        .iter()
        .filter(|c| c.kind == "retry")
        .map(|c| (c.actor.reason().map(str::to_owned), c.outcome.clone()))
        .collect();
    // Every recovery RETRY before the push ran (each re-suspended); the pushed one was
    // superseded by the wake, which ran once.
    let pushed = retries
        .iter()
        .position(|r| r.1.as_deref() == Some("superseded"))
        .unwrap_or_else(|| panic!("the pushed recovery RETRY was superseded: {retries:?}"));
    assert_eq!(
        retries[pushed].0.as_deref(),
        Some("recovery"),
        "{retries:?}"
    );
    assert_eq!(
        retries.get(pushed + 1).and_then(|r| r.0.as_deref()),
        Some("chain-served"),
        "resumed by the chain's wake, not by the recovery backoff: {retries:?}"
    );
    assert_eq!(
        retries
            .iter()
            .filter(|r| r.0.as_deref() == Some("chain-served"))
            .count(),
        1,
        "{retries:?}"
    );
    sigterm(&runner);
    assert!(wait_exit(runner).await.success());
    sigterm(&indexer);
    assert!(wait_exit(indexer).await.success());
}
