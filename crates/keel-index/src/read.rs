//! Reads of the projections, and read-after-write waits.

use crate::decode::FreezeChange;
use crate::scope::{chain_i64, to_i64};
use crate::store::{chain as chain_row, ledger, projection};
use crate::{IndexError, Result};
use alloy::primitives::{Address, B256, U256};
use keel_store::PgPool;
use keel_units::ChainId;
use sqlx::PgExecutor;
use sqlx::postgres::PgListener;
use sqlx::types::chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::time::Duration;

/// The channel of `pg_notify` sent with every checkpoint advance (payload
/// `"<chain_id>:<block number>"`): tip ingest notifies it, readers wait on it.
pub const TIP_CHANNEL: &str = "keel_index_tip";

/// The indexed tip of a chain: every row at or below `number` reflects the canonical
/// chain as far as the tip ingest has verified it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexedTip {
    /// Block number.
    pub number: u64,
    /// Block hash.
    pub hash: B256,
}

/// Where an event sits on chain (every projected row carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    /// Block number.
    pub block_number: u64,
    /// Log index within the block.
    pub log_index: u64,
    /// Block hash.
    pub block_hash: B256,
    /// Transaction hash.
    pub tx_hash: B256,
}

/// An ERC-20 `Transfer` of a scoped asset token (a mint has `from` = zero address).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransferRow {
    /// Position of the event.
    pub position: EventPosition,
    /// The token contract.
    pub token: Address,
    /// Sender (zero for a mint).
    pub from: Address,
    /// Receiver (zero for a burn).
    pub to: Address,
    /// Amount in the token's base units, as a decimal integer string.
    pub value: String,
}

/// An asset announced by `AssetCreated`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssetRow {
    /// Position of the event.
    pub position: EventPosition,
    /// The factory that created it.
    pub factory: Address,
    /// Keel asset id.
    pub asset_id: B256,
    /// The token contract.
    pub token: Address,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
}

/// A price observation (`AnswerUpdated`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservationRow {
    /// Position of the event.
    pub position: EventPosition,
    /// The feed contract.
    pub feed: Address,
    /// Round id, decimal string.
    pub round_id: String,
    /// Answer in the feed's decimals, signed decimal string.
    pub answer: String,
    /// Round timestamp (unix seconds), decimal string.
    pub updated_at: String,
}

/// A directory entry. `removed_at_block` is set when the entry was removed or replaced
/// by a later value in that block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryEntryRow {
    /// Position of the `EntryChanged` event that set it.
    pub position: EventPosition,
    /// The directory contract.
    pub directory: Address,
    /// The entry name (32 bytes, ASCII left-aligned).
    pub name: B256,
    /// The entry value.
    pub value: Address,
    /// Block of the removal or replacement; `None` while live.
    pub removed_at_block: Option<u64>,
}

fn decode_err() -> IndexError {
    IndexError::Store(keel_store::StoreError::Decode)
}

fn b256(v: &[u8]) -> Result<B256> {
    B256::try_from(v).map_err(|_| decode_err())
}

fn address(v: &[u8]) -> Result<Address> {
    Address::try_from(v).map_err(|_| decode_err())
}

fn u64_of(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| decode_err())
}

fn position(row: &projection::PositionRow) -> Result<EventPosition> {
    Ok(EventPosition {
        block_number: u64_of(row.block_number)?,
        log_index: u64_of(row.log_index)?,
        block_hash: b256(&row.block_hash)?,
        tx_hash: b256(&row.tx_hash)?,
    })
}

/// The indexed tip of `chain`, if any block was ingested.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn indexed_tip(db: impl PgExecutor<'_>, chain: ChainId) -> Result<Option<IndexedTip>> {
    let row = chain_row::chain_tip(db, chain_i64(chain)).await?;
    row.map(|r| {
        Ok(IndexedTip {
            number: u64_of(r.tip_number.ok_or_else(decode_err)?)?,
            hash: b256(r.tip_hash.as_deref().ok_or_else(decode_err)?)?,
        })
    })
    .transpose()
}

/// Why a chain's index is degraded (see [`chain_health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degraded {
    /// When the tip ingest marked the chain (database clock, UTC).
    pub since: DateTime<Utc>,
    /// Value-free text of what happened (e.g. a reorg below the finalized block).
    pub reason: String,
    /// The indexed tip when it was marked, if recorded.
    pub at_block: Option<u64>,
}

