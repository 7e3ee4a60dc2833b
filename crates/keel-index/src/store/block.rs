//! `index_block`: the hash window of a chain (block number → hash, parent hash), used to
//! find reorgs' common ancestors and to check history rows against canonical blocks.
//! It is contiguous from the tip down to the lower of `hash_window` blocks below the tip
//! and the block Keel recorded as finalized (`index_chain.finalized_number`): every
//! block above what Keel recorded as final is kept, and the final block itself, so a
//! fork anywhere above it is found exactly and a fork at or below it is proven.

use crate::Result;
use sqlx::PgExecutor;

/// One stored block.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct BlockRow {
    pub number: i64,
    pub hash: Vec<u8>,
}

/// Stores block `number` (`hash`, `parent_hash`; replacing a stored block of that
/// number) and deletes the blocks at or below `prune_at_or_below` (the hash window's
/// lower end) that are also below the chain's finalized block — the higher of the
/// recorded `finalized_number` and `finalized` (this commit's reading); with neither
/// known, the window alone decides — in one statement. `prune_at_or_below` must be
/// below `number`.
pub(crate) async fn block_upsert_and_prune(
    db: impl PgExecutor<'_>,
    chain: i64,
    number: i64,
    hash: &[u8],
    parent_hash: &[u8],
    prune_at_or_below: i64,
    finalized: Option<i64>,
) -> Result<()> {
    sqlx::query(
        "WITH pruned AS (
           DELETE FROM index_block WHERE chain_id = $1 AND number <= $5
              AND number < coalesce(
                    greatest((SELECT finalized_number FROM index_chain WHERE chain_id = $1),
                             $6::bigint),
                    $5 + 1))
         INSERT INTO index_block (chain_id, number, hash, parent_hash) VALUES ($1, $2, $3, $4)
         ON CONFLICT (chain_id, number) DO UPDATE
           SET hash = EXCLUDED.hash, parent_hash = EXCLUDED.parent_hash",
    )
    .bind(chain)
    .bind(number)
    .bind(hash)
    .bind(parent_hash)
    .bind(prune_at_or_below)
    .bind(finalized)
    .execute(db)
    .await?;
    Ok(())
}

/// Deletes the blocks above `number` (a rollback).
pub(crate) async fn blocks_delete_above(
    db: impl PgExecutor<'_>,
    chain: i64,
    number: i64,
) -> Result<()> {
    sqlx::query("DELETE FROM index_block WHERE chain_id = $1 AND number > $2")
        .bind(chain)
        .bind(number)
        .execute(db)
        .await?;
    Ok(())
}

/// The stored blocks at or below `number`, highest first.
pub(crate) async fn blocks_at_or_below(
    db: impl PgExecutor<'_>,
    chain: i64,
    number: i64,
) -> Result<Vec<BlockRow>> {
    Ok(sqlx::query_as(
        "SELECT number, hash FROM index_block WHERE chain_id = $1 AND number <= $2
         ORDER BY number DESC",
    )
    .bind(chain)
    .bind(number)
    .fetch_all(db)
    .await?)
}

/// The lowest stored block number; `None` when the window is empty.
pub(crate) async fn block_oldest(db: impl PgExecutor<'_>, chain: i64) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT min(number) FROM index_block WHERE chain_id = $1")
            .bind(chain)
            .fetch_one(db)
            .await?,
    )
}

/// The stored blocks numbered `from..=to`.
pub(crate) async fn blocks_between(
    db: impl PgExecutor<'_>,
    chain: i64,
    from: i64,
    to: i64,
) -> Result<Vec<BlockRow>> {
    Ok(sqlx::query_as(
        "SELECT number, hash FROM index_block WHERE chain_id = $1 AND number BETWEEN $2 AND $3",
    )
    .bind(chain)
    .bind(from)
    .bind(to)
    .fetch_all(db)
    .await?)
}

/// Deletes every stored block of the chain (a re-index starts a new hash window).
pub(crate) async fn blocks_delete_all(db: impl PgExecutor<'_>, chain: i64) -> Result<()> {
    sqlx::query("DELETE FROM index_block WHERE chain_id = $1")
        .bind(chain)
        .execute(db)
        .await?;
    Ok(())
}
