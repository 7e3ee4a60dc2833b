//! Record-date snapshots as objects (issue 36 §2, migration `0088`): the holders of one
//! token at one block, created once per `(chain, token, block)`, **pending** until that
//! block is final on its chain, then **sealed** once — copied into their own rows with
//! a holder count, a total and a content hash — and immutable from then on.
//!
//! - [`create`] records a pending snapshot (or answers the existing one of the same
//!   block) and seals it at once when it is already due.
//! - [`seal`] seals one snapshot when it is due: its block is at or below the chain's
//!   recorded finalized block ([`crate::read::finalized_block`]) and the indexed tip,
//!   no history range starting at or below it is still open, and the chain is neither
//!   degraded nor being re-indexed. The rows are computed in one statement (each
//!   holder's kept balance minus its balance changes above the block,
//!   `index_holder_change`), and the chain row's owner epoch is read before and after:
//!   a re-index (or an ownership takeover) meanwhile takes a new epoch and the seal is
//!   rolled back to be tried again later, so a final snapshot is never read from a
//!   half-rebuilt index. [`seal_due`] seals every due snapshot of a chain.
//! - [`holders`] pages a snapshot ranked by balance (descending, then holder
//!   ascending): a final one from its own rows (one index range scan from the cursor,
//!   whatever the token's history), a pending one computed from the index at its
//!   block ([`crate::read::holders_at`]; it may still change with a reorg).
//! - [`rows_by_holder`] pages a final snapshot in its canonical order (holder
//!   ascending) for an export; [`CSV_HEADER`] and [`csv_line`] are its CSV.
//!
//! ## Content hash
//! `content_hash` is the SHA-256 (FIPS 180-4) of the snapshot's CSV export, byte for
//! byte: the line [`CSV_HEADER`], then one [`csv_line`] per holder in ascending byte
//! order of the address — the EIP-55 checksummed address, a comma, the balance in the
//! token's base units as a decimal integer, and `\n`. An auditor recomputes it with
//! `sha256sum` over the downloaded export, or from `balanceOf(holder)` at the block of
//! every holder the chain's `Transfer` logs name.

use crate::read::{self, HolderBalance, HolderKey};
use crate::scope::{chain_i64, to_i64};
use crate::store::{ledger, snapshot as rows};
use crate::{IndexError, Result};
use alloy::primitives::{Address, B256, U256};
use keel_store::{PgPool, StoreError};
use keel_units::ChainId;
use sha2::{Digest, Sha256};
use sqlx::PgExecutor;
use sqlx::types::chrono::{DateTime, Utc};
use uuid::Uuid;

/// The first line of a snapshot's CSV export (with its `\n`).
pub const CSV_HEADER: &str = "holder,balance\n";

/// Rows read per statement while a seal hashes a snapshot.
const SEAL_PAGE: i64 = 5_000;

/// Whether a snapshot can still change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    /// Its block is not final yet (or the index has not caught up to it): reads compute
    /// it from the index and a reorg may still change it.
    Pending,
    /// Sealed: its rows, count, total and hash never change again.
    Final,
}

/// What a sealed snapshot records about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// Holders with a positive balance (the zero address never counts).
    pub holder_count: u64,
    /// Sum of their balances, base units (the supply at the block, less nothing: the
    /// zero address holds none).
    pub total: U256,
    /// SHA-256 of the CSV export (see the module docs).
    pub content_hash: B256,
    /// When it was sealed.
    pub finalized_at: DateTime<Utc>,
}

/// A record-date snapshot of one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Its id.
    pub id: Uuid,
    /// The token's chain.
    pub chain: ChainId,
    /// The token.
    pub token: Address,
    /// The record date: balances count every canonical transfer at or below this block.
    pub block: u64,
    /// Pending or final.
    pub state: SnapshotState,
    /// Count, total and hash; `Some` exactly when `state` is [`SnapshotState::Final`].
    pub sealed: Option<Sealed>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

fn decode_err() -> IndexError {
    IndexError::Store(StoreError::Decode)
}

fn u256(v: &str) -> Result<U256> {
    U256::from_str_radix(v, 10).map_err(|_| decode_err())
}

/// A stored snapshot row as a [`HolderBalance`].
fn holder_balance(r: &rows::SnapshotHolderRecord) -> Result<HolderBalance> {
    Ok(HolderBalance {
        holder: Address::try_from(r.holder.as_slice()).map_err(|_| decode_err())?,
        balance: u256(&r.balance)?,
    })
}

