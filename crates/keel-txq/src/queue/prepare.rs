//! The preparation stage, before any nonce: a sender's nonce row, the funding check of
//! `waiting_funding` requests, and each queued request's gas limit and cost against the
//! sender's funds (settling it `failed` or pausing it in `waiting_funding` when it
//! cannot be signed).

use super::attempt::{Fees, ReadyTx, SenderPlan, TxBody, failed};
use super::{SENDERS_IN_FLIGHT, Signing, TxQueue, metrics};
use crate::store::{self, RequestRow};
use crate::verdict::{FailureCode, SettlementVerdict};
use crate::{Result, TxqError};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::{Address, Bytes, TxKind, U256};
use alloy::rpc::types::TransactionRequest;
use alloy::rpc::types::state::StateOverridesBuilder;
use keel_chain::{ChainError, NodeErrorKind};
use tokio_util::sync::CancellationToken;

enum Prepared {
    Ready(Box<ReadyTx>),
    Settled,
    /// Entered `waiting_funding`; the sender's later requests wait behind it.
    Waiting,
    Retry,
}

impl Prepared {
    /// The outcome of a request whose preparation settles it: `Settled`, or, when the
    /// settle rolled back (`settled` false: the settlement sink failed), `Retry`: the
    /// request stays queued and the sender's later requests wait behind it (queue
    /// order), until a later pass settles it.
    fn settled(settled: bool) -> Self {
        if settled {
            Prepared::Settled
        } else {
            Prepared::Retry
        }
    }
}

