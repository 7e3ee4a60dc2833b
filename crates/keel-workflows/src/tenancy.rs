//! Organizations, API keys and asset templates (operator-side writes and the API's
//! authentication lookup). SQL for tables of `migrations/0007_platform_api.sql`.

use crate::error::{OpsError, Result};
use crate::store;
use keel_units::{Decimals, Rounding, parse_units};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// Prefix of every API key token (`keel_sk_` + 64 hex digits of randomness).
pub const API_KEY_PREFIX: &str = "keel_sk_";

/// An authenticated caller: the organization and the key it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The caller's organization; every read and write is scoped to it.
    pub organization_id: Uuid,
    /// The API key used (approvals need a different key than the request's).
    pub api_key_id: Uuid,
}

impl From<store::CallerRow> for Caller {
    fn from(r: store::CallerRow) -> Self {
        Self {
            organization_id: r.organization_id,
            api_key_id: r.api_key_id,
        }
    }
}

/// A freshly created API key. `token` is shown once and never stored.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    /// The key's id.
    pub id: Uuid,
    /// The bearer token: `keel_sk_` followed by 64 hex digits (256 random bits).
    pub token: String,
}

/// An asset template's settings (callers name a template; they never choose a chain,
/// resolver or staleness bound themselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Template id (`^[a-z0-9][a-z0-9._-]{0,63}$`), unique per organization.
    pub id: String,
    /// EIP-155 chain id of the chain its assets live on.
    pub chain_id: u64,
    /// Decimals of the price feed's answers (0..=36).
    pub price_decimals: u8,
    /// Staleness bound installed on the `PriceResolver`, seconds (> 0).
    pub staleness_bound_seconds: u64,
    /// Mints and burns (forced ones included) above this amount (token units, decimal
    /// string) wait for an approval, and when it is set every role change waits for one;
    /// `None`: never.
    pub mint_approval_threshold: Option<String>,
    /// How long an approval may take, seconds; after it the operation fails
    /// `APPROVAL_EXPIRED`.
    pub approval_ttl_seconds: u64,
    /// Insufficient gas funds pause the operation (waiting for funding) instead of
    /// failing it `GAS_REQUIRED`.
    pub funding_pause: bool,
    /// How long a funding pause may last, seconds.
    pub funding_deadline_seconds: u64,
}

impl TryFrom<store::AssetTemplateRow> for Template {
    type Error = OpsError;

    /// Decodes a stored row; an out-of-range column is [`keel_store::StoreError::Decode`].
    fn try_from(r: store::AssetTemplateRow) -> Result<Self> {
        let decode = |_| OpsError::Store(keel_store::StoreError::Decode);
        Ok(Self {
            id: r.id,
            chain_id: u64::try_from(r.chain_id).map_err(decode)?,
            price_decimals: u8::try_from(r.price_decimals).map_err(decode)?,
            staleness_bound_seconds: u64::try_from(r.staleness_bound_seconds).map_err(decode)?,
            mint_approval_threshold: r.mint_approval_threshold,
            approval_ttl_seconds: u64::try_from(r.approval_ttl_seconds).map_err(decode)?,
            funding_pause: r.funding_pause,
            funding_deadline_seconds: u64::try_from(r.funding_deadline_seconds).map_err(decode)?,
        })
    }
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    Sha256::digest(bytes).to_vec()
}

fn i64_of(v: u64, field: &'static str) -> Result<i64> {
    i64::try_from(v).map_err(|_| OpsError::InvalidField {
        field,
        reason: "exceeds the supported range",
    })
}

/// Creates an organization named `name` (1..=255 characters, unique) and returns its id.
///
/// # Errors
/// [`OpsError::InvalidField`] for a bad name; [`OpsError::Store`] (a duplicate name is
/// a constraint violation).
pub async fn create_organization(db: &PgPool, name: &str) -> Result<Uuid> {
    let len = name.chars().count();
    if len == 0 || len > 255 {
        return Err(OpsError::InvalidField {
            field: "name",
            reason: "must be 1 to 255 characters",
        });
    }
    let id = Uuid::new_v4();
    store::organization_insert(db, id, name).await?;
    Ok(id)
}

/// The id of the organization named `name`.
///
/// # Errors
/// [`OpsError::NotFound`]; [`OpsError::Store`].
pub async fn organization_by_name(db: &PgPool, name: &str) -> Result<Uuid> {
    store::organization_id_by_name(db, name)
        .await?
        .ok_or(OpsError::NotFound {
            what: "organization",
        })
}

