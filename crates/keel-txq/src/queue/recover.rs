//! The recovery stage: adopting a nonce advanced outside Keel, and filling nonce gaps
//! (left by requests that failed after signing) with zero-value self-transfers.

use super::{TxQueue, metrics};
use crate::store::{self, NewAttempt};
use crate::{Result, TxqError};
use alloy::eips::{BlockNumberOrTag, Encodable2718};
use alloy::primitives::{Address, Bytes, U256};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

impl TxQueue {
    /// The nonce half of [`TxQueue::recover_nonces`]: adopts a nonce advanced outside
    /// Keel, or persists a zero-value self-transfer (signed, not sent) for every gap;
    /// writes nothing once `cancel` fired. Returns `(adopted, filled)`; the caller
    /// broadcasts the fillers.
    pub(super) async fn recover_sender(
        &self,
        sender: Address,
        cancel: &CancellationToken,
    ) -> Result<(bool, usize)> {
        if cancel.is_cancelled() {
            return Ok((false, 0));
        }
        let signer = self
            .signers
            .get(&sender)
            .cloned()
            .ok_or(TxqError::UnknownSender)?;
        let Some(next) = store::sender_next(&self.db, self.chain_id, sender.as_slice()).await?
        else {
            return Ok((false, 0)); // initialized from the chain on first use
        };
        let to_i64 = |n: u64| i64::try_from(n).map_err(|_| TxqError::InvalidRequest("nonce"));
        let latest = to_i64(self.chain.nonce(sender, BlockNumberOrTag::Latest).await?)?;
        let mut adopted = false;
        if cancel.is_cancelled() {
            return Ok((false, 0));
        }
        if latest > next {
            if let Some(before) =
                store::sender_raise_next(&self.db, self.chain_id, sender.as_slice(), latest).await?
            {
                tracing::warn!(target: "keel::txq", %sender, before, after = latest, "nonce advanced outside Keel; adopted");
                metrics::nonce_adopted(self.chain_id);
                adopted = true;
            }
            return Ok((adopted, 0));
        }
        // Nodes disagree on whether gapped pool transactions count in the `pending`
        // nonce, so gaps are looked for from the mined (`latest`) nonce.
        if latest >= next {
            return Ok((false, 0));
        }
        let live =
            store::live_nonces(&self.db, self.chain_id, sender.as_slice(), latest, next).await?;
        let super::attempt::Fees {
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
        } = self.fees().await?;
        let mut filled = 0;
        for nonce in latest..next {
            if live.contains(&nonce) {
                continue;
            }
            let unsigned = super::attempt::TxBody {
                to: Some(sender),
                value: U256::ZERO,
                data: Bytes::new(),
                authorization_list: Vec::new(),
            }
            .unsigned(
                self.config.fee_model,
                self.chain.chain().get(),
                u64::try_from(nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
                21_000,
                super::attempt::Fees {
                    max_fee_per_gas: max_fee,
                    max_priority_fee_per_gas: tip,
                },
            )?;
            let envelope = signer.sign(unsigned).await?;
            let hash = *envelope.tx_hash();
            let raw = envelope.encoded_2718();
            let id = Uuid::new_v4();
            if cancel.is_cancelled() {
                break;
            }
            let mut tx = self.db.begin().await?;
            if !store::request_insert_gap_fill(
                &mut *tx,
                id,
                self.chain_id,
                sender.as_slice(),
                nonce,
            )
            .await?
            {
                continue;
            }
            store::attempt_insert(
                &mut *tx,
                &NewAttempt {
                    request_id: id,
                    attempt: 1,
                    nonce,
                    hash: hash.as_slice(),
                    raw: &raw,
                    max_fee: max_fee.to_string(),
                    priority_fee: tip.to_string(),
                    gas_limit: 21_000,
                },
            )
            .await?;
            tx.commit().await?;
            tracing::warn!(target: "keel::txq", %sender, nonce, "nonce gap filled with a zero-value self-transfer");
            metrics::nonce_gap_filled(self.chain_id);
            filled += 1;
        }
        Ok((adopted, filled))
    }
}
