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
use crate::write::write_logs;
use crate::{IndexError, Result};
use alloy::primitives::Address;
use alloy::rpc::types::Log;
use keel_chain::{ChainError, NodeErrorKind, UpstreamPool};
use keel_store::PgPool;
use keel_units::ChainId;
use serde::Deserialize;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Settings of a history worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// How long a claimed range stays leased; a replica that stops is replaced after
    /// this (default 60 s). A worker renews its lease every third of this while it
    /// fetches the range (fenced by its attempt), so a long range is not offered again
    /// while its worker is alive.
    pub lease: Duration,
    /// Largest `eth_getLogs` span in blocks (default 2000). The span halves on a
    /// "range too large"/"too many results" answer and doubles back on success.
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

/// What `HistoryWorker::fetch_all` returns: logs, scope kinds, discovered contracts
/// (address, kind, announcing block), span splits.
type Fetched = (
    Vec<Log>,
    HashMap<Address, ScopeKind>,
    Vec<(Address, ScopeKind, u64)>,
    u64,
);

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
    sqlx::query("INSERT INTO index_chain (chain_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(c)
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT 1 FROM index_chain WHERE chain_id = $1 FOR UPDATE")
        .bind(c)
        .execute(&mut *tx)
        .await?;
    let start: Option<i64> = sqlx::query_scalar(
        "SELECT COALESCE(
            (SELECT max(to_block) + 1 FROM index_range WHERE chain_id = $1 AND address IS NULL),
            (SELECT min(from_block) FROM index_scope WHERE chain_id = $1 AND removed_at IS NULL))",
    )
    .bind(c)
    .fetch_one(&mut *tx)
    .await?;
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
    sqlx::query(
        "INSERT INTO index_range (chain_id, from_block, to_block)
         SELECT $1, f, t FROM unnest($2::bigint[], $3::bigint[]) AS u(f, t)",
    )
    .bind(c)
    .bind(&froms)
    .bind(&tos)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(froms.len() as u64)
}

/// Ranges of `chain` not yet completed.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn pending_ranges(db: &PgPool, chain: ChainId) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM index_range WHERE chain_id = $1 AND state <> 'completed'",
    )
    .bind(chain_i64(chain))
    .fetch_one(db)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[derive(Debug, Deserialize)]
struct Numbered {
    number: alloy::primitives::U64,
}

/// The settled height: the `finalized` block where the node has the tag, else
/// `head − confirmations`.
///
/// # Errors
/// [`IndexError::Chain`] when the head cannot be read.
pub async fn settled_height(node: &UpstreamPool, confirmations: u64) -> Result<u64> {
    if let Ok(Some(b)) = node
        .request::<_, Option<Numbered>>("eth_getBlockByNumber", ("finalized", false))
        .await
    {
        return Ok(b.number.to::<u64>());
    }
    Ok(node.block_number().await?.saturating_sub(confirmations))
}

