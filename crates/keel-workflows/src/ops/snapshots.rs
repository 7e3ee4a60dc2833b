//! Record-date snapshots of an asset as objects (issue 36 §2) over
//! `keel_index::snapshot`: created once per block, pending until the block is final on
//! the asset's chain, then sealed — holder count, total, content hash, pages from their
//! own rows and a CSV export that never change again. Every call first seals what
//! became due (sealing happens on read; nothing else has to run for it), and is scoped
//! to the caller's organization like every read: another organization's asset or
//! snapshot is `NotFound`.

use crate::error::{OpsError, Result};
use crate::ops::Ops;
use crate::ops::amount::format_amount;
use crate::ops::ledger::HolderView;
use crate::store;
use crate::tenancy::Caller;
use alloy::primitives::{Address, B256, U256};
use chrono::{DateTime, Utc};
use keel_index::snapshot::{self, SealBlocker, Snapshot, SnapshotState};
use uuid::Uuid;

/// Why a snapshot is still pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingReason {
    /// The Ledger Index has not reached its block yet.
    NotIndexed,
    /// Its block is above the chain's finalized block.
    NotFinal,
    /// History below its block is still being indexed.
    HistoryIndexing,
    /// The chain's index is degraded or being re-indexed.
    IndexUnhealthy,
}

impl PendingReason {
    /// The wire spelling (`notIndexed`, `notFinal`, `historyIndexing`,
    /// `indexUnhealthy`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotIndexed => "notIndexed",
            Self::NotFinal => "notFinal",
            Self::HistoryIndexing => "historyIndexing",
            Self::IndexUnhealthy => "indexUnhealthy",
        }
    }
}

/// A snapshot of an asset as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotView {
    /// The snapshot.
    pub id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// The record date: balances count every canonical transfer at or below this block.
    pub block: u64,
    /// True once sealed: nothing about it changes any more.
    pub finalized: bool,
    /// Why it is still pending; `None` once final.
    pub pending_reason: Option<PendingReason>,
    /// Holders with a positive balance (final snapshots).
    pub holder_count: Option<u64>,
    /// Sum of the holders' balances in token units (final snapshots).
    pub total: Option<String>,
    /// The same in base units.
    pub total_base_units: Option<U256>,
    /// SHA-256 of the CSV export (final snapshots).
    pub content_hash: Option<B256>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was sealed.
    pub finalized_at: Option<DateTime<Utc>>,
}

/// A page of a snapshot's holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotHoldersView {
    /// The snapshot.
    pub snapshot: SnapshotView,
    /// Holders by balance descending, then address ascending (as many as asked).
    pub holders: Vec<HolderView>,
}

fn reason(b: SealBlocker) -> PendingReason {
    match b {
        SealBlocker::NotIndexed => PendingReason::NotIndexed,
        SealBlocker::NotFinal => PendingReason::NotFinal,
        SealBlocker::HistoryOpen => PendingReason::HistoryIndexing,
        SealBlocker::IndexUnhealthy => PendingReason::IndexUnhealthy,
    }
}

impl Ops {
    async fn snapshot_view(
        &self,
        asset_id: Uuid,
        decimals: u8,
        s: &Snapshot,
    ) -> Result<SnapshotView> {
        let pending_reason = match s.state {
            SnapshotState::Final => None,
            SnapshotState::Pending => Some(
                snapshot::seal_blocker(&self.db, s)
                    .await?
                    .map_or(PendingReason::NotFinal, reason),
            ),
        };
        let total = s
            .sealed
            .map(|m| format_amount(m.total, decimals))
            .transpose()?;
        Ok(SnapshotView {
            id: s.id,
            asset_id,
            block: s.block,
            finalized: s.state == SnapshotState::Final,
            pending_reason,
            holder_count: s.sealed.map(|m| m.holder_count),
            total,
            total_base_units: s.sealed.map(|m| m.total),
            content_hash: s.sealed.map(|m| m.content_hash),
            created_at: s.created_at,
            finalized_at: s.sealed.map(|m| m.finalized_at),
        })
    }

    /// The snapshot `snapshot_id` of asset `asset_id`, sealed first if it became due.
    async fn snapshot_of(
        &self,
        caller: Caller,
        asset_id: Uuid,
        snapshot_id: Uuid,
    ) -> Result<(crate::ops::read::AssetRecord, Snapshot)> {
        let r = self.asset_record(caller, asset_id).await?;
        let token = r.token.ok_or(OpsError::NotFound { what: "snapshot" })?;
        let s = snapshot::seal(&self.db, snapshot_id)
            .await?
            .filter(|s| s.chain == r.chain_id && s.token == token)
            .ok_or(OpsError::NotFound { what: "snapshot" })?;
        Ok((r, s))
    }

    /// Creates the snapshot of asset `id` at block `at_block` (default: the indexed tip)
    /// — or answers the one that exists for that block (`false`) — sealed at once when
    /// its block is already final. A block above the indexed tip is accepted (a record
    /// date announced ahead): the snapshot stays pending until the index reaches it and
    /// it is final.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::AssetNotReady`] before the token exists;
    /// [`OpsError::BlockNotIndexed`] without `at_block` when nothing is indexed;
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn snapshot_create(
        &self,
        caller: Caller,
        id: Uuid,
        at_block: Option<u64>,
    ) -> Result<(SnapshotView, bool)> {
        let r = self.asset_record(caller, id).await?;
        let token = r.token.ok_or(OpsError::AssetNotReady)?;
        let block = match at_block {
            Some(b) => b,
            None => keel_index::read::indexed_tip(&self.db, r.chain_id)
                .await?
                .map(|t| t.number)
                .ok_or(OpsError::BlockNotIndexed { indexed: None })?,
        };
        let (s, created) = snapshot::create(&self.db, r.chain_id, token, block).await?;
        Ok((self.snapshot_view(id, r.decimals, &s).await?, created))
    }

