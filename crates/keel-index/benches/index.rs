//! Ledger Index benchmark (issue 6): historical catch-up of N ERC-20 `Transfer` events
//! on Anvil into PostgreSQL with 1 and with 3 [`HistoryWorker`]s, tip-ingest
//! throughput over the same blocks, and tip latency (block mined → indexed and visible
//! through `wait_for_block`) at 1 s block time. Optionally, in the same run, the Ponder
//! peer (`benches/peers/ponder`) indexing the same events from the same Anvil into the
//! same PostgreSQL server, printed as a ratio.
//!
//! `cargo bench -p keel-index --bench index`. Environment (defaults in brackets):
//! `KEEL_INDEX_BENCH_EVENTS` [1000000] events (the figure; 100000 for a quick run),
//! `KEEL_INDEX_BENCH_EVENTS_PER_BLOCK` [1000] (one transaction per block emits them),
//! `KEEL_INDEX_BENCH_RANGE` [10] blocks per history range,
//! `KEEL_INDEX_BENCH_SPAN` [20] largest `eth_getLogs` span of a worker,
//! `KEEL_INDEX_BENCH_CONCURRENCY` [16] `eth_getLogs` in flight per worker process,
//! `KEEL_INDEX_BENCH_WRITERS` [2 for one process, 1 for several] range writers per
//! worker process,
//! `KEEL_INDEX_BENCH_WORKERS` [1,3] worker-process counts of the history cases,
//! `KEEL_INDEX_BENCH_LATENCY_BLOCKS` [20] blocks per latency run,
//! `KEEL_INDEX_BENCH_POLL_MS` [100] tip-ingest poll intervals of the latency runs (100
//! is the configuration's default `index.pollIntervalMs`),
//! `KEEL_INDEX_BENCH_HEAD_MS` [10] `eth_blockNumber` interval of the head-watching
//! latency variant,
//! `KEEL_INDEX_BENCH_PEER` [1] (0 skips Ponder; it runs only when
//! `benches/peers/ponder/node_modules` exists).
//!
//! The events come from a 71-byte contract assembled here (no Solidity compiler
//! needed): `fallback(uint256 n)` emits `Transfer(msg.sender, address(i + 1), i + 1)`
//! for i in 0..n. It is put in the index scope as an asset token, so every event is
//! a raw `index_log` row and an `index_transfer` row. Transactions are sent with
//! automine off and packed into blocks with `evm_mine`; 40 empty blocks follow, so
//! every event is at least 30 blocks deep (Ponder's finality distance for this chain:
//! it backfills only below it and takes the rest block by block through its live path).
//!
//! The program does nothing unless it gets `--bench` (which `cargo bench` passes), so
//! `cargo test --benches` stays cheap. Needs `scripts/setup` (PostgreSQL, Anvil).

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::TransactionRequest;
use anvil_tests::{ChainBuilder, TestChain};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::scope::{self, ScopeEntry};
use keel_index::{HistoryConfig, HistoryWorker, ScopeKind, TipConfig, TipIngest, plan_history};
use keel_store::testing::TestDatabase;
use keel_units::ChainId;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// keccak256("Transfer(address,address,uint256)").
const TRANSFER_TOPIC: [u8; 32] = [
    0xdd, 0xf2, 0x52, 0xad, 0x1b, 0xe2, 0xc8, 0x9b, 0x69, 0xc2, 0xb0, 0x68, 0xfc, 0x37, 0x8d, 0xaa,
    0x95, 0x2b, 0xa7, 0xf1, 0x63, 0xc4, 0xa1, 0x16, 0x28, 0xf5, 0x5a, 0x4d, 0xf5, 0x23, 0xb3, 0xef,
];

/// Blocks mined above the workload before indexing starts.
const EMPTY_BLOCKS_ON_TOP: u64 = 40;

