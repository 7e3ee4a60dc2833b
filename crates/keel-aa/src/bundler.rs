//! The bundler of one chain: ready user operations packed into `handleOps` transactions
//! sent through the nonce-serialized transaction queue, and each bundle's verdict turned
//! into every operation's outcome, reported to its workflow once.
//!
//! [`Bundler`] is a [`keel_service::BackgroundService`] (service name `aa-bundler`); in the
//! `keel` binary it is meant to run as the cluster singleton `aa-bundler/<chainId>` next
//! to the queue's `txq/<chainId>`. Each run does two passes, both driven by the database
//! only (a restarted or killed runner loses nothing and repeats nothing):
//!
//! - **settle** ([`Bundler::settle_pass`]), every operation followed until its block is
//!   final for the chain (issue 33 §2; finality is the queue's, `chains.<name>.finalityDepth`
//!   or the node's `finalized` tag):
//!   - a `submitted` bundle whose queue request ([`keel_txq::requests`]) has a verdict:
//!     *confirmed*: for each operation [`crate::user_operation_receipt`] over its
//!     journaled, resolved EntryPoint from the bundle's receipt. Found: `included` with
//!     the receipt fields (readable through `eth_getUserOperationReceipt` at once), not
//!     reported yet; the bundle `included` (watched). Not found: released (below).
//!     *reverted* or *failed* (never took effect): each operation released; the bundle
//!     `failed`. Failed `EXCEEDS_BLOCK_GAS_LIMIT` (issue 33 §1): later bundles stay
//!     below this bundle's gas (never the same set again), and an operation alone in it
//!     ends `failed` `GAS_LIMIT_EXCEEDS_BUNDLE_MAX`.
//!   - an `included` bundle follows its queue request's watch (keel-txq issue 32 §10):
//!     the verdict's transaction re-included elsewhere moves its operations' transaction,
//!     block and receipt fields; out of the chain for now, its operations go back to
//!     `bundled` (the queue re-broadcasts the same bytes while the bundler's nonce is
//!     free); once the queue marked it final (`final_at`), each operation is reported
//!     with [`crate::flow::OUTCOME_SIGNAL`] **in the transaction that sets its
//!     `finalized_at`** (dedupe `final:<bundle id>`) and the bundle's `final_at` is set; taken out
//!     for good (`REORGED_OUT`) or re-mined reverted / without an operation's
//!     `UserOperationEvent`, its operations are released and the bundle is `reorged`.
//!   - *released*: an operation whose nonce the EntryPoint has not passed
//!     (`getNonce(sender, key) <= nonce`) goes back to `ready` and is re-validated by the
//!     next bundle's simulation. Passed: the chain's `UserOperationEvent` of its hash
//!     (another Keel bundle, its own bundle's re-inclusion, or another bundler's
//!     transaction) makes it `included` there, followed by that transaction until its
//!     block is final; without one it ends `nonce_used_elsewhere` (reported at once).
//!
//!   Each bundle's (or operation's) step is one database transaction holding the state
//!   changes and the signals they report; a state guard makes a repeat write nothing,
//!   so a killed runner loses nothing and reports nothing twice. The workflow is told
//!   once, never from a block that can still be reorganized away.
//! - **bundle** ([`Bundler::bundle_pass`]): up to [`BundlerConfig::max_operations`]
//!   `ready` operations, one per sender and none of a sender with an operation in an
//!   unsettled bundle, of one resolved EntryPoint, whose gas (each operation's five gas
//!   fields, plus the overhead) stays within the bundle gas budget
//!   ([`crate::admission::bundle_gas_budget`]: min(configured maximum, latest block gas
//!   limit − margin), and below the gas of a bundle the queue refused for the block gas
//!   limit). An operation over the budget alone ends `failed`
//!   (`GAS_LIMIT_EXCEEDS_BUNDLE_MAX`); one whose `maxFeePerGas` is below the latest base
//!   fee waits, at most [`BundlerConfig::ready_ttl`] (then it ends `failed`
//!   `MEMPOOL_EXPIRED`, as does any operation `ready` for that long). `handleOps`
//!   simulated with `eth_call`
//!   ([`crate::flow::simulate_handle_ops`]): an operation named by `FailedOp` ends
//!   `failed` alone (its `AAxx` code and ERC-7769 code reported to its workflow) and the
//!   rest is simulated again. Then, in one transaction, the queue request (key
//!   `aa-bundle:<bundle id>`, the bundler's sender, a gas limit of the operations' gas
//!   plus the overhead), the `aa_bundle` row and the operations' move to `bundled`.
//!   Nonces, fee bumps, re-broadcasts, funding pauses and confirmation are the queue's;
//!   the queue fails a request over the block gas limit before assigning a nonce
//!   (`EXCEEDS_BLOCK_GAS_LIMIT`), and the settle pass then splits the set (see
//!   [`Bundler::settle_pass`]).
//!
//! Metrics (labels `chain_id` and a fixed `outcome`):
//! `keel_aa_bundles_total{outcome=submitted|included|final|reorged|failed}`,
//! `keel_aa_user_operations_total{outcome=included|moved|final|reorged|failed|nonce_used_elsewhere|rebundled|expired}`.

