//! Transaction-queue benchmark (issue 5): durable submissions per second to Anvil
//! (automine) with 1 sender and with 50 senders, enqueue→broadcast latency p50/p99,
//! and in the same run the same transactions sent raw with alloy (pre-signed,
//! `eth_sendRawTransaction`, 64 in flight, no durability) as the ceiling.
//!
//! Two loads: a burst (env `KEEL_TXQ_BENCH_N`, default 2,000 transactions per case,
//! about half a second, so pipeline fill and drain weigh on it) in all four cases,
//! and sustained load for the production loop (env `KEEL_TXQ_BENCH_SUSTAINED_N`,
//! default 10,000 per case: `run1-sustained`, `run50-sustained`).
//!
//! `cargo bench -p keel-txq --bench txq`; `KEEL_TXQ_BENCH_CASES`, e.g.
//! `run50,run50-sustained`, runs a subset (`run1,run4,run16`: a signer pool of 1, 4 and
//! 16 senders on one chain, issue 35 §2); `KEEL_TXQ_BENCH_TIMELINE` prints, per 25 ms
//! of each Keel case, the requests enqueued, signed and marked broadcast;
//! `KEEL_TXQ_BENCH_REPEAT=R` runs each case R times (each repetition with its own raw
//! ceilings) and ends with one median line per case: the median of the per-repetition
//! ratios and their range. The detail line of each Keel case gives the WAL bytes
//! PostgreSQL wrote per request (cluster-wide, so on an otherwise idle server), a
//! measure of the database's work that does not move with the machine's load.
//! Needs `scripts/setup` (PostgreSQL, Anvil).

use alloy::consensus::{SignableTransaction, TxEip1559, TxEnvelope};
use alloy::eips::Encodable2718;
use alloy::network::TxSignerSync;
use alloy::primitives::{Address, Bytes, TxKind, U256};
use alloy::providers::Provider;
use anvil_tests::{ChainBuilder, TestChain};
use futures::{StreamExt, TryStreamExt};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{LocalSigner, TxQueue, TxQueueConfig, TxRequest};
use keel_units::{ChainId, Wei};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

