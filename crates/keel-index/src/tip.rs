//! Tip ingest: one epoch-fenced owner per chain follows the head block by block,
//! checks parent hashes, fetches logs by block hash and rolls back reorgs.

use crate::decode::decode;
use crate::scope::{ScopeKind, chain_i64, live_scope, to_i64};
use crate::store::{block, chain as chain_row, logs, scope as scope_rows};
use crate::{IndexError, Result};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::{Address, B256};
use alloy::rpc::types::Log;
use keel_chain::{BlockHeader, ChainError, UpstreamPool};
use keel_store::PgPool;
use keel_units::ChainId;
use sqlx::PgConnection;
use std::collections::HashMap;
use std::sync::Arc;

pub use crate::read::TIP_CHANNEL;

/// Settings of one chain's tip ingest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TipConfig {
    /// Blocks after which a block is considered final on this chain when the node has
    /// no `finalized` tag (e.g. 64 on an Ethereum-like chain).
    pub finality_depth: u64,
    /// Blocks kept in `index_block` below the tip for reorg detection at least; at
    /// least `finality_depth` (default `2 × finality_depth`, minimum 1). Blocks above
    /// the block Keel recorded as finalized are kept too, whatever the window, so a
    /// reorg deeper than the window but above recorded finality is still repaired
    /// exactly.
    pub hash_window: u64,
    /// First block to ingest when the chain has no checkpoint yet; `None` starts at
    /// the lowest `from_block` of the live scope, or at the head if the scope is empty.
    pub start_block: Option<u64>,
    /// Upper bound of blocks ingested by one [`TipIngest::round`] (default 1000).
    pub max_blocks_per_round: u64,
    /// The node's `finalized` block is read again (one `eth_getBlockByNumber`) by a
    /// round that commits a block only once the head has moved this many blocks since
    /// the last read (default 8, minimum 1 = every round). The recorded finalized height
    /// is a lower bound, so reading it less often only delays a block's `finalized`
    /// flag by up to this many blocks; it never marks a block final too early.
    pub finalized_refresh_blocks: u64,
    /// Whether the node's `finalized` tag decides which blocks are final (default
    /// true; `finality_depth` only where the node has no tag). `false`: the block
    /// `finality_depth` below the head is final whatever the tag says, for a chain
    /// whose operator sets its finality as a depth (`chains.<name>.indexFinalityDepth`).
    pub finalized_tag: bool,
}

