//! The shared floor of the stages: one broadcast and what the node said to it, the
//! record of failed broadcasts, fee and market reads, batched lookups, and the types
//! several stages hand each other (settling requests is [`super::settle`]).

use super::config::{FeeModel, PriorityFee};
use super::{TxQueue, metrics};
use crate::store::{self, AttemptRow, RequestRow};
use crate::verdict::{AttemptRecord, FailureCode, SettlementVerdict};
use crate::{RequestState, Result, TxqError};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::{Address, B256, Bytes, U256};
use keel_chain::{ChainError, NodeErrorKind};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Receipts fetched per JSON-RPC batch.
const RECEIPT_BATCH: usize = 100;

/// Receipt batches of the confirmation pass in flight at once.
const RECEIPT_BATCHES_IN_FLIGHT: usize = 4;

/// A request to broadcast: the request (as of signing or as read) and its attempts,
/// the last one being the one to send.
pub(super) type ToSend = (RequestRow, Vec<AttemptRow>);

/// The EIP-1559 fees of a transaction, wei per gas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fees {
    /// `maxFeePerGas`: the most the sender pays per gas, base fee and tip together.
    pub(super) max_fee_per_gas: u128,
    /// `maxPriorityFeePerGas`: the tip to the block producer, per gas.
    pub(super) max_priority_fee_per_gas: u128,
}

/// The fee market as read from the node, wei per gas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Market {
    /// The base fee of the latest block (0 under [`FeeModel::Legacy`]).
    pub(super) base_fee_per_gas: u128,
    /// EIP-1559: the tip from the model's source (at least its minimum); legacy: the
    /// node's `eth_gasPrice`.
    pub(super) priority_fee_per_gas: u128,
}

impl Market {
    /// The fees of a new transaction at this market under `model`: EIP-1559, the base
    /// fee × the multiplier + the tip, and the tip; legacy, the gas price × the
    /// multiplier in both fields (a legacy transaction has one fee, `gasPrice`, which
    /// is the max fee and the tip at once).
    pub(super) fn fees(self, model: FeeModel) -> Fees {
        match model {
            FeeModel::Eip1559 {
                base_fee_multiplier_percent,
                ..
            } => Fees {
                max_fee_per_gas: percent_of(self.base_fee_per_gas, base_fee_multiplier_percent)
                    .saturating_add(self.priority_fee_per_gas),
                max_priority_fee_per_gas: self.priority_fee_per_gas,
            },
            FeeModel::Legacy {
                gas_price_multiplier_percent,
            } => {
                let price = percent_of(self.priority_fee_per_gas, gas_price_multiplier_percent);
                Fees {
                    max_fee_per_gas: price,
                    max_priority_fee_per_gas: price,
                }
            }
        }
    }
}

/// `value × percent / 100`, rounded up, saturating.
pub(super) fn percent_of(value: u128, percent: u64) -> u128 {
    value.saturating_mul(u128::from(percent)).div_ceil(100)
}

/// A queued request ready for a nonce.
pub(super) struct ReadyTx {
    pub(super) id: Uuid,
    /// The queued row (turned into the `signed` row handed to the broadcaster).
    pub(super) row: RequestRow,
    /// What the transaction carries.
    pub(super) body: TxBody,
    pub(super) gas_limit: u64,
}

/// What a request's transaction carries, whatever its nonce, gas limit and fees.
#[derive(Debug, Clone)]
pub(super) struct TxBody {
    /// Recipient; `None` creates a contract.
    pub(super) to: Option<Address>,
    /// Native value, wei.
    pub(super) value: U256,
    /// Calldata.
    pub(super) data: Bytes,
    /// EIP-7702 authorizations; empty for an EIP-1559 transaction.
    pub(super) authorization_list: Vec<alloy::eips::eip7702::SignedAuthorization>,
}

