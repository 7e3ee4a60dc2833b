//! Historical catch-up: block ranges below the settled height, recorded in
//! `index_range`, leased by any indexer replica, worked with adaptive `eth_getLogs`
//! spans and completed in the same transaction as their rows.
//!
//! The chain's owner calls [`plan_history`] up to the block before the tip ingest's
//! start block; history and tip then meet without a gap, and any overlap is harmless
//! because every write is idempotent on `(chain, block hash, log index)`.
//!
//! Contracts discovered inside a range (a token announced by `AssetCreated`) are
//! fetched for the rest of that range and get address-only ranges for the spans that
//! will not read the new scope: whole-scope ranges above that are already claimed or
//! completed, and tip blocks above the planned history. Pending ranges above are
//! locked while the discovery commits, so they read the new scope when claimed.

use crate::decode::decode;
use crate::scope::{ScopeKind, chain_i64, live_scope, to_i64};
use crate::store::logs::{Batch, batch_insert};
use crate::store::{block, chain as chain_row, range, scope as scope_rows};
use crate::{IndexError, Result};
use alloy::primitives::Address;
use alloy::rpc::types::Log;
use keel_chain::{ChainError, NodeErrorKind, UpstreamPool};
use keel_store::PgPool;
use keel_units::ChainId;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// Settings of a history worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// How long a claimed range stays leased; a replica that stops is replaced after
    /// this (default 60 s). A worker renews its lease every third of this while it
    /// fetches the range (fenced by its attempt), so a long range is not offered again
    /// while its worker is alive.
    pub lease: Duration,
    /// Largest `eth_getLogs` span in blocks (default 2000). The span halves on a
    /// "range too large"/"too many results" answer, shrinks when an answer had more
    /// logs than [`HistoryWorker::with_target_logs_per_request`], and doubles back on
    /// smaller answers.
    pub max_span: u64,
    /// Retries of a rate-limited or unreachable `eth_getLogs` before the range is left
    /// to its lease (default 5, 200 ms apart, doubling).
    pub retries: u32,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            max_span: 2_000,
            retries: 5,
        }
    }
}

/// A contract announced by a factory in the scope: (address, kind, announcing block).
type Announced = (Address, ScopeKind, u64);

/// What `HistoryWorker::fetch_all` returns: the range's rows encoded for the bulk
/// write, the contracts discovered in it, and the span splits.
#[derive(Debug)]
struct Fetched {
    batch: Batch,
    discovered: Vec<Announced>,
    splits: u64,
}

/// One `eth_getLogs` span's answer, encoded in its fetch task.
struct Chunk {
    batch: Batch,
    announced: Vec<Announced>,
    logs: u64,
}

/// Default of [`HistoryWorker::with_target_logs_per_request`].
pub const DEFAULT_TARGET_LOGS_PER_REQUEST: u64 = 1_000;

/// A claimed range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeLease {
    /// Row id in `index_range`.
    pub id: i64,
    /// The chain.
    pub chain: ChainId,
    /// `None` for the whole scope, else the one contract this range backfills.
    pub address: Option<Address>,
    /// First block (inclusive).
    pub from_block: u64,
    /// Last block (inclusive).
    pub to_block: u64,
    /// Claim count of the range, this claim included; completion is guarded by it.
    pub attempt: i32,
}

/// A completed range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeDone {
    /// First block.
    pub from_block: u64,
    /// Last block.
    pub to_block: u64,
    /// Logs written (before de-duplication).
    pub logs: u64,
    /// `eth_getLogs` span splits caused by "range too large" answers.
    pub splits: u64,
}