/// The health of one chain's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHealth {
    /// The chain.
    pub chain: ChainId,
    /// The indexed tip, if any block was ingested.
    pub tip: Option<IndexedTip>,
    /// `Some` when the tip ingest stopped because the chain reorganized below its
    /// finalized block: rows may belong to orphaned blocks until an operator re-indexes
    /// the chain. Readers should say the index is degraded.
    pub degraded: Option<Degraded>,
    /// `Some(since)` while an operator's re-index ([`crate::reindex()`]) rebuilds the
    /// chain's index: rows above the re-index's first block are being written again,
    /// so reads may miss some until it is done. Readers should say so.
    pub rebuilding_since: Option<DateTime<Utc>>,
}

impl ChainHealth {
    /// True when the index of the chain is degraded.
    pub fn is_degraded(&self) -> bool {
        self.degraded.is_some()
    }

    /// True while a re-index rebuilds the chain's index.
    pub fn is_rebuilding(&self) -> bool {
        self.rebuilding_since.is_some()
    }
}

/// The health of `chain`'s index: its tip and whether it is degraded. A chain never
/// indexed is healthy with no tip.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn chain_health(db: impl PgExecutor<'_>, chain: ChainId) -> Result<ChainHealth> {
    let row = chain_row::chain_health_of(db, chain_i64(chain)).await?;
    let Some(r) = row else {
        return Ok(ChainHealth {
            chain,
            tip: None,
            degraded: None,
            rebuilding_since: None,
        });
    };
    Ok(health_of(chain, r))
}

/// True when `chain` has an `index_chain` row (an indexer took it, or a re-index ran).
///
/// # Errors
/// [`IndexError::Store`].
pub async fn chain_known(db: impl PgExecutor<'_>, chain: ChainId) -> Result<bool> {
    Ok(chain_row::chain_health_of(db, chain_i64(chain))
        .await?
        .is_some())
}

/// Every indexed chain whose index is degraded, by chain id.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn degraded_chains(db: impl PgExecutor<'_>) -> Result<Vec<ChainHealth>> {
    let rows = chain_row::chains_degraded(db).await?;
    Ok(rows
        .into_iter()
        .map(|r| health_of(ChainId(u64::try_from(r.chain_id).unwrap_or(0)), r))
        .collect())
}

fn health_of(chain: ChainId, r: chain_row::ChainHealthRow) -> ChainHealth {
    let tip = match (r.tip_number, r.tip_hash) {
        (Some(n), Some(h)) if h.len() == 32 => Some(IndexedTip {
            number: u64::try_from(n).unwrap_or(0),
            hash: B256::from_slice(&h),
        }),
        _ => None,
    };
    let (reason, block) = (r.degraded_reason, r.degraded_block);
    let degraded = r.degraded_at.map(|since| Degraded {
        since,
        reason: reason.unwrap_or_default(),
        at_block: block.and_then(|b| u64::try_from(b).ok()),
    });
    ChainHealth {
        chain,
        tip,
        degraded,
        rebuilding_since: r.rebuild_started_at,
    }
}

/// Transfers of `token` on `chain` (every token when `None`), in chain order.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn transfers(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Option<Address>,
) -> Result<Vec<TransferRow>> {
    let rows = projection::transfers_of(db, chain_i64(chain), token.as_ref().map(|t| t.as_slice()))
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(TransferRow {
                position: position(&r.position)?,
                token: address(&r.token)?,
                from: address(&r.from_address)?,
                to: address(&r.to_address)?,
                value: r.value,
            })
        })
        .collect()
}

/// The balance of `holder` in `token` on `chain`, in base units as a decimal string
/// ("0" when it never received any). Computed on read from the transfers (the
/// `index_balance` view), so it always agrees with them, including after a reorg.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn balance(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    holder: Address,
) -> Result<String> {
    let v =
        projection::balance_of(db, chain_i64(chain), token.as_slice(), holder.as_slice()).await?;
    Ok(v.unwrap_or_else(|| "0".to_owned()))
}

