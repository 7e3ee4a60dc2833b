//! `aa_sponsorship_spend` (`migrations/0045_aa_user_operations.sql`): what a
//! sponsorship policy granted per period.

use sqlx::PgExecutor;
use uuid::Uuid;

use super::StoreResult;

/// Wei the policy granted to `organization_id` on `chain_id` on UTC `day` (decimal
/// string; "0" without a row).
///
/// # Errors
/// [`StoreError`].
pub async fn sponsorship_spend_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    chain_id: i64,
    day: chrono::NaiveDate,
) -> StoreResult<String> {
    let v: Option<String> = sqlx::query_scalar(
        "SELECT granted_wei::text FROM aa_sponsorship_spend \
         WHERE organization_id = $1 AND chain_id = $2 AND day = $3",
    )
    .bind(organization_id)
    .bind(chain_id)
    .bind(day)
    .fetch_optional(db)
    .await?;
    Ok(v.unwrap_or_else(|| "0".to_owned()))
}

/// Adds `wei` (decimal) to the day's grant of `organization_id` on `chain_id`; the new
/// total (decimal).
///
/// # Errors
/// [`StoreError`].
pub async fn sponsorship_spend_add(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    chain_id: i64,
    day: chrono::NaiveDate,
    wei: &str,
) -> StoreResult<String> {
    Ok(sqlx::query_scalar(
        "INSERT INTO aa_sponsorship_spend (organization_id, chain_id, day, granted_wei) \
         VALUES ($1, $2, $3, $4::numeric) \
         ON CONFLICT (organization_id, chain_id, day) DO UPDATE \
           SET granted_wei = aa_sponsorship_spend.granted_wei + EXCLUDED.granted_wei, \
               updated_at = now() \
         RETURNING granted_wei::text",
    )
    .bind(organization_id)
    .bind(chain_id)
    .bind(day)
    .bind(wei)
    .fetch_one(db)
    .await?)
}
