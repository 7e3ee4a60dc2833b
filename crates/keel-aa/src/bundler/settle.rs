//! The settle pass: each bundle's verdict (and then its watch until its block is final)
//! turned into every operation's outcome, reported to its workflow once (see the
//! module docs of [`crate::bundler`]).

use super::*;

/// Watched bundles (and operations found elsewhere) looked at per pass, oldest first.
const WATCH_BATCH: i64 = 500;

/// Receipts asked for in one JSON-RPC batch.
const RECEIPT_BATCH: usize = 100;

/// How far below the head a released operation's `UserOperationEvent` is looked for
/// (blocks): an operation is accepted shortly before it is bundled, so an inclusion of
/// it is recent; nodes commonly refuse `eth_getLogs` spans beyond a few thousand blocks.
const EVENT_LOOKBACK_BLOCKS: u64 = 1_024;

/// An operation's inclusion as the chain shows it now.
#[derive(Debug, Clone)]
struct Found {
    success: bool,
    /// Wei, decimal.
    cost: String,
    /// Gas units, decimal.
    used: String,
    revert: Option<Bytes>,
    tx_hash: B256,
    block_number: u64,
    block_hash: Option<B256>,
}

impl Found {
    fn of(r: &crate::UserOperationReceipt) -> Self {
        Self {
            success: r.success,
            cost: r.actual_gas_cost.get().to_string(),
            used: r.actual_gas_used.to_string(),
            revert: r.revert_reason.clone(),
            tx_hash: r.transaction_hash,
            block_number: r.block_number.unwrap_or(0),
            block_hash: r.block_hash,
        }
    }

    /// True when `row` does not show this inclusion yet.
    fn changes(&self, row: &UserOperationRow) -> bool {
        row.state != store::state::INCLUDED
            || row.tx_hash.map(B256::from) != Some(self.tx_hash)
            || row.block_number != i64::try_from(self.block_number).ok()
            || row.block_hash.map(B256::from) != self.block_hash
            || row.success != Some(self.success)
            || row.actual_gas_cost.as_deref() != Some(self.cost.as_str())
    }
}

/// What the bundler does with one operation of a bundle whose verdict (or watch) it
/// handles.
#[derive(Debug, Clone)]
enum Fate {
    /// In the chain at this inclusion; `true`: its block is final (report it).
    In(Found, bool),
    /// Its bundle is out of the chain for now and may be re-included: `bundled`.
    Out,
    /// Back to `ready`, re-validated by the next bundle's simulation.
    Ready,
    /// Its nonce was used and the chain has no `UserOperationEvent` of it.
    Elsewhere,
    /// The chain is in between (a log without its receipt): look again next pass.
    Wait,
    /// Alone in a bundle the queue refused for the block gas limit: ends `failed`
    /// `GAS_LIMIT_EXCEEDS_BUNDLE_MAX` (issue 33 §1).
    TooLarge,
}

impl Fate {
    /// True when applying it would change `row`.
    fn changes(&self, row: &UserOperationRow) -> bool {
        match self {
            Fate::In(f, fin) => f.changes(row) || (*fin && row.finalized_at.is_none()),
            Fate::Out => row.state == store::state::INCLUDED,
            Fate::Ready | Fate::Elsewhere | Fate::TooLarge => true,
            Fate::Wait => false,
        }
    }
}

/// Operations moved by one bundle's transaction, for the metrics.
#[derive(Debug, Default)]
struct Counts {
    included: u64,
    moved: u64,
    finalized: u64,
    reorged: u64,
    rebundled: u64,
    elsewhere: u64,
}

impl Counts {
    fn record(&self, chain_id: u64) {
        count_ops(chain_id, "included", self.included);
        count_ops(chain_id, "moved", self.moved);
        count_ops(chain_id, "final", self.finalized);
        count_ops(chain_id, "reorged", self.reorged);
        count_ops(chain_id, "rebundled", self.rebundled);
        count_ops(chain_id, "nonce_used_elsewhere", self.elsewhere);
    }
}

