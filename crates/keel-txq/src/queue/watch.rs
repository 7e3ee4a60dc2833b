//! The watch stage (issue 32 §10): a request settled `confirmed` or `reverted` stays
//! watched until its verdict's block is final for the chain ([`crate::Finality`]). At
//! most [`WATCH_BATCH`] watched requests are looked at per pass, and only when the
//! chain's head or final block moved since the last look (or a watched transaction is
//! out of the chain).
//!
//! Per watched request, the receipts of all its attempts decide:
//!
//! - **Mined, the block final**: the watch ends (`final_at`).
//! - **Mined elsewhere** (the same transaction re-included in another block after a
//!   reorg, or another of its attempts): the verdict stands with the new block and hash
//!   (same kind), and the watch goes on.
//! - **Not mined** (a reorg took it out): counted (`keel_txq_reorged_total`), logged,
//!   and then, by the sender's nonce:
//!   - the nonce is still free on the chain: the verdict's attempt's **exact signed
//!     bytes** are broadcast again (always safe: the same transaction can take effect
//!     once at most). Nonce recovery never fills that nonce with a gap transfer while
//!     the request holds it (`store::live_nonces`);
//!   - another transaction took the nonce on the **final** chain and no node knows any
//!     attempt of the request: the effect is provably absent and can never happen from
//!     these bytes. The verdict becomes `Failed { code: REORGED_OUT }` (the watch
//!     ends), handed to the settlement sink ([`crate::SettlementSink::reorged`]) in the
//!     same transaction. The queue does not re-send it: re-sending is the operation's
//!     decision (docs/architecture.md, "Reorgs after a verdict").
//!   - otherwise (the other transaction not final yet, or an attempt still in a pool):
//!     wait.

use super::attempt::{attempt_records, by_batches, failed};
use super::{TxQueue, metrics};
use crate::settlement::Settled;
use crate::store::{self, AttemptRow, WatchedRow};
use crate::verdict::{FailureCode, SettlementVerdict};
use crate::{Result, TxqError};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::{B256, Bytes};
use alloy::rpc::types::TransactionReceipt;
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Watched requests looked at per pass (oldest settlement first).
const WATCH_BATCH: i64 = 1_000;

/// What a watch pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Watched {
    /// Watches ended: the block is final.
    pub(super) finalized: usize,
    /// Verdicts updated to a new block (re-included).
    pub(super) reincluded: usize,
    /// Transactions found out of the chain (this pass).
    pub(super) out: usize,
    /// Verdicts replaced by `REORGED_OUT`.
    pub(super) reorged_out: usize,
}

