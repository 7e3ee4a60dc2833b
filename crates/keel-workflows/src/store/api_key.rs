//! `api_key` (migration `0007`, scopes in `0029`): bearer-token keys by secret hash,
//! their scopes, issued-to address, listing, revocation and rotation.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::*;

/// Inserts API key `id` of `organization_id` holding the column default, every scope
/// (the statement keys had before scopes existed: it also runs on a schema before
/// migration 0029); `secret_sha256` is the SHA-256 (32 bytes) of the full token.
///
/// # Errors
/// [`StoreError`] (an unknown organization is a constraint violation).
pub async fn api_key_insert(
    db: impl PgExecutor<'_>,
    id: Uuid,
    organization_id: Uuid,
    label: &str,
    secret_sha256: &[u8],
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO api_key (id, organization_id, label, secret_sha256) VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(organization_id)
    .bind(label)
    .bind(secret_sha256)
    .execute(db)
    .await?;
    Ok(())
}

/// Inserts API key `id` of `organization_id` holding `scopes` (names out of `read`,
/// `operate`, `approve`, `admin`; the table CHECKs them); `secret_sha256` as in
/// [`api_key_insert`].
///
/// # Errors
/// [`StoreError`] (an unknown organization or an unknown scope is a constraint
/// violation).
pub async fn api_key_insert_with_scopes(
    db: impl PgExecutor<'_>,
    id: Uuid,
    organization_id: Uuid,
    label: &str,
    secret_sha256: &[u8],
    scopes: &[&str],
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO api_key (id, organization_id, label, secret_sha256, scopes)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(organization_id)
    .bind(label)
    .bind(secret_sha256)
    .bind(scopes)
    .execute(db)
    .await?;
    Ok(())
}

/// An organization and one of its API keys: who made a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct CallerRow {
    /// The organization.
    pub organization_id: Uuid,
    /// The API key.
    pub api_key_id: Uuid,
}

/// A bearer token's key: its organization, id and scope names.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ApiKeyCredentialRow {
    /// The organization.
    pub organization_id: Uuid,
    /// The API key.
    pub api_key_id: Uuid,
    /// Its scope names.
    pub scopes: Vec<String>,
}

/// The unrevoked API key whose current secret hashes to `secret_sha256`, or whose
/// previous secret does while its rotation overlap lasts (database clock), if any.
///
/// # Errors
/// [`StoreError`].
pub async fn api_key_by_secret(
    db: impl PgExecutor<'_>,
    secret_sha256: &[u8],
) -> StoreResult<Option<ApiKeyCredentialRow>> {
    Ok(sqlx::query_as(
        "SELECT organization_id, id AS api_key_id, scopes FROM api_key
          WHERE revoked_at IS NULL
            AND (secret_sha256 = $1
                 OR (previous_secret_sha256 = $1 AND previous_secret_expires_at > now()))",
    )
    .bind(secret_sha256)
    .fetch_optional(db)
    .await?)
}

/// An `api_key` row as its organization sees it (never a secret or its hash).
/// `previous_secret_expires_at` is set only while a rotation overlap lasts.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ApiKeyRow {
    /// Key id.
    pub id: Uuid,
    /// Label.
    pub label: String,
    /// Scope names.
    pub scopes: Vec<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last rotation, if any.
    pub rotated_at: Option<DateTime<Utc>>,
    /// Revocation, if any.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Until when the previous secret keeps working (in the future), if it does.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// The person the key is issued to (migration 0057), if any.
    pub issued_to: Option<String>,
}

/// The columns of [`ApiKeyRow`] (a macro, so the queries stay `&'static str`).
macro_rules! api_key_columns {
    () => {
        "id, label, scopes, created_at, rotated_at, revoked_at,
         CASE WHEN revoked_at IS NULL AND previous_secret_expires_at > now()
              THEN previous_secret_expires_at END AS previous_secret_expires_at, issued_to"
    };
}

/// Sets the person key `id` of `organization_id` is issued to (in the creating
/// transaction). False: no such key.
///
/// # Errors
/// [`StoreError`] (a bound violation of `api_key_issued_to_bounds`).
pub async fn api_key_set_issued_to(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
    issued_to: &str,
) -> StoreResult<bool> {
    let done =
        sqlx::query("UPDATE api_key SET issued_to = $3 WHERE organization_id = $1 AND id = $2")
            .bind(organization_id)
            .bind(id)
            .bind(issued_to)
            .execute(db)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// Who key `id` records commands as: whether it exists unrevoked, and the person it
/// is issued to. `None`: no such key.
///
/// # Errors
/// [`StoreError`].
pub async fn api_key_identity(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> StoreResult<Option<(bool, Option<String>)>> {
    Ok(
        sqlx::query_as("SELECT revoked_at IS NULL AS live, issued_to FROM api_key WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// Up to `limit` API keys of `organization_id` (revoked ones included) in
/// `(created_at, id)` order, after the keyset position `after` when given.
///
/// # Errors
/// [`StoreError`].
pub async fn api_key_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> StoreResult<Vec<ApiKeyRow>> {
    let (after_at, after_id) = after.unzip();
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        api_key_columns!(),
        " FROM api_key
          WHERE organization_id = $1
            AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3))
          ORDER BY created_at, id
          LIMIT $4"
    ))
    .bind(organization_id)
    .bind(after_at)
    .bind(after_id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// API key `id` of `organization_id`, if it exists there.
///
/// # Errors
/// [`StoreError`].
pub async fn api_key_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<ApiKeyRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        api_key_columns!(),
        " FROM api_key WHERE organization_id = $1 AND id = $2"
    ))
    .bind(organization_id)
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Revokes API key `id` of `organization_id` (both its secrets stop at once). Guarded:
/// a repeated revoke keeps the first `revoked_at`. `None` when no such key.
///
/// # Errors
/// [`StoreError`].
pub async fn api_key_revoke(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<ApiKeyRow>> {
    Ok(sqlx::query_as(concat!(
        "UPDATE api_key SET revoked_at = COALESCE(revoked_at, now())
          WHERE organization_id = $1 AND id = $2
         RETURNING ",
        api_key_columns!(),
        ""
    ))
    .bind(organization_id)
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Rotates unrevoked API key `id` of `organization_id` to the secret hashing to
/// `secret_sha256`. With `overlap_seconds > 0` the current secret becomes the previous
/// one, working until now + the overlap; with 0 it stops at once. Either way a secret
/// an earlier rotation kept working stops. `None` when no such unrevoked key.
///
/// # Errors
/// [`StoreError`].
pub async fn api_key_rotate(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
    secret_sha256: &[u8],
    overlap_seconds: i64,
) -> StoreResult<Option<ApiKeyRow>> {
    Ok(sqlx::query_as(concat!(
        "UPDATE api_key
            SET previous_secret_sha256 = CASE WHEN $4 > 0 THEN secret_sha256 END,
                previous_secret_expires_at =
                    CASE WHEN $4 > 0 THEN now() + make_interval(secs => $4) END,
                secret_sha256 = $3,
                rotated_at = now()
          WHERE organization_id = $1 AND id = $2 AND revoked_at IS NULL
         RETURNING ",
        api_key_columns!(),
        ""
    ))
    .bind(organization_id)
    .bind(id)
    .bind(secret_sha256)
    .bind(overlap_seconds)
    .fetch_optional(db)
    .await?)
}
