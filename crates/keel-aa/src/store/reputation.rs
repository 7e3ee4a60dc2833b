//! `aa_reputation` (`migrations/0077_aa_reputation.sql`): ERC-7562 opsSeen /
//! opsIncluded per (chain, entity), decayed by floor(value * (23/24)^h) over the whole
//! hours h since `decayed_at`, on every read and write.

use keel_units::db::DbAddress;
use sqlx::PgExecutor;

use super::{StoreResult, unreadable};

/// One entity's decayed reputation counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct ReputationRow {
    /// `opsSeen` after decay.
    pub ops_seen: i64,
    /// `opsIncluded` after decay.
    pub ops_included: i64,
}

/// The decay expression of a column of `aa_reputation` (`r`), as of now.
macro_rules! decayed {
    ($col:literal) => {
        concat!(
            "floor(r.",
            $col,
            " * power(23.0 / 24.0, floor(extract(epoch FROM now() - r.decayed_at) / 3600)))::bigint"
        )
    };
}
/// The new `decayed_at` (advanced by the whole hours applied).
macro_rules! decayed_at {
    () => {
        "r.decayed_at + floor(extract(epoch FROM now() - r.decayed_at) / 3600) * interval '1 hour'"
    };
}

/// The decayed counters of `address` on `chain_id` (zeros when unknown).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_get<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address: &[u8],
) -> StoreResult<ReputationRow> {
    let row: Option<ReputationRow> = sqlx::query_as(concat!(
        "SELECT ",
        decayed!("ops_seen"),
        " AS ops_seen, ",
        decayed!("ops_included"),
        " AS ops_included FROM aa_reputation r WHERE r.chain_id = $1 AND r.address = $2"
    ))
    .bind(chain_id)
    .bind(address)
    .fetch_optional(db)
    .await
    .map_err(unreadable("aa_reputation"))?;
    Ok(row.unwrap_or(ReputationRow {
        ops_seen: 0,
        ops_included: 0,
    }))
}

/// Adds `seen` to `opsSeen` and `included` to `opsIncluded` of every address (after
/// decaying them).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_add<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    addresses: &[Vec<u8>],
    seen: i64,
    included: i64,
) -> StoreResult<()> {
    sqlx::query(concat!(
        "INSERT INTO aa_reputation AS r (chain_id, address, ops_seen, ops_included) ",
        "SELECT $1, a, $3, $4 FROM unnest($2::bytea[]) AS a ",
        "ON CONFLICT (chain_id, address) DO UPDATE SET ops_seen = ",
        decayed!("ops_seen"),
        " + $3, ops_included = ",
        decayed!("ops_included"),
        " + $4, decayed_at = ",
        decayed_at!(),
        ", updated_at = now()"
    ))
    .bind(chain_id)
    .bind(addresses)
    .bind(seen)
    .bind(included)
    .execute(db)
    .await?;
    Ok(())
}

/// Sets both counters of `address` (the ban penalty, an operator's `setReputation`);
/// the decay restarts now.
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_set<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address: &[u8],
    ops_seen: i64,
    ops_included: i64,
) -> StoreResult<()> {
    sqlx::query(concat!(
        "INSERT INTO aa_reputation (chain_id, address, ops_seen, ops_included) ",
        "VALUES ($1, $2, $3, $4) ON CONFLICT (chain_id, address) DO UPDATE SET ",
        "ops_seen = $3, ops_included = $4, decayed_at = now(), updated_at = now()"
    ))
    .bind(chain_id)
    .bind(address)
    .bind(ops_seen)
    .bind(ops_included)
    .execute(db)
    .await?;
    Ok(())
}

/// Moves `decayed_at` of `address` back by `hours` (tests of the decay).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_age<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    address: &[u8],
    hours: i32,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE aa_reputation SET decayed_at = decayed_at - make_interval(hours => $3) \
         WHERE chain_id = $1 AND address = $2",
    )
    .bind(chain_id)
    .bind(address)
    .bind(hours)
    .execute(db)
    .await?;
    Ok(())
}

/// One entity of [`reputation_list`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReputationEntry {
    /// The entity's address.
    pub address: DbAddress,
    /// `opsSeen` after decay.
    pub ops_seen: i64,
    /// `opsIncluded` after decay.
    pub ops_included: i64,
}

/// Every entity of `chain_id` with its decayed counters, by address (at most 10,000).
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_list<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
) -> StoreResult<Vec<ReputationEntry>> {
    sqlx::query_as(concat!(
        "SELECT r.address, ",
        decayed!("ops_seen"),
        " AS ops_seen, ",
        decayed!("ops_included"),
        " AS ops_included FROM aa_reputation r WHERE r.chain_id = $1 ORDER BY r.address LIMIT 10000"
    ))
    .bind(chain_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("aa_reputation"))
}

/// Deletes every reputation row of `chain_id`; the rows deleted.
///
/// # Errors
/// [`StoreError`].
pub async fn reputation_clear<'e>(db: impl PgExecutor<'e>, chain_id: i64) -> StoreResult<u64> {
    Ok(sqlx::query("DELETE FROM aa_reputation WHERE chain_id = $1")
        .bind(chain_id)
        .execute(db)
        .await?
        .rows_affected())
}
