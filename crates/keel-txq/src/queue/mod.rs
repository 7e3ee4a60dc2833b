//! The queue: its configuration and public entry points (enqueue, status, the passes,
//! [`TxQueue::run`]) and the orchestration of a round. The stages live in the
//! submodules, each using only this module, [`attempt`] and [`settle`] (the shared floor) and
//! [`metrics`], never another stage:
//!
//! | module | stage |
//! |---|---|
//! | [`config`] | the queue's settings and finality rule |
//! | [`enqueue`] | validating and recording requests (the enqueue combiner, or the caller's transaction) |
//! | [`prepare`] | sender rows, funding checks, gas estimates and funds before a nonce |
//! | [`sign`] | signing groups across senders and their one-statement commit |
//! | [`broadcast`] | the batched broadcast of `signed` requests |
//! | [`confirm`] | receipts, settling at the confirmation depth, unsent reconciliation |
//! | [`replace`] | re-broadcast of dropped and fee-bumped replacement of stuck transactions |
//! | [`recover`] | nonce adoption and gap filling |
//! | [`attempt`] | shared floor: one send and what the node said, fee reads, batched lookups |
//! | [`settle`] | shared floor: settling one or many requests (with the sinks), marking broadcasts, funding waits |
//! | [`metrics`] | every metric of the queue |
//!
//! [`service`] holds the long-running loops of [`TxQueue::run`] on the shared
//! background-service shape ([`keel_service`]): the sender rounds and the confirmation
//! pass. It uses this module only.

mod attempt;
mod broadcast;
mod config;
mod confirm;
mod custody;
mod enqueue;
pub(crate) mod metrics;
mod prepare;
mod recover;
mod replace;
mod resign;
mod service;
mod settle;
mod sign;
mod trace;
mod watch;

pub use self::config::{FeeModel, Finality, L1DataFee, PriorityFee, TxQueueConfig};
pub use self::enqueue::{EnqueueOptions, TxRequest};

use self::attempt::{ToSend, WarnLimiter};
use self::broadcast::BROADCAST_CHUNK;
use crate::batch::{EnqueueBatcher, enqueue_batcher};
use crate::failures::BroadcastFailure;
use crate::funding::FundingRequest;
use crate::settlement::SettlementSink;
use crate::store::{self, AttemptRow, RequestRow};
use crate::verdict::SettlementVerdict;
use crate::{RequestState, Result, TxSigner, TxqError};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::Address;
use keel_chain::UpstreamPool;
use keel_store::PgPool;
use keel_units::ChainId;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What a caller can read about a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestStatus {
    /// Request id.
    pub id: Uuid,
    /// `queued`, `waiting_funding`, `signed`, `broadcast` or `settled`.
    pub state: RequestState,
    /// Assigned nonce, once signed (never while `queued` or `waiting_funding`).
    pub nonce: Option<u64>,
    /// The verdict, once settled.
    pub verdict: Option<SettlementVerdict>,
    /// The open funding request while the state is `waiting_funding`; `None` otherwise.
    pub funding: Option<FundingRequest>,
    /// The last failed broadcast (error class, time, count), once one failed; kept
    /// after the request moves on. See [`crate::broadcast_failures`] for many requests.
    pub broadcast_failure: Option<BroadcastFailure>,
    /// For a request of a custody sender registered with this queue: its latest
    /// submission at the provider (status, provider id, approval wait); `None`
    /// otherwise or before the first create (see [`crate::custody_views`]).
    pub custody: Option<crate::CustodyView>,
}