/// Splits `[start, to_block]` into pending whole-scope ranges of `range_size` blocks,
/// where `start` continues after the last planned range (or, the first time, is the
/// lowest `from_block` of the live scope). Serialized per chain by locking the
/// `index_chain` row, so repeated or concurrent calls never plan a block twice.
/// Returns the number of ranges created.
///
/// # Errors
/// [`IndexError::Config`] for `range_size` 0; [`IndexError::Store`].
pub async fn plan_history(
    db: &PgPool,
    chain: ChainId,
    to_block: u64,
    range_size: u64,
) -> Result<u64> {
    if range_size == 0 {
        return Err(IndexError::Config {
            key: "rangeSize",
            reason: "must be at least 1",
        });
    }
    let c = chain_i64(chain);
    let mut tx = db.begin().await?;
    chain_row::chain_ensure(&mut *tx, c).await?;
    chain_row::chain_lock(&mut *tx, c).await?;
    let start = range::range_plan_start(&mut *tx, c).await?;
    let Some(start) = start.and_then(|s| u64::try_from(s).ok()) else {
        return Ok(0);
    };
    let mut froms = Vec::new();
    let mut tos = Vec::new();
    let mut f = start;
    while f <= to_block {
        let t = f.saturating_add(range_size - 1).min(to_block);
        froms.push(to_i64(f));
        tos.push(to_i64(t));
        f = t + 1;
    }
    range::ranges_insert_many(&mut *tx, c, &froms, &tos).await?;
    tx.commit().await?;
    Ok(froms.len() as u64)
}

/// Ranges of `chain` not yet completed.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn pending_ranges(db: &PgPool, chain: ChainId) -> Result<u64> {
    let n = range::ranges_open_count(db, chain_i64(chain)).await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The settled height: the `finalized` block where the node has the tag, else
/// `head − confirmations`.
///
/// # Errors
/// [`IndexError::Chain`] when the head cannot be read.
pub async fn settled_height(node: &UpstreamPool, confirmations: u64) -> Result<u64> {
    if let Ok(Some(b)) = node.finalized().await {
        return Ok(b.number);
    }
    Ok(node.block_number().await?.saturating_sub(confirmations))
}

/// One replica's history worker for one chain.
///
/// [`HistoryWorker::run_once`] works one range at a time; [`HistoryWorker::drain`]
/// pipelines: the next range is claimed and fetched while the previous one is written.
/// Within a range, up to [`HistoryWorker::with_fetch_concurrency`] `eth_getLogs` spans
/// are in flight, each decoded and encoded for the bulk write in its own task.
#[derive(Debug)]
pub struct HistoryWorker {
    db: PgPool,
    node: Arc<UpstreamPool>,
    worker_id: String,
    config: HistoryConfig,
    span: AtomicU64,
    fetch_concurrency: usize,
    write_concurrency: usize,
    target_logs: u64,
    /// First hold of a range refused as unsettled, doubling per refusal up to the cap.
    unsettled_backoff: (Duration, Duration),
    /// Unsettled refusals since the last WARN, and when that was (one WARN per
    /// [`UNSETTLED_WARN_EVERY`] per worker).
    unsettled_warn: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

/// Default first hold of a range refused as unsettled
/// ([`HistoryWorker::with_unsettled_backoff`]).
pub const DEFAULT_UNSETTLED_BACKOFF: Duration = Duration::from_millis(250);
/// Default longest hold of a range refused as unsettled.
pub const DEFAULT_UNSETTLED_BACKOFF_CAP: Duration = Duration::from_secs(5);
/// At most one WARN per this interval per worker for unsettled ranges.
const UNSETTLED_WARN_EVERY: Duration = Duration::from_secs(30);

/// Most writers [`HistoryWorker::drain`] runs at once.
pub const MAX_WRITE_CONCURRENCY: usize = 4;

impl HistoryWorker {
    /// A worker named `worker_id` (recorded as `lease_owner`).
    ///
    /// # Errors
    /// [`IndexError::Config`] when `max_span` is 0 or `lease` is zero.
    pub fn new(
        db: PgPool,
        node: Arc<UpstreamPool>,
        worker_id: impl Into<String>,
        config: HistoryConfig,
    ) -> Result<Self> {
        if config.max_span == 0 {
            return Err(IndexError::Config {
                key: "maxSpan",
                reason: "must be at least 1",
            });
        }
        if config.lease.is_zero() {
            return Err(IndexError::Config {
                key: "lease",
                reason: "must be positive",
            });
        }
        let span = AtomicU64::new(config.max_span);
        Ok(Self {
            db,
            node,
            worker_id: worker_id.into(),
            config,
            span,
            fetch_concurrency: 1,
            write_concurrency: 1,
            target_logs: DEFAULT_TARGET_LOGS_PER_REQUEST,
            unsettled_backoff: (DEFAULT_UNSETTLED_BACKOFF, DEFAULT_UNSETTLED_BACKOFF_CAP),
            unsettled_warn: std::sync::Mutex::new((None, 0)),
        })
    }