    /// The snapshot `snapshot_id` of asset `asset_id`.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (also a snapshot of another asset); [`OpsError::Store`] /
    /// [`OpsError::Index`].
    pub async fn snapshot(
        &self,
        caller: Caller,
        asset_id: Uuid,
        snapshot_id: Uuid,
    ) -> Result<SnapshotView> {
        let (r, s) = self.snapshot_of(caller, asset_id, snapshot_id).await?;
        self.snapshot_view(asset_id, r.decimals, &s).await
    }

    /// Up to `limit` snapshots of asset `id`, newest record date first, strictly below
    /// block `before` (the previous page's last `block`).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn snapshots(
        &self,
        caller: Caller,
        id: Uuid,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<SnapshotView>> {
        let r = self.asset_record(caller, id).await?;
        let Some(token) = r.token else {
            return Ok(Vec::new());
        };
        snapshot::seal_due(&self.db, r.chain_id).await?;
        let rows = snapshot::list(&self.db, r.chain_id, token, before, limit).await?;
        let mut out = Vec::with_capacity(rows.len());
        for s in &rows {
            out.push(self.snapshot_view(id, r.decimals, s).await?);
        }
        Ok(out)
    }

    /// Up to `limit` holders of snapshot `snapshot_id` ranked by balance descending, then
    /// address ascending, after the keyset `after` = (balance in base units, address):
    /// a final snapshot's own rows, a pending one's computed from the index at its block
    /// (it may still change with a reorg).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::BlockNotIndexed`] for a pending snapshot
    /// whose block the index has not reached; [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn snapshot_holders(
        &self,
        caller: Caller,
        asset_id: Uuid,
        snapshot_id: Uuid,
        after: Option<(U256, Address)>,
        limit: u32,
    ) -> Result<SnapshotHoldersView> {
        let (r, s) = self.snapshot_of(caller, asset_id, snapshot_id).await?;
        let after = after.map(|(balance, holder)| keel_index::read::HolderKey { balance, holder });
        let mut tx = self.db.begin().await?;
        store::transaction_snapshot(&mut *tx).await?;
        if s.state == SnapshotState::Pending {
            let tip = keel_index::read::indexed_tip(&mut *tx, s.chain)
                .await?
                .map(|t| t.number);
            if tip.is_none_or(|t| t < s.block) {
                return Err(OpsError::BlockNotIndexed { indexed: tip });
            }
        }
        let rows = snapshot::holders(&mut *tx, &s, after, limit).await?;
        // Frozen state as of the record date (issue 37 §3), in the same snapshot.
        let frozen = keel_index::read::frozen_at(&mut *tx, s.chain, s.token, s.block).await?;
        tx.commit().await?;
        let holders = rows
            .into_iter()
            .map(|h| {
                let f = frozen.get(&h.holder).copied().unwrap_or_default();
                Ok(HolderView {
                    address: h.holder,
                    balance: format_amount(h.balance, r.decimals)?,
                    balance_base_units: h.balance,
                    frozen_balance: format_amount(f.amount, r.decimals)?,
                    frozen_balance_base_units: f.amount,
                    frozen: f.address_frozen,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SnapshotHoldersView {
            snapshot: self.snapshot_view(asset_id, r.decimals, &s).await?,
            holders,
        })
    }

    /// The final snapshot `snapshot_id` of asset `asset_id`, for an export of its rows
    /// ([`Ops::snapshot_csv_chunk`]).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::SnapshotNotFinal`] while it is pending;
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn snapshot_for_export(
        &self,
        caller: Caller,
        asset_id: Uuid,
        snapshot_id: Uuid,
    ) -> Result<SnapshotView> {
        let (r, s) = self.snapshot_of(caller, asset_id, snapshot_id).await?;
        if s.state != SnapshotState::Final {
            return Err(OpsError::SnapshotNotFinal);
        }
        self.snapshot_view(asset_id, r.decimals, &s).await
    }

    /// A chunk of final snapshot `snapshot_id`'s CSV export: the header line when
    /// `after` is `None`, then the lines of up to `limit` holders in canonical order
    /// (holder ascending) strictly after `after` (see `keel_index::snapshot`: the bytes
    /// whose SHA-256 is the snapshot's content hash), and the holder to continue after
    /// (`None` after the last chunk). Check the snapshot with
    /// [`Ops::snapshot_for_export`] first; a pending one has no rows.
    ///
    /// # Errors
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn snapshot_csv_chunk(
        &self,
        snapshot_id: Uuid,
        after: Option<Address>,
        limit: u32,
    ) -> Result<(String, Option<Address>)> {
        let rows = snapshot::rows_by_holder(&self.db, snapshot_id, after, limit).await?;
        let mut out = String::new();
        if after.is_none() {
            out.push_str(snapshot::CSV_HEADER);
        }
        for h in &rows {
            out.push_str(&snapshot::csv_line(h));
        }
        let next = if rows.len() == usize::try_from(limit).unwrap_or(usize::MAX) {
            rows.last().map(|h| h.holder)
        } else {
            None
        };
        Ok((out, next))
    }
}
