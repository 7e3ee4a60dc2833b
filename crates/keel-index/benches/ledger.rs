//! Ledger read API benchmark (issue 18 §3): latency of a holders page at the indexed
//! tip and of a record-date snapshot page, with 100,000 holders and 1,000,000
//! transfers of one token, read through `keel_index::read` (the functions the
//! Platform API's holders, transfers and supply routes call).
//!
//! `cargo bench -p keel-index --bench ledger`. Environment (defaults in brackets):
//! `KEEL_LEDGER_BENCH_HOLDERS` [100000], `KEEL_LEDGER_BENCH_TRANSFERS` [1000000]
//! (a multiple of 1,000), `KEEL_LEDGER_BENCH_TXS_PER_BLOCK` [10] (1,000 transfers per
//! transaction), `KEEL_LEDGER_BENCH_SAMPLES` [200] reads per case, `KEEL_LEDGER_BENCH_PAGE`
//! [50] rows per page.
//!
//! The transfers come from a small contract assembled here: `fallback(uint256 n,
//! uint256 offset)` emits `Transfer(msg.sender, address(offset + i + 1), i + 1)` for i
//! in 0..n. Transaction j uses offset `(j mod holders/1000) × 1000`, so every holder
//! receives `transfers / holders` transfers and balances tie in groups. The contract
//! is in the index scope as an asset token; the tip ingest indexes every block through
//! the production write path (so the ingest figure includes the balance triggers of
//! migration 0025).
//!
//! Cases: `holders@tip` (first page and pages starting at random ranks, keyset
//! cursors), `snapshot@tip-1` (record date one block below the last block with transfers,
//! 70 empty blocks above it so the middle is final:
//! `txs_per_block × 1,000` transfers above it), `snapshot@middle` (half the transfers
//! above it: the cost grows with the transfers above the record date), the same record
//! date as a snapshot object (`seal`: its one-time sealing, then `snapshot
//! object@middle`: pages of its own rows, whatever lies above it),
//! `transfers page`, `holder transfers page`, `supply@tip-1`.
//!
//! The program does nothing unless it gets `--bench` (which `cargo bench` passes).
//! Needs `scripts/setup` (PostgreSQL, Anvil).

