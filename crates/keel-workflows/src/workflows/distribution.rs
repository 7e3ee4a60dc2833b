//! `distribution.pay` (issue 36 §3): pays the holders of a final snapshot through the
//! platform's `BatchPay` contract, many recipients per transaction, exactly once per
//! holder.
//!
//! The body, in journaled steps:
//! 1. the chain; the approval wait when the template's rule asks for one;
//! 2. `plan`: reads the sealed snapshot's rows, computes every holder's share
//!    ([`crate::workflows::distribution_plan`]) and writes them once as
//!    `distribution_payment` rows (a replay writes nothing new);
//! 3. for an ERC-20, the paying account's allowance for `BatchPay`: when it is below
//!    what is still owed, the write `approve` sets it to that;
//! 4. `batch size`: recipients per batch from gas (an estimate of a probe batch, a
//!    budget of [`BATCH_GAS_BUDGET`] gas per transaction, at most [`MAX_BATCH`] or the
//!    request's `maxBatchSize`);
//! 5. per batch *b*: the funding check (the paying account's balance against what is
//!    still owed; waits for funds up to the template's funding deadline, else fails
//!    `DISTRIBUTION_UNFUNDED`), `batch b` places the next unplaced payments in it (in
//!    holder order), `check b.k` simulates the call and marks every recipient the token
//!    refuses `refused` (with the token's error name) and leaves it out, then the write
//!    `batch-b` (later attempts `batch-b.k`) — one transaction-queue request keyed
//!    `op/<id>/batch-b`, so a replay after a crash never pays a batch twice — and
//!    `settle b` marks its payments paid and emits `distribution.batch_settled` in the
//!    same transaction. A batch that reverts on chain (a recipient refused between the
//!    check and the block) is checked and sent again without the refused recipient, at
//!    most [`MAX_BATCH_ATTEMPTS`] times.
//! 6. `complete`: emits `distribution.completed`; the output tallies the payments.
//!
//! A pause (`POST /v1/distributions/{id}/pause`) holds it before its next batch
//! until a resume; a cancel of the operation stops it before its next batch is queued.
//! Either way the payments say which holders were paid. Distributions paying one token (or the native
//! currency) on a chain run one at a time (serialization key
//! `distribution-pay:<chain>:<token>`), so two never race for one allowance.

use crate::env::{ChainContext, WorkflowEnv};
use crate::store;
use crate::workflows::contract::{Failure, OpFailure};
use crate::workflows::distribution_plan::{self, Basis, Rounding};
use crate::workflows::send::{Write, chain_of, custom_error_name, send, step_ok};
use crate::workflows::token_op::{await_approval, write_sender};
use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::rpc::types::TransactionRequest;
use alloy::sol_types::{SolCall, SolInterface};
use chrono::{DateTime, Utc};
use keel_abi::bindings::{AssetToken, BatchPay};
use keel_durable::{SignalOutcome, StepError, Workflow, WorkflowContext, WorkflowFailure};
use keel_units::Wei;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The signal a paused distribution waits for (recorded by
/// [`crate::Ops::distribution_resume`]).
pub const RESUME_SIGNAL: &str = "resume";

/// The most recipients in one batch.
pub const MAX_BATCH: u32 = 500;
/// The gas one batch transaction may use (well inside any chain's block gas limit;
/// Anvil's and Ethereum's are 30,000,000 and more).
pub const BATCH_GAS_BUDGET: u64 = 6_000_000;
/// Sends of one batch (the first and the resends after an on-chain revert).
pub const MAX_BATCH_ATTEMPTS: u32 = 3;
/// How often a distribution waiting for funds reads the paying account's balance.
const FUNDING_POLL: Duration = Duration::from_secs(10);
/// Rows read per statement from the snapshot.
const SNAPSHOT_PAGE: u32 = 5_000;

/// What a distribution pays with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum PayWith {
    /// An ERC-20 (the asset itself or another), pulled from the paying account with
    /// `transferFrom` by `BatchPay`.
    Token {
        /// The token.
        token: Address,
    },
    /// The chain's native currency (wei), sent with each batch.
    Native,
}

