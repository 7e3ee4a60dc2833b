//! The confirmation stage: receipts of every attempt of in-flight requests, settling
//! those at the confirmation depth (`confirmed`, or `reverted` with the decoded reason),
//! and the reconciliation of `signed` requests whose nonce the chain passed.

use super::TxQueue;
use super::attempt::{attempt_records, by_batches};
use crate::store::{AttemptRow, RequestRow};
use crate::verdict::SettlementVerdict;
use crate::{RequestState, Result};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::{B256, Bytes, TxKind};
use alloy::rpc::types::{TransactionReceipt, TransactionRequest};
use keel_chain::ChainError;
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The verdict's kind for a span's `outcome` (`confirmed`, `reverted`, `failed`).
fn verdict_kind(v: &SettlementVerdict) -> &'static str {
    match v {
        SettlementVerdict::Confirmed { .. } => "confirmed",
        SettlementVerdict::Reverted { .. } => "reverted",
        _ => "failed",
    }
}

/// What the receipt half of the confirmation pass did.
pub(super) struct Mined<'a> {
    /// Requests settled.
    pub(super) settled: usize,
    /// `broadcast` requests none of whose attempts has a receipt, with their attempts.
    pub(super) unmined: Vec<(&'a RequestRow, &'a [AttemptRow])>,
}