/// The balance of `holder` in `token` on `chain` as of block `at_block` — every
/// indexed `Transfer` at or below it — in base units. Exact for any block at or below
/// the indexed tip ([`indexed_tip`]; read both in one `REPEATABLE READ` transaction), as
/// [`holders_at`]: the kept balance corrected by the holder's transfers above the
/// block. Zero for a holder that had received nothing by then.
///
/// # Errors
/// [`IndexError::Store`] (a negative or unreadable result is `StoreError::Decode`).
pub async fn balance_at(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    holder: Address,
    at_block: u64,
) -> Result<U256> {
    let v = ledger::balance_at(
        db,
        chain_i64(chain),
        token.as_slice(),
        holder.as_slice(),
        to_i64(at_block),
    )
    .await?;
    U256::from_str_radix(&v, 10).map_err(|_| decode_err())
}

/// Every nonzero balance of `token` on `chain`, by holder.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn balances(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
) -> Result<Vec<(Address, String)>> {
    let rows = projection::balances_of(db, chain_i64(chain), token.as_slice()).await?;
    rows.into_iter()
        .map(|r| Ok((address(&r.holder)?, r.balance)))
        .collect()
}

/// Assets created on `chain`, in chain order.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn assets(db: impl PgExecutor<'_>, chain: ChainId) -> Result<Vec<AssetRow>> {
    let rows = projection::assets_of(db, chain_i64(chain)).await?;
    rows.into_iter()
        .map(|r| {
            Ok(AssetRow {
                position: position(&r.position)?,
                factory: address(&r.factory)?,
                asset_id: b256(&r.asset_id)?,
                token: address(&r.token)?,
                symbol: r.symbol,
                decimals: u8::try_from(r.decimals).map_err(|_| decode_err())?,
            })
        })
        .collect()
}

/// Observations of `feed` on `chain`, in chain order.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn observations(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    feed: Address,
) -> Result<Vec<ObservationRow>> {
    let rows = projection::observations_of(db, chain_i64(chain), feed.as_slice()).await?;
    rows.into_iter()
        .map(|r| {
            Ok(ObservationRow {
                position: position(&r.position)?,
                feed: address(&r.feed)?,
                round_id: r.round_id,
                answer: r.answer,
                updated_at: r.updated_at,
            })
        })
        .collect()
}

/// Entries of `directory` on `chain`: live ones only, or with `history` also the
/// removed and replaced ones. Chain order.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn directory_entries(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    directory: Address,
    history: bool,
) -> Result<Vec<DirectoryEntryRow>> {
    let rows =
        projection::directory_entries_of(db, chain_i64(chain), directory.as_slice(), history)
            .await?;
    rows.into_iter()
        .map(|r| {
            Ok(DirectoryEntryRow {
                position: position(&r.position)?,
                directory: address(&r.directory)?,
                name: b256(&r.name)?,
                value: address(&r.value)?,
                removed_at_block: r.removed_at_block.and_then(|n| u64::try_from(n).ok()),
            })
        })
        .collect()
}

/// Read-after-write: waits until the tip ingest of `chain` has committed block
/// `block` (its indexed tip is at or above it) and returns that tip. Woken by the
/// checkpoint's `pg_notify` on [`TIP_CHANNEL`], with a poll every `poll` as fallback
/// (a missed notification or a lost listener connection only delays the answer).
///
/// # Errors
/// [`IndexError::WaitTimeout`] when `timeout` passes first; [`IndexError::Store`].
pub async fn wait_for_block(
    db: &PgPool,
    chain: ChainId,
    block: u64,
    timeout: Duration,
    poll: Duration,
) -> Result<IndexedTip> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut listener = match PgListener::connect_with(db).await {
        Ok(mut l) => match l.listen(TIP_CHANNEL).await {
            Ok(()) => Some(l),
            Err(_) => None,
        },
        Err(_) => None,
    };
    let target = to_i64(block);
    loop {
        let tip = indexed_tip(db, chain).await?;
        if let Some(t) = tip
            && to_i64(t.number) >= target
        {
            return Ok(t);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(IndexError::WaitTimeout {
                chain,
                block,
                indexed: tip.map(|t| t.number),
            });
        }
        let wake = (now + poll).min(deadline);
        match listener.as_mut() {
            Some(l) => {
                tokio::select! {
                    r = l.recv() => { if r.is_err() { listener = None; } }
                    () = tokio::time::sleep_until(wake) => {}
                }
            }
            None => tokio::time::sleep_until(wake).await,
        }
    }
}