/// The transaction queue of one chain.
pub struct TxQueue {
    db: PgPool,
    chain: Arc<UpstreamPool>,
    /// The chain id as bound in SQL (`BIGINT`; checked to fit by [`TxQueue::new`]).
    chain_id: i64,
    signers: HashMap<Address, Arc<dyn TxSigner>>,
    /// Custody senders: their requests go to the provider, never through a nonce.
    custody: HashMap<Address, crate::CustodySender>,
    config: TxQueueConfig,
    /// Wakes [`TxQueue::run`] when a request is recorded in this process (a stored
    /// permit when the loop is busy, so a request recorded during a pass is picked up
    /// by the next one at once).
    wake: tokio::sync::Notify,
    /// Group commit of concurrent enqueues.
    enqueues: EnqueueBatcher,
    /// Per sender: the highest block that holds one of its transactions, as seen by
    /// the confirmation pass, and when that block was first seen (a sender whose
    /// transactions keep being included is not stuck; see [`TxQueue::stuck`]).
    progress: std::sync::Mutex<HashMap<Vec<u8>, (u64, std::time::Instant)>>,
    /// Senders whose `txq_sender` row is known to exist.
    initialized: std::sync::Mutex<std::collections::HashSet<Address>>,
    /// The WARN rate limit of failed broadcasts.
    warned: std::sync::Mutex<WarnLimiter>,
    /// The head hash, final block and a hash of the watched requests' ids at the last
    /// watch pass that completed (`watch.rs`): an unchanged chain with the same watched
    /// requests is not looked at again.
    watched_at: std::sync::Mutex<Option<(alloy::primitives::B256, u64, u64)>>,
    /// When the registered senders' balances were last read ([`BALANCE_REFRESH`]).
    balances_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Receives every settlement in the transaction that settles it
    /// ([`TxQueue::set_settlement_sink`]); `None`: settles are plain statements.
    sink: Option<Arc<dyn SettlementSink>>,
    /// Receives first broadcasts and opened funding requests in the transactions that
    /// record them ([`TxQueue::set_progress_sink`]); `None`: plain statements.
    progress_sink: Option<Arc<dyn crate::ProgressSink>>,
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxQueue")
            .field("chain_id", &self.chain_id)
            .field("senders", &self.signers.len())
            .field("settlement_sink", &self.sink.is_some())
            .field("progress_sink", &self.progress_sink.is_some())
            .finish()
    }
}

/// How often the queue loop reads the balance and chain nonce of every registered
/// sender (local signers and custody vaults) for Platform Status and
/// `keel_txq_sender_balance_wei` (one JSON-RPC batch per chain): 15 s.
pub const BALANCE_REFRESH: std::time::Duration = std::time::Duration::from_secs(15);

/// Senders of one round whose funding check or preparation runs at once (each may
/// wait on the node: estimates, balances).
const SENDERS_IN_FLIGHT: usize = 16;

/// What a round (or a sender pass) did.
#[derive(Debug, Default)]
struct Round {
    /// Requests signed, settled, paused or resumed by the signing half.
    moved: usize,
    /// Of those, requests signed (a nonce taken).
    signed: usize,
    /// Requests the broadcast half moved (accepted by a node, or settled).
    broadcast: usize,
}

/// What the signing half of a round did: counts as in [`Round`], and the first error
/// (the other senders went on).
#[derive(Default)]
struct Signing {
    moved: usize,
    signed: usize,
    error: Option<TxqError>,
}

impl Signing {
    fn fail(&mut self, e: TxqError) {
        self.error.get_or_insert(e);
    }
}