/// Init code of the batch emitter: copies the runtime below into memory and returns it.
fn emitter_init_code() -> Vec<u8> {
    let mut runtime = vec![
        0x60, 0x00, 0x35, // n = calldataload(0)
        0x60, 0x00, // i = 0
        0x5b, // 0x05 loop:
        0x81, 0x81, 0x10, 0x15, 0x60, 0x45, 0x57, // if !(i < n) goto end
        0x80, 0x60, 0x01, 0x01, 0x60, 0x00, 0x52, // mstore(0, i + 1)
        0x80, 0x60, 0x01, 0x01, // to = i + 1
        0x33, // from = caller
        0x7f, // push32 topic
    ];
    runtime.extend_from_slice(&TRANSFER_TOPIC);
    runtime.extend_from_slice(&[
        0x60, 0x20, 0x60, 0x00, 0xa3, // log3(0, 32, topic, from, to)
        0x60, 0x01, 0x01, // i += 1
        0x60, 0x05, 0x56, // goto loop
        0x5b, 0x00, // 0x45 end: stop
    ]);
    assert_eq!(runtime.len(), 0x47);
    let len = u8::try_from(runtime.len()).unwrap_or(u8::MAX);
    let mut init = vec![
        0x60, len, 0x80, 0x60, 0x0b, 0x60, 0x00, 0x39, // codecopy(0, 11, len)
        0x60, 0x00, 0xf3, // return(0, len)
    ];
    init.extend(runtime);
    init
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// An upstream pool for a local node: no provider plan to respect.
fn node(url: &str, chain_id: u64) -> anyhow::Result<Arc<UpstreamPool>> {
    let mut upstream = UpstreamConfig::new(vec![url.to_owned()]);
    upstream.requests_per_second = 1_000_000;
    upstream.burst = 1_000_000;
    upstream.request_timeout = Duration::from_secs(60);
    Ok(Arc::new(UpstreamPool::new(ChainId(chain_id), upstream)?))
}

/// Settings of a history worker process.
#[derive(Debug, Clone)]
struct WorkerArgs {
    database_url: String,
    rpc_url: String,
    chain_id: u64,
    id: String,
    span: u64,
    concurrency: u64,
    writers: u64,
}

impl WorkerArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            "--history-worker".into(),
            self.database_url.clone(),
            self.rpc_url.clone(),
            self.chain_id.to_string(),
            self.id.clone(),
            self.span.to_string(),
            self.concurrency.to_string(),
            self.writers.to_string(),
        ]
    }

    fn parse(args: &[String]) -> anyhow::Result<Self> {
        let at = |i: usize| {
            args.get(i)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("--history-worker needs 7 arguments"))
        };
        Ok(Self {
            database_url: at(0)?,
            rpc_url: at(1)?,
            chain_id: at(2)?.parse()?,
            id: at(3)?,
            span: at(4)?.parse()?,
            concurrency: at(5)?.parse()?,
            writers: at(6)?.parse()?,
        })
    }
}

/// `--history-worker`: one indexer process's history worker. Connects (own pool, own
/// upstream pool), prints `ready`, waits for a line on stdin, drains every claimable
/// range with the pipelined worker, prints `done ranges=R logs=L cpu_s=S`, and exits
/// at the next line on stdin.
async fn history_worker_process(args: WorkerArgs) -> anyhow::Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(args.writers)? + 3)
        .connect(&args.database_url)
        .await?;
    // Connect (and check the database) before the clock starts.
    keel_index::history::pending_ranges(&pool, ChainId(args.chain_id)).await?;
    let worker = HistoryWorker::new(
        pool,
        node(&args.rpc_url, args.chain_id)?,
        args.id.clone(),
        HistoryConfig {
            lease: Duration::from_secs(60),
            max_span: args.span,
            retries: 5,
        },
    )?
    .with_fetch_concurrency(usize::try_from(args.concurrency)?)
    .with_write_concurrency(usize::try_from(args.writers)?);
    println!("ready");
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    stdin.read_line(&mut line).await?;
    let done = worker.drain().await?;
    println!(
        "done ranges={} logs={} cpu_s={:.2}",
        done.len(),
        done.iter().map(|d| d.logs).sum::<u64>(),
        own_cpu_seconds()
    );
    // Keep the pool (and its server backends) until the driver has read the backends'
    // CPU time.
    line.clear();
    stdin.read_line(&mut line).await?;
    Ok(())
}

/// The chain with the emitter deployed, automine off.
struct Workload {
    chain: TestChain,
    emitter: Address,
    nonce: u64,
}