async fn chain(senders: usize) -> anyhow::Result<TestChain> {
    ChainBuilder::new()
        .high_throughput()
        .args(["--accounts".to_owned(), (senders + 1).to_string()])
        .start()
        .await
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

struct Figures {
    /// Transactions per second over first enqueue (or send) → every transaction
    /// accepted by the node and mined (every sender's chain nonce reached).
    per_second: f64,
    /// Keel only: over first enqueue → every request settled `confirmed` (the
    /// confirmation watcher's work on top).
    settled_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// How the Keel case drives the queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every request is enqueued first, then `tick()` runs until all are settled.
    Tick,
    /// `TxQueue::run` (the production loop, default poll interval) runs while the
    /// requests are enqueued.
    Run,
}

async fn keel_case(n: usize, senders: usize, mode: Mode) -> anyhow::Result<Figures> {
    let chain = chain(senders).await?;
    let db = TestDatabase::create().await?;
    // A local node: no provider plan to respect.
    let mut upstream = UpstreamConfig::new(vec![chain.endpoint().to_string()]);
    upstream.requests_per_second = 1_000_000;
    upstream.burst = 1_000_000;
    let pool = UpstreamPool::new(ChainId(chain.chain_id()), upstream)?;
    let mut q = TxQueue::new(
        db.pool().clone(),
        Arc::new(pool),
        TxQueueConfig {
            // Anvil's pool has a race under concurrent sends with automine: a transaction
            // validated just before its predecessor is mined can stay "queued" forever
            // (observed with Anvil 1.7.1). A replacement is evaluated afresh and mines.
            // With automine an accepted transaction mines at once, so one still without
            // a receipt after 300 ms is stranded: bump it then (the confirmation pass
            // looks every 250 ms). The raw case has no such recovery: it is retried on a
            // fresh node instead.
            bump_after: Some(Duration::from_millis(300)),
            sign_batch: 10_000,
            // The figures in benches/README.md were measured with 64.
            broadcast_in_flight: std::env::var("KEEL_TXQ_BENCH_IN_FLIGHT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(64),
            broadcast_batch: std::env::var("KEEL_TXQ_BENCH_BATCH")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(16),
            ..Default::default()
        },
    )?;
    let accounts: Vec<Address> = (1..=senders)
        .map(|i| chain.account(i))
        .collect::<anyhow::Result<_>>()?;
    for i in 1..=senders {
        q.add_signer(Arc::new(LocalSigner::new(chain.signer(i)?.clone())));
    }
    let q = Arc::new(q);
    let commits0 = commits(db.pool()).await?;
    let wal0 = wal_lsn(db.pool()).await?;
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let enqueue_all = async {
        let enqueues = futures::stream::iter(0..n)
            .map(|i| {
                let q = q.clone();
                let sender = accounts[i % senders];
                async move {
                    q.enqueue(&TxRequest {
                        sender,
                        idempotency_key: format!("bench-{i}"),
                        to: Some(Address::repeat_byte(0x42)),
                        value: Wei::new(U256::from(1u64)),
                        data: Bytes::new(),
                        gas_limit: Some(21_000),
                        authorization_list: Vec::new(),
                    })
                    .await
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
        for r in enqueues {
            r?;
        }
        anyhow::Ok(started.elapsed())
    };
    let settled = || async {
        let settled: i64 =
            sqlx::query_scalar("SELECT count(*) FROM txq_request WHERE state = 'settled'")
                .fetch_one(db.pool())
                .await?;
        anyhow::Ok(settled as usize >= n)
    };
    // Submitted: every request accepted by the node (its broadcast recorded) and the
    // chain's nonce of every sender past its requests — the raw case's criterion.
    let per = n.div_ceil(senders);
    let provider = chain.provider().clone();
    let pg = db.pool().clone();
    // Probed only once every request is enqueued. The database side looks for any
    // request left before `broadcast` through the queue's partial indexes; the chain
    // side asks each sender's nonce until it is reached, sender after sender, as the
    // raw case does.
    let reached = std::sync::atomic::AtomicUsize::new(0);
    let submitted = || {
        let provider = provider.clone();
        let accounts = accounts.clone();
        let pg = pg.clone();
        let reached = &reached;
        async move {
            // EXISTS, not count(*): the probe stops at the first row left, so it costs
            // PostgreSQL the same early in the case (thousands queued) as late.
            let left: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM txq_request WHERE state = 'queued')
                     OR EXISTS (SELECT 1 FROM txq_request WHERE state = 'waiting_funding')
                     OR EXISTS (SELECT 1 FROM txq_request WHERE state = 'signed')",
            )
            .fetch_one(&pg)
            .await?;
            if left {
                return anyhow::Ok(false);
            }
            let from = reached.load(std::sync::atomic::Ordering::Relaxed);
            for (s, account) in accounts.iter().enumerate().skip(from) {
                let want = per.min(n - s * per) as u64;
                if provider.get_transaction_count(*account).await? < want {
                    return anyhow::Ok(false);
                }
                reached.store(s + 1, std::sync::atomic::Ordering::Relaxed);
            }
            anyhow::Ok(true)
        }
    };
    let mut submitted_at: Option<Duration> = None;
    let mut ticks = 0;
    let enqueued = match mode {
        Mode::Tick => {
            let enqueued = enqueue_all.await?;
            if std::env::var_os("KEEL_TXQ_BENCH_PROFILE").is_some() {
                // One round by phase: sign (every sender), broadcast (every sender), confirm.
                let t = Instant::now();
                let signs =
                    futures::future::join_all(accounts.iter().map(|a| q.sign_pending(*a))).await;
                let sign = t.elapsed();
                for s in signs {
                    s?;
                }
                let t = Instant::now();
                let sends =
                    futures::future::join_all(accounts.iter().map(|a| q.sender_pass(*a))).await;
                let send = t.elapsed();
                for s in sends {
                    s?;
                }
                let t = Instant::now();
                let settled = q.confirm_pass().await?;
                let confirm = t.elapsed();
                eprintln!(
                    "profile senders={senders}: enqueue {:.0} ms, sign {:.0} ms, broadcast {:.0} ms, confirm {:.0} ms ({settled} settled)",
                    enqueued.as_secs_f64() * 1e3,
                    sign.as_secs_f64() * 1e3,
                    send.as_secs_f64() * 1e3,
                    confirm.as_secs_f64() * 1e3
                );
            }
            loop {
                ticks += 1;
                q.tick().await?;
                if submitted_at.is_none() && submitted().await? {
                    submitted_at = Some(started.elapsed());
                }
                if settled().await? {
                    break;
                }
            }
            enqueued
        }
        Mode::Run => {
            let token = CancellationToken::new();
            let driver = async {
                let enqueued = enqueue_all.await?;
                let deadline = Instant::now() + Duration::from_secs(600);
                while !submitted().await? {
                    anyhow::ensure!(Instant::now() < deadline, "not submitted in time");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                submitted_at = Some(started.elapsed());
                while !settled().await? {
                    anyhow::ensure!(Instant::now() < deadline, "not settled in time");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                token.cancel();
                anyhow::Ok(enqueued)
            };
            // Driven on this task (no spawn), so the loop's future need not be `Send`.
            let ((), enqueued) = tokio::join!(q.run(token.clone()), async {
                let r = driver.await;
                token.cancel();
                r
            });
            enqueued?
        }
    };
    let elapsed = started.elapsed();
    let cpu1 = cpu_seconds();
    let wal1 = wal_lsn(db.pool()).await?;
    let commits1 = commits(db.pool()).await?;
    let batches: i64 = sqlx::query_scalar("SELECT count(DISTINCT created_at) FROM txq_request")
        .fetch_one(db.pool())
        .await?;
    // Replacements: requests Anvil's pool race stranded until the fee bump.
    let bumped: i64 = sqlx::query_scalar("SELECT count(*) FROM txq_attempt WHERE attempt > 1")
        .fetch_one(db.pool())
        .await?;
    eprintln!(
        "detail {} senders={senders} n={n}: enqueue {:.0} ms in {batches} statements, then {ticks} ticks {:.0} ms, {:.1} commits/request (enqueue included), {:.0} WAL bytes/request, {bumped} fee bumps; CPU s keel {:.2}, postgres {:.2}, anvil {:.2}",
        if mode == Mode::Run { "run" } else { "tick" },
        enqueued.as_secs_f64() * 1e3,
        elapsed.saturating_sub(enqueued).as_secs_f64() * 1e3,
        (commits1 - commits0) as f64 / n as f64,
        (wal1 - wal0) as f64 / n as f64,
        cpu1.0 - cpu0.0,
        cpu1.1 - cpu0.1,
        cpu1.2 - cpu0.2,
    );
    if std::env::var_os("KEEL_TXQ_BENCH_TIMELINE").is_some() {
        // Per 25 ms since the first enqueue: requests enqueued, signed (attempt
        // committed) and marked broadcast in that slot.
        let rows: Vec<(i32, i64, i64, i64)> = sqlx::query_as(
            "WITH t0 AS (SELECT min(created_at) AS t FROM txq_request),
                  ev AS (SELECT floor(extract(epoch FROM r.created_at - t0.t) * 40)::int AS s, 1 AS e, 0 AS c, 0 AS b FROM txq_request r, t0
                         UNION ALL SELECT floor(extract(epoch FROM a.created_at - t0.t) * 40)::int, 0, 1, 0 FROM txq_attempt a, t0
                         UNION ALL SELECT floor(extract(epoch FROM r.broadcast_at - t0.t) * 40)::int, 0, 0, 1 FROM txq_request r, t0)
             SELECT s, sum(e)::int8, sum(c)::int8, sum(b)::int8 FROM ev GROUP BY s ORDER BY s",
        )
        .fetch_all(db.pool())
        .await?;
        for (s, e, c, b) in rows {
            eprintln!(
                "timeline {:>4} ms: enqueued {e:>4} signed {c:>4} broadcast {b:>4}",
                s * 25
            );
        }
    }
    let mut lat: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM broadcast_at - created_at) * 1000)::float8 FROM txq_request WHERE broadcast_at IS NOT NULL",
    )
    .fetch_all(db.pool())
    .await?;
    lat.sort_by(|a, b| a.total_cmp(b));
    let confirmed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM txq_request WHERE verdict_kind = 'confirmed'")
            .fetch_one(db.pool())
            .await?;
    anyhow::ensure!(confirmed as usize == n, "only {confirmed} of {n} confirmed");
    let submitted_at = submitted_at.unwrap_or(elapsed);
    Ok(Figures {
        per_second: n as f64 / submitted_at.as_secs_f64(),
        settled_per_second: n as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    })
}

/// CPU seconds (user + system) used so far by this process, by PostgreSQL processes
/// and by Anvil processes, read from `/proc` (zeros where it is unreadable).
fn cpu_seconds() -> (f64, f64, f64) {
    let tick = 100.0; // USER_HZ on Linux
    let read = |path: &std::path::Path| -> Option<(String, f64)> {
        let stat = std::fs::read_to_string(path).ok()?;
        let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?.to_owned();
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
        let t: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some((name, t / tick))
    };
    let me = read(std::path::Path::new("/proc/self/stat")).map_or(0.0, |(_, t)| t);
    let (mut pg, mut anvil) = (0.0, 0.0);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            if let Some((name, t)) = read(&entry.path().join("stat")) {
                if name.starts_with("postgres") {
                    pg += t;
                } else if name.starts_with("anvil") {
                    anvil += t;
                }
            }
        }
    }
    (me, pg, anvil)
}