    /// A range refused as unsettled ([`IndexError::Unsettled`]: its answer held a block
    /// the index does not hold as canonical yet) is not claimed again before `base`,
    /// doubling with each refusal of that range, at most `cap` (defaults
    /// [`DEFAULT_UNSETTLED_BACKOFF`], [`DEFAULT_UNSETTLED_BACKOFF_CAP`]; `base` at least
    /// 1 ms, `cap` at least `base`). The cap bounds how long a range waits once the tip
    /// has reached its blocks.
    #[must_use]
    pub fn with_unsettled_backoff(mut self, base: Duration, cap: Duration) -> Self {
        let base = base.max(Duration::from_millis(1));
        self.unsettled_backoff = (base, cap.max(base));
        self
    }

    /// The chain this worker's node serves.
    pub fn chain(&self) -> ChainId {
        self.node.chain()
    }

    /// The database this worker writes to.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// Up to `n` `eth_getLogs` requests of one range in flight at once (default 1;
    /// at least 1). Against a local node, 8–16 is where fetching stops being the
    /// bottleneck; against a hosted provider, mind its rate limit (the upstream
    /// pool's limiter applies to every request).
    #[must_use]
    pub fn with_fetch_concurrency(mut self, n: usize) -> Self {
        self.fetch_concurrency = n.max(1);
        self
    }

    /// Up to `n` fetched ranges written at once by [`HistoryWorker::drain`], each in
    /// its own transaction on its own connection (default 1; 1 to
    /// [`MAX_WRITE_CONCURRENCY`]). Writing is where a range's time goes (index
    /// maintenance in PostgreSQL), so a second writer lets one process use more than one
    /// database core; the pool needs `n` + 1 connections.
    #[must_use]
    pub fn with_write_concurrency(mut self, n: usize) -> Self {
        self.write_concurrency = n.clamp(1, MAX_WRITE_CONCURRENCY);
        self
    }

    /// The span of the next `eth_getLogs` shrinks (proportionally) when an answer had
    /// more than `n` logs, and doubles (up to [`HistoryConfig::max_span`]) only when an
    /// answer had at most `n / 2`; 0 turns this off (always double on success).
    /// Default [`DEFAULT_TARGET_LOGS_PER_REQUEST`]: nodes encode big answers slowly,
    /// and small ones spread over concurrent requests.
    #[must_use]
    pub fn with_target_logs_per_request(mut self, n: u64) -> Self {
        self.target_logs = n;
        self
    }

    /// Claims, works and completes one range. `None` when no range is claimable.
    ///
    /// # Errors
    /// As [`HistoryWorker::claim`] and [`HistoryWorker::work`]. On error the range
    /// stays leased and is offered again when the lease expires.
    pub async fn run_once(&self) -> Result<Option<RangeDone>> {
        match self.claim().await? {
            Some(lease) => Ok(Some(self.work(&lease).await?)),
            None => Ok(None),
        }
    }

    /// Claims, works and completes ranges until none is claimable, pipelined: while
    /// one range is written (its rows, projections and completion in one
    /// transaction, fenced by its attempt as in [`HistoryWorker::work`]), the next one
    /// is claimed and fetched, its lease renewed until its write begins. Ranges that
    /// contracts discovered on the way schedule are drained too. Returns the completed
    /// ranges.
    ///
    /// # Errors
    /// The first error of a fetch or a write (as [`HistoryWorker::work`]); the ranges
    /// then claimed but not completed stay leased and are offered again when their
    /// leases expire. Nothing of an uncompleted range is committed.
    pub async fn drain(&self) -> Result<Vec<RangeDone>> {
        let mut all = Vec::new();
        loop {
            let done = self.drain_pass().await?;
            if done.is_empty() {
                return Ok(all);
            }
            all.extend(done);
        }
    }

