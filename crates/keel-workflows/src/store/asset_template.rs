//! `asset_template` (migration `0007`): the templates an asset is created from.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::*;

/// An `asset_template` row (without its organization).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AssetTemplateRow {
    /// Template id.
    pub id: String,
    /// EIP-155 chain id.
    pub chain_id: i64,
    /// Decimals of the feed's answers (0..=36).
    pub price_decimals: i16,
    /// Staleness bound, seconds.
    pub staleness_bound_seconds: i64,
    /// Mint approval threshold, token units (decimal string), or none.
    pub mint_approval_threshold: Option<String>,
    /// Approval deadline, seconds.
    pub approval_ttl_seconds: i64,
    /// Whether missing gas funds pause instead of failing.
    pub funding_pause: bool,
    /// Funding pause deadline, seconds.
    pub funding_deadline_seconds: i64,
    /// The custody vault the template's assets send from (migration 0059), or none:
    /// the operator key.
    pub sender_vault: Option<String>,
    /// That vault's address (20 bytes), set with `sender_vault`.
    pub sender_address: Option<Vec<u8>>,
    /// Forced transfers skip the compliance check (migration 0094).
    pub forced_transfer_skips_compliance: bool,
    /// Most recipients of a batch mint or transfer, 1..=500 (migration 0094).
    pub batch_max_recipients: i32,
}

/// Inserts or replaces template `t.id` of `organization_id`.
///
/// # Errors
/// [`StoreError`] (the table's CHECKs reject out-of-range values).
pub async fn asset_template_upsert(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    t: &AssetTemplateRow,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO asset_template (organization_id, id, chain_id, price_decimals,
             staleness_bound_seconds, mint_approval_threshold, approval_ttl_seconds,
             funding_pause, funding_deadline_seconds, sender_vault, sender_address,
             forced_transfer_skips_compliance, batch_max_recipients)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (organization_id, id) DO UPDATE SET
             chain_id = EXCLUDED.chain_id, price_decimals = EXCLUDED.price_decimals,
             staleness_bound_seconds = EXCLUDED.staleness_bound_seconds,
             mint_approval_threshold = EXCLUDED.mint_approval_threshold,
             approval_ttl_seconds = EXCLUDED.approval_ttl_seconds,
             funding_pause = EXCLUDED.funding_pause,
             funding_deadline_seconds = EXCLUDED.funding_deadline_seconds,
             sender_vault = EXCLUDED.sender_vault,
             sender_address = EXCLUDED.sender_address,
             forced_transfer_skips_compliance = EXCLUDED.forced_transfer_skips_compliance,
             batch_max_recipients = EXCLUDED.batch_max_recipients,
             updated_at = now()",
    )
    .bind(organization_id)
    .bind(&t.id)
    .bind(t.chain_id)
    .bind(t.price_decimals)
    .bind(t.staleness_bound_seconds)
    .bind(t.mint_approval_threshold.as_deref())
    .bind(t.approval_ttl_seconds)
    .bind(t.funding_pause)
    .bind(t.funding_deadline_seconds)
    .bind(t.sender_vault.as_deref())
    .bind(t.sender_address.as_deref())
    .bind(t.forced_transfer_skips_compliance)
    .bind(t.batch_max_recipients)
    .execute(db)
    .await?;
    Ok(())
}

/// Template `id` of `organization_id`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn asset_template_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: &str,
) -> StoreResult<Option<AssetTemplateRow>> {
    Ok(sqlx::query_as(
        "SELECT id, chain_id, price_decimals, staleness_bound_seconds, mint_approval_threshold,
                approval_ttl_seconds, funding_pause, funding_deadline_seconds, sender_vault,
                sender_address, forced_transfer_skips_compliance, batch_max_recipients
           FROM asset_template WHERE organization_id = $1 AND id = $2",
    )
    .bind(organization_id)
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// An `asset_template` row with its timestamps (the list).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AssetTemplateListRow {
    /// The template.
    #[sqlx(flatten)]
    pub template: AssetTemplateRow,
    /// When it was first created.
    pub created_at: DateTime<Utc>,
    /// When it was last upserted.
    pub updated_at: DateTime<Utc>,
}

/// The templates of `organization_id` ordered by id, after `after` (exclusive) when
/// given, at most `limit` (an index range scan of the primary key).
///
/// # Errors
/// [`StoreError`].
pub async fn asset_template_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    after: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<AssetTemplateListRow>> {
    Ok(sqlx::query_as(
        "SELECT id, chain_id, price_decimals, staleness_bound_seconds, mint_approval_threshold,
                approval_ttl_seconds, funding_pause, funding_deadline_seconds, sender_vault,
                sender_address, forced_transfer_skips_compliance, batch_max_recipients,
                created_at, updated_at
           FROM asset_template
          WHERE organization_id = $1 AND ($2::text IS NULL OR id > $2)
          ORDER BY id LIMIT $3",
    )
    .bind(organization_id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?)
}