/// Input of `distribution.pay`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DistributionInput {
    /// The operation (and the distribution: same id).
    pub operation_id: Uuid,
    /// The organization (webhook events).
    pub organization_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The final snapshot.
    pub snapshot_id: Uuid,
    /// The asset's decimals (per-unit amounts are per `10^decimals` base units held).
    pub asset_decimals: u8,
    /// What is paid.
    pub pay: PayWith,
    /// How much: base units of the paying token.
    pub basis: Basis,
    /// The rounding rule.
    pub rounding: Rounding,
    /// Holders owed nothing.
    pub exclusions: Vec<Address>,
    /// The most recipients per batch (below the gas-derived size only).
    pub max_batch: Option<u32>,
    /// When set, waits for an approval this many seconds first.
    pub approval_ttl_seconds: Option<u64>,
    /// How long the distribution (and its transactions) wait for funds, seconds, when
    /// the template enables the funding pause; else an unfunded distribution fails.
    pub funding_deadline_seconds: Option<u64>,
    /// The custody vault that sends the asset's writes, when the template sends through
    /// one (it then pays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<Address>,
    /// The asset's issuer (a pool sender) when it is not a custody vault: it pays when
    /// the runner holds its key, else the operator key does (as for token operations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<Address>,
    /// The paying account, resolved by the workflow's `payer` step (journaled); not
    /// part of the start input (set it to any value, it is ignored).
    #[serde(skip)]
    pub payer: Address,
}

/// Output of `distribution.pay`: the payments tallied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DistributionOutput {
    /// Holders paid.
    pub holders_paid: u64,
    /// Holders whose payment the token or the recipient refused.
    pub holders_refused: u64,
    /// Base units paid.
    pub amount_paid: U256,
    /// Base units owed to refused holders (not paid).
    pub amount_refused: U256,
    /// What the rounding left unpaid.
    pub remainder: U256,
    /// Batches sent.
    pub batches: u32,
}

/// The plan's summary, journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Planned {
    payable: u64,
    total_due: U256,
    remainder: U256,
}

/// One checked batch, journaled: the recipients and amounts the write pays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckedBatch {
    to: Vec<Address>,
    amounts: Vec<U256>,
}

/// The funding check's answer, journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Funds {
    owed: U256,
    held: U256,
}

/// `distribution.pay` (see the module documentation).
#[derive(Debug, Clone)]
pub struct DistributionPay(pub Arc<WorkflowEnv>);

impl Workflow for DistributionPay {
    const NAME: &'static str = "distribution.pay";
    /// 2: a pause gate before every batch (`paused b.k` steps and the [`RESUME_SIGNAL`]
    /// wait); version-1 instances run without it.
    const VERSION: u32 = 2;
    type Input = DistributionInput;
    type Output = DistributionOutput;
    type Error = OpFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: DistributionInput,
    ) -> Result<DistributionOutput, Failure> {
        run(&self.0, ctx, input).await
    }
}

fn store_err<T>(_: T) -> StepError<OpFailure> {
    StepError::transient("DATABASE_UNAVAILABLE")
}

fn failed(code: &str, detail: &str) -> Failure {
    WorkflowFailure::Failed(OpFailure::new(code, false, detail))
}

fn decode_u256(s: &str) -> Result<U256, StepError<OpFailure>> {
    U256::from_str_radix(s, 10).map_err(|_| StepError::transient("DATABASE_DECODE"))
}

/// The batch's 32-byte identifier in `BatchPaid`: the distribution id's 16 bytes, then
/// the batch number big-endian.
pub fn batch_id(distribution: Uuid, batch: u32) -> B256 {
    let mut b = [0u8; 32];
    b[..16].copy_from_slice(distribution.as_bytes());
    b[28..].copy_from_slice(&batch.to_be_bytes());
    B256::from(b)
}