    /// One pipelined pass: a fetcher claims and fetches ranges until none is
    /// claimable, handing each to the writers through a channel of one.
    async fn drain_pass(&self) -> Result<Vec<RangeDone>> {
        let (send, recv) = tokio::sync::mpsc::channel::<(RangeLease, Fetched)>(1);
        let recv = tokio::sync::Mutex::new(recv);
        let fetcher = async move {
            while let Some(lease) = self.claim().await? {
                let send = &send;
                let fetch_and_hand_over = async {
                    let t0 = std::time::Instant::now();
                    let fetched = self.fetch_all(&lease).await?;
                    tracing::debug!(target: "keel::index::history", from = lease.from_block, logs = fetched.batch.log_rows(), ms = t0.elapsed().as_millis() as u64, "range fetched");
                    send.send((lease.clone(), fetched))
                        .await
                        .map_err(|_| IndexError::Interrupted)
                };
                // Renewed while fetched and while waiting for the writer.
                self.while_renewing(&lease, fetch_and_hand_over).await?;
            }
            Ok::<(), IndexError>(())
        };
        let writer = |i: usize| {
            let recv = &recv;
            async move {
                let mut done = Vec::new();
                if i >= self.write_concurrency {
                    return Ok::<_, IndexError>(done);
                }
                loop {
                    let next = recv.lock().await.recv().await;
                    let Some((lease, fetched)) = next else {
                        return Ok(done);
                    };
                    let t0 = std::time::Instant::now();
                    done.push(self.complete(&lease, fetched).await?);
                    tracing::debug!(target: "keel::index::history", from = lease.from_block, writer = i, ms = t0.elapsed().as_millis() as u64, "range written");
                }
            }
        };
        let ((), mut done, d1, d2, d3) =
            tokio::try_join!(fetcher, writer(0), writer(1), writer(2), writer(3))?;
        done.extend(d1.into_iter().chain(d2).chain(d3));
        Ok(done)
    }

    /// Claims the lowest claimable range of the node's chain (pending, or running with
    /// an expired lease) in one statement (`FOR UPDATE SKIP LOCKED`), incrementing its
    /// attempt and setting the lease.
    ///
    /// # Errors
    /// [`IndexError::Store`].
    pub async fn claim(&self) -> Result<Option<RangeLease>> {
        let chain = self.node.chain();
        let row = range::range_claim(
            &self.db,
            chain_i64(chain),
            &self.worker_id,
            self.config.lease.as_secs_f64(),
        )
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(RangeLease {
            id: row.id,
            chain,
            address: row.address.and_then(|a| Address::try_from(&a[..]).ok()),
            from_block: u64::try_from(row.from_block).unwrap_or(0),
            to_block: u64::try_from(row.to_block).unwrap_or(0),
            attempt: row.attempt,
        }))
    }

    /// Fetches the range's logs and writes them, their projections and the range's
    /// completion in one transaction. While fetching, the lease is renewed every third
    /// of [`HistoryConfig::lease`], fenced by the attempt; a renewal that finds the
    /// range claimed again stops the fetch. The completion is guarded by the attempt
    /// too: if the range was claimed again since (the lease expired), nothing is
    /// committed.
    ///
    /// # Errors
    /// [`IndexError::LeaseLost`] (renewal or completion found the attempt superseded); [`IndexError::Chain`] when `eth_getLogs` keeps
    /// failing (after retries, or "range too large" at a span of one block);
    /// [`IndexError::Store`].
    #[tracing::instrument(target = "keel::index::history", skip_all, fields(chain = %lease.chain, from = lease.from_block, to = lease.to_block))]
    pub async fn work(&self, lease: &RangeLease) -> Result<RangeDone> {
        // Fetching can take longer than the lease: renew it (fenced by the attempt)
        // while the fetch runs. A lost lease drops the fetch and commits nothing. The
        // renewal stops before the write transaction, which locks the range row (so a
        // claimer skips it) until the completion commits.
        let fetched = self.while_renewing(lease, self.fetch_all(lease)).await?;
        self.complete(lease, fetched).await
    }

