//! `asset` (migration `0007`): inserts, recorded contract addresses, and reads joined
//! with the asset's `asset.create` operation.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, Postgres, QueryBuilder};
use uuid::Uuid;

use super::*;

/// A new `asset` row (token and feed addresses are recorded later, by `asset.create`).
#[derive(Debug, Clone, Copy)]
pub struct NewAssetRow<'a> {
    /// Asset id.
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// The template it is created from.
    pub template_id: &'a str,
    /// EIP-155 chain id (from the template).
    pub chain_id: i64,
    /// ERC-20 name.
    pub name: &'a str,
    /// ERC-20 symbol.
    pub symbol: &'a str,
    /// ERC-20 decimals.
    pub decimals: i16,
    /// Initial price as given (decimal string).
    pub initial_price: &'a str,
    /// The organization system whose factory deploys the token (`None`: the platform's).
    pub system_id: Option<Uuid>,
}

/// Inserts a new asset.
///
/// # Errors
/// [`StoreError`].
pub async fn asset_insert(db: impl PgExecutor<'_>, a: &NewAssetRow<'_>) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO asset (id, organization_id, template_id, chain_id, name, symbol, decimals,
                            initial_price, system_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(a.id)
    .bind(a.organization_id)
    .bind(a.template_id)
    .bind(a.chain_id)
    .bind(a.name)
    .bind(a.symbol)
    .bind(a.decimals)
    .bind(a.initial_price)
    .bind(a.system_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Records the token, feed and issuer addresses (20 bytes each) of `asset_id` and
/// stamps `updated_at` when they change. Idempotent: `asset.create` records the same
/// addresses on every replay of its step (a repeat changes nothing).
///
/// # Errors
/// [`StoreError`].
pub async fn asset_addresses_set(
    db: impl PgExecutor<'_>,
    asset_id: Uuid,
    token: &[u8],
    feed: &[u8],
    issuer: &[u8],
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE asset SET token_address = $2, feed_address = $3, issuer_address = $4,
                          updated_at = now()
          WHERE id = $1
            AND (token_address, feed_address, issuer_address) IS DISTINCT FROM ($2, $3, $4)",
    )
    .bind(asset_id)
    .bind(token)
    .bind(feed)
    .bind(issuer)
    .execute(db)
    .await?;
    Ok(())
}

/// The factory of the organization system recorded for `asset_id` at acceptance, if
/// any (and once deployed).
///
/// # Errors
/// [`StoreError`].
pub async fn asset_system_factory(
    db: impl PgExecutor<'_>,
    asset_id: Uuid,
) -> StoreResult<Option<alloy::primitives::Address>> {
    let f: Option<Option<Vec<u8>>> = sqlx::query_scalar(
        "SELECT s.factory FROM asset a JOIN organization_system s ON s.id = a.system_id
          WHERE a.id = $1",
    )
    .bind(asset_id)
    .fetch_optional(db)
    .await?;
    Ok(f.flatten()
        .and_then(|f| alloy::primitives::Address::try_from(f.as_slice()).ok()))
}

/// The contracts of the organization system that deployed an asset's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssetSystemContracts {
    /// Its `Compliance` (the rules of the asset's mints and transfers).
    pub compliance: alloy::primitives::Address,
    /// Its `IdentityRegistry` (the investors' eligibility).
    pub registry: alloy::primitives::Address,
}

/// The `Compliance` and `IdentityRegistry` of the organization system that deployed
/// `asset_id`'s token; `None` for an asset created through the platform's factory (or
/// a system whose addresses are not recorded yet).
///
/// # Errors
/// [`StoreError`].
pub async fn asset_system_contracts(
    db: impl PgExecutor<'_>,
    asset_id: Uuid,
) -> StoreResult<Option<AssetSystemContracts>> {
    type Addresses = (Option<Vec<u8>>, Option<Vec<u8>>);
    let row: Option<Addresses> = sqlx::query_as(
        "SELECT s.compliance, s.registry FROM asset a
           JOIN organization_system s ON s.id = a.system_id
          WHERE a.id = $1",
    )
    .bind(asset_id)
    .fetch_optional(db)
    .await?;
    let address = |b: Option<Vec<u8>>| {
        b.and_then(|b| alloy::primitives::Address::try_from(b.as_slice()).ok())
    };
    Ok(row.and_then(|(c, r)| {
        Some(AssetSystemContracts {
            compliance: address(c)?,
            registry: address(r)?,
        })
    }))
}

/// An asset with its creation operation and that operation's workflow instance (whose
/// status the engine reports: `Engine::statuses`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AssetRow {
    /// Asset id.
    pub id: Uuid,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: i16,
    /// Template id.
    pub template_id: String,
    /// EIP-155 chain id.
    pub chain_id: i64,
    /// Token contract (20 bytes), once recorded.
    pub token_address: Option<Vec<u8>>,
    /// Price feed contract (20 bytes), once recorded.
    pub feed_address: Option<Vec<u8>>,
    /// The `asset.create` operation.
    pub create_operation_id: Option<Uuid>,
    /// Its workflow instance, once started.
    pub create_instance_id: Option<Uuid>,
    /// The issuer (20 bytes), once recorded by `asset.create`.
    pub issuer_address: Option<Vec<u8>>,
    /// When the asset was accepted.
    pub created_at: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
}

const ASSET_SELECT: &str = "SELECT a.id, a.name, a.symbol, a.decimals, a.template_id, a.chain_id,
        a.token_address, a.feed_address, o.id AS create_operation_id,
        o.instance_id AS create_instance_id, a.issuer_address, a.created_at, a.updated_at
   FROM asset a
   LEFT JOIN operation o ON o.asset_id = a.id AND o.kind = 'asset.create'
  WHERE a.organization_id = ";

/// Asset `id` of `organization_id`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn asset_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<AssetRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{ASSET_SELECT}$1 AND a.id = $2"
    )))
    .bind(organization_id)
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// The assets of `organization_id` in `(created_at, id)` order (oldest first), after
/// the keyset position `after` (exclusive) when given, at most `limit`: a range scan of
/// `asset_organization`.
///
/// # Errors
/// [`StoreError`].
pub async fn asset_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> StoreResult<Vec<AssetRow>> {
    // Built per call, so the keyset bound is an index condition in every plan (a
    // `$n IS NULL OR ...` would become a filter in a generic plan).
    let mut q = QueryBuilder::<Postgres>::new(ASSET_SELECT);
    q.push_bind(organization_id);
    if let Some((at, id)) = after {
        q.push(" AND (a.created_at, a.id) > (")
            .push_bind(at)
            .push(", ")
            .push_bind(id)
            .push(")");
    }
    q.push(" ORDER BY a.created_at, a.id LIMIT ")
        .push_bind(limit);
    Ok(q.build_query_as().fetch_all(db).await?)
}
