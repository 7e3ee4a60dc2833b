//! Ledger Index benchmark (issue 6): historical catch-up of N ERC-20 `Transfer` events
//! on Anvil into PostgreSQL with 1 and with 3 [`HistoryWorker`]s, tip-ingest
//! throughput over the same blocks, and tip latency (block mined → indexed and visible
//! through `wait_for_block`) at 1 s block time. Optionally, in the same run, the Ponder
//! peer (`benches/peers/ponder`) indexing the same events from the same Anvil into the
//! same PostgreSQL server, printed as a ratio.
//!
//! `cargo bench -p keel-index --bench index`. Environment (defaults in brackets):
//! `KEEL_INDEX_BENCH_EVENTS` [100000] events (1000000 for the figure),
//! `KEEL_INDEX_BENCH_EVENTS_PER_BLOCK` [1000] (one transaction per block emits them),
//! `KEEL_INDEX_BENCH_RANGE` [20] blocks per history range,
//! `KEEL_INDEX_BENCH_SPAN` [20] largest `eth_getLogs` span of a worker,
//! `KEEL_INDEX_BENCH_LATENCY_BLOCKS` [20] blocks per latency run,
//! `KEEL_INDEX_BENCH_POLL_MS` [50,500] tip-ingest poll intervals of the latency runs,
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
        // A local node: no provider plan to respect.
        let mut upstream = UpstreamConfig::new(vec![self.chain.endpoint().to_string()]);
        upstream.requests_per_second = 1_000_000;
        upstream.burst = 1_000_000;
        upstream.request_timeout = Duration::from_secs(60);
        Ok(Arc::new(UpstreamPool::new(
            ChainId(self.chain.chain_id()),
            upstream,
        )?))
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

/// Historical catch-up of `[0, head]` with `workers` workers (tasks of this process,
/// each with its own upstream pool).
async fn history(
    w: &Workload,
    head: u64,
    workers: usize,
    range: u64,
    span: u64,
) -> anyhow::Result<(f64, i64, u64)> {
    let db = w.database().await?;
    let chain = ChainId(w.chain.chain_id());
    let ranges = plan_history(db.pool(), chain, head, range).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..workers {
        let worker = HistoryWorker::new(
            db.pool().clone(),
            w.node()?,
            format!("bench-{i}"),
            HistoryConfig {
                lease: Duration::from_secs(60),
                max_span: span,
                retries: 5,
            },
        )?;
        tasks.push(tokio::spawn(async move {
            while worker.run_once().await?.is_some() {}
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((secs, transfers(&db).await?, ranges))
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
        let out = ingest.step().await?;
        if out.tip >= Some(head) {
            break;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Tip latency at 1 s block time: a tip loop polls every `poll`; each second this
/// sends a transaction of `events` events, mines its block and waits (read-after-write,
/// `wait_for_block`) until the index shows it. Milliseconds, sorted.
async fn tip_latency(
    w: &mut Workload,
    db: &TestDatabase,
    blocks: u64,
    events: u64,
    poll: Duration,
) -> anyhow::Result<Vec<f64>> {
    let ingest = TipIngest::take_ownership(
        db.pool().clone(),
        w.node()?,
        TipConfig::new(12),
        "bench-latency",
    )
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                ingest.step().await?;
                tokio::time::sleep(poll).await;
            }
            anyhow::Ok(())
        })
    };
    let chain = ChainId(w.chain.chain_id());
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    let mut out = Vec::new();
    for _ in 0..blocks {
        ticks.tick().await;
        w.send(events).await?;
        w.mine().await?;
        let mined = Instant::now();
        let number = w.chain.block_number().await?;
        keel_index::wait_for_block(
            db.pool(),
            chain,
            number,
            Duration::from_secs(30),
            Duration::from_millis(200),
        )
        .await?;
        out.push(mined.elapsed().as_secs_f64() * 1_000.0);
    }
    stop.store(true, Ordering::Relaxed);
    looping.await??;
    out.sort_by(f64::total_cmp);
    Ok(out)
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let events = env_u64("KEEL_INDEX_BENCH_EVENTS", 100_000);
    let per_block = env_u64("KEEL_INDEX_BENCH_EVENTS_PER_BLOCK", 1_000).max(1);
    let range = env_u64("KEEL_INDEX_BENCH_RANGE", 20).max(1);
    let span = env_u64("KEEL_INDEX_BENCH_SPAN", 20).max(1);
    let latency_blocks = env_u64("KEEL_INDEX_BENCH_LATENCY_BLOCKS", 20);
    let polls: Vec<u64> = std::env::var("KEEL_INDEX_BENCH_POLL_MS")
        .unwrap_or_else(|_| "50,500".to_owned())
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect();

    let mut w = Workload::start().await?;
    let started = Instant::now();
    let head = w.generate(events, per_block).await?;
    println!(
        "workload: {events} Transfer events in {} blocks ({per_block}/block, head {head}), generated in {:.1} s",
        events.div_ceil(per_block),
        started.elapsed().as_secs_f64()
    );

    let mut best_history = 0.0_f64;
    for workers in [1usize, 3] {
        let (secs, rows, ranges) = history(&w, head, workers, range, span).await?;
        anyhow::ensure!(
            rows == i64::try_from(events)?,
            "history indexed {rows} transfers, expected {events}"
        );
        let rate = events as f64 / secs;
        best_history = best_history.max(rate);
        println!(
            "history  workers={workers}  ranges={ranges} ({range} blocks, span {span})  {secs:.2} s  {rate:.0} events/s"
        );
    }

    let db = w.database().await?;
    let secs = tip_catch_up(&w, &db, head).await?;
    anyhow::ensure!(transfers(&db).await? == i64::try_from(events)?);
    let tip_rate = events as f64 / secs;
    println!("tip      catch-up of {head} blocks  {secs:.2} s  {tip_rate:.0} events/s");

    // Ponder over the same blocks, before the latency runs add more.
    let peer = ponder(&w, events).await?;
    if let Some(p) = peer {
        println!(
            "ratio    keel history (best) / ponder = {:.1}x",
            best_history / p
        );
    }

    let mut latency = Vec::new();
    for poll in &polls {
        let ms = tip_latency(
            &mut w,
            &db,
            latency_blocks,
            100,
            Duration::from_millis(*poll),
        )
        .await?;
        let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
        println!(
            "latency  poll={poll} ms  {latency_blocks} blocks at 1 s, 100 events each: p50 {p50:.1} ms  p99 {p99:.1} ms  max {:.1} ms",
            ms.last().copied().unwrap_or(0.0)
        );
        latency.push(format!(
            "latency_p50_ms_poll{poll}={p50:.1} latency_p99_ms_poll{poll}={p99:.1}"
        ));
    }

    println!(
        "RESULT events={events} history_best_events_per_s={best_history:.0} tip_events_per_s={tip_rate:.0} {} ponder_events_per_s={}",
        latency.join(" "),
        peer.map_or("n/a".to_owned(), |p| format!("{p:.0}"))
    );
    Ok(())
}
