//! The Ledger read API of an asset (issue 18 §3): its holders ranked by balance, at
//! the indexed tip or as of a record date (`atBlock`), its transfers (all, or of one
//! holder) and its supply at a block. Everything comes from the Ledger Index through
//! `keel_index::read` and `keel_index::token_supply_at`, inside one `REPEATABLE READ`
//! transaction with the indexed tip, so a page and the block it says it reflects agree.
//! Scoped to the caller's organization like every read (the asset is looked up in the caller's organization first).

use crate::error::{OpsError, Result};
use crate::ops::Ops;
use crate::ops::amount::format_amount;
use crate::store;
use crate::tenancy::Caller;
use alloy::primitives::{Address, B256, U256};
use chrono::{DateTime, Utc};
use keel_units::ChainId;
use sqlx::PgConnection;
use uuid::Uuid;

/// A holder's balance in a holders page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    /// The holder.
    pub address: Address,
    /// Token units (decimal string with the token's decimals).
    pub balance: String,
    /// Base units.
    pub balance_base_units: U256,
    /// The part of the balance that cannot move (a regulated asset's
    /// `freezePartialTokens`), token units; `"0"` when none.
    pub frozen_balance: String,
    /// The same, base units.
    pub frozen_balance_base_units: U256,
    /// Whether the whole address is frozen (it can neither send nor receive).
    pub frozen: bool,
}

/// A page of an asset's holders as of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldersView {
    /// The asset.
    pub asset_id: Uuid,
    /// The block the balances reflect (`atBlock`, else the indexed tip).
    pub block: u64,
    /// True when `block` is at or below the chain's finalized block as the index last
    /// recorded it: the snapshot cannot change any more. False means a reorg may still
    /// replace blocks at or below `block` (the index would then answer the new branch).
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded (see
    /// [`crate::AssetView::index_degraded`]).
    pub index_degraded: bool,
    /// True while a re-index rebuilds the chain's index (see
    /// [`crate::AssetView::index_rebuilding`]).
    pub index_rebuilding: bool,
    /// Holders by balance descending, then address ascending (as many as asked).
    pub holders: Vec<HolderView>,
}

/// One `Transfer` of an asset's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferView {
    /// Block number.
    pub block_number: u64,
    /// The block's timestamp, when the index has it.
    pub block_time: Option<DateTime<Utc>>,
    /// Block hash.
    pub block_hash: B256,
    /// Transaction hash.
    pub tx_hash: B256,
    /// Log index within the block.
    pub log_index: u64,
    /// Sender (zero for a mint).
    pub from: Address,
    /// Receiver (zero for a burn).
    pub to: Address,
    /// Token units (decimal string with the token's decimals).
    pub amount: String,
    /// Base units.
    pub amount_base_units: U256,
}

/// A page of an asset's transfers, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransfersView {
    /// The asset.
    pub asset_id: Uuid,
    /// The indexed tip the page was read at (0 when nothing is indexed yet).
    pub indexed_block: u64,
    /// True when the Ledger Index of the asset's chain is degraded.
    pub index_degraded: bool,
    /// True while a re-index rebuilds the chain's index.
    pub index_rebuilding: bool,
    /// Transfers by `(block number, log index)` descending (as many as asked).
    pub transfers: Vec<TransferView>,
}

/// An asset's total supply as of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupplyView {
    /// The asset.
    pub asset_id: Uuid,
    /// The block the supply reflects (`atBlock`, else the indexed tip).
    pub block: u64,
    /// As [`HoldersView::finalized`].
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded.
    pub index_degraded: bool,
    /// True while a re-index rebuilds the chain's index.
    pub index_rebuilding: bool,
    /// Token units (decimal string with the token's decimals).
    pub supply: String,
    /// Base units.
    pub supply_base_units: U256,
}

/// The block a snapshot read answers for, checked against the index.
struct Snapshot {
    block: u64,
    finalized: bool,
    degraded: bool,
    rebuilding: bool,
}

/// Resolves `at_block` (or the indexed tip) inside the caller's snapshot transaction.
async fn snapshot(
    tx: &mut PgConnection,
    chain: ChainId,
    at_block: Option<u64>,
) -> Result<Snapshot> {
    let tip = keel_index::read::indexed_tip(&mut *tx, chain)
        .await?
        .map(|t| t.number);
    let Some(tip) = tip else {
        return Err(OpsError::BlockNotIndexed { indexed: None });
    };
    let block = at_block.unwrap_or(tip);
    if block > tip {
        return Err(OpsError::BlockNotIndexed { indexed: Some(tip) });
    }
    let finalized = keel_index::read::finalized_block(&mut *tx, chain)
        .await?
        .is_some_and(|f| block <= f);
    let health = keel_index::read::chain_health(&mut *tx, chain).await?;
    Ok(Snapshot {
        block,
        finalized,
        degraded: health.is_degraded(),
        rebuilding: health.is_rebuilding(),
    })
}

