//! The replacement stage: a `broadcast` request without a receipt is re-broadcast with
//! the same bytes when the node no longer knows it (a reorg dropped it), or replaced at
//! the same nonce with bumped fees when it is stuck.

use super::attempt::{Fees, TxBody, by_batches};
use super::{TxQueue, metrics};
use crate::store::{self, AttemptRow, NewAttempt, RequestRow};
use crate::{RequestState, Result, TxqError};
use alloy::eips::Encodable2718;
use alloy::primitives::B256;
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;

/// Requests without a receipt examined at once by the confirmation pass (each asks the
/// node whether it still knows an attempt, and may re-broadcast or replace it).
const UNMINED_IN_FLIGHT: usize = 16;

impl TxQueue {
    /// The unmined half of the confirmation pass: `unmined` are the `broadcast`
    /// requests without a receipt (of `in_flight`, every request in flight). Still known
    /// to the node: wait, or replace when stuck; dropped: re-broadcast the same bytes.
    /// Only each sender's lowest nonce may be replaced for being stuck, unless the others
    /// are underpriced, and none while a lower nonce of its sender is still `signed`.
    pub(super) async fn handle_unmined(
        &self,
        in_flight: &[RequestRow],
        unmined: Vec<(&RequestRow, &[AttemptRow])>,
        cancel: &CancellationToken,
    ) -> Result<()> {
        use futures::StreamExt;
        // Per sender, the lowest nonce that is still `signed` (never accepted by a
        // node): no later nonce of the sender is replaced while it is unsent.
        let mut lowest_unsent: HashMap<&[u8], i64> = HashMap::new();
        for req in in_flight.iter().filter(|r| r.state == RequestState::Signed) {
            if let Some(nonce) = req.nonce {
                let low = lowest_unsent
                    .entry(req.sender.0.as_slice())
                    .or_insert(nonce);
                *low = (*low).min(nonce);
            }
        }
        // Requests without a receipt: still known to the node (wait, or replace when
        // stuck), or dropped (re-broadcast the same bytes). Only each sender's lowest
        // nonce may be replaced for being stuck, unless the others are underpriced.
        let mut lowest: HashMap<&[u8], i64> = HashMap::new();
        for (req, _) in &unmined {
            if let Some(nonce) = req.nonce {
                let low = lowest.entry(req.sender.0.as_slice()).or_insert(nonce);
                *low = (*low).min(nonce);
            }
        }
        let blocked = |req: &RequestRow| {
            req.nonce.is_some_and(|n| {
                lowest_unsent
                    .get(req.sender.0.as_slice())
                    .is_some_and(|low| *low < n)
            })
        };
        // The market is read only when a sender has stuck requests above its lowest.
        let market = if unmined.iter().any(|(req, mine)| {
            lowest.get(req.sender.0.as_slice()) != req.nonce.as_ref()
                && !blocked(req)
                && self.stuck(req, mine)
        }) {
            Some(self.market().await?)
        } else {
            None
        };
        // Which attempts the node still knows, for all of them in JSON-RPC batches.
        let unmined_hashes: Vec<B256> = unmined
            .iter()
            .flat_map(|(_, mine)| mine.iter())
            .map(|a| a.tx_hash.0)
            .collect();
        let answers = by_batches(&unmined_hashes, |chunk| {
            self.chain.transactions_known(chunk)
        })
        .await?;
        let known_hashes: std::collections::HashSet<B256> = unmined_hashes
            .iter()
            .zip(answers)
            .filter_map(|(hash, known)| known.then_some(*hash))
            .collect();
        let checks: Vec<_> = unmined
            .into_iter()
            .map(|(req, mine)| {
                let is_lowest = req.nonce.is_some()
                    && lowest.get(req.sender.0.as_slice()) == req.nonce.as_ref();
                let underpriced = market.is_some_and(|m| {
                    mine.last().is_some_and(|a| {
                        a.max_fee_per_gas
                            .parse::<u128>()
                            .is_ok_and(|f| f < m.base_fee_per_gas)
                            || a.max_priority_fee_per_gas
                                .parse::<u128>()
                                .is_ok_and(|t| t < m.priority_fee_per_gas)
                    })
                });
                let known = mine.iter().any(|a| known_hashes.contains(&a.tx_hash.0));
                let may_replace = (is_lowest || underpriced) && !blocked(req);
                self.unmined(req, mine, known, may_replace, cancel)
            })
            .collect();
        let checked: Vec<Result<()>> = futures::stream::iter(checks)
            .buffer_unordered(UNMINED_IN_FLIGHT)
            .collect()
            .await;
        for r in checked {
            r?;
        }
        Ok(())
    }

    /// A `broadcast` request none of whose attempts has a receipt: re-broadcast the
    /// last attempt's bytes when the node knows none of them (`known` false: a reorg
    /// dropped it), or, when `may_replace`, replace it with bumped fees once it is
    /// older than `bump_after`. Nothing once `cancel` fired.
    async fn unmined(
        &self,
        req: &RequestRow,
        mine: &[AttemptRow],
        known: bool,
        may_replace: bool,
        cancel: &CancellationToken,
    ) -> Result<()> {
        let Some(last) = mine.last() else {
            return Ok(());
        };
        if cancel.is_cancelled() {
            return Ok(());
        }
        if !known {
            if !req.broadcast_due {
                // Its re-broadcasts keep failing: wait out the backoff (issue 32 §8).
                metrics::broadcasts_deferred(self.chain_id, 1);
                return Ok(());
            }
            tracing::warn!(target: "keel::txq", request = %req.id, "transaction unknown to the node (reorg?); re-broadcasting the same bytes");
            let _ = self.broadcast(req, last, mine, cancel).await?;
        } else if may_replace && self.stuck(req, mine) {
            self.replace(req, mine, cancel).await?;
        }
        Ok(())
    }

