//! `aa_bundler_control` (`migrations/0080_aa_bundler_control.sql`): the
//! `debug_bundler_*` controls of a chain's bundling.

use sqlx::PgExecutor;

use super::StoreResult;

/// The bundler controls of a chain: `(manual, send_now)`; `(false, false)` without a row
/// (automatic bundling).
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundler_control_get(
    db: impl PgExecutor<'_>,
    chain_id: i64,
) -> StoreResult<(bool, bool)> {
    let row: Option<(bool, bool)> =
        sqlx::query_as("SELECT manual, send_now FROM aa_bundler_control WHERE chain_id = $1")
            .bind(chain_id)
            .fetch_optional(db)
            .await?;
    Ok(row.unwrap_or((false, false)))
}

/// Sets the chain's bundling mode (`manual` true: bundles only on request); clears a
/// pending send-now request.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundler_control_set_manual(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    manual: bool,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO aa_bundler_control (chain_id, manual, send_now) VALUES ($1, $2, false)
         ON CONFLICT (chain_id) DO UPDATE SET manual = $2, send_now = false, updated_at = now()",
    )
    .bind(chain_id)
    .bind(manual)
    .execute(db)
    .await?;
    Ok(())
}

/// Raises (`true`) or clears (`false`) the chain's send-now request.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn bundler_control_send_now(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    raise: bool,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO aa_bundler_control (chain_id, send_now) VALUES ($1, $2)
         ON CONFLICT (chain_id) DO UPDATE SET send_now = $2, updated_at = now()",
    )
    .bind(chain_id)
    .bind(raise)
    .execute(db)
    .await?;
    Ok(())
}