impl Bundler {
    /// Handles this chain's bundles (see the module docs): the verdicts of `submitted`
    /// bundles, then the watch of `included` bundles and of operations found in another
    /// transaction. The number of bundles and operations whose state changed.
    ///
    /// # Errors
    /// [`BundlerError`]; nothing of the failed bundle is written (the next pass retries).
    pub async fn settle_pass(&self) -> Result<u64, BundlerError> {
        let mut final_block = None;
        let mut n = self.settle_submitted(&mut final_block).await?;
        n += self.watch_included(&mut final_block).await?;
        n += self.watch_found_elsewhere(&mut final_block).await?;
        Ok(n)
    }

    /// The chain's final block now (read once per pass).
    async fn final_block(&self, cached: &mut Option<u64>) -> Result<u64, BundlerError> {
        if let Some(b) = *cached {
            return Ok(b);
        }
        let b = self.chain()?.queue.final_block_number().await?;
        *cached = Some(b);
        Ok(b)
    }

    /// The verdicts of `submitted` bundles: confirmed → its operations `included`
    /// (watched, not reported yet) and the bundle `included`; reverted or failed → each
    /// operation released ([`Bundler::release`]) and the bundle `failed`.
    async fn settle_submitted(&self, final_block: &mut Option<u64>) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let bundles = store::bundles_submitted(db, chain_id_i64(self.chain_id)).await?;
        if bundles.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = bundles.iter().map(|b| b.txq_request_id).collect();
        let views: HashMap<Uuid, RequestView> = keel_txq::requests(db, &ids)
            .await?
            .into_iter()
            .map(|v| (v.id, v))
            .collect();
        let mut settled = 0;
        for bundle in bundles {
            let Some(view) = views.get(&bundle.txq_request_id) else {
                continue;
            };
            let Some(verdict) = &view.verdict else {
                continue;
            };
            let ops = store::user_operations_in_bundle(db, bundle.id)
                .await?
                .into_iter()
                .map(load)
                .collect::<Result<Vec<_>, _>>()?;
            let mut fates = Vec::with_capacity(ops.len());
            let end_state;
            let mut settled_tx: Option<(B256, u64, Option<B256>)> = None;
            match verdict {
                SettlementVerdict::Confirmed { hash, block, .. } => {
                    let receipts = chain.pool.receipts(&[*hash]).await?;
                    let Some(Some(receipt)) = receipts.into_iter().next() else {
                        // Settled at depth but the node lost it for now: next pass.
                        continue;
                    };
                    let final_now = view.final_at.is_some() && receipt.block_number == Some(*block);
                    for l in &ops {
                        let fate = match user_operation_receipt(
                            &receipt,
                            &l.resolution.resolved,
                            l.hash,
                        ) {
                            Some(r) => Fate::In(Found::of(&r), final_now),
                            None => self.release(chain, l, final_block).await?,
                        };
                        fates.push(fate);
                    }
                    end_state = store::bundle_state::INCLUDED;
                    settled_tx = Some((*hash, *block, receipt.block_hash));
                }
                _ => {
                    // Refused for exceeding the block gas limit (before a nonce, issue 33
                    // §1): the next bundles stay below this one's gas (the set is split),
                    // and an operation alone in it ends with a typed reason. Otherwise
                    // (reverted or never took effect): released one by one.
                    let gas_refused = self.note_gas_refusal(verdict, &ops);
                    for l in &ops {
                        fates.push(self.release(chain, l, final_block).await?);
                    }
                    if gas_refused && ops.len() == 1 {
                        for f in fates.iter_mut() {
                            if matches!(f, Fate::Ready) {
                                *f = Fate::TooLarge;
                            }
                        }
                    }
                    end_state = store::bundle_state::FAILED;
                }
            }
            if fates.iter().any(|f| matches!(f, Fate::Wait)) {
                continue;
            }
            let mut tx = db.begin().await?;
            let mut counts = Counts::default();
            for (l, fate) in ops.iter().zip(&fates) {
                self.apply(&mut tx, l, bundle.id, fate, &mut counts).await?;
            }
            let (h, b, bh) = match &settled_tx {
                Some((h, b, bh)) => (
                    Some(h.as_slice()),
                    i64::try_from(*b).ok(),
                    bh.as_ref().map(|x| x.as_slice()),
                ),
                None => (None, None, None),
            };
            store::bundle_settle(&mut *tx, bundle.id, end_state, h, b, bh).await?;
            tx.commit().await?;
            self.wake_successors(ops.iter().map(|l| l.op.sender).collect())
                .await;
            count_bundle(
                self.chain_id,
                if end_state == store::bundle_state::INCLUDED {
                    "included"
                } else {
                    "failed"
                },
            );
            counts.record(self.chain_id);
            settled += 1;
        }
        Ok(settled)
    }

    /// The watch of `included` bundles while their queue request is watched (see the
    /// module docs): operations follow the bundle's transaction as the chain shows it;
    /// once the queue found its block final they are reported and the bundle is
    /// `final`; a bundle out for good (`REORGED_OUT`, or re-mined reverted or without
    /// an operation's event) releases its operations and is `reorged`.
    async fn watch_included(&self, final_block: &mut Option<u64>) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let bundles = store::bundles_watched(db, chain_id_i64(self.chain_id), WATCH_BATCH).await?;
        if bundles.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = bundles.iter().map(|b| b.txq_request_id).collect();
        let views: HashMap<Uuid, RequestView> = keel_txq::requests(db, &ids)
            .await?
            .into_iter()
            .map(|v| (v.id, v))
            .collect();
        // Looked at only when the head or a watched request changed since the last
        // complete look (a reorg changes the head's hash; a re-inclusion mines a block).
        let head = chain
            .pool
            .header(BlockNumberOrTag::Latest)
            .await?
            .map(|h| h.hash);
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            head.hash(&mut h);
            for b in &bundles {
                b.id.hash(&mut h);
                if let Some(v) = views.get(&b.txq_request_id) {
                    serde_json::to_string(&v.verdict)
                        .unwrap_or_default()
                        .hash(&mut h);
                    v.final_at.hash(&mut h);
                }
            }
            h.finish()
        };
        {
            let last = self
                .watched_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *last == Some(fingerprint) {
                return Ok(0);
            }
        }
        // The receipts of every watched bundle's verdict transaction, in batches.
        let hashes: Vec<B256> = bundles
            .iter()
            .filter_map(|b| match views.get(&b.txq_request_id)?.verdict.as_ref()? {
                SettlementVerdict::Confirmed { hash, .. }
                | SettlementVerdict::Reverted { hash, .. } => Some(*hash),
                _ => None,
            })
            .collect();
        let mut receipts: HashMap<B256, alloy::rpc::types::TransactionReceipt> = HashMap::new();
        for chunk in hashes.chunks(RECEIPT_BATCH) {
            for (h, r) in chunk.iter().zip(chain.pool.receipts(chunk).await?) {
                if let Some(r) = r {
                    receipts.insert(*h, r);
                }
            }
        }
        let mut complete = true;
        let mut changed = 0;
        for bundle in bundles {
            let Some(view) = views.get(&bundle.txq_request_id) else {
                continue;
            };
            let ops = store::user_operations_watched_in_bundle(db, bundle.id)
                .await?
                .into_iter()
                .map(load)
                .collect::<Result<Vec<_>, _>>()?;
            let mut fates = Vec::with_capacity(ops.len());
            // The bundle's next state and transaction as the chain shows it.
            let mut next = store::bundle_state::INCLUDED;
            let mut finalized = false;
            let mut seen: Option<(B256, u64, Option<B256>)> = None;
            match &view.verdict {
                Some(
                    SettlementVerdict::Confirmed { hash, block, .. }
                    | SettlementVerdict::Reverted { hash, block, .. },
                ) => {
                    match receipts.get(hash).cloned() {
                        None => {
                            // Out of the chain now; the queue re-broadcasts the same bytes
                            // while the nonce is free (or ends it REORGED_OUT).
                            for _ in &ops {
                                fates.push(Fate::Out);
                            }
                        }
                        Some(receipt) if !receipt.status() => {
                            // Re-mined, reverted: its operations did not take effect here.
                            for l in &ops {
                                fates.push(self.release(chain, l, final_block).await?);
                            }
                            next = store::bundle_state::REORGED;
                        }
                        Some(receipt) => {
                            let final_now =
                                view.final_at.is_some() && receipt.block_number == Some(*block);
                            for l in &ops {
                                let fate = match user_operation_receipt(
                                    &receipt,
                                    &l.resolution.resolved,
                                    l.hash,
                                ) {
                                    Some(r) => Fate::In(Found::of(&r), final_now),
                                    None => self.release(chain, l, final_block).await?,
                                };
                                fates.push(fate);
                            }
                            if let Some(b) = receipt.block_number {
                                seen = Some((receipt.transaction_hash, b, receipt.block_hash));
                            }
                            finalized = final_now;
                        }
                    }
                }
                Some(SettlementVerdict::Failed { .. }) => {
                    // Taken out for good (REORGED_OUT): another transaction has the
                    // bundler's nonce on the final chain.
                    for l in &ops {
                        fates.push(self.release(chain, l, final_block).await?);
                    }
                    next = store::bundle_state::REORGED;
                }
                _ => continue,
            }
            if fates.iter().any(|f| matches!(f, Fate::Wait)) {
                complete = false;
                continue;
            }
            let moved = seen.as_ref().is_some_and(|(h, b, bh)| {
                bundle.tx_hash.map(B256::from) != Some(*h)
                    || bundle.block_number != i64::try_from(*b).ok()
                    || bundle.block_hash.map(B256::from) != *bh
            });
            let ops_change = ops.iter().zip(&fates).any(|(l, f)| f.changes(&l.row));
            if !ops_change && !moved && !finalized && next == store::bundle_state::INCLUDED {
                continue;
            }
            let mut tx = db.begin().await?;
            let mut counts = Counts::default();
            for (l, fate) in ops.iter().zip(&fates) {
                self.apply(&mut tx, l, bundle.id, fate, &mut counts).await?;
            }
            let (h, b, bh) = match &seen {
                Some((h, b, bh)) => (
                    Some(h.as_slice()),
                    i64::try_from(*b).ok(),
                    bh.as_ref().map(|x| x.as_slice()),
                ),
                None => (None, None, None),
            };
            store::bundle_watch_update(&mut *tx, bundle.id, next, finalized, h, b, bh).await?;
            tx.commit().await?;
            if moved {
                tracing::warn!(target: "keel::aa::bundler", chain_id = self.chain_id, bundle = %bundle.id,
                    "a reorg moved an included bundle; its operations follow the chain");
            }
            if next == store::bundle_state::REORGED {
                count_bundle(self.chain_id, "reorged");
                tracing::warn!(target: "keel::aa::bundler", chain_id = self.chain_id, bundle = %bundle.id,
                    "a reorg took an included bundle out for good; its operations were released");
            } else if finalized {
                count_bundle(self.chain_id, "final");
            }
            counts.record(self.chain_id);
            changed += 1;
        }
        if complete {
            *self
                .watched_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fingerprint);
        }
        Ok(changed)
    }

    /// Operations found `included` in a transaction other than their bundle's (see
    /// [`Bundler::release`]): each followed by its own transaction until that block is
    /// final for the chain, then reported.
    async fn watch_found_elsewhere(
        &self,
        final_block: &mut Option<u64>,
    ) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let rows =
            store::user_operations_found_elsewhere(db, chain_id_i64(self.chain_id), WATCH_BATCH)
                .await?;
        let mut changed = 0;
        for row in rows {
            let Some(bundle_id) = row.bundle_id else {
                continue;
            };
            let l = load(row)?;
            let Some(tx_hash) = l.row.tx_hash.map(B256::from) else {
                continue;
            };
            let receipt = chain
                .pool
                .receipts(&[tx_hash])
                .await?
                .into_iter()
                .next()
                .flatten();
            let fate = match receipt
                .as_ref()
                .and_then(|r| user_operation_receipt(r, &l.resolution.resolved, l.hash))
            {
                Some(r) => {
                    let found = Found::of(&r);
                    let fin = found.block_number <= self.final_block(final_block).await?;
                    Fate::In(found, fin)
                }
                None => self.release(chain, &l, final_block).await?,
            };
            if matches!(fate, Fate::Wait) || !fate.changes(&l.row) {
                continue;
            }
            let mut tx = db.begin().await?;
            let mut counts = Counts::default();
            self.apply(&mut tx, &l, bundle_id, &fate, &mut counts)
                .await?;
            tx.commit().await?;
            counts.record(self.chain_id);
            changed += 1;
        }
        Ok(changed)
    }

    /// Where an operation goes when its bundle did not include it (reverted, never took
    /// effect, or taken out by a reorg): its nonce still free → [`Fate::Ready`]
    /// (re-validated by the next bundle's simulation); used → the chain's
    /// `UserOperationEvent` of its hash (Keel's own other bundle, this bundle's
    /// re-inclusion, or another bundler's: [`Fate::In`], final when its block is) or,
    /// without one, [`Fate::Elsewhere`].
    async fn release(
        &self,
        chain: &AaChain,
        l: &Loaded,
        final_block: &mut Option<u64>,
    ) -> Result<Fate, BundlerError> {
        if !self.nonce_used(chain, l).await? {
            return Ok(Fate::Ready);
        }
        let head = chain.pool.block_number().await?;
        let filter = serde_json::json!({
            "address": l.resolution.resolved.address(),
            "topics": [IEntryPointV08::UserOperationEvent::SIGNATURE_HASH, l.hash],
            "fromBlock": format!("{:#x}", head.saturating_sub(EVENT_LOOKBACK_BLOCKS)),
            "toBlock": "latest",
        });
        let logs: Vec<Log> = chain.pool.request("eth_getLogs", (filter,)).await?;
        let Some(tx_hash) = logs.iter().rev().find_map(|log| log.transaction_hash) else {
            return Ok(Fate::Elsewhere);
        };
        let receipt = chain
            .pool
            .receipts(&[tx_hash])
            .await?
            .into_iter()
            .next()
            .flatten();
        let Some(r) = receipt
            .as_ref()
            .and_then(|r| user_operation_receipt(r, &l.resolution.resolved, l.hash))
        else {
            // The log is there, the receipt not yet (or it moved meanwhile): next pass.
            return Ok(Fate::Wait);
        };
        let found = Found::of(&r);
        let fin = found.block_number <= self.final_block(final_block).await?;
        tracing::info!(target: "keel::aa::bundler", chain_id = self.chain_id,
            "a user operation left out of its bundle was found included in another transaction");
        Ok(Fate::In(found, fin))
    }

    /// Writes `fate` of operation `l` (of bundle `bundle_id`) on `tx`, with the outcome
    /// signal when it is terminal (final inclusion, nonce used elsewhere).
    async fn apply(
        &self,
        tx: &mut sqlx::PgConnection,
        l: &Loaded,
        bundle_id: Uuid,
        fate: &Fate,
        counts: &mut Counts,
    ) -> Result<(), BundlerError> {
        let (chain_id, hash) = (
            chain_id_i64(l.row.chain_id.0),
            l.row.user_op_hash.0.as_slice(),
        );
        match fate {
            Fate::In(f, fin) => {
                if f.changes(&l.row) {
                    let cost = f.cost.clone();
                    let used = f.used.clone();
                    let inc = store::Inclusion {
                        success: f.success,
                        actual_gas_cost: &cost,
                        actual_gas_used: &used,
                        revert_reason: f.revert.as_ref().map(|b| b.as_ref()),
                        tx_hash: f.tx_hash.as_slice(),
                        block_number: i64::try_from(f.block_number).unwrap_or(i64::MAX),
                        block_hash: f.block_hash.as_ref().map(|h| h.as_slice()),
                    };
                    if store::user_operation_track(&mut *tx, chain_id, hash, bundle_id, &inc)
                        .await?
                    {
                        if l.row.state == store::state::INCLUDED {
                            counts.moved += 1;
                        } else {
                            counts.included += 1;
                        }
                    }
                }
                if *fin && store::user_operation_finalize(&mut *tx, chain_id, hash).await? {
                    let outcome = OutcomeSignal {
                        state: store::state::INCLUDED,
                        success: Some(f.success),
                        actual_gas_cost: Some(f.cost.clone()),
                        actual_gas_used: Some(f.used.clone()),
                        tx_hash: Some(f.tx_hash),
                        block_number: Some(f.block_number),
                        error_code: None,
                        error_reason: None,
                    };
                    self.signal(
                        &mut *tx,
                        l.row.instance_id,
                        &format!("final:{bundle_id}"),
                        &outcome,
                    )
                    .await?;
                    // ERC-7562 reputation: opsIncluded counts final inclusions only.
                    crate::validation::record_included(&mut *tx, chain_id, &l.op).await?;
                    counts.finalized += 1;
                }
            }
            Fate::Out => {
                if store::user_operation_out(&mut *tx, chain_id, hash, bundle_id).await? {
                    counts.reorged += 1;
                }
            }
            Fate::Ready => {
                if store::user_operation_unbundle(&mut *tx, chain_id, hash, bundle_id).await? {
                    if l.row.state == store::state::INCLUDED {
                        counts.reorged += 1;
                    }
                    counts.rebundled += 1;
                }
            }
            Fate::Elsewhere => {
                let code = crate::Erc7769Code::RejectedByEntryPoint.code();
                let reason = "NONCE_USED_ELSEWHERE";
                if store::user_operation_end(
                    &mut *tx,
                    chain_id,
                    hash,
                    store::state::NONCE_USED_ELSEWHERE,
                    code,
                    reason,
                )
                .await?
                {
                    let outcome =
                        OutcomeSignal::ended(store::state::NONCE_USED_ELSEWHERE, code, reason);
                    self.signal(
                        &mut *tx,
                        l.row.instance_id,
                        &format!("bundle:{bundle_id}"),
                        &outcome,
                    )
                    .await?;
                    counts.elsewhere += 1;
                }
            }
            Fate::TooLarge => {
                let (code, reason) = too_large();
                if store::user_operation_end(
                    &mut *tx,
                    chain_id,
                    hash,
                    store::state::FAILED,
                    code,
                    reason,
                )
                .await?
                {
                    let outcome = failure_outcome(code, reason);
                    self.signal(
                        &mut *tx,
                        l.row.instance_id,
                        &format!("bundle:{bundle_id}"),
                        &outcome,
                    )
                    .await?;
                    count_ops(self.chain_id, "failed", 1);
                }
            }
            Fate::Wait => {}
        }
        Ok(())
    }

    /// True when `verdict` says the bundle's transaction exceeded the block gas limit
    /// (the queue fails it before assigning a nonce); then the bundler's gas ceiling
    /// is lowered below this bundle's gas, so its operations are bundled in smaller
    /// sets and never in the same one again.
    fn note_gas_refusal(&self, verdict: &SettlementVerdict, ops: &[Loaded]) -> bool {
        if !matches!(
            verdict,
            SettlementVerdict::Failed {
                code: FailureCode::ExceedsBlockGasLimit,
                ..
            }
        ) {
            return false;
        }
        let gas = ops
            .iter()
            .map(|l| admission::operation_gas(&l.op))
            .fold(self.overhead(), u64::saturating_add);
        self.gas_ceiling
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |c| {
                    let below = gas.saturating_sub(1).max(1);
                    Some(if c == 0 { below } else { c.min(below) })
                },
            )
            .ok();
        tracing::warn!(target: "keel::aa::bundler", chain_id = self.chain_id, operations = ops.len(),
            "bundle refused for exceeding the block gas limit; later bundles are split below its gas");
        true
    }

    /// True when the EntryPoint's nonce of the operation's sender and key has passed the
    /// operation's nonce.
    async fn nonce_used(&self, chain: &AaChain, l: &Loaded) -> Result<bool, BundlerError> {
        let key = U192::from(l.op.nonce >> 64);
        let call = IEntryPointV08::getNonceCall {
            sender: l.op.sender,
            key,
        };
        let tx = TransactionRequest {
            to: Some(TxKind::Call(l.resolution.resolved.address())),
            input: TransactionInput::new(call.abi_encode().into()),
            ..Default::default()
        };
        let out = chain.pool.call(&tx, BlockNumberOrTag::Latest).await?;
        let onchain = IEntryPointV08::getNonceCall::abi_decode_returns(&out)
            .map_err(|_| BundlerError::Corrupt("getNonce answer"))?;
        Ok(onchain > l.op.nonce)
    }
}