use alloy::network::TransactionBuilder;
use alloy::primitives::{Bytes, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::TransactionRequest;
use anvil_tests::ChainBuilder;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::read::{self, HolderBalance, HolderKey};
use keel_index::scope::{self, ScopeEntry};
use keel_index::snapshot;
use keel_index::{ScopeKind, TipConfig, TipIngest};
use keel_store::testing::TestDatabase;
use keel_units::ChainId;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// keccak256("Transfer(address,address,uint256)").
const TRANSFER_TOPIC: [u8; 32] = [
    0xdd, 0xf2, 0x52, 0xad, 0x1b, 0xe2, 0xc8, 0x9b, 0x69, 0xc2, 0xb0, 0x68, 0xfc, 0x37, 0x8d, 0xaa,
    0x95, 0x2b, 0xa7, 0xf1, 0x63, 0xc4, 0xa1, 0x16, 0x28, 0xf5, 0x5a, 0x4d, 0xf5, 0x23, 0xb3, 0xef,
];

/// Transfers per transaction.
const PER_TX: u64 = 1_000;

/// Init code of the emitter: copies the runtime below into memory and returns it.
fn emitter_init_code() -> Vec<u8> {
    // Stack comments list the top first.
    let mut runtime = vec![
        0x60, 0x00, 0x35, // n
        0x60, 0x20, 0x35, // off, n
        0x60, 0x00, // i, off, n
        0x5b, // 0x08 loop:
        0x82, 0x81, 0x10, 0x15, 0x60, 0x00, 0x57, // if !(i < n) goto end (patched)
        0x80, 0x60, 0x01, 0x01, 0x60, 0x00, 0x52, // mstore(0, i + 1)
        0x80, 0x60, 0x01, 0x01, 0x82, 0x01, // to = i + 1 + off
        0x33, // from = caller
        0x7f, // push32 topic
    ];
    runtime.extend_from_slice(&TRANSFER_TOPIC);
    runtime.extend_from_slice(&[
        0x60, 0x20, 0x60, 0x00, 0xa3, // log3(0, 32, topic, from, to)
        0x60, 0x01, 0x01, // i += 1
        0x60, 0x08, 0x56, // goto loop
    ]);
    let end = u8::try_from(runtime.len()).unwrap_or(u8::MAX);
    runtime.extend_from_slice(&[0x5b, 0x00]); // end: stop
    runtime[14] = end;
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

/// A small deterministic generator (xorshift64*), for the random start ranks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Runs `f` `samples` times (after 3 warm-up runs) and prints p50/p99 in ms.
async fn measure<F, Fut>(label: &str, samples: u64, mut f: F) -> anyhow::Result<(f64, f64)>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = anyhow::Result<usize>>,
{
    for i in 0..3 {
        f(i).await?;
    }
    let mut ms = Vec::new();
    let mut rows = 0;
    for i in 0..samples {
        let started = Instant::now();
        rows += f(i).await?;
        ms.push(started.elapsed().as_secs_f64() * 1_000.0);
    }
    ms.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
    println!(
        "{label:<28} samples={samples:<4} rows/read={:<4} p50={p50:.2} ms  p99={p99:.2} ms",
        rows / usize::try_from(samples.max(1))?
    );
    Ok((p50, p99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let holders = env_u64("KEEL_LEDGER_BENCH_HOLDERS", 100_000).max(PER_TX);
    let transfers = env_u64("KEEL_LEDGER_BENCH_TRANSFERS", 1_000_000).max(holders);
    let per_block = env_u64("KEEL_LEDGER_BENCH_TXS_PER_BLOCK", 10).max(1);
    let samples = env_u64("KEEL_LEDGER_BENCH_SAMPLES", 200).max(1);
    let page = u32::try_from(env_u64("KEEL_LEDGER_BENCH_PAGE", 50).clamp(1, 200))?;
    let txs = transfers / PER_TX;
    let groups = holders / PER_TX;

    // The chain: the emitter, then `txs` transactions, `per_block` per block.
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
    let mut nonce = p.get_transaction_count(chain.account(0)?).await?;
    let started = Instant::now();
    for j in 0..txs {
        let offset = (j % groups) * PER_TX;
        let mut input = U256::from(PER_TX).to_be_bytes::<32>().to_vec();
        input.extend_from_slice(&U256::from(offset).to_be_bytes::<32>());
        let tx = TransactionRequest::default()
            .with_to(emitter)
            .with_input(Bytes::from(input))
            .with_nonce(nonce)
            .with_chain_id(chain.chain_id())
            .with_gas_limit(60_000 + PER_TX * 2_300)
            .with_max_fee_per_gas(100_000_000_000)
            .with_max_priority_fee_per_gas(1_000_000_000);
        let _pending = p.send_transaction(tx).await?;
        nonce += 1;
        if (j + 1) % per_block == 0 || j + 1 == txs {
            p.evm_mine(None).await?;
        }
    }
    let work_head = chain.block_number().await?;
    println!(
        "workload: {transfers} transfers to {holders} holders in {txs} transactions ({per_block}/block, head {work_head}), generated in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // 70 empty blocks on top, so that the middle of the workload is final (Anvil's
    // `finalized` = head − 64) and a snapshot object there can be sealed.
    p.evm_mine(None).await?;
    p.anvil_mine(Some(69), None).await?;
    let head = chain.block_number().await?;

    // Index it with the tip ingest (production write path, triggers included).
    let db = TestDatabase::create().await?;
    let chain_id = ChainId(chain.chain_id());
    scope::add_scope(
        db.pool(),
        chain_id,
        &ScopeEntry {
            address: emitter,
            kind: ScopeKind::AssetToken,
            organization: None,
            from_block: 0,
        },
    )
    .await?;
    let mut upstream = UpstreamConfig::new(vec![chain.endpoint().to_string()]);
    upstream.requests_per_second = 1_000_000;
    upstream.burst = 1_000_000;
    upstream.request_timeout = Duration::from_secs(60);
    let node = Arc::new(UpstreamPool::new(chain_id, upstream)?);
    let ingest = TipIngest::take_ownership(
        db.pool().clone(),
        node,
        TipConfig {
            start_block: Some(0),
            ..TipConfig::new(12)
        },
        "bench-ledger",
    )
    .await?;
    let started = Instant::now();
    loop {
        let out = ingest.round().await?;
        if out.tip >= Some(head) {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "ingest:   tip catch-up of {head} blocks {secs:.1} s ({:.0} transfers/s, balance triggers included)",
        transfers as f64 / secs
    );
    let pool = db.pool().clone();
    sqlx::query("ANALYZE").execute(&pool).await?;

    // The whole ranking at the tip (also the reference for the random start keys).
    let started = Instant::now();
    let mut ranking: Vec<HolderBalance> = Vec::new();
    let mut after: Option<HolderKey> = None;
    loop {
        let rows = read::holders_at(&pool, chain_id, emitter, head, after, 200).await?;
        after = rows.last().map(HolderBalance::key);
        let done = rows.len() < 200;
        ranking.extend(rows);
        if done {
            break;
        }
    }
    anyhow::ensure!(
        ranking.len() as u64 == holders,
        "walked {} holders, expected {holders}",
        ranking.len()
    );
    println!(
        "walk:     every holder at the tip in pages of 200: {} holders, {:.2} s",
        ranking.len(),
        started.elapsed().as_secs_f64()
    );

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut starts: Vec<Option<HolderKey>> = vec![None];
    for _ in 1..samples {
        let i = usize::try_from(rng.next() % holders)?;
        starts.push(Some(ranking[i].key()));
    }
    let start = |i: u64| starts[usize::try_from(i).unwrap_or(0) % starts.len()];
    let record = work_head.saturating_sub(1);
    let middle = work_head / 2;
    // Transfers above the record date (the last block carries `per_block` transactions
    // unless `txs` is not a multiple of it).
    let moved = (work_head - record) * per_block * PER_TX;

    let (tip50, tip99) = measure("holders@tip", samples, |i| {
        let (pool, after) = (pool.clone(), start(i));
        async move {
            Ok(
                read::holders_at(&pool, chain_id, emitter, head, after, page)
                    .await?
                    .len(),
            )
        }
    })
    .await?;
    let (snap50, snap99) = measure("snapshot@tip-1", samples, |i| {
        let (pool, after) = (pool.clone(), start(i));
        async move {
            Ok(
                read::holders_at(&pool, chain_id, emitter, record, after, page)
                    .await?
                    .len(),
            )
        }
    })
    .await?;
    let deep = (samples / 10).max(5);
    let (mid50, mid99) = measure("snapshot@middle", deep, |i| {
        let (pool, after) = (pool.clone(), start(i));
        async move {
            Ok(
                read::holders_at(&pool, chain_id, emitter, middle, after, page)
                    .await?
                    .len(),
            )
        }
    })
    .await?;
    // The record date as a snapshot object (issue 36 §2): sealed once (its rows copied
    // from the balance history), then paged from its own rows.
    let started = Instant::now();
    let (object, _) = snapshot::create(&pool, chain_id, emitter, middle).await?;
    let seal_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        object.state == snapshot::SnapshotState::Final,
        "the snapshot at {middle} was not sealed (finalized block {:?})",
        read::finalized_block(&pool, chain_id).await?
    );
    println!(
        "seal:     snapshot object at block {middle} ({} holders): {seal_s:.2} s",
        object.sealed.map_or(0, |m| m.holder_count)
    );
    let (obj50, obj99) = measure("snapshot object@middle", samples, |i| {
        let (pool, after, object) = (pool.clone(), start(i), object.clone());
        async move { Ok(snapshot::holders(&pool, &object, after, page).await?.len()) }
    })
    .await?;
    let (tr50, tr99) = measure("transfers page", samples, |i| {
        let pool = pool.clone();
        let before = (i % 2 == 1).then_some((middle, 0));
        async move {
            Ok(
                read::transfer_page(&pool, chain_id, emitter, None, before, page)
                    .await?
                    .len(),
            )
        }
    })
    .await?;
    let (ht50, ht99) = measure("holder transfers page", samples, |i| {
        let pool = pool.clone();
        let holder = start(i).map_or(ranking[0].holder, |k| k.holder);
        async move {
            Ok(
                read::transfer_page(&pool, chain_id, emitter, Some(holder), None, page)
                    .await?
                    .len(),
            )
        }
    })
    .await?;
    let (su50, su99) = measure("supply@tip-1", samples, |_| {
        let pool = pool.clone();
        async move {
            keel_index::token_supply_at(&pool, chain_id, emitter, record).await?;
            Ok(1)
        }
    })
    .await?;
    println!(
        "summary:  holders={holders} transfers={transfers} page={page} transfers_above_record_date={moved} \
         holders_tip_p50_ms={tip50:.2} holders_tip_p99_ms={tip99:.2} \
         snapshot_tip1_p50_ms={snap50:.2} snapshot_tip1_p99_ms={snap99:.2} \
         snapshot_middle_p50_ms={mid50:.2} snapshot_middle_p99_ms={mid99:.2} \
         snapshot_object_seal_s={seal_s:.2} snapshot_object_middle_p50_ms={obj50:.2} snapshot_object_middle_p99_ms={obj99:.2} \
         transfers_p50_ms={tr50:.2} transfers_p99_ms={tr99:.2} \
         holder_transfers_p50_ms={ht50:.2} holder_transfers_p99_ms={ht99:.2} \
         supply_p50_ms={su50:.2} supply_p99_ms={su99:.2}"
    );
    Ok(())
}