/// Whether `token` is paused according to its latest `Paused`/`Unpaused` event, with
/// that event's position; `None` when no such event was indexed.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn token_paused(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
) -> Result<Option<(bool, EventPosition)>> {
    let row = projection::token_pause_latest(db, chain_i64(chain), token.as_slice()).await?;
    row.map(|r| Ok((r.paused, position(&r.position)?)))
        .transpose()
}

/// The staleness bound of `feed` (seconds, decimal string) according to the latest
/// `StalenessBoundSet`/`StalenessBoundCleared` event, with that event's position.
/// `None` when never set; `Some((None, _))` when cleared.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn staleness_bound(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    feed: Address,
) -> Result<Option<(Option<String>, EventPosition)>> {
    let row = projection::staleness_bound_latest(db, chain_i64(chain), feed.as_slice()).await?;
    row.map(|r| Ok((r.bound, position(&r.position)?)))
        .transpose()
}

/// Frozen state of one holder of a RegulatedToken (issue 37 §3), as its
/// `AddressFrozenSet`, `TokensFrozen`, `TokensUnfrozen` and `RecoverySuccess` events
/// leave it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FrozenState {
    /// The part of the holder's balance that cannot move, in token base units
    /// (`frozenAmount` on chain).
    pub amount: U256,
    /// True when the whole address is frozen: it can neither send nor receive
    /// (`isFrozen` on chain).
    pub address_frozen: bool,
}

impl FrozenState {
    /// True when nothing is frozen (such holders are left out of [`frozen_at`]).
    pub fn is_clear(&self) -> bool {
        self.amount.is_zero() && !self.address_frozen
    }
}

/// The frozen state of every holder of RegulatedToken `token` on `chain` as of block
/// `at_block` (inclusive), by holder: only holders with a positive frozen amount
/// (token base units) or a frozen address. Empty for a plain AssetToken (it never
/// emits freeze events) and for a token not indexed.
///
/// Computed on read by folding the token's indexed freeze events (`index_freeze_event`)
/// at or below the block in chain order, so it agrees with them whatever order blocks
/// and history ranges were written in, and after a reorg rollback. As [`holders_at`]:
/// exact for any `at_block` at or below the indexed tip ([`indexed_tip`]; read both in
/// one `REPEATABLE READ` transaction); a block above the tip counts every indexed
/// event. The cost grows with the token's freeze events up to the block.
///
/// # Errors
/// [`IndexError::Store`] (a stored row that does not decode is `StoreError::Decode`).
pub async fn frozen_at(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    at_block: u64,
) -> Result<BTreeMap<Address, FrozenState>> {
    let rows =
        projection::freeze_events_of(db, chain_i64(chain), token.as_slice(), to_i64(at_block))
            .await?;
    let changes = rows.iter().map(freeze_change).collect::<Result<Vec<_>>>()?;
    Ok(fold_frozen(changes))
}

/// Decodes one stored freeze event.
fn freeze_change(r: &projection::FreezeEventRecord) -> Result<FreezeChange> {
    let account = address(&r.account)?;
    let amount = || {
        r.amount
            .as_deref()
            .and_then(|a| U256::from_str_radix(a, 10).ok())
            .ok_or_else(decode_err)
    };
    Ok(match r.kind.as_str() {
        "address" => FreezeChange::Address {
            account,
            frozen: r.frozen.ok_or_else(decode_err)?,
        },
        "freeze" => FreezeChange::Freeze {
            account,
            amount: amount()?,
        },
        "unfreeze" => FreezeChange::Unfreeze {
            account,
            amount: amount()?,
        },
        "recovery" => FreezeChange::Recovery {
            lost: account,
            replacement: address(r.replacement.as_deref().ok_or_else(decode_err)?)?,
        },
        _ => return Err(decode_err()),
    })
}