impl TxQueue {
    /// A queue for the chain behind `chain`.
    ///
    /// # Errors
    /// [`TxqError::InvalidRequest`] when the chain id does not fit PostgreSQL's BIGINT;
    /// [`TxqError::Config`] when `bump_percent` is below 10 (geth and reth refuse such
    /// replacements), a fee multiplier is below 100 (`feeMultiplierPercent`,
    /// `l1DataFeeMultiplierPercent`), a fee-history tip source is out of its bounds
    /// (`priorityFeeHistory`) or `confirmations` is 0.
    pub fn new(db: PgPool, chain: Arc<UpstreamPool>, config: TxQueueConfig) -> Result<Self> {
        if config.bump_percent < 10 {
            return Err(TxqError::Config {
                key: "bumpPercent",
                reason: "must be at least 10 (the geth/reth replacement rule)",
            });
        }
        match config.fee_model {
            FeeModel::Eip1559 {
                base_fee_multiplier_percent: m,
                ..
            }
            | FeeModel::Legacy {
                gas_price_multiplier_percent: m,
            } if m < 100 => {
                return Err(TxqError::Config {
                    key: "feeMultiplierPercent",
                    reason: "must be at least 100 (a fee below the market never mines)",
                });
            }
            _ => {}
        }
        if let FeeModel::Eip1559 {
            priority_fee: PriorityFee::FeeHistory { blocks, percentile },
            ..
        } = config.fee_model
            && (!(1..=1024).contains(&blocks) || percentile > 100)
        {
            return Err(TxqError::Config {
                key: "priorityFeeHistory",
                reason: "blocks must be within 1..=1024 and the percentile within 0..=100",
            });
        }
        if config
            .l1_data_fee
            .is_some_and(|f| f.multiplier_percent < 100)
        {
            return Err(TxqError::Config {
                key: "l1DataFeeMultiplierPercent",
                reason: "must be at least 100",
            });
        }
        if config.confirmations == 0 {
            return Err(TxqError::Config {
                key: "confirmations",
                reason: "must be at least 1",
            });
        }
        let chain_id = chain
            .chain()
            .to_db()
            .map_err(|_| TxqError::InvalidRequest("chain_id"))?;
        Ok(Self {
            enqueues: enqueue_batcher(db.clone()),
            initialized: Default::default(),
            progress: Default::default(),
            warned: Default::default(),
            watched_at: Default::default(),
            balances_at: Default::default(),
            db,
            chain,
            chain_id,
            signers: HashMap::new(),
            custody: HashMap::new(),
            config,
            wake: tokio::sync::Notify::new(),
            sink: None,
            progress_sink: None,
        })
    }

    /// Registers the signer of its address.
    pub fn add_signer(&mut self, signer: Arc<dyn TxSigner>) {
        self.signers.insert(signer.address(), signer);
    }

    /// The registered senders (local signers and custody vaults), in address order.
    pub fn senders(&self) -> Vec<Address> {
        let mut out: Vec<Address> = self
            .signers
            .keys()
            .chain(self.custody.keys())
            .copied()
            .collect();
        out.sort();
        out
    }

    /// Whether `sender` is registered (a local signer or a custody vault): only such a
    /// sender's requests are ever signed by this queue; a request of another sender
    /// stays `queued` until a process with its key serves the chain.
    pub fn has_sender(&self, sender: Address) -> bool {
        self.signers.contains_key(&sender) || self.custody.contains_key(&sender)
    }

    /// Registers a custody sender: its requests are submitted to its provider (which
    /// signs and broadcasts) by the custody pass, never with a local nonce (see
    /// `crate::custody` and docs/custody.md). An address registered both ways is a
    /// custody sender.
    pub fn add_custody_sender(&mut self, sender: crate::CustodySender) {
        self.signers.remove(&sender.address());
        self.custody.insert(sender.address(), sender);
    }

    /// One custody pass: submits every due request of a custody sender, follows its
    /// provider status, and settles those with a final verdict (the chain's receipt at
    /// the confirmation depth, or a provider rejection). Returns how many settled.
    /// [`TxQueue::run`] runs it every `poll_interval` (`txq-custody`).
    ///
    /// # Errors
    /// Store errors of the read of due requests; a failing request is logged (WARN,
    /// `keel_txq_custody_step_failures_total`), deferred with backoff, and does not hold
    /// back the others.
    pub async fn custody_pass(&self) -> Result<usize> {
        self.custody_round(&CancellationToken::new()).await
    }

    /// Sets the [`SettlementSink`] that receives every request this queue settles, in
    /// the transaction that settles it (replacing any earlier one). Set it before
    /// [`TxQueue::run`]; see [`crate::SettlementSink`] for what it is promised.
    pub fn set_settlement_sink(&mut self, sink: Arc<dyn SettlementSink>) {
        self.sink = Some(sink);
    }