fn typed(r: rows::SnapshotRecord) -> Result<Snapshot> {
    let state = match r.state.as_str() {
        "pending" => SnapshotState::Pending,
        "final" => SnapshotState::Final,
        _ => return Err(decode_err()),
    };
    let sealed = match (
        state,
        r.holder_count,
        r.total,
        r.content_hash,
        r.finalized_at,
    ) {
        (SnapshotState::Final, Some(count), Some(total), Some(hash), Some(at)) => Some(Sealed {
            holder_count: u64::try_from(count).map_err(|_| decode_err())?,
            total: u256(&total)?,
            content_hash: B256::try_from(hash.as_slice()).map_err(|_| decode_err())?,
            finalized_at: at,
        }),
        (SnapshotState::Pending, ..) => None,
        _ => return Err(decode_err()),
    };
    Ok(Snapshot {
        id: r.id,
        chain: ChainId(u64::try_from(r.chain_id).map_err(|_| decode_err())?),
        token: Address::try_from(r.token.as_slice()).map_err(|_| decode_err())?,
        block: u64::try_from(r.at_block).map_err(|_| decode_err())?,
        state,
        sealed,
        created_at: r.created_at,
    })
}

/// One CSV line of a snapshot row: the EIP-55 checksummed holder, a comma, the balance
/// in base units (decimal integer), `\n`.
pub fn csv_line(h: &HolderBalance) -> String {
    format!("{},{}\n", h.holder.to_checksum(None), h.balance)
}

/// Records a pending snapshot of `token` on `chain` at block `at_block` — or answers the
/// one that exists for that block — then seals it if it is due ([`seal`]). Returns it
/// and whether this call created it.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn create(
    db: &PgPool,
    chain: ChainId,
    token: Address,
    at_block: u64,
) -> Result<(Snapshot, bool)> {
    let mut conn = db.acquire().await.map_err(StoreError::from)?;
    let (row, created) = rows::snapshot_insert(
        &mut conn,
        Uuid::new_v4(),
        chain_i64(chain),
        token.as_slice(),
        to_i64(at_block),
    )
    .await?;
    drop(conn);
    let s = typed(row)?;
    if s.state == SnapshotState::Final {
        return Ok((s, created));
    }
    let s = seal(db, s.id).await?.unwrap_or(s);
    Ok((s, created))
}

/// The snapshot `id`, as stored (call [`seal`] first to seal it if it became due).
///
/// # Errors
/// [`IndexError::Store`].
pub async fn get(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<Snapshot>> {
    rows::snapshot_get(db, id).await?.map(typed).transpose()
}

/// Snapshots of `token` on `chain`, newest record date first, strictly below block
/// `before` (`None`: from the newest), at most `limit`.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn list(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    before: Option<u64>,
    limit: u32,
) -> Result<Vec<Snapshot>> {
    let before = before.map_or(i64::MAX, to_i64);
    rows::snapshots_of(
        db,
        chain_i64(chain),
        token.as_slice(),
        before,
        i64::from(limit),
    )
    .await?
    .into_iter()
    .map(typed)
    .collect()
}

/// Why a snapshot is not sealed yet, as [`seal_blocker`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealBlocker {
    /// The chain has no indexed tip at or above the block.
    NotIndexed,
    /// The block is above the chain's recorded finalized block.
    NotFinal,
    /// History ranges at or below the block are still being indexed.
    HistoryOpen,
    /// The chain's index is degraded or being re-indexed.
    IndexUnhealthy,
}

async fn blocker(
    db: &mut sqlx::PgConnection,
    chain: i64,
    at: i64,
) -> Result<(Option<SealBlocker>, Option<i64>)> {
    let Some(view) = rows::chain_seal_view(&mut *db, chain).await? else {
        return Ok((Some(SealBlocker::NotIndexed), None));
    };
    let epoch = Some(view.owner_epoch);
    if view.degraded || view.rebuilding {
        return Ok((Some(SealBlocker::IndexUnhealthy), epoch));
    }
    if view.tip_number.is_none_or(|t| t < at) {
        return Ok((Some(SealBlocker::NotIndexed), epoch));
    }
    if view.finalized_number.is_none_or(|f| f < at) {
        return Ok((Some(SealBlocker::NotFinal), epoch));
    }
    if rows::ranges_open_at_or_below(&mut *db, chain, at).await? > 0 {
        return Ok((Some(SealBlocker::HistoryOpen), epoch));
    }
    Ok((None, epoch))
}

/// Why snapshot `s` cannot be sealed now; `None` when it is final or due.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn seal_blocker(db: &PgPool, s: &Snapshot) -> Result<Option<SealBlocker>> {
    if s.state == SnapshotState::Final {
        return Ok(None);
    }
    let mut conn = db.acquire().await.map_err(StoreError::from)?;
    Ok(blocker(&mut conn, chain_i64(s.chain), to_i64(s.block))
        .await?
        .0)
}