impl TxBody {
    /// The body of a stored request.
    ///
    /// # Errors
    /// [`TxqError::InvalidRequest`] naming the stored column that does not decode.
    pub(super) fn of(row: &RequestRow) -> Result<Self> {
        Ok(Self {
            to: row.to_address.map(|a| a.0),
            value: row
                .value_wei
                .parse()
                .map_err(|_| TxqError::InvalidRequest("value"))?,
            data: Bytes::from(row.calldata.clone()),
            authorization_list: row.authorizations()?,
        })
    }

    /// The unsigned transaction at `nonce`: EIP-1559 (type 2), or EIP-7702 (type 4)
    /// when the body carries authorizations (EIP-7702 forbids contract creation:
    /// [`TxqError::InvalidRequest`]`("to")` then); under [`FeeModel::Legacy`] a legacy
    /// EIP-155 transaction (type 0) whose `gasPrice` is `fees.max_fee_per_gas`
    /// (authorizations: [`TxqError::InvalidRequest`]`("authorization_list")`).
    pub(super) fn unsigned(
        &self,
        model: FeeModel,
        chain_id: u64,
        nonce: u64,
        gas_limit: u64,
        fees: Fees,
    ) -> Result<alloy::consensus::TypedTransaction> {
        use alloy::consensus::{TxEip1559, TxEip7702, TxLegacy};
        use alloy::primitives::TxKind;
        if matches!(model, FeeModel::Legacy { .. }) {
            if !self.authorization_list.is_empty() {
                return Err(TxqError::InvalidRequest("authorization_list"));
            }
            return Ok(TxLegacy {
                chain_id: Some(chain_id),
                nonce,
                gas_price: fees.max_fee_per_gas,
                gas_limit,
                to: self.to.map_or(TxKind::Create, TxKind::Call),
                value: self.value,
                input: self.data.clone(),
            }
            .into());
        }
        if self.authorization_list.is_empty() {
            return Ok(TxEip1559 {
                chain_id,
                nonce,
                gas_limit,
                max_fee_per_gas: fees.max_fee_per_gas,
                max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
                to: self.to.map_or(TxKind::Create, TxKind::Call),
                value: self.value,
                access_list: Default::default(),
                input: self.data.clone(),
            }
            .into());
        }
        let to = self.to.ok_or(TxqError::InvalidRequest("to"))?;
        Ok(TxEip7702 {
            chain_id,
            nonce,
            gas_limit,
            max_fee_per_gas: fees.max_fee_per_gas,
            max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
            to,
            value: self.value,
            access_list: Default::default(),
            authorization_list: self.authorization_list.clone(),
            input: self.data.clone(),
        }
        .into())
    }
}

pub(super) enum Broadcast {
    Accepted,
    /// Not accepted; the request stays in flight for another try. With the error class
    /// when the broadcast failed ([`error_class`]); `None` when nothing was sent.
    Retry(Option<&'static str>),
    Settled,
    /// Another transaction took the nonce for good: the request was re-signed at a
    /// fresh nonce (persisted, `signed`); the next round broadcasts the new attempt.
    Resigned,
}

impl Broadcast {
    /// The outcome of a broadcast whose answer settles the request: `Settled`, or, when
    /// the settle rolled back (`settled` false: the settlement sink failed), a retry
    /// without a failure to record (the same bytes go out next pass and get the same
    /// answer).
    pub(super) fn settled(settled: bool) -> Self {
        if settled {
            Broadcast::Settled
        } else {
            Broadcast::Retry(None)
        }
    }
}

/// An attempt a node accepted: its request, hash and nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Accepted {
    pub(super) request_id: Uuid,
    pub(super) hash: B256,
    pub(super) nonce: u64,
}

/// A stored nonce (`BIGINT`, `CHECK >= 0`) as the `u64` it stands for; a negative one
/// is an unreadable row of `table`, never nonce 0.
pub(super) fn stored_nonce(nonce: i64, table: &'static str) -> Result<u64> {
    u64::try_from(nonce).map_err(|_| TxqError::UnreadableRow { table })
}