fn batch_calldata(input: &DistributionInput, batch: u32, c: &CheckedBatch) -> Vec<u8> {
    let id = batch_id(input.operation_id, batch);
    match input.pay {
        PayWith::Token { token } => BatchPay::payTokenCall {
            batch: id,
            token,
            to: c.to.clone(),
            amounts: c.amounts.clone(),
        }
        .abi_encode(),
        PayWith::Native => BatchPay::payNativeCall {
            batch: id,
            to: c.to.clone(),
            amounts: c.amounts.clone(),
        }
        .abi_encode(),
    }
}

fn batch_value(input: &DistributionInput, c: &CheckedBatch) -> U256 {
    match input.pay {
        PayWith::Token { .. } => U256::ZERO,
        PayWith::Native => c.amounts.iter().copied().sum(),
    }
}

async fn run(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    mut input: DistributionInput,
) -> Result<DistributionOutput, Failure> {
    let chain = chain_of(ctx, p, input.chain_id).await?;
    let (sender, issuer) = (input.sender, input.issuer);
    input.payer = step_ok(
        ctx.step("payer", || async move {
            Ok::<_, StepError<OpFailure>>(write_sender(sender, issuer, chain, p.operator))
        })
        .await?,
    )?;
    let Some(batch_pay) = chain.contracts.batch_pay else {
        return Err(failed(
            "BATCH_PAY_MISSING",
            "the chain's platform has no BatchPay contract: run `keel chain bootstrap` again",
        ));
    };
    if let Some(ttl) = input.approval_ttl_seconds {
        await_approval(ctx, ttl).await?;
    }
    ctx.set_progress(json!({ "phase": "plan" }));
    let planned = step_ok(
        ctx.step("plan", || {
            let input = input.clone();
            async move { plan(p, &input).await }
        })
        .await?,
    )?;
    let id = input.operation_id;
    if let PayWith::Token { token } = input.pay
        && planned.payable > 0
    {
        let payer = input.payer;
        let allowance = step_ok(
            ctx.step("allowance", || async move {
                let call = AssetToken::allowanceCall {
                    owner: payer,
                    spender: batch_pay,
                }
                .abi_encode();
                let answer = eth_call(chain, payer, token, call, U256::ZERO).await?;
                let owed = owed(p, id).await?;
                Ok::<_, StepError<OpFailure>>((
                    U256::try_from_be_slice(&answer).unwrap_or(U256::ZERO),
                    owed,
                ))
            })
            .await?,
        )?;
        if allowance.0 < allowance.1 {
            ctx.set_progress(json!({ "phase": "approve" }));
            send(
                ctx,
                p,
                chain,
                Write {
                    operation_id: id,
                    name: "approve",
                    contract: token,
                    funding_deadline: input.funding_deadline_seconds,
                    sender: payer,
                    value: Wei::ZERO,
                },
                AssetToken::approveCall {
                    spender: batch_pay,
                    value: allowance.1,
                }
                .abi_encode(),
            )
            .await?;
        }
    }
    let size = step_ok(
        ctx.step("batch size", || {
            let input = input.clone();
            async move { batch_size(p, chain, batch_pay, &input).await }
        })
        .await?,
    )?;
    let started = ctx.now().await?;
    let pausable = ctx.changed("pause", 2).await?;
    let mut batch: u32 = 0;
    let mut sent: u32 = 0;
    loop {
        if pausable {
            pause_gate(p, ctx, id, batch).await?;
        }
        await_funds(p, ctx, chain, &input, batch, started).await?;
        let placed = step_ok(
            ctx.step(&format!("batch {batch}"), || async move {
                let rows = store::distribution_batch_place(
                    &p.db,
                    id,
                    i32::try_from(batch).unwrap_or(i32::MAX),
                    i64::from(size),
                )
                .await
                .map_err(store_err)?;
                Ok::<_, StepError<OpFailure>>(rows.len())
            })
            .await?,
        )?;
        if placed == 0 {
            break;
        }
        let mut attempt: u32 = 1;
        loop {
            ctx.set_progress(json!({ "phase": "pay", "batch": batch, "attempt": attempt }));
            let checked = step_ok(
                ctx.step(&format!("check {batch}.{attempt}"), || {
                    let input = input.clone();
                    async move { check_batch(p, chain, batch_pay, &input, batch).await }
                })
                .await?,
            )?;
            if checked.to.is_empty() {
                break;
            }
            let name = if attempt == 1 {
                format!("batch-{batch}")
            } else {
                format!("batch-{batch}.{attempt}")
            };
            let outcome = send(
                ctx,
                p,
                chain,
                Write {
                    operation_id: id,
                    name: &name,
                    contract: batch_pay,
                    funding_deadline: input.funding_deadline_seconds,
                    sender: input.payer,
                    value: Wei::new(batch_value(&input, &checked)),
                },
                batch_calldata(&input, batch, &checked),
            )
            .await;
            match outcome {
                Ok(landed) => {
                    sent += 1;
                    let org = input.organization_id;
                    step_ok(
                        ctx.step(&format!("settle {batch}"), || async move {
                            settle(p, org, id, batch, landed.tx_hash, landed.block).await
                        })
                        .await?,
                    )?;
                    break;
                }
                Err(WorkflowFailure::Failed(f))
                    if f.code == "EXECUTION_REVERTED" && attempt < MAX_BATCH_ATTEMPTS =>
                {
                    // Refused between the check and the block (or at the queue's own
                    // estimate): check again, which leaves the refused recipient out.
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
        batch += 1;
    }
    let org = input.organization_id;
    let output = step_ok(
        ctx.step("complete", || async move {
            let out = output(p, id, sent, planned.remainder).await?;
            complete(p, org, id).await?;
            Ok::<_, StepError<OpFailure>>(out)
        })
        .await?,
    )?;
    ctx.set_progress(json!({ "phase": "done" }));
    Ok(output)
}

/// The `plan` step: reads the sealed snapshot, computes the shares, writes them once.
async fn plan(p: &WorkflowEnv, input: &DistributionInput) -> Result<Planned, StepError<OpFailure>> {
    let snapshot = keel_index::snapshot::get(&p.db, input.snapshot_id)
        .await
        .map_err(store_err)?
        .ok_or_else(|| {
            StepError::Failed(OpFailure::new(
                "SNAPSHOT_NOT_FOUND",
                false,
                "the distribution's snapshot does not exist",
            ))
        })?;
    if snapshot.sealed.is_none() {
        return Err(StepError::Failed(OpFailure::new(
            "SNAPSHOT_NOT_FINAL",
            false,
            "the distribution's snapshot is not final",
        )));
    }
    let mut holders: Vec<(Address, U256)> = Vec::new();
    let mut after = None;
    loop {
        let page = keel_index::snapshot::rows_by_holder(&p.db, snapshot.id, after, SNAPSHOT_PAGE)
            .await
            .map_err(store_err)?;
        let Some(last) = page.last() else { break };
        after = Some(last.holder);
        holders.extend(page.iter().map(|h| (h.holder, h.balance)));
    }
    let excluded: HashSet<Address> = input.exclusions.iter().copied().collect();
    let plan = distribution_plan::plan(
        &holders,
        input.asset_decimals,
        input.basis,
        input.rounding,
        &excluded,
    )
    .map_err(|e| {
        StepError::Failed(OpFailure::new(
            match e {
                distribution_plan::PlanError::Overflow => "DISTRIBUTION_OVERFLOW",
                _ => "DISTRIBUTION_ROUNDING",
            },
            false,
            "the shares cannot be computed (see the code)",
        ))
    })?;
    let rows: Vec<store::PlannedPaymentRow> = plan
        .shares
        .iter()
        .map(|s| store::PlannedPaymentRow {
            holder: s.holder.to_vec(),
            balance: s.balance.to_string(),
            amount: s.amount.to_string(),
            state: if s.excluded {
                "excluded"
            } else if s.amount.is_zero() {
                "zero"
            } else {
                "pending"
            },
        })
        .collect();
    let payable = rows.iter().filter(|r| r.state == "pending").count() as u64;
    let mut tx = p.db.begin().await.map_err(store_err)?;
    store::distribution_plan_write(
        &mut tx,
        input.operation_id,
        &rows,
        &plan.total_due.to_string(),
        &plan.remainder.to_string(),
    )
    .await
    .map_err(store_err)?;
    tx.commit().await.map_err(store_err)?;
    Ok(Planned {
        payable,
        total_due: plan.total_due,
        remainder: plan.remainder,
    })
}

/// What distribution `id` still owes its pending holders, base units.
async fn owed(p: &WorkflowEnv, id: Uuid) -> Result<U256, StepError<OpFailure>> {
    let tally = store::distribution_tally(&p.db, id)
        .await
        .map_err(store_err)?;
    match tally.iter().find(|t| t.state == "pending") {
        Some(t) => decode_u256(&t.amount),
        None => Ok(U256::ZERO),
    }
}

/// `eth_call` of `data` to `to` from `from` at the latest block; a revert is
/// `Err(Some(revert data))`, an unanswered call a transient step error.
async fn try_call(
    chain: &ChainContext,
    from: Address,
    to: Address,
    data: Vec<u8>,
    value: U256,
) -> Result<Result<Bytes, Bytes>, StepError<OpFailure>> {
    let tx = TransactionRequest::default()
        .from(from)
        .to(to)
        .input(Bytes::from(data).into())
        .value(value);
    match chain
        .node
        .call(&tx, alloy::eips::BlockNumberOrTag::Latest)
        .await
    {
        Ok(b) => Ok(Ok(b)),
        Err(keel_chain::ChainError::Node { error, .. }) if error.revert.is_some() => {
            Ok(Err(error.revert.map(|r| r.data).unwrap_or_default()))
        }
        Err(_) => Err(crate::workflows::send::chain_read_unavailable(
            "RPC_UNAVAILABLE",
            chain.chain_id,
        )),
    }
}

async fn eth_call(
    chain: &ChainContext,
    from: Address,
    to: Address,
    data: Vec<u8>,
    value: U256,
) -> Result<Bytes, StepError<OpFailure>> {
    try_call(chain, from, to, data, value).await?.map_err(|d| {
        StepError::Failed(OpFailure {
            reason: custom_error_name(&d),
            ..OpFailure::new(
                "EXECUTION_REVERTED",
                false,
                "a read of the paying token reverted",
            )
        })
    })
}

/// The paying account's holdings of what the distribution pays (wei or token base
/// units) at the latest block.
async fn held(
    chain: &ChainContext,
    input: &DistributionInput,
) -> Result<U256, StepError<OpFailure>> {
    match input.pay {
        PayWith::Native => chain
            .node
            .balance(input.payer, alloy::eips::BlockNumberOrTag::Latest)
            .await
            .map(|a| a.wei.get())
            .map_err(|_| {
                crate::workflows::send::chain_read_unavailable("RPC_UNAVAILABLE", chain.chain_id)
            }),
        PayWith::Token { token } => {
            let answer = eth_call(
                chain,
                input.payer,
                token,
                AssetToken::balanceOfCall {
                    account: input.payer,
                }
                .abi_encode(),
                U256::ZERO,
            )
            .await?;
            Ok(U256::try_from_be_slice(&answer).unwrap_or(U256::ZERO))
        }
    }
}

/// Before batch `batch`: the paying account must hold what is still owed (native:
/// the amounts; gas is the queue's funding check). Waits, reading again every
/// [`FUNDING_POLL`], until the template's funding deadline (from `started`); without a
/// funding pause an unfunded distribution fails `DISTRIBUTION_UNFUNDED` at once.
async fn await_funds(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    chain: &ChainContext,
    input: &DistributionInput,
    batch: u32,
    started: DateTime<Utc>,
) -> Result<(), Failure> {
    let id = input.operation_id;
    let mut read: u32 = 1;
    loop {
        let funds = step_ok(
            ctx.step(&format!("funds {batch}.{read}"), || {
                let input = input.clone();
                async move {
                    let owed = owed(p, id).await?;
                    let held = held(chain, &input).await?;
                    Ok::<_, StepError<OpFailure>>(Funds { owed, held })
                }
            })
            .await?,
        )?;
        if funds.held >= funds.owed {
            return Ok(());
        }
        let now = ctx.now().await?;
        let waited = (now - started).num_seconds().max(0) as u64;
        match input.funding_deadline_seconds {
            Some(deadline) if waited < deadline => {
                ctx.set_progress(json!({
                    "phase": "funding",
                    "owed": funds.owed.to_string(),
                    "held": funds.held.to_string(),
                }));
                ctx.sleep(FUNDING_POLL).await?;
                read += 1;
            }
            _ => {
                return Err(failed(
                    "DISTRIBUTION_UNFUNDED",
                    "the paying account does not hold what the distribution still owes; fund it and start a new distribution (paid holders stay paid)",
                ));
            }
        }
    }
}

/// Before batch `batch`: while the distribution is paused (`distribution.paused_at`,
/// set by [`crate::Ops::distribution_pause`]), waits for [`RESUME_SIGNAL`] and reads
/// the flag again (`paused b.k` steps). A resume recorded while the flag was still
/// unread leaves a signal no wait consumed; a later pause consumes it and, the flag
/// still set, waits again, so a stale resume never lets a paused batch through.
async fn pause_gate(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    id: Uuid,
    batch: u32,
) -> Result<(), Failure> {
    let mut read: u32 = 0;
    loop {
        let paused = step_ok(
            ctx.step(&format!("paused {batch}.{read}"), || async move {
                store::distribution_paused(&p.db, id)
                    .await
                    .map_err(store_err)
            })
            .await?,
        )?;
        if !paused {
            return Ok(());
        }
        ctx.set_progress(json!({ "phase": "paused", "batch": batch }));
        let _: SignalOutcome<serde_json::Value> = ctx.wait_signal(RESUME_SIGNAL, None).await?;
        read += 1;
    }
}

/// The `batch size` step: recipients per batch from an estimate of a probe batch of
/// the first unplaced payments (gas per recipient = the difference between a probe of
/// k and of 1, over k − 1), within [`BATCH_GAS_BUDGET`] and at most [`MAX_BATCH`] or
/// the request's maximum. A probe that cannot be estimated (a refused recipient in it)
/// falls back to a conservative 60,000 gas per recipient.
async fn batch_size(
    p: &WorkflowEnv,
    chain: &ChainContext,
    batch_pay: Address,
    input: &DistributionInput,
) -> Result<u32, StepError<OpFailure>> {
    let cap = input.max_batch.unwrap_or(MAX_BATCH).clamp(1, MAX_BATCH);
    let rows = store::distribution_payments_unplaced(&p.db, input.operation_id, 16)
        .await
        .map_err(store_err)?;
    let probe: Vec<(Address, U256)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                Address::try_from(r.holder.as_slice()).ok()?,
                U256::from_str_radix(&r.amount, 10).ok()?,
            ))
        })
        .collect();
    let estimate = |n: usize| {
        let c = CheckedBatch {
            to: probe[..n].iter().map(|x| x.0).collect(),
            amounts: probe[..n].iter().map(|x| x.1).collect(),
        };
        let tx = TransactionRequest::default()
            .from(input.payer)
            .to(batch_pay)
            .input(Bytes::from(batch_calldata(input, 0, &c)).into())
            .value(batch_value(input, &c));
        async move { chain.node.estimate_gas(&tx).await.ok() }
    };
    let (base, per) = if probe.len() >= 2 {
        match (estimate(1).await, estimate(probe.len()).await) {
            (Some(one), Some(k)) if k > one => {
                let per = (k - one) / (probe.len() as u64 - 1);
                (one.saturating_sub(per), per.max(1))
            }
            _ => (50_000, 60_000),
        }
    } else {
        (50_000, 60_000)
    };
    // Headroom: storage a probe found warm may be cold in a later batch.
    let per = per + per / 4;
    let fits = BATCH_GAS_BUDGET.saturating_sub(base) / per;
    Ok(u32::try_from(fits).unwrap_or(u32::MAX).clamp(1, cap))
}

