//! Nonce drift (issue 32 §3), part of the shared floor: when a request's nonce was
//! taken for good by a transaction that is not one of its attempts, the request is
//! re-signed at a fresh nonce instead of failing; and before an idle sender signs, its
//! next nonce is reconciled with the chain's.
//!
//! ## Why re-signing cannot double an effect
//!
//! Every attempt of a request is signed at the request's nonce (fee bumps keep it). A
//! request is re-signed only when:
//!
//! 1. the sender's nonce **at the final block** ([`crate::Finality`]) is above the
//!    request's nonce: a transaction with that nonce is in a block no reorg takes back;
//! 2. after that read, no node knows any attempt of the request
//!    (`eth_getTransactionByHash`, which also finds mined ones): the transaction in
//!    that final block is not ours.
//!
//! Then none of the request's attempts can ever be mined (their nonce is used on the
//! final chain by another transaction), so its effect never happened and never will
//! from those bytes: a new signature at a fresh nonce is its only possible effect. The
//! new attempt is persisted (under the sender's row lock, with the next nonce moved
//! past it, in one transaction) before it is broadcast, like any other attempt; a crash
//! in between leaves a `signed` request whose exact new bytes the next pass sends.
//!
//! ## Drift directions
//!
//! - **Chain above Keel** (a transaction sent from the sender's key outside Keel):
//!   idle senders adopt the chain's `pending` nonce before signing
//!   ([`TxQueue::reconcile_idle`]); a request signed before the outside transaction
//!   was seen (busy queue, or a race) is re-signed once the outside transaction is
//!   final.
//! - **Keel above chain** (a nonce Keel assigned that no node holds): a request in
//!   flight keeps its nonce and its exact bytes go out again (a dropped transaction is
//!   re-broadcast); a nonce whose request failed after signing is filled with a
//!   zero-value self-transfer by nonce recovery, at once for an idle sender. Keel never
//!   lowers its counter: a lower nonce could collide with an attempt of its own that
//!   some pool still holds.

use super::attempt::TxBody;
use super::{TxQueue, metrics};
use crate::store::{self, AttemptRow, NewAttempt, RequestRow};
use crate::{Finality, Result, TxqError};
use alloy::eips::{BlockNumberOrTag, Encodable2718};
use alloy::primitives::Address;
use keel_chain::ChainError;