impl TxQueue {
    /// The receipt half of the confirmation pass over `watched` (every `broadcast`
    /// request, and the `signed` ones with failed broadcasts) and their `attempts`: fetches
    /// the receipts of every attempt in JSON-RPC batches and settles the requests at the
    /// confirmation depth in one statement, then reconciles the `signed` ones without a
    /// receipt ([`TxQueue::reconcile_unsent`]). Returns how many settled and the
    /// `broadcast` requests without a receipt; `None` when `cancel` fired before the
    /// settling statement (nothing settled).
    pub(super) async fn settle_mined<'a>(
        &self,
        watched: &[&'a RequestRow],
        attempts: &'a HashMap<Uuid, Vec<AttemptRow>>,
        cancel: &CancellationToken,
    ) -> Result<Option<Mined<'a>>> {
        let hashes: Vec<B256> = attempts.values().flatten().map(|a| a.tx_hash.0).collect();
        let head = self.chain.block_number().await?;
        let receipts = by_batches(&hashes, |chunk| self.chain.receipts(chunk)).await?;
        let by_hash: HashMap<B256, TransactionReceipt> = hashes
            .iter()
            .zip(receipts)
            .filter_map(|(h, r)| r.map(|r| (*h, r)))
            .collect();
        let mut verdicts: Vec<(Uuid, SettlementVerdict)> = Vec::new();
        let mut spans: Vec<Option<tracing::Span>> = Vec::new();
        let mut unmined: Vec<(&RequestRow, &[AttemptRow])> = Vec::new();
        let mut unsent: Vec<(&RequestRow, &[AttemptRow])> = Vec::new();
        for req in watched {
            let mine = attempts.get(&req.id).map_or(&[][..], Vec::as_slice);
            let receipt = mine
                .iter()
                .map(|a| a.tx_hash.0)
                .find_map(|h| by_hash.get(&h));
            let Some(receipt) = receipt else {
                if req.state == RequestState::Broadcast {
                    unmined.push((req, mine));
                } else {
                    unsent.push((req, mine));
                }
                continue;
            };
            let Some(block) = receipt.block_number else {
                continue;
            };
            self.saw_included(req.sender.0.as_slice(), block);
            if head.saturating_sub(block) + 1 < self.config.confirmations {
                continue;
            }
            if cancel.is_cancelled() {
                return Ok(None);
            }
            let verdict = if receipt.status() {
                SettlementVerdict::Confirmed {
                    block,
                    hash: receipt.transaction_hash,
                    gas_used: receipt.gas_used,
                    effective_gas_price: receipt.effective_gas_price.to_string(),
                    attempts: attempt_records(mine)?,
                }
            } else {
                let revert = self.revert_reason(req, block).await;
                SettlementVerdict::Reverted {
                    block,
                    hash: receipt.transaction_hash,
                    reason: revert.as_ref().and_then(|r| r.message.clone()),
                    revert_data: revert.map(|r| r.data),
                    attempts: attempt_records(mine)?,
                }
            };
            let span = super::trace::request_span("txq.settle", req);
            super::trace::record_outcome(span.as_ref(), verdict_kind(&verdict));
            spans.push(span);
            verdicts.push((req.id, verdict));
        }
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let settled = self.settle_many(&verdicts).await?;
        // The traced requests' settle spans end with the settling statement.
        drop(spans);
        // `signed` requests without a receipt whose nonce the final chain passed:
        // another transaction took it for good, unless a node knows one of their
        // attempts (mined, its receipt not served yet); they are re-signed.
        self.reconcile_unsent(&unsent, cancel).await?;
        Ok(Some(Mined { settled, unmined }))
    }

    /// `signed` requests with failed broadcasts and no receipt: when the sender's nonce
    /// at the final block is above theirs and no node knows any of their attempts,
    /// another transaction took the nonce for good and none of their attempts can ever
    /// be mined: they are re-signed at a fresh nonce ([`TxQueue::resign`], issue 32
    /// §3). The nonce is read before the attempts are looked up, so an attempt that
    /// mines in between is found. Returns how many were re-signed.
    async fn reconcile_unsent(
        &self,
        unsent: &[(&RequestRow, &[AttemptRow])],
        cancel: &CancellationToken,
    ) -> Result<usize> {
        if unsent.is_empty() || cancel.is_cancelled() {
            return Ok(0);
        }
        let mut final_nonce: HashMap<&[u8], i64> = HashMap::new();
        for (req, _) in unsent {
            if final_nonce.contains_key(req.sender.0.as_slice()) {
                continue;
            }
            let sender = req.sender.0;
            let n = self.final_nonce(sender).await?;
            final_nonce.insert(req.sender.0.as_slice(), n);
        }
        let passed: Vec<&(&RequestRow, &[AttemptRow])> = unsent
            .iter()
            .filter(|(req, _)| {
                req.nonce.is_some_and(|n| {
                    final_nonce
                        .get(req.sender.0.as_slice())
                        .is_some_and(|l| *l > n)
                })
            })
            .collect();
        if passed.is_empty() {
            return Ok(0);
        }
        let hashes: Vec<B256> = passed
            .iter()
            .flat_map(|(_, mine)| mine.iter())
            .map(|a| a.tx_hash.0)
            .collect();
        let answers = by_batches(&hashes, |chunk| self.chain.transactions_known(chunk)).await?;
        let known: std::collections::HashSet<B256> = hashes
            .iter()
            .zip(answers)
            .filter_map(|(hash, known)| known.then_some(*hash))
            .collect();
        let mut resigned = 0;
        for (req, mine) in passed {
            let ours_known = mine.iter().any(|a| known.contains(&a.tx_hash.0));
            if ours_known || cancel.is_cancelled() {
                continue;
            }
            if self.resign(req, mine).await? {
                resigned += 1;
            }
        }
        Ok(resigned)
    }

    /// Records that a transaction of `sender` is included in `block` (see
    /// [`TxQueue::stuck`]): a block higher than any seen for the sender restarts its
    /// progress clock.
    fn saw_included(&self, sender: &[u8], block: u64) {
        let mut progress = self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match progress.get_mut(sender) {
            Some((seen, since)) if block > *seen => {
                *seen = block;
                *since = std::time::Instant::now();
            }
            Some(_) => {}
            None => {
                progress.insert(sender.to_vec(), (block, std::time::Instant::now()));
            }
        }
    }

    /// Re-executes a reverted request with `eth_call` at its block's parent to read the
    /// revert data (and its `Error(string)` reason), then, when that call succeeds, on
    /// the block's end state (a revert caused by an earlier transaction of the same
    /// block); `None` when the node gives none. Best effort: the end state is not the
    /// state at the transaction's position.
    async fn revert_reason(
        &self,
        req: &RequestRow,
        block: u64,
    ) -> Option<keel_chain::RevertReason> {
        let sender = req.sender.0;
        let to = req.to_address.map(|t| t.0);
        let call = TransactionRequest {
            from: Some(sender),
            to: Some(to.map_or(TxKind::Create, TxKind::Call)),
            value: req.value_wei.parse().ok(),
            input: Bytes::from(req.calldata.clone()).into(),
            ..Default::default()
        };
        // Replayed on the parent block's state; when that succeeds, an earlier
        // transaction of the same block caused the revert (e.g. it used up a limit the
        // call checks), so the call is replayed on the block's own end state too.
        for at in [block.saturating_sub(1), block] {
            if let Err(ChainError::Node { error, .. }) =
                self.chain.call(&call, BlockNumberOrTag::Number(at)).await
                && error.revert.is_some()
            {
                return error.revert;
            }
        }
        None
    }
}