/// The `check b.k` step: the batch's pending payments, simulated; each recipient the
/// call refuses (`TransferRefused(i)`) is marked refused with the token's own error
/// name when it has one, and the call simulated again without it. Any other revert
/// fails the distribution `EXECUTION_REVERTED` with the error's name.
async fn check_batch(
    p: &WorkflowEnv,
    chain: &ChainContext,
    batch_pay: Address,
    input: &DistributionInput,
    batch: u32,
) -> Result<CheckedBatch, StepError<OpFailure>> {
    let id = input.operation_id;
    let rows =
        store::distribution_batch_place(&p.db, id, i32::try_from(batch).unwrap_or(i32::MAX), 0)
            .await
            .map_err(store_err)?;
    let mut c = CheckedBatch {
        to: Vec::with_capacity(rows.len()),
        amounts: Vec::with_capacity(rows.len()),
    };
    for r in &rows {
        c.to.push(Address::try_from(r.holder.as_slice()).map_err(store_err)?);
        c.amounts.push(decode_u256(&r.amount)?);
    }
    while !c.to.is_empty() {
        let data = batch_calldata(input, batch, &c);
        let answer = try_call(chain, input.payer, batch_pay, data, batch_value(input, &c)).await?;
        let Err(revert) = answer else { break };
        let Ok(BatchPay::BatchPayErrors::TransferRefused(refused)) =
            BatchPay::BatchPayErrors::abi_decode(&revert)
        else {
            return Err(StepError::Failed(OpFailure {
                reason: custom_error_name(&revert),
                ..OpFailure::new(
                    "EXECUTION_REVERTED",
                    false,
                    "a batch of the distribution would revert",
                )
            }));
        };
        let i = usize::try_from(refused.index).unwrap_or(usize::MAX);
        if i >= c.to.len() {
            return Err(StepError::Failed(OpFailure::new(
                "EXECUTION_REVERTED",
                false,
                "the batch contract named a recipient outside the batch",
            )));
        }
        let (to, amount) = (c.to.remove(i), c.amounts.remove(i));
        let reason = refusal_reason(chain, batch_pay, input, to, amount).await;
        store::distribution_payment_refuse(&p.db, id, to.as_slice(), &reason)
            .await
            .map_err(store_err)?;
    }
    Ok(c)
}