/// One replica's history worker for one chain.
#[derive(Debug)]
pub struct HistoryWorker {
    db: PgPool,
    node: Arc<UpstreamPool>,
    worker_id: String,
    config: HistoryConfig,
    span: AtomicU64,
}

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
        })
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

    /// Claims the lowest claimable range of the node's chain (pending, or running with
    /// an expired lease) in one statement (`FOR UPDATE SKIP LOCKED`), incrementing its
    /// attempt and setting the lease.
    ///
    /// # Errors
    /// [`IndexError::Store`].
    pub async fn claim(&self) -> Result<Option<RangeLease>> {
        let chain = self.node.chain();
        let row = sqlx::query(
            "WITH next AS (
                SELECT id FROM index_range
                WHERE chain_id = $1
                  AND (state = 'pending' OR (state = 'running' AND lease_expires_at < now()))
                ORDER BY from_block, id
                LIMIT 1
                FOR UPDATE SKIP LOCKED)
             UPDATE index_range r
                SET state = 'running', attempt = r.attempt + 1, lease_owner = $2,
                    lease_expires_at = now() + make_interval(secs => $3)
               FROM next WHERE r.id = next.id
             RETURNING r.id, r.address, r.from_block, r.to_block, r.attempt",
        )
        .bind(chain_i64(chain))
        .bind(&self.worker_id)
        .bind(self.config.lease.as_secs_f64())
        .fetch_optional(&self.db)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let address: Option<Vec<u8>> = row.try_get("address")?;
        let from: i64 = row.try_get("from_block")?;
        let to: i64 = row.try_get("to_block")?;
        Ok(Some(RangeLease {
            id: row.try_get("id")?,
            chain,
            address: address.and_then(|a| Address::try_from(&a[..]).ok()),
            from_block: u64::try_from(from).unwrap_or(0),
            to_block: u64::try_from(to).unwrap_or(0),
            attempt: row.try_get("attempt")?,
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
        let chain = lease.chain;
        // Fetching can take longer than the lease: renew it (fenced by the attempt)
        // while the fetch runs. A lost lease drops the fetch and commits nothing. The
        // renewal stops before the write transaction, which locks the range row (so a
        // claimer skips it) until the completion commits.
        let (logs, kinds, discovered, splits) =
            self.while_renewing(lease, self.fetch_all(lease)).await?;

        let c = chain_i64(chain);
        let mut tx = self.db.begin().await?;
        let done = sqlx::query(
            "UPDATE index_range
                SET state = 'completed', completed_at = now(), lease_expires_at = NULL, logs = $3
              WHERE id = $1 AND attempt = $2 AND state = 'running'",
        )
        .bind(lease.id)
        .bind(lease.attempt)
        .bind(to_i64(logs.len() as u64))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Err(self.lost(lease));
        }
        // Discovered contracts need their events above this range, but only where
        // nobody will read the new scope: whole-scope ranges already claimed or completed
        // (they may have read the scope before this commit), and blocks the tip has
        // already committed above the planned history. Pending ranges above are locked
        // here, so claimers skip them until this commits and then read the new scope.
        // The chain row is locked shared (tip commits lock it exclusively and re-read
        // the scope under that lock), before any row is written.
        let mut gaps: Vec<(i64, i64)> = Vec::new();
        if !discovered.is_empty() {
            let tip: Option<i64> = sqlx::query_scalar(
                "SELECT tip_number FROM index_chain WHERE chain_id = $1 FOR SHARE",
            )
            .bind(c)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
            let above: Vec<(i64, i64, String)> = sqlx::query_as(
                "SELECT from_block, to_block, state FROM index_range
                 WHERE chain_id = $1 AND address IS NULL AND from_block > $2
                 ORDER BY from_block FOR UPDATE",
            )
            .bind(c)
            .bind(to_i64(lease.to_block))
            .fetch_all(&mut *tx)
            .await?;
            let planned_end = above
                .iter()
                .map(|(_, t, _)| *t)
                .max()
                .unwrap_or(to_i64(lease.to_block));
            gaps.extend(
                above
                    .into_iter()
                    .filter(|(_, _, state)| state != "pending")
                    .map(|(f, t, _)| (f, t)),
            );
            if let Some(tip) = tip
                && tip > planned_end
            {
                gaps.push((planned_end + 1, tip));
            }
        }
        write_logs(&mut tx, c, &logs, &kinds).await?;
        for (address, kind, block) in &discovered {
            sqlx::query(
                "INSERT INTO index_scope (chain_id, address, kind, from_block, discovered_at_block)
                 VALUES ($1, $2, $3, $4, $4)
                 ON CONFLICT (chain_id, address) WHERE removed_at IS NULL DO NOTHING",
            )
            .bind(c)
            .bind(address.as_slice())
            .bind(kind.as_str())
            .bind(to_i64(*block))
            .execute(&mut *tx)
            .await?;
            for (from, to) in &gaps {
                sqlx::query(
                    "INSERT INTO index_range (chain_id, address, from_block, to_block)
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(c)
                .bind(address.as_slice())
                .bind(from)
                .bind(to)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        metrics::counter!("keel_index_history_logs_total", "chain_id" => chain.get().to_string())
            .increment(logs.len() as u64);
        Ok(RangeDone {
            from_block: lease.from_block,
            to_block: lease.to_block,
            logs: logs.len() as u64,
            splits,
        })
    }

    /// The range's logs (the scope's, and those of contracts announced inside the
    /// range from their announcing block on), with the scope's kinds, the discovered
    /// contracts and the span splits.
    async fn fetch_all(&self, lease: &RangeLease) -> Result<Fetched> {
        let chain = lease.chain;
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
        let mut discovered: Vec<(Address, ScopeKind, u64)> = Vec::new();
        let mut splits = 0;
        let mut logs = if addresses.is_empty() {
            Vec::new()
        } else {
            self.fetch_range(
                chain,
                lease.from_block,
                lease.to_block,
                &addresses,
                &mut splits,
            )
            .await?
        };
        // Contracts announced in this range: fetch them from their announcing block on.
        let mut pending = self.discover(&logs, &mut kinds, &mut discovered);
        while let Some((address, block)) = pending.pop() {
            let more = self
                .fetch_range(chain, block, lease.to_block, &[address], &mut splits)
                .await?;
            pending.extend(self.discover(&more, &mut kinds, &mut discovered));
            logs.extend(more);
        }
        logs.sort_by_key(|l| (l.block_number, l.log_index));
        logs.dedup_by_key(|l| (l.block_number, l.log_index));

        Ok((logs, kinds, discovered, splits))
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
        let renewed = sqlx::query(
            "UPDATE index_range SET lease_expires_at = now() + make_interval(secs => $3)
              WHERE id = $1 AND attempt = $2 AND state = 'running'",
        )
        .bind(lease.id)
        .bind(lease.attempt)
        .bind(self.config.lease.as_secs_f64())
        .execute(&self.db)
        .await?;
        Ok(renewed.rows_affected() == 1)
    }

    fn lost(&self, lease: &RangeLease) -> IndexError {
        metrics::counter!("keel_index_history_leases_lost_total", "chain_id" => lease.chain.get().to_string()).increment(1);
        IndexError::LeaseLost {
            chain: lease.chain,
            from_block: lease.from_block,
            attempt: lease.attempt,
        }
    }

    /// Logs of `addresses` over `[from, to]`, in `eth_getLogs` spans that halve on a
    /// "range too large" answer and double back (up to `max_span`) on success.
    async fn fetch_range(
        &self,
        chain: ChainId,
        from: u64,
        to: u64,
        addresses: &[Address],
        splits: &mut u64,
    ) -> Result<Vec<Log>> {
        let mut logs = Vec::new();
        let mut start = from;
        while start <= to {
            let span = self.span.load(Ordering::Relaxed).max(1);
            let end = start.saturating_add(span - 1).min(to);
            match self.get_logs(start, end, addresses).await {
                Ok(l) => {
                    logs.extend(l);
                    let grown = span.saturating_mul(2).min(self.config.max_span);
                    self.span.store(grown, Ordering::Relaxed);
                    start = end + 1;
                }
                Err(IndexError::Chain(ChainError::Node { error, .. }))
                    if error.kind == NodeErrorKind::RangeTooLarge && end > start =>
                {
                    self.span
                        .store((end - start).div_ceil(2).max(1), Ordering::Relaxed);
                    *splits += 1;
                    metrics::counter!("keel_index_history_span_splits_total", "chain_id" => chain.get().to_string()).increment(1);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(logs)
    }

    /// New contracts announced by `logs`, with the block that announced them.
    fn discover(
        &self,
        logs: &[Log],
        kinds: &mut HashMap<Address, ScopeKind>,
        discovered: &mut Vec<(Address, ScopeKind, u64)>,
    ) -> Vec<(Address, u64)> {
        let mut out = Vec::new();
        for log in logs {
            let Some(kind) = kinds.get(&log.inner.address).copied() else {
                continue;
            };
            if let Some((address, new_kind)) = decode(kind, log).and_then(|p| p.discovers())
                && !kinds.contains_key(&address)
            {
                let block = log.block_number.unwrap_or(0);
                kinds.insert(address, new_kind);
                discovered.push((address, new_kind, block));
                out.push((address, block));
            }
        }
        out
    }

    /// `eth_getLogs` over `[from, to]` for `addresses`, retrying rate limits and
    /// transport failures with backoff.
    async fn get_logs(&self, from: u64, to: u64, addresses: &[Address]) -> Result<Vec<Log>> {
        let filter = serde_json::json!({
            "fromBlock": format!("0x{from:x}"),
            "toBlock": format!("0x{to:x}"),
            "address": addresses,
        });
        let mut delay = Duration::from_millis(200);
        let mut attempt = 0;
        loop {
            match self
                .node
                .request::<_, Vec<Log>>("eth_getLogs", vec![filter.clone()])
                .await
            {
                Ok(l) => return Ok(l),
                Err(e) if e.is_retryable() && attempt < self.config.retries => {
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