/// Folds freeze events (in chain order) into the frozen state of every holder they
/// leave with something frozen, as RegulatedToken applies them: an address (un)freeze
/// sets the flag; a freeze adds to the frozen amount, an unfreeze subtracts from it
/// (clamped at zero: the contract refuses more, so a larger one means events are
/// missing, and a read must not fail on it); a recovery moves the lost wallet's amount
/// onto the replacement's, freezes the replacement if the lost wallet was frozen (never
/// unfreezes it) and clears the lost wallet. Pure.
fn fold_frozen(changes: impl IntoIterator<Item = FreezeChange>) -> BTreeMap<Address, FrozenState> {
    let mut state: BTreeMap<Address, FrozenState> = BTreeMap::new();
    for change in changes {
        match change {
            FreezeChange::Address { account, frozen } => {
                state.entry(account).or_default().address_frozen = frozen;
            }
            FreezeChange::Freeze { account, amount } => {
                let s = state.entry(account).or_default();
                s.amount = s.amount.saturating_add(amount);
            }
            FreezeChange::Unfreeze { account, amount } => {
                let s = state.entry(account).or_default();
                s.amount = s.amount.saturating_sub(amount);
            }
            FreezeChange::Recovery { lost, replacement } => {
                // Taken off `lost` first: a recovery onto itself leaves it as it was.
                let moved = state.remove(&lost).unwrap_or_default();
                let s = state.entry(replacement).or_default();
                s.amount = s.amount.saturating_add(moved.amount);
                s.address_frozen |= moved.address_frozen;
            }
        }
    }
    state.retain(|_, s| !s.is_clear());
    state
}

/// A holder and its balance of a token, in base units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HolderBalance {
    /// The holder.
    pub holder: Address,
    /// Its balance in the token's base units (positive).
    pub balance: U256,
}

impl HolderBalance {
    /// The keyset position of this row in a holders ranking.
    pub fn key(&self) -> HolderKey {
        HolderKey {
            balance: self.balance,
            holder: self.holder,
        }
    }
}

/// A position in a holders ranking, ordered by balance descending, then holder
/// ascending: a page after a key starts with the next holder in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HolderKey {
    /// Balance of the last holder of the previous page, base units.
    pub balance: U256,
    /// That holder.
    pub holder: Address,
}

/// The holders of `token` on `chain` as of block `at_block` — the sum of every indexed
/// `Transfer` at or below it, the **record-date snapshot** — ranked by balance
/// (descending, then address ascending), after `after` (exclusive; `None` for the
/// first page), at most `limit` rows. Positive balances only; never the zero address.
///
/// Exact for any `at_block` at or below the indexed tip ([`indexed_tip`]; read both in
/// one `REPEATABLE READ` transaction): the index holds only transfers of blocks it
/// verified as canonical, a reorg deletes those above the common ancestor in the same
/// transaction that rewinds the checkpoint, and the balances it ranks by
/// (`index_holder_balance`, kept by triggers on `index_transfer`) move with them. A
/// block above the tip counts every indexed transfer (the caller refuses it). The cost
/// grows with the transfers above `at_block` (their holders are recomputed), not with
/// the token's history: at the tip a page is one index range scan.
///
/// # Errors
/// [`IndexError::Store`] (a stored value out of range is `StoreError::Decode`).
pub async fn holders_at(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    at_block: u64,
    after: Option<HolderKey>,
    limit: u32,
) -> Result<Vec<HolderBalance>> {
    let (balance, holder) = match after {
        Some(k) => (k.balance.to_string(), k.holder.to_vec()),
        None => (ledger::ABOVE_ANY_BALANCE.to_owned(), Vec::new()),
    };
    let rows = ledger::holders_at(
        db,
        chain_i64(chain),
        token.as_slice(),
        to_i64(at_block),
        &balance,
        &holder,
        i64::from(limit),
    )
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(HolderBalance {
                holder: address(&r.holder)?,
                balance: U256::from_str_radix(&r.balance, 10).map_err(|_| decode_err())?,
            })
        })
        .collect()
}

/// A `Transfer` of a token as the transfer pages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferEntry {
    /// Position of the event (block number, log index, block hash, tx hash).
    pub position: EventPosition,
    /// Sender (zero for a mint).
    pub from: Address,
    /// Receiver (zero for a burn).
    pub to: Address,
    /// Amount in the token's base units.
    pub value: U256,
    /// The block's timestamp (UTC), `None` when the node did not report it (rows
    /// written before migration `0025`, or backfilled from a node whose logs lack
    /// `blockTimestamp`).
    pub block_time: Option<DateTime<Utc>>,
}