/// Why the payment of `amount` to `to` is refused: the token's error name for the
/// `transferFrom` `BatchPay` makes (a call from `BatchPay`) when Keel knows its ABI,
/// `custom error 0x<selector>` for another custom error, `TransferRefused` when the
/// token gives no error data (or for native ether).
async fn refusal_reason(
    chain: &ChainContext,
    batch_pay: Address,
    input: &DistributionInput,
    to: Address,
    amount: U256,
) -> String {
    const DEFAULT: &str = "TransferRefused";
    let PayWith::Token { token } = input.pay else {
        return DEFAULT.to_owned();
    };
    let call = AssetToken::transferFromCall {
        from: input.payer,
        to,
        value: amount,
    }
    .abi_encode();
    match try_call(chain, batch_pay, token, call, U256::ZERO).await {
        Ok(Err(data)) => custom_error_name(&data).unwrap_or_else(|| match data.get(..4) {
            // An error Keel has no ABI for: its selector, so an auditor can look it up.
            Some(selector) if data.len() >= 4 => {
                format!("custom error 0x{}", alloy::hex::encode(selector))
            }
            _ => DEFAULT.to_owned(),
        }),
        _ => DEFAULT.to_owned(),
    }
}

/// The `settle b` step: marks batch `batch`'s payments paid and emits
/// `distribution.batch_settled`, in one transaction (a repeat changes and emits
/// nothing).
async fn settle(
    p: &WorkflowEnv,
    organization_id: Uuid,
    id: Uuid,
    batch: u32,
    tx_hash: B256,
    block: u64,
) -> Result<(), StepError<OpFailure>> {
    let mut tx = p.db.begin().await.map_err(store_err)?;
    let changed = store::distribution_batch_settle(
        &mut *tx,
        id,
        i32::try_from(batch).unwrap_or(i32::MAX),
        tx_hash.as_slice(),
        i64::try_from(block).unwrap_or(i64::MAX),
    )
    .await
    .map_err(store_err)?;
    if changed > 0 {
        let tally = store::distribution_tally(&mut *tx, id)
            .await
            .map_err(store_err)?;
        let data = json!({
            "distributionId": id,
            "batch": batch,
            "txHash": tx_hash.to_string(),
            "block": block,
            "holders": changed,
            "progress": crate::ops::distributions::progress_json(&tally),
        });
        keel_webhooks::emit_in(
            &mut tx,
            &keel_webhooks::NewEvent {
                organization_id,
                event_type: keel_webhooks::event::DISTRIBUTION_BATCH_SETTLED,
                operation_id: Some(id),
                data: &data,
            },
        )
        .await
        .map_err(store_err)?;
    }
    tx.commit().await.map_err(store_err)?;
    Ok(())
}

