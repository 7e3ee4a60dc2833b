//! `organization_system`, `organization_system_current` (migration `0091`): the
//! organizations' own on-chain systems, their deployments and the one each organization
//! carries per chain.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::*;

/// An `organization_system` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OrgSystemRow {
    /// The system's id: its deploying operation's id.
    pub id: Uuid,
    /// The organization.
    pub organization_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: i64,
    /// The deployment's serial per (organization, chain), from 1.
    pub serial: i64,
    /// `deploying`, `active`, `replaced` or `failed`.
    pub state: String,
    /// The `OrgAssetFactory` (20 bytes), once deployed.
    pub factory: Option<Vec<u8>>,
    /// The `IdentityRegistry` (20 bytes), once deployed.
    pub registry: Option<Vec<u8>>,
    /// The `Compliance` (20 bytes), once deployed.
    pub compliance: Option<Vec<u8>>,
    /// The block of the deployment transaction.
    pub deployed_block: Option<i64>,
    /// The operator's switch.
    pub enabled: bool,
    /// Why the sweep declared it failed.
    pub failure: Option<String>,
    /// Accepted at.
    pub created_at: DateTime<Utc>,
    /// Its contracts recorded at.
    pub deployed_at: Option<DateTime<Utc>>,
    /// Carried by the organization from.
    pub activated_at: Option<DateTime<Utc>>,
    /// Replaced or failed at.
    pub ended_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, organization_id, chain_id, serial, state, factory, registry, compliance, \
     deployed_block, enabled, failure, created_at, deployed_at, activated_at, ended_at";

/// Inserts deployment `id` with the next serial of (organization, chain); returns the
/// serial. Takes a transaction-scoped advisory lock on the pair so two concurrent
/// accepts get different serials.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: Uuid,
    organization_id: Uuid,
    chain_id: i64,
) -> StoreResult<i64> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('org-system:' || $1::text || ':' || $2::text, 0))")
        .bind(organization_id)
        .bind(chain_id)
        .execute(&mut **tx)
        .await?;
    Ok(sqlx::query_scalar(
        "INSERT INTO organization_system (id, organization_id, chain_id, serial, state)
         SELECT $1, $2, $3, COALESCE(max(serial), 0) + 1, 'deploying'
           FROM organization_system WHERE organization_id = $2 AND chain_id = $3
         RETURNING serial",
    )
    .bind(id)
    .bind(organization_id)
    .bind(chain_id)
    .fetch_one(&mut **tx)
    .await?)
}

/// System `id`.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_get(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> StoreResult<Option<OrgSystemRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM organization_system WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// The systems of `organization_id`, newest first.
///
/// # Errors
/// [`StoreError`].
pub async fn org_systems_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
) -> StoreResult<Vec<OrgSystemRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM organization_system WHERE organization_id = $1
          ORDER BY chain_id, serial DESC"
    )))
    .bind(organization_id)
    .fetch_all(db)
    .await?)
}

/// Records the deployed contracts of system `id` (idempotent: the first record stays).
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_deployed(
    db: impl PgExecutor<'_>,
    id: Uuid,
    factory: &[u8],
    registry: &[u8],
    compliance: &[u8],
    block: i64,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE organization_system
            SET factory = $2, registry = $3, compliance = $4, deployed_block = $5,
                deployed_at = now()
          WHERE id = $1 AND factory IS NULL",
    )
    .bind(id)
    .bind(factory)
    .bind(registry)
    .bind(compliance)
    .bind(block)
    .execute(db)
    .await?;
    Ok(())
}

/// The system `organization_id` carries on `chain_id` now.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_current(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    chain_id: i64,
) -> StoreResult<Option<OrgSystemRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM organization_system
          WHERE id = (SELECT system_id FROM organization_system_current
                       WHERE organization_id = $1 AND chain_id = $2)"
    )))
    .bind(organization_id)
    .bind(chain_id)
    .fetch_optional(db)
    .await?)
}

