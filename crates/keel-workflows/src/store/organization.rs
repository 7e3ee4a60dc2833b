//! `organization` (migration `0007`): tenants by id and unique name.

use sqlx::PgExecutor;
use uuid::Uuid;

use super::*;

/// Inserts organization `id` named `name` (unique: a duplicate is
/// [`StoreError::UniqueViolation`]).
///
/// # Errors
/// [`StoreError`].
pub async fn organization_insert(db: impl PgExecutor<'_>, id: Uuid, name: &str) -> StoreResult<()> {
    sqlx::query("INSERT INTO organization (id, name) VALUES ($1, $2)")
        .bind(id)
        .bind(name)
        .execute(db)
        .await?;
    Ok(())
}

/// The id of the organization named `name`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn organization_id_by_name(
    db: impl PgExecutor<'_>,
    name: &str,
) -> StoreResult<Option<Uuid>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM organization WHERE name = $1")
            .bind(name)
            .fetch_optional(db)
            .await?,
    )
}
