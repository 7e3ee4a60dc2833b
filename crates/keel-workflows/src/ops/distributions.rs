//! Distributions (issue 36 §3): `POST /v1/distributions` accepts a payout to the holders
//! of an asset's final snapshot as a `distribution.pay` operation
//! ([`crate::workflows::distribution`]); the reads show its plan, its progress and
//! every holder's payment.
//!
//! Amounts are **base units of the paying token** (wei for native ether), decimal
//! integer strings: a pro-rata `amount` is the total split; a per-unit `amount` is paid
//! per whole unit (`10^decimals` base units) of the asset held. The rounding rules are
//! those of [`crate::workflows::distribution_plan`].
//!
//! Approval: when the template sets a mint approval threshold, a distribution paying the
//! asset itself pro rata waits for an approval when its total is above the threshold;
//! every other distribution (per unit, another token, native ether) waits whenever a
//! threshold is set, since the threshold is stated in the asset's units.

use crate::error::{OpsError, Result};
use crate::kinds::OperationKind;
use crate::ops::Ops;
use crate::ops::amount::above_threshold;
use crate::ops::read::AssetStatus;
use crate::ops::view::OperationView;
use crate::store::{self, NewDistributionRow, NewOperationRow, PaymentTallyRow};
use crate::tenancy::{Caller, template};
use crate::workflows::distribution::{DistributionInput, MAX_BATCH, PayWith, RESUME_SIGNAL};
use crate::workflows::distribution_plan::{Basis, Rounding};
use alloy::primitives::{Address, B256, U256};
use chrono::{DateTime, Utc};
use keel_durable::RunStatus;
use keel_index::snapshot::{self, SnapshotState};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The most exclusions one distribution names.
pub const MAX_EXCLUSIONS: usize = 1_000;

/// What a distribution pays with, as requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayRequest {
    /// The asset's own token (paid from the paying account's holdings).
    Asset,
    /// Another ERC-20 the paying account holds.
    Erc20 {
        /// The token (not the zero address).
        token: Address,
    },
    /// The chain's native currency.
    Native,
}

/// A request to pay a distribution (`POST /v1/distributions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDistribution {
    /// The asset whose holders are paid.
    pub asset_id: Uuid,
    /// A final snapshot of that asset.
    pub snapshot_id: Uuid,
    /// What is paid.
    pub pay: PayRequest,
    /// `proRata` or `perUnit`.
    pub basis: String,
    /// Base units of the paying token, decimal integer (see the module docs).
    pub amount: String,
    /// `floor` or `largestRemainder`.
    pub rounding: String,
    /// Holders paid nothing (at most [`MAX_EXCLUSIONS`]).
    pub exclusions: Vec<Address>,
    /// The most recipients per batch, 1..=500 (the batch size is otherwise chosen from
    /// gas).
    pub max_batch_size: Option<u32>,
}

/// Payments of a distribution tallied: holders and base units per state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Holders.
    pub holders: u64,
    /// Base units owed to them.
    pub amount: U256,
}

/// A distribution's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DistributionProgress {
    /// Paid (their batch's transaction confirmed).
    pub paid: Tally,
    /// Owed and not paid yet.
    pub pending: Tally,
    /// Refused by the paying token or the recipient (left out of their batch).
    pub refused: Tally,
    /// Excluded by the request.
    pub excluded: Tally,
    /// Shares that rounded to 0.
    pub zero: Tally,
    /// Batches paid.
    pub batches_paid: u64,
}

/// A distribution as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct DistributionView {
    /// The distribution (also its operation's id).
    pub id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// The snapshot.
    pub snapshot_id: Uuid,
    /// The record date (the snapshot's block).
    pub record_block: Option<u64>,
    /// What is paid.
    pub pay: PayRequest,
    /// `proRata` or `perUnit`.
    pub basis: &'static str,
    /// Base units of the paying token (the total, or per whole unit).
    pub amount: U256,
    /// The rounding rule.
    pub rounding: &'static str,
    /// Excluded holders.
    pub exclusions: Vec<Address>,
    /// Holders of the snapshot, once planned.
    pub holder_count: Option<u64>,
    /// The sum owed, once planned.
    pub total_due: Option<U256>,
    /// What the rounding left unpaid (stays with the payer), once planned.
    pub remainder: Option<U256>,
    /// The payments tallied.
    pub progress: DistributionProgress,
    /// Its operation (state, wait, transactions, error).
    pub operation: OperationView,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When its last batch was paid.
    pub completed_at: Option<DateTime<Utc>>,
    /// Since when it is paused (`None`: running or ended).
    pub paused_at: Option<DateTime<Utc>>,
}

