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

mod pack;
mod settle;
mod watchdog;

pub use watchdog::{StaleCount, Watchdog};

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

    /// The gas a bundle adds to its operations' gas (the larger of the bundler's and
    /// the admission's overhead), gas units.
    fn overhead(&self) -> u64 {
        self.chain().map_or(self.config.gas_overhead, |c| {
            self.config
                .gas_overhead
                .max(c.admission.bundle_gas_overhead)
        })
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
