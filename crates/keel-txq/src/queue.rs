//! The queue: enqueue, the per-sender signing/broadcast pass (with funding pauses), the
//! confirmation pass, metrics.

use crate::batch::{EnqueueBatcher, enqueue_batcher};
use crate::failures::BroadcastFailure;
use crate::funding::FundingRequest;
use crate::store::{self, AttemptRow, NewAttempt, OwnedNewRequest, RequestRow};
use crate::verdict::{AttemptRecord, SettlementVerdict};
use crate::{Result, TxSigner, TxqError};
use alloy::consensus::TxEip1559;
use alloy::eips::{BlockNumberOrTag, Encodable2718};
use alloy::primitives::{Address, B256, Bytes, TxKind, U64, U256};
use alloy::rpc::types::{Block, TransactionReceipt, TransactionRequest};
use keel_chain::{ChainError, NodeErrorKind, UpstreamPool};
use keel_store::PgPool;
use keel_units::{ChainId, Wei};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A transaction to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxRequest {
    /// The sender; a [`TxSigner`] for it must be registered before its requests sign.
    pub sender: Address,
    /// Unique per (chain, sender), 1..=255 characters.
    pub idempotency_key: String,
    /// Recipient; `None` creates a contract.
    pub to: Option<Address>,
    /// Native value in wei.
    pub value: Wei,
    /// Calldata (the queue does not add the attribution suffix; the caller does, once).
    pub data: Bytes,
    /// Fixed gas limit; `None` estimates it (`eth_estimateGas`) before signing.
    pub gas_limit: Option<u64>,
}

/// Queue settings.
#[derive(Debug, Clone)]
pub struct TxQueueConfig {
    /// Blocks a receipt must be deep (1 = in the head block) to settle.
    pub confirmations: u64,
    /// Sleep between passes when nothing woke the loop.
    pub poll_interval: Duration,
    /// Queued requests signed per sender per pass.
    pub sign_batch: i64,
    /// Percent added to an estimate for the gas limit (default 20).
    pub gas_limit_headroom_percent: u64,
    /// Nonce recovery runs every this many ticks of [`TxQueue::run`] (default 40).
    pub recovery_every_ticks: u64,
    /// A broadcast transaction without a receipt for this long after its broadcast,
    /// while no transaction of its sender was newly included for as long, is replaced at
    /// the same nonce with bumped fees; `None` disables fee bumping (default 30 s). Of
    /// one sender's stuck transactions, only the lowest nonce is replaced unless the
    /// others are underpriced too (max fee below the current base fee, or tip below the
    /// node's suggestion): later nonces waiting behind a stuck one mine once it does.
    pub bump_after: Option<Duration>,
    /// Percent by which a replacement raises both the max fee and the priority fee
    /// (default 12; geth and reth refuse replacements below +10 %).
    pub bump_percent: u64,
    /// Upper bound of the max fee per gas, wei (the per-chain cap; default 1,000 gwei).
    pub max_fee_cap: u128,
    /// For requests with a funding pause: how many times a broadcast refused by the node
    /// for insufficient funds (after the queue's own balance check let the request
    /// sign) is retried with the same bytes, one retry per pass, before the request
    /// settles `Failed { code: "GAS_REQUIRED" }` (default 10). Requests without a
    /// funding pause settle on the first refusal.
    pub funding_broadcast_retries: u32,
    /// Broadcasts of one sender outstanding at once (default 16; at least 1). Higher
    /// is faster against a node that promotes out-of-order nonces reliably; Anvil 1.7.1
    /// can leave a transaction queued for good when many arrive concurrently (then only
    /// a fee bump gets it mined), so keep it modest on Anvil.
    pub broadcast_in_flight: usize,
    /// Broadcasts per JSON-RPC batch (`eth_sendRawTransaction` × n in one HTTP
    /// request; default 16; 1 = one request per transaction). With n > 1, up to
    /// `broadcast_in_flight / n` batches (at least 1) are outstanding at once, each of
    /// one sender, spread over the senders first. A node
    /// answers each item separately; a batch that fails at the transport level leaves
    /// its requests `signed` for the next pass (same bytes).
    pub broadcast_batch: usize,
}

impl Default for TxQueueConfig {
    fn default() -> Self {
        Self {
            confirmations: 1,
            poll_interval: Duration::from_millis(250),
            sign_batch: 256,
            gas_limit_headroom_percent: 20,
            recovery_every_ticks: 40,
            bump_after: Some(Duration::from_secs(30)),
            bump_percent: 12,
            max_fee_cap: 1_000_000_000_000,
            funding_broadcast_retries: 10,
            broadcast_in_flight: DEFAULT_BROADCAST_IN_FLIGHT,
            broadcast_batch: 16,
        }
    }
}

/// Options of [`TxQueue::enqueue_with`]. `Default` is what [`TxQueue::enqueue`] uses: no
/// funding pause.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    /// Enables the funding pause. When the sender cannot pay for the request (balance <
    /// gas limit × max fee per gas + value, in wei) the request waits in
    /// `waiting_funding` with a [`FundingRequest`] instead of failing `GAS_REQUIRED`,
    /// and resumes by itself once the balance suffices.
    ///
    /// The duration counts from the **first detection** of missing funds (not from
    /// enqueue): the deadline, database clock, is fixed then and never moves, even if
    /// the request resumes and later waits again. Past it the request settles
    /// `Failed { code: "FUNDING_DEADLINE_EXPIRED" }`. Millisecond resolution.
    /// `None` (the default): no pause, the request fails `GAS_REQUIRED`.
    pub funding_pause: Option<Duration>,
}

impl EnqueueOptions {
    /// Options with a funding pause of `deadline` (counted from the first detection of
    /// missing funds).
    pub fn funding_pause(deadline: Duration) -> Self {
        Self {
            funding_pause: Some(deadline),
        }
    }
}

/// What a caller can read about a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestStatus {
    /// Request id.
    pub id: Uuid,
    /// `queued`, `waiting_funding`, `signed`, `broadcast` or `settled`.
    pub state: String,
    /// Assigned nonce, once signed (never while `queued` or `waiting_funding`).
    pub nonce: Option<u64>,
    /// The verdict, once settled.
    pub verdict: Option<SettlementVerdict>,
    /// The open funding request while the state is `waiting_funding`; `None` otherwise.
    pub funding: Option<FundingRequest>,
    /// The last failed broadcast (error class, time, count), once one failed; kept
    /// after the request moves on. See [`crate::broadcast_failures`] for many requests.
    pub broadcast_failure: Option<BroadcastFailure>,
}

/// The transaction queue of one chain.
pub struct TxQueue {
    db: PgPool,
    chain: Arc<UpstreamPool>,
    chain_id: i64,
    signers: HashMap<Address, Arc<dyn TxSigner>>,
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
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxQueue")
            .field("chain_id", &self.chain_id)
            .field("senders", &self.signers.len())
            .finish()
    }
}

/// Senders of one round whose funding check or preparation runs at once (each may
/// wait on the node: estimates, balances).
const SENDERS_IN_FLIGHT: usize = 16;

/// Transactions signed per signing group (one commit statement, across senders).
const SIGN_CHUNK: usize = 128;

/// Receipts fetched per JSON-RPC batch.
const RECEIPT_BATCH: usize = 100;

/// Broadcasts of one sender in flight at once.
const DEFAULT_BROADCAST_IN_FLIGHT: usize = 16;

/// Receipt batches of the confirmation pass in flight at once.
const RECEIPT_BATCHES_IN_FLIGHT: usize = 4;

/// Requests without a receipt examined at once by the confirmation pass (each asks the
/// node whether it still knows an attempt, and may re-broadcast or replace it).
const UNMINED_IN_FLIGHT: usize = 16;

/// Signatures of one chunk requested at once (the [`TxSigner`] may be remote).
const SIGN_IN_FLIGHT: usize = 16;

/// Signed requests broadcast per marking statement (leftovers of earlier passes).
const BROADCAST_CHUNK: usize = 256;

/// A request to broadcast: the request (as of signing or as read) and its attempts,
/// the last one being the one to send.
type ToSend = (RequestRow, Vec<AttemptRow>);

/// A queued request ready for a nonce.
struct ReadyTx {
    id: Uuid,
    /// The queued row (turned into the `signed` row handed to the broadcaster).
    row: RequestRow,
    to: Option<Address>,
    value: U256,
    data: Bytes,
    gas_limit: u64,
}

enum Prepared {
    Ready(Box<ReadyTx>),
    Settled,
    /// Entered `waiting_funding`; the sender's later requests wait behind it.
    Waiting,
    Retry,
}

enum Broadcast {
    Accepted,
    /// Not accepted; the request stays in flight for another try. With the error class
    /// when the broadcast failed ([`error_class`]); `None` when nothing was sent.
    Retry(Option<&'static str>),
    Settled,
}

/// The bounded error class of a failed broadcast (a metric label and the value of
/// `txq_request.last_broadcast_error`): the node error kind when a node answered,
/// `unavailable` when no upstream answered.
fn error_class(e: &ChainError) -> &'static str {
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
struct WarnLimiter {
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