impl Workload {
    async fn start() -> anyhow::Result<Self> {
        let chain = ChainBuilder::new().high_throughput().start().await?;
        let p = chain.provider();
        let receipt = p
            .send_transaction(
                TransactionRequest::default().with_deploy_code(Bytes::from(emitter_init_code())),
            )
            .await?
            .get_receipt()
            .await?;
        let emitter = receipt
            .contract_address
            .ok_or_else(|| anyhow::anyhow!("emitter not deployed"))?;
        p.anvil_set_auto_mine(false).await?;
        let nonce = p.get_transaction_count(chain.account(0)?).await?;
        Ok(Self {
            chain,
            emitter,
            nonce,
        })
    }

    /// Sends one transaction emitting `events` Transfer events (not yet mined).
    async fn send(&mut self, events: u64) -> anyhow::Result<()> {
        let tx = TransactionRequest::default()
            .with_to(self.emitter)
            .with_input(Bytes::from(U256::from(events).to_be_bytes::<32>().to_vec()))
            .with_nonce(self.nonce)
            .with_chain_id(self.chain.chain_id())
            .with_gas_limit(60_000 + events * 2_200)
            .with_max_fee_per_gas(100_000_000_000)
            .with_max_priority_fee_per_gas(1_000_000_000);
        let _pending = self.chain.provider().send_transaction(tx).await?;
        self.nonce += 1;
        Ok(())
    }

    async fn mine(&self) -> anyhow::Result<()> {
        self.chain.provider().evm_mine(None).await?;
        Ok(())
    }

    /// `events` events in blocks of `per_block`, one transaction per block.
    async fn generate(&mut self, events: u64, per_block: u64) -> anyhow::Result<u64> {
        let mut left = events;
        while left > 0 {
            let n = left.min(per_block);
            self.send(n).await?;
            self.mine().await?;
            left -= n;
        }
        // Empty blocks on top, so the whole workload is below Ponder's finality
        // distance on this chain (30 blocks) and it backfills every event historically.
        self.chain
            .provider()
            .anvil_mine(Some(EMPTY_BLOCKS_ON_TOP), None)
            .await?;
        self.chain.block_number().await
    }

    fn node(&self) -> anyhow::Result<Arc<UpstreamPool>> {
        node(self.chain.endpoint().as_str(), self.chain.chain_id())
    }

    /// A fresh database whose scope holds the emitter (as an asset token) from block 0.
    async fn database(&self) -> anyhow::Result<TestDatabase> {
        let db = TestDatabase::create().await?;
        scope::add_scope(
            db.pool(),
            ChainId(self.chain.chain_id()),
            &ScopeEntry {
                address: self.emitter,
                kind: ScopeKind::AssetToken,
                organization: None,
                from_block: 0,
            },
        )
        .await?;
        Ok(db)
    }
}

async fn transfers(db: &TestDatabase) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM index_transfer")
        .fetch_one(db.pool())
        .await?)
}

