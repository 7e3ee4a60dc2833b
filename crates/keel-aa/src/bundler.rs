//! The bundler of one chain: ready user operations packed into `handleOps` transactions
//! sent through the nonce-serialized transaction queue, and each bundle's verdict turned
//! into every operation's outcome, reported to its workflow once.
//!
//! [`Bundler`] is a [`keel_service::BackgroundService`] (service name `aa-bundler`); in the
//! `keel` binary it is meant to run as the cluster singleton `aa-bundler/<chainId>` next
//! to the queue's `txq/<chainId>`. Each run does two passes, both driven by the database
//! only (a restarted or killed runner loses nothing and repeats nothing):
//!
//! - **settle** ([`Bundler::settle_pass`]): for every `submitted` bundle whose queue
//!   request has a verdict ([`keel_txq::requests`]):
//!   - *confirmed*: the bundle's receipt; for each operation
//!     [`crate::user_operation_receipt`] over its journaled, resolved EntryPoint. Found:
//!     `included` with the receipt fields and the signal [`crate::flow::OUTCOME_SIGNAL`]
//!     recorded **in the same transaction** (deduplicated by the bundle id), so the
//!     outcome is reported exactly once. Not found: back to `ready`.
//!   - *reverted* or *failed* (never took effect): each operation whose nonce the
//!     EntryPoint has passed (`getNonce(sender, key) > nonce`) ends
//!     `nonce_used_elsewhere`; the others go back to `ready` and are re-validated by the
//!     next bundle's simulation.
//!
//!   The queue gives the verdict at its confirmation depth: a reorg before that depth
//!   removes the bundle's receipt and the queue re-broadcasts the same signed bytes
//!   (the operations stay `bundled`, in flight, meanwhile), so no outcome is ever
//!   reported from a block that was reorganized away before the depth.
//! - **bundle** ([`Bundler::bundle_pass`]): up to [`BundlerConfig::max_operations`]
//!   `ready` operations, one per sender, of one resolved EntryPoint; `handleOps`
//!   simulated with `eth_call` ([`crate::flow::simulate_handle_ops`]): an operation
//!   named by `FailedOp` ends `failed` alone (its `AAxx` code and ERC-7769 code reported
//!   to its workflow) and the rest is simulated again. Then, in one transaction, the
//!   queue request (key `aa-bundle:<bundle id>`, the bundler's sender, a gas limit of
//!   the operations' limits plus [`BundlerConfig::gas_overhead`]), the `aa_bundle` row and
//!   the operations' move to `bundled`. Nonces, fee bumps, re-broadcasts, funding pauses
//!   and confirmation are the queue's.
//!
//! Metrics (labels `chain_id` and a fixed `outcome`):
//! `keel_aa_bundles_total{outcome=submitted|included|failed}`,
//! `keel_aa_user_operations_total{outcome=included|failed|nonce_used_elsewhere|rebundled}`.

use crate::entry_point::Resolution;
use crate::flow::{
    AaChain, AaEnv, OUTCOME_SIGNAL, OutcomeSignal, chain_id_i64, handle_ops_calldata,
    rejection_failure, simulate_handle_ops,
};
use crate::store::{self, UserOperationRow};
use crate::user_op::{PackedUserOperation, UserOperation};
use crate::user_operation_receipt;
use alloy::primitives::{Address, B256, TxKind, U256, aliases::U192};
use alloy::rpc::types::{BlockNumberOrTag, TransactionInput, TransactionRequest};
use alloy::sol_types::SolCall;
use keel_abi::erc4337::IEntryPointV08;
use keel_durable::{Actor, DurableError, Engine};
use keel_service::{BackgroundService, Report};
use keel_txq::{EnqueueOptions, SettlementVerdict, TxRequest};
use keel_units::Wei;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use uuid::Uuid;

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
}