    /// Writes a fetched range: its completion (guarded by the attempt; first, so the
    /// range row stays locked until the commit), scheduled gaps for discovered
    /// contracts, the rows and the discovered scope, in one transaction.
    async fn complete(&self, lease: &RangeLease, fetched: Fetched) -> Result<RangeDone> {
        let chain = lease.chain;
        let Fetched {
            batch,
            discovered,
            splits,
        } = fetched;
        let logs = batch.log_rows();
        let c = chain_i64(chain);
        let mut tx = self.db.begin().await?;
        if !range::range_complete(&mut *tx, lease.id, lease.attempt, to_i64(logs)).await? {
            return Err(self.lost(lease));
        }
        // The chain row is locked shared before any row is written: tip commits and
        // reorg rollbacks lock it exclusively, so the checkpoint and the hash window read
        // here stay as they are until this commits.
        let tip = chain_row::chain_tip_for_share(&mut *tx, c).await?;
        if let Some(number) = unsettled_block(&mut tx, c, tip, &batch).await? {
            drop(tx);
            return Err(self.unsettled(lease, number).await);
        }
        // Discovered contracts need their events above this range, but only where
        // nobody will read the new scope: whole-scope ranges already claimed or completed
        // (they may have read the scope before this commit), and blocks the tip has
        // already committed above the planned history. Pending ranges above are locked
        // here, so claimers skip them until this commits and then read the new scope.
        // The chain row is locked shared above (tip commits lock it exclusively and
        // re-read the scope under that lock).
        let mut gaps: Vec<(i64, i64)> = Vec::new();
        if !discovered.is_empty() {
            let above =
                range::ranges_whole_above_for_update(&mut *tx, c, to_i64(lease.to_block)).await?;
            let planned_end = above
                .iter()
                .map(|r| r.to_block)
                .max()
                .unwrap_or(to_i64(lease.to_block));
            gaps.extend(
                above
                    .into_iter()
                    .filter(|r| r.state != "pending")
                    .map(|r| (r.from_block, r.to_block)),
            );
            if let Some(tip) = tip
                && tip > planned_end
            {
                gaps.push((planned_end + 1, tip));
            }
        }
        batch_insert(&mut tx, c, &batch).await?;
        for (address, kind, block) in &discovered {
            scope_rows::scope_insert_discovered(
                &mut *tx,
                c,
                address.as_slice(),
                kind.as_str(),
                to_i64(*block),
            )
            .await?;
            for (from, to) in &gaps {
                range::range_insert_address(&mut *tx, c, address.as_slice(), *from, *to).await?;
            }
        }
        tx.commit().await?;
        metrics::counter!("keel_index_history_logs_total", "chain_id" => chain.get().to_string())
            .increment(logs);
        Ok(RangeDone {
            from_block: lease.from_block,
            to_block: lease.to_block,
            logs,
            splits,
        })
    }

    /// The range's logs (the scope's, and those of contracts announced inside the
    /// range from their announcing block on), encoded for the bulk write, with the
    /// discovered contracts and the span splits.
    ///
    /// Blocks above the indexed tip are not fetched: the tip ingest writes them itself
    /// with the scope as it is when it gets there (a range ends above the tip after a
    /// reorg rolled the tip back below it).
    async fn fetch_all(&self, lease: &RangeLease) -> Result<Fetched> {
        let chain = lease.chain;
        let c = chain_i64(chain);
        let tip = crate::read::indexed_tip(&self.db, chain).await?;
        let to_block = tip.map_or(lease.to_block, |t| lease.to_block.min(t.number));
        let scope = live_scope(&self.db, chain).await?;
        let mut kinds: HashMap<Address, ScopeKind> =
            scope.iter().map(|e| (e.address, e.kind)).collect();
        let addresses: Vec<Address> = match lease.address {
            Some(a) => vec![a],
            None => scope
                .iter()
                .filter(|e| e.from_block <= lease.to_block)
                .map(|e| e.address)
                .collect(),
        };
        let mut discovered: Vec<Announced> = Vec::new();
        let mut splits = 0;
        let mut batch = Batch::default();
        let mut announced = Vec::new();
        if !addresses.is_empty() && lease.from_block <= to_block {
            let (b, a) = self
                .fetch_range(
                    c,
                    lease.from_block,
                    to_block,
                    addresses,
                    Arc::new(kinds.clone()),
                    &mut splits,
                )
                .await?;
            batch.append(b);
            announced = a;
        }
        // Contracts announced in this range: fetch them from their announcing block on
        // (earliest announcement first).
        loop {
            announced.sort_by_key(|(_, _, block)| std::cmp::Reverse(*block));
            let Some((address, kind, block)) = announced.pop() else {
                break;
            };
            if kinds.contains_key(&address) {
                continue;
            }
            kinds.insert(address, kind);
            discovered.push((address, kind, block));
            let (b, a) = self
                .fetch_range(
                    c,
                    block,
                    to_block,
                    vec![address],
                    Arc::new(kinds.clone()),
                    &mut splits,
                )
                .await?;
            batch.append(b);
            announced.extend(a);
        }
        Ok(Fetched {
            batch,
            discovered,
            splits,
        })
    }