impl Accepted {
    /// The accepted `attempt` of request `request_id`.
    ///
    /// # Errors
    /// [`TxqError::UnreadableRow`] when the stored nonce is negative.
    pub(super) fn of(request_id: Uuid, attempt: &AttemptRow) -> Result<Self> {
        Ok(Self {
            request_id,
            hash: attempt.tx_hash.0,
            nonce: stored_nonce(attempt.nonce, "txq_attempt")?,
        })
    }
}

/// The bounded error class of a failed broadcast (a metric label and the value of
/// `txq_request.last_broadcast_error`): the node error kind when a node answered,
/// `unavailable` when no upstream answered.
pub(super) fn error_class(e: &ChainError) -> &'static str {
    match e {
        ChainError::Node { error, .. } => error.kind.as_str(),
        ChainError::Unavailable { .. } => "unavailable",
        _ => "other",
    }
}

/// At most one WARN per error class per this long about failed broadcasts (the others
/// are counted and reported with the next one).
const BROADCAST_WARN_EVERY: Duration = Duration::from_secs(30);

/// Per error class, one log line at most every `every`, carrying the failures counted
/// since the previous line.
#[derive(Debug, Default)]
pub(super) struct WarnLimiter {
    /// Per class: when a line was last due, and the failures counted since.
    classes: HashMap<&'static str, (Option<std::time::Instant>, u64)>,
}

impl WarnLimiter {
    /// Counts `n` failures of `class` at `now`; returns how many to report when a line
    /// is due (the first failure of a class is reported at once).
    fn count(
        &mut self,
        class: &'static str,
        n: u64,
        now: std::time::Instant,
        every: Duration,
    ) -> Option<u64> {
        let (last, since) = self.classes.entry(class).or_insert((None, 0));
        *since += n;
        if last.is_none_or(|t| now.duration_since(t) >= every) {
            *last = Some(now);
            Some(std::mem::take(since))
        } else {
            None
        }
    }
}

/// One sender's part of a round: the next nonce as read with its queued requests, and
/// those prepared for signing, in queue order.
pub(super) struct SenderPlan {
    pub(super) sender: Address,
    pub(super) first: i64,
    pub(super) ready: Vec<ReadyTx>,
    /// A signature failed or a commit found the nonce moved: nothing more this round
    /// (atomic: set by the commit half while the signing half reads it).
    pub(super) failed: std::sync::atomic::AtomicBool,
}