/// Creates an API key for `organization_id`. The token is returned once; only its
/// SHA-256 is stored.
///
/// # Errors
/// [`OpsError::InvalidField`] for a bad label; [`OpsError::Store`] (unknown
/// organization is a constraint violation).
pub async fn create_api_key(db: &PgPool, organization_id: Uuid, label: &str) -> Result<NewApiKey> {
    let len = label.chars().count();
    if len == 0 || len > 255 {
        return Err(OpsError::InvalidField {
            field: "label",
            reason: "must be 1 to 255 characters",
        });
    }
    let secret: [u8; 32] = rand::random();
    let token = format!("{API_KEY_PREFIX}{}", hex::encode(secret));
    let id = Uuid::new_v4();
    store::api_key_insert(db, id, organization_id, label, &sha256(token.as_bytes())).await?;
    Ok(NewApiKey { id, token })
}

/// Resolves a bearer token to its caller. Tokens that do not have the key shape are
/// refused before any query.
///
/// # Errors
/// [`OpsError::Unauthenticated`] for an unknown, revoked or malformed token;
/// [`OpsError::Store`].
pub async fn authenticate(db: &PgPool, token: &str) -> Result<Caller> {
    let well_formed = token.len() == API_KEY_PREFIX.len() + 64
        && token.starts_with(API_KEY_PREFIX)
        && token[API_KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit());
    if !well_formed {
        return Err(OpsError::Unauthenticated);
    }
    let row = store::api_key_by_secret(db, &sha256(token.as_bytes()))
        .await?
        .ok_or(OpsError::Unauthenticated)?;
    Ok(Caller::from(row))
}

/// Whether `id` matches the template id pattern `^[a-z0-9][a-z0-9._-]{0,63}$`.
pub fn valid_template_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || (i > 0 && matches!(b, b'.' | b'_' | b'-'))
        })
}

/// Creates or replaces the template `t.id` of `organization_id`.
///
/// # Errors
/// [`OpsError::InvalidField`] for an id that breaks the pattern, zero bound or TTLs,
/// decimals above 36 or a malformed threshold; [`OpsError::Store`].
pub async fn upsert_template(db: &PgPool, organization_id: Uuid, t: &Template) -> Result<()> {
    if !valid_template_id(&t.id) {
        return Err(OpsError::InvalidField {
            field: "id",
            reason: "must match ^[a-z0-9][a-z0-9._-]{0,63}$",
        });
    }
    Decimals::new(t.price_decimals).map_err(|source| OpsError::Amount {
        field: "priceDecimals",
        source,
    })?;
    if t.staleness_bound_seconds == 0
        || t.approval_ttl_seconds == 0
        || t.funding_deadline_seconds == 0
    {
        return Err(OpsError::InvalidField {
            field: "seconds",
            reason: "bounds and deadlines must be positive",
        });
    }
    if let Some(th) = &t.mint_approval_threshold {
        parse_units(
            th,
            Decimals::new(36).map_err(|source| OpsError::Amount {
                field: "mintApprovalThreshold",
                source,
            })?,
            Rounding::Exact,
        )
        .map_err(|source| OpsError::Amount {
            field: "mintApprovalThreshold",
            source,
        })?;
    }
    let row = store::AssetTemplateRow {
        id: t.id.clone(),
        chain_id: i64_of(t.chain_id, "chainId")?,
        price_decimals: i16::from(t.price_decimals),
        staleness_bound_seconds: i64_of(t.staleness_bound_seconds, "stalenessBoundSeconds")?,
        mint_approval_threshold: t.mint_approval_threshold.clone(),
        approval_ttl_seconds: i64_of(t.approval_ttl_seconds, "approvalTtlSeconds")?,
        funding_pause: t.funding_pause,
        funding_deadline_seconds: i64_of(t.funding_deadline_seconds, "fundingDeadlineSeconds")?,
    };
    store::asset_template_upsert(db, organization_id, &row).await?;
    Ok(())
}

/// The template `id` of `organization_id`.
///
/// # Errors
/// [`OpsError::NotFound`] (`template`, also for an id that breaks the pattern, which
/// is refused before any query); [`OpsError::Store`].
pub async fn template(
    db: impl sqlx::PgExecutor<'_>,
    organization_id: Uuid,
    id: &str,
) -> Result<Template> {
    if !valid_template_id(id) {
        return Err(OpsError::NotFound { what: "template" });
    }
    let row = store::asset_template_get(db, organization_id, id)
        .await?
        .ok_or(OpsError::NotFound { what: "template" })?;
    Template::try_from(row)
}