    /// Runs `fetch` while renewing `lease` every third of the configured lease. A
    /// renewal that finds the attempt superseded or the range no longer running ends
    /// the fetch with [`IndexError::LeaseLost`]; a failed renewal (database
    /// unreachable) is retried at the next tick until the lease would have expired,
    /// then also counts as lost.
    async fn while_renewing<T>(
        &self,
        lease: &RangeLease,
        fetch: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let every = self.renew_every();
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewed = tokio::time::Instant::now();
        let mut fetch = std::pin::pin!(fetch);
        loop {
            tokio::select! {
                biased;
                out = &mut fetch => return out,
                _ = ticker.tick() => match self.renew(lease).await {
                    Ok(true) => renewed = tokio::time::Instant::now(),
                    Ok(false) => return Err(self.lost(lease)),
                    Err(e) if renewed.elapsed() < self.config.lease => {
                        tracing::warn!(target: "keel::index::history", chain = %lease.chain, from = lease.from_block, error = %e, "lease renewal failed; retrying");
                    }
                    Err(_) => return Err(self.lost(lease)),
                },
            }
        }
    }

    /// The renewal period: a third of the lease (at least 1 ms).
    fn renew_every(&self) -> Duration {
        (self.config.lease / 3).max(Duration::from_millis(1))
    }

    /// Extends the lease of `lease` if it is still this attempt's and the range still
    /// running. False when it is not (another worker claimed it since).
    ///
    /// # Errors
    /// [`IndexError::Store`].
    pub async fn renew(&self, lease: &RangeLease) -> Result<bool> {
        range::range_renew(
            &self.db,
            lease.id,
            lease.attempt,
            self.config.lease.as_secs_f64(),
        )
        .await
    }

    /// A fetched range held a row of block `number` that is not the block the index
    /// holds as canonical: puts the range back to pending (guarded by the attempt),
    /// held back per range ([`HistoryWorker::with_unsettled_backoff`]: not claimed again
    /// at once), counts it (`keel_index_history_unsettled_total`), logs a WARN at most
    /// every 30 s per worker (with the refusals since the last one; DEBUG otherwise) and
    /// returns [`IndexError::Unsettled`].
    async fn unsettled(&self, lease: &RangeLease, number: u64) -> IndexError {
        metrics::counter!("keel_index_history_unsettled_total", "chain_id" => lease.chain.get().to_string()).increment(1);
        let (base, cap) = self.unsettled_backoff;
        let released = range::range_release_unsettled(
            &self.db,
            lease.id,
            lease.attempt,
            base.as_secs_f64(),
            cap.as_secs_f64(),
        )
        .await;
        let hold_ms = match &released {
            Ok(hold) => hold.map(|h| (h * 1_000.0) as u64),
            Err(e) => {
                tracing::warn!(target: "keel::index::history", chain = %lease.chain, from = lease.from_block, error = %e, "releasing the range failed; its lease will lapse");
                None
            }
        };
        let warn = {
            let mut w = self
                .unsettled_warn
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            w.1 += 1;
            let now = std::time::Instant::now();
            if w.0
                .is_none_or(|t| now.duration_since(t) >= UNSETTLED_WARN_EVERY)
            {
                let occurrences = w.1;
                *w = (Some(now), 0);
                Some(occurrences)
            } else {
                None
            }
        };
        match warn {
            Some(occurrences) => {
                tracing::warn!(target: "keel::index::history", chain = %lease.chain, from = lease.from_block, to = lease.to_block, block = number, occurrences, ?hold_ms, "range answer holds a block the index does not hold as canonical yet (above the indexed tip, or a reorg since the fetch); nothing written, the range is fetched again after a backoff");
            }
            None => {
                tracing::debug!(target: "keel::index::history", chain = %lease.chain, from = lease.from_block, to = lease.to_block, block = number, ?hold_ms, "range unsettled; backing off");
            }
        }
        IndexError::Unsettled {
            chain: lease.chain,
            from_block: lease.from_block,
            number,
        }
    }