/// Historical catch-up of `[0, head]` with `workers` indexer processes (this
/// executable with `--history-worker`), each with its own database pool and upstream
/// pool. The clock runs from the start signal (every process connected and ready) to
/// the last process reporting its ranges done; the CPU time of the database's server
/// backends is then read (the processes keep their pools open until told to exit) and
/// printed per event beside the processes' own. Returns (seconds, transfers indexed,
/// ranges).
async fn history(
    w: &Workload,
    head: u64,
    workers: usize,
    range: u64,
    span: u64,
    concurrency: u64,
    writers: u64,
) -> anyhow::Result<(f64, i64, u64)> {
    let db = w.database().await?;
    let chain = ChainId(w.chain.chain_id());
    let ranges = plan_history(db.pool(), chain, head, range).await?;
    let mut children = Vec::new();
    for i in 0..workers {
        let args = WorkerArgs {
            database_url: db.url().to_owned(),
            rpc_url: w.chain.endpoint().to_string(),
            chain_id: w.chain.chain_id(),
            id: format!("bench-{i}"),
            span,
            concurrency,
            writers,
        };
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(args.to_args())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no child stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
        anyhow::ensure!(
            ready.as_deref() == Some("ready"),
            "worker {i} did not start: {ready:?}"
        );
        children.push((child, lines));
    }
    let started = Instant::now();
    for (child, _) in &mut children {
        let stdin = child
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("no child stdin"))?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }
    let mut reports = Vec::new();
    for (_, lines) in &mut children {
        let mut report = None;
        while let Some(l) = lines.next_line().await? {
            if l.starts_with("done ") {
                report = Some(l);
                break;
            }
        }
        reports.push(report.ok_or_else(|| anyhow::anyhow!("a worker process failed"))?);
    }
    let secs = started.elapsed().as_secs_f64();
    // The server backends of this case's database (the workers' pools, still open):
    // their CPU time is PostgreSQL's share of the catch-up.
    let pg_cpu = backends_cpu_seconds(&db).await?;
    for (mut child, _) in children {
        if let Some(stdin) = child.stdin.as_mut() {
            stdin.write_all(b"exit\n").await?;
            stdin.flush().await?;
        }
        let status = child.wait().await?;
        anyhow::ensure!(status.success(), "worker process failed: {status}");
    }
    let worker_cpu: f64 = reports
        .iter()
        .filter_map(|r| r.split("cpu_s=").nth(1)?.parse::<f64>().ok())
        .sum();
    println!("         processes: {}", reports.join("; "));
    let events = transfers(&db).await?;
    let per = |s: f64| s * 1e6 / (events.max(1) as f64);
    println!(
        "         cpu: postgres backends {pg_cpu:.2} s ({:.1} us/event), workers {worker_cpu:.2} s ({:.1} us/event), wall {secs:.2} s",
        per(pg_cpu),
        per(worker_cpu)
    );
    Ok((secs, events, ranges))
}

/// CPU seconds (user + system) of the client backends connected to `db`'s database,
/// read from `/proc/<pid>/stat` (the server runs on this machine); 0 for a backend
/// whose stat cannot be read.
async fn backends_cpu_seconds(db: &TestDatabase) -> anyhow::Result<f64> {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend'",
    )
    .fetch_all(db.pool())
    .await?;
    Ok(pids
        .into_iter()
        .map(|p| cpu_seconds_of(&format!("/proc/{p}/stat")))
        .sum())
}