/// Transactions committed in the current database so far (statistics are flushed
/// lazily, so this waits a moment first).
async fn commits(db: &keel_store::PgPool) -> anyhow::Result<i64> {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Ok(sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(db)
    .await?)
}

/// The server's current WAL insert position in bytes (cluster-wide: on an otherwise
/// idle server the difference over a case is the WAL the case wrote; the queue's row
/// writes and index insertions are most of it).
async fn wal_lsn(db: &keel_store::PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8")
            .fetch_one(db)
            .await?,
    )
}

/// How the raw case sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Raw {
    /// Each transfer signed (alloy's local signer, on the sending task, as a
    /// wallet-backed provider does) right before its own `eth_sendRawTransaction`, 64
    /// in flight: the ceiling the issue names.
    SignEach,
    /// As `SignEach`, but sent the way Keel sends: JSON-RPC batches of 16 consecutive
    /// nonces of one sender, 4 batches (64 transactions) in flight, each signed right
    /// before its batch goes out. The same transport as Keel, so what is left of the
    /// gap is durability.
    Batched,
    /// Signed before the clock starts; only the sends (64 in flight) are timed.
    Presigned,
}

/// The raw ceilings: the same transfers sent with alloy, no database (see [`Raw`]).
async fn raw_case(n: usize, senders: usize, how: Raw) -> anyhow::Result<Figures> {
    let presigned = how == Raw::Presigned;
    let chain = chain(senders).await?;
    let provider = chain.provider().clone();
    let fee = provider.get_gas_price().await? * 2;
    let mut unsigned = Vec::with_capacity(n);
    let per = n.div_ceil(senders);
    for s in 1..=senders {
        let signer = chain.signer(s)?;
        for nonce in 0..per {
            if unsigned.len() >= n {
                break;
            }
            let tx = TxEip1559 {
                chain_id: chain.chain_id(),
                nonce: nonce as u64,
                gas_limit: 21_000,
                max_fee_per_gas: fee,
                max_priority_fee_per_gas: 1_000_000_000.min(fee),
                to: TxKind::Call(Address::repeat_byte(0x42)),
                value: U256::from(1u64),
                access_list: Default::default(),
                input: Bytes::new(),
            };
            unsigned.push((signer.clone(), tx));
        }
    }
    let sign = |(signer, mut tx): (alloy::signers::local::PrivateKeySigner, TxEip1559)| {
        let sig = signer.sign_transaction_sync(&mut tx)?;
        anyhow::Ok(Bytes::from(
            TxEnvelope::from(tx.into_signed(sig)).encoded_2718(),
        ))
    };
    // Batched: one sender's consecutive nonces per batch (`unsigned` is in sender,
    // nonce order, `per` each), the batches taken round-robin over the senders.
    let mut batches = Vec::new();
    if how == Raw::Batched {
        let lanes: Vec<Vec<Vec<_>>> = std::mem::take(&mut unsigned)
            .chunks(per)
            .map(|lane| lane.chunks(16).map(<[_]>::to_vec).collect())
            .collect();
        let depth = lanes.iter().map(Vec::len).max().unwrap_or(0);
        for k in 0..depth {
            batches.extend(lanes.iter().filter_map(|lane| lane.get(k).cloned()));
        }
    }
    let presigned_raws = if presigned {
        Some(
            unsigned
                .drain(..)
                .map(sign)
                .collect::<anyhow::Result<Vec<_>>>()?,
        )
    } else {
        None
    };
    let items: Vec<_> = match presigned_raws {
        Some(raws) => raws
            .into_iter()
            .map(futures::future::Either::Left)
            .collect(),
        None => unsigned
            .into_iter()
            .map(futures::future::Either::Right)
            .collect(),
    };
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let sent: Vec<(Duration, anyhow::Result<alloy::primitives::B256>)> = if how == Raw::Batched {
        let client = alloy::rpc::client::ClientBuilder::default().http(chain.endpoint().clone());
        let outs: Vec<(Duration, Vec<alloy::primitives::B256>)> = futures::stream::iter(batches)
            .map(|batch| {
                let client = client.clone();
                async move {
                    let t = Instant::now();
                    let raws = batch
                        .into_iter()
                        .map(sign)
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    let mut rpc = client.new_batch();
                    let waiters = raws
                        .iter()
                        .map(|raw| {
                            rpc.add_call::<_, alloy::primitives::B256>(
                                "eth_sendRawTransaction",
                                &(raw,),
                            )
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    rpc.send().await?;
                    let mut hashes = Vec::with_capacity(waiters.len());
                    for w in waiters {
                        hashes.push(w.await?);
                    }
                    anyhow::Ok((t.elapsed(), hashes))
                }
            })
            .buffer_unordered(4)
            .try_collect()
            .await?;
        outs.into_iter()
            .flat_map(|(d, hashes)| hashes.into_iter().map(move |h| (d, Ok(h))))
            .collect()
    } else {
        futures::stream::iter(items)
            .map(|item| {
                let provider = provider.clone();
                async move {
                    let t = Instant::now();
                    let raw = match item {
                        futures::future::Either::Left(raw) => raw,
                        futures::future::Either::Right(u) => match sign(u) {
                            Ok(raw) => raw,
                            Err(e) => return (t.elapsed(), Err(e)),
                        },
                    };
                    let r = provider
                        .send_raw_transaction(&raw)
                        .await
                        .map(|p| *p.tx_hash())
                        .map_err(anyhow::Error::from);
                    (t.elapsed(), r)
                }
            })
            .buffer_unordered(64)
            .collect()
            .await
    };
    let mut lat = Vec::with_capacity(sent.len());
    for (d, r) in &sent {
        r.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        lat.push(d.as_secs_f64() * 1000.0);
    }
    // Confirmed: every sender's nonce reached its count. Anvil's pool race (see
    // `keel_case`) can strand a transaction; as the queue does (its `bump_after` of
    // 300 ms), a sender whose nonce has not moved for 300 ms gets the stranded nonce
    // replaced with raised fees, signed on the clock, so the ceiling pays for the race
    // the way Keel does instead of failing the case.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut bumps = 0u32;
    for s in 1..=senders {
        let want = per.min(n - (s - 1) * per) as u64;
        let account = chain.account(s)?;
        let (mut seen, mut since, mut round) = (u64::MAX, Instant::now(), 0u128);
        loop {
            let got = provider.get_transaction_count(account).await?;
            if got >= want {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "raw sends did not all mine (Anvil's pool race: a transaction stuck in \"queued\")"
            );
            if got != seen {
                (seen, since, round) = (got, Instant::now(), 0);
            } else if since.elapsed() >= Duration::from_millis(300) {
                round += 1;
                // +25 % per replacement of the same nonce (Anvil takes any increase).
                let bump = |v: u128| v + v * round / 4 + 1;
                let tip = 1_000_000_000.min(fee);
                let raw = sign((
                    chain.signer(s)?.clone(),
                    TxEip1559 {
                        chain_id: chain.chain_id(),
                        nonce: got,
                        gas_limit: 21_000,
                        max_fee_per_gas: bump(fee),
                        max_priority_fee_per_gas: bump(tip),
                        to: TxKind::Call(Address::repeat_byte(0x42)),
                        value: U256::from(1u64),
                        access_list: Default::default(),
                        input: Bytes::new(),
                    },
                ))?;
                // "Already known" or a mined original are fine: the loop re-reads the nonce.
                let _ = provider.send_raw_transaction(&raw).await;
                bumps += 1;
                since = Instant::now();
            }
        }
    }
    let elapsed = started.elapsed();
    let cpu1 = cpu_seconds();
    eprintln!(
        "detail raw{} senders={senders} n={n}: {:.0} ms, {bumps} fee bumps; CPU s client {:.2}, anvil {:.2}",
        match how {
            Raw::SignEach => "",
            Raw::Batched => " batched",
            Raw::Presigned => " pre-signed",
        },
        elapsed.as_secs_f64() * 1e3,
        cpu1.0 - cpu0.0,
        cpu1.2 - cpu0.2
    );
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok(Figures {
        per_second: n as f64 / elapsed.as_secs_f64(),
        settled_per_second: n as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    })
}

/// One repetition of a case: transfers per second of Keel and of each raw ceiling
/// from the same repetition, and latencies (ms, p50/p99).
struct Row {
    keel: f64,
    settled: f64,
    raw: f64,
    batch: f64,
    pre: f64,
    keel_lat: (f64, f64),
    raw_lat: (f64, f64),
}

impl Row {
    fn line(&self, label: &str) -> String {
        format!(
            "{label} {:>9.0} {:>9.0} {:>9.0} {:>6.0}% {:>9.0} {:>6.0}% {:>9.0} {:>6.0}% {:>7.1}/{:<7.1} {:>6.1}/{:<6.1}",
            self.keel,
            self.settled,
            self.raw,
            100.0 * self.keel / self.raw,
            self.batch,
            100.0 * self.keel / self.batch,
            self.pre,
            100.0 * self.keel / self.pre,
            self.keel_lat.0,
            self.keel_lat.1,
            self.raw_lat.0,
            self.raw_lat.1
        )
    }
}

/// The table's first three columns for a case.
fn label(mode: Mode, senders: usize, n: usize) -> String {
    format!(
        "{:<5} {:<7} {:>6}",
        if mode == Mode::Run { "run" } else { "tick" },
        senders,
        n
    )
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The median line of a case: median tx/s of each column and the median of the
/// per-repetition ratios (each ratio taken within one repetition), with their range.
fn summary(label: &str, reps: &[Row]) -> String {
    let col = |f: fn(&Row) -> f64| median(reps.iter().map(f).collect());
    let ratio = |f: fn(&Row) -> f64| {
        let r: Vec<f64> = reps.iter().map(|x| 100.0 * x.keel / f(x)).collect();
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        format!("{:.0}% ({lo:.0}-{hi:.0})", median(r))
    };
    format!(
        "median of {} {label}: keel {:.0} tx/s, settled {:.0}/s; to raw {}, to batch {}, to pre-signed {}; keel p50/p99 {:.1}/{:.1} ms",
        reps.len(),
        col(|r| r.keel),
        col(|r| r.settled),
        ratio(|r| r.raw),
        ratio(|r| r.batch),
        ratio(|r| r.pre),
        col(|r| r.keel_lat.0),
        col(|r| r.keel_lat.1),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let env_n = |var: &str, default: usize| -> usize {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    // `KEEL_TXQ_BENCH_RPC`: count the queue's JSON-RPC calls by method (the Keel
    // cases' `keel_chain_rpc_requests_total`), printed after each Keel case.
    let rpc = if std::env::var_os("KEEL_TXQ_BENCH_RPC").is_some() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder)?;
        Some(handle)
    } else {
        None
    };
    let burst = env_n("KEEL_TXQ_BENCH_N", 2000);
    let sustained = env_n("KEEL_TXQ_BENCH_SUSTAINED_N", 10_000);
    // Each case this many times in a row (Keel, then its raw ceilings); with more than
    // one, a median line per case follows the table.
    let repeat = env_n("KEEL_TXQ_BENCH_REPEAT", 1).max(1);
    let mut medians = Vec::new();
    println!(
        "keel-txq benchmark: Anvil automine, PostgreSQL local; burst {burst} and sustained {sustained} transfers; {repeat} repetition(s) per case"
    );
    println!(
        "{:<5} {:<7} {:>6} {:>9} {:>9} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7} {:>15} {:>13}",
        "mode",
        "senders",
        "n",
        "keel tx/s",
        "settled/s",
        "raw tx/s",
        "ratio",
        "batch tx/s",
        "ratio",
        "pre tx/s",
        "ratio",
        "keel p50/p99",
        "raw p50/p99"
    );
    // `KEEL_TXQ_BENCH_CASES`: a comma-separated subset of tick1, tick50, run1, run4,
    // run16, run50, run1-sustained, run50-sustained (run1,run4,run16: the signer pool's
    // scaling, issue 35 §2).
    let only = std::env::var("KEEL_TXQ_BENCH_CASES").ok();
    for (mode, senders, n, suffix) in [
        (Mode::Tick, 1usize, burst, ""),
        (Mode::Tick, 50, burst, ""),
        (Mode::Run, 1, burst, ""),
        (Mode::Run, 4, burst, ""),
        (Mode::Run, 16, burst, ""),
        (Mode::Run, 50, burst, ""),
        (Mode::Run, 1, sustained, "-sustained"),
        (Mode::Run, 50, sustained, "-sustained"),
    ] {
        let name = format!(
            "{}{senders}{suffix}",
            if mode == Mode::Run { "run" } else { "tick" }
        );
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|c| c.trim() == name))
        {
            continue;
        }
        let mut reps: Vec<Row> = Vec::with_capacity(repeat);
        for _ in 0..repeat {
            let keel = keel_case(n, senders, mode).await?;
            if let Some(handle) = &rpc {
                // Cumulative over the run's Keel cases so far.
                for line in handle.render().lines() {
                    if line.starts_with("keel_chain_rpc_requests_total") {
                        eprintln!("rpc {line}");
                    }
                }
            }
            // A raw case replaces a stranded nonce itself (see `raw_case`); one that
            // still does not finish within 30 s is retried on a fresh node, up to five
            // times.
            let mut raws = Vec::new();
            for how in [Raw::SignEach, Raw::Batched, Raw::Presigned] {
                let mut raw = raw_case(n, senders, how).await;
                for _ in 0..5 {
                    if raw.is_ok() {
                        break;
                    }
                    eprintln!(
                        "raw case failed, retrying on a fresh Anvil: {:?}",
                        raw.err()
                    );
                    raw = raw_case(n, senders, how).await;
                }
                raws.push(raw?);
            }
            let row = Row {
                keel: keel.per_second,
                settled: keel.settled_per_second,
                raw: raws[0].per_second,
                batch: raws[1].per_second,
                pre: raws[2].per_second,
                keel_lat: (keel.p50_ms, keel.p99_ms),
                raw_lat: (raws[0].p50_ms, raws[0].p99_ms),
            };
            println!("{}", row.line(&label(mode, senders, n)));
            reps.push(row);
        }
        if repeat > 1 {
            medians.push(summary(&label(mode, senders, n), &reps));
        }
    }
    for m in &medians {
        println!("{m}");
    }
    println!(
        "keel tx/s: first enqueue -> every request accepted by the node and mined (each sender's\n\
         chain nonce reached), with full durability (request, nonce, signed bytes persisted\n\
         before broadcast); settled/s: first enqueue -> every request settled `confirmed`.\n\
         tick: all enqueued first, then tick() until settled; run: TxQueue::run while enqueuing.\n\
         n: transfers in the case; the burst figures include the pipeline's fill and drain\n\
         (first enqueue -> first broadcast, last commit -> last broadcast), sustained ones\n\
         spread them over n.\n\
         latency (ms): keel = enqueue -> broadcast recorded; raw = one send"
    );
    println!(
        "raw: the same transfers with alloy, no database, 64 in flight, signed right before each\n\
         send (the ceiling of the ratio); batch: the same sent as Keel sends (JSON-RPC batches\n\
         of 16 consecutive nonces of one sender, 4 in flight, signed right before); pre:\n\
         pre-signed bytes only sent (replay, no signing)"
    );
    Ok(())
}