use crate::admission;
use crate::entry_point::Resolution;
use crate::flow::{
    AaChain, AaEnv, OUTCOME_SIGNAL, OutcomeSignal, chain_id_i64, handle_ops_calldata,
    rejection_failure, simulate_handle_ops,
};
use crate::store::{self, UserOperationRow};
use crate::user_op::{PackedUserOperation, UserOperation};
use crate::user_operation_receipt;
use alloy::primitives::{Address, B256, Bytes, TxKind, U256, aliases::U192};
use alloy::rpc::types::{BlockNumberOrTag, Log, TransactionInput, TransactionRequest};
use alloy::sol_types::{SolCall, SolEvent};
use keel_abi::erc4337::IEntryPointV08;
use keel_durable::{Actor, DurableError, Engine};
use keel_service::{BackgroundService, Report};
use keel_txq::{EnqueueOptions, FailureCode, RequestView, SettlementVerdict, TxRequest};
use keel_units::Wei;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use uuid::Uuid;

/// The ERC-7769 code and reason of an operation that can never fit in a bundle (its
/// gas plus the bundle overhead exceeds the bundle gas budget).
/// The code and reason of an operation that stayed `ready` longer than
/// [`BundlerConfig::ready_ttl`].
const MEMPOOL_EXPIRED: &str = "MEMPOOL_EXPIRED";

fn too_large() -> (i32, &'static str) {
    (
        crate::Erc7769Code::InvalidParams.code(),
        "GAS_LIMIT_EXCEEDS_BUNDLE_MAX",
    )
}

/// The outcome signal of an operation ended `failed` with `code` and `reason`.
fn failure_outcome(code: i32, reason: &str) -> OutcomeSignal {
    OutcomeSignal::ended(store::state::FAILED, code, reason)
}

/// The actor recorded with the outcome signals.
pub const BUNDLER_ACTOR: &str = "aa-bundler";

/// Settings of a [`Bundler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundlerConfig {
    /// Most operations in one bundle.
    pub max_operations: usize,
    /// Gas added to the sum of the operations' gas limits for the bundle transaction's
    /// gas limit (the EntryPoint's own work), gas units.
    pub gas_overhead: u64,
    /// How long an operation may stay `ready` without being bundled (its
    /// `maxFeePerGas` below the base fee for that long, say) before it ends `failed`
    /// with reason `MEMPOOL_EXPIRED` (-32602); measured on the database clock from its
    /// last state change. Default 1 hour (`aa.readyTtlSecs`).
    pub ready_ttl: std::time::Duration,
}

impl Default for BundlerConfig {
    fn default() -> Self {
        Self {
            max_operations: 32,
            gas_overhead: 200_000,
            ready_ttl: std::time::Duration::from_secs(3_600),
        }
    }
}