/// Tip ingest from block 0 to `head`, one transaction per block.
async fn tip_catch_up(w: &Workload, db: &TestDatabase, head: u64) -> anyhow::Result<f64> {
    let ingest = TipIngest::take_ownership(
        db.pool().clone(),
        w.node()?,
        TipConfig {
            start_block: Some(0),
            ..TipConfig::new(12)
        },
        "bench-tip",
    )
    .await?;
    let started = Instant::now();
    loop {
        let out = ingest.round().await?;
        if out.tip >= Some(head) {
            break;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// How the latency case's tip loop waits between rounds once caught up.
#[derive(Debug, Clone, Copy)]
enum Follow {
    /// Sleep the poll interval (what `keel run`'s indexer loop does).
    Poll,
    /// [`TipIngest::wait_for_new_head`]: `eth_blockNumber` every `head` until a new
    /// block appears, at most the poll interval.
    WatchHead(Duration),
    /// A `newHeads` subscription over the chain's WebSocket ([`keel_chain::watch_heads`],
    /// what `keel run`'s indexer does with `chains.<name>.wsUrl`): wait for a head, at
    /// most the poll interval (then the fallback poll). With `hand_head` the round gets
    /// the announced header ([`TipIngest::round_at`], what `keel run` does); without, the
    /// head only wakes a plain [`TipIngest::round`] (the loop before issue 25's second
    /// step, kept for comparison).
    Subscribe { hand_head: bool },
}

/// The JSON-RPC methods the tip loop sends (counted through the proxy).
const TIP_METHODS: &[&str] = &[
    "eth_blockNumber",
    "eth_getBlockByNumber",
    "eth_getBlockByHash",
    "eth_getLogs",
    "eth_getBlockReceipts",
    "eth_chainId",
];

/// Tip latency at 1 s block time on `chain` (an Anvil with `--block-time 1`, the
/// emitter at `emitter`): a tip loop rounds and then waits per `follow`; the bench
/// watches the head every 2 ms, sends a transaction of `events` events as each block
/// appears (so the next block carries them), and times block seen → `wait_for_block`
/// returns (read-after-write through LISTEN/NOTIFY). Milliseconds, sorted, and the tip
/// loop's JSON-RPC requests over HTTP per block (counted by a proxy in front of Anvil).
async fn tip_latency(
    chain: &TestChain,
    emitter: Address,
    blocks: u64,
    events: u64,
    poll: Duration,
    follow: Follow,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let db = TestDatabase::create().await?;
    let chain_id = ChainId(chain.chain_id());
    let proxy = anvil_tests::proxy::RpcProxy::start(chain.endpoint()).await?;
    let wake = Arc::new(keel_chain::HeadSignal::new());
    let watch_stop = tokio_util::sync::CancellationToken::new();
    if matches!(follow, Follow::Subscribe { .. }) {
        let ws = format!("ws://127.0.0.1:{}", chain.port());
        tokio::spawn(keel_chain::watch_heads(
            chain_id,
            keel_chain::HeadWatchConfig::new(ws),
            wake.clone(),
            watch_stop.clone(),
        ));
    }
    let start = chain.block_number().await? + 1;
    scope::add_scope(
        db.pool(),
        chain_id,
        &ScopeEntry {
            address: emitter,
            kind: ScopeKind::AssetToken,
            organization: None,
            from_block: start,
        },
    )
    .await?;
    let ingest = TipIngest::take_ownership(
        db.pool().clone(),
        node(proxy.url().as_str(), chain.chain_id())?,
        TipConfig {
            start_block: Some(start),
            ..TipConfig::new(12)
        },
        "bench-latency",
    )
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let stop = stop.clone();
        let wake = wake.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let announced = match follow {
                    Follow::Subscribe { hand_head: true } => wake.take(),
                    _ => None,
                };
                let out = ingest.round_at(announced).await?;
                if out.tip.is_some_and(|t| t < out.head) {
                    continue;
                }
                match follow {
                    Follow::Poll => tokio::time::sleep(poll).await,
                    Follow::WatchHead(every) => {
                        ingest.wait_for_new_head(out.tip, poll, every).await?;
                    }
                    Follow::Subscribe { .. } => {
                        let _ = tokio::time::timeout(poll, wake.notify().notified()).await;
                    }
                }
            }
            anyhow::Ok(())
        })
    };
    let p = chain.provider();
    let from = chain.account(0)?;
    let mut nonce = p.get_transaction_count(from).pending().await?;
    let mut seen = chain.block_number().await?;
    let mut out = Vec::new();
    let mut carrying = false;
    let mut counted_from: Option<(u64, u64)> = None;
    while (out.len() as u64) < blocks {
        let head = chain.block_number().await?;
        if head == seen {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let mined = Instant::now();
        seen = head;
        let tx = TransactionRequest::default()
            .with_to(emitter)
            .with_input(Bytes::from(U256::from(events).to_be_bytes::<32>().to_vec()))
            .with_nonce(nonce)
            .with_chain_id(chain.chain_id())
            .with_gas_limit(60_000 + events * 2_200)
            .with_max_fee_per_gas(100_000_000_000)
            .with_max_priority_fee_per_gas(1_000_000_000);
        keel_index::wait_for_block(
            db.pool(),
            chain_id,
            head,
            Duration::from_secs(30),
            Duration::from_millis(200),
        )
        .await?;
        // Only blocks that carry the bench's events count (the first one seen does not).
        if carrying {
            out.push(mined.elapsed().as_secs_f64() * 1_000.0);
        }
        let calls: u64 = TIP_METHODS.iter().map(|m| proxy.count(m)).sum();
        counted_from.get_or_insert((head, calls));
        // Events for the next block, sent once this one is visible (outside the clock).
        let _pending = p.send_transaction(tx).await?;
        nonce += 1;
        carrying = true;
    }
    let calls: u64 = TIP_METHODS.iter().map(|m| proxy.count(m)).sum();
    let head = chain.block_number().await?;
    let per_block = counted_from.map_or(0.0, |(first, before)| {
        (calls - before) as f64 / (head.saturating_sub(first).max(1)) as f64
    });
    stop.store(true, Ordering::Relaxed);
    watch_stop.cancel();
    looping.await??;
    let indexed: i64 = sqlx::query_scalar("SELECT count(*) FROM index_transfer")
        .fetch_one(db.pool())
        .await?;
    anyhow::ensure!(indexed > 0, "the latency blocks carried no indexed events");
    out.sort_by(f64::total_cmp);
    Ok((out, per_block))
}