impl TxQueue {
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
        let max_fee = self.fees().await?.max_fee_per_gas;
        let mut available = self
            .chain
            .balance(sender, BlockNumberOrTag::Pending)
            .await?
            .wei
            .get();
        let mut moved = 0;
        for w in &waiting {
            let value: U256 = w
                .value_wei
                .parse()
                .map_err(|_| TxqError::InvalidRequest("value"))?;
            let gas = u64::try_from(w.funding_gas_limit)
                .map_err(|_| TxqError::InvalidRequest("gas_limit"))?;
            let l1_fee: U256 = match &w.funding_l1_fee_wei {
                Some(f) => f.parse().map_err(|_| TxqError::InvalidRequest("l1_fee"))?,
                None => U256::ZERO,
            };
            let need = U256::from(gas)
                .saturating_mul(U256::from(max_fee))
                .saturating_add(value)
                .saturating_add(l1_fee);
            if available >= need {
                available -= need;
                if store::request_resume(&self.db, w.id).await? {
                    tracing::info!(target: "keel::txq", request = %w.id, %sender, "funds arrived; request resumes");
                    metrics::funding_resumed(self.chain_id);
                    moved += 1;
                }
                continue;
            }
            if w.expired {
                let verdict = failed(FailureCode::FundingDeadlineExpired, vec![]);
                if self.settle_expired(w.id, &verdict).await? {
                    tracing::warn!(target: "keel::txq", request = %w.id, %sender, "funding deadline passed; request failed");
                    moved += 1;
                }
                continue;
            }
            let short = need - available;
            self.keep_waiting(w, short, max_fee).await?;
            return Ok((true, moved));
        }
        Ok((false, moved))
    }

    /// Prepares one queued request for signing: its gas limit (estimated when not
    /// fixed) and what it costs; settles it `failed` when it can never be signed
    /// (estimation reverts, its gas limit exceeds `block_gas_limit` — the latest
    /// block's, `EXCEEDS_BLOCK_GAS_LIMIT`: no node would accept it, so it must not hold
    /// a nonce —, the sender cannot pay and the request has no funding pause), or moves
    /// it to `waiting_funding` (the sender cannot pay, funding pause enabled). Nothing
    /// here takes a nonce.
    async fn prepare(
        &self,
        sender: Address,
        req: &RequestRow,
        fees: Fees,
        block_gas_limit: Option<u64>,
        available: &mut U256,
    ) -> Result<Prepared> {
        let max_fee = fees.max_fee_per_gas;
        let body = TxBody::of(req)?;
        let (to, value) = (body.to, body.value);
        let gas_limit = match req.gas_limit {
            Some(g) => u64::try_from(g).map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
            None => {
                let call = TransactionRequest {
                    from: Some(sender),
                    to: Some(to.map_or(TxKind::Create, TxKind::Call)),
                    value: Some(value),
                    input: body.data.clone().into(),
                    authorization_list: (!body.authorization_list.is_empty())
                        .then(|| body.authorization_list.clone()),
                    ..Default::default()
                };
                match self.chain.estimate_gas(&call).await {
                    Ok(g) => g.saturating_add(
                        g.saturating_mul(self.config.gas_limit_headroom_percent) / 100,
                    ),
                    Err(ChainError::Node { error, .. }) => {
                        let verdict = match error.kind {
                            NodeErrorKind::ExecutionReverted => {
                                let revert = error.revert.unwrap_or(keel_chain::RevertReason {
                                    message: None,
                                    data: Bytes::new(),
                                });
                                SettlementVerdict::Failed {
                                    code: FailureCode::ExecutionReverted,
                                    reason: revert.message,
                                    revert_data: Some(revert.data),
                                    attempts: vec![],
                                }
                            }
                            NodeErrorKind::InsufficientFunds if req.funding_pause_ms.is_some() => {
                                // The node refuses to estimate without funds: estimate as
                                // if funded; a lower bound of 21,000 gas when it cannot.
                                let gas = self.estimate_funded(sender, &body).await;
                                let l1_fee = self.l1_fee(&body, gas, fees).await?;
                                return self
                                    .wait_for_funds(req, gas, max_fee, value, l1_fee, *available)
                                    .await;
                            }
                            NodeErrorKind::InsufficientFunds => {
                                failed(FailureCode::GasRequired, vec![])
                            }
                            _ => failed(FailureCode::Rejected, vec![]),
                        };
                        return Ok(Prepared::settled(self.settle(req.id, &verdict).await?));
                    }
                    Err(e) => {
                        tracing::debug!(target: "keel::txq", error = %e, "estimation failed; retry next pass");
                        return Ok(Prepared::Retry);
                    }
                }
            }
        };
        let gas_cap = match (block_gas_limit, self.config.max_gas_per_transaction) {
            (Some(block), Some(tx)) => Some(block.min(tx)),
            (block, tx) => block.or(tx),
        };
        if gas_cap.is_some_and(|limit| gas_limit > limit) {
            // Before any nonce (issue 33 §1): a transaction over the block gas limit is
            // refused by every node, and a nonce it held would be a gap to fill.
            let verdict = failed(FailureCode::ExceedsBlockGasLimit, vec![]);
            tracing::warn!(target: "keel::txq", request = %req.id, gas_limit, "gas limit exceeds the block gas limit; request failed before signing");
            return Ok(Prepared::settled(self.settle(req.id, &verdict).await?));
        }
        // OP Stack: the L1 data fee on top (0 elsewhere).
        let l1_fee = self.l1_fee(&body, gas_limit, fees).await?;
        let need = U256::from(gas_limit)
            .saturating_mul(U256::from(max_fee))
            .saturating_add(value)
            .saturating_add(l1_fee);
        if *available < need {
            if req.funding_pause_ms.is_some() {
                return self
                    .wait_for_funds(req, gas_limit, max_fee, value, l1_fee, *available)
                    .await;
            }
            let verdict = failed(FailureCode::GasRequired, vec![]);
            return Ok(Prepared::settled(self.settle(req.id, &verdict).await?));
        }
        *available -= need;
        Ok(Prepared::Ready(Box::new(ReadyTx {
            id: req.id,
            row: req.clone(),
            body,
            gas_limit,
        })))
    }

    /// Moves a queued request with a funding pause to `waiting_funding`, its funding
    /// request being `gas_limit × max_fee + value + l1_fee − available` wei (deadline
    /// set on the first detection; `l1_fee` is recorded for the funding checks). Takes
    /// no nonce.
    async fn wait_for_funds(
        &self,
        req: &RequestRow,
        gas_limit: u64,
        max_fee: u128,
        value: U256,
        l1_fee: U256,
        available: U256,
    ) -> Result<Prepared> {
        let need = U256::from(gas_limit)
            .saturating_mul(U256::from(max_fee))
            .saturating_add(value)
            .saturating_add(l1_fee);
        let short = need.saturating_sub(available).max(U256::from(1));
        let gas = i64::try_from(gas_limit).map_err(|_| TxqError::InvalidRequest("gas_limit"))?;
        if !self
            .open_funding(
                req,
                short,
                gas,
                &max_fee.to_string(),
                (!l1_fee.is_zero()).then(|| l1_fee.to_string()).as_deref(),
            )
            .await?
        {
            // Moved by another process meanwhile.
            return Ok(Prepared::Retry);
        }
        metrics::funding_paused(self.chain_id);
        tracing::warn!(target: "keel::txq", request = %req.id, required_wei = %short, "sender cannot pay; request waits for funding");
        Ok(Prepared::Waiting)
    }

    /// `eth_estimateGas` with the sender's balance overridden (state override), for a
    /// request the node refused to estimate for lack of funds; 21,000 (the intrinsic
    /// minimum, a lower bound) when the node supports no override or still refuses.
    async fn estimate_funded(&self, sender: Address, body: &TxBody) -> u64 {
        let call = TransactionRequest {
            from: Some(sender),
            to: Some(body.to.map_or(TxKind::Create, TxKind::Call)),
            value: Some(body.value),
            input: body.data.clone().into(),
            authorization_list: (!body.authorization_list.is_empty())
                .then(|| body.authorization_list.clone()),
            ..Default::default()
        };
        let balance = body.value.saturating_add(U256::from(10u128.pow(30)));
        let overrides = StateOverridesBuilder::with_capacity(1)
            .with_balance(sender, balance)
            .build();
        match self
            .chain
            .estimate_gas_with_overrides(&call, BlockNumberOrTag::Latest, &overrides)
            .await
        {
            Ok(g) => {
                g.saturating_add(g.saturating_mul(self.config.gas_limit_headroom_percent) / 100)
            }
            Err(e) => {
                tracing::debug!(target: "keel::txq", error = %e, "estimation with a balance override failed; using 21,000 gas as a lower bound");
                21_000
            }
        }
    }

    /// The preparation half of a signing round for `senders` (address, has
    /// `waiting_funding` requests): sender rows and funding checks, the queued requests
    /// with each sender's next nonce, the round's fees, the balances, and each request's
    /// preparation. Returns the plans of the senders with prepared requests, sorted by
    /// sender (the lock order of the group commits), and the fees they are signed with;
    /// `None` when nothing is to be signed. Counts and errors go to `out`.
    pub(super) async fn prepare_round(
        &self,
        senders: &[(Address, bool)],
        out: &mut Signing,
        cancel: &CancellationToken,
    ) -> Option<(Vec<SenderPlan>, Fees)> {
        use futures::StreamExt;
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
            return None;
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
            Err(e) => {
                out.fail(e);
                return None;
            }
        };
        if rows.is_empty() {
            return None;
        }
        // Rows come grouped by sender, oldest first.
        let mut queued: Vec<(Address, i64, Vec<RequestRow>)> = Vec::new();
        for row in rows {
            let sender = row.request.sender.0;
            match queued.last_mut() {
                Some((s, _, requests)) if *s == sender => requests.push(row.request),
                _ => queued.push((sender, row.next_nonce, vec![row.request])),
            }
        }
        // Fees once per round; each sender's funds in one batch, spent down locally as
        // its requests are prepared (their transactions are not in the node's pool yet).
        let fees = match self.fees().await {
            Ok(fees) => fees,
            Err(e) => {
                out.fail(e);
                return None;
            }
        };
        // The latest block's gas limit, once per round: a request above it fails before
        // a nonce. Unknown (the node has no such field or block): not checked.
        let block_gas_limit = match self.chain.block_gas_limit(BlockNumberOrTag::Latest).await {
            Ok(limit) => limit,
            Err(e) => {
                out.fail(e.into());
                return None;
            }
        };
        let addresses: Vec<Address> = queued.iter().map(|q| q.0).collect();
        let balances = match self
            .chain
            .balances(&addresses, BlockNumberOrTag::Pending)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                out.fail(e.into());
                return None;
            }
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
                    match self
                        .prepare(sender, req, fees, block_gas_limit, &mut available)
                        .await?
                    {
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
        Some((plans, fees))
    }
}
