//! `keel chaos`: a multi-replica scale and fault run (issue 38 §1; not a production
//! role, not part of `scripts/test`; `scripts/scale` runs it).
//!
//! It sets up what `keel dev` does (a fresh database, an Anvil chain with 1 s blocks,
//! `chain bootstrap`, organizations, keys, templates) and puts the chain behind the
//! project's fault-injecting JSON-RPC proxy (`anvil_tests::proxy`). It starts `--api`
//! api, `--runners` runner and `--indexers` indexer processes, registers a webhook
//! endpoint served by a local receiver, and drives a workload through the API:
//! asset creations, mints and transfers across many assets, mints above the approval
//! threshold approved (or rejected) by a second key, and a noisy integrator of another
//! organization looping on a read route (the rate limits must hold it back, never the
//! workload). Meanwhile the fault schedule kills a random replica with SIGKILL and
//! restarts it, restarts PostgreSQL (`--pg-restart-command`, default
//! `pg_ctlcluster … restart`), reorgs the chain by 1 to 5 blocks and adds RPC faults.
//!
//! At the end (workload stopped, faults cleared, every replica running) it waits for
//! the work to drain and checks the invariants in [`verify`]; it prints them with
//! throughput, accept → confirmed and accept → indexed p50/p99, and resource use
//! (PostgreSQL connections and CPU, each role's RSS and CPU). Exit status 1 when an
//! invariant failed, naming it.

use anyhow::{Context, bail};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

mod client;
mod fleet;
mod verify;

use client::{Api, Receiver};
use fleet::Fleet;

/// `keel chaos` arguments: sizes, workload and fault schedule.
#[derive(Args, Debug, Clone)]
pub(crate) struct ChaosArgs {
    /// api replicas.
    #[arg(long, default_value_t = 2)]
    api: usize,
    /// runner replicas.
    #[arg(long, default_value_t = 3)]
    runners: usize,
    /// indexer replicas.
    #[arg(long, default_value_t = 3)]
    indexers: usize,
    /// Assets created before the churn (half of them with an approval threshold).
    #[arg(long, default_value_t = 6)]
    assets: usize,
    /// Token operations (mints and transfers) the workload submits per second.
    #[arg(long, default_value_t = 3.0)]
    rate: f64,
    /// Seconds the workload and the fault schedule run.
    #[arg(long, default_value_t = 300)]
    duration_secs: u64,
    /// Soak mode: run for `--soak-hours` instead of `--duration-secs`.
    #[arg(long)]
    soak: bool,
    /// Hours of a soak run.
    #[arg(long, default_value_t = 4)]
    soak_hours: u64,
    /// Seconds between two kill -9 of a random replica (0: none).
    #[arg(long, default_value_t = 20)]
    kill_every_secs: u64,
    /// Seconds between two reorgs of 1 to 5 blocks (0: none).
    #[arg(long, default_value_t = 40)]
    reorg_every_secs: u64,
    /// Seconds between two RPC faults added at the proxy (0: none).
    #[arg(long, default_value_t = 25)]
    rpc_fault_every_secs: u64,
    /// Seconds between two PostgreSQL restarts (0: none). They restart the whole server:
    /// every other client of it loses its connections.
    #[arg(long, default_value_t = 120)]
    pg_restart_every_secs: u64,
    /// The command that restarts PostgreSQL (run with `sh -c`; default: `pg_ctlcluster
    /// --skip-systemctl-redirect <version> main restart` for the cluster found in
    /// /etc/postgresql).
    #[arg(long)]
    pg_restart_command: Option<String>,
    /// Seconds the run waits for every operation to end and every webhook to be
    /// delivered after the churn.
    #[arg(long, default_value_t = 300)]
    drain_secs: u64,
    /// Database connections per replica (`database.maxConnections`).
    #[arg(long, default_value_t = 8)]
    db_connections: u32,
    /// Per-API-key requests per second at each api replica (the noisy integrator's key
    /// hits it; the workload stays below it).
    #[arg(long, default_value_t = 20)]
    key_rate_limit: u32,
    /// Seed of the fault schedule and the workload's choices (default: the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// The Anvil binary (default: `tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil`).
    #[arg(long, env = "KEEL_ANVIL")]
    anvil: Option<PathBuf>,
}