/// `fetch` over `hashes` in JSON-RPC batches of [`RECEIPT_BATCH`] (providers cap batch
/// sizes), [`RECEIPT_BATCHES_IN_FLIGHT`] at once; one answer per hash, in order.
pub(super) async fn by_batches<'a, T, F, Fut>(hashes: &'a [B256], fetch: F) -> Result<Vec<T>>
where
    F: Fn(&'a [B256]) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<Vec<T>, ChainError>>,
{
    use futures::StreamExt;
    let batches: Vec<_> = hashes.chunks(RECEIPT_BATCH).map(fetch).collect();
    let fetched: Vec<_> = futures::stream::iter(batches)
        .buffered(RECEIPT_BATCHES_IN_FLIGHT)
        .collect()
        .await;
    let mut out = Vec::with_capacity(hashes.len());
    for batch in fetched {
        out.extend(batch?);
    }
    Ok(out)
}

pub(super) fn failed(code: FailureCode, attempts: Vec<AttemptRecord>) -> SettlementVerdict {
    SettlementVerdict::Failed {
        code,
        reason: None,
        revert_data: None,
        attempts,
    }
}

/// The verdict's record of each attempt.
///
/// # Errors
/// [`TxqError::UnreadableRow`] when a stored nonce is negative.
pub(super) fn attempt_records(rows: &[AttemptRow]) -> Result<Vec<AttemptRecord>> {
    rows.iter()
        .map(|a| {
            Ok(AttemptRecord {
                attempt: a.attempt,
                nonce: stored_nonce(a.nonce, "txq_attempt")?,
                hash: a.tx_hash.0,
            })
        })
        .collect()
}

impl TxQueue {
    /// The fees of a new transaction under the queue's [`FeeModel`] (see
    /// [`Market::fees`]).
    pub(super) async fn fees(&self) -> Result<Fees> {
        Ok(self.market().await?.fees(self.config.fee_model))
    }

    /// The market under the queue's [`FeeModel`]: EIP-1559, the latest block's base
    /// fee and the tip from the model's source (at least its minimum); legacy, no base
    /// fee and the node's `eth_gasPrice`.
    pub(super) async fn market(&self) -> Result<Market> {
        let wide = |v: U256| u128::try_from(v).unwrap_or(u128::MAX);
        let (priority_fee, min_tip) = match self.config.fee_model {
            FeeModel::Legacy { .. } => {
                let price = wide(self.chain.gas_price().await?.wei_per_gas);
                return Ok(Market {
                    base_fee_per_gas: 0,
                    priority_fee_per_gas: price,
                });
            }
            FeeModel::Eip1559 {
                priority_fee,
                min_priority_fee_per_gas,
                ..
            } => (priority_fee, min_priority_fee_per_gas),
        };
        let base = self
            .chain
            .header(BlockNumberOrTag::Latest)
            .await?
            .and_then(|h| h.base_fee_per_gas)
            .map_or(0, |fee| wide(fee.wei_per_gas));
        let tip = match priority_fee {
            PriorityFee::Node => wide(self.chain.max_priority_fee().await?.wei_per_gas),
            PriorityFee::Fixed(tip) => tip,
            PriorityFee::FeeHistory { blocks, percentile } => wide(
                self.chain
                    .fee_history_tip(blocks, f64::from(percentile))
                    .await?
                    .wei_per_gas,
            ),
        };
        Ok(Market {
            base_fee_per_gas: base,
            priority_fee_per_gas: tip.max(min_tip),
        })
    }

    /// The L1 data fee of `body`'s transaction at `fees` and `gas_limit`, wei, counted
    /// with [`crate::L1DataFee::multiplier_percent`]; 0 on a chain without one. The
    /// oracle prices the unsigned transaction's bytes (the nonce here is a 4-byte
    /// placeholder, at least as long as any nonce the sender will reach).
    ///
    /// # Errors
    /// [`TxqError::L1FeeUnreadable`] when the oracle answers nothing decodable (no code
    /// at its address); [`TxqError::Chain`] when the call fails.
    pub(super) async fn l1_fee(&self, body: &TxBody, gas_limit: u64, fees: Fees) -> Result<U256> {
        use alloy::consensus::SignableTransaction;
        use alloy::sol_types::SolCall;
        let Some(l1) = self.config.l1_data_fee else {
            return Ok(U256::ZERO);
        };
        alloy::sol! {
            function getL1Fee(bytes _data) external view returns (uint256);
        }
        let unsigned = body.unsigned(
            self.config.fee_model,
            self.chain.chain().get(),
            u64::from(u32::MAX),
            gas_limit,
            fees,
        )?;
        let call = alloy::rpc::types::TransactionRequest {
            to: Some(alloy::primitives::TxKind::Call(l1.oracle)),
            input: Bytes::from(
                getL1FeeCall {
                    _data: unsigned.encoded_for_signing().into(),
                }
                .abi_encode(),
            )
            .into(),
            ..Default::default()
        };
        let out = self.chain.call(&call, BlockNumberOrTag::Latest).await?;
        let fee = getL1FeeCall::abi_decode_returns(&out).map_err(|_| TxqError::L1FeeUnreadable)?;
        Ok(fee
            .saturating_mul(U256::from(l1.multiplier_percent))
            .div_ceil(U256::from(100)))
    }

    /// Broadcasts `attempt`'s bytes and records what the node said (nothing once
    /// `cancel` fired).
    pub(super) async fn broadcast(
        &self,
        req: &RequestRow,
        attempt: &AttemptRow,
        all: &[AttemptRow],
        cancel: &CancellationToken,
    ) -> Result<Broadcast> {
        if cancel.is_cancelled() {
            return Ok(Broadcast::Retry(None));
        }
        let sent = self.send(req, attempt, all).await?;
        if cancel.is_cancelled() {
            return Ok(sent);
        }
        if let Broadcast::Retry(Some(class)) = sent {
            self.broadcast_failed(&[(req.id, class)]).await?;
        }
        if matches!(sent, Broadcast::Accepted) {
            let marked = self
                .mark_broadcast(&[Accepted::of(req.id, attempt)?])
                .await?;
            metrics::time_to_broadcast(self.chain_id, &marked);
            metrics::broadcasts(self.chain_id, 1);
        }
        Ok(sent)
    }

    /// Sends `attempt`'s bytes and handles what the node said, except recording an
    /// acceptance (the caller marks [`Broadcast::Accepted`] requests `broadcast`).
    pub(super) async fn send(
        &self,
        req: &RequestRow,
        attempt: &AttemptRow,
        all: &[AttemptRow],
    ) -> Result<Broadcast> {
        let raw = Bytes::from(attempt.raw.clone());
        let sent = self.chain.send_raw_transaction(&raw).await;
        self.sent(req, all, sent).await
    }

    /// Handles what the node said to a broadcast of `attempt` (see [`TxQueue::send`]).
    pub(super) async fn sent(
        &self,
        req: &RequestRow,
        all: &[AttemptRow],
        sent: std::result::Result<B256, ChainError>,
    ) -> Result<Broadcast> {
        match sent {
            Ok(_) => {}
            Err(ChainError::Node { error, .. }) => match error.kind {
                NodeErrorKind::AlreadyKnown => {}
                NodeErrorKind::NonceTooLow => {
                    // Ours mined (or known) means success. Otherwise another transaction
                    // took the nonce: once that is final (no attempt of ours can ever
                    // be mined) the request is re-signed at a fresh nonce; until then
                    // it stays in flight as a failed broadcast, which the confirmation
                    // pass reconciles (issue 32 §3, `resign.rs`).
                    if !self.any_attempt_known(all).await? {
                        if self.nonce_taken_for_good(req, all).await? {
                            return Ok(if self.resign(req, all).await? {
                                Broadcast::Resigned
                            } else {
                                Broadcast::Retry(None)
                            });
                        }
                        return Ok(Broadcast::Retry(Some(error.kind.as_str())));
                    }
                }
                NodeErrorKind::InsufficientFunds => {
                    if req.state == RequestState::Broadcast {
                        // An earlier attempt was accepted (this is a replacement or a
                        // re-broadcast): it may still mine, so the request stays in
                        // flight and the confirmation pass keeps watching it.
                        tracing::warn!(target: "keel::txq", request = %req.id, "node refused an attempt for insufficient funds; an earlier attempt stays in flight");
                        return Ok(Broadcast::Retry(Some(error.kind.as_str())));
                    }
                    if req.funding_pause_ms.is_some() {
                        // Signed after the queue's own balance check (the funds may not
                        // have reached this node yet): bounded retries, same bytes.
                        let refusals = store::request_funding_refused(&self.db, req.id).await?;
                        if u32::try_from(refusals).unwrap_or(u32::MAX)
                            <= self.config.funding_broadcast_retries
                        {
                            tracing::warn!(target: "keel::txq", request = %req.id, refusals, "broadcast refused for insufficient funds; retrying next pass");
                            return Ok(Broadcast::Retry(Some(error.kind.as_str())));
                        }
                    }
                    // The nonce is left unused; nonce recovery fills the gap.
                    let verdict = failed(FailureCode::GasRequired, attempt_records(all)?);
                    return Ok(Broadcast::settled(self.settle(req.id, &verdict).await?));
                }
                NodeErrorKind::IntrinsicGasTooLow | NodeErrorKind::ExceedsBlockGasLimit => {
                    let code = if error.kind == NodeErrorKind::IntrinsicGasTooLow {
                        FailureCode::IntrinsicGasTooLow
                    } else {
                        FailureCode::ExceedsBlockGasLimit
                    };
                    let verdict = failed(code, attempt_records(all)?);
                    // The verdict and the nonce's hand-back in one transaction: nothing
                    // sees the request failed while its nonce is still taken.
                    let release = refused_nonce(req, all);
                    let settled = self.settle_releasing(req.id, &verdict, release).await?;
                    return Ok(Broadcast::settled(settled));
                }
                // Not final for the request (the pool already asked every upstream
                // when the answer was not a node's verdict): the same bytes go out
                // again next pass, and the confirmation pass reconciles the request by
                // receipt and chain nonce meanwhile.
                kind => return Ok(Broadcast::Retry(Some(kind.as_str()))),
            },
            Err(e) => {
                tracing::debug!(target: "keel::txq", error = %e, "broadcast failed; the same bytes go out next pass");
                return Ok(Broadcast::Retry(Some(error_class(&e))));
            }
        }
        Ok(Broadcast::Accepted)
    }

    /// Records failed broadcasts (request, error class): the class, time and count on
    /// each request (one statement), `keel_txq_broadcast_failures_total{chain_id,
    /// class}`, and a WARN per class at most every [`BROADCAST_WARN_EVERY`] with the
    /// number of failures since the last one.
    pub(super) async fn broadcast_failed(&self, failures: &[(Uuid, &'static str)]) -> Result<()> {
        if failures.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = failures.iter().map(|f| f.0).collect();
        let classes: Vec<&str> = failures.iter().map(|f| f.1).collect();
        let mut by_class: HashMap<&'static str, (u64, Uuid)> = HashMap::new();
        for &(id, class) in failures {
            by_class.entry(class).or_insert((0, id)).0 += 1;
        }
        let mut to_log = Vec::new();
        {
            let mut warned = self
                .warned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = std::time::Instant::now();
            for (&class, &(n, example)) in &by_class {
                metrics::broadcast_failures(self.chain_id, class, n);
                if let Some(since) = warned.count(class, n, now, BROADCAST_WARN_EVERY) {
                    to_log.push((class, since, example));
                }
            }
        }
        for (class, failures, example) in to_log {
            tracing::warn!(target: "keel::txq", chain_id = self.chain_id, class, failures, example_request = %example,
                "broadcasts keep failing; the same bytes go out again and the requests are reconciled by receipt and chain nonce");
        }
        store::requests_broadcast_failed(&self.db, &ids, &classes).await
    }

    pub(super) async fn any_attempt_known(&self, attempts: &[AttemptRow]) -> Result<bool> {
        for a in attempts {
            let hash = a.tx_hash.0;
            if self.chain.transaction_known(hash).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// The sender and nonce a refused `signed` request may hand back: all its attempts at
/// one nonce and no node ever accepted any of them (its state is still `signed`).
fn refused_nonce<'r>(req: &'r RequestRow, all: &[AttemptRow]) -> Option<(&'r [u8], i64)> {
    let nonce = req.nonce?;
    (req.state == RequestState::Signed && all.iter().all(|a| a.nonce == nonce))
        .then_some((req.sender.0.as_slice(), nonce))
}

#[cfg(test)]
mod tests {
    use super::WarnLimiter;
    use std::time::{Duration, Instant};

    #[test]
    fn failed_broadcasts_are_logged_once_per_class_and_interval_with_the_count() {
        let mut w = WarnLimiter::default();
        let every = Duration::from_secs(30);
        let t0 = Instant::now();
        assert_eq!(w.count("internal", 1, t0, every), Some(1), "first: at once");
        assert_eq!(
            w.count("internal", 3, t0 + Duration::from_secs(1), every),
            None
        );
        assert_eq!(
            w.count("unavailable", 2, t0 + Duration::from_secs(2), every),
            Some(2),
            "classes are limited separately"
        );
        assert_eq!(
            w.count("internal", 1, t0 + Duration::from_secs(29), every),
            None
        );
        assert_eq!(
            w.count("internal", 1, t0 + Duration::from_secs(30), every),
            Some(5),
            "the line carries the failures since the previous one"
        );
        assert_eq!(
            w.count("internal", 1, t0 + Duration::from_secs(31), every),
            None
        );
    }
}