    fn lost(&self, lease: &RangeLease) -> IndexError {
        metrics::counter!("keel_index_history_leases_lost_total", "chain_id" => lease.chain.get().to_string()).increment(1);
        IndexError::LeaseLost {
            chain: lease.chain,
            from_block: lease.from_block,
            attempt: lease.attempt,
        }
    }

    /// Logs of `addresses` over `[from, to]`, encoded, with the contracts they
    /// announce. Up to `fetch_concurrency` `eth_getLogs` spans are in flight, each in
    /// its own task that also decodes and encodes its answer. A span answered "range
    /// too large" is split in halves (and the worker's span halves); the span adapts
    /// to the answers' sizes (see [`HistoryWorker::with_target_logs_per_request`]).
    async fn fetch_range(
        &self,
        chain: i64,
        from: u64,
        to: u64,
        addresses: Vec<Address>,
        kinds: Arc<HashMap<Address, ScopeKind>>,
        splits: &mut u64,
    ) -> Result<(Batch, Vec<Announced>)> {
        let addresses = Arc::new(addresses);
        let mut batch = Batch::default();
        let mut announced = Vec::new();
        let mut retry: VecDeque<(u64, u64)> = VecDeque::new();
        let mut next = Some(from).filter(|f| *f <= to);
        let mut tasks: JoinSet<(u64, u64, Result<Chunk>)> = JoinSet::new();
        loop {
            while tasks.len() < self.fetch_concurrency {
                let (start, end) = if let Some(r) = retry.pop_front() {
                    r
                } else if let Some(start) = next {
                    let span = self.span.load(Ordering::Relaxed).max(1);
                    let end = start.saturating_add(span - 1).min(to);
                    next = end.checked_add(1).filter(|n| *n <= to);
                    (start, end)
                } else {
                    break;
                };
                let node = self.node.clone();
                let addresses = addresses.clone();
                let kinds = kinds.clone();
                let retries = self.config.retries;
                tasks.spawn(async move {
                    let out = match get_logs(&node, retries, start, end, &addresses).await {
                        Ok(logs) => encode_chunk(chain, &logs, &kinds),
                        Err(e) => Err(e),
                    };
                    (start, end, out)
                });
            }
            let Some(joined) = tasks.join_next().await else {
                break;
            };
            let (start, end, out) = match joined {
                Ok(j) => j,
                Err(e) => match e.try_into_panic() {
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(_) => return Err(IndexError::Interrupted),
                },
            };
            match out {
                Ok(chunk) => {
                    self.adapt_span(end - start + 1, chunk.logs);
                    batch.append(chunk.batch);
                    announced.extend(chunk.announced);
                }
                Err(IndexError::Chain(ChainError::Node { error, .. }))
                    if error.kind == NodeErrorKind::RangeTooLarge && end > start =>
                {
                    let half = (end - start).div_ceil(2).max(1);
                    self.span.fetch_min(half, Ordering::Relaxed);
                    let mid = start + half - 1;
                    retry.push_front((mid + 1, end));
                    retry.push_front((start, mid));
                    *splits += 1;
                    metrics::counter!("keel_index_history_span_splits_total", "chain_id" => chain.to_string()).increment(1);
                }
                Err(e) => return Err(e),
            }
        }
        Ok((batch, announced))
    }