/// Makes system `id` the one its organization carries on its chain and marks it
/// `active` (one transaction; idempotent).
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_activate(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: Uuid,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO organization_system_current (organization_id, chain_id, system_id)
         SELECT organization_id, chain_id, id FROM organization_system WHERE id = $1
         ON CONFLICT (organization_id, chain_id)
         DO UPDATE SET system_id = EXCLUDED.system_id, updated_at = now()
         WHERE organization_system_current.system_id <> EXCLUDED.system_id",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE organization_system SET state = 'active', activated_at = now()
          WHERE id = $1 AND state = 'deploying'",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Marks system `id` `replaced` by deployment `by` (only an `active` one; idempotent).
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_replaced(db: impl PgExecutor<'_>, id: Uuid, by: Uuid) -> StoreResult<()> {
    sqlx::query(
        "UPDATE organization_system SET state = 'replaced', replaced_by = $2, ended_at = now()
          WHERE id = $1 AND state = 'active'",
    )
    .bind(id)
    .bind(by)
    .execute(db)
    .await?;
    Ok(())
}

/// Marks `deploying` system `id` `replaced` by the newer system `by` the organization
/// already carries (a deployment accepted later that finished first supersedes it).
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_superseded(db: impl PgExecutor<'_>, id: Uuid, by: Uuid) -> StoreResult<()> {
    sqlx::query(
        "UPDATE organization_system SET state = 'replaced', replaced_by = $2, ended_at = now()
          WHERE id = $1 AND state = 'deploying'",
    )
    .bind(id)
    .bind(by)
    .execute(db)
    .await?;
    Ok(())
}

/// Takes the session-level advisory lock of (organization, chain) on `conn`: the
/// settings steps and the sweep's scope writes of one organization and chain run one
/// at a time. The lock lives as long as the session: callers close the connection
/// (`PoolConnection::detach`) when done, so no path can leave it held in the pool.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_lock(
    conn: &mut sqlx::PgConnection,
    organization_id: Uuid,
    chain_id: i64,
) -> StoreResult<()> {
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('org-system-scope:' || $1::text || ':' || $2::text, 0))")
        .bind(organization_id)
        .bind(chain_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The system deployment `by` replaced, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_replaced_by(
    db: impl PgExecutor<'_>,
    by: Uuid,
) -> StoreResult<Option<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM organization_system WHERE replaced_by = $1 AND activated_at IS NOT NULL",
    )
    .bind(by)
    .fetch_optional(db)
    .await?)
}

/// Marks a `deploying` system `failed` with `failure`; true when this call did.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_failed(
    db: impl PgExecutor<'_>,
    id: Uuid,
    failure: &str,
) -> StoreResult<bool> {
    let done = sqlx::query(
        "UPDATE organization_system SET state = 'failed', failure = $2, ended_at = now()
          WHERE id = $1 AND state = 'deploying'",
    )
    .bind(id)
    .bind(failure)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets the operator's switch of system `id`.
///
/// # Errors
/// [`StoreError`].
pub async fn org_system_set_enabled(
    db: impl PgExecutor<'_>,
    id: Uuid,
    enabled: bool,
) -> StoreResult<()> {
    sqlx::query("UPDATE organization_system SET enabled = $2 WHERE id = $1")
        .bind(id)
        .bind(enabled)
        .execute(db)
        .await?;
    Ok(())
}

/// A `deploying` system with what the sweep needs of its execution.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeployingSystemRow {
    /// The system (and operation) id.
    pub id: Uuid,
    /// The operation's durable instance, once started.
    pub instance_id: Option<Uuid>,
    /// Seconds since acceptance (database clock).
    pub age_seconds: f64,
}

/// The `deploying` systems, oldest first, at most `limit`.
///
/// # Errors
/// [`StoreError`].
pub async fn org_systems_deploying(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> StoreResult<Vec<DeployingSystemRow>> {
    Ok(sqlx::query_as(
        "SELECT s.id, o.instance_id,
                EXTRACT(EPOCH FROM now() - s.created_at)::float8 AS age_seconds
           FROM organization_system s JOIN operation o ON o.id = s.id
          WHERE s.state = 'deploying' ORDER BY s.created_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// A new `investor_change` row (migration `0092`).
#[derive(Debug, Clone, Copy)]
pub struct NewInvestorChange<'a> {
    /// The `investor.set` operation.
    pub operation_id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// The system whose registry is written.
    pub system_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: i64,
    /// The investor (20 bytes).
    pub investor: &'a [u8],
    /// Attested eligible.
    pub eligible: bool,
    /// ISO 3166-1 numeric country code (0: none).
    pub country: i32,
    /// Unix seconds (0: never).
    pub expires_at: i64,
}

/// Records an investor write.
///
/// # Errors
/// [`StoreError`].
pub async fn investor_change_insert(
    db: impl PgExecutor<'_>,
    c: &NewInvestorChange<'_>,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO investor_change (operation_id, organization_id, system_id, chain_id,
                                      investor, eligible, country, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(c.operation_id)
    .bind(c.organization_id)
    .bind(c.system_id)
    .bind(c.chain_id)
    .bind(c.investor)
    .bind(c.eligible)
    .bind(c.country)
    .bind(c.expires_at)
    .execute(db)
    .await?;
    Ok(())
}

/// The chain of investor write `operation_id`, if it is one.
///
/// # Errors
/// [`StoreError`].
pub async fn investor_change_chain(
    db: impl PgExecutor<'_>,
    operation_id: Uuid,
) -> StoreResult<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT chain_id FROM investor_change WHERE operation_id = $1")
            .bind(operation_id)
            .fetch_optional(db)
            .await?,
    )
}
