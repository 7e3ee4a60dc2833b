//! `index_scope`: the contracts watched per chain; a removal stamps `removed_at`,
//! contracts discovered by ingest carry the block that announced them
//! (`discovered_at_block`, rolled back with it).

use crate::Result;
use sqlx::PgExecutor;

/// One live scope row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ScopeRow {
    pub address: Vec<u8>,
    pub kind: String,
    pub organization: Option<String>,
    pub from_block: i64,
}

/// Adds an operator's entry unless the address is live already. Returns true when a
/// row was inserted.
pub(crate) async fn scope_insert(
    db: impl PgExecutor<'_>,
    chain: i64,
    address: &[u8],
    kind: &str,
    organization: Option<&str>,
    from_block: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO index_scope (chain_id, address, kind, organization, from_block)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (chain_id, address) WHERE removed_at IS NULL DO NOTHING",
    )
    .bind(chain)
    .bind(address)
    .bind(kind)
    .bind(organization)
    .bind(from_block)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Adds a contract announced at `block` (from then on, discovered there) unless the
/// address is live already.
pub(crate) async fn scope_insert_discovered(
    db: impl PgExecutor<'_>,
    chain: i64,
    address: &[u8],
    kind: &str,
    block: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO index_scope (chain_id, address, kind, from_block, discovered_at_block)
         VALUES ($1, $2, $3, $4, $4)
         ON CONFLICT (chain_id, address) WHERE removed_at IS NULL DO NOTHING",
    )
    .bind(chain)
    .bind(address)
    .bind(kind)
    .bind(block)
    .execute(db)
    .await?;
    Ok(())
}

/// Stamps `removed_at` on the live row of `address`. Returns true when one was stamped.
pub(crate) async fn scope_remove(
    db: impl PgExecutor<'_>,
    chain: i64,
    address: &[u8],
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE index_scope SET removed_at = now()
         WHERE chain_id = $1 AND address = $2 AND removed_at IS NULL",
    )
    .bind(chain)
    .bind(address)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Clears `discovered_at_block` of the live row of `address`. True when one changed.
pub(crate) async fn scope_pin(db: impl PgExecutor<'_>, chain: i64, address: &[u8]) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE index_scope SET discovered_at_block = NULL
         WHERE chain_id = $1 AND address = $2 AND removed_at IS NULL
           AND discovered_at_block IS NOT NULL",
    )
    .bind(chain)
    .bind(address)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The live rows, ordered by address.
pub(crate) async fn scope_live(db: impl PgExecutor<'_>, chain: i64) -> Result<Vec<ScopeRow>> {
    Ok(sqlx::query_as(
        "SELECT address, kind, organization, from_block FROM index_scope
         WHERE chain_id = $1 AND removed_at IS NULL ORDER BY address",
    )
    .bind(chain)
    .fetch_all(db)
    .await?)
}

/// The number of live rows.
pub(crate) async fn scope_live_count(db: impl PgExecutor<'_>, chain: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM index_scope WHERE chain_id = $1 AND removed_at IS NULL",
    )
    .bind(chain)
    .fetch_one(db)
    .await?)
}

/// Deletes the rows discovered above `block` (a rollback).
pub(crate) async fn scopes_delete_discovered_above(
    db: impl PgExecutor<'_>,
    chain: i64,
    block: i64,
) -> Result<()> {
    sqlx::query("DELETE FROM index_scope WHERE chain_id = $1 AND discovered_at_block > $2")
        .bind(chain)
        .bind(block)
        .execute(db)
        .await?;
    Ok(())
}

/// The lowest `from_block` of the live scope entries an operator added (not
/// discovered); `None` when there is none.
pub(crate) async fn scope_configured_start(
    db: impl PgExecutor<'_>,
    chain: i64,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT min(from_block) FROM index_scope
          WHERE chain_id = $1 AND removed_at IS NULL AND discovered_at_block IS NULL",
    )
    .bind(chain)
    .fetch_one(db)
    .await?)
}