impl Ops {
    /// Up to `limit` holders of asset `id` with positive balances as of `at_block`
    /// (default: the indexed tip), ranked by balance descending, then address
    /// ascending, after the keyset `after` = (balance in base units, address) of the
    /// previous page's last holder. Exact for any block at or below the indexed tip:
    /// computed from the canonical transfers the index holds at or below it.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (also another organization's asset);
    /// [`OpsError::AssetNotReady`] before the token exists; [`OpsError::BlockNotIndexed`]
    /// when `at_block` is above the indexed tip or nothing is indexed;
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn holders(
        &self,
        caller: Caller,
        id: Uuid,
        at_block: Option<u64>,
        after: Option<(U256, Address)>,
        limit: u32,
    ) -> Result<HoldersView> {
        let r = self.asset_record(caller, id).await?;
        let token = r.token.ok_or(OpsError::AssetNotReady)?;
        let mut tx = self.db.begin().await?;
        store::transaction_snapshot(&mut *tx).await?;
        let s = snapshot(&mut tx, r.chain_id, at_block).await?;
        let after = after.map(|(balance, holder)| keel_index::read::HolderKey { balance, holder });
        let rows = keel_index::read::holders_at(&mut *tx, r.chain_id, token, s.block, after, limit)
            .await?;
        // The frozen state as of the same block, in the same snapshot (issue 37 §3;
        // empty for a token that is not regulated).
        let frozen = keel_index::read::frozen_at(&mut *tx, r.chain_id, token, s.block).await?;
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
        Ok(HoldersView {
            asset_id: id,
            block: s.block,
            finalized: s.finalized,
            index_degraded: s.degraded,
            index_rebuilding: s.rebuilding,
            holders,
        })
    }

    /// Up to `limit` transfers of asset `id` (of `holder` as sender or receiver when
    /// given), newest first, strictly before the keyset `before` = (block number, log
    /// index) of the previous page's last transfer.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::AssetNotReady`]; [`OpsError::Store`] /
    /// [`OpsError::Index`].
    pub async fn transfers(
        &self,
        caller: Caller,
        id: Uuid,
        holder: Option<Address>,
        before: Option<(u64, u64)>,
        limit: u32,
    ) -> Result<TransfersView> {
        let r = self.asset_record(caller, id).await?;
        let token = r.token.ok_or(OpsError::AssetNotReady)?;
        let chain = r.chain_id;
        let mut tx = self.db.begin().await?;
        store::transaction_snapshot(&mut *tx).await?;
        let tip = keel_index::read::indexed_tip(&mut *tx, chain).await?;
        let health = keel_index::read::chain_health(&mut *tx, chain).await?;
        let rows =
            keel_index::read::transfer_page(&mut *tx, chain, token, holder, before, limit).await?;
        tx.commit().await?;
        let transfers = rows
            .into_iter()
            .map(|t| {
                Ok(TransferView {
                    block_number: t.position.block_number,
                    block_time: t.block_time,
                    block_hash: t.position.block_hash,
                    tx_hash: t.position.tx_hash,
                    log_index: t.position.log_index,
                    from: t.from,
                    to: t.to,
                    amount: format_amount(t.value, r.decimals)?,
                    amount_base_units: t.value,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TransfersView {
            asset_id: id,
            indexed_block: tip.map(|t| t.number).unwrap_or(0),
            index_degraded: health.is_degraded(),
            index_rebuilding: health.is_rebuilding(),
            transfers,
        })
    }

    /// The total supply of asset `id` as of `at_block` (default: the indexed tip):
    /// mints minus burns at or below it.
    ///
    /// # Errors
    /// As [`Ops::holders`].
    pub async fn supply(
        &self,
        caller: Caller,
        id: Uuid,
        at_block: Option<u64>,
    ) -> Result<SupplyView> {
        let r = self.asset_record(caller, id).await?;
        let token = r.token.ok_or(OpsError::AssetNotReady)?;
        let mut tx = self.db.begin().await?;
        store::transaction_snapshot(&mut *tx).await?;
        let s = snapshot(&mut tx, r.chain_id, at_block).await?;
        let supply = keel_index::token_supply_at(&mut *tx, r.chain_id, token, s.block).await?;
        tx.commit().await?;
        Ok(SupplyView {
            asset_id: id,
            block: s.block,
            finalized: s.finalized,
            index_degraded: s.degraded,
            index_rebuilding: s.rebuilding,
            supply: format_amount(supply, r.decimals)?,
            supply_base_units: supply,
        })
    }
}
