//! The indexing scope (`index_scope`): which contracts of which chain are watched.

use crate::Result;
use alloy::primitives::Address;
use keel_store::PgPool;
use keel_units::ChainId;
use sqlx::{PgExecutor, Row};

/// What kind of Keel contract a scoped address is; decides which events are projected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScopeKind {
    /// `AssetFactory`: `AssetCreated` → `index_asset`, and the token joins the scope.
    AssetFactory,
    /// `AssetToken`: `Transfer` → `index_transfer` (balances computed on read),
    /// `Paused`/`Unpaused` → `index_token_pause`.
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
    let tip: Option<i64> =
        sqlx::query_scalar("SELECT tip_number FROM index_chain WHERE chain_id = $1 FOR SHARE")
            .bind(c)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
    let done = sqlx::query(
        "INSERT INTO index_scope (chain_id, address, kind, organization, from_block)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (chain_id, address) WHERE removed_at IS NULL DO NOTHING",
    )
    .bind(c)
    .bind(entry.address.as_slice())
    .bind(entry.kind.as_str())
    .bind(entry.organization.as_deref())
    .bind(to_i64(entry.from_block))
    .execute(&mut *tx)
    .await?;
    let inserted = done.rows_affected() == 1;
    if inserted {
        let planned: Option<i64> = sqlx::query_scalar(
            "SELECT max(to_block) FROM index_range WHERE chain_id = $1 AND address IS NULL",
        )
        .bind(c)
        .fetch_one(&mut *tx)
        .await?;
        if let Some(end) = tip.max(planned)
            && end >= to_i64(entry.from_block)
        {
            sqlx::query(
                "INSERT INTO index_range (chain_id, address, from_block, to_block)
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(c)
            .bind(entry.address.as_slice())
            .bind(to_i64(entry.from_block))
            .bind(end)
            .execute(&mut *tx)
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
    let done = sqlx::query(
        "UPDATE index_scope SET removed_at = now()
         WHERE chain_id = $1 AND address = $2 AND removed_at IS NULL",
    )
    .bind(chain_i64(chain))
    .bind(address.as_slice())
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The live scope of `chain`, ordered by address. Rows of unknown kind are skipped.
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn live_scope(db: impl PgExecutor<'_>, chain: ChainId) -> Result<Vec<ScopeEntry>> {
    let rows = sqlx::query(
        "SELECT address, kind, organization, from_block FROM index_scope
         WHERE chain_id = $1 AND removed_at IS NULL ORDER BY address",
    )
    .bind(chain_i64(chain))
    .fetch_all(db)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let address: Vec<u8> = row.try_get("address")?;
        let kind: String = row.try_get("kind")?;
        let from_block: i64 = row.try_get("from_block")?;
        let (Some(kind), Ok(address)) = (ScopeKind::parse(&kind), Address::try_from(&address[..]))
        else {
            continue;
        };
        out.push(ScopeEntry {
            address,
            kind,
            organization: row.try_get("organization")?,
            from_block: u64::try_from(from_block).unwrap_or(0),
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