/// The output: the payments tallied.
async fn output(
    p: &WorkflowEnv,
    id: Uuid,
    batches: u32,
    remainder: U256,
) -> Result<DistributionOutput, StepError<OpFailure>> {
    let tally = store::distribution_tally(&p.db, id)
        .await
        .map_err(store_err)?;
    let of = |state: &str| -> Result<(u64, U256), StepError<OpFailure>> {
        match tally.iter().find(|t| t.state == state) {
            Some(t) => Ok((
                u64::try_from(t.holders).unwrap_or(0),
                decode_u256(&t.amount)?,
            )),
            None => Ok((0, U256::ZERO)),
        }
    };
    let (holders_paid, amount_paid) = of("paid")?;
    let (holders_refused, amount_refused) = of("refused")?;
    Ok(DistributionOutput {
        holders_paid,
        holders_refused,
        amount_paid,
        amount_refused,
        remainder,
        batches,
    })
}

/// Marks the distribution completed and emits `distribution.completed`, in one
/// transaction (inside the `complete` step; a repeat does neither).
async fn complete(
    p: &WorkflowEnv,
    organization_id: Uuid,
    id: Uuid,
) -> Result<(), StepError<OpFailure>> {
    let mut tx = p.db.begin().await.map_err(store_err)?;
    if !store::distribution_complete(&mut *tx, id)
        .await
        .map_err(store_err)?
    {
        return Ok(());
    }
    let tally = store::distribution_tally(&mut *tx, id)
        .await
        .map_err(store_err)?;
    let data = json!({
        "distributionId": id,
        "progress": crate::ops::distributions::progress_json(&tally),
    });
    keel_webhooks::emit_in(
        &mut tx,
        &keel_webhooks::NewEvent {
            organization_id,
            event_type: keel_webhooks::event::DISTRIBUTION_COMPLETED,
            operation_id: Some(id),
            data: &data,
        },
    )
    .await
    .map_err(store_err)?;
    tx.commit().await.map_err(store_err)?;
    Ok(())
}