/// An operation the workload got accepted.
#[derive(Debug, Clone)]
struct Submitted {
    id: String,
    kind: &'static str,
    /// Index into the run's assets.
    asset: usize,
    recipient: String,
    /// Token base units (6 decimals).
    base_units: u128,
    /// Whether the workload decided to reject it at its approval.
    reject: bool,
}

/// One asset of the run.
#[derive(Debug, Clone)]
struct Asset {
    id: String,
    token: String,
    gated: bool,
}

/// What the fault schedule applied.
#[derive(Debug, Default, Clone)]
struct Faults {
    kills: std::collections::BTreeMap<&'static str, u64>,
    pg_restarts: u64,
    pg_restart_failures: Vec<String>,
    reorgs_by_depth: std::collections::BTreeMap<u64, u64>,
    rpc_faults: std::collections::BTreeMap<&'static str, u64>,
    unexpected_exits: Vec<(String, String)>,
}

/// Everything the run shares between its tasks.
struct Run {
    api: Api,
    key: String,
    approver: String,
    noisy: String,
    operator: String,
    rpc: reqwest::Url,
    assets: Mutex<Vec<Asset>>,
    submitted: Mutex<Vec<Submitted>>,
    refused: Mutex<Vec<String>>,
    faults: Mutex<Faults>,
    fleet: tokio::sync::Mutex<Fleet>,
    pool: sqlx::PgPool,
    db_name: String,
    stop: AtomicBool,
    seq: AtomicU64,
    noisy_ok: AtomicU64,
    noisy_limited: AtomicU64,
    pg_connections_peak: AtomicU64,
    pg_connections_sum: AtomicU64,
    pg_connection_samples: AtomicU64,
    pg_cpu: Mutex<fleet::MonotonicTicks>,
}