    /// Sets the [`crate::ProgressSink`] that receives every first broadcast and every
    /// opened funding request of this queue, in the transaction that records it
    /// (replacing any earlier one). Set it before [`TxQueue::run`]; see
    /// [`crate::ProgressSink`] for what it is promised.
    pub fn set_progress_sink(&mut self, sink: Arc<dyn crate::ProgressSink>) {
        self.progress_sink = Some(sink);
    }

    /// The chain id.
    pub fn chain_id(&self) -> ChainId {
        self.chain.chain()
    }

    /// Starts a round now (after a commit that made requests visible to the queue).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The request's state, nonce, verdict and (while `waiting_funding`) its funding
    /// request.
    ///
    /// # Errors
    /// [`TxqError::NotFound`]; store errors.
    pub async fn status(&self, id: Uuid) -> Result<RequestStatus> {
        let row = store::request_get(&self.db, id)
            .await?
            .ok_or(TxqError::NotFound)?;
        let verdict = match row.verdict {
            Some(v) => Some(
                serde_json::from_value(v)
                    .map_err(|_| TxqError::Store(keel_store::StoreError::Decode))?,
            ),
            None => None,
        };
        let funding = if row.state == RequestState::WaitingFunding {
            store::funding_of(&self.db, id)
                .await?
                .map(FundingRequest::try_from)
                .transpose()?
        } else {
            None
        };
        let broadcast_failure = if row.broadcast_failures > 0 {
            crate::broadcast_failures(&self.db, &[id])
                .await?
                .remove(&id)
        } else {
            None
        };
        let is_custody = self.custody.contains_key(&row.sender.0);
        let custody = if is_custody {
            crate::custody_views(&self.db, &[id]).await?.pop()
        } else {
            None
        };
        Ok(RequestStatus {
            id,
            state: row.state,
            nonce: row
                .nonce
                .map(|n| attempt::stored_nonce(n, "txq_request"))
                .transpose()?,
            verdict,
            funding,
            broadcast_failure,
            custody,
        })
    }

    /// Open funding requests of this queue's chain (requests in `waiting_funding`),
    /// oldest first; see [`crate::funding_requests`] for every chain.
    ///
    /// # Errors
    /// [`TxqError::Store`] when the database fails or a row does not decode.
    pub async fn funding_requests(&self) -> Result<Vec<FundingRequest>> {
        crate::funding_requests(&self.db, Some(self.chain_id())).await
    }

    /// The highest block of this queue's chain that is final now, by the queue's
    /// [`TxQueueConfig::finality`] (the node's `finalized` tag or a depth below the
    /// head): what the watch of settled requests (issue 32 §10) ends at. For readers
    /// that judge finality of a transaction the queue did not send (e.g. a user
    /// operation found in another bundler's transaction).
    ///
    /// # Errors
    /// Transport errors reading the head or the tag.
    pub async fn final_block_number(&self) -> Result<u64> {
        self.final_block().await
    }