/// Transfers of `token` on `chain` — of `holder` as sender or receiver when given —
/// newest first by `(block number, log index)`, strictly before `before` (`None` for
/// the first page), at most `limit` rows.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn transfer_page(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    holder: Option<Address>,
    before: Option<(u64, u64)>,
    limit: u32,
) -> Result<Vec<TransferEntry>> {
    let (block, log) = before.map_or((i64::MAX, i64::MAX), |(b, l)| (to_i64(b), to_i64(l)));
    let rows = ledger::transfers_page(
        db,
        chain_i64(chain),
        token.as_slice(),
        holder.as_ref().map(|h| h.as_slice()),
        block,
        log,
        i64::from(limit),
    )
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(TransferEntry {
                position: EventPosition {
                    block_number: u64_of(r.block_number)?,
                    log_index: u64_of(r.log_index)?,
                    block_hash: b256(&r.block_hash)?,
                    tx_hash: b256(&r.tx_hash)?,
                },
                from: address(&r.from_address)?,
                to: address(&r.to_address)?,
                value: U256::from_str_radix(&r.value, 10).map_err(|_| decode_err())?,
                block_time: r.block_time,
            })
        })
        .collect()
}

/// The chain's finalized block as the tip ingest last recorded it (the node's
/// `finalized` tag, else head − finality depth; never lowered), `None` before the
/// first record. A block at or below it cannot be reorged.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn finalized_block(db: impl PgExecutor<'_>, chain: ChainId) -> Result<Option<u64>> {
    chain_row::chain_finalized(db, chain_i64(chain))
        .await?
        .map(u64_of)
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::address;

    const A: Address = address!("0x000000000000000000000000000000000000000a");
    const B: Address = address!("0x000000000000000000000000000000000000000b");
    const C: Address = address!("0x000000000000000000000000000000000000000c");

    fn st(amount: u64, address_frozen: bool) -> FrozenState {
        FrozenState {
            amount: U256::from(amount),
            address_frozen,
        }
    }

    fn freeze(account: Address, amount: u64) -> FreezeChange {
        FreezeChange::Freeze {
            account,
            amount: U256::from(amount),
        }
    }

    fn unfreeze(account: Address, amount: u64) -> FreezeChange {
        FreezeChange::Unfreeze {
            account,
            amount: U256::from(amount),
        }
    }

    fn set(account: Address, frozen: bool) -> FreezeChange {
        FreezeChange::Address { account, frozen }
    }

    fn recover(lost: Address, replacement: Address) -> FreezeChange {
        FreezeChange::Recovery { lost, replacement }
    }

    #[test]
    fn no_events_no_state() {
        assert!(fold_frozen([]).is_empty());
    }

    #[test]
    fn an_address_freeze_and_unfreeze() {
        assert_eq!(
            fold_frozen([set(A, true)]),
            BTreeMap::from([(A, st(0, true))])
        );
        // Unfrozen with nothing frozen: the entry is gone.
        assert!(fold_frozen([set(A, true), set(A, false)]).is_empty());
        // Unfreezing the address keeps a frozen amount.
        assert_eq!(
            fold_frozen([set(A, true), freeze(A, 5), set(A, false)]),
            BTreeMap::from([(A, st(5, false))])
        );
        // An unfreeze of an address never frozen leaves nothing.
        assert!(fold_frozen([set(B, false)]).is_empty());
    }

    #[test]
    fn partial_freezes_and_unfreezes_add_up() {
        assert_eq!(
            fold_frozen([freeze(A, 100), freeze(A, 20), unfreeze(A, 30), freeze(B, 1)]),
            BTreeMap::from([(A, st(90, false)), (B, st(1, false))])
        );
    }

    #[test]
    fn an_unfreeze_to_zero_drops_the_entry() {
        assert_eq!(
            fold_frozen([
                freeze(A, 100),
                freeze(B, 7),
                unfreeze(A, 60),
                unfreeze(A, 40)
            ]),
            BTreeMap::from([(B, st(7, false))])
        );
        // Still kept while the address is frozen.
        assert_eq!(
            fold_frozen([set(A, true), freeze(A, 10), unfreeze(A, 10)]),
            BTreeMap::from([(A, st(0, true))])
        );
    }

    #[test]
    fn a_recovery_moves_the_frozen_state_onto_the_replacement() {
        // A: frozen address with 40 frozen tokens; C already had 15 frozen, address free.
        let folded = fold_frozen([
            set(A, true),
            freeze(A, 50),
            unfreeze(A, 10),
            freeze(C, 15),
            recover(A, C),
        ]);
        assert_eq!(folded, BTreeMap::from([(C, st(55, true))]));
        // The lost wallet starts clean afterwards.
        assert_eq!(
            fold_frozen([set(A, true), freeze(A, 5), recover(A, C), freeze(A, 2)]),
            BTreeMap::from([(A, st(2, false)), (C, st(5, true))])
        );
    }

    #[test]
    fn a_recovery_never_unfreezes_a_frozen_replacement() {
        assert_eq!(
            fold_frozen([freeze(A, 3), set(C, true), recover(A, C)]),
            BTreeMap::from([(C, st(3, true))])
        );
    }

    #[test]
    fn a_recovery_of_a_clean_wallet_changes_nothing() {
        let before = [set(B, true), freeze(C, 9)];
        let after = [set(B, true), freeze(C, 9), recover(A, C), recover(A, B)];
        assert_eq!(fold_frozen(after), fold_frozen(before));
        assert_eq!(
            fold_frozen(before),
            BTreeMap::from([(B, st(0, true)), (C, st(9, false))])
        );
        // A clean wallet recovered onto a clean wallet leaves no entry.
        assert!(fold_frozen([recover(A, C)]).is_empty());
    }

    #[test]
    fn a_recovery_onto_itself_keeps_the_state() {
        assert_eq!(
            fold_frozen([set(A, true), freeze(A, 8), recover(A, A)]),
            BTreeMap::from([(A, st(8, true))])
        );
    }

    #[test]
    fn an_unfreeze_above_the_folded_amount_clamps_at_zero() {
        // More than frozen (events missing): zero, no panic; the entry is dropped.
        assert!(fold_frozen([freeze(A, 5), unfreeze(A, 6)]).is_empty());
        assert!(fold_frozen([unfreeze(A, 1)]).is_empty());
        // And a later freeze counts from zero.
        assert_eq!(
            fold_frozen([freeze(A, 5), unfreeze(A, 600), freeze(A, 4)]),
            BTreeMap::from([(A, st(4, false))])
        );
        // Freezes saturate too.
        assert_eq!(
            fold_frozen([
                FreezeChange::Freeze {
                    account: A,
                    amount: U256::MAX
                },
                freeze(A, 1)
            ]),
            BTreeMap::from([(
                A,
                FrozenState {
                    amount: U256::MAX,
                    address_frozen: false
                }
            )])
        );
    }

    #[test]
    fn stored_rows_decode_and_bad_ones_are_refused() {
        let row = |kind: &str, replacement: Option<Vec<u8>>, amount: Option<&str>, frozen| {
            projection::FreezeEventRecord {
                kind: kind.to_owned(),
                account: A.to_vec(),
                replacement,
                amount: amount.map(str::to_owned),
                frozen,
            }
        };
        assert_eq!(
            freeze_change(&row("address", None, None, Some(true))).ok(),
            Some(set(A, true))
        );
        assert_eq!(
            freeze_change(&row("freeze", None, Some("12"), None)).ok(),
            Some(freeze(A, 12))
        );
        assert_eq!(
            freeze_change(&row("unfreeze", None, Some("3"), None)).ok(),
            Some(unfreeze(A, 3))
        );
        assert_eq!(
            freeze_change(&row("recovery", Some(B.to_vec()), None, None)).ok(),
            Some(recover(A, B))
        );
        for bad in [
            row("address", None, None, None),
            row("freeze", None, None, None),
            row("freeze", None, Some("-1"), None),
            row("recovery", None, None, None),
            row("recovery", Some(vec![1, 2]), None, None),
            row("burn", None, Some("1"), None),
        ] {
            assert!(freeze_change(&bad).is_err(), "{bad:?}");
        }
    }
}
