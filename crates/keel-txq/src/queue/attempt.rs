//! The shared floor of the stages: one broadcast and what the node said to it, the
//! record of failed broadcasts, settling requests, fee and market reads, batched
//! lookups, and the types several stages hand each other.

use super::{TxQueue, metrics};
use crate::progress::{Progress, ProgressSink, ProgressSinkError};
use crate::settlement::{Settled, SettlementSinkError};
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
    /// The base fee of the latest block.
    pub(super) base_fee_per_gas: u128,
    /// The node's tip suggestion (`eth_maxPriorityFeePerGas`).
    pub(super) priority_fee_per_gas: u128,
}

impl Market {
    /// The fees of a new transaction at this market: twice the base fee plus the tip,
    /// and the tip.
    pub(super) fn fees(self) -> Fees {
        Fees {
            max_fee_per_gas: self
                .base_fee_per_gas
                .saturating_mul(2)
                .saturating_add(self.priority_fee_per_gas),
            max_priority_fee_per_gas: self.priority_fee_per_gas,
        }
    }
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
    /// [`TxqError::InvalidRequest`]`("to")` then).
    pub(super) fn unsigned(
        &self,
        chain_id: u64,
        nonce: u64,
        gas_limit: u64,
        fees: Fees,
    ) -> Result<alloy::consensus::TypedTransaction> {
        use alloy::consensus::{TxEip1559, TxEip7702};
        use alloy::primitives::TxKind;
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
    /// The fees of a new transaction (EIP-1559): twice the latest base fee plus the
    /// node's tip suggestion, and that tip.
    pub(super) async fn fees(&self) -> Result<Fees> {
        Ok(self.market().await?.fees())
    }

    /// The base fee of the latest block and the node's tip suggestion.
    pub(super) async fn market(&self) -> Result<Market> {
        let base = self
            .chain
            .header(BlockNumberOrTag::Latest)
            .await?
            .and_then(|h| h.base_fee_per_gas)
            .map_or(0, |fee| {
                u128::try_from(fee.wei_per_gas).unwrap_or(u128::MAX)
            });
        let tip = self.chain.max_priority_fee().await?.wei_per_gas;
        let tip = u128::try_from(tip).unwrap_or(u128::MAX);
        Ok(Market {
            base_fee_per_gas: base,
            priority_fee_per_gas: tip,
        })
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

    /// Settles one request with `verdict` (and hands it to the settlement sink in the
    /// same transaction, when one is set); metrics and a log line when it moved. Returns
    /// false when the sink failed (rolled back: the request keeps its state and a later
    /// pass settles it again), true otherwise (settled now, or settled already: a settled
    /// verdict is never overwritten).
    pub(super) async fn settle(&self, id: Uuid, verdict: &SettlementVerdict) -> Result<bool> {
        self.settle_releasing(id, verdict, None).await
    }

    /// [`Self::settle`], and with `release` (the sender and nonce of a request no node
    /// ever accepted, refused for good) its nonce handed back in the same transaction
    /// when nothing above it is signed ([`store::sender_release_nonce`], issue 33 §1):
    /// the next request takes it and no gap-filling self-transfer is needed. Otherwise
    /// nonce recovery fills the gap.
    pub(super) async fn settle_releasing(
        &self,
        id: Uuid,
        verdict: &SettlementVerdict,
        release: Option<(&[u8], i64)>,
    ) -> Result<bool> {
        let json =
            serde_json::to_value(verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
        let row = match (&self.sink, release) {
            (None, None) => store::request_settle(&self.db, id, &json, verdict.kind()).await?,
            (sink, _) => {
                let mut tx = self.db.begin().await?;
                let row = store::request_settle(&mut *tx, id, &json, verdict.kind()).await?;
                if let (Some(_), Some((sender, nonce))) = (&row, release)
                    && store::sender_release_nonce(&mut *tx, self.chain_id, sender, nonce).await?
                {
                    tracing::info!(target: "keel::txq", request = %id, nonce, "refused request's nonce handed back; no gap to fill");
                }
                if let (Some(r), Some(sink)) = (&row, sink) {
                    let settled = [Settled {
                        request_id: id,
                        idempotency_key: &r.idempotency_key,
                        verdict,
                    }];
                    if let Err(e) = sink.record(&mut tx, &settled).await {
                        self.sink_failed(&e, 1);
                        return Ok(false);
                    }
                }
                tx.commit().await?;
                row
            }
        };
        if let Some(r) = row {
            metrics::verdicts(self.chain_id, verdict.kind(), 1);
            if !matches!(verdict, SettlementVerdict::Failed { .. }) {
                metrics::time_to_confirmation(self.chain_id, r.secs);
            }
            tracing::info!(target: "keel::txq", request = %id, verdict = verdict.kind(), "request settled");
        }
        Ok(true)
    }

    /// Settles a `waiting_funding` request past its deadline with `verdict` (and hands
    /// it to the settlement sink in the same transaction, when one is set). Returns
    /// whether it moved: false when it is not waiting any more, its deadline has not
    /// passed, or the sink failed (rolled back; a later check settles it again).
    pub(super) async fn settle_expired(
        &self,
        id: Uuid,
        verdict: &SettlementVerdict,
    ) -> Result<bool> {
        let json =
            serde_json::to_value(verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
        let moved = match &self.sink {
            None => store::request_expire_funding(&self.db, id, &json, verdict.kind())
                .await?
                .is_some(),
            Some(sink) => {
                let mut tx = self.db.begin().await?;
                let Some(key) =
                    store::request_expire_funding(&mut *tx, id, &json, verdict.kind()).await?
                else {
                    return Ok(false);
                };
                let settled = [Settled {
                    request_id: id,
                    idempotency_key: &key,
                    verdict,
                }];
                if let Err(e) = sink.record(&mut tx, &settled).await {
                    self.sink_failed(&e, 1);
                    return Ok(false);
                }
                tx.commit().await?;
                true
            }
        };
        if moved {
            metrics::verdicts(self.chain_id, verdict.kind(), 1);
        }
        Ok(moved)
    }

    /// Marks the requests of `accepted` `broadcast` (those still `signed`: a first
    /// broadcast) and, with a progress sink, hands the ones that moved to it in the same
    /// transaction. When the sink fails, each request is marked in its own transaction
    /// with the sink, and one it still refuses without the sink (see `crate::progress`).
    /// Returns, per request that moved, the seconds since enqueue.
    pub(super) async fn mark_broadcast(&self, accepted: &[Accepted]) -> Result<Vec<f64>> {
        if accepted.is_empty() {
            return Ok(Vec::new());
        }
        let Some(sink) = &self.progress_sink else {
            let ids: Vec<Uuid> = accepted.iter().map(|a| a.request_id).collect();
            let rows = store::requests_mark_broadcast_many(&self.db, &ids).await?;
            return Ok(rows.iter().map(|r| r.secs).collect());
        };
        match self.mark_broadcast_with(sink.as_ref(), accepted).await? {
            Ok(secs) => Ok(secs),
            Err(e) => {
                self.progress_sink_failed(&e, "broadcast", accepted.len());
                let mut secs = Vec::new();
                for a in accepted {
                    if accepted.len() > 1 {
                        match self
                            .mark_broadcast_with(sink.as_ref(), std::slice::from_ref(a))
                            .await?
                        {
                            Ok(s) => {
                                secs.extend(s);
                                continue;
                            }
                            Err(e) => self.progress_sink_failed(&e, "broadcast", 1),
                        }
                    }
                    let rows =
                        store::requests_mark_broadcast_many(&self.db, &[a.request_id]).await?;
                    secs.extend(rows.iter().map(|r| r.secs));
                }
                Ok(secs)
            }
        }
    }

    /// One marking statement for `accepted` and the progress sink call on the rows that
    /// moved, in one transaction. `Ok(Err(_))`: the sink failed, nothing was marked.
    async fn mark_broadcast_with(
        &self,
        sink: &dyn ProgressSink,
        accepted: &[Accepted],
    ) -> Result<std::result::Result<Vec<f64>, ProgressSinkError>> {
        let ids: Vec<Uuid> = accepted.iter().map(|a| a.request_id).collect();
        let mut tx = self.db.begin().await?;
        let rows = store::requests_mark_broadcast_many(&mut *tx, &ids).await?;
        if !rows.is_empty() {
            let progress: Vec<Progress<'_>> = rows
                .iter()
                .filter_map(|r| {
                    let a = accepted.iter().find(|a| a.request_id == r.id)?;
                    Some(Progress::Broadcast {
                        request_id: r.id,
                        idempotency_key: &r.idempotency_key,
                        hash: a.hash,
                        nonce: a.nonce,
                    })
                })
                .collect();
            if let Err(e) = sink.record(&mut tx, &progress).await {
                return Ok(Err(e));
            }
        }
        tx.commit().await?;
        Ok(Ok(rows.iter().map(|r| r.secs).collect()))
    }

    /// Moves queued request `req` to `waiting_funding` with its funding request
    /// (`required_wei` from `sender`'s shortfall) and, with a progress sink, hands the
    /// opened request to it in the same transaction; when the sink fails, the move is
    /// made without it (see `crate::progress`). False when the request was not moved
    /// (no longer queued, or without a funding pause).
    pub(super) async fn open_funding(
        &self,
        req: &RequestRow,
        required_wei: alloy::primitives::U256,
        gas_limit: i64,
        max_fee_wei: &str,
    ) -> Result<bool> {
        let required = required_wei.to_string();
        if let Some(sink) = &self.progress_sink {
            let mut tx = self.db.begin().await?;
            let Some((key, deadline)) =
                store::request_wait_funding(&mut *tx, req.id, &required, gas_limit, max_fee_wei)
                    .await?
            else {
                return Ok(false);
            };
            let progress = [Progress::FundingRequested {
                request_id: req.id,
                idempotency_key: &key,
                address: req.sender.0,
                required_wei: keel_units::Wei::new(required_wei),
                deadline,
            }];
            match sink.record(&mut tx, &progress).await {
                Ok(()) => {
                    tx.commit().await?;
                    return Ok(true);
                }
                Err(e) => {
                    drop(tx);
                    self.progress_sink_failed(&e, "funding", 1);
                }
            }
        }
        Ok(
            store::request_wait_funding(&self.db, req.id, &required, gas_limit, max_fee_wei)
                .await?
                .is_some(),
        )
    }

    /// Updates the shortfall (`required_wei`) of `w`, still `waiting_funding`, and, with a
    /// progress sink, offers the open funding request to it again in the same
    /// transaction. The sink reports only what its operation has not reported yet, so
    /// this is a no-op once reported; a funding wait whose first report failed, or that
    /// the sink could not yet see as the operation's wait, is reported on the next
    /// funding check instead of only with the operation's next change. When the sink
    /// fails, the shortfall is updated without it.
    pub(super) async fn keep_waiting(
        &self,
        w: &store::FundingRow,
        required_wei: alloy::primitives::U256,
        max_fee_wei: u128,
    ) -> Result<()> {
        let required = required_wei.to_string();
        let max_fee = max_fee_wei.to_string();
        if let Some(sink) = &self.progress_sink {
            let mut tx = self.db.begin().await?;
            store::request_update_funding(&mut *tx, w.id, &required, &max_fee).await?;
            let progress = [Progress::FundingRequested {
                request_id: w.id,
                idempotency_key: &w.idempotency_key,
                address: w.sender.0,
                required_wei: keel_units::Wei::new(required_wei),
                deadline: w.funding_deadline,
            }];
            match sink.record(&mut tx, &progress).await {
                Ok(()) => {
                    tx.commit().await?;
                    return Ok(());
                }
                Err(e) => {
                    drop(tx);
                    self.progress_sink_failed(&e, "funding", 1);
                }
            }
        }
        store::request_update_funding(&self.db, w.id, &required, &max_fee).await
    }

    /// Records a failed progress sink call (its transaction rolled back): the metric and
    /// a WARN.
    fn progress_sink_failed(&self, e: &ProgressSinkError, change: &'static str, requests: usize) {
        metrics::progress_sink_failures(self.chain_id, change);
        tracing::warn!(target: "keel::txq", chain_id = self.chain_id, change, requests, error = %e,
            error_source = ?std::error::Error::source(e), "progress sink failed; recording the change again");
    }

    /// Records a failed settlement sink call (its transaction rolled back): the metric,
    /// and a WARN with the number of requests left unsettled.
    pub(super) fn sink_failed(&self, e: &SettlementSinkError, requests: usize) {
        metrics::settlement_sink_failures(self.chain_id);
        tracing::warn!(target: "keel::txq", chain_id = self.chain_id, requests, error = %e,
            error_source = ?std::error::Error::source(e), "settlement sink failed; the requests stay unsettled and settle on a later pass");
    }

    /// Settles many requests in one statement (and, with a settlement sink, hands the
    /// ones that moved to it in the same transaction); metrics and logs for the ones that
    /// moved (a request settled already keeps its verdict and is not counted again).
    /// When the sink fails for the batch, each request is settled in its own transaction
    /// at once, so one the sink refuses does not hold back the others (it stays unsettled
    /// for a later pass). Returns how many moved.
    pub(super) async fn settle_many(
        &self,
        verdicts: &[(Uuid, SettlementVerdict)],
    ) -> Result<usize> {
        if verdicts.is_empty() {
            return Ok(0);
        }
        let mut rows = match self.settle_batch(verdicts).await? {
            Ok(rows) => rows,
            Err(e) if verdicts.len() == 1 => {
                self.sink_failed(&e, 1);
                Vec::new()
            }
            Err(e) => {
                self.sink_failed(&e, verdicts.len());
                let mut rows = Vec::new();
                for v in verdicts {
                    match self.settle_batch(std::slice::from_ref(v)).await? {
                        Ok(moved) => rows.extend(moved),
                        Err(e) => self.sink_failed(&e, 1),
                    }
                }
                rows
            }
        };
        let kinds: Vec<&'static str> = verdicts.iter().map(|(_, v)| v.kind()).collect();
        for r in &mut rows {
            let kind = kinds
                .iter()
                .find(|k| **k == r.kind)
                .copied()
                .unwrap_or("failed");
            metrics::verdicts(self.chain_id, kind, 1);
            if kind != "failed" {
                metrics::time_to_confirmation(self.chain_id, r.secs);
            }
            tracing::info!(target: "keel::txq", request = %r.id, verdict = kind, "request settled");
        }
        Ok(rows.len())
    }

    /// One settling statement for `verdicts` and, with a settlement sink, the sink call
    /// on the rows that moved, in one transaction. `Ok(Err(_))`: the sink failed and
    /// the transaction rolled back (nothing settled).
    async fn settle_batch(
        &self,
        verdicts: &[(Uuid, SettlementVerdict)],
    ) -> Result<std::result::Result<Vec<store::SettledRow>, SettlementSinkError>> {
        let mut ids = Vec::with_capacity(verdicts.len());
        let mut json = Vec::with_capacity(verdicts.len());
        let mut kinds = Vec::with_capacity(verdicts.len());
        for (id, v) in verdicts {
            ids.push(*id);
            json.push(serde_json::to_string(v).map_err(|_| TxqError::InvalidRequest("verdict"))?);
            kinds.push(v.kind());
        }
        let Some(sink) = &self.sink else {
            return Ok(Ok(store::requests_settle_many(
                &self.db, &ids, &json, &kinds,
            )
            .await?));
        };
        let mut tx = self.db.begin().await?;
        let rows = store::requests_settle_many(&mut *tx, &ids, &json, &kinds).await?;
        if !rows.is_empty() {
            let by_id: HashMap<Uuid, &SettlementVerdict> =
                verdicts.iter().map(|(id, v)| (*id, v)).collect();
            let settled: Vec<Settled<'_>> = rows
                .iter()
                .filter_map(|r| {
                    by_id.get(&r.id).map(|v| Settled {
                        request_id: r.id,
                        idempotency_key: &r.idempotency_key,
                        verdict: v,
                    })
                })
                .collect();
            if let Err(e) = sink.record(&mut tx, &settled).await {
                return Ok(Err(e));
            }
        }
        tx.commit().await?;
        Ok(Ok(rows))
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