/// One holder's payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentView {
    /// The holder.
    pub holder: Address,
    /// Its balance at the record date, base units of the asset.
    pub balance: U256,
    /// What it is owed, base units of the paying token.
    pub amount: U256,
    /// `pending`, `paid`, `refused`, `excluded` or `zero`.
    pub state: String,
    /// Its batch, once placed in one.
    pub batch: Option<u32>,
    /// The transaction that paid it.
    pub tx_hash: Option<B256>,
    /// That transaction's block.
    pub block: Option<u64>,
    /// Why it was refused (the token's error name, or `TransferRefused`).
    pub reason: Option<String>,
}

fn decode_err() -> OpsError {
    OpsError::Store(keel_store::StoreError::Decode)
}

fn u256(s: &str) -> Result<U256> {
    U256::from_str_radix(s, 10).map_err(|_| decode_err())
}

fn address(b: &[u8]) -> Result<Address> {
    Address::try_from(b).map_err(|_| decode_err())
}

/// The tally rows as a [`DistributionProgress`] (unknown states are ignored).
pub fn progress_of(rows: &[PaymentTallyRow]) -> DistributionProgress {
    let mut p = DistributionProgress::default();
    for r in rows {
        let t = Tally {
            holders: u64::try_from(r.holders).unwrap_or(0),
            amount: U256::from_str_radix(&r.amount, 10).unwrap_or_default(),
        };
        match r.state.as_str() {
            "paid" => {
                p.paid = t;
                p.batches_paid = u64::try_from(r.batches).unwrap_or(0);
            }
            "pending" => p.pending = t,
            "refused" => p.refused = t,
            "excluded" => p.excluded = t,
            "zero" => p.zero = t,
            _ => {}
        }
    }
    p
}

/// The progress as webhook events carry it: `{holdersPaid, holdersPending,
/// holdersRefused, amountPaid, amountPending, amountRefused, batchesPaid}` (amounts in
/// base units, decimal strings).
pub fn progress_json(rows: &[PaymentTallyRow]) -> Value {
    let p = progress_of(rows);
    json!({
        "holdersPaid": p.paid.holders,
        "holdersPending": p.pending.holders,
        "holdersRefused": p.refused.holders,
        "amountPaid": p.paid.amount.to_string(),
        "amountPending": p.pending.amount.to_string(),
        "amountRefused": p.refused.amount.to_string(),
        "batchesPaid": p.batches_paid,
    })
}

fn base_units(s: &str) -> Result<U256> {
    if s.is_empty() || s.len() > 78 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(OpsError::InvalidField {
            field: "amount",
            reason: "must be a decimal integer of base units",
        });
    }
    U256::from_str_radix(s, 10).map_err(|_| OpsError::InvalidField {
        field: "amount",
        reason: "must fit in 256 bits",
    })
}