    /// Waits until the request is settled, checking every `poll` (this is a reader's
    /// wait; workflows wrap it in a step).
    ///
    /// # Errors
    /// [`TxqError::NotFound`]; store errors.
    pub async fn await_verdict(&self, id: Uuid, poll: Duration) -> Result<SettlementVerdict> {
        loop {
            if let Some(v) = self.status(id).await?.verdict {
                return Ok(v);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Nonce recovery for `sender`: compares the chain's nonces with the queue's.
    ///
    /// - When the chain's latest nonce is above Keel's next nonce, someone else used
    ///   the account: Keel adopts the chain's value (with a warning); live requests
    ///   below it are resolved by their next broadcast (ours mined, or re-signed at a
    ///   fresh nonce once the other transaction is final).
    /// - Every nonce between the chain's latest nonce and Keel's next nonce that no
    ///   live request holds (its request failed after signing) is a gap that would
    ///   stall every later transaction: it is filled with a zero-value self-transfer,
    ///   persisted and broadcast like any request.
    ///
    /// Returns `(adopted, filled)`: whether the nonce was adopted, and how many gaps
    /// were filled.
    ///
    /// # Errors
    /// [`TxqError::UnknownSender`] without a signer; store and transport errors.
    pub async fn recover_nonces(&self, sender: Address) -> Result<(bool, usize)> {
        self.recover(sender, &CancellationToken::new()).await
    }

    /// [`TxQueue::recover_nonces`], writing and sending nothing once `cancel` fired:
    /// the nonce half ([`TxQueue::recover_sender`]), then the broadcast of the gap
    /// fillers with the sender's other `signed` requests.
    async fn recover(&self, sender: Address, cancel: &CancellationToken) -> Result<(bool, usize)> {
        let (adopted, filled) = self.recover_sender(sender, cancel).await?;
        if filled > 0 && !cancel.is_cancelled() {
            self.broadcast_signed(sender, cancel).await?;
        }
        Ok((adopted, filled))
    }

    /// The signing half of [`TxQueue::round`] for `senders` (address, has
    /// `waiting_funding` requests), handing every committed group to `sink`: the
    /// preparation ([`TxQueue::prepare_round`]), then signing and committing in groups
    /// ([`TxQueue::sign_plans`]).
    async fn sign_round(
        &self,
        senders: &[(Address, bool)],
        sink: Option<&tokio::sync::mpsc::UnboundedSender<Vec<ToSend>>>,
        cancel: &CancellationToken,
    ) -> Signing {
        let mut out = Signing::default();
        if cancel.is_cancelled() {
            return out;
        }
        // Before an idle sender signs, its next nonce is reconciled with the chain's
        // (issue 32 §3): an outside transaction's nonce is adopted; a nonce no node
        // holds is filled by recovery at once.
        for (sender, drift) in self.reconcile_idle(senders).await {
            if drift == std::cmp::Ordering::Less
                && !cancel.is_cancelled()
                && let Err(e) = self.recover(sender, cancel).await
            {
                tracing::warn!(target: "keel::txq", error = %e, %sender, "nonce recovery of an idle sender failed; retrying later");
            }
        }
        if cancel.is_cancelled() {
            return out;
        }
        if let Some((plans, fees)) = self.prepare_round(senders, &mut out, cancel).await {
            self.sign_plans(&plans, fees, sink, &mut out, cancel).await;
        }
        out
    }

    /// One round: sender passes for every sender with work (funding checks included),
    /// then a confirmation pass, then the queue-depth and in-flight gauges.
    ///
    /// # Errors
    /// The first failing pass's error (others still ran).
    pub async fn tick(&self) -> Result<()> {
        let never = CancellationToken::new();
        let senders = self.round(None, true, &never).await;
        let confirm = self.confirm(&never).await;
        let custody = self.custody_round(&never).await;
        let gauges = self.record_gauges().await;
        senders?;
        confirm?;
        custody?;
        gauges?;
        Ok(())
    }

    /// One round for every sender with work (or only `only`): the funding check of
    /// senders with `waiting_funding` requests, then the queued requests of every other
    /// sender read in one statement with each sender's next nonce, their balances in one
    /// JSON-RPC batch, their preparation (gas, funds; senders in parallel), and then
    /// signing in groups of up to [`sign::SIGN_CHUNK`] transactions across senders, each group
    /// committed in one statement ([`store::commit_signed`]). With `broadcast`, a
    /// committed group is broadcast (after any requests earlier rounds left `signed`)
    /// while the next group is being signed; nothing is broadcast before it is
    /// persisted, and no broadcast happens inside a database transaction.
    ///
    /// A failing sender (no signer, a failed funding check, a failed signature) is left
    /// for the next round while the others go on. Returns what moved; the first error
    /// once everything else ran. Once `cancel` fired the round writes and sends nothing
    /// more (it checks between its stages) and returns what it did.
    async fn round(
        &self,
        only: Option<Address>,
        broadcast: bool,
        cancel: &CancellationToken,
    ) -> Result<Round> {
        if let Some(sender) = only
            && !self.signers.contains_key(&sender)
        {
            return Err(TxqError::UnknownSender);
        }
        if cancel.is_cancelled() {
            return Ok(Round::default());
        }
        let started = std::time::Instant::now();
        let mut out = Round::default();
        let mut first_err: Option<TxqError> = None;
        let work = store::senders_with_work(&self.db, self.chain_id).await?;
        let mut senders = Vec::with_capacity(work.len());
        let mut with_leftovers = false;
        for w in &work {
            let sender = w.sender.0;
            if only.is_some_and(|o| o != sender) {
                continue;
            }
            if self.custody.contains_key(&sender) {
                // The custody pass moves these.
                continue;
            }
            if !self.signers.contains_key(&sender) {
                first_err.get_or_insert(TxqError::UnknownSender);
                continue;
            }
            with_leftovers |= w.signed;
            senders.push((sender, w.waiting_funding));
        }
        if senders.is_empty() {
            return first_err.map_or(Ok(out), Err);
        }
        // Left over from earlier rounds: lower nonces than anything signed below.
        let leftovers = if broadcast && with_leftovers {
            self.signed_of(only).await?
        } else {
            Vec::new()
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<ToSend>>();
        let sign = async move {
            // `tx` is dropped when signing ends, which ends the broadcaster's loop.
            let sink = broadcast.then_some(&tx);
            let mut total = self.sign_round(&senders, sink, cancel).await;
            // Requests recorded while this round signed are signed too, while the
            // broadcaster is still sending what came before (their broadcasts queue
            // behind, in nonce order), for up to `poll_interval` (the confirmation pass
            // and nonce recovery of `run` wait for the round).
            let mut last = total.signed;
            while broadcast
                && only.is_none()
                && last > 0
                && total.error.is_none()
                && started.elapsed() < self.config.poll_interval
                && !cancel.is_cancelled()
            {
                let more = match self.senders_ready().await {
                    Ok(more) => more,
                    Err(e) => {
                        total.fail(e);
                        break;
                    }
                };
                let next = self.sign_round(&more, sink, cancel).await;
                last = next.signed;
                total.moved += next.moved;
                total.signed += next.signed;
                if let Some(e) = next.error {
                    total.fail(e);
                }
            }
            total
        };
        let send = async {
            let mut moved = 0;
            let mut first_err = None;
            let mut step = |r: Result<usize>| match r {
                Ok(n) => moved += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            };
            for chunk in leftovers.chunks(BROADCAST_CHUNK) {
                step(self.broadcast_many(chunk, cancel).await);
            }
            while let Some(mut items) = rx.recv().await {
                // Every group committed meanwhile goes out together: more senders to
                // spread the batches over, one marking statement. A stable sort by
                // sender keeps each sender's requests in nonce order (groups commit
                // in order).
                while let Ok(more) = rx.try_recv() {
                    items.extend(more);
                }
                items.sort_by_key(|a| a.0.sender.0);
                step(self.broadcast_many(&items, cancel).await);
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(moved),
            }
        };
        let (signed, sent) = tokio::join!(sign, send);
        out.moved = signed.moved;
        out.signed = signed.signed;
        if let Some(e) = signed.error {
            first_err.get_or_insert(e);
        }
        match sent {
            Ok(n) => out.broadcast = n,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(out), Err)
    }

    /// Senders with a signer and queued requests, none waiting for funding, as
    /// [`TxQueue::sign_round`] takes them (no funding check due).
    async fn senders_ready(&self) -> Result<Vec<(Address, bool)>> {
        Ok(store::senders_with_work(&self.db, self.chain_id)
            .await?
            .into_iter()
            .filter(|w| !w.waiting_funding)
            .map(|w| w.sender.0)
            .filter(|s| self.signers.contains_key(s))
            .map(|s| (s, false))
            .collect())
    }

    /// Sets `keel_txq_queue_depth{chain_id}` (queued + waiting_funding),
    /// `keel_txq_waiting_funding{chain_id}`, and for every registered sender (a bounded
    /// label set: senders are configured, not discovered) `keel_txq_in_flight{chain_id,
    /// sender}` (signed + broadcast) and `keel_txq_sender_depth{chain_id, sender}`
    /// (queued + waiting_funding); every [`BALANCE_REFRESH`] also the senders' balances
    /// (`keel_txq_sender_balance_wei{chain_id, sender}` and `txq_sender_balance`).
    pub(crate) async fn record_gauges(&self) -> Result<()> {
        let rows = store::depth(&self.db, self.chain_id).await?;
        let (mut depth, mut waiting) = (0_i64, 0_i64);
        let mut in_flight: HashMap<Address, i64> = HashMap::new();
        let mut queued: HashMap<Address, i64> = HashMap::new();
        for r in rows {
            match r.state {
                RequestState::Queued => {
                    depth += r.n;
                    *queued.entry(r.sender.0).or_default() += r.n;
                }
                RequestState::WaitingFunding => {
                    depth += r.n;
                    waiting += r.n;
                    *queued.entry(r.sender.0).or_default() += r.n;
                }
                _ => *in_flight.entry(r.sender.0).or_default() += r.n,
            }
        }
        metrics::queue_depth(self.chain_id, depth, waiting);
        let senders = self.senders();
        for sender in &senders {
            let n = in_flight.get(sender).copied().unwrap_or(0);
            metrics::in_flight(self.chain_id, sender, n);
            metrics::sender_depth(
                self.chain_id,
                sender,
                queued.get(sender).copied().unwrap_or(0),
            );
        }
        self.refresh_balances(&senders).await
    }

    /// Reads and records the balances and chain nonces of `senders` when the last read is
    /// [`BALANCE_REFRESH`] old (or none happened yet).
    async fn refresh_balances(&self, senders: &[Address]) -> Result<()> {
        let now = std::time::Instant::now();
        {
            let mut at = self
                .balances_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if senders.is_empty() || at.is_some_and(|t| now.duration_since(t) < BALANCE_REFRESH) {
                return Ok(());
            }
            *at = Some(now);
        }
        let balances = self
            .chain
            .balances(senders, BlockNumberOrTag::Pending)
            .await?;
        let mut nonces = Vec::with_capacity(senders.len());
        for sender in senders {
            let n = self.chain.nonce(*sender, BlockNumberOrTag::Pending).await?;
            nonces.push(i64::try_from(n).map_err(|_| TxqError::InvalidRequest("nonce"))?);
        }
        for (sender, b) in senders.iter().zip(&balances) {
            metrics::sender_balance(self.chain_id, sender, b.wei.get());
        }
        let addresses: Vec<Vec<u8>> = senders.iter().map(|a| a.to_vec()).collect();
        let wei: Vec<String> = balances.iter().map(|b| b.wei.get().to_string()).collect();
        store::sender_balances_record(&self.db, self.chain_id, &addresses, &wei, &nonces).await
    }

    /// The sender pass: a round (`TxQueue::round`) for `sender` alone. Signs and persists
    /// the sender's queued requests (see [`TxQueue::sign_pending`]) and broadcasts
    /// every `signed` request in nonce order — first any a crash (or an earlier
    /// refusal) left persisted but unsent, whose exact bytes go out again, then the
    /// ones just signed. The two phases are pipelined: a group of requests is broadcast
    /// as soon as its nonces, raw bytes and hashes have committed, while the next group
    /// is being signed; nothing is broadcast before it is persisted, and no broadcast
    /// happens inside a database transaction. Returns how many requests it moved.
    ///
    /// # Errors
    /// [`TxqError::UnknownSender`] without a signer; store and transport errors (the
    /// first one, after both phases ran).
    pub async fn sender_pass(&self, sender: Address) -> Result<usize> {
        let round = self
            .round(Some(sender), true, &CancellationToken::new())
            .await?;
        Ok(round.moved + round.broadcast)
    }

    /// Phase one of a sender pass: first the funding check of the sender's
    /// `waiting_funding` requests (resume when the balance suffices, settle
    /// `FUNDING_DEADLINE_EXPIRED` past the deadline); while one still waits, nothing
    /// else of the sender is signed (head-of-line: the funds sent for it are not spent
    /// by later requests). Then for each queued request, oldest first, prepares it (gas
    /// estimate, fees, funds); the prepared requests get consecutive nonces from the
    /// sender's next nonce, are signed, and are persisted in one statement that checks,
    /// under the sender's row lock, that the next nonce and the requests' states did not
    /// change meanwhile (otherwise nothing is written and the requests stay queued).
    /// Nothing is broadcast. Requests that fail before signing settle `failed`, and
    /// requests that enter `waiting_funding` wait; neither takes a nonce. Returns how
    /// many requests were signed, settled, paused or resumed.
    ///
    /// # Errors
    /// [`TxqError::UnknownSender`] without a signer; store and transport errors.
    pub async fn sign_pending(&self, sender: Address) -> Result<usize> {
        Ok(self
            .round(Some(sender), false, &CancellationToken::new())
            .await?
            .moved)
    }

    /// The confirmation pass: fetches receipts of every attempt of in-flight requests
    /// in JSON-RPC batches and settles those at the confirmation depth, all in one
    /// statement; a `broadcast` request whose transaction the node no longer knows
    /// (dropped by a reorg) is re-broadcast with the same bytes, and one without a
    /// receipt for `bump_after` is replaced (see [`TxQueueConfig::bump_after`] for which
    /// of a sender's stuck transactions). Returns how many requests settled.
    ///
    /// `signed` requests whose broadcasts failed (no node accepted an attempt, see
    /// [`crate::BroadcastFailure`]) are reconciled too: a receipt of any of their
    /// attempts settles them like a `broadcast` one (the transaction may have reached a
    /// node whose answer was lost, and mined), and once the sender's nonce at the final
    /// block passed theirs while no node knows any of their attempts they are re-signed
    /// at a fresh nonce (none of their attempts can be mined any more). A `broadcast` transaction is
    /// never replaced while a lower nonce of its sender is still `signed` (unsent: it
    /// cannot mine before that one, whatever its fees).
    ///
    /// # Errors
    /// Store and transport errors.
    pub async fn confirm_pass(&self) -> Result<usize> {
        self.confirm(&CancellationToken::new()).await
    }

    /// [`TxQueue::confirm_pass`], checking `cancel` between its stages: once it fired,
    /// nothing more is written or sent and the pass returns what it settled.
    async fn confirm(&self, cancel: &CancellationToken) -> Result<usize> {
        if cancel.is_cancelled() {
            return Ok(0);
        }
        // Settled writes stay watched until their block is final (issue 32 §10); a
        // failure here is logged and looked at again next pass.
        if let Err(e) = self.watch_settled(cancel).await {
            tracing::warn!(target: "keel::txq", error = %e, "watching settled transactions failed; retrying next pass");
        }
        let in_flight = store::requests_in_flight(&self.db, self.chain_id, None, None).await?;
        if in_flight.is_empty() {
            return Ok(0);
        }
        // The requests reconciled here: every `broadcast` one, and the `signed` ones
        // whose broadcasts failed (the others are being sent by the sender round).
        let watched: Vec<&RequestRow> = in_flight
            .iter()
            .filter(|r| r.state == RequestState::Broadcast || r.broadcast_failures > 0)
            .collect();
        if watched.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = watched.iter().map(|r| r.id).collect();
        let mut attempts: HashMap<Uuid, Vec<AttemptRow>> = HashMap::new();
        for a in store::attempts_of(&self.db, &ids).await? {
            attempts.entry(a.request_id).or_default().push(a);
        }
        // Receipts: the mined requests settle, the unsent ones are reconciled.
        let Some(mined) = self.settle_mined(&watched, &attempts, cancel).await? else {
            return Ok(0);
        };
        if cancel.is_cancelled() {
            return Ok(mined.settled);
        }
        // Requests without a receipt: re-broadcast or replaced.
        self.handle_unmined(&in_flight, mined.unmined, cancel)
            .await?;
        Ok(mined.settled)
    }
}