    /// The next span after an answer of `logs` logs for `span` blocks.
    fn adapt_span(&self, span: u64, logs: u64) {
        let target = self.target_logs;
        let next = if target > 0 && logs > target {
            (u128::from(span) * u128::from(target) / u128::from(logs)) as u64
        } else if target == 0 || logs.saturating_mul(2) <= target {
            span.saturating_mul(2)
        } else {
            span
        };
        self.span
            .store(next.clamp(1, self.config.max_span), Ordering::Relaxed);
    }
}

/// The first block of `batch` whose rows may not be written: inside the chain's hash
/// window (`index_block`, from its oldest block up) but not the block stored there, or
/// above the indexed tip `tip` (the tip ingest writes those blocks itself, with the
/// scope as it is when it gets there). Blocks below the window are settled (the window
/// is at least the finality depth deep). Every block is suspect when two rows of one
/// number carry different hashes. Runs inside the caller's transaction, which holds
/// the chain row locked, so the window cannot change until it commits.
async fn unsettled_block(
    tx: &mut sqlx::PgConnection,
    chain: i64,
    tip: Option<i64>,
    batch: &Batch,
) -> Result<Option<u64>> {
    let blocks = batch.blocks();
    let (Some((&lowest, _)), Some((&highest, _))) =
        (blocks.first_key_value(), blocks.last_key_value())
    else {
        return Ok(None);
    };
    if batch.forked() {
        return Ok(Some(lowest));
    }
    if let Some(t) = tip.and_then(|t| u64::try_from(t).ok())
        && highest > t
    {
        return Ok(blocks.keys().copied().find(|n| *n > t));
    }
    let oldest = block::block_oldest(&mut *tx, chain).await?;
    let Some(oldest) = oldest.and_then(|o| u64::try_from(o).ok()) else {
        return Ok(None);
    };
    if highest < oldest {
        return Ok(None);
    }
    let stored =
        block::blocks_between(&mut *tx, chain, to_i64(lowest.max(oldest)), to_i64(highest)).await?;
    let stored: HashMap<u64, Vec<u8>> = stored
        .into_iter()
        .filter_map(|b| Some((u64::try_from(b.number).ok()?, b.hash)))
        .collect();
    Ok(blocks
        .range(oldest..)
        .find(|(n, hash)| stored.get(n).map(Vec::as_slice) != Some(hash.as_slice()))
        .map(|(n, _)| *n))
}

/// Encodes one span's logs for the bulk write and lists the contracts they announce
/// (factory events only are decoded for that).
fn encode_chunk(chain: i64, logs: &[Log], kinds: &HashMap<Address, ScopeKind>) -> Result<Chunk> {
    let batch = Batch::encode(chain, logs, kinds)?;
    let announced = logs
        .iter()
        .filter_map(|log| {
            let kind = *kinds.get(&log.inner.address)?;
            if !matches!(kind, ScopeKind::AssetFactory | ScopeKind::PriceFeedFactory) {
                return None;
            }
            let (address, new_kind) = decode(kind, log)?.discovers()?;
            Some((address, new_kind, log.block_number.unwrap_or(0)))
        })
        .collect();
    Ok(Chunk {
        batch,
        announced,
        logs: logs.len() as u64,
    })
}

/// `eth_getLogs` over `[from, to]` for `addresses`, retrying rate limits and
/// transport failures with backoff (`retries` times, 200 ms apart, doubling).
async fn get_logs(
    node: &UpstreamPool,
    retries: u32,
    from: u64,
    to: u64,
    addresses: &[Address],
) -> Result<Vec<Log>> {
    let mut delay = Duration::from_millis(200);
    let mut attempt = 0;
    loop {
        match node.logs_in_range(addresses, from, to).await {
            Ok(l) => return Ok(l),
            Err(e) if e.is_retryable() && attempt < retries => {
                attempt += 1;
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
            }
            Err(e) => return Err(e.into()),
        }
    }
}