/// Why a bundler pass failed (value-free; the cause is the source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundlerError {
    /// The chain is not in the [`AaEnv`].
    #[error("chain {0} is not served")]
    ChainNotServed(u64),
    /// The database failed.
    #[error("database")]
    Store(#[from] keel_store::StoreError),
    /// A database transaction failed.
    #[error("database")]
    Sql(#[from] sqlx::Error),
    /// Chain access failed.
    #[error("chain access")]
    Chain(#[from] keel_chain::ChainError),
    /// The transaction queue refused.
    #[error("transaction queue")]
    Queue(#[from] keel_txq::TxqError),
    /// The durable engine refused a signal.
    #[error("durable engine")]
    Engine(#[from] DurableError),
    /// A stored row does not read back (a bug or a manual edit).
    #[error("stored user operation does not read: {0}")]
    Corrupt(&'static str),
    /// A bundle simulation reverted without naming an operation.
    #[error("the bundle simulation reverted without FailedOp")]
    Unexplained,
}

/// The bundler of one chain (see the module docs).
pub struct Bundler {
    env: Arc<AaEnv>,
    engine: Engine,
    chain_id: u64,
    config: BundlerConfig,
    /// What the last complete watch of included bundles looked at (the head's hash and
    /// the watched requests' verdicts): unchanged, there is nothing new to look at.
    watched_at: std::sync::Mutex<Option<u64>>,
    /// Below the gas of the last bundle the queue failed for exceeding the block gas
    /// limit (0: none): the next bundles stay under it, so a failed set is split and
    /// never rebuilt unchanged (until the runner restarts).
    gas_ceiling: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Bundler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundler")
            .field("chain_id", &self.chain_id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One operation read back from its row.
struct Loaded {
    row: UserOperationRow,
    hash: B256,
    op: UserOperation,
    packed: PackedUserOperation,
    resolution: Resolution,
}

fn load(row: UserOperationRow) -> Result<Loaded, BundlerError> {
    let hash = row.user_op_hash.0;
    let op: UserOperation = serde_json::from_value(row.user_operation.clone())
        .map_err(|_| BundlerError::Corrupt("user operation"))?;
    let packed = op.pack().map_err(|_| BundlerError::Corrupt("packing"))?;
    let resolution: Resolution = serde_json::from_value(row.resolution.clone())
        .map_err(|_| BundlerError::Corrupt("resolution"))?;
    Ok(Loaded {
        row,
        hash,
        op,
        packed,
        resolution,
    })
}

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

fn count_ops(chain_id: u64, outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!("keel_aa_user_operations_total", "chain_id" => chain_id.to_string(), "outcome" => outcome)
            .increment(n);
    }
}

fn count_bundle(chain_id: u64, outcome: &'static str) {
    metrics::counter!("keel_aa_bundles_total", "chain_id" => chain_id.to_string(), "outcome" => outcome)
        .increment(1);
}

impl Bundler {
    /// The bundler of `chain_id` (which `env` must serve), reporting outcomes to
    /// instances of `engine`.
    ///
    /// # Errors
    /// [`BundlerError::ChainNotServed`].
    pub fn new(
        env: Arc<AaEnv>,
        engine: Engine,
        chain_id: u64,
        config: BundlerConfig,
    ) -> Result<Self, BundlerError> {
        if env.chain(chain_id).is_none() {
            return Err(BundlerError::ChainNotServed(chain_id));
        }
        Ok(Self {
            env,
            engine,
            chain_id,
            config,
            watched_at: std::sync::Mutex::new(None),
            gas_ceiling: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn chain(&self) -> Result<&AaChain, BundlerError> {
        self.env
            .chain(self.chain_id)
            .ok_or(BundlerError::ChainNotServed(self.chain_id))
    }

    /// Records `outcome` for the operation's instance on `conn` (a duplicate or an ended
    /// instance is not an error: the outcome was reported, or nobody waits).
    async fn signal(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
        dedupe: &str,
        outcome: &OutcomeSignal,
    ) -> Result<(), BundlerError> {
        let payload =
            serde_json::to_value(outcome).map_err(|_| BundlerError::Corrupt("outcome"))?;
        match self
            .engine
            .signal_in_as(
                conn,
                instance_id,
                OUTCOME_SIGNAL,
                dedupe,
                &payload,
                &Actor::system(BUNDLER_ACTOR),
            )
            .await
        {
            Ok(_) | Err(DurableError::InstanceEnded { .. } | DurableError::InstanceNotFound(_)) => {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Ends one operation `failed` (or `nonce_used_elsewhere`) and reports it, in one
    /// transaction.
    async fn end(
        &self,
        l: &Loaded,
        end_state: store::UserOpState,
        code: i32,
        reason: &str,
        dedupe: &str,
    ) -> Result<(), BundlerError> {
        let mut tx = self.env.db.begin().await?;
        let (chain_id, hash) = l.row.key();
        if store::user_operation_end(&mut *tx, chain_id, hash, end_state, code, reason).await? {
            let outcome = OutcomeSignal::ended(end_state, code, reason);
            self.signal(&mut tx, l.row.instance_id, dedupe, &outcome)
                .await?;
        }
        tx.commit().await?;
        self.wake_successors(vec![l.op.sender]).await;
        Ok(())
    }

    /// Wakes the workflows of `senders`' later operations waiting for this one
    /// ([`crate::flow::sender_wake_tag`]: their validation found the nonce below theirs
    /// still open): they validate again now rather than at their recovery backoff. A
    /// failure is logged only (the backoff still resumes them).
    async fn wake_successors(&self, senders: Vec<Address>) {
        let mut seen = HashSet::new();
        for sender in senders {
            if !seen.insert(sender) {
                continue;
            }
            let tag = crate::flow::sender_wake_tag(self.chain_id, sender);
            if let Err(e) = self
                .engine
                .wake_suspended(&tag, "aa-predecessor-settled")
                .await
            {
                tracing::warn!(target: "keel::aa::bundler", error = %e, "waking a sender's waiting user operations failed; their backoff resumes them");
            }
        }
    }

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

    /// The gas a bundle adds to its operations' gas (the larger of the bundler's and
    /// the admission's overhead), gas units.
    fn overhead(&self) -> u64 {
        self.chain().map_or(self.config.gas_overhead, |c| {
            self.config
                .gas_overhead
                .max(c.admission.bundle_gas_overhead)
        })
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

    /// Packs ready operations into one bundle and enqueues it (see the module docs);
    /// the number of operations moved (bundled or ended alone). In the manual mode of
    /// the `debug_bundler_*` namespace ([`crate::debug`]) it does nothing unless a
    /// bundle was asked for, and clears that request once the bundle is enqueued.
    ///
    /// # Errors
    /// [`BundlerError`]; a failure before the commit writes nothing of the bundle.
    pub async fn bundle_pass(&self) -> Result<u64, BundlerError> {
        let chain_id = chain_id_i64(self.chain_id);
        let (manual, send_now) = store::bundler_control_get(&self.env.db, chain_id).await?;
        if manual && !send_now {
            return Ok(0);
        }
        let expired = self.expire_pass().await?;
        let moved = expired + self.pack_and_enqueue().await?;
        if send_now {
            store::bundler_control_send_now(&self.env.db, chain_id, false).await?;
        }
        Ok(moved)
    }

    /// Ends every operation `ready` for longer than [`BundlerConfig::ready_ttl`]
    /// `failed` (`MEMPOOL_EXPIRED`, -32602), reported to its workflow in the same
    /// transaction: an operation that can never be bundled (fees below a base fee that
    /// does not come down) does not wait forever. The number ended.
    async fn expire_pass(&self) -> Result<u64, BundlerError> {
        let ttl = i64::try_from(self.config.ready_ttl.as_secs()).unwrap_or(i64::MAX);
        let rows = store::user_operations_ready_expired(
            &self.env.db,
            chain_id_i64(self.chain_id),
            ttl,
            256,
        )
        .await?;
        let code = crate::Erc7769Code::InvalidParams.code();
        let mut ended = 0u64;
        for row in rows {
            let l = load(row)?;
            self.end(&l, store::state::FAILED, code, MEMPOOL_EXPIRED, "ready-ttl")
                .await?;
            ended += 1;
        }
        if ended > 0 {
            tracing::info!(target: "keel::aa::bundler", chain_id = self.chain_id, ended, "user operations ready for longer than aa.readyTtlSecs ended MEMPOOL_EXPIRED");
            count_ops(self.chain_id, "expired", ended);
        }
        Ok(ended)
    }

    /// The body of [`Bundler::bundle_pass`].
    async fn pack_and_enqueue(&self) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let max = self.config.max_operations.max(1);
        let rows = store::user_operations_ready(
            db,
            chain_id_i64(self.chain_id),
            i64::try_from(max.saturating_mul(4)).unwrap_or(i64::MAX),
        )
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        // The bundle gas budget: min(configured maximum, latest block gas limit − margin),
        // below the gas of a bundle the queue refused for the block gas limit.
        let view = crate::service::chain_view(&chain.pool).await?;
        let overhead = self.overhead();
        let mut budget = admission::bundle_gas_budget(&chain.admission, view.block_gas_limit);
        let ceiling = self.gas_ceiling.load(std::sync::atomic::Ordering::Relaxed);
        if ceiling > 0 {
            budget = budget.min(ceiling);
        }
        let mut senders = HashSet::new();
        let mut chosen: Vec<Loaded> = Vec::new();
        let mut entry_point: Option<Address> = None;
        let mut gas = overhead;
        let mut moved = 0u64;
        for row in rows {
            let l = load(row)?;
            let ep = l.resolution.resolved.address();
            // A sender's oldest ready operation only (its later ones wait behind it), and
            // never an address that is another chosen operation's sender and paymaster or
            // factory (ERC-7562 STO-040).
            if *entry_point.get_or_insert(ep) != ep
                || crate::validation::entity_conflict(chosen.iter().map(|c| &c.op), &l.op)
                || !senders.insert(l.op.sender)
            {
                continue;
            }
            let op_gas = admission::operation_gas(&l.op);
            if op_gas.saturating_add(overhead) > budget {
                // Can never fit a bundle now: ended with a typed reason, never bundled.
                let (code, reason) = too_large();
                self.end(&l, store::state::FAILED, code, reason, "bundle-gas")
                    .await?;
                count_ops(self.chain_id, "failed", 1);
                moved += 1;
                continue;
            }
            if l.op.max_fee_per_gas.get() < alloy::primitives::U256::from(view.base_fee_per_gas) {
                // Its fees would not cover the base fee: the operator would pay the
                // difference. It waits (ready) for the base fee to come down.
                continue;
            }
            if gas.saturating_add(op_gas) > budget {
                continue; // the next bundle
            }
            gas = gas.saturating_add(op_gas);
            chosen.push(l);
            if chosen.len() == max {
                break;
            }
        }
        let Some(first) = chosen.first() else {
            return Ok(moved);
        };
        let ep = first.resolution.resolved;
        // Simulate; an operation the EntryPoint names fails alone.
        loop {
            let packed: Vec<PackedUserOperation> =
                chosen.iter().map(|l| l.packed.clone()).collect();
            let authorizations = crate::eip7702::authorization_list(chosen.iter().map(|l| &l.op));
            match simulate_handle_ops(&chain.pool, &ep, &packed, chain.bundler, authorizations)
                .await?
            {
                None => break,
                Some(rejection) if rejection.op_index < chosen.len() && rejection.aa.is_some() => {
                    let l = chosen.remove(rejection.op_index);
                    crate::validation::penalise_bundle_failure(db, chain, &l.op, rejection.aa)
                        .await?;
                    let f = rejection_failure(&rejection);
                    self.end(
                        &l,
                        store::state::FAILED,
                        f.code,
                        &f.reason,
                        "bundle-simulation",
                    )
                    .await?;
                    count_ops(self.chain_id, "failed", 1);
                    moved += 1;
                    if chosen.is_empty() {
                        return Ok(moved);
                    }
                }
                Some(_) => return Err(BundlerError::Unexplained),
            }
        }
        let packed: Vec<PackedUserOperation> = chosen.iter().map(|l| l.packed.clone()).collect();
        let hashes: Vec<Vec<u8>> = chosen.iter().map(|l| l.hash.to_vec()).collect();
        // Within the budget by construction (operations removed by the simulation only
        // lower it).
        let gas: u64 = chosen
            .iter()
            .map(|l| admission::operation_gas(&l.op))
            .fold(overhead, u64::saturating_add);
        let id = Uuid::new_v4();
        let request = TxRequest {
            sender: chain.bundler,
            idempotency_key: format!("aa-bundle:{id}"),
            to: Some(ep.address()),
            value: Wei::ZERO,
            data: handle_ops_calldata(&packed, chain.beneficiary()),
            gas_limit: Some(gas),
            // A type-4 (EIP-7702) transaction when an operation carries an authorization;
            // its intrinsic cost is in that operation's preVerificationGas.
            authorization_list: crate::eip7702::authorization_list(chosen.iter().map(|l| &l.op))
                .unwrap_or_default(),
        };
        let chain_id = chain_id_i64(self.chain_id);
        let mut tx = db.begin().await?;
        let request_id = chain
            .queue
            .enqueue_in(&mut tx, &request, &EnqueueOptions::default())
            .await?;
        store::bundle_insert(
            &mut *tx,
            id,
            chain_id,
            ep.address().as_slice(),
            request_id,
            &hashes,
        )
        .await?;
        let n = store::user_operations_bundle(&mut *tx, chain_id, &hashes, id).await?;
        if n != hashes.len() as u64 {
            // Another bundler moved some of them meanwhile (not a singleton): write nothing.
            tx.rollback().await?;
            return Ok(moved);
        }
        tx.commit().await?;
        chain.queue.wake();
        count_bundle(self.chain_id, "submitted");
        tracing::info!(
            target: "keel::aa::bundler",
            chain_id = self.chain_id,
            operations = n,
            "bundle enqueued"
        );
        Ok(moved + n)
    }
}

impl BackgroundService for Bundler {
    type Error = BundlerError;

    fn name(&self) -> &'static str {
        "aa-bundler"
    }

    async fn run_once(&mut self) -> Result<Report, BundlerError> {
        let settled = self.settle_pass().await?;
        let moved = self.bundle_pass().await?;
        let max = self.config.max_operations.max(1) as u64;
        Ok(Report::pending(settled + moved, moved >= max))
    }

    fn cancel_safe(&self) -> bool {
        // Every write is one transaction; dropping a pass mid-way writes nothing of it.
        true
    }
}

/// The EntryPoint deposit of `account` (`EntryPoint.balanceOf`), wei: what pays for the
/// operations a paymaster sponsors (the runway of Keel's SponsorPaymaster).
///
/// # Errors
/// The chain access error, or [`BundlerError::Corrupt`] for an answer that does not
/// decode.
pub async fn entry_point_deposit(
    pool: &keel_chain::UpstreamPool,
    ep: &crate::ResolvedEntryPoint,
    account: Address,
) -> Result<U256, BundlerError> {
    let call = IEntryPointV08::balanceOfCall { account };
    let tx = TransactionRequest {
        to: Some(TxKind::Call(ep.address())),
        input: TransactionInput::new(call.abi_encode().into()),
        ..Default::default()
    };
    let out = pool.call(&tx, BlockNumberOrTag::Latest).await?;
    IEntryPointV08::balanceOfCall::abi_decode_returns(&out)
        .map_err(|_| BundlerError::Corrupt("balanceOf answer"))
}

/// Operations older than a threshold in a non-terminal state, per chain and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleCount {
    /// The chain.
    pub chain_id: u64,
    /// `accepted`, `ready` or `bundled`.
    pub state: String,
    /// How many.
    pub count: u64,
}

/// The bundler watchdog (service `aa-watchdog`, one per deployment, e.g. a cluster
/// cron): every `interval` it counts the operations of every chain still `accepted`,
/// `ready` or `bundled` after `older_than`, sets
/// `keel_aa_stale_user_operations{chain_id, state}` and logs a WARN when there are any.
#[derive(Debug)]
pub struct Watchdog {
    db: sqlx::PgPool,
    older_than: std::time::Duration,
    interval: std::time::Duration,
    reported: HashSet<(u64, String)>,
}

impl Watchdog {
    /// A watchdog over `db` reporting operations older than `older_than`, every
    /// `interval`.
    pub fn new(
        db: sqlx::PgPool,
        older_than: std::time::Duration,
        interval: std::time::Duration,
    ) -> Self {
        Self {
            db,
            older_than,
            interval,
            reported: HashSet::new(),
        }
    }

    /// One check: the stale counts (and the gauge set for them; a (chain, state) seen
    /// before and now clear is set to 0).
    ///
    /// # Errors
    /// [`BundlerError::Store`].
    pub async fn check(&mut self) -> Result<Vec<StaleCount>, BundlerError> {
        let secs = i64::try_from(self.older_than.as_secs()).unwrap_or(i64::MAX);
        let rows = store::user_operations_stale(&self.db, secs).await?;
        let counts: Vec<StaleCount> = rows
            .into_iter()
            .map(|(chain, state, count)| StaleCount {
                chain_id: chain.0,
                state: state.as_str().to_owned(),
                count: u64::try_from(count).unwrap_or(0),
            })
            .collect();
        let now: HashSet<(u64, String)> = counts
            .iter()
            .map(|c| (c.chain_id, c.state.clone()))
            .collect();
        for (chain, state) in self.reported.difference(&now) {
            metrics::gauge!("keel_aa_stale_user_operations", "chain_id" => chain.to_string(), "state" => state.clone())
                .set(0.0);
        }
        for c in &counts {
            metrics::gauge!("keel_aa_stale_user_operations", "chain_id" => c.chain_id.to_string(), "state" => c.state.clone())
                .set(c.count as f64);
            tracing::warn!(target: "keel::aa::watchdog", chain_id = c.chain_id, state = %c.state,
                count = c.count, older_than_s = self.older_than.as_secs(),
                "user operations pending longer than the threshold");
        }
        self.reported = now;
        Ok(counts)
    }
}

impl BackgroundService for Watchdog {
    type Error = BundlerError;

    fn name(&self) -> &'static str {
        "aa-watchdog"
    }

    async fn run_once(&mut self) -> Result<Report, BundlerError> {
        let n = self.check().await?.len() as u64;
        Ok(Report::after(n, self.interval))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}