/// A second Anvil mining a block every second, with the emitter deployed.
async fn block_time_chain() -> anyhow::Result<(TestChain, Address)> {
    let chain = ChainBuilder::new()
        .high_throughput()
        .block_time(1)
        .start()
        .await?;
    let receipt = chain
        .provider()
        .send_transaction(
            TransactionRequest::default().with_deploy_code(Bytes::from(emitter_init_code())),
        )
        .await?
        .get_receipt()
        .await?;
    let emitter = receipt
        .contract_address
        .ok_or_else(|| anyhow::anyhow!("emitter not deployed"))?;
    Ok((chain, emitter))
}

/// Ponder (benches/peers/ponder/run.sh) over the same chain; its events/s.
async fn ponder(w: &Workload, events: u64) -> anyhow::Result<Option<f64>> {
    let dir = anvil_tests::workspace_root().join("benches/peers/ponder");
    if std::env::var("KEEL_INDEX_BENCH_PEER").as_deref() == Ok("0")
        || !dir.join("node_modules").exists()
    {
        println!("ponder: skipped (KEEL_INDEX_BENCH_PEER=0 or benches/peers/ponder not installed)");
        return Ok(None);
    }
    let db = TestDatabase::create().await?;
    let out = tokio::process::Command::new(dir.join("run.sh"))
        .env("PONDER_RPC_URL", w.chain.endpoint().as_str())
        .env("PONDER_CHAIN_ID", w.chain.chain_id().to_string())
        .env("PONDER_ADDRESS", w.emitter.to_string())
        .env("PONDER_EXPECTED", events.to_string())
        .env("DATABASE_URL", db.url())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        println!(
            "ponder: failed ({}):\n{}\n{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        return Ok(None);
    }
    let result = stdout.lines().rev().find(|l| l.starts_with("RESULT "));
    let rate = result.and_then(|l| {
        l.split_whitespace()
            .find_map(|kv| kv.strip_prefix("events_per_s="))
            .and_then(|v| v.parse::<f64>().ok())
    });
    if let Some(l) = result {
        println!("ponder: {l}");
    }
    Ok(rate)
}

fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--history-worker") {
        return history_worker_process(WorkerArgs::parse(&args[i + 1..])?).await;
    }
    if !args.iter().any(|a| a == "--bench") {
        return Ok(());
    }
    let events = env_u64("KEEL_INDEX_BENCH_EVENTS", 1_000_000);
    let per_block = env_u64("KEEL_INDEX_BENCH_EVENTS_PER_BLOCK", 1_000).max(1);
    let range = env_u64("KEEL_INDEX_BENCH_RANGE", 10).max(1);
    let span = env_u64("KEEL_INDEX_BENCH_SPAN", 20).max(1);
    let concurrency = env_u64("KEEL_INDEX_BENCH_CONCURRENCY", 16).max(1);
    // 0 = 2 writers for a single process (one process can then keep two database
    // cores busy), 1 each when there are several.
    let writers_env = env_u64("KEEL_INDEX_BENCH_WRITERS", 0);
    let latency_blocks = env_u64("KEEL_INDEX_BENCH_LATENCY_BLOCKS", 20);
    let head_ms = env_u64("KEEL_INDEX_BENCH_HEAD_MS", 10).max(1);
    let polls = env_list("KEEL_INDEX_BENCH_POLL_MS", "100");
    let worker_counts = env_list("KEEL_INDEX_BENCH_WORKERS", "1,3");

    let mut w = Workload::start().await?;
    let started = Instant::now();
    let head = w.generate(events, per_block).await?;
    println!(
        "workload: {events} Transfer events in {} blocks ({per_block}/block, head {head}), generated in {:.1} s",
        events.div_ceil(per_block),
        started.elapsed().as_secs_f64()
    );
    println!("loadavg  {}", loadavg());

    let mut best_history = 0.0_f64;
    let mut history_kv = Vec::new();
    for workers in worker_counts {
        let workers = usize::try_from(workers)?.max(1);
        let writers = match writers_env {
            0 if workers == 1 => 2,
            0 => 1,
            n => n,
        };
        let (secs, rows, ranges) =
            history(&w, head, workers, range, span, concurrency, writers).await?;
        anyhow::ensure!(
            rows == i64::try_from(events)?,
            "history indexed {rows} transfers, expected {events}"
        );
        let rate = events as f64 / secs;
        best_history = best_history.max(rate);
        println!(
            "history  processes={workers}  ranges={ranges} ({range} blocks, span {span}, {concurrency} getLogs in flight, {writers} writers each)  {secs:.2} s  {rate:.0} events/s"
        );
        history_kv.push(format!("history_p{workers}_events_per_s={rate:.0}"));
    }
    println!("loadavg  {}", loadavg());

    let db = w.database().await?;
    let secs = tip_catch_up(&w, &db, head).await?;
    anyhow::ensure!(transfers(&db).await? == i64::try_from(events)?);
    let tip_rate = events as f64 / secs;
    println!("tip      catch-up of {head} blocks  {secs:.2} s  {tip_rate:.0} events/s");

    // Ponder over the same blocks.
    let peer = ponder(&w, events).await?;
    if let Some(p) = peer {
        println!(
            "ratio    keel history (best) / ponder = {:.1}x",
            best_history / p
        );
    }
    println!("loadavg  {}", loadavg());
    drop(w);

    let (bt_chain, emitter) = block_time_chain().await?;
    let mut latency = Vec::new();
    for poll in polls.iter().filter(|_| latency_blocks > 0) {
        for follow in [
            Follow::Poll,
            Follow::WatchHead(Duration::from_millis(head_ms)),
            Follow::Subscribe { hand_head: false },
            Follow::Subscribe { hand_head: true },
        ] {
            let (ms, calls_per_block) = tip_latency(
                &bt_chain,
                emitter,
                latency_blocks,
                100,
                Duration::from_millis(*poll),
                follow,
            )
            .await?;
            let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
            let (label, key) = match follow {
                Follow::Poll => ("round, sleep poll".to_owned(), format!("poll{poll}")),
                Follow::WatchHead(d) => (
                    format!("round, watch head every {} ms", d.as_millis()),
                    format!("poll{poll}_head{}", d.as_millis()),
                ),
                Follow::Subscribe { hand_head: false } => (
                    "newHeads head wakes a plain round, poll as fallback".to_owned(),
                    format!("poll{poll}_subscribed_wake"),
                ),
                Follow::Subscribe { hand_head: true } => (
                    "newHeads head handed to the round, poll as fallback".to_owned(),
                    format!("poll{poll}_subscribed"),
                ),
            };
            println!(
                "latency  poll={poll} ms ({label})  {latency_blocks} blocks at --block-time 1, 100 events each: p50 {p50:.1} ms  p99 {p99:.1} ms  max {:.1} ms  HTTP RPC calls per block {calls_per_block:.1}",
                ms.last().copied().unwrap_or(0.0)
            );
            latency.push(format!(
                "latency_p50_ms_{key}={p50:.1} latency_p99_ms_{key}={p99:.1} rpc_per_block_{key}={calls_per_block:.1}"
            ));
        }
    }
    println!("loadavg  {}", loadavg());

    println!(
        "RESULT events={events} {} history_best_events_per_s={best_history:.0} tip_events_per_s={tip_rate:.0} {} ponder_events_per_s={} ratio={}",
        history_kv.join(" "),
        latency.join(" "),
        peer.map_or("n/a".to_owned(), |p| format!("{p:.0}")),
        peer.map_or("n/a".to_owned(), |p| format!("{:.1}", best_history / p)),
    );
    Ok(())
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat` (clock
/// ticks of 10 ms); 0 where unavailable.
fn own_cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/self/stat")
}

/// User + system CPU seconds of the process whose `stat` file is `path`.
fn cpu_seconds_of(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses): utime is the 12th.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// `/proc/loadavg` (1, 5, 15 min), for the record.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
