//! Statements on no table: the database clock, read-only snapshots, liveness.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::*;

/// The database clock (`now()`), the clock the engine's deadlines use.
///
/// # Errors
/// [`StoreError`].
pub async fn database_now(db: impl PgExecutor<'_>) -> StoreResult<DateTime<Utc>> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(db).await?)
}

/// Makes the caller's (just begun) transaction a read-only snapshot (`REPEATABLE READ
/// READ ONLY`): every read in it sees the same committed state, so an asset's index
/// fields all reflect one indexed block.
///
/// # Errors
/// [`StoreError`].
pub async fn transaction_snapshot(db: impl PgExecutor<'_>) -> StoreResult<()> {
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(db)
        .await?;
    Ok(())
}

/// `SELECT 1`: whether the database answers.
///
/// # Errors
/// [`StoreError`].
pub async fn database_ping(db: impl PgExecutor<'_>) -> StoreResult<()> {
    sqlx::query("SELECT 1").execute(db).await?;
    Ok(())
}