    fn failed(mut self, e: TxqError) -> Self {
        self.fail(e);
        self
    }
}

/// One sender's part of a round: the next nonce as read with its queued requests, and
/// those prepared for signing, in queue order.
struct SenderPlan {
    sender: Address,
    first: i64,
    ready: Vec<ReadyTx>,
    /// A signature failed or a commit found the nonce moved: nothing more this round
    /// (atomic: set by the commit half while the signing half reads it).
    failed: std::sync::atomic::AtomicBool,
}

/// `len` prepared requests of `plans[plan]` from `start`: one sender's share of a
/// signing group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    plan: usize,
    start: usize,
    len: usize,
}

/// Splits the plans' prepared requests (plans sorted by sender) into signing groups of
/// at most `size` transactions, in order: a sender's requests stay in queue order, each
/// sender appears at most once per group, and a sender's later pieces come in later
/// groups.
fn signing_groups(plans: &[SenderPlan], size: usize) -> Vec<Vec<Piece>> {
    let lens: Vec<usize> = plans.iter().map(|p| p.ready.len()).collect();
    pieces_of(&lens, size)
}

/// [`signing_groups`] over the number of prepared requests of each plan.
fn pieces_of(lens: &[usize], size: usize) -> Vec<Vec<Piece>> {
    let size = size.max(1);
    let mut groups = Vec::new();
    let mut current = Vec::new();
    let mut filled = 0;
    for (plan, &len) in lens.iter().enumerate() {
        let mut start = 0;
        while start < len {
            let take = (size - filled).min(len - start);
            current.push(Piece {
                plan,
                start,
                len: take,
            });
            filled += take;
            start += take;
            if filled == size {
                groups.push(std::mem::take(&mut current));
                filled = 0;
            }
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// A signing group with its signatures: per piece, the signed transactions or `None`
/// when a signature failed (the first such error kept).
struct SignedGroup {
    pieces: Vec<Piece>,
    signed: Vec<Option<Vec<SignedTx>>>,
    error: Option<TxqError>,
}

/// `fetch` over `hashes` in JSON-RPC batches of [`RECEIPT_BATCH`] (providers cap batch
/// sizes), [`RECEIPT_BATCHES_IN_FLIGHT`] at once; one answer per hash, in order.
async fn by_batches<'a, T, F, Fut>(hashes: &'a [B256], fetch: F) -> Result<Vec<T>>
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

/// One signed transaction of a group: (nonce, hash, EIP-2718 bytes, gas limit).
type SignedTx = (i64, B256, Vec<u8>, i64);

fn to_i64(n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| TxqError::InvalidRequest("nonce"))
}
fn failed(code: &str, attempts: Vec<AttemptRecord>) -> SettlementVerdict {
    SettlementVerdict::Failed {
        code: code.to_owned(),
        reason: None,
        revert_data: None,
        attempts,
    }
}

fn attempt_records(rows: &[AttemptRow]) -> Vec<AttemptRecord> {
    rows.iter()
        .map(|a| AttemptRecord {
            attempt: a.attempt,
            nonce: u64::try_from(a.nonce).unwrap_or_default(),
            hash: B256::try_from(a.tx_hash.as_slice()).unwrap_or_default(),
        })
        .collect()
}

impl TxQueue {
    /// A queue for the chain behind `chain`.
    ///
    /// # Errors
    /// [`TxqError::InvalidRequest`] when the chain id does not fit PostgreSQL's BIGINT;
    /// [`TxqError::Config`] when `bump_percent` is below 10 (geth and reth refuse such
    /// replacements) or `confirmations` is 0.
    pub fn new(db: PgPool, chain: Arc<UpstreamPool>, config: TxQueueConfig) -> Result<Self> {
        if config.bump_percent < 10 {
            return Err(TxqError::Config {
                key: "bumpPercent",
                reason: "must be at least 10 (the geth/reth replacement rule)",
            });
        }
        if config.confirmations == 0 {
            return Err(TxqError::Config {
                key: "confirmations",
                reason: "must be at least 1",
            });
        }
        let chain_id =
            i64::try_from(chain.chain().get()).map_err(|_| TxqError::InvalidRequest("chain_id"))?;
        Ok(Self {
            enqueues: enqueue_batcher(db.clone()),
            initialized: Default::default(),
            progress: Default::default(),
            warned: Default::default(),
            db,
            chain,
            chain_id,
            signers: HashMap::new(),
            config,
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Registers the signer of its address.
    pub fn add_signer(&mut self, signer: Arc<dyn TxSigner>) {
        self.signers.insert(signer.address(), signer);
    }

    /// The chain id.
    pub fn chain_id(&self) -> ChainId {
        self.chain.chain()
    }

    /// Records a request without a funding pause, idempotently by (chain, sender, key).
    /// Returns its id. Same as [`TxQueue::enqueue_with`] with `EnqueueOptions::default()`.
    ///
    /// # Errors
    /// [`TxqError::IdempotencyConflict`] when the key exists with another payload (or
    /// with a funding pause); [`TxqError::InvalidRequest`] for an empty or over-long key
    /// or a zero gas limit.
    pub async fn enqueue(&self, req: &TxRequest) -> Result<Uuid> {
        self.enqueue_with(req, &EnqueueOptions::default()).await
    }

    /// Records a request with `opts`, idempotently by (chain, sender, key). Returns its
    /// id. The options are part of the payload: the same key with another funding pause
    /// is a conflict.
    ///
    /// # Errors
    /// [`TxqError::IdempotencyConflict`] when the key exists with another payload or
    /// other options; [`TxqError::InvalidRequest`] for an empty or over-long key
    /// (`idempotency_key`), a zero gas limit (`gas_limit`), or a funding pause longer
    /// than `i64::MAX` milliseconds (`funding_pause`).
    pub async fn enqueue_with(&self, req: &TxRequest, opts: &EnqueueOptions) -> Result<Uuid> {
        let key_len = req.idempotency_key.chars().count();
        if key_len == 0 || key_len > 255 {
            return Err(TxqError::InvalidRequest("idempotency_key"));
        }
        let gas_limit = match req.gas_limit {
            Some(0) => return Err(TxqError::InvalidRequest("gas_limit")),
            Some(g) => Some(i64::try_from(g).map_err(|_| TxqError::InvalidRequest("gas_limit"))?),
            None => None,
        };
        let funding_pause_ms = opts
            .funding_pause
            .map(|d| i64::try_from(d.as_millis()))
            .transpose()
            .map_err(|_| TxqError::InvalidRequest("funding_pause"))?;
        let owned = OwnedNewRequest {
            id: Uuid::new_v4(),
            chain_id: self.chain_id,
            sender: req.sender.to_vec(),
            key: req.idempotency_key.clone(),
            to: req.to.map(|a| a.to_vec()),
            value_wei: req.value.get().to_string(),
            calldata: req.data.to_vec(),
            gas_limit,
            funding_pause_ms,
        };
        // Concurrent enqueues of this process share one INSERT (group commit); this
        // returns once this request's row has committed.
        let inserted = self
            .enqueues
            .submit(owned.clone())
            .await
            // The answer was lost (runtime shutting down): the row may or may not
            // exist; a retry with the same key tells.
            .ok_or(TxqError::Store(keel_store::StoreError::Transient {
                kind: keel_store::TransientKind::ConnectionLost,
                sqlstate: None,
            }))??;
        let new = owned.borrowed();
        if inserted {
            metrics::counter!("keel_txq_enqueued_total", "chain_id" => self.chain_id.to_string())
                .increment(1);
            self.wake.notify_one();
            return Ok(new.id);
        }
        let existing = store::request_by_key(&self.db, self.chain_id, new.sender, new.key)
            .await?
            .ok_or(TxqError::NotFound)?;
        let same = existing.to_address.as_deref() == new.to
            && existing.value_wei == new.value_wei
            && existing.calldata == new.calldata
            && existing.gas_limit == new.gas_limit
            && existing.funding_pause_ms == new.funding_pause_ms;
        if same {
            Ok(existing.id)
        } else {
            Err(TxqError::IdempotencyConflict)
        }
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
        let funding = if row.state == "waiting_funding" {
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
        Ok(RequestStatus {
            id,
            state: row.state,
            nonce: row.nonce.and_then(|n| u64::try_from(n).ok()),
            verdict,
            funding,
            broadcast_failure,
        })
    }

    /// Open funding requests of this queue's chain (requests in `waiting_funding`),
    /// oldest first; see [`crate::funding_requests`] for every chain.
    ///
    /// # Errors
    /// [`TxqError::Store`] when the database fails or a row does not decode.
    pub async fn funding_requests(&self) -> Result<Vec<FundingRequest>> {
        crate::funding_requests(&self.db, Some(self.chain_id)).await
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

    /// Runs passes until `cancel` fires: two loops side by side.
    ///
    /// - Sender rounds: a request recorded through this queue ([`TxQueue::enqueue`] /
    ///   [`TxQueue::enqueue_with`], this process) wakes the loop for a round at once,
    ///   and a round that signed something is followed by another at once (more may be
    ///   queued than one round signs); otherwise a round runs every `poll_interval`,
    ///   which picks up requests recorded by other processes. Nonce recovery
    ///   ([`TxQueue::recover_nonces`]) runs for every registered sender at start and then
    ///   every `recovery_every_ticks` intervals, between rounds.
    /// - The confirmation pass ([`TxQueue::confirm_pass`]) and the queue gauges, every
    ///   `poll_interval`, without waiting for rounds (it only reads and settles
    ///   `broadcast` requests, and replaces stuck ones at their own nonce).
    ///
    /// Once `cancel` fires no new pass starts, and a pass under way stops at its next
    /// stage boundary: it checks the token before every database write and every
    /// broadcast, so nothing is written or sent after the token fired (a shard's new
    /// owner may be running its own passes by then). A write already sent completes.
    ///
    /// The future is `Send`: `tokio::spawn(async move { queue.run(token).await })` on
    /// an `Arc<TxQueue>` works.
    pub async fn run(&self, cancel: CancellationToken) {
        use tracing::Instrument;
        let span = tracing::info_span!("txq", chain_id = self.chain_id);
        let rounds = async {
            let mut ticks: u64 = 0;
            let mut next_tick = tokio::time::Instant::now();
            while !cancel.is_cancelled() {
                if tokio::time::Instant::now() >= next_tick {
                    if ticks.is_multiple_of(self.config.recovery_every_ticks.max(1)) {
                        self.recover_all(&cancel).await;
                    }
                    ticks = ticks.wrapping_add(1);
                    next_tick = tokio::time::Instant::now() + self.config.poll_interval;
                }
                if cancel.is_cancelled() {
                    break;
                }
                let again = match self.round(None, true, &cancel).await {
                    Ok(round) => round.signed > 0,
                    Err(e) => {
                        tracing::warn!(target: "keel::txq", error = %e, "sender round failed; retrying next tick");
                        false
                    }
                };
                if again {
                    continue;
                }
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep_until(next_tick) => {}
                }
            }
        };
        let confirmations = async {
            let mut interval = tokio::time::interval(self.config.poll_interval);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                // Biased: a fired token wins over a due tick (no extra pass).
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = interval.tick() => {}
                }
                if let Err(e) = self.confirm(&cancel).await {
                    tracing::warn!(target: "keel::txq", error = %e, "confirmation pass failed; retrying next tick");
                }
                if cancel.is_cancelled() {
                    break;
                }
                if let Err(e) = self.record_gauges().await {
                    tracing::warn!(target: "keel::txq", error = %e, "queue gauges failed; retrying next tick");
                }
            }
        };
        async {
            tokio::join!(rounds, confirmations);
        }
        .instrument(span)
        .await
    }

    /// [`TxQueue::recover_nonces`] for every registered sender, a few at once; a
    /// failure is logged and retried at the next recovery.
    async fn recover_all(&self, cancel: &CancellationToken) {
        use futures::StreamExt;
        let recoveries: Vec<_> = self
            .signers
            .keys()
            .map(|sender| self.recover(*sender, cancel))
            .collect();
        let results: Vec<Result<(bool, usize)>> = futures::stream::iter(recoveries)
            .buffer_unordered(SENDERS_IN_FLIGHT)
            .collect()
            .await;
        for r in results {
            if let Err(e) = r {
                tracing::warn!(target: "keel::txq", error = %e, "nonce recovery failed; retrying later");
            }
        }
    }

    /// Nonce recovery for `sender`: compares the chain's nonces with the queue's.
    ///
    /// - When the chain's latest nonce is above Keel's next nonce, someone else used
    ///   the account: Keel adopts the chain's value (with a warning); live requests
    ///   below it are resolved by their next broadcast (ours mined, or
    ///   `NONCE_CONSUMED_EXTERNALLY`).
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

    /// [`TxQueue::recover_nonces`], writing and sending nothing once `cancel` fired.
    async fn recover(&self, sender: Address, cancel: &CancellationToken) -> Result<(bool, usize)> {
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
                metrics::counter!("keel_txq_nonce_adopted_total", "chain_id" => self.chain_id.to_string()).increment(1);
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
        let (max_fee, tip) = self.fees().await?;
        let mut filled = 0;
        for nonce in latest..next {
            if live.contains(&nonce) {
                continue;
            }
            let unsigned = TxEip1559 {
                chain_id: self.chain.chain().get(),
                nonce: u64::try_from(nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
                gas_limit: 21_000,
                max_fee_per_gas: max_fee,
                max_priority_fee_per_gas: tip,
                to: TxKind::Call(sender),
                value: U256::ZERO,
                access_list: Default::default(),
                input: Bytes::new(),
            };
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
            metrics::counter!("keel_txq_nonce_gaps_filled_total", "chain_id" => self.chain_id.to_string()).increment(1);
            filled += 1;
        }
        if filled > 0 && !cancel.is_cancelled() {
            self.broadcast_signed(sender, cancel).await?;
        }
        Ok((adopted, filled))
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
        let gauges = self.record_gauges().await;
        senders?;
        confirm?;
        gauges?;
        Ok(())
    }

    /// One round for every sender with work (or only `only`): the funding check of
    /// senders with `waiting_funding` requests, then the queued requests of every other
    /// sender read in one statement with each sender's next nonce, their balances in one
    /// JSON-RPC batch, their preparation (gas, funds; senders in parallel), and then
    /// signing in groups of up to [`SIGN_CHUNK`] transactions across senders, each group
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
            let Ok(sender) = Address::try_from(w.sender.as_slice()) else {
                continue;
            };
            if only.is_some_and(|o| o != sender) {
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
                items.sort_by(|a, b| a.0.sender.cmp(&b.0.sender));
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

    /// The signing half of [`TxQueue::round`] for `senders` (address, has
    /// `waiting_funding` requests), handing every committed group to `sink`.
    async fn sign_round(
        &self,
        senders: &[(Address, bool)],
        sink: Option<&tokio::sync::mpsc::UnboundedSender<Vec<ToSend>>>,
        cancel: &CancellationToken,
    ) -> Signing {
        use futures::StreamExt;
        let mut out = Signing::default();
        if cancel.is_cancelled() {
            return out;
        }
        // Sender rows and funding checks, senders in parallel; a sender whose oldest
        // paused request still waits signs nothing (head-of-line: the funds sent for it
        // are not spent by later requests).
        let checks: Vec<_> = senders
            .iter()
            .map(|&(sender, waiting)| async move {
                if cancel.is_cancelled() {
                    return Ok((true, 0));
                }
                self.ensure_sender(sender).await?;
                if waiting && !cancel.is_cancelled() {
                    self.check_funding(sender).await
                } else {
                    Ok((false, 0))
                }
            })
            .collect();
        let checked: Vec<Result<(bool, usize)>> = futures::stream::iter(checks)
            .buffered(SENDERS_IN_FLIGHT)
            .collect()
            .await;
        let mut ready_senders: Vec<&[u8]> = Vec::with_capacity(senders.len());
        for ((sender, _), r) in senders.iter().zip(checked) {
            match r {
                Ok((still_waiting, n)) => {
                    out.moved += n;
                    if !still_waiting {
                        ready_senders.push(sender.as_slice());
                    }
                }
                Err(e) => out.fail(e),
            }
        }
        if ready_senders.is_empty() || cancel.is_cancelled() {
            return out;
        }
        let rows = match store::requests_queued_many(
            &self.db,
            self.chain_id,
            &ready_senders,
            self.config.sign_batch,
        )
        .await
        {
            Ok(rows) => rows,
            Err(e) => return out.failed(e),
        };
        if rows.is_empty() {
            return out;
        }
        // Rows come grouped by sender, oldest first.
        let mut queued: Vec<(Address, i64, Vec<RequestRow>)> = Vec::new();
        for row in rows {
            let Ok(sender) = Address::try_from(row.request.sender.as_slice()) else {
                continue;
            };
            match queued.last_mut() {
                Some((s, _, requests)) if *s == sender => requests.push(row.request),
                _ => queued.push((sender, row.next_nonce, vec![row.request])),
            }
        }
        // Fees once per round; each sender's funds in one batch, spent down locally as
        // its requests are prepared (their transactions are not in the node's pool yet).
        let fees = match self.fees().await {
            Ok(fees) => fees,
            Err(e) => return out.failed(e),
        };
        let addresses: Vec<Address> = queued.iter().map(|q| q.0).collect();
        let balances = match self
            .chain
            .balances(&addresses, BlockNumberOrTag::Pending)
            .await
        {
            Ok(b) => b,
            Err(e) => return out.failed(e.into()),
        };
        let preparations: Vec<_> = queued
            .into_iter()
            .zip(balances)
            .map(|((sender, first, requests), balance)| async move {
                let mut available = balance.wei.get();
                let (mut moved, mut ready) = (0, Vec::new());
                for req in &requests {
                    // Preparing may settle or pause the request (a write).
                    if cancel.is_cancelled() {
                        break;
                    }
                    match self.prepare(sender, req, fees, &mut available).await? {
                        Prepared::Ready(p) => ready.push(*p),
                        Prepared::Settled => moved += 1,
                        Prepared::Waiting => {
                            moved += 1;
                            break;
                        }
                        Prepared::Retry => break,
                    }
                }
                Ok::<_, TxqError>((
                    moved,
                    SenderPlan {
                        sender,
                        first,
                        ready,
                        failed: Default::default(),
                    },
                ))
            })
            .collect();
        let prepared: Vec<Result<(usize, SenderPlan)>> = futures::stream::iter(preparations)
            .buffered(SENDERS_IN_FLIGHT)
            .collect()
            .await;
        let mut plans = Vec::with_capacity(prepared.len());
        for p in prepared {
            match p {
                Ok((moved, plan)) => {
                    out.moved += moved;
                    if !plan.ready.is_empty() {
                        plans.push(plan);
                    }
                }
                Err(e) => out.fail(e),
            }
        }
        // Lock order of the group commits.
        plans.sort_by_key(|p| p.sender);
        // Signing and committing are pipelined: the next group is signed while one
        // commits. A group signed after an earlier group of the same sender failed to
        // commit cannot commit either (its first nonce is not the sender's next).
        let groups = signing_groups(&plans, SIGN_CHUNK);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<SignedGroup>>(1);
        let plans = &plans;
        let sign = async move {
            for group in &groups {
                if cancel.is_cancelled() {
                    break;
                }
                let signed = self.sign_group(plans, group, fees).await;
                let stop = signed.is_err();
                if tx.send(signed).await.is_err() || stop {
                    break;
                }
            }
        };
        let commit = async {
            while let Some(signed) = rx.recv().await {
                if cancel.is_cancelled() {
                    // Signed but not committed: discarded unbroadcast, the requests
                    // stay queued.
                    break;
                }
                let committed = match signed {
                    Ok(group) => self.commit_group(plans, group, fees).await,
                    Err(e) => Err(e),
                };
                match committed {
                    Ok((done, err)) => {
                        if let Some(e) = err {
                            out.fail(e);
                        }
                        out.moved += done.len();
                        out.signed += done.len();
                        if let Some(sink) = sink
                            && !done.is_empty()
                        {
                            // Committed: these may be broadcast now. A closed receiver
                            // only means the broadcaster failed; the rows stay `signed`
                            // for the next round.
                            let _ = sink.send(done);
                        }
                    }
                    // The store failed: nothing more is signed this round.
                    Err(e) => {
                        out.fail(e);
                        break;
                    }
                }
            }
        };
        tokio::join!(sign, commit);
        out
    }

    /// Senders with a signer and queued requests, none waiting for funding, as
    /// [`TxQueue::sign_round`] takes them (no funding check due).
    async fn senders_ready(&self) -> Result<Vec<(Address, bool)>> {
        Ok(store::senders_with_work(&self.db, self.chain_id)
            .await?
            .into_iter()
            .filter(|w| !w.waiting_funding)
            .filter_map(|w| Address::try_from(w.sender.as_slice()).ok())
            .filter(|s| self.signers.contains_key(s))
            .map(|s| (s, false))
            .collect())
    }

    /// Creates `sender`'s nonce row from the chain's pending nonce when it does not
    /// exist (the row is never deleted, so this looks once per process).
    async fn ensure_sender(&self, sender: Address) -> Result<()> {
        let known = self
            .initialized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&sender);
        if known {
            return Ok(());
        }
        if !store::sender_exists(&self.db, self.chain_id, sender.as_slice()).await? {
            let nonce = self.chain.nonce(sender, BlockNumberOrTag::Pending).await?;
            let nonce = i64::try_from(nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?;
            store::sender_init(&self.db, self.chain_id, sender.as_slice(), nonce).await?;
        }
        self.initialized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(sender);
        Ok(())
    }

    /// Sets `keel_txq_queue_depth{chain_id}` (queued + waiting_funding),
    /// `keel_txq_waiting_funding{chain_id}` and `keel_txq_in_flight{chain_id,sender}`
    /// (signed + broadcast) for every registered sender (a bounded label set).
    async fn record_gauges(&self) -> Result<()> {
        let rows = store::depth(&self.db, self.chain_id).await?;
        let (mut depth, mut waiting) = (0_i64, 0_i64);
        let mut in_flight: HashMap<Vec<u8>, i64> = HashMap::new();
        for r in rows {
            match r.state.as_str() {
                "queued" => depth += r.n,
                "waiting_funding" => {
                    depth += r.n;
                    waiting += r.n;
                }
                _ => *in_flight.entry(r.sender).or_default() += r.n,
            }
        }
        let chain = self.chain_id.to_string();
        metrics::gauge!("keel_txq_queue_depth", "chain_id" => chain.clone()).set(depth as f64);
        metrics::gauge!("keel_txq_waiting_funding", "chain_id" => chain.clone())
            .set(waiting as f64);
        for sender in self.signers.keys() {
            let n = in_flight.get(sender.as_slice()).copied().unwrap_or(0);
            metrics::gauge!("keel_txq_in_flight", "chain_id" => chain.clone(), "sender" => sender.to_string())
                .set(n as f64);
        }
        Ok(())
    }

    /// The sender pass: a [`TxQueue::round`] for `sender` alone. Signs and persists
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

    /// The `signed` requests (of `only`, or of every sender with a signer) with their
    /// attempts, by sender in nonce order.
    async fn signed_of(&self, only: Option<Address>) -> Result<Vec<ToSend>> {
        let signed = store::requests_in_flight(
            &self.db,
            self.chain_id,
            only.as_ref().map(|s| s.as_slice()),
            Some("signed"),
        )
        .await?;
        let signed: Vec<RequestRow> = signed
            .into_iter()
            .filter(|r| {
                Address::try_from(r.sender.as_slice()).is_ok_and(|s| self.signers.contains_key(&s))
            })
            .collect();
        if signed.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = signed.iter().map(|r| r.id).collect();
        let mut attempts: HashMap<Uuid, Vec<AttemptRow>> = HashMap::new();
        for a in store::attempts_of(&self.db, &ids).await? {
            attempts.entry(a.request_id).or_default().push(a);
        }
        Ok(signed
            .into_iter()
            .map(|r| {
                let mine = attempts.remove(&r.id).unwrap_or_default();
                (r, mine)
            })
            .collect())
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

    /// The funding check of `sender`'s `waiting_funding` requests, oldest first: one
    /// whose cost (its gas limit × the current max fee per gas + value, wei) the
    /// sender's pending balance covers goes back to `queued` (the balance is spent down
    /// locally for the next one); otherwise, past its deadline (database clock), it
    /// settles `Failed { code: "FUNDING_DEADLINE_EXPIRED" }`; otherwise its shortfall is
    /// updated and it keeps waiting. Returns whether one still waits, and how many
    /// moved.
    async fn check_funding(&self, sender: Address) -> Result<(bool, usize)> {
        let waiting =
            store::funding_open(&self.db, Some(self.chain_id), Some(sender.as_slice())).await?;
        if waiting.is_empty() {
            return Ok((false, 0));
        }
        let (max_fee, _tip) = self.fees().await?;
        let mut available = self
            .chain
            .balance(sender, BlockNumberOrTag::Pending)
            .await?
            .wei
            .get();
        let chain = self.chain_id.to_string();
        let mut moved = 0;
        for w in &waiting {
            let value: U256 = w
                .value_wei
                .parse()
                .map_err(|_| TxqError::InvalidRequest("value"))?;
            let gas = u64::try_from(w.funding_gas_limit)
                .map_err(|_| TxqError::InvalidRequest("gas_limit"))?;
            let need = U256::from(gas)
                .saturating_mul(U256::from(max_fee))
                .saturating_add(value);
            if available >= need {
                available -= need;
                if store::request_resume(&self.db, w.id).await? {
                    tracing::info!(target: "keel::txq", request = %w.id, %sender, "funds arrived; request resumes");
                    metrics::counter!("keel_txq_funding_resumed_total", "chain_id" => chain.clone())
                        .increment(1);
                    moved += 1;
                }
                continue;
            }
            if w.expired {
                let verdict = failed("FUNDING_DEADLINE_EXPIRED", vec![]);
                let json = serde_json::to_value(&verdict)
                    .map_err(|_| TxqError::InvalidRequest("verdict"))?;
                if store::request_expire_funding(&self.db, w.id, &json, verdict.kind()).await? {
                    metrics::counter!("keel_txq_verdicts_total", "chain_id" => chain.clone(), "kind" => verdict.kind()).increment(1);
                    tracing::warn!(target: "keel::txq", request = %w.id, %sender, "funding deadline passed; request failed");
                    moved += 1;
                }
                continue;
            }
            let short = need - available;
            store::request_update_funding(&self.db, w.id, &short.to_string(), &max_fee.to_string())
                .await?;
            return Ok((true, moved));
        }
        Ok((false, moved))
    }

    /// Broadcasts the latest attempt of every `signed` request of `sender` in nonce
    /// order, a bounded number in flight; those that must be retried stay `signed` and
    /// go out again (same bytes) next pass.
    async fn broadcast_signed(&self, sender: Address, cancel: &CancellationToken) -> Result<usize> {
        let mut moved = 0;
        for chunk in self.signed_of(Some(sender)).await?.chunks(BROADCAST_CHUNK) {
            moved += self.broadcast_many(chunk, cancel).await?;
        }
        Ok(moved)
    }

    /// Broadcasts the last attempt of each request of `items` (grouped by sender, each
    /// sender's in nonce order), then marks the accepted ones `broadcast` in one
    /// statement. Returns how many moved (accepted or settled).
    ///
    /// With JSON-RPC batches (`broadcast_batch` > 1), up to `broadcast_in_flight /
    /// broadcast_batch` batches are outstanding at once, each holding one sender's
    /// consecutive nonces; a sender gets more than one of them only when fewer senders
    /// than that have requests here (Anvil 1.7.1 can strand a transaction whose
    /// predecessor arrives concurrently: a sender's nonces arrive in order whenever
    /// the parallelism can come from other senders). Without batches, up to
    /// `broadcast_in_flight` single sends are outstanding (nodes hold a briefly
    /// out-of-order nonce until its predecessor arrives).
    ///
    /// Failed broadcasts are recorded ([`TxQueue::broadcast_failed`]). Nothing is sent
    /// once `cancel` fired, and nothing is written after it fired (sent requests then
    /// stay `signed`; the next owner sends the same bytes again).
    async fn broadcast_many(&self, items: &[ToSend], cancel: &CancellationToken) -> Result<usize> {
        use futures::StreamExt;
        if cancel.is_cancelled() {
            return Ok(0);
        }
        // The futures are built up front (no closure over borrowed rows inside the
        // stream), which keeps this future `Send`.
        let results: Vec<Result<Broadcast>> = if self.config.broadcast_batch > 1 {
            let batch = self.config.broadcast_batch;
            // One lane per run of the same sender.
            let mut lanes: Vec<(usize, &[ToSend])> = Vec::new();
            let mut start = 0;
            for i in 1..=items.len() {
                if i == items.len() || items[i].0.sender != items[start].0.sender {
                    lanes.push((start, &items[start..i]));
                    start = i;
                }
            }
            // Batches in flight at once, shared by the lanes; a lane gets more than one
            // only when there are fewer lanes than that.
            let slots = (self.config.broadcast_in_flight / batch).max(1);
            let per_lane = (slots / lanes.len().max(1)).max(1);
            let lanes: Vec<_> = lanes
                .into_iter()
                .map(|(offset, lane)| async move {
                    let batches: Vec<_> = lane.chunks(batch).map(|c| self.send_batch(c)).collect();
                    let out: Vec<Vec<Result<Broadcast>>> = futures::stream::iter(batches)
                        .buffered(per_lane)
                        .collect()
                        .await;
                    (offset, out.into_iter().flatten().collect::<Vec<_>>())
                })
                .collect();
            let mut done: Vec<(usize, Vec<Result<Broadcast>>)> = futures::stream::iter(lanes)
                .buffer_unordered(slots)
                .collect()
                .await;
            done.sort_by_key(|(offset, _)| *offset);
            done.into_iter().flat_map(|(_, out)| out).collect()
        } else {
            let sends: Vec<_> = items
                .iter()
                .map(|(req, mine)| self.send_last(req, mine))
                .collect();
            futures::stream::iter(sends)
                .buffered(self.config.broadcast_in_flight.max(1))
                .collect()
                .await
        };
        let mut accepted = Vec::new();
        let mut failures = Vec::new();
        let mut moved = 0;
        let mut first_err = None;
        for ((req, _), r) in items.iter().zip(results) {
            match r {
                Ok(Broadcast::Accepted) => accepted.push(req.id),
                Ok(Broadcast::Settled) => moved += 1,
                Ok(Broadcast::Retry(Some(class))) => failures.push((req.id, class)),
                Ok(Broadcast::Retry(None)) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if cancel.is_cancelled() {
            return first_err.map_or(Ok(moved), Err);
        }
        self.broadcast_failed(&failures).await?;
        // A failure here leaves them `signed`: the next pass sends the same bytes
        // again ("already known", or "nonce too low" resolved by their receipts).
        let marked = store::requests_mark_broadcast_many(&self.db, &accepted).await?;
        let chain = self.chain_id.to_string();
        let histogram =
            metrics::histogram!("keel_txq_time_to_broadcast_seconds", "chain_id" => chain.clone());
        for secs in &marked {
            histogram.record(*secs);
        }
        metrics::counter!("keel_txq_broadcast_total", "chain_id" => chain)
            .increment(accepted.len() as u64);
        moved += accepted.len();
        match first_err {
            Some(e) => Err(e),
            None => Ok(moved),
        }
    }

    /// [`TxQueue::send_last`] for every item of `items` with one JSON-RPC batch;
    /// one outcome per item, in order.
    async fn send_batch(&self, items: &[ToSend]) -> Vec<Result<Broadcast>> {
        let raws: Vec<Bytes> = items
            .iter()
            .filter_map(|(_, mine)| mine.last().map(|a| Bytes::from(a.raw.clone())))
            .collect();
        let answers = match self.chain.send_raw_transactions(&raws).await {
            Ok(answers) => answers,
            Err(e) => {
                tracing::debug!(target: "keel::txq", error = %e, "batched broadcast failed; the same bytes go out next pass");
                let class = error_class(&e);
                return items
                    .iter()
                    .map(|(_, mine)| Ok(Broadcast::Retry((!mine.is_empty()).then_some(class))))
                    .collect();
            }
        };
        let mut answers = answers.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for (req, mine) in items {
            if mine.is_empty() {
                out.push(Ok(Broadcast::Retry(None)));
                continue;
            }
            let sent = match answers.next() {
                Some(Ok(hash)) => Ok(hash),
                Some(Err(error)) => Err(ChainError::Node {
                    method: "eth_sendRawTransaction",
                    error,
                }),
                None => {
                    out.push(Ok(Broadcast::Retry(None)));
                    continue;
                }
            };
            out.push(self.sent(req, mine, sent).await);
        }
        out
    }

    async fn send_last(&self, req: &RequestRow, mine: &[AttemptRow]) -> Result<Broadcast> {
        match mine.last() {
            Some(last) => self.send(req, last, mine).await,
            None => Ok(Broadcast::Retry(None)),
        }
    }

    /// (max fee, priority fee) per gas in wei for a new transaction: twice the latest
    /// base fee plus the node's tip suggestion, and that tip (EIP-1559).
    async fn fees(&self) -> Result<(u128, u128)> {
        let (base, tip) = self.market().await?;
        Ok((base.saturating_mul(2).saturating_add(tip), tip))
    }

    /// (base fee of the latest block, the node's tip suggestion), wei per gas.
    async fn market(&self) -> Result<(u128, u128)> {
        let block: Option<Block> = self
            .chain
            .request("eth_getBlockByNumber", (BlockNumberOrTag::Latest, false))
            .await?;
        let base = block.and_then(|b| b.header.base_fee_per_gas).unwrap_or(0) as u128;
        let tip = self.chain.max_priority_fee().await?.wei_per_gas;
        let tip = u128::try_from(tip).unwrap_or(u128::MAX);
        Ok((base, tip))
    }

    /// Prepares one queued request for signing: its gas limit (estimated when not
    /// fixed) and what it costs; settles it `failed` when it can never be signed
    /// (estimation reverts, the sender cannot pay and the request has no funding
    /// pause), or moves it to `waiting_funding` (the sender cannot pay, funding pause
    /// enabled). Nothing here takes a nonce.
    async fn prepare(
        &self,
        sender: Address,
        req: &RequestRow,
        (max_fee, _tip): (u128, u128),
        available: &mut U256,
    ) -> Result<Prepared> {
        let to = req
            .to_address
            .as_deref()
            .map(Address::try_from)
            .transpose()
            .map_err(|_| TxqError::InvalidRequest("to"))?;
        let value: U256 = req
            .value_wei
            .parse()
            .map_err(|_| TxqError::InvalidRequest("value"))?;
        let data = Bytes::from(req.calldata.clone());
        let gas_limit = match req.gas_limit {
            Some(g) => u64::try_from(g).map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
            None => {
                let call = TransactionRequest {
                    from: Some(sender),
                    to: Some(to.map_or(TxKind::Create, TxKind::Call)),
                    value: Some(value),
                    input: data.clone().into(),
                    ..Default::default()
                };
                match self
                    .chain
                    .request::<_, U64>("eth_estimateGas", (call,))
                    .await
                {
                    Ok(g) => {
                        let g = g.to::<u64>();
                        g.saturating_add(
                            g.saturating_mul(self.config.gas_limit_headroom_percent) / 100,
                        )
                    }
                    Err(ChainError::Node { error, .. }) => {
                        let verdict = match error.kind {
                            NodeErrorKind::ExecutionReverted => {
                                let revert = error.revert.unwrap_or(keel_chain::RevertReason {
                                    message: None,
                                    data: Bytes::new(),
                                });
                                SettlementVerdict::Failed {
                                    code: "EXECUTION_REVERTED".into(),
                                    reason: revert.message,
                                    revert_data: Some(revert.data),
                                    attempts: vec![],
                                }
                            }
                            NodeErrorKind::InsufficientFunds if req.funding_pause_ms.is_some() => {
                                // The node refuses to estimate without funds: estimate as
                                // if funded; a lower bound of 21,000 gas when it cannot.
                                let gas = self.estimate_funded(sender, to, value, &data).await;
                                return self
                                    .wait_for_funds(req, gas, max_fee, value, *available)
                                    .await;
                            }
                            NodeErrorKind::InsufficientFunds => failed("GAS_REQUIRED", vec![]),
                            _ => failed("REJECTED", vec![]),
                        };
                        self.settle(req.id, &verdict).await?;
                        return Ok(Prepared::Settled);
                    }
                    Err(e) => {
                        tracing::debug!(target: "keel::txq", error = %e, "estimation failed; retry next pass");
                        return Ok(Prepared::Retry);
                    }
                }
            }
        };
        let need = U256::from(gas_limit)
            .saturating_mul(U256::from(max_fee))
            .saturating_add(value);
        if *available < need {
            if req.funding_pause_ms.is_some() {
                return self
                    .wait_for_funds(req, gas_limit, max_fee, value, *available)
                    .await;
            }
            self.settle(req.id, &failed("GAS_REQUIRED", vec![])).await?;
            return Ok(Prepared::Settled);
        }
        *available -= need;
        Ok(Prepared::Ready(Box::new(ReadyTx {
            id: req.id,
            row: req.clone(),
            to,
            value,
            data,
            gas_limit,
        })))
    }

    /// Moves a queued request with a funding pause to `waiting_funding`, its funding
    /// request being `gas_limit × max_fee + value − available` wei (deadline set on the
    /// first detection). Takes no nonce.
    async fn wait_for_funds(
        &self,
        req: &RequestRow,
        gas_limit: u64,
        max_fee: u128,
        value: U256,
        available: U256,
    ) -> Result<Prepared> {
        let need = U256::from(gas_limit)
            .saturating_mul(U256::from(max_fee))
            .saturating_add(value);
        let short = need.saturating_sub(available).max(U256::from(1));
        let gas = i64::try_from(gas_limit).map_err(|_| TxqError::InvalidRequest("gas_limit"))?;
        if !store::request_wait_funding(
            &self.db,
            req.id,
            &short.to_string(),
            gas,
            &max_fee.to_string(),
        )
        .await?
        {
            // Moved by another process meanwhile.
            return Ok(Prepared::Retry);
        }
        metrics::counter!("keel_txq_funding_paused_total", "chain_id" => self.chain_id.to_string())
            .increment(1);
        tracing::warn!(target: "keel::txq", request = %req.id, required_wei = %short, "sender cannot pay; request waits for funding");
        Ok(Prepared::Waiting)
    }

    /// `eth_estimateGas` with the sender's balance overridden (state override), for a
    /// request the node refused to estimate for lack of funds; 21,000 (the intrinsic
    /// minimum, a lower bound) when the node supports no override or still refuses.
    async fn estimate_funded(
        &self,
        sender: Address,
        to: Option<Address>,
        value: U256,
        data: &Bytes,
    ) -> u64 {
        let call = TransactionRequest {
            from: Some(sender),
            to: Some(to.map_or(TxKind::Create, TxKind::Call)),
            value: Some(value),
            input: data.clone().into(),
            ..Default::default()
        };
        let balance = value.saturating_add(U256::from(10u128.pow(30)));
        let overrides =
            serde_json::json!({ sender.to_string(): { "balance": format!("{balance:#x}") } });
        match self
            .chain
            .request::<_, U64>(
                "eth_estimateGas",
                (call, BlockNumberOrTag::Latest, overrides),
            )
            .await
        {
            Ok(g) => {
                let g = g.to::<u64>();
                g.saturating_add(g.saturating_mul(self.config.gas_limit_headroom_percent) / 100)
            }
            Err(e) => {
                tracing::debug!(target: "keel::txq", error = %e, "estimation with a balance override failed; using 21,000 gas as a lower bound");
                21_000
            }
        }
    }

    /// Signs the pieces of `group` (skipping senders that failed earlier this round)
    /// with consecutive nonces from each sender's next nonce as read. The signatures
    /// are requested concurrently (up to [`SIGN_IN_FLIGHT`] at once; the signer may be
    /// remote); a piece with a failed signature is left out of the commit.
    async fn sign_group(
        &self,
        plans: &[SenderPlan],
        group: &[Piece],
        (max_fee, tip): (u128, u128),
    ) -> Result<SignedGroup> {
        use futures::StreamExt;
        let pieces: Vec<Piece> = group
            .iter()
            .filter(|p| {
                !plans[p.plan]
                    .failed
                    .load(std::sync::atomic::Ordering::Acquire)
            })
            .copied()
            .collect();
        let mut futures = Vec::new();
        for piece in &pieces {
            let plan = &plans[piece.plan];
            let signer = self
                .signers
                .get(&plan.sender)
                .ok_or(TxqError::UnknownSender)?;
            for (k, r) in plan.ready[piece.start..piece.start + piece.len]
                .iter()
                .enumerate()
            {
                let nonce = plan.first + to_i64(piece.start + k)?;
                futures.push(signer.sign(TxEip1559 {
                    chain_id: self.chain.chain().get(),
                    nonce: u64::try_from(nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
                    gas_limit: r.gas_limit,
                    max_fee_per_gas: max_fee,
                    max_priority_fee_per_gas: tip,
                    to: r.to.map_or(TxKind::Create, TxKind::Call),
                    value: r.value,
                    access_list: Default::default(),
                    input: r.data.clone(),
                }));
            }
        }
        let mut envelopes = futures::stream::iter(futures)
            .buffered(SIGN_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter();
        // Per piece: (nonce, hash, raw, gas) of each request, or a signing error.
        let mut first_err = None;
        let mut signed: Vec<Option<Vec<SignedTx>>> = Vec::new();
        for piece in &pieces {
            let plan = &plans[piece.plan];
            let mut rows = Some(Vec::with_capacity(piece.len));
            for (k, r) in plan.ready[piece.start..piece.start + piece.len]
                .iter()
                .enumerate()
            {
                let envelope = envelopes.next();
                let Some(list) = rows.as_mut() else {
                    continue;
                };
                match envelope {
                    Some(Ok(envelope)) => list.push((
                        plan.first + to_i64(piece.start + k)?,
                        *envelope.tx_hash(),
                        envelope.encoded_2718(),
                        i64::try_from(r.gas_limit)
                            .map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
                    )),
                    Some(Err(e)) => {
                        first_err.get_or_insert(TxqError::from(e));
                        rows = None;
                    }
                    None => rows = None,
                }
            }
            signed.push(rows);
        }
        Ok(SignedGroup {
            pieces,
            signed,
            error: first_err,
        })
    }

    /// Commits a signed group in one statement ([`store::commit_signed`]). Returns the
    /// committed requests with their attempt, ready to broadcast, and the group's first
    /// signing error. A sender whose signature failed, or whose slice did not commit
    /// (its next nonce moved or a request was taken by another process), is marked
    /// failed: its later pieces are not signed this round, and its requests stay
    /// queued.
    async fn commit_group(
        &self,
        plans: &[SenderPlan],
        SignedGroup {
            pieces,
            signed,
            error: first_err,
        }: SignedGroup,
        (max_fee, tip): (u128, u128),
    ) -> Result<(Vec<ToSend>, Option<TxqError>)> {
        let (max_fee_s, tip_s) = (max_fee.to_string(), tip.to_string());
        let slices: Vec<store::SignedSlice<'_>> = pieces
            .iter()
            .zip(&signed)
            .filter_map(|(piece, rows)| {
                let plan = &plans[piece.plan];
                let rows = rows.as_ref()?;
                Some(store::SignedSlice {
                    sender: plan.sender.as_slice(),
                    first: plan.first + i64::try_from(piece.start).ok()?,
                    attempts: plan.ready[piece.start..piece.start + piece.len]
                        .iter()
                        .zip(rows)
                        .map(|(r, (nonce, hash, raw, gas))| NewAttempt {
                            request_id: r.id,
                            attempt: 1,
                            nonce: *nonce,
                            hash: hash.as_slice(),
                            raw,
                            max_fee: max_fee_s.clone(),
                            priority_fee: tip_s.clone(),
                            gas_limit: *gas,
                        })
                        .collect(),
                })
            })
            .collect();
        let committed: std::collections::HashSet<Vec<u8>> = if slices.is_empty() {
            Default::default()
        } else {
            store::commit_signed(&self.db, self.chain_id, &slices)
                .await?
                .into_iter()
                .collect()
        };
        drop(slices);
        let mut done = Vec::new();
        let failed: Vec<usize> = pieces
            .iter()
            .zip(signed)
            .filter_map(|(piece, rows)| {
                let plan = &plans[piece.plan];
                let Some(rows) = rows else {
                    return Some(piece.plan);
                };
                if !committed.contains(plan.sender.as_slice()) {
                    tracing::debug!(target: "keel::txq", sender = %plan.sender, "next nonce or requests changed meanwhile; nothing committed, retried next round");
                    return Some(piece.plan);
                }
                for (r, (nonce, hash, raw, gas)) in plan.ready
                    [piece.start..piece.start + piece.len]
                    .iter()
                    .zip(rows)
                {
                    let mut row = r.row.clone();
                    row.state = "signed".to_owned();
                    row.nonce = Some(nonce);
                    let attempt = AttemptRow {
                        request_id: r.id,
                        attempt: 1,
                        nonce,
                        tx_hash: hash.to_vec(),
                        raw,
                        max_fee_per_gas: max_fee_s.clone(),
                        max_priority_fee_per_gas: tip_s.clone(),
                        gas_limit: gas,
                        age_ms: 0,
                    };
                    done.push((row, vec![attempt]));
                }
                None
            })
            .collect();
        for plan in failed {
            plans[plan]
                .failed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        metrics::counter!("keel_txq_signed_total", "chain_id" => self.chain_id.to_string())
            .increment(done.len() as u64);
        Ok((done, first_err))
    }

    /// Broadcasts `attempt`'s bytes and records what the node said (nothing once
    /// `cancel` fired).
    async fn broadcast(
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
            if let Some(secs) = store::request_mark_broadcast(&self.db, req.id).await? {
                metrics::histogram!("keel_txq_time_to_broadcast_seconds", "chain_id" => self.chain_id.to_string())
                    .record(secs);
            }
            metrics::counter!("keel_txq_broadcast_total", "chain_id" => self.chain_id.to_string())
                .increment(1);
        }
        Ok(sent)
    }

    /// Sends `attempt`'s bytes and handles what the node said, except recording an
    /// acceptance (the caller marks [`Broadcast::Accepted`] requests `broadcast`).
    async fn send(
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
    async fn sent(
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
                    // Ours mined (or known) means success; only the absence of every
                    // attempt after the nonce passed means someone else took it.
                    if !self.any_attempt_known(all).await? {
                        self.settle(
                            req.id,
                            &failed("NONCE_CONSUMED_EXTERNALLY", attempt_records(all)),
                        )
                        .await?;
                        return Ok(Broadcast::Settled);
                    }
                }
                NodeErrorKind::InsufficientFunds => {
                    if req.state == "broadcast" {
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
                    self.settle(req.id, &failed("GAS_REQUIRED", attempt_records(all)))
                        .await?;
                    return Ok(Broadcast::Settled);
                }
                NodeErrorKind::IntrinsicGasTooLow => {
                    self.settle(
                        req.id,
                        &failed("INTRINSIC_GAS_TOO_LOW", attempt_records(all)),
                    )
                    .await?;
                    return Ok(Broadcast::Settled);
                }
                NodeErrorKind::ExceedsBlockGasLimit => {
                    self.settle(
                        req.id,
                        &failed("EXCEEDS_BLOCK_GAS_LIMIT", attempt_records(all)),
                    )
                    .await?;
                    return Ok(Broadcast::Settled);
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
    async fn broadcast_failed(&self, failures: &[(Uuid, &'static str)]) -> Result<()> {
        if failures.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = failures.iter().map(|f| f.0).collect();
        let classes: Vec<&str> = failures.iter().map(|f| f.1).collect();
        let chain = self.chain_id.to_string();
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
                metrics::counter!("keel_txq_broadcast_failures_total", "chain_id" => chain.clone(), "class" => class)
                    .increment(n);
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

    async fn any_attempt_known(&self, attempts: &[AttemptRow]) -> Result<bool> {
        for a in attempts {
            let hash = B256::try_from(a.tx_hash.as_slice())
                .map_err(|_| TxqError::InvalidRequest("tx_hash"))?;
            let tx: Option<serde_json::Value> = self
                .chain
                .request("eth_getTransactionByHash", (hash,))
                .await?;
            if tx.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn settle(&self, id: Uuid, verdict: &SettlementVerdict) -> Result<()> {
        let json =
            serde_json::to_value(verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
        if let Some(secs) = store::request_settle(&self.db, id, &json, verdict.kind()).await? {
            metrics::counter!("keel_txq_verdicts_total", "chain_id" => self.chain_id.to_string(), "kind" => verdict.kind()).increment(1);
            if !matches!(verdict, SettlementVerdict::Failed { .. }) {
                metrics::histogram!("keel_txq_time_to_confirmation_seconds", "chain_id" => self.chain_id.to_string())
                    .record(secs);
            }
            tracing::info!(target: "keel::txq", request = %id, verdict = verdict.kind(), "request settled");
        }
        Ok(())
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
    /// node whose answer was lost, and mined), and once the chain's nonce of the sender
    /// passed theirs while no node knows any of their attempts they settle
    /// `Failed { code: "NONCE_CONSUMED_EXTERNALLY" }`. A `broadcast` transaction is
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
        use futures::StreamExt;
        if cancel.is_cancelled() {
            return Ok(0);
        }
        let in_flight = store::requests_in_flight(&self.db, self.chain_id, None, None).await?;
        if in_flight.is_empty() {
            return Ok(0);
        }
        // Per sender, the lowest nonce that is still `signed` (never accepted by a
        // node): no later nonce of the sender is replaced while it is unsent.
        let mut lowest_unsent: HashMap<&[u8], i64> = HashMap::new();
        for req in in_flight.iter().filter(|r| r.state == "signed") {
            if let Some(nonce) = req.nonce {
                let low = lowest_unsent.entry(req.sender.as_slice()).or_insert(nonce);
                *low = (*low).min(nonce);
            }
        }
        // The requests reconciled here: every `broadcast` one, and the `signed` ones
        // whose broadcasts failed (the others are being sent by the sender round).
        let watched: Vec<&RequestRow> = in_flight
            .iter()
            .filter(|r| r.state == "broadcast" || r.broadcast_failures > 0)
            .collect();
        if watched.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = watched.iter().map(|r| r.id).collect();
        let mut attempts: HashMap<Uuid, Vec<AttemptRow>> = HashMap::new();
        for a in store::attempts_of(&self.db, &ids).await? {
            attempts.entry(a.request_id).or_default().push(a);
        }
        let hashes: Vec<B256> = attempts
            .values()
            .flatten()
            .filter_map(|a| B256::try_from(a.tx_hash.as_slice()).ok())
            .collect();
        let head = self.chain.block_number().await?;
        let receipts = by_batches(&hashes, |chunk| self.chain.receipts(chunk)).await?;
        let by_hash: HashMap<B256, TransactionReceipt> = hashes
            .iter()
            .zip(receipts)
            .filter_map(|(h, r)| r.map(|r| (*h, r)))
            .collect();
        let empty = Vec::new();
        let mut verdicts: Vec<(Uuid, SettlementVerdict)> = Vec::new();
        let mut unmined: Vec<(&RequestRow, &[AttemptRow])> = Vec::new();
        let mut unsent: Vec<(&RequestRow, &[AttemptRow])> = Vec::new();
        for req in watched {
            let mine = attempts.get(&req.id).unwrap_or(&empty);
            let receipt = mine
                .iter()
                .filter_map(|a| B256::try_from(a.tx_hash.as_slice()).ok())
                .find_map(|h| by_hash.get(&h));
            let Some(receipt) = receipt else {
                if req.state == "broadcast" {
                    unmined.push((req, mine));
                } else {
                    unsent.push((req, mine));
                }
                continue;
            };
            let Some(block) = receipt.block_number else {
                continue;
            };
            self.saw_included(&req.sender, block);
            if head.saturating_sub(block) + 1 < self.config.confirmations {
                continue;
            }
            if cancel.is_cancelled() {
                return Ok(0);
            }
            let verdict = if receipt.status() {
                SettlementVerdict::Confirmed {
                    block,
                    hash: receipt.transaction_hash,
                    gas_used: receipt.gas_used,
                    effective_gas_price: receipt.effective_gas_price.to_string(),
                    attempts: attempt_records(mine),
                }
            } else {
                let revert = self.revert_reason(req, block).await;
                SettlementVerdict::Reverted {
                    block,
                    hash: receipt.transaction_hash,
                    reason: revert.as_ref().and_then(|r| r.message.clone()),
                    revert_data: revert.map(|r| r.data),
                    attempts: attempt_records(mine),
                }
            };
            verdicts.push((req.id, verdict));
        }
        if cancel.is_cancelled() {
            return Ok(0);
        }
        let mut settled = self.settle_many(&verdicts).await?;
        // `signed` requests without a receipt whose nonce the chain passed: another
        // transaction took it, unless a node knows one of their attempts (mined, its
        // receipt not served yet).
        settled += self.reconcile_unsent(&unsent, cancel).await?;
        if cancel.is_cancelled() {
            return Ok(settled);
        }
        // Requests without a receipt: still known to the node (wait, or replace when
        // stuck), or dropped (re-broadcast the same bytes). Only each sender's lowest
        // nonce may be replaced for being stuck, unless the others are underpriced.
        let mut lowest: HashMap<&[u8], i64> = HashMap::new();
        for (req, _) in &unmined {
            if let Some(nonce) = req.nonce {
                let low = lowest.entry(req.sender.as_slice()).or_insert(nonce);
                *low = (*low).min(nonce);
            }
        }
        let blocked = |req: &RequestRow| {
            req.nonce.is_some_and(|n| {
                lowest_unsent
                    .get(req.sender.as_slice())
                    .is_some_and(|low| *low < n)
            })
        };
        // The market is read only when a sender has stuck requests above its lowest.
        let market = if unmined.iter().any(|(req, mine)| {
            lowest.get(req.sender.as_slice()) != req.nonce.as_ref()
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
            .filter_map(|a| B256::try_from(a.tx_hash.as_slice()).ok())
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
                let is_lowest =
                    req.nonce.is_some() && lowest.get(req.sender.as_slice()) == req.nonce.as_ref();
                let underpriced = market.is_some_and(|(base, tip)| {
                    mine.last().is_some_and(|a| {
                        a.max_fee_per_gas.parse::<u128>().is_ok_and(|f| f < base)
                            || a.max_priority_fee_per_gas
                                .parse::<u128>()
                                .is_ok_and(|t| t < tip)
                    })
                });
                let known = mine.iter().any(|a| {
                    B256::try_from(a.tx_hash.as_slice()).is_ok_and(|h| known_hashes.contains(&h))
                });
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
        Ok(settled)
    }

    /// `signed` requests with failed broadcasts and no receipt: when the chain's
    /// latest nonce of their sender is above theirs and no node knows any of their
    /// attempts, another transaction took the nonce and they settle
    /// `NONCE_CONSUMED_EXTERNALLY`. The nonce is read before the attempts are looked
    /// up, so an attempt that mines in between is found. Returns how many settled.
    async fn reconcile_unsent(
        &self,
        unsent: &[(&RequestRow, &[AttemptRow])],
        cancel: &CancellationToken,
    ) -> Result<usize> {
        if unsent.is_empty() || cancel.is_cancelled() {
            return Ok(0);
        }
        let mut latest: HashMap<&[u8], i64> = HashMap::new();
        for (req, _) in unsent {
            if latest.contains_key(req.sender.as_slice()) {
                continue;
            }
            let sender = Address::try_from(req.sender.as_slice())
                .map_err(|_| TxqError::InvalidRequest("sender"))?;
            let n = self.chain.nonce(sender, BlockNumberOrTag::Latest).await?;
            let n = i64::try_from(n).map_err(|_| TxqError::InvalidRequest("nonce"))?;
            latest.insert(req.sender.as_slice(), n);
        }
        let passed: Vec<&(&RequestRow, &[AttemptRow])> = unsent
            .iter()
            .filter(|(req, _)| {
                req.nonce
                    .is_some_and(|n| latest.get(req.sender.as_slice()).is_some_and(|l| *l > n))
            })
            .collect();
        if passed.is_empty() {
            return Ok(0);
        }
        let hashes: Vec<B256> = passed
            .iter()
            .flat_map(|(_, mine)| mine.iter())
            .filter_map(|a| B256::try_from(a.tx_hash.as_slice()).ok())
            .collect();
        let answers = by_batches(&hashes, |chunk| self.chain.transactions_known(chunk)).await?;
        let known: std::collections::HashSet<B256> = hashes
            .iter()
            .zip(answers)
            .filter_map(|(hash, known)| known.then_some(*hash))
            .collect();
        let verdicts: Vec<(Uuid, SettlementVerdict)> = passed
            .into_iter()
            .filter(|(_, mine)| {
                !mine.iter().any(|a| {
                    B256::try_from(a.tx_hash.as_slice()).is_ok_and(|h| known.contains(&h))
                })
            })
            .map(|(req, mine)| {
                tracing::warn!(target: "keel::txq", request = %req.id, "nonce passed on chain by another transaction while the request could not be broadcast");
                (
                    req.id,
                    failed("NONCE_CONSUMED_EXTERNALLY", attempt_records(mine)),
                )
            })
            .collect();
        if cancel.is_cancelled() {
            return Ok(0);
        }
        self.settle_many(&verdicts).await
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
            .get(&req.sender)
            .is_some_and(|(_, since)| since.elapsed() < after);
        old && !moving
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

    /// Settles many requests in one statement; metrics and logs for the ones that
    /// moved (a request settled already keeps its verdict and is not counted again).
    /// Returns how many moved.
    async fn settle_many(&self, verdicts: &[(Uuid, SettlementVerdict)]) -> Result<usize> {
        if verdicts.is_empty() {
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(verdicts.len());
        let mut json = Vec::with_capacity(verdicts.len());
        let mut kinds = Vec::with_capacity(verdicts.len());
        for (id, v) in verdicts {
            ids.push(*id);
            json.push(serde_json::to_string(v).map_err(|_| TxqError::InvalidRequest("verdict"))?);
            kinds.push(v.kind());
        }
        let rows = store::requests_settle_many(&self.db, &ids, &json, &kinds).await?;
        let chain = self.chain_id.to_string();
        let time_to_confirmation = metrics::histogram!("keel_txq_time_to_confirmation_seconds", "chain_id" => chain.clone());
        for r in &rows {
            let kind = kinds
                .iter()
                .find(|k| **k == r.kind)
                .copied()
                .unwrap_or("failed");
            metrics::counter!("keel_txq_verdicts_total", "chain_id" => chain.clone(), "kind" => kind)
                .increment(1);
            if kind != "failed" {
                time_to_confirmation.record(r.secs);
            }
            tracing::info!(target: "keel::txq", request = %r.id, verdict = kind, "request settled");
        }
        Ok(rows.len())
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
        let sender = Address::try_from(req.sender.as_slice())
            .map_err(|_| TxqError::InvalidRequest("sender"))?;
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
        let bump = |v: u128| {
            v.saturating_mul(100 + u128::from(self.config.bump_percent))
                .div_ceil(100)
        };
        let (market_max, market_tip) = self.fees().await?;
        let tip = bump(prev_tip).max(market_tip);
        let max_fee = bump(prev_max)
            .max(market_max)
            .max(tip)
            .min(self.config.max_fee_cap);
        if max_fee < bump(prev_max) || tip > max_fee {
            tracing::warn!(target: "keel::txq", request = %req.id, "fee cap reached; not replacing");
            metrics::counter!("keel_txq_replacements_capped_total", "chain_id" => self.chain_id.to_string()).increment(1);
            return Ok(());
        }
        let to = req
            .to_address
            .as_deref()
            .map(Address::try_from)
            .transpose()
            .map_err(|_| TxqError::InvalidRequest("to"))?;
        let unsigned = TxEip1559 {
            chain_id: self.chain.chain().get(),
            nonce: u64::try_from(last.nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
            gas_limit: u64::try_from(last.gas_limit)
                .map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
            to: to.map_or(TxKind::Create, TxKind::Call),
            value: req
                .value_wei
                .parse()
                .map_err(|_| TxqError::InvalidRequest("value"))?,
            access_list: Default::default(),
            input: Bytes::from(req.calldata.clone()),
        };
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
        metrics::counter!("keel_txq_replacements_total", "chain_id" => self.chain_id.to_string())
            .increment(1);
        tracing::info!(target: "keel::txq", request = %req.id, attempt, "replacing a stuck transaction with bumped fees");
        let new = AttemptRow {
            request_id: req.id,
            attempt,
            nonce: last.nonce,
            tx_hash: hash.to_vec(),
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

    /// Re-executes a reverted request with `eth_call` at its block's parent to read the
    /// revert data (and its `Error(string)` reason); `None` when the node gives none.
    async fn revert_reason(
        &self,
        req: &RequestRow,
        block: u64,
    ) -> Option<keel_chain::RevertReason> {
        let sender = Address::try_from(req.sender.as_slice()).ok()?;
        let to = req
            .to_address
            .as_deref()
            .and_then(|t| Address::try_from(t).ok());
        let call = TransactionRequest {
            from: Some(sender),
            to: Some(to.map_or(TxKind::Create, TxKind::Call)),
            value: req.value_wei.parse().ok(),
            input: Bytes::from(req.calldata.clone()).into(),
            ..Default::default()
        };
        let at = BlockNumberOrTag::Number(block.saturating_sub(1));
        match self.chain.request::<_, Bytes>("eth_call", (call, at)).await {
            Err(ChainError::Node { error, .. }) => error.revert,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Piece, WarnLimiter, pieces_of};
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

    fn p(plan: usize, start: usize, len: usize) -> Piece {
        Piece { plan, start, len }
    }

    #[test]
    fn signing_groups_split_senders_in_order_and_never_repeat_one_within_a_group() {
        assert_eq!(
            pieces_of(&[3, 5, 1], 4),
            vec![
                vec![p(0, 0, 3), p(1, 0, 1)],
                vec![p(1, 1, 4)],
                vec![p(2, 0, 1)],
            ]
        );
        // One sender with more than a group: consecutive pieces, in queue order.
        assert_eq!(
            pieces_of(&[9], 4),
            vec![vec![p(0, 0, 4)], vec![p(0, 4, 4)], vec![p(0, 8, 1)]]
        );
        assert!(pieces_of(&[], 4).is_empty());
        // Every request lands in exactly one piece, whatever the sizes.
        for size in 1..7 {
            let lens = [0, 2, 7, 1, 0, 13];
            let groups = pieces_of(&lens, size);
            for g in &groups {
                assert!(g.iter().map(|p| p.len).sum::<usize>() <= size);
                let mut plans: Vec<usize> = g.iter().map(|p| p.plan).collect();
                plans.dedup();
                assert_eq!(plans.len(), g.len(), "a sender once per group");
            }
            for (plan, &len) in lens.iter().enumerate() {
                let covered: Vec<usize> = groups
                    .iter()
                    .flatten()
                    .filter(|p| p.plan == plan)
                    .flat_map(|p| p.start..p.start + p.len)
                    .collect();
                assert_eq!(covered, (0..len).collect::<Vec<_>>());
            }
        }
    }
}
