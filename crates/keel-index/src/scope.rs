//! The indexing scope (`index_scope`): which contracts of which chain are watched.

use crate::Result;
use crate::store::{chain as chain_row, range, scope as scope_rows};
use alloy::primitives::Address;
use keel_store::PgPool;
use keel_units::ChainId;
use sqlx::PgExecutor;

/// What kind of Keel contract a scoped address is; decides which events are projected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScopeKind {
    /// `AssetFactory`: `AssetCreated` → `index_asset`, and the token joins the scope.
    AssetFactory,
    /// `AssetToken`: `Transfer` → `index_transfer` (balances computed on read),
    /// `Paused`/`Unpaused` → `index_token_pause`; a RegulatedToken's (also this kind)
    /// `AddressFrozenSet`/`TokensFrozen`/`TokensUnfrozen`/`RecoverySuccess` →
    /// `index_freeze_event` (frozen state folded on read).
    AssetToken,
    /// `PriceFeedFactory`: `FeedCreated` adds the feed to the scope.
    PriceFeedFactory,
    /// `PriceFeed`: `AnswerUpdated` → `index_observation`.
    PriceFeed,
    /// `PriceResolver`: `StalenessBoundSet`/`StalenessBoundCleared` → `index_staleness_bound`.
    PriceResolver,
    /// `Directory`: `EntryChanged`/`EntryRemoved` → `index_directory_entry`.
    Directory,
}

impl ScopeKind {
    /// The stored text (`index_scope.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AssetFactory => "asset_factory",
            Self::AssetToken => "asset_token",
            Self::PriceFeedFactory => "price_feed_factory",
            Self::PriceFeed => "price_feed",
            Self::PriceResolver => "price_resolver",
            Self::Directory => "directory",
        }
    }

    /// Parses the stored text; `None` for an unknown kind.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "asset_factory" => Self::AssetFactory,
            "asset_token" => Self::AssetToken,
            "price_feed_factory" => Self::PriceFeedFactory,
            "price_feed" => Self::PriceFeed,
            "price_resolver" => Self::PriceResolver,
            "directory" => Self::Directory,
            _ => return None,
        })
    }
}

/// One live scope entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeEntry {
    /// The contract.
    pub address: Address,
    /// What it is.
    pub kind: ScopeKind,
    /// Owning organization, if any.
    pub organization: Option<String>,
    /// First block whose events matter.
    pub from_block: u64,
}

/// Adds `entry` to the scope of `chain` (idempotent: an address already live is left
/// as it is) and schedules its history: when ingest has already passed `from_block`
/// (history planned or tip committed above it), an address-only `index_range` from
/// `from_block` to the higher of the planned history end and the indexed tip is
/// inserted for the history workers. The tip ingest notices the scope change at its
/// next commit (it re-reads the scope under the chain-row lock taken here in shared
/// mode), so no block is left between the range and the tip. Returns true when a row
/// was inserted.
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn add_scope(db: &PgPool, chain: ChainId, entry: &ScopeEntry) -> Result<bool> {
    let c = chain_i64(chain);
    let mut tx = db.begin().await?;
    let tip = chain_row::chain_tip_for_share(&mut *tx, c).await?;
    let inserted = scope_rows::scope_insert(
        &mut *tx,
        c,
        entry.address.as_slice(),
        entry.kind.as_str(),
        entry.organization.as_deref(),
        to_i64(entry.from_block),
    )
    .await?;
    if inserted {
        let planned = range::range_planned_end(&mut *tx, c).await?;
        if let Some(end) = tip.max(planned)
            && end >= to_i64(entry.from_block)
        {
            range::range_insert_address(
                &mut *tx,
                c,
                entry.address.as_slice(),
                to_i64(entry.from_block),
                end,
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(inserted)
}

/// Stops watching `address` on `chain`: stamps `removed_at` (the row is kept as a
/// record). Returns true when a live row was stamped.
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn remove_scope(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    address: Address,
) -> Result<bool> {
    scope_rows::scope_remove(db, chain_i64(chain), address.as_slice()).await
}

/// Makes the live entry of `address` a configured one (clears its
/// `discovered_at_block`), so neither a rollback nor a re-index of the block that
/// announced it drops it, even once its announcer has left the scope (an organization
/// system's token after the system was replaced). Returns true when a row changed.
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn pin_scope(db: impl PgExecutor<'_>, chain: ChainId, address: Address) -> Result<bool> {
    scope_rows::scope_pin(db, chain_i64(chain), address.as_slice()).await
}

/// The live scope of `chain`, ordered by address. Rows of unknown kind are skipped.
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn live_scope(db: impl PgExecutor<'_>, chain: ChainId) -> Result<Vec<ScopeEntry>> {
    let rows = scope_rows::scope_live(db, chain_i64(chain)).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let (Some(kind), Ok(address)) = (
            ScopeKind::parse(&row.kind),
            Address::try_from(&row.address[..]),
        ) else {
            continue;
        };
        out.push(ScopeEntry {
            address,
            kind,
            organization: row.organization,
            from_block: u64::try_from(row.from_block).unwrap_or(0),
        });
    }
    Ok(out)
}

/// A chain id as PostgreSQL BIGINT (ids above `i64::MAX` saturate; no real chain has one).
pub(crate) fn chain_i64(chain: ChainId) -> i64 {
    to_i64(chain.get())
}

/// A block number as BIGINT (saturating).
pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