impl TxQueue {
    /// One watch pass (see the module docs). Nothing is written or sent once `cancel`
    /// fired.
    ///
    /// # Errors
    /// Store and transport errors (the next pass looks again).
    pub(super) async fn watch_settled(&self, cancel: &CancellationToken) -> Result<Watched> {
        let mut out = Watched::default();
        if cancel.is_cancelled() {
            return Ok(out);
        }
        let rows = store::requests_watched(&self.db, self.chain_id, WATCH_BATCH).await?;
        if rows.is_empty() {
            return Ok(out);
        }
        let head = self
            .chain
            .header(BlockNumberOrTag::Latest)
            .await?
            .ok_or(TxqError::InvalidRequest("head"))?;
        let final_block = self.final_block().await?;
        let any_out = rows.iter().any(|r| r.reorged);
        // The pass is skipped when nothing moved (head, final block, the watched rows)
        // since the last *completed* one; a pass
        // that ended early (an error, a cancel: its rows not marked) is not remembered,
        // so the next one looks again even if the chain stands still.
        // Which rows, not how many: a write settled in the block of one whose watch just
        // ended keeps the count (and the head) unchanged, and must still be looked at.
        let rows_seen = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for r in &rows {
                r.id.hash(&mut h);
            }
            h.finish()
        };
        let now = (head.hash, final_block, rows_seen);
        if !any_out
            && *self
                .watched_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                == Some(now)
        {
            return Ok(out);
        }
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let mut attempts: HashMap<Uuid, Vec<AttemptRow>> = HashMap::new();
        for a in store::attempts_of(&self.db, &ids).await? {
            attempts.entry(a.request_id).or_default().push(a);
        }
        let hashes: Vec<B256> = attempts.values().flatten().map(|a| a.tx_hash.0).collect();
        let receipts = by_batches(&hashes, |chunk| self.chain.receipts(chunk)).await?;
        let by_hash: HashMap<B256, TransactionReceipt> = hashes
            .iter()
            .zip(receipts)
            .filter_map(|(h, r)| r.map(|r| (*h, r)))
            .collect();
        let mut final_ids = Vec::new();
        let mut reorged: Vec<(&WatchedRow, &[AttemptRow])> = Vec::new();
        for row in &rows {
            let mine = attempts.get(&row.id).map_or(&[][..], Vec::as_slice);
            let receipt = mine
                .iter()
                .map(|a| a.tx_hash.0)
                .find_map(|h| by_hash.get(&h));
            let Some(receipt) = receipt else {
                reorged.push((row, mine));
                continue;
            };
            let Some(block) = receipt.block_number else {
                continue;
            };
            let stored: Option<SettlementVerdict> =
                serde_json::from_value(row.verdict.clone()).ok();
            let (was_block, was_hash) = match &stored {
                Some(
                    SettlementVerdict::Confirmed { block, hash, .. }
                    | SettlementVerdict::Reverted { block, hash, .. },
                ) => (*block, *hash),
                _ => (0, B256::ZERO),
            };
            if (block != was_block || receipt.transaction_hash != was_hash)
                && !cancel.is_cancelled()
            {
                let was_kind = stored.as_ref().map_or("failed", SettlementVerdict::kind);
                let verdict = moved(stored, block, receipt, mine)?;
                if verdict.kind() != was_kind {
                    tracing::error!(target: "keel::txq", request = %row.id, from = was_kind, to = verdict.kind(),
                        "a reorg changed a settled transaction's outcome; its verdict is updated");
                }
                let json = serde_json::to_value(&verdict)
                    .map_err(|_| TxqError::InvalidRequest("verdict"))?;
                if store::request_watch_update(&self.db, row.id, &json, verdict.kind()).await? {
                    out.reincluded += 1;
                    tracing::warn!(target: "keel::txq", request = %row.id, from_block = was_block, to_block = block,
                        "a reorg moved a settled transaction; its verdict stands with the new block");
                }
            }
            if block <= final_block {
                final_ids.push(row.id);
            }
        }
        if cancel.is_cancelled() {
            return Ok(out);
        }
        store::requests_mark_final(&self.db, &final_ids).await?;
        out.finalized = final_ids.len();
        if !reorged.is_empty() {
            self.handle_reorged(&reorged, &mut out, cancel).await?;
        }
        if !cancel.is_cancelled() {
            *self
                .watched_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(now);
        }
        Ok(out)
    }

    /// Watched requests none of whose attempts is mined: marked and counted once per
    /// reorg; the exact bytes re-broadcast while the nonce is free; `REORGED_OUT` once
    /// another transaction took the nonce on the final chain and no node knows any of
    /// their attempts.
    async fn handle_reorged(
        &self,
        reorged: &[(&WatchedRow, &[AttemptRow])],
        out: &mut Watched,
        cancel: &CancellationToken,
    ) -> Result<()> {
        let mut latest: HashMap<&[u8], (i64, i64)> = HashMap::new();
        for (row, mine) in reorged {
            if cancel.is_cancelled() {
                return Ok(());
            }
            let Some(nonce) = row.nonce else {
                continue;
            };
            if store::request_mark_reorged(&self.db, row.id).await? {
                out.out += 1;
                metrics::reorged(self.chain_id);
                tracing::warn!(target: "keel::txq", request = %row.id, nonce,
                    "a reorg took a settled transaction out of the chain; watching it until final");
            }
            let sender = row.sender.0;
            let (chain_nonce, final_nonce) = match latest.get(row.sender.0.as_slice()) {
                Some(n) => *n,
                None => {
                    // The final nonce first: a later latest read can only be higher.
                    let f = self.final_nonce(sender).await?;
                    let l = self.chain.nonce(sender, BlockNumberOrTag::Latest).await?;
                    let l = i64::try_from(l).map_err(|_| TxqError::InvalidRequest("nonce"))?;
                    latest.insert(row.sender.0.as_slice(), (l, f));
                    (l, f)
                }
            };
            if chain_nonce <= nonce {
                // The nonce is free: the same signed bytes go out again.
                let verdict_hash =
                    match serde_json::from_value::<SettlementVerdict>(row.verdict.clone()) {
                        Ok(
                            SettlementVerdict::Confirmed { hash, .. }
                            | SettlementVerdict::Reverted { hash, .. },
                        ) => Some(hash),
                        _ => None,
                    };
                let attempt = mine
                    .iter()
                    .find(|a| Some(a.tx_hash.0) == verdict_hash)
                    .or(mine.last());
                if let Some(a) = attempt {
                    match self
                        .chain
                        .send_raw_transaction(&Bytes::from(a.raw.clone()))
                        .await
                    {
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(target: "keel::txq", request = %row.id, error = %e, "re-broadcast of a reorged transaction failed; next pass");
                        }
                    }
                }
                continue;
            }
            if final_nonce <= nonce || self.any_attempt_known(mine).await? {
                // Not final yet, or one of ours may still be mined: wait.
                continue;
            }
            if self.reorged_out(row.id, mine).await? {
                out.reorged_out += 1;
            }
        }
        Ok(())
    }

    /// Replaces request `id`'s verdict with `Failed { code: REORGED_OUT }` and ends its
    /// watch, handing it to the settlement sink in the same transaction. False when it
    /// was no longer watched or the sink failed (rolled back; a later pass tries again).
    async fn reorged_out(&self, id: Uuid, mine: &[AttemptRow]) -> Result<bool> {
        let verdict = failed(FailureCode::ReorgedOut, attempt_records(mine)?);
        let json =
            serde_json::to_value(&verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
        let mut tx = self.db.begin().await?;
        let Some(key) = store::request_reorged_out(&mut tx, id, &json).await? else {
            return Ok(false);
        };
        if let Some(sink) = &self.sink {
            let reorged = [Settled {
                request_id: id,
                idempotency_key: &key,
                verdict: &verdict,
            }];
            if let Err(e) = sink.reorged(&mut tx, &reorged).await {
                tracing::warn!(target: "keel::txq", request = %id, error = %e, "settlement sink refused a REORGED_OUT verdict; retrying next pass");
                return Ok(false);
            }
        }
        tx.commit().await?;
        metrics::reorged_out(self.chain_id);
        tracing::error!(target: "keel::txq", request = %id,
            "a reorg took a settled transaction out and another transaction took its nonce on the final chain: its effect is absent (REORGED_OUT)");
        Ok(true)
    }
}

/// The verdict of a re-included transaction: at `block` with `receipt`'s hash, kind and
/// gas figures (a revert keeps the stored reason when it was a revert before).
fn moved(
    stored: Option<SettlementVerdict>,
    block: u64,
    receipt: &TransactionReceipt,
    mine: &[AttemptRow],
) -> Result<SettlementVerdict> {
    if !receipt.status() {
        let (reason, revert_data) = match stored {
            Some(SettlementVerdict::Reverted {
                reason,
                revert_data,
                ..
            }) => (reason, revert_data),
            _ => (None, None),
        };
        return Ok(SettlementVerdict::Reverted {
            block,
            hash: receipt.transaction_hash,
            reason,
            revert_data,
            attempts: attempt_records(mine)?,
        });
    }
    Ok(SettlementVerdict::Confirmed {
        block,
        hash: receipt.transaction_hash,
        gas_used: receipt.gas_used,
        effective_gas_price: receipt.effective_gas_price.to_string(),
        attempts: attempt_records(mine)?,
    })
}