/// Seals snapshot `id` if it is pending and due (see the module docs) and answers it
/// as it is afterwards: final, or still pending when it is not due (or a re-index or
/// takeover of the chain's ingest raced the seal; the next call tries again). `None`
/// when there is no such snapshot. Idempotent; concurrent calls seal it once (the row
/// is locked for the seal).
///
/// # Errors
/// [`IndexError::Store`].
pub async fn seal(db: &PgPool, id: Uuid) -> Result<Option<Snapshot>> {
    let mut tx = db.begin().await.map_err(StoreError::from)?;
    let Some(row) = rows::snapshot_lock(&mut *tx, id).await? else {
        return Ok(None);
    };
    let s = typed(row)?;
    if s.state == SnapshotState::Final {
        return Ok(Some(s));
    }
    let (chain, at) = (chain_i64(s.chain), to_i64(s.block));
    let (why, epoch) = blocker(&mut tx, chain, at).await?;
    if why.is_some() {
        return Ok(Some(s));
    }
    rows::snapshot_holders_fill(&mut *tx, id, chain, s.token.as_slice(), at).await?;
    if rows::chain_seal_view(&mut *tx, chain)
        .await?
        .map(|v| v.owner_epoch)
        != epoch
    {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(Some(s));
    }
    let mut hash = Sha256::new();
    hash.update(CSV_HEADER.as_bytes());
    let (mut count, mut total) = (0i64, U256::ZERO);
    let mut after: Vec<u8> = Vec::new();
    loop {
        let page = rows::snapshot_holders_by_address(&mut *tx, id, &after, SEAL_PAGE).await?;
        for r in &page {
            let h = holder_balance(r)?;
            hash.update(csv_line(&h).as_bytes());
            count += 1;
            total = total.checked_add(h.balance).ok_or_else(decode_err)?;
        }
        match page.last() {
            Some(last) if page.len() == usize::try_from(SEAL_PAGE).unwrap_or(usize::MAX) => {
                after = last.holder.clone();
            }
            _ => break,
        }
    }
    let digest: [u8; 32] = hash.finalize().into();
    rows::snapshot_finalize(&mut *tx, id, count, &total.to_string(), &digest).await?;
    tx.commit().await.map_err(StoreError::from)?;
    metrics::counter!("keel_index_snapshots_sealed_total").increment(1);
    get(db, id).await
}

/// Seals every pending snapshot of `chain` whose block is at or below the recorded
/// finalized block and due; returns how many it sealed.
///
/// # Errors
/// [`IndexError::Store`].
pub async fn seal_due(db: &PgPool, chain: ChainId) -> Result<u64> {
    let Some(finalized) = read::finalized_block(db, chain).await? else {
        return Ok(0);
    };
    let ids = rows::snapshots_pending_at_or_below(db, chain_i64(chain), to_i64(finalized)).await?;
    let mut sealed = 0;
    for id in ids {
        if seal(db, id)
            .await?
            .is_some_and(|s| s.state == SnapshotState::Final)
        {
            sealed += 1;
        }
    }
    Ok(sealed)
}

/// A page of snapshot `s`'s holders ranked by balance (descending, then holder
/// ascending) after `after` (exclusive), at most `limit`: a final snapshot's own rows,
/// a pending one's computed from the index at its block (the caller checks that block
/// is indexed, and reads it with the indexed tip in one `REPEATABLE READ` transaction).
///
/// # Errors
/// [`IndexError::Store`].
pub async fn holders(
    db: impl PgExecutor<'_>,
    s: &Snapshot,
    after: Option<HolderKey>,
    limit: u32,
) -> Result<Vec<HolderBalance>> {
    if s.state == SnapshotState::Pending {
        return read::holders_at(db, s.chain, s.token, s.block, after, limit).await;
    }
    let (balance, holder) = match after {
        Some(k) => (k.balance.to_string(), k.holder.to_vec()),
        None => (ledger::ABOVE_ANY_BALANCE.to_owned(), Vec::new()),
    };
    rows::snapshot_holders_ranked(db, s.id, &balance, &holder, i64::from(limit))
        .await?
        .into_iter()
        .map(|r| holder_balance(&r))
        .collect()
}

/// A page of final snapshot `id`'s rows in canonical order (holder ascending), strictly
/// after `after` (`None`: from the first), at most `limit` (an export streams these
/// pages; a pending snapshot has no rows).
///
/// # Errors
/// [`IndexError::Store`].
pub async fn rows_by_holder(
    db: impl PgExecutor<'_>,
    id: Uuid,
    after: Option<Address>,
    limit: u32,
) -> Result<Vec<HolderBalance>> {
    let after = after.map(|a| a.to_vec()).unwrap_or_default();
    rows::snapshot_holders_by_address(db, id, &after, i64::from(limit))
        .await?
        .into_iter()
        .map(|r| holder_balance(&r))
        .collect()
}