impl Run {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Twenty holder addresses, deterministic (`0x…c4a05e00` + i).
fn holders() -> Vec<String> {
    (0..20u64)
        .map(|i| format!("0x00000000000000000000000000000000c4a05e{i:02x}"))
        .collect()
}

/// Runs `keel <args>` with `env` to completion; its stdout (trimmed).
async fn keel_child(env: &[(String, String)], args: &[&str]) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let out = tokio::process::Command::new(exe)
        .args(args)
        .envs(env.iter().cloned())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running keel {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "keel {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// The default PostgreSQL restart command, when a Debian cluster is found.
fn default_pg_restart() -> Option<String> {
    let dir = std::fs::read_dir("/etc/postgresql").ok()?;
    let version = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .max()?;
    Some(format!(
        "pg_ctlcluster --skip-systemctl-redirect {version} main restart"
    ))
}

/// `keel chaos`: see the module documentation.
pub(crate) async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let duration = if args.soak {
        Duration::from_secs(args.soak_hours * 3600)
    } else {
        Duration::from_secs(args.duration_secs)
    };
    let replicas = args.api + args.runners + args.indexers;
    if args.api == 0 || args.runners == 0 || args.indexers == 0 {
        bail!("every role needs at least one replica (--api, --runners, --indexers)");
    }
    let db = keel_store::testing::TestDatabase::create().await.context(
        "creating a fresh database (is PostgreSQL running? DATABASE_URL names its admin connection)",
    )?;
    let server_max: i64 = sqlx::query_scalar("SELECT current_setting('max_connections')::bigint")
        .fetch_one(db.pool())
        .await
        .context("reading max_connections")?;
    let budget = u64::from(args.db_connections) * replicas as u64;
    eprintln!(
        "keel chaos: seed {seed}; {} api, {} runner, {} indexer replicas × {} connections = {budget} of the server's max_connections {server_max}",
        args.api, args.runners, args.indexers, args.db_connections
    );
    if budget as i64 > server_max - 5 {
        bail!(
            "{replicas} replicas × {} connections = {budget} would exhaust the server's max_connections {server_max}: lower --db-connections or the replica counts",
            args.db_connections
        );
    }
    let anvil_path = args.anvil.clone().unwrap_or_else(|| {
        super::workspace_root().join("tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil")
    });
    let states = tempfile::Builder::new()
        .prefix("keel-chaos-anvil-")
        .tempdir()
        .context("a directory for Anvil's states")?;
    let node = alloy::node_bindings::Anvil::at(&anvil_path)
        .block_time(1)
        .args([
            "--cache-path".to_owned(),
            states.path().display().to_string(),
        ])
        .try_spawn()
        .with_context(|| {
            format!(
                "starting Anvil at {} (run scripts/setup)",
                anvil_path.display()
            )
        })?;
    let key = node
        .keys()
        .first()
        .map(|k| format!("0x{}", alloy::hex::encode(k.to_bytes())))
        .context("Anvil has no dev account")?;
    let operator = node
        .addresses()
        .first()
        .map(ToString::to_string)
        .context("Anvil has no dev account")?;
    let rpc: reqwest::Url = node.endpoint().parse().context("Anvil's endpoint")?;
    let proxy = anvil_tests::proxy::RpcProxy::start(&rpc).await?;
    let logs = tempfile::Builder::new()
        .prefix("keel-chaos-logs-")
        .tempdir()
        .context("a log directory")?
        .keep();
    eprintln!(
        "keel chaos: Anvil at {rpc} behind the RPC proxy {}; logs in {}",
        proxy.url(),
        logs.display()
    );
    let mut env: Vec<(String, String)> = [
        ("KEEL__DATABASE__URL", db.url().to_owned()),
        (
            "KEEL__DATABASE__MAXCONNECTIONS",
            args.db_connections.to_string(),
        ),
        ("KEEL__CHAINS__LOCAL__CHAINID", node.chain_id().to_string()),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS",
            format!("[\"{}\"]", proxy.url()),
        ),
        // Reorgs of up to 5 blocks happen: the queue watches writes 12 blocks deep.
        ("KEEL__CHAINS__LOCAL__FINALITYDEPTH", "12".to_owned()),
        ("KEEL__TELEMETRY__METRICSADDRESS", String::new()),
        ("KEEL__TELEMETRY__LOGFORMAT", "json".to_owned()),
        ("KEEL__DEPLOYMENTID", "chaos".to_owned()),
        ("KEEL__DURABLE__LEASEMS", "3000".to_owned()),
        ("KEEL__CLUSTER__REFRESHINTERVALMS", "250".to_owned()),
        ("KEEL__CLUSTER__LIVENESSWINDOWMS", "1500".to_owned()),
        ("KEEL__WEBHOOKS__ALLOWHTTP", "true".to_owned()),
        ("KEEL__WEBHOOKS__ALLOWPRIVATEADDRESSES", "true".to_owned()),
        ("KEEL__WEBHOOKS__RETRYINITIALMS", "500".to_owned()),
        ("KEEL_OPERATOR_KEY", key.clone()),
        ("KEEL_DEPLOYER_KEY", key),
        ("RUST_LOG", "info".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(rate_limit_env(args.key_rate_limit));
    keel_child(
        &env,
        &["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"],
    )
    .await?;
    keel_child(&env, &["org", "create", "--name", "chaos"]).await?;
    keel_child(&env, &["org", "create", "--name", "noisy"]).await?;
    let key_a = keel_child(
        &env,
        &["api-key", "create", "--org", "chaos", "--label", "workload"],
    )
    .await?;
    let key_b = keel_child(
        &env,
        &[
            "api-key", "create", "--org", "chaos", "--label", "approver", "--scope", "read",
            "--scope", "approve",
        ],
    )
    .await?;
    let key_n = keel_child(
        &env,
        &["api-key", "create", "--org", "noisy", "--label", "loop"],
    )
    .await?;
    keel_child(
        &env,
        &[
            "template", "set", "--org", "chaos", "--id", "std", "--chain", "local",
        ],
    )
    .await?;
    keel_child(
        &env,
        &[
            "template",
            "set",
            "--org",
            "chaos",
            "--id",
            "gated",
            "--chain",
            "local",
            "--mint-approval-threshold",
            "1000",
        ],
    )
    .await?;
    let api_ports: Vec<u16> = (0..args.api)
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let mut fleet = Fleet::new(
        env,
        &logs,
        [
            ("indexer", args.indexers),
            ("runner", args.runners),
            ("api", args.api),
        ],
        &api_ports,
    )?;
    fleet.start_missing()?;
    let api = Api::new(
        api_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect(),
        Duration::from_secs(120),
    )?;
    let run = Arc::new(Run {
        api,
        key: key_a,
        approver: key_b,
        noisy: key_n,
        operator,
        rpc: rpc.clone(),
        assets: Mutex::default(),
        submitted: Mutex::default(),
        refused: Mutex::default(),
        faults: Mutex::default(),
        fleet: tokio::sync::Mutex::new(fleet),
        pool: db.pool().clone(),
        db_name: db.name().to_owned(),
        stop: AtomicBool::new(false),
        seq: AtomicU64::new(0),
        noisy_ok: AtomicU64::new(0),
        noisy_limited: AtomicU64::new(0),
        pg_connections_peak: AtomicU64::new(0),
        pg_connections_sum: AtomicU64::new(0),
        pg_connection_samples: AtomicU64::new(0),
        pg_cpu: Mutex::default(),
    });
    let outcome = drive(&run, &args, seed, duration, &proxy).await;
    run.fleet.lock().await.stop(Duration::from_secs(10)).await;
    drop(proxy);
    drop(node);
    match outcome {
        Ok(true) => {
            eprintln!(
                "keel chaos: every invariant held; logs in {}",
                logs.display()
            );
            drop(db);
            Ok(())
        }
        Ok(false) => bail!(
            "an invariant failed (see above); logs in {}",
            logs.display()
        ),
        Err(e) => Err(e.context(format!("logs in {}", logs.display()))),
    }
}

/// The api's rate-limit settings of the run (the noisy integrator's key hits the
/// per-key limit).
fn rate_limit_env(per_key: u32) -> Vec<(String, String)> {
    vec![
        (
            "KEEL__API__RATELIMIT__PERKEYREQUESTSPERSECOND".to_owned(),
            per_key.to_string(),
        ),
        (
            "KEEL__API__RATELIMIT__PERKEYBURST".to_owned(),
            (per_key * 2).to_string(),
        ),
    ]
}

/// The run after setup: readiness, webhook endpoint, assets, then the workload and the
/// faults for `duration`, then the drain and the invariants. `Ok(false)`: an invariant
/// failed.
async fn drive(
    run: &Arc<Run>,
    args: &ChaosArgs,
    seed: u64,
    duration: Duration,
    proxy: &anvil_tests::proxy::RpcProxy,
) -> anyhow::Result<bool> {
    // Readiness of every api replica.
    let http = reqwest::Client::new();
    let ports: Vec<u16> = {
        let f = run.fleet.lock().await;
        f.replicas.iter().filter_map(|r| r.api_port).collect()
    };
    for port in ports {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(r) = http
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                && r.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the api replica on port {port} was not ready within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let receiver = Receiver::start().await?;
    let (status, created) = run
        .api
        .post(
            &run.key,
            "/v1/webhook-endpoints",
            "chaos-endpoint",
            &json!({"url": receiver.url, "eventTypes": ["*"], "description": "chaos"}),
        )
        .await?;
    if status != 201 && status != 200 {
        bail!("POST /v1/webhook-endpoints answered {status}: {created}");
    }
    eprintln!(
        "keel chaos: all replicas ready; webhook receiver at {}",
        receiver.url
    );

    // The assets, created before the churn.
    let started = Instant::now();
    for i in 0..args.assets {
        create_asset(run, i, i % 2 == 1).await?;
    }
    await_assets(run, args.assets, Duration::from_secs(300)).await?;
    // The issuer's float, minted once per asset.
    let count = Run::lock(&run.assets).len();
    for a in 0..count {
        submit(
            run,
            a,
            "mint",
            run.operator.clone(),
            900_000 * 1_000_000,
            false,
        )
        .await;
    }
    // Transfers move the issuer's holdings: the float is on chain before they start
    // (operations of one asset need not run in acceptance order).
    let floats: Vec<String> = Run::lock(&run.submitted)
        .iter()
        .filter(|s| s.kind == "mint")
        .map(|s| s.id.clone())
        .collect();
    await_completed(run, &floats, Duration::from_secs(300)).await?;
    eprintln!(
        "keel chaos: {count} assets active in {:.0} s; the workload and the fault schedule run for {} s",
        started.elapsed().as_secs_f64(),
        duration.as_secs()
    );

    // Workload, approvals, noisy integrator, faults, sampler.
    let churn_started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let run = run.clone();
        let rate = args.rate;
        tasks.spawn(async move { workload(run, rate, seed).await });
    }
    {
        let run = run.clone();
        tasks.spawn(async move { approvals(run).await });
    }
    {
        let run = run.clone();
        tasks.spawn(async move { noisy(run).await });
    }
    {
        let run = run.clone();
        tasks.spawn(async move { sampler(run).await });
    }
    let faults = schedule(run, args, seed, proxy);
    let churn = async {
        tokio::time::sleep(duration).await;
        run.stop.store(true, Ordering::Release);
    };
    let (fault_outcome, ()) = tokio::join!(faults, churn);
    fault_outcome?;
    while let Some(r) = tasks.join_next().await {
        if let Ok(Err(e)) = r {
            eprintln!("keel chaos: a workload task ended: {e:#}");
        }
    }
    let churn_secs = churn_started.elapsed().as_secs_f64();
    proxy.clear_rules();
    {
        let mut f = run.fleet.lock().await;
        let exited = f.exited();
        Run::lock(&run.faults).unexpected_exits.extend(exited);
        f.start_missing()?;
    }
    eprintln!("keel chaos: churn over after {churn_secs:.0} s; faults cleared; draining");
    // The approvals loop ended with the churn: the drain decides what is still waiting.
    let report = verify::drain_and_check(run, args, &receiver, churn_secs).await?;
    Ok(report)
}

/// `POST /v1/assets` (template `gated` when `gated`); records the asset.
async fn create_asset(run: &Run, i: usize, gated: bool) -> anyhow::Result<()> {
    let (status, op) = run
        .api
        .post(
            &run.key,
            "/v1/assets",
            &format!("chaos-asset-{i}"),
            &json!({
                "name": format!("Chaos Fund {i}"), "symbol": format!("CH{i}"), "decimals": 6,
                "templateId": if gated { "gated" } else { "std" }, "initialPrice": "100",
            }),
        )
        .await?;
    if status != 202 && status != 200 {
        bail!("POST /v1/assets answered {status}: {op}");
    }
    let id = op["assetId"].as_str().context("no assetId")?.to_owned();
    Run::lock(&run.assets).push(Asset {
        id,
        token: String::new(),
        gated,
    });
    Run::lock(&run.submitted).push(Submitted {
        id: op["id"].as_str().context("no id")?.to_owned(),
        kind: "create",
        asset: i,
        recipient: String::new(),
        base_units: 0,
        reject: false,
    });
    Ok(())
}

/// Waits until the first `n` assets are active; records their token addresses.
async fn await_assets(run: &Run, n: usize, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let pending: Vec<(usize, String)> = Run::lock(&run.assets)
            .iter()
            .enumerate()
            .take(n)
            .filter(|(_, a)| a.token.is_empty())
            .map(|(i, a)| (i, a.id.clone()))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        for (i, id) in pending {
            let (status, a) = run.api.get(&run.key, &format!("/v1/assets/{id}")).await?;
            if status == 200
                && a["status"] == "active"
                && let Some(token) = a["tokenAddress"].as_str()
                && let Some(asset) = Run::lock(&run.assets).get_mut(i)
            {
                asset.token = token.to_owned();
            }
            if a["status"] == "failed" {
                bail!("asset {id} failed to create: {a}");
            }
        }
        if Instant::now() > deadline {
            bail!("assets were not active within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until every operation of `ids` completed, approving those that wait for an
/// approval.
async fn await_completed(run: &Run, ids: &[String], within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    for id in ids {
        loop {
            // The gated assets' floats are above their approval threshold.
            decide_waiting(run).await;
            let (status, v) = run
                .api
                .get(&run.key, &format!("/v1/operations/{id}"))
                .await?;
            match v["state"].as_str() {
                Some("completed") if status == 200 => break,
                Some("failed" | "cancelled") => {
                    bail!("operation {id} ended {}: {}", v["state"], v["error"])
                }
                _ if Instant::now() > deadline => {
                    bail!("operation {id} did not complete within {within:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    Ok(())
}

/// Submits one token operation; records it when accepted, its refusal otherwise.
async fn submit(
    run: &Run,
    asset: usize,
    what: &'static str,
    recipient: String,
    base_units: u128,
    reject: bool,
) {
    let Some(asset_id) = Run::lock(&run.assets).get(asset).map(|a| a.id.clone()) else {
        return;
    };
    let seq = run.seq.fetch_add(1, Ordering::Relaxed);
    let amount = format!("{}.{:06}", base_units / 1_000_000, base_units % 1_000_000);
    let body = json!({"recipient": recipient, "amount": amount});
    let idem = format!("chaos-{what}-{seq}");
    match run
        .api
        .post(
            &run.key,
            &format!("/v1/assets/{asset_id}/{what}"),
            &idem,
            &body,
        )
        .await
    {
        Ok((status, op)) if status == 200 || status == 202 => {
            if let Some(id) = op["id"].as_str() {
                Run::lock(&run.submitted).push(Submitted {
                    id: id.to_owned(),
                    kind: what,
                    asset,
                    recipient,
                    base_units,
                    reject,
                });
            }
        }
        Ok((status, body)) => Run::lock(&run.refused).push(format!(
            "{what} {idem}: {status} {}",
            body["code"].as_str().unwrap_or("?")
        )),
        Err(e) => Run::lock(&run.refused).push(format!("{what} {idem}: {e:#}")),
    }
}

/// Mints and transfers at `rate` per second across the assets, with unique amounts
/// (so an effect applied twice shows in the balances).
async fn workload(run: Arc<Run>, rate: f64, seed: u64) -> anyhow::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let holders = holders();
    let period = Duration::from_secs_f64(1.0 / rate.max(0.01));
    let mut tick = tokio::time::interval(period);
    let mut inflight = tokio::task::JoinSet::new();
    let mut n: u64 = 0;
    while !run.stopped() {
        tick.tick().await;
        n += 1;
        let assets = Run::lock(&run.assets).len();
        if assets == 0 {
            continue;
        }
        let asset = rng.gen_range(0..assets);
        let gated = Run::lock(&run.assets).get(asset).is_some_and(|a| a.gated);
        let holder = holders[rng.gen_range(0..holders.len())].clone();
        let unique = u128::from(n % 1_000_000);
        let roll: u32 = rng.gen_range(0..100);
        let run = run.clone();
        let (what, base_units, reject) = if roll < 45 {
            ("mint", (1 + u128::from(n % 50)) * 1_000_000 + unique, false)
        } else if roll < 90 {
            (
                "transfer",
                (1 + u128::from(n % 20)) * 1_000_000 + unique,
                false,
            )
        } else if gated {
            // Above the gated template's threshold (1000): waits for an approval.
            ("mint", 2_000 * 1_000_000 + unique, roll >= 97)
        } else {
            ("mint", 3 * 1_000_000 + unique, false)
        };
        inflight.spawn(async move { submit(&run, asset, what, holder, base_units, reject).await });
        while inflight.try_join_next().is_some() {}
    }
    while inflight.join_next().await.is_some() {}
    Ok(())
}

/// Every 2 s: approves (or, when the workload decided so, rejects) the operations
/// waiting for an approval, with the second key.
async fn approvals(run: Arc<Run>) -> anyhow::Result<()> {
    while !run.stopped() {
        decide_waiting(&run).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// One pass of the approver over the waiting operations.
async fn decide_waiting(run: &Run) {
    let Ok(waiting) = run
        .api
        .all(&run.approver, "/v1/operations?state=waiting&limit=200")
        .await
    else {
        return;
    };
    for op in waiting {
        if op["wait"]["for"] != "approval" {
            continue;
        }
        let Some(id) = op["id"].as_str() else {
            continue;
        };
        let reject = Run::lock(&run.submitted)
            .iter()
            .any(|s| s.id == id && s.reject);
        let decision = if reject { "reject" } else { "approve" };
        let _ = run
            .api
            .post(
                &run.approver,
                &format!("/v1/operations/{id}/{decision}"),
                &format!("chaos-{decision}-{id}"),
                &json!({}),
            )
            .await;
    }
}

/// Another organization's integrator in a tight loop on a read route: about 100
/// requests per second, over the per-key limit.
async fn noisy(run: Arc<Run>) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while !run.stopped() {
        tick.tick().await;
        match run.api.get_once(&run.noisy, "/v1/assets?limit=1").await {
            Some(429) => run.noisy_limited.fetch_add(1, Ordering::Relaxed),
            Some(_) => run.noisy_ok.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
    }
    Ok(())
}

/// Every 2 s: each replica's RSS and CPU, PostgreSQL's connections to the run's
/// database and the server's CPU.
async fn sampler(run: Arc<Run>) -> anyhow::Result<()> {
    while !run.stopped() {
        sample_once(&run).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(())
}

async fn sample_once(run: &Run) {
    run.fleet.lock().await.sample();
    Run::lock(&run.pg_cpu).observe(fleet::postgres_cpu_ticks());
    if let Ok(n) =
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
            .bind(&run.db_name)
            .fetch_one(&run.pool)
            .await
    {
        let n = u64::try_from(n).unwrap_or(0);
        run.pg_connections_peak.fetch_max(n, Ordering::Relaxed);
        run.pg_connections_sum.fetch_add(n, Ordering::Relaxed);
        run.pg_connection_samples.fetch_add(1, Ordering::Relaxed);
    }
}

/// The fault schedule until the churn ends: kill -9 and restart a random replica,
/// PostgreSQL restarts, reorgs of 1-5 blocks, RPC faults at the proxy; a replica that
/// exited by itself is recorded and restarted.
async fn schedule(
    run: &Run,
    args: &ChaosArgs,
    seed: u64,
    proxy: &anvil_tests::proxy::RpcProxy,
) -> anyhow::Result<()> {
    use anvil_tests::proxy::Rule;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pg_restart = args.pg_restart_command.clone().or_else(default_pg_restart);
    if args.pg_restart_every_secs > 0 && pg_restart.is_none() {
        eprintln!(
            "keel chaos: no PostgreSQL restart command (none given, no /etc/postgresql): restarts skipped"
        );
    }
    let every = |s: u64| (s > 0).then(|| Duration::from_secs(s));
    let plan = [
        (every(args.kill_every_secs), 0u8),
        (every(args.pg_restart_every_secs), 1),
        (every(args.reorg_every_secs), 2),
        (every(args.rpc_fault_every_secs), 3),
    ];
    let start = Instant::now();
    let mut next: Vec<(Instant, Duration, u8)> = plan
        .iter()
        .filter_map(|(d, k)| d.map(|d| (start + d, d, *k)))
        .collect();
    let provider_http = reqwest::Client::new();
    while !run.stopped() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        {
            let mut f = run.fleet.lock().await;
            let exited = f.exited();
            if !exited.is_empty() {
                for (name, status) in &exited {
                    eprintln!("keel chaos: {name} exited by itself ({status}); restarting it");
                }
                Run::lock(&run.faults).unexpected_exits.extend(exited);
                f.start_missing()?;
            }
        }
        let now = Instant::now();
        for slot in &mut next {
            if now < slot.0 {
                continue;
            }
            slot.0 = now + slot.1;
            match slot.2 {
                0 => {
                    let mut f = run.fleet.lock().await;
                    let i = rng.gen_range(0..f.replicas.len());
                    let role = f.replicas[i].role;
                    let name = f.replicas[i].name.clone();
                    f.kill9(i).await;
                    *Run::lock(&run.faults).kills.entry(role).or_default() += 1;
                    eprintln!("keel chaos: kill -9 {name}");
                    drop(f);
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(500..3000))).await;
                    run.fleet.lock().await.start(i)?;
                }
                1 => {
                    let Some(cmd) = &pg_restart else { continue };
                    eprintln!("keel chaos: restarting PostgreSQL");
                    let out = tokio::process::Command::new("sh")
                        .args(["-c", cmd])
                        .output()
                        .await;
                    match out {
                        Ok(o) if o.status.success() => Run::lock(&run.faults).pg_restarts += 1,
                        Ok(o) => Run::lock(&run.faults)
                            .pg_restart_failures
                            .push(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
                        Err(e) => Run::lock(&run.faults)
                            .pg_restart_failures
                            .push(e.to_string()),
                    }
                }
                2 => {
                    let depth: u64 = rng.gen_range(1..=5);
                    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "anvil_reorg", "params": [depth, []]});
                    let ok = provider_http
                        .post(run.rpc.clone())
                        .json(&body)
                        .send()
                        .await
                        .ok()
                        .map(|r| r.status().is_success())
                        .unwrap_or(false);
                    if ok {
                        *Run::lock(&run.faults)
                            .reorgs_by_depth
                            .entry(depth)
                            .or_default() += 1;
                        eprintln!("keel chaos: reorg of depth {depth}");
                    }
                }
                _ => {
                    let (label, rule) = match rng.gen_range(0..5) {
                        0 => (
                            "send reply lost",
                            Rule::drop_response("eth_sendRawTransaction").times(2),
                        ),
                        1 => (
                            "receipt 503",
                            Rule::fail_then_recover("eth_getTransactionReceipt", 5),
                        ),
                        2 => (
                            "logs error",
                            Rule::error("eth_getLogs", -32603, "internal error").times(3),
                        ),
                        3 => (
                            "head latency",
                            Rule::latency("eth_blockNumber", Duration::from_millis(800)).times(10),
                        ),
                        _ => (
                            "estimate 503",
                            Rule::fail_then_recover("eth_estimateGas", 3),
                        ),
                    };
                    proxy.add_rule(rule);
                    *Run::lock(&run.faults).rpc_faults.entry(label).or_default() += 1;
                }
            }
        }
    }
    Ok(())
}