    /// Whether `req` is stuck: the last of its `attempts` has gone without a receipt
    /// for `bump_after` since it went out — since its broadcast, not its signature, so
    /// a transaction signed long before a backlog let it out is not replaced the moment
    /// it is sent — and no transaction of its sender has been newly included for as
    /// long (a sender whose transactions keep being included is moving through its
    /// nonces, and its lowest unmined one is next in line rather than stuck; this
    /// process's memory, so after a restart only the attempt's age counts). Never when
    /// fee bumping is off.
    fn stuck(&self, req: &RequestRow, attempts: &[AttemptRow]) -> bool {
        let Some(after) = self.config.bump_after else {
            return false;
        };
        let old = attempts
            .last()
            .is_some_and(|a| u128::try_from(a.age_ms).unwrap_or(0) >= after.as_millis());
        let moving = self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(req.sender.0.as_slice())
            .is_some_and(|(_, since)| since.elapsed() < after);
        old && !moving
    }

    /// Replaces a stuck transaction: a new attempt at the same nonce with both fees
    /// raised by at least `bump_percent` (and at least the market's current fees),
    /// capped by `max_fee_cap`; persisted before it is broadcast. Every attempt carries
    /// the request's calldata unchanged (so an attribution suffix appended by the
    /// caller is byte-identical on all of them).
    async fn replace(
        &self,
        req: &RequestRow,
        attempts: &[AttemptRow],
        cancel: &CancellationToken,
    ) -> Result<()> {
        let Some(last) = attempts.last() else {
            return Ok(());
        };
        let sender = req.sender.0;
        let Some(signer) = self.signers.get(&sender).cloned() else {
            return Ok(());
        };
        let parse = |s: &str| {
            s.parse::<u128>()
                .map_err(|_| TxqError::InvalidRequest("fee"))
        };
        let (prev_max, prev_tip) = (
            parse(&last.max_fee_per_gas)?,
            parse(&last.max_priority_fee_per_gas)?,
        );
        // At least +1 wei: a field at 0 (or so low that the percentage rounds to
        // nothing) must still rise, or the node refuses the replacement as underpriced.
        let bump = |v: u128| {
            super::attempt::percent_of(v, 100 + self.config.bump_percent).max(v.saturating_add(1))
        };
        let market = self.fees().await?;
        let (market_max, market_tip) = (market.max_fee_per_gas, market.max_priority_fee_per_gas);
        let tip = bump(prev_tip).max(market_tip);
        let max_fee = bump(prev_max)
            .max(market_max)
            .max(tip)
            .min(self.config.max_fee_cap);
        if max_fee < bump(prev_max) || tip > max_fee {
            tracing::warn!(target: "keel::txq", request = %req.id, "fee cap reached; not replacing");
            metrics::replacement_capped(self.chain_id);
            return Ok(());
        }
        let unsigned = TxBody::of(req)?.unsigned(
            self.config.fee_model,
            self.chain.chain().get(),
            u64::try_from(last.nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
            u64::try_from(last.gas_limit).map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
            Fees {
                max_fee_per_gas: max_fee,
                max_priority_fee_per_gas: tip,
            },
        )?;
        if cancel.is_cancelled() {
            return Ok(());
        }
        let mut tx = self.db.begin().await?;
        if !store::request_lock_broadcast(&mut *tx, req.id).await? {
            return Ok(());
        }
        let envelope = signer.sign(unsigned).await?;
        if cancel.is_cancelled() {
            // Rolled back: no attempt is recorded.
            return Ok(());
        }
        let hash = *envelope.tx_hash();
        let raw = envelope.encoded_2718();
        let attempt = last.attempt + 1;
        store::attempt_insert(
            &mut *tx,
            &NewAttempt {
                request_id: req.id,
                attempt,
                nonce: last.nonce,
                hash: hash.as_slice(),
                raw: &raw,
                max_fee: max_fee.to_string(),
                priority_fee: tip.to_string(),
                gas_limit: last.gas_limit,
            },
        )
        .await?;
        tx.commit().await?;
        metrics::replacement(self.chain_id);
        tracing::info!(target: "keel::txq", request = %req.id, attempt, "replacing a stuck transaction with bumped fees");
        let new = AttemptRow {
            request_id: req.id,
            attempt,
            nonce: last.nonce,
            tx_hash: keel_units::db::DbHash(hash),
            raw,
            max_fee_per_gas: max_fee.to_string(),
            max_priority_fee_per_gas: tip.to_string(),
            gas_limit: last.gas_limit,
            age_ms: 0,
        };
        let mut all = attempts.to_vec();
        all.push(new.clone());
        let _ = self.broadcast(req, &new, &all, cancel).await?;
        Ok(())
    }
}