impl TipConfig {
    /// Defaults for a chain with `finality_depth`.
    pub fn new(finality_depth: u64) -> Self {
        Self {
            finality_depth,
            hash_window: finality_depth.saturating_mul(2).max(1),
            start_block: None,
            max_blocks_per_round: 1_000,
            finalized_refresh_blocks: 8,
            finalized_tag: true,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`IndexError::Config`] naming `hashWindow`, `maxBlocksPerRound` or
    /// `finalizedRefreshBlocks`.
    pub fn validate(&self) -> Result<()> {
        if self.hash_window < self.finality_depth.max(1) {
            return Err(IndexError::Config {
                key: "hashWindow",
                reason: "must be at least finalityDepth and at least 1",
            });
        }
        if self.max_blocks_per_round == 0 {
            return Err(IndexError::Config {
                key: "maxBlocksPerRound",
                reason: "must be at least 1",
            });
        }
        if self.finalized_refresh_blocks == 0 {
            return Err(IndexError::Config {
                key: "finalizedRefreshBlocks",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }
}

/// What one [`TipIngest::round`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundOutcome {
    /// The head the node reported at the start of the round.
    pub head: u64,
    /// The indexed tip after the round (`None` if nothing was ever ingested).
    pub tip: Option<u64>,
    /// Blocks committed.
    pub blocks: u64,
    /// Logs committed.
    pub logs: u64,
    /// Reorgs rolled back.
    pub reorgs: u64,
    /// The node reported a head at or above this block but answered `null` for it
    /// (a hole, e.g. while the node applies a reorg): the round stopped there. A follow
    /// loop must back off before running another round ([`FollowBackoff`]), not spin.
    pub missing: Option<u64>,
}

/// What a reorg search found.
enum Reorg {
    /// Rolled back to this common ancestor (the new checkpoint).
    RolledBack((u64, B256)),
    /// The node has no header at this height below its head (a hole): nothing was
    /// decided; the round stops there ([`RoundOutcome::missing`]).
    Hole(u64),
}

/// Why fetching one block's data stopped.
enum Fetch {
    Ready(Vec<Log>, Vec<(Address, ScopeKind)>),
    /// The block is no longer canonical: re-read from the checkpoint.
    Orphaned,
}

/// The tip-ingest owner of one chain, holding a fencing epoch.
///
/// Every database write (block commit, reorg rollback) runs in one transaction that
/// first locks `index_chain` and checks the epoch; if another process took ownership
/// since, the write fails with [`IndexError::Fenced`] and commits nothing.
#[derive(Debug, Clone)]
pub struct TipIngest {
    db: PgPool,
    node: Arc<UpstreamPool>,
    chain: ChainId,
    epoch: i64,
    config: TipConfig,
    /// The last (head, tip) recorded in `index_chain` and when: the head observation is
    /// written when either changes, else at most every [`HEAD_RECORD_EVERY`].
    recorded: Arc<std::sync::Mutex<Option<HeadRecord>>>,
    /// The head at the last read of the node's `finalized` block
    /// ([`TipConfig::finalized_refresh_blocks`]).
    finalized_read_at: Arc<std::sync::Mutex<Option<u64>>>,
}

/// The last recorded (head, tip) and when.
type HeadRecord = (u64, Option<u64>, std::time::Instant);

/// How often an unchanged head observation is re-recorded (its `head_observed_at`
/// then tells a live owner from one that stopped reporting).
pub const HEAD_RECORD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl TipIngest {
    /// Takes ownership of `node`'s chain: increments `index_chain.owner_epoch`
    /// (creating the row at epoch 1), records `owner_id`, and returns an ingest
    /// holding the new epoch. Any earlier owner is fenced out from then on.
    ///
    /// Callers hold the chain's singleton (keel-cluster) before calling this; the
    /// epoch makes a late write of a previous owner harmless anyway.
    ///
    /// # Errors
    /// [`IndexError::Config`] for invalid settings; [`IndexError::Store`].
    pub async fn take_ownership(
        db: PgPool,
        node: Arc<UpstreamPool>,
        config: TipConfig,
        owner_id: &str,
    ) -> Result<Self> {
        config.validate()?;
        let chain = node.chain();
        let epoch = chain_row::chain_take_ownership(&db, chain_i64(chain), owner_id).await?;
        tracing::info!(target: "keel::index::tip", chain = %chain, epoch, "took tip-ingest ownership");
        Ok(Self {
            db,
            node,
            chain,
            epoch,
            config,
            recorded: Arc::default(),
            finalized_read_at: Arc::default(),
        })
    }

    /// The fencing epoch this owner holds.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// The chain.
    pub fn chain(&self) -> ChainId {
        self.chain
    }

    /// One ingest pass: reads the head, verifies the stored tip is still canonical
    /// (rolling back a reorg if not), then ingests up to `max_blocks_per_round` new
    /// blocks, each in its own fenced transaction with its logs, projections and the
    /// checkpoint. [`TipIngest::round_at`] without an announced head.
    ///
    /// # Errors
    /// [`IndexError::Fenced`] (stop: another owner took over), [`IndexError::ReorgTooDeep`]
    /// (stop: operator needed), retryable [`IndexError::Chain`], [`IndexError::Store`],
    /// [`IndexError::Inconsistent`].
    pub async fn round(&self) -> Result<RoundOutcome> {
        self.round_at(None).await
    }

    /// [`TipIngest::round`] up to a head the node announced (a `newHeads` subscription,
    /// [`keel_chain::HeadSignal`]), or up to the node's head read with `eth_blockNumber`
    /// when `announced` is `None`.
    ///
    /// The announced header stands in for two reads: the head number, and the header of
    /// that block (its logs are still fetched by its hash, EIP-234). When it is the
    /// child of the stored tip (its parent hash is the tip's hash) or the tip itself, it
    /// also proves the tip canonical, so the tip's header is not read again. Anything
    /// else (blocks between the tip and the head, a parent that differs: a reorg) is read
    /// from the node as in [`TipIngest::round`]. With one new block per head, a round
    /// then costs one `eth_getLogs`, plus a `finalized` read every
    /// [`TipConfig::finalized_refresh_blocks`] blocks.
    ///
    /// # Errors
    /// As [`TipIngest::round`].
    #[tracing::instrument(target = "keel::index::tip", skip_all, fields(chain = %self.chain, epoch = self.epoch, announced = announced.map(|h| h.number)))]
    pub async fn round_at(&self, announced: Option<BlockHeader>) -> Result<RoundOutcome> {
        // Side by side: one plain read for "still the owner, not degraded" and the
        // stored checkpoint (the writes below check the epoch again under the row lock),
        // the live scope, and the head unless it was announced.
        let head = async {
            Ok::<_, IndexError>(match announced {
                Some(h) => h.number,
                None => self.node.block_number().await?,
            })
        };
        let (mut tip, mut scope, head) =
            tokio::try_join!(self.fence_and_checkpoint(), self.load_scope(), head)?;
        // Dropped once it proves useless (its block turned out orphaned).
        let mut announced = announced;
        self.observed_head(head);
        let mut out = RoundOutcome {
            head,
            ..RoundOutcome::default()
        };

        // Verify the stored tip before building on it (catches same-height reorgs and
        // reorgs that happened while no owner was running).
        if let Some((number, hash)) = tip {
            let proven = announced.is_some_and(|h| {
                (h.number == number.saturating_add(1) && h.parent_hash == hash)
                    || (h.number == number && h.hash == hash)
            });
            let node_hash = if proven {
                Some(hash)
            } else {
                self.header(number).await?.map(|h| h.hash)
            };
            match node_hash {
                Some(h) if h == hash => {}
                // No header at the stored tip's height, at or below the node's head: a
                // hole (the node is applying a reorg), not a proof of one. The round stops
                // and says so; the follow loop backs off briefly and re-verifies.
                None if number <= head => out.missing = Some(number),
                _ => match self.handle_reorg(number).await? {
                    Reorg::RolledBack(to) => {
                        tip = Some(to);
                        out.reorgs += 1;
                    }
                    Reorg::Hole(at) => out.missing = Some(at),
                },
            }
        }

        let mut finalized: Option<Option<u64>> = None;
        let mut budget = if out.missing.is_some() {
            0
        } else {
            self.config.max_blocks_per_round
        };
        while budget > 0 {
            budget -= 1;
            let next = match tip {
                Some((n, _)) => n + 1,
                None => self.start_block(head, &scope),
            };
            if next > head {
                break;
            }
            let from_announcement = announced.is_some_and(|h| h.number == next);
            let header = match announced.filter(|_| from_announcement) {
                Some(h) => Some(h),
                None => self.header(next).await?,
            };
            let Some(header) = header else {
                // The node reports a head at or above `next` but has no block there (a
                // hole while it applies a reorg, or the head moved back): the next round
                // re-verifies, after a backoff.
                out.missing = Some(next);
                break;
            };
            if header.number != next {
                return Err(IndexError::Inconsistent {
                    chain: self.chain,
                    number: next,
                    reason: "block number differs from the one requested",
                });
            }
            if let Some((n, hash)) = tip
                && header.parent_hash != hash
            {
                if from_announcement {
                    // A stale announcement (its branch was replaced since) or a reorg
                    // below it: read the block by number, whose parent decides.
                    announced = None;
                    continue;
                }
                match self.handle_reorg(n).await? {
                    Reorg::RolledBack(to) => {
                        tip = Some(to);
                        out.reorgs += 1;
                        continue;
                    }
                    Reorg::Hole(at) => {
                        out.missing = Some(at);
                        break;
                    }
                }
            }
            match self.fetch_logs(&header, &scope).await? {
                Fetch::Orphaned => {
                    // Re-read the block by number (the announced one is gone).
                    announced = None;
                    continue;
                }
                Fetch::Ready(mut logs, discovered) => {
                    for log in &mut logs {
                        log.block_timestamp.get_or_insert(header.timestamp);
                    }
                    if finalized.is_none() {
                        // At most once per round that commits a block, and only every
                        // `finalized_refresh_blocks` of head movement: the node's
                        // finalized block, recorded with the block for readers
                        // (snapshots flag blocks above it). Unknown when the node cannot
                        // say (the recorded height then stays as it was).
                        finalized = Some(if self.finalized_due(head) {
                            self.finalized().await.ok().flatten().map(|h| h.number)
                        } else {
                            None
                        });
                    }
                    if !self
                        .commit_block(
                            &header,
                            &logs,
                            &scope,
                            &discovered,
                            finalized.flatten(),
                            head,
                        )
                        .await?
                    {
                        // The scope changed under us (history discovered a contract, an
                        // operator added one): reload it and fetch this block again.
                        scope = self.load_scope().await?;
                        continue;
                    }
                    for (address, kind) in discovered {
                        scope.insert(address, (kind, next));
                    }
                    out.blocks += 1;
                    out.logs += logs.len() as u64;
                    tip = Some((next, header.hash));
                }
            }
        }
        out.tip = tip.map(|(n, _)| n);
        self.record_head(head, out.tip).await?;
        let label = self.chain.get().to_string();
        metrics::counter!("keel_index_blocks_total", "chain_id" => label.clone())
            .increment(out.blocks);
        metrics::counter!("keel_index_logs_total", "chain_id" => label.clone()).increment(out.logs);
        if let Some(t) = out.tip {
            metrics::gauge!("keel_index_tip_block", "chain_id" => label).set(t as f64);
        }
        Ok(out)
    }

    /// Waits until the node's head is above `tip`, asking only `eth_blockNumber` every
    /// `every` (no database work), for at most `max_wait`. Returns the last head seen.
    ///
    /// A follow loop calls this between [`TipIngest::round`]s once caught up, with
    /// `max_wait` = its poll interval: a new block is then ingested within `every` of
    /// its appearance, while a full round (which also re-verifies the stored tip, so a
    /// same-height reorg is caught) still runs at least once per poll interval.
    ///
    /// # Errors
    /// [`IndexError::Chain`] when the head cannot be read.
    pub async fn wait_for_new_head(
        &self,
        tip: Option<u64>,
        max_wait: std::time::Duration,
        every: std::time::Duration,
    ) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let every = every.max(std::time::Duration::from_millis(1));
        loop {
            let head = self.node.block_number().await?;
            self.observed_head(head);
            self.record_head(head, tip).await?;
            let now = tokio::time::Instant::now();
            if tip.is_none_or(|t| head > t) || now >= deadline {
                return Ok(head);
            }
            tokio::time::sleep_until((now + every).min(deadline)).await;
        }
    }

    /// True when the node's `finalized` block should be read again at `head`
    /// ([`TipConfig::finalized_refresh_blocks`]); records `head` as the read's if so.
    fn finalized_due(&self, head: u64) -> bool {
        let mut at = self
            .finalized_read_at
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let due = at
            .is_none_or(|last| head < last || head - last >= self.config.finalized_refresh_blocks);
        if due {
            *at = Some(head);
        }
        due
    }

    /// Exports the node's head as last seen (`keel_index_chain_head_block`), so the
    /// index lag is `chain_head_block - tip_block` per chain.
    fn observed_head(&self, head: u64) {
        metrics::gauge!("keel_index_chain_head_block", "chain_id" => self.chain.get().to_string())
            .set(head as f64);
    }

    /// Records `head` (with the stored `tip` for the throttle) in `index_chain` for
    /// Platform Status, when (head, tip) changed since the last record or
    /// [`HEAD_RECORD_EVERY`] passed. Fenced by the epoch.
    ///
    /// # Errors
    /// [`IndexError::Fenced`] when another owner took over; [`IndexError::Store`].
    async fn record_head(&self, head: u64, tip: Option<u64>) -> Result<()> {
        let now = std::time::Instant::now();
        let due = match *self.recorded.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((h, t, at)) => {
                h != head || t != tip || now.duration_since(at) >= HEAD_RECORD_EVERY
            }
            None => true,
        };
        if !due {
            return Ok(());
        }
        if !chain_row::chain_observe_head(&self.db, chain_i64(self.chain), self.epoch, to_i64(head))
            .await?
        {
            return Err(IndexError::Fenced {
                chain: self.chain,
                epoch: self.epoch,
            });
        }
        *self.recorded.lock().unwrap_or_else(|e| e.into_inner()) = Some((head, tip, now));
        Ok(())
    }

    async fn load_scope(&self) -> Result<HashMap<Address, (ScopeKind, u64)>> {
        Ok(live_scope(&self.db, self.chain)
            .await?
            .into_iter()
            .map(|e| (e.address, (e.kind, e.from_block)))
            .collect())
    }

    fn start_block(&self, head: u64, scope: &HashMap<Address, (ScopeKind, u64)>) -> u64 {
        self.config
            .start_block
            .or_else(|| scope.values().map(|(_, from)| *from).min())
            .unwrap_or(head)
    }

    /// Checks (without a lock) that this owner still holds the chain and that it is not
    /// degraded, and returns the stored checkpoint `(tip_number, tip_hash)`.
    async fn fence_and_checkpoint(&self) -> Result<Option<(u64, B256)>> {
        let row = chain_row::chain_fence_checkpoint(&self.db, chain_i64(self.chain)).await?;
        self.judge_fence(row.as_ref().map(|r| chain_row::ChainFenceRow {
            owner_epoch: r.owner_epoch,
            degraded: r.degraded,
        }))?;
        let Some(row) = row else { return Ok(None) };
        Ok(match (row.tip_number, row.tip_hash) {
            (Some(n), Some(h)) if h.len() == 32 => {
                Some((u64::try_from(n).unwrap_or(0), B256::from_slice(&h)))
            }
            _ => None,
        })
    }

    /// The header of block `number`; `None` when the node has no such block.
    async fn header(&self, number: u64) -> Result<Option<BlockHeader>> {
        Ok(self.node.header(BlockNumberOrTag::Number(number)).await?)
    }

    /// True when `hash` is still the canonical block at `number`.
    async fn is_canonical(&self, number: u64, hash: B256) -> Result<bool> {
        Ok(self.header(number).await?.map(|h| h.hash) == Some(hash))
    }

    /// Logs of the scoped contracts in `header`'s block, fetched by block hash and
    /// checked to belong to it; contracts announced in the block (new tokens, feeds)
    /// are fetched too.
    async fn fetch_logs(
        &self,
        header: &BlockHeader,
        scope: &HashMap<Address, (ScopeKind, u64)>,
    ) -> Result<Fetch> {
        let number = header.number;
        let mut known: HashMap<Address, ScopeKind> = scope
            .iter()
            .filter(|(_, (_, from))| *from <= number)
            .map(|(a, (k, _))| (*a, *k))
            .collect();
        let mut pending: Vec<Address> = known.keys().copied().collect();
        let mut logs: Vec<Log> = Vec::new();
        let mut discovered = Vec::new();
        while !pending.is_empty() {
            pending.sort();
            let fetched: Vec<Log> = match self.node.logs_by_block_hash(&pending, header.hash).await
            {
                Ok(l) => l,
                Err(e @ ChainError::Node { .. }) => {
                    // A node error for a block hash that is no longer canonical is a
                    // reorg signal, not something to retry forever.
                    if self.is_canonical(number, header.hash).await? {
                        return Err(e.into());
                    }
                    return Ok(Fetch::Orphaned);
                }
                Err(e) => return Err(e.into()),
            };
            for log in &fetched {
                let ours = log.block_hash == Some(header.hash)
                    && log.block_number == Some(number)
                    && !log.removed
                    && log.log_index.is_some()
                    && log.transaction_hash.is_some();
                if !ours {
                    if self.is_canonical(number, header.hash).await? {
                        return Err(IndexError::Inconsistent {
                            chain: self.chain,
                            number,
                            reason: "a log returned for the block hash belongs elsewhere",
                        });
                    }
                    return Ok(Fetch::Orphaned);
                }
            }
            pending.clear();
            for log in &fetched {
                if let Some(kind) = known.get(&log.inner.address)
                    && let Some((address, kind)) = decode(*kind, log).and_then(|p| p.discovers())
                    && !known.contains_key(&address)
                {
                    known.insert(address, kind);
                    discovered.push((address, kind));
                    pending.push(address);
                }
            }
            logs.extend(fetched);
        }
        logs.sort_by_key(|l| l.log_index);
        logs.dedup_by_key(|l| l.log_index);
        Ok(Fetch::Ready(logs, discovered))
    }

    /// Locks the chain row and checks the epoch (inside the caller's transaction), and
    /// that the chain is not marked degraded ([`IndexError::Degraded`]).
    async fn check_epoch(&self, conn: &mut PgConnection) -> Result<()> {
        let row = chain_row::chain_lock_fence(&mut *conn, chain_i64(self.chain)).await?;
        self.judge_fence(row)
    }

    /// [`IndexError::Degraded`] or [`IndexError::Fenced`] (counted and logged) for a
    /// chain row read with another epoch or marked degraded; `None` is fenced too.
    fn judge_fence(&self, row: Option<chain_row::ChainFenceRow>) -> Result<()> {
        let epoch = row.map(|r| r.owner_epoch);
        if row.is_some_and(|r| r.degraded) && epoch == Some(self.epoch) {
            return Err(IndexError::Degraded { chain: self.chain });
        }
        if epoch != Some(self.epoch) {
            metrics::counter!("keel_index_fenced_total", "chain_id" => self.chain.get().to_string())
                .increment(1);
            tracing::warn!(target: "keel::index::tip", chain = %self.chain, epoch = self.epoch, current = ?epoch, "fenced: another owner took over");
            return Err(IndexError::Fenced {
                chain: self.chain,
                epoch: self.epoch,
            });
        }
        Ok(())
    }

    /// Writes one block, its logs, projections, discovered scope, the checkpoint and the
    /// head observation (`head`) in one fenced transaction. Returns false (nothing
    /// committed) when the live scope in the database no longer matches `scope`: history
    /// and `add_scope` writers change the scope, and the chain-row lock taken here orders
    /// them against this commit.
    async fn commit_block(
        &self,
        header: &BlockHeader,
        logs: &[Log],
        scope: &HashMap<Address, (ScopeKind, u64)>,
        discovered: &[(Address, ScopeKind)],
        finalized: Option<u64>,
        head: u64,
    ) -> Result<bool> {
        let chain = chain_i64(self.chain);
        let number = to_i64(header.number);
        let hash = header.hash.as_slice();
        let mut tx = self.db.begin().await?;
        self.check_epoch(&mut tx).await?;
        let live = scope_rows::scope_live_count(&mut *tx, chain).await?;
        if usize::try_from(live).ok() != Some(scope.len()) {
            return Ok(false);
        }

        block::block_upsert_and_prune(
            &mut *tx,
            chain,
            number,
            hash,
            header.parent_hash.as_slice(),
            number.saturating_sub(to_i64(self.config.hash_window)),
            finalized.map(to_i64),
        )
        .await?;

        if !logs.is_empty() {
            let mut kinds: HashMap<Address, ScopeKind> =
                scope.iter().map(|(a, (k, _))| (*a, *k)).collect();
            kinds.extend(discovered.iter().copied());
            logs::logs_insert(&mut tx, chain, logs, &kinds).await?;
        }

        for (address, kind) in discovered {
            scope_rows::scope_insert_discovered(
                &mut *tx,
                chain,
                address.as_slice(),
                kind.as_str(),
                number,
            )
            .await?;
        }

        chain_row::chain_advance_tip(
            &mut *tx,
            chain,
            number,
            hash,
            finalized.map(to_i64),
            to_i64(head),
            TIP_CHANNEL,
        )
        .await?;
        tx.commit().await?;
        // The head observation rode along: the round's closing record_head need not
        // write it again.
        *self.recorded.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((head, Some(header.number), std::time::Instant::now()));
        Ok(true)
    }

    /// Finds the common ancestor below the stored block `from` and rolls back to it.
    /// Returns the new checkpoint.
    ///
    /// `index_block` holds every block from the tip down to the lower of the hash
    /// window's end and the block Keel recorded as finalized (`finalized_number`), so
    /// the stored hashes are compared with the node's (a bisection: a block is canonical
    /// exactly when every stored block below it is, the hashes being chained) to find the
    /// highest stored block still canonical, the true common ancestor. When it is at or
    /// above the recorded finalized block, everything above it is rolled back and
    /// re-ingested, however deep that is. When no stored block is canonical, or a block
    /// at or below the recorded finalized block was replaced, finality as Keel recorded
    /// it was broken: the chain is marked degraded and [`IndexError::ReorgTooDeep`]
    /// returned. The node's *current* `finalized` block is not trusted for this: after
    /// a deep reorg it is already on the new branch.
    async fn handle_reorg(&self, from: u64) -> Result<Reorg> {
        let label = self.chain.get().to_string();
        let chain = chain_i64(self.chain);
        let stored = block::blocks_at_or_below(&self.db, chain, to_i64(from)).await?;
        // The contiguous run of stored blocks from `from` down (highest first): a hole
        // cannot be proven continuous, so the search stops above it.
        let mut run: Vec<(u64, B256)> = Vec::with_capacity(stored.len());
        let mut expected = Some(from);
        for block::BlockRow { number, hash } in stored {
            let number = u64::try_from(number).unwrap_or(0);
            if Some(number) != expected {
                break;
            }
            let hash = B256::try_from(&hash[..]).map_err(|_| IndexError::Inconsistent {
                chain: self.chain,
                number,
                reason: "stored block hash is not 32 bytes",
            })?;
            run.push((number, hash));
            expected = number.checked_sub(1);
        }
        let recorded_final = chain_row::chain_finalized(&self.db, chain)
            .await?
            .and_then(|f| u64::try_from(f).ok());
        let ancestor = match self.highest_canonical(&run).await? {
            Ok(a) => a,
            Err(hole) => {
                tracing::debug!(target: "keel::index::tip", chain = %self.chain, tip = from, hole, "the node has no header at a height below its head while a reorg is searched; retrying after a backoff");
                return Ok(Reorg::Hole(hole));
            }
        };
        let lowest_stored = run.last().map_or(from, |(n, _)| *n);
        if let Some((number, hash)) = ancestor
            && recorded_final.is_none_or(|f| number >= f)
        {
            let depth = from - number;
            self.rollback_to(number, hash).await?;
            metrics::counter!("keel_index_reorgs_total", "chain_id" => label.clone()).increment(1);
            if depth > self.config.hash_window {
                metrics::counter!("keel_index_reorg_beyond_window_total", "chain_id" => label.clone())
                    .increment(1);
            }
            metrics::histogram!("keel_index_reorg_depth_blocks", "chain_id" => label)
                .record(depth as f64);
            tracing::warn!(target: "keel::index::tip", chain = %self.chain, ancestor = number, depth, window = self.config.hash_window, ?recorded_final, "reorg rolled back to the common ancestor (its stored hash is canonical; no block Keel recorded as finalized was replaced)");
            return Ok(Reorg::RolledBack((number, hash)));
        }
        // The lowest block known replaced: the ancestor's child, else (no stored block is
        // canonical) the lowest stored one, and the fork is somewhere below it.
        let replaced = ancestor.map_or(lowest_stored, |(n, _)| n + 1);
        metrics::counter!("keel_index_reorg_too_deep_total", "chain_id" => label).increment(1);
        self.mark_degraded(from, "reorg replaced a block Keel recorded as finalized")
            .await?;
        tracing::error!(target: "keel::index::tip", chain = %self.chain, tip = from, replaced, ancestor = ?ancestor.map(|a| a.0), lowest_stored, ?recorded_final, "a reorg replaced a block at or below the block Keel recorded as finalized (or below every stored block hash); the chain is marked degraded and its ingest stops until it is re-indexed (`keel index reindex`)");
        Err(IndexError::ReorgTooDeep {
            chain: self.chain,
            tip: from,
            oldest: replaced,
        })
    }

    /// The highest block of `run` (stored blocks, contiguous, highest first) whose
    /// stored hash is the node's canonical one; `None` when even the lowest is not.
    /// Bisects: a stored block is canonical exactly when every stored block below it is
    /// (each is the parent of the next), so about log2(len) + 1 headers are read.
    /// `Err(number)` (inner) when the node has no header at a height at or below its
    /// head (a hole while it applies a reorg): the search is not trusted with it.
    async fn highest_canonical(
        &self,
        run: &[(u64, B256)],
    ) -> Result<std::result::Result<Option<(u64, B256)>, u64>> {
        let Some(&lowest) = run.last() else {
            return Ok(Ok(None));
        };
        let head = self.node.block_number().await?;
        match self.canonical_at(lowest, head).await? {
            Some(true) => {}
            Some(false) => return Ok(Ok(None)),
            None => return Ok(Err(lowest.0)),
        }
        // Invariant: run[hi] is canonical; every index below lo is not.
        let (mut lo, mut hi) = (0usize, run.len() - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.canonical_at(run[mid], head).await? {
                Some(true) => hi = mid,
                Some(false) => lo = mid + 1,
                None => return Ok(Err(run[mid].0)),
            }
        }
        Ok(Ok(Some(run[hi])))
    }

    /// Whether the stored `(number, hash)` is the node's canonical block: a block above
    /// the node's `head` is not (the chain got shorter); `None` when the node has no
    /// header at a height at or below its head (a hole).
    async fn canonical_at(&self, (number, hash): (u64, B256), head: u64) -> Result<Option<bool>> {
        if number > head {
            return Ok(Some(false));
        }
        Ok(self.header(number).await?.map(|h| h.hash == hash))
    }

    /// The chain's finalized block: the node's `finalized` tag, else (a node without
    /// the tag, or [`TipConfig::finalized_tag`] off) the block `finality_depth` below
    /// the head. `None` when the node has no such block.
    async fn finalized(&self) -> Result<Option<BlockHeader>> {
        if self.config.finalized_tag
            && let Ok(Some(h)) = self.node.finalized().await
        {
            return Ok(Some(h));
        }
        let head = self.node.block_number().await?;
        self.header(head.saturating_sub(self.config.finality_depth))
            .await
    }

    /// Marks the chain degraded (fenced: only this owner, and only once) and sets the
    /// gauge `keel_index_chain_degraded`.
    async fn mark_degraded(&self, tip: u64, reason: &'static str) -> Result<()> {
        let mut tx = self.db.begin().await?;
        self.check_epoch(&mut tx).await?;
        chain_row::chain_mark_degraded(&mut *tx, chain_i64(self.chain), reason, to_i64(tip))
            .await?;
        tx.commit().await?;
        metrics::gauge!("keel_index_chain_degraded", "chain_id" => self.chain.get().to_string())
            .set(1.0);
        Ok(())
    }

    /// Deletes every derived row above `ancestor` and moves the checkpoint to it, in
    /// one fenced transaction.
    async fn rollback_to(&self, ancestor: u64, hash: B256) -> Result<()> {
        let chain = chain_i64(self.chain);
        let above = to_i64(ancestor);
        let mut tx = self.db.begin().await?;
        self.check_epoch(&mut tx).await?;
        logs::projections_delete_above(&mut tx, chain, above).await?;
        scope_rows::scopes_delete_discovered_above(&mut *tx, chain, above).await?;
        block::blocks_delete_above(&mut *tx, chain, above).await?;
        chain_row::chain_set_checkpoint(&mut *tx, chain, above, hash.as_slice()).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// What a tip follow loop does after one [`TipIngest::round`] (see [`FollowBackoff`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRound {
    /// Run another round at once: blocks are waiting below the head.
    Now,
    /// Wait this long before the next round (the poll interval when caught up, a
    /// backoff after a node hole or an error).
    Wait(std::time::Duration),
    /// Fenced: a newer owner took the chain over. Stop this owner's loop.
    GiveUp,
    /// Fatal for the chain ([`IndexError::ReorgTooDeep`], [`IndexError::Degraded`]: it
    /// is marked degraded). The caller must not take ownership again in a loop; it
    /// holds the chain idle until it is stopped.
    Halt,
}

/// Default first backoff of [`FollowBackoff`].
pub const DEFAULT_BACKOFF_BASE: std::time::Duration = std::time::Duration::from_millis(100);
/// Default longest backoff of [`FollowBackoff`].
pub const DEFAULT_BACKOFF_CAP: std::time::Duration = std::time::Duration::from_secs(30);
/// Default longest backoff after a node hole ([`RoundOutcome::missing`]): a hole closes
/// by itself (the node finishes applying a reorg), and catch-up must start within this
/// of it closing, however long it lasted.
pub const DEFAULT_HOLE_BACKOFF_CAP: std::time::Duration = std::time::Duration::from_secs(1);
/// At most one warning per this interval per chain for repeated node holes or errors.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The pacing of a tip follow loop: after each [`TipIngest::round`],
/// [`FollowBackoff::after`] says whether to run another round now, wait, or stop.
///
/// A round that stopped at a block the node answered `null` for while reporting a head
/// above it ([`RoundOutcome::missing`]), and a failed round, wait an exponential
/// backoff (`base`, doubling, at most `cap`; a node hole at most `hole_cap`, default
/// [`DEFAULT_HOLE_BACKOFF_CAP`], so catch-up starts within a second of the hole
/// closing however long it lasted: each retry costs one `eth_blockNumber` and one
/// header read), are counted
/// (`keel_index_tip_missing_block_total`, `keel_index_tip_round_errors_total`, label
/// `chain_id`) and logged at WARN at most once per 30 s (with the number of
/// occurrences since the last warning). A round that made progress resets the backoff.
#[derive(Debug, Clone)]
pub struct FollowBackoff {
    chain: ChainId,
    poll: std::time::Duration,
    base: std::time::Duration,
    cap: std::time::Duration,
    hole_cap: std::time::Duration,
    failures: u32,
    last_warn: Option<std::time::Instant>,
    unwarned: u64,
}

impl FollowBackoff {
    /// Pacing for `chain` with poll interval `poll` (the wait once caught up) and the
    /// default backoff ([`DEFAULT_BACKOFF_BASE`] doubling up to [`DEFAULT_BACKOFF_CAP`]).
    pub fn new(chain: ChainId, poll: std::time::Duration) -> Self {
        Self {
            chain,
            poll,
            base: DEFAULT_BACKOFF_BASE,
            cap: DEFAULT_BACKOFF_CAP,
            hole_cap: DEFAULT_HOLE_BACKOFF_CAP,
            failures: 0,
            last_warn: None,
            unwarned: 0,
        }
    }

    /// Backoff from `base` (at least 1 ms), doubling up to `cap` (at least `base`).
    #[must_use]
    pub fn with_backoff(mut self, base: std::time::Duration, cap: std::time::Duration) -> Self {
        self.base = base.max(std::time::Duration::from_millis(1));
        self.cap = cap.max(self.base);
        self
    }

    /// The longest backoff after a node hole (at least `base`).
    #[must_use]
    pub fn with_hole_backoff_cap(mut self, cap: std::time::Duration) -> Self {
        self.hole_cap = cap.max(self.base);
        self
    }

    /// Consecutive rounds that hit a node hole or failed.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// What to do after a round that returned `result`.
    pub fn after(&mut self, result: &Result<RoundOutcome>) -> NextRound {
        let label = || self.chain.get().to_string();
        match result {
            Ok(out) if out.missing.is_some() => {
                metrics::counter!("keel_index_tip_missing_block_total", "chain_id" => label())
                    .increment(1);
                let wait = self.fail().min(self.hole_cap.max(self.base));
                if self.should_warn() {
                    tracing::warn!(target: "keel::index::tip", chain = %self.chain, head = out.head, missing = ?out.missing, occurrences = self.unwarned, backoff_ms = wait.as_millis() as u64, "the node reports a head above a block it has no header for; backing off");
                    self.unwarned = 0;
                }
                NextRound::Wait(wait)
            }
            Ok(out) => {
                self.failures = 0;
                if out.tip.is_some_and(|t| t < out.head) {
                    NextRound::Now
                } else {
                    NextRound::Wait(self.poll)
                }
            }
            Err(IndexError::Fenced { .. }) => {
                tracing::warn!(target: "keel::index::tip", chain = %self.chain, "fenced by a newer owner; giving the chain up");
                NextRound::GiveUp
            }
            Err(e) if e.is_fatal() => {
                tracing::error!(target: "keel::index::tip", chain = %self.chain, error = %e, "tip ingest stopped for this chain");
                NextRound::Halt
            }
            Err(e) => {
                metrics::counter!("keel_index_tip_round_errors_total", "chain_id" => label())
                    .increment(1);
                let wait = self.fail();
                if self.should_warn() {
                    tracing::warn!(target: "keel::index::tip", chain = %self.chain, error = %e, occurrences = self.unwarned, backoff_ms = wait.as_millis() as u64, "tip round failed; retrying after a backoff");
                    self.unwarned = 0;
                }
                NextRound::Wait(wait)
            }
        }
    }

    /// Counts a failure and returns its backoff.
    fn fail(&mut self) -> std::time::Duration {
        self.failures = self.failures.saturating_add(1);
        self.unwarned = self.unwarned.saturating_add(1);
        let shift = (self.failures - 1).min(20);
        self.base.saturating_mul(1 << shift).min(self.cap)
    }

    fn should_warn(&mut self) -> bool {
        let now = std::time::Instant::now();
        if self
            .last_warn
            .is_some_and(|t| now.duration_since(t) < WARN_EVERY)
        {
            return false;
        }
        self.last_warn = Some(now);
        true
    }
}

/// Reads `chain`'s health ([`crate::read::chain_health`]) and publishes it as the gauge
/// `keel_index_chain_degraded{chain_id}` (1 degraded, 0 healthy). A tip-ingest owner
/// calls this before taking ownership: a degraded chain must not be ingested (nor its
/// ownership retaken in a loop) until an operator re-indexes it.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn publish_health(db: &PgPool, chain: ChainId) -> Result<crate::read::ChainHealth> {
    let health = crate::read::chain_health(db, chain).await?;
    metrics::gauge!("keel_index_chain_degraded", "chain_id" => chain.get().to_string())
        .set(if health.is_degraded() { 1.0 } else { 0.0 });
    Ok(health)
}