impl TxQueue {
    /// The number of the block that is final now ([`crate::TxQueueConfig::finality`]):
    /// the node's `finalized` block, or the head less the configured depth.
    ///
    /// # Errors
    /// Transport errors of the head read.
    pub(super) async fn final_block(&self) -> Result<u64> {
        match self.config.finality {
            Finality::Depth(depth) => Ok(self.chain.block_number().await?.saturating_sub(depth)),
            Finality::Finalized { fallback_depth } => match self.chain.finalized().await {
                Ok(Some(header)) => Ok(header.number),
                // No such tag on this node (or none answered yet): the fallback depth.
                Ok(None) | Err(ChainError::Node { .. }) => Ok(self
                    .chain
                    .block_number()
                    .await?
                    .saturating_sub(fallback_depth)),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// The sender's nonce at the final block: every nonce below it is used by a
    /// transaction no reorg takes back.
    pub(super) async fn final_nonce(&self, sender: Address) -> Result<i64> {
        let block = self.final_block().await?;
        let n = self
            .chain
            .nonce(sender, BlockNumberOrTag::Number(block))
            .await?;
        i64::try_from(n).map_err(|_| TxqError::InvalidRequest("nonce"))
    }

    /// Whether `req`'s nonce is taken for good by a transaction that is none of its
    /// `attempts` (see the module docs): the nonce at the final block is above it, and
    /// then no node knows any of the attempts.
    pub(super) async fn nonce_taken_for_good(
        &self,
        req: &RequestRow,
        attempts: &[AttemptRow],
    ) -> Result<bool> {
        let Some(nonce) = req.nonce else {
            return Ok(false);
        };
        let sender = req.sender.0;
        if self.final_nonce(sender).await? <= nonce {
            return Ok(false);
        }
        Ok(!self.any_attempt_known(attempts).await?)
    }

    /// Re-signs `req` (in flight at a nonce taken for good by another transaction, see
    /// [`TxQueue::nonce_taken_for_good`]) at a fresh nonce: the higher of the sender's
    /// next nonce and the chain's `pending` nonce, at the current fees and the last
    /// attempt's gas limit. In one transaction under the sender's row lock (then the
    /// request's): the new attempt is inserted, the request is `signed` again at the new
    /// nonce, and the sender's next nonce moves past it. Nothing is broadcast here: the
    /// next round sends the persisted bytes (and is woken). Returns false when the
    /// request moved meanwhile (settled, or re-signed by another pass) or has no signer
    /// here.
    ///
    /// # Errors
    /// Store, transport and signer errors (nothing is written then).
    pub(super) async fn resign(&self, req: &RequestRow, attempts: &[AttemptRow]) -> Result<bool> {
        let (Some(old), Some(last)) = (req.nonce, attempts.last()) else {
            return Ok(false);
        };
        let sender = req.sender.0;
        let Some(signer) = self.signers.get(&sender).cloned() else {
            return Ok(false);
        };
        let pending = i64::try_from(self.chain.nonce(sender, BlockNumberOrTag::Pending).await?)
            .map_err(|_| TxqError::InvalidRequest("nonce"))?;
        let fees = self.fees().await?;
        let body = TxBody::of(req)?;
        let mut tx = self.db.begin().await?;
        let Some(next) = store::sender_lock(&mut *tx, self.chain_id, sender.as_slice()).await?
        else {
            return Ok(false);
        };
        let Some(attempt) = store::request_lock_at_nonce(&mut tx, req.id, old).await? else {
            return Ok(false);
        };
        let nonce = next.max(pending);
        let unsigned = body.unsigned(
            self.config.fee_model,
            self.chain.chain().get(),
            u64::try_from(nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
            u64::try_from(last.gas_limit).map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
            fees,
        )?;
        let envelope = signer.sign(unsigned).await?;
        let hash = *envelope.tx_hash();
        let raw = envelope.encoded_2718();
        store::attempt_insert(
            &mut *tx,
            &NewAttempt {
                request_id: req.id,
                attempt: attempt + 1,
                nonce,
                hash: hash.as_slice(),
                raw: &raw,
                max_fee: fees.max_fee_per_gas.to_string(),
                priority_fee: fees.max_priority_fee_per_gas.to_string(),
                gas_limit: last.gas_limit,
            },
        )
        .await?;
        store::request_resigned(&mut tx, self.chain_id, sender.as_slice(), req.id, nonce).await?;
        tx.commit().await?;
        metrics::resigned(self.chain_id);
        tracing::warn!(target: "keel::txq", request = %req.id, %sender, old_nonce = old, new_nonce = nonce,
            "another transaction took the request's nonce for good and none of its attempts can be mined; re-signed at a fresh nonce");
        self.wake.notify_one();
        Ok(true)
    }

    /// Reconciles idle senders of `senders` (no `signed` or `broadcast` request: none
    /// of their transactions can be in a pool) with the chain before they sign: a
    /// `pending` nonce above Keel's next nonce (transactions sent from the key outside
    /// Keel) is adopted; one below it (a nonce Keel assigned and no node holds) starts
    /// nonce recovery at once, which fills the gap. Failures are logged and left to the
    /// periodic recovery; this never blocks signing.
    pub(super) async fn reconcile_idle(
        &self,
        senders: &[(Address, bool)],
    ) -> Vec<(Address, std::cmp::Ordering)> {
        let addresses: Vec<&[u8]> = senders.iter().map(|(s, _)| s.as_slice()).collect();
        let idle = match store::senders_idle(&self.db, self.chain_id, &addresses).await {
            Ok(idle) => idle,
            Err(e) => {
                tracing::warn!(target: "keel::txq", error = %e, "reading idle senders failed; signing without reconciling their nonces");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (sender, next) in idle {
            let Ok(sender) = Address::try_from(sender.as_slice()) else {
                continue;
            };
            let pending = match self.chain.nonce(sender, BlockNumberOrTag::Pending).await {
                Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
                Err(e) => {
                    tracing::debug!(target: "keel::txq", error = %e, %sender, "pending nonce read failed; signing without reconciling");
                    continue;
                }
            };
            if pending > next {
                match store::sender_raise_next(&self.db, self.chain_id, sender.as_slice(), pending)
                    .await
                {
                    Ok(Some(before)) => {
                        tracing::warn!(target: "keel::txq", %sender, before, after = pending, "idle sender's nonce advanced outside Keel; adopted before signing");
                        metrics::nonce_adopted(self.chain_id);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(target: "keel::txq", error = %e, %sender, "adopting the chain's nonce failed");
                    }
                }
            }
            out.push((sender, pending.cmp(&next)));
        }
        out
    }
}