impl Default for BundlerConfig {
    fn default() -> Self {
        Self {
            max_operations: 32,
            gas_overhead: 200_000,
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
    let hash =
        B256::try_from(row.user_op_hash.as_slice()).map_err(|_| BundlerError::Corrupt("hash"))?;
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
        end_state: &str,
        code: i32,
        reason: &str,
        dedupe: &str,
    ) -> Result<(), BundlerError> {
        let mut tx = self.env.db.begin().await?;
        if store::user_operation_end(
            &mut *tx,
            l.row.chain_id,
            &l.row.user_op_hash,
            end_state,
            code,
            reason,
        )
        .await?
        {
            let outcome = OutcomeSignal {
                state: end_state.to_owned(),
                success: None,
                actual_gas_cost: None,
                actual_gas_used: None,
                tx_hash: None,
                block_number: None,
                error_code: Some(code),
                error_reason: Some(reason.to_owned()),
            };
            self.signal(&mut tx, l.row.instance_id, dedupe, &outcome)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Handles the verdicts of this chain's `submitted` bundles (see the module docs);
    /// the number of bundles settled.
    ///
    /// # Errors
    /// [`BundlerError`]; nothing of the failed bundle is written (the next pass retries).
    pub async fn settle_pass(&self) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let bundles = store::bundles_submitted(db, chain_id_i64(self.chain_id)).await?;
        if bundles.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = bundles.iter().map(|b| b.txq_request_id).collect();
        let views: HashMap<Uuid, Option<SettlementVerdict>> = keel_txq::requests(db, &ids)
            .await?
            .into_iter()
            .map(|v| (v.id, v.verdict))
            .collect();
        let mut settled = 0;
        for bundle in bundles {
            let Some(Some(verdict)) = views.get(&bundle.txq_request_id) else {
                continue;
            };
            let dedupe = format!("bundle:{}", bundle.id);
            let ops = store::user_operations_in_bundle(db, bundle.id)
                .await?
                .into_iter()
                .map(load)
                .collect::<Result<Vec<_>, _>>()?;
            match verdict {
                SettlementVerdict::Confirmed { hash, block, .. } => {
                    let receipts = chain.pool.receipts(&[*hash]).await?;
                    let Some(Some(receipt)) = receipts.into_iter().next() else {
                        // Settled at depth but the node lost it for now: next pass.
                        continue;
                    };
                    let block_hash = receipt.block_hash;
                    let mut tx = db.begin().await?;
                    let (mut included, mut rebundled) = (0, 0);
                    for l in &ops {
                        match user_operation_receipt(&receipt, &l.resolution.resolved, l.hash) {
                            Some(r) => {
                                let cost = r.actual_gas_cost.get().to_string();
                                let used = r.actual_gas_used.to_string();
                                let inc = store::Inclusion {
                                    success: r.success,
                                    actual_gas_cost: &cost,
                                    actual_gas_used: &used,
                                    revert_reason: r.revert_reason.as_ref().map(|b| b.as_ref()),
                                    tx_hash: hash.as_slice(),
                                    block_number: i64::try_from(*block).unwrap_or(i64::MAX),
                                    block_hash: block_hash.as_ref().map(|h| h.as_slice()),
                                };
                                if store::user_operation_include(
                                    &mut *tx,
                                    l.row.chain_id,
                                    &l.row.user_op_hash,
                                    bundle.id,
                                    &inc,
                                )
                                .await?
                                {
                                    let outcome = OutcomeSignal {
                                        state: store::state::INCLUDED.to_owned(),
                                        success: Some(r.success),
                                        actual_gas_cost: Some(cost.clone()),
                                        actual_gas_used: Some(used.clone()),
                                        tx_hash: Some(*hash),
                                        block_number: Some(*block),
                                        error_code: None,
                                        error_reason: None,
                                    };
                                    self.signal(&mut tx, l.row.instance_id, &dedupe, &outcome)
                                        .await?;
                                    crate::validation::record_included(
                                        &mut *tx,
                                        l.row.chain_id,
                                        &l.op,
                                    )
                                    .await?;
                                    included += 1;
                                }
                            }
                            None => {
                                store::user_operation_unbundle(
                                    &mut *tx,
                                    l.row.chain_id,
                                    &l.row.user_op_hash,
                                    bundle.id,
                                )
                                .await?;
                                rebundled += 1;
                            }
                        }
                    }
                    store::bundle_settle(
                        &mut *tx,
                        bundle.id,
                        "included",
                        Some(hash.as_slice()),
                        i64::try_from(*block).ok(),
                        block_hash.as_ref().map(|h| h.as_slice()),
                    )
                    .await?;
                    tx.commit().await?;
                    count_bundle(self.chain_id, "included");
                    count_ops(self.chain_id, "included", included);
                    count_ops(self.chain_id, "rebundled", rebundled);
                }
                _ => {
                    // Reverted or never took effect: which operations' nonces were used?
                    let mut used = HashSet::new();
                    for l in &ops {
                        if self.nonce_used(chain, l).await? {
                            used.insert(l.hash);
                        }
                    }
                    let mut tx = db.begin().await?;
                    let (mut elsewhere, mut rebundled) = (0, 0);
                    for l in &ops {
                        if used.contains(&l.hash) {
                            let code = crate::Erc7769Code::RejectedByEntryPoint.code();
                            let reason = "NONCE_USED_ELSEWHERE";
                            if store::user_operation_end(
                                &mut *tx,
                                l.row.chain_id,
                                &l.row.user_op_hash,
                                store::state::NONCE_USED_ELSEWHERE,
                                code,
                                reason,
                            )
                            .await?
                            {
                                let outcome = OutcomeSignal {
                                    state: store::state::NONCE_USED_ELSEWHERE.to_owned(),
                                    success: None,
                                    actual_gas_cost: None,
                                    actual_gas_used: None,
                                    tx_hash: None,
                                    block_number: None,
                                    error_code: Some(code),
                                    error_reason: Some(reason.to_owned()),
                                };
                                self.signal(&mut tx, l.row.instance_id, &dedupe, &outcome)
                                    .await?;
                                elsewhere += 1;
                            }
                        } else {
                            store::user_operation_unbundle(
                                &mut *tx,
                                l.row.chain_id,
                                &l.row.user_op_hash,
                                bundle.id,
                            )
                            .await?;
                            rebundled += 1;
                        }
                    }
                    store::bundle_settle(&mut *tx, bundle.id, "failed", None, None, None).await?;
                    tx.commit().await?;
                    count_bundle(self.chain_id, "failed");
                    count_ops(self.chain_id, "nonce_used_elsewhere", elsewhere);
                    count_ops(self.chain_id, "rebundled", rebundled);
                }
            }
            settled += 1;
        }
        Ok(settled)
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
    /// the number of operations moved (bundled or ended alone).
    ///
    /// # Errors
    /// [`BundlerError`]; a failure before the commit writes nothing of the bundle.
    pub async fn bundle_pass(&self) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let max = self.config.max_operations.max(1);
        let rows = store::user_operations_ready(
            db,
            chain_id_i64(self.chain_id),
            i64::try_from(max.saturating_mul(4)).unwrap_or(i64::MAX),
        )
        .await?;
        let mut senders = HashSet::new();
        let mut chosen: Vec<Loaded> = Vec::new();
        let mut entry_point: Option<Address> = None;
        for row in rows {
            let l = load(row)?;
            let ep = l.resolution.resolved.address();
            if *entry_point.get_or_insert(ep) != ep
                || crate::validation::entity_conflict(chosen.iter().map(|c| &c.op), &l.op)
                || !senders.insert(l.op.sender)
            {
                continue;
            }
            chosen.push(l);
            if chosen.len() == max {
                break;
            }
        }
        let Some(first) = chosen.first() else {
            return Ok(0);
        };
        let ep = first.resolution.resolved;
        let mut moved = 0u64;
        // Simulate; an operation the EntryPoint names fails alone.
        loop {
            let packed: Vec<PackedUserOperation> =
                chosen.iter().map(|l| l.packed.clone()).collect();
            match simulate_handle_ops(&chain.pool, &ep, &packed, chain.bundler).await? {
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
        let gas: u64 = chosen
            .iter()
            .map(|l| {
                let op = &l.op;
                let limits = op
                    .verification_gas_limit
                    .saturating_add(op.call_gas_limit)
                    .saturating_add(op.paymaster_verification_gas_limit)
                    .saturating_add(op.paymaster_post_op_gas_limit);
                let pvg = u128::try_from(op.pre_verification_gas).unwrap_or(u128::MAX);
                u64::try_from(limits.saturating_add(pvg)).unwrap_or(u64::MAX)
            })
            .fold(self.config.gas_overhead, u64::saturating_add);
        let id = Uuid::new_v4();
        let request = TxRequest {
            sender: chain.bundler,
            idempotency_key: format!("aa-bundle:{id}"),
            to: Some(ep.address()),
            value: Wei::ZERO,
            data: handle_ops_calldata(&packed, chain.beneficiary()),
            gas_limit: Some(gas),
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
                chain_id: u64::try_from(chain).unwrap_or(0),
                state,
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