impl Ops {
    /// Accepts a distribution: the asset must be active and the snapshot one of its
    /// final snapshots; records the operation and the distribution (idempotently by
    /// `key`) and starts `distribution.pay`.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`asset`, `snapshot`); [`OpsError::AssetNotReady`];
    /// [`OpsError::SnapshotNotFinal`]; [`OpsError::InvalidField`] (`payToken`,
    /// `basis`, `amountBaseUnits`, `rounding`, `exclusions`, `maxBatchSize`);
    /// [`OpsError::IdempotencyConflict`]; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn distribution_create(
        &self,
        caller: Caller,
        key: &str,
        req: &NewDistribution,
    ) -> Result<(bool, DistributionView)> {
        crate::ops::accept::check_key(key)?;
        let amount = base_units(&req.amount)?;
        let basis = match req.basis.as_str() {
            "proRata" => Basis::ProRata(amount),
            "perUnit" => Basis::PerUnit(amount),
            _ => {
                return Err(OpsError::InvalidField {
                    field: "basis",
                    reason: "must be proRata or perUnit",
                });
            }
        };
        let rounding = Rounding::from_name(&req.rounding).ok_or(OpsError::InvalidField {
            field: "rounding",
            reason: "must be floor or largestRemainder",
        })?;
        if matches!(basis, Basis::PerUnit(_)) && rounding != Rounding::Floor {
            return Err(OpsError::InvalidField {
                field: "rounding",
                reason: "a per-unit distribution rounds each share down (floor)",
            });
        }
        if req.exclusions.len() > MAX_EXCLUSIONS {
            return Err(OpsError::InvalidField {
                field: "exclusions",
                reason: "at most 1000 addresses",
            });
        }
        if let Some(n) = req.max_batch_size
            && !(1..=MAX_BATCH).contains(&n)
        {
            return Err(OpsError::InvalidField {
                field: "maxBatchSize",
                reason: "must be 1 to 500",
            });
        }
        if let PayRequest::Erc20 { token } = req.pay
            && token.is_zero()
        {
            return Err(OpsError::InvalidField {
                field: "payToken",
                reason: "must not be the zero address",
            });
        }
        let mut exclusions = req.exclusions.clone();
        exclusions.sort_unstable();
        exclusions.dedup();
        let asset = self.asset_record(caller, req.asset_id).await?;
        let (Some(asset_token), AssetStatus::Active) = (asset.token, asset.status()) else {
            return Err(OpsError::AssetNotReady);
        };
        let snap = snapshot::seal(&self.db, req.snapshot_id)
            .await?
            .filter(|s| s.chain == asset.chain_id && s.token == asset_token)
            .ok_or(OpsError::NotFound { what: "snapshot" })?;
        if snap.state != SnapshotState::Final {
            return Err(OpsError::SnapshotNotFinal);
        }
        let (pay, pay_kind, pay_token) = match req.pay {
            PayRequest::Asset => (
                PayWith::Token { token: asset_token },
                "asset",
                Some(asset_token),
            ),
            PayRequest::Erc20 { token } => (PayWith::Token { token }, "erc20", Some(token)),
            PayRequest::Native => (PayWith::Native, "native", None),
        };
        let request_hash: Vec<u8> = Sha256::digest(
            json!({
                "kind": OperationKind::DistributionPay.name(),
                "asset": req.asset_id, "snapshot": req.snapshot_id,
                "pay": pay_kind, "token": pay_token,
                "basis": req.basis, "amount": amount.to_string(), "rounding": rounding.name(),
                "exclusions": exclusions, "maxBatchSize": req.max_batch_size,
            })
            .to_string()
            .as_bytes(),
        )
        .to_vec();
        let t = template(&self.db, caller.organization_id, &asset.template_id).await?;
        let needs_approval = match (t.mint_approval_threshold.as_deref(), req.pay, basis) {
            (None, ..) => false,
            (Some(th), PayRequest::Asset, Basis::ProRata(total)) => {
                above_threshold(total, th, asset.decimals)?
            }
            (Some(_), ..) => true,
        };
        let chain_id = i64::try_from(asset.chain_id.get()).map_err(|_| decode_err())?;
        let exclusion_bytes: Vec<Vec<u8>> = exclusions.iter().map(|a| a.to_vec()).collect();
        let (operation_id, created) = loop {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
            {
                if op.request_sha256 != request_hash {
                    return Err(OpsError::IdempotencyConflict);
                }
                if op.instance_id.is_some() {
                    return Ok((false, self.distribution(caller, op.id).await?));
                }
                break (op.id, false);
            }
            let operation_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            let inserted = store::operation_insert(
                &mut *tx,
                &NewOperationRow {
                    id: operation_id,
                    organization_id: caller.organization_id,
                    kind: OperationKind::DistributionPay,
                    asset_id: Some(req.asset_id),
                    idempotency_key: key,
                    request_sha256: &request_hash,
                    api_key_id: caller.api_key_id,
                },
            )
            .await?;
            if inserted {
                store::distribution_insert(
                    &mut *tx,
                    &NewDistributionRow {
                        id: operation_id,
                        organization_id: caller.organization_id,
                        asset_id: req.asset_id,
                        snapshot_id: req.snapshot_id,
                        chain_id,
                        pay_kind,
                        pay_token: pay_token.as_ref().map(|a| a.as_slice()),
                        basis: &req.basis,
                        amount: &amount.to_string(),
                        rounding: rounding.name(),
                        exclusions: &exclusion_bytes,
                    },
                )
                .await?;
                self.emit_accepted(&mut tx, caller.organization_id, operation_id)
                    .await?;
                tx.commit().await?;
                break (operation_id, true);
            }
            tx.rollback().await?;
        };
        let input = DistributionInput {
            operation_id,
            organization_id: caller.organization_id,
            chain_id: asset.chain_id.get(),
            snapshot_id: req.snapshot_id,
            asset_decimals: asset.decimals,
            pay,
            basis,
            rounding,
            exclusions,
            max_batch: req.max_batch_size,
            approval_ttl_seconds: needs_approval.then_some(t.approval_ttl_seconds),
            funding_deadline_seconds: t.funding_pause.then_some(t.funding_deadline_seconds),
            sender: t.sender.as_ref().and(asset.issuer),
            issuer: if t.sender.is_some() {
                None
            } else {
                asset.issuer
            },
            payer: Address::ZERO,
        };
        let serialization = Some(format!(
            "distribution-pay:{}:{}",
            asset.chain_id.get(),
            pay_token.map_or_else(|| "native".to_owned(), |a| a.to_string())
        ));
        self.start::<crate::workflows::DistributionPay>(
            operation_id,
            &input,
            serialization,
            caller,
        )
        .await?;
        Ok((created, self.distribution(caller, operation_id).await?))
    }

    /// The distribution `id` of the caller's organization.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`distribution`); [`OpsError::Store`] /
    /// [`OpsError::Engine`].
    pub async fn distribution(&self, caller: Caller, id: Uuid) -> Result<DistributionView> {
        let row = store::distribution_get(&self.db, caller.organization_id, id)
            .await?
            .ok_or(OpsError::NotFound {
                what: "distribution",
            })?;
        self.distribution_view(caller, row).await
    }

    /// Pauses distribution `id`: its workflow holds before its next batch (a batch
    /// already queued still lands and settles) until [`Ops::distribution_resume`].
    /// Pausing a paused distribution changes nothing.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`distribution`); [`OpsError::OperationEnded`] when its
    /// operation has ended; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn distribution_pause(&self, caller: Caller, id: Uuid) -> Result<DistributionView> {
        let row = self.running_distribution(caller, id).await?;
        if store::distribution_pause(&self.db, caller.organization_id, row.id)
            .await?
            .is_some()
        {
            tracing::info!(target: "keel::ops", distribution = %id, "distribution paused");
        }
        self.distribution(caller, id).await
    }

    /// Resumes a paused distribution `id`: clears the pause and, in the same database
    /// transaction, records the workflow's [`RESUME_SIGNAL`] (its history names the
    /// caller). Resuming a distribution that is not paused changes nothing.
    ///
    /// # Errors
    /// As [`Ops::distribution_pause`].
    pub async fn distribution_resume(&self, caller: Caller, id: Uuid) -> Result<DistributionView> {
        let row = self.running_distribution(caller, id).await?;
        let instance = self
            .operation_row(caller, id)
            .await?
            .instance_id
            .ok_or(OpsError::OperationEnded)?;
        let actor = self.actor(caller).await?;
        let mut tx = self.db.begin().await?;
        if let Some(n) =
            store::distribution_unpause(&mut *tx, caller.organization_id, row.id).await?
        {
            match self
                .engine
                .signal_in_as(
                    &mut tx,
                    instance,
                    RESUME_SIGNAL,
                    &format!("resume-{n}"),
                    &json!({}),
                    &actor,
                )
                .await
            {
                Ok(_) | Err(keel_durable::DurableError::InstanceEnded { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(target: "keel::ops", distribution = %id, pause = n, "distribution resumed");
        }
        tx.commit().await?;
        self.distribution(caller, id).await
    }

    /// The distribution `id` while its operation has not ended.
    async fn running_distribution(
        &self,
        caller: Caller,
        id: Uuid,
    ) -> Result<store::DistributionRow> {
        let row = store::distribution_get(&self.db, caller.organization_id, id)
            .await?
            .ok_or(OpsError::NotFound {
                what: "distribution",
            })?;
        if row.completed_at.is_some() {
            return Err(OpsError::OperationEnded);
        }
        let op = self.operation_row(caller, id).await?;
        if let Some(instance) = op.instance_id {
            let status = self.engine.status(instance).await?.status;
            if matches!(
                status,
                RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
            ) {
                return Err(OpsError::OperationEnded);
            }
        }
        Ok(row)
    }

    /// Up to `limit` distributions of asset `asset_id`, newest first, strictly after
    /// the position `after` (the previous page's last `createdAt` and `id`).
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`asset`); [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn distributions(
        &self,
        caller: Caller,
        asset_id: Uuid,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: u32,
    ) -> Result<Vec<DistributionView>> {
        self.asset_record(caller, asset_id).await?;
        let rows = store::distribution_list(
            &self.db,
            caller.organization_id,
            asset_id,
            after,
            i64::from(limit),
        )
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(self.distribution_view(caller, r).await?);
        }
        Ok(out)
    }

    /// Up to `limit` payments of distribution `id` in holder order, strictly after
    /// holder `after`. A paid row's block is its transaction's block as the queue's
    /// verdict has it now (a reorg can move it; the queue follows until final).
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`distribution`); [`OpsError::Store`].
    pub async fn distribution_payments(
        &self,
        caller: Caller,
        id: Uuid,
        after: Option<Address>,
        limit: u32,
    ) -> Result<Vec<PaymentView>> {
        store::distribution_get(&self.db, caller.organization_id, id)
            .await?
            .ok_or(OpsError::NotFound {
                what: "distribution",
            })?;
        // A reorg that moved a batch's transaction to another block (the queue
        // re-broadcast the same bytes) updates the queue's verdict, not the payment
        // rows: the block comes from the operation's confirmed transactions.
        let blocks: std::collections::HashMap<B256, u64> = self
            .operation(caller, id)
            .await?
            .milestones
            .confirmed
            .iter()
            .filter_map(|m| Some((m.tx_hash?, m.block?)))
            .collect();
        let after = after.map(|a| a.to_vec()).unwrap_or_default();
        store::distribution_payments(&self.db, id, &after, i64::from(limit))
            .await?
            .into_iter()
            .map(|r| {
                let tx_hash = r
                    .tx_hash
                    .map(|h| B256::try_from(h.as_slice()).map_err(|_| decode_err()))
                    .transpose()?;
                let block = tx_hash
                    .and_then(|h| blocks.get(&h).copied())
                    .or_else(|| r.block_number.and_then(|b| u64::try_from(b).ok()));
                Ok(PaymentView {
                    holder: address(&r.holder)?,
                    balance: u256(&r.balance)?,
                    amount: u256(&r.amount)?,
                    state: r.state,
                    batch: r.batch.and_then(|b| u32::try_from(b).ok()),
                    tx_hash,
                    block,
                    reason: r.reason,
                })
            })
            .collect()
    }

    async fn distribution_view(
        &self,
        caller: Caller,
        row: store::DistributionRow,
    ) -> Result<DistributionView> {
        let tally = store::distribution_tally(&self.db, row.id).await?;
        let record_block = snapshot::get(&self.db, row.snapshot_id)
            .await?
            .map(|s| s.block);
        let pay = match (row.pay_kind.as_str(), row.pay_token.as_deref()) {
            ("asset", _) => PayRequest::Asset,
            ("erc20", Some(t)) => PayRequest::Erc20 { token: address(t)? },
            ("native", _) => PayRequest::Native,
            _ => return Err(decode_err()),
        };
        let basis = match row.basis.as_str() {
            "proRata" => "proRata",
            "perUnit" => "perUnit",
            _ => return Err(decode_err()),
        };
        let rounding = Rounding::from_name(&row.rounding)
            .ok_or_else(decode_err)?
            .name();
        Ok(DistributionView {
            id: row.id,
            asset_id: row.asset_id,
            snapshot_id: row.snapshot_id,
            record_block,
            pay,
            basis,
            amount: u256(&row.amount)?,
            rounding,
            exclusions: row
                .exclusions
                .iter()
                .map(|a| address(a))
                .collect::<Result<_>>()?,
            holder_count: row.holder_count.and_then(|n| u64::try_from(n).ok()),
            total_due: row.total_due.as_deref().map(u256).transpose()?,
            remainder: row.remainder.as_deref().map(u256).transpose()?,
            progress: progress_of(&tally),
            operation: self.operation(caller, row.id).await?,
            created_at: row.created_at,
            completed_at: row.completed_at,
            paused_at: row.paused_at,
        })
    }
}
