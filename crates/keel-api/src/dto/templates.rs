//! Asset templates (`/v1/templates`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An asset template: the server-side settings assets are created from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Template {
    /// Template id (`templateId` of `POST /v1/assets`).
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub id: String,
    /// EIP-155 chain id of its assets.
    pub chain_id: u64,
    /// Decimals of the price feed's answers.
    pub price_decimals: u8,
    /// Staleness bound installed on the price resolver, seconds.
    pub staleness_bound_seconds: u64,
    /// Mints above this amount (token units, decimal string) wait for an approval; null:
    /// never.
    pub mint_approval_threshold: Option<String>,
    /// How long an approval may take, seconds (then `APPROVAL_EXPIRED`).
    pub approval_ttl_seconds: u64,
    /// Whether missing gas funds pause an operation (a funding request) instead of
    /// failing it `GAS_REQUIRED`.
    pub funding_pause: bool,
    /// How long a funding pause may last, seconds.
    pub funding_deadline_seconds: u64,
    /// Whether `asset.forced-transfer` skips the compliance check of the receiver
    /// (false: a forced transfer is checked like any transfer).
    pub forced_transfer_skips_compliance: bool,
    /// The most recipients one `asset.batch-mint` or `asset.batch-transfer` may name.
    #[schema(minimum = 1, maximum = 500)]
    pub batch_max_recipients: u16,
    /// When it was created (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When it was last written (RFC 3339, UTC).
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/templates`: one page of the caller's asset templates, by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateList {
    /// The templates of this page.
    pub data: Vec<Template>,
    /// True when more templates follow this page.
    pub has_more: bool,
    /// Pass as `cursor` to get the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}
