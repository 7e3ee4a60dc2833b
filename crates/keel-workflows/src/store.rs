//! SQL of keel-workflows' tables (`migrations/0007_platform_api.sql`, retries in
//! `0011_operation_retries.sql`, cancels in `0020_operation_cancel.sql`): organization,
//! api_key, asset_template, asset, operation, operation_tx.
//!
//! Every function is one statement named noun-first (`operation_insert`,
//! `operation_cancel_request`, ...) and takes an executor, so a caller can compose them
//! in one transaction. Rows come back as `FromRow` structs holding the database types
//! (`i64` chain ids, `i16` decimals, 20-byte `Vec<u8>` addresses); the service layer
//! converts them into its typed views. Updates are guarded: a repeated call changes
//! nothing (`instance_id` is set once, `cancel_requested_at` is set once).
//!
//! ## Vocabulary
//! The column `operation_tx.step` is not a journal step: it names the **link** of one
//! transaction-queue request to its operation, `<write>` for the first attempt of a
//! workflow's on-chain write (`create-feed`, `mint`, ...) and `<write>#<n>` for the n-th
//! (after a retryable failure and a retry of the operation). Rust code calls it `link`;
//! the JSON wire name stays `step`.
//!
//! The last section holds the reads of other crates' tables; each is replaced by the
//! owning crate's API when issue 17's seams land.

use chrono::{DateTime, Utc};
use keel_store::StoreError;
use sqlx::{PgExecutor, PgPool, Postgres, QueryBuilder, Transaction};
use uuid::Uuid;

/// `Result` of the store functions: every failure is a classified [`StoreError`].
pub type StoreResult<T> = Result<T, StoreError>;

// ---------------------------------------------------------------------------------------
// organization, api_key
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// asset_template
// ---------------------------------------------------------------------------------------

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
             funding_pause, funding_deadline_seconds, sender_vault, sender_address)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (organization_id, id) DO UPDATE SET
             chain_id = EXCLUDED.chain_id, price_decimals = EXCLUDED.price_decimals,
             staleness_bound_seconds = EXCLUDED.staleness_bound_seconds,
             mint_approval_threshold = EXCLUDED.mint_approval_threshold,
             approval_ttl_seconds = EXCLUDED.approval_ttl_seconds,
             funding_pause = EXCLUDED.funding_pause,
             funding_deadline_seconds = EXCLUDED.funding_deadline_seconds,
             sender_vault = EXCLUDED.sender_vault,
             sender_address = EXCLUDED.sender_address,
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
                sender_address
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
                sender_address, created_at, updated_at
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

// ---------------------------------------------------------------------------------------
// asset
// ---------------------------------------------------------------------------------------

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
}

/// Inserts a new asset.
///
/// # Errors
/// [`StoreError`].
pub async fn asset_insert(db: impl PgExecutor<'_>, a: &NewAssetRow<'_>) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO asset (id, organization_id, template_id, chain_id, name, symbol, decimals,
                            initial_price)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(a.id)
    .bind(a.organization_id)
    .bind(a.template_id)
    .bind(a.chain_id)
    .bind(a.name)
    .bind(a.symbol)
    .bind(a.decimals)
    .bind(a.initial_price)
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

// ---------------------------------------------------------------------------------------
// operation
// ---------------------------------------------------------------------------------------

/// An `operation` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationRow {
    /// Operation id.
    pub id: Uuid,
    /// `asset.create`, `asset.mint`, ... (also the workflow's name); a stored kind this
    /// build does not know fails the row's decoding.
    pub kind: crate::kinds::OperationKind,
    /// The asset.
    pub asset_id: Uuid,
    /// SHA-256 of the kind, the asset and the canonical request body.
    pub request_sha256: Vec<u8>,
    /// The API key that made the request.
    pub api_key_id: Uuid,
    /// The workflow instance, once started.
    pub instance_id: Option<Uuid>,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When a cancel was requested, if one was.
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

const OPERATION_COLUMNS: &str =
    "id, kind, asset_id, request_sha256, api_key_id, instance_id, created_at, cancel_requested_at";

/// A new `operation` row.
#[derive(Debug, Clone, Copy)]
pub struct NewOperationRow<'a> {
    /// Operation id.
    pub id: Uuid,
    /// The caller's organization.
    pub organization_id: Uuid,
    /// The operation kind.
    pub kind: crate::kinds::OperationKind,
    /// The asset.
    pub asset_id: Uuid,
    /// The caller's `Idempotency-Key` (1..=255 characters).
    pub idempotency_key: &'a str,
    /// SHA-256 (32 bytes) of the request.
    pub request_sha256: &'a [u8],
    /// The caller's API key.
    pub api_key_id: Uuid,
}

/// Inserts a new operation unless its (organization, idempotency key) exists: true
/// when inserted, false when another operation holds the key (nothing is written).
///
/// # Errors
/// [`StoreError`].
pub async fn operation_insert(
    db: impl PgExecutor<'_>,
    o: &NewOperationRow<'_>,
) -> StoreResult<bool> {
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO operation (id, organization_id, kind, asset_id, idempotency_key, request_sha256,
                                api_key_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (organization_id, idempotency_key) DO NOTHING RETURNING id",
    )
    .bind(o.id)
    .bind(o.organization_id)
    .bind(o.kind)
    .bind(o.asset_id)
    .bind(o.idempotency_key)
    .bind(o.request_sha256)
    .bind(o.api_key_id)
    .fetch_optional(db)
    .await?;
    Ok(inserted.is_some())
}

/// Operation `id` of `organization_id`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<OperationRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {OPERATION_COLUMNS} FROM operation WHERE organization_id = $1 AND id = $2"
    )))
    .bind(organization_id)
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// The operation of `organization_id` that holds idempotency key `key`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_by_key(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    key: &str,
) -> StoreResult<Option<OperationRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {OPERATION_COLUMNS} FROM operation WHERE organization_id = $1 AND idempotency_key = $2"
    )))
    .bind(organization_id)
    .bind(key)
    .fetch_optional(db)
    .await?)
}

/// The filters of [`operation_list`] that SQL applies (the state is the engine's and is
/// filtered by the caller).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationListFilter {
    /// Only this kind.
    pub kind: Option<crate::kinds::OperationKind>,
    /// Only operations of this asset.
    pub asset_id: Option<Uuid>,
    /// Only operations accepted strictly after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only operations accepted strictly before this instant.
    pub created_before: Option<DateTime<Utc>>,
}

/// The operations of `organization_id` matching `f`, in `(created_at, id)` order (oldest
/// first), after the keyset position `after` (exclusive) when given, at most `limit`.
/// Each filter combination is a range scan of one index (migration 0023):
/// `operation_asset_created` with an asset, else `operation_organization_kind_created`
/// with a kind, else `operation_organization_created`.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    f: &OperationListFilter,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> StoreResult<Vec<OperationRow>> {
    let mut q = operation_list_query("", organization_id, f, after, limit);
    Ok(q.build_query_as().fetch_all(db).await?)
}

/// The plan PostgreSQL chooses for [`operation_list`] with these arguments (`EXPLAIN`,
/// one line per plan node): what the tests read to show that each filter combination
/// is an index range scan without a sort.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_list_plan(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    f: &OperationListFilter,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> StoreResult<Vec<String>> {
    let mut q = operation_list_query("EXPLAIN ", organization_id, f, after, limit);
    Ok(q.build_query_scalar().fetch_all(db).await?)
}

/// The statement of [`operation_list`], built per call so that only the given filters
/// appear: each is then an index condition in every plan (a `$n IS NULL OR ...` would
/// become a filter in a generic plan).
fn operation_list_query(
    prefix: &str,
    organization_id: Uuid,
    f: &OperationListFilter,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> QueryBuilder<Postgres> {
    let mut q = QueryBuilder::<Postgres>::new(format!(
        "{prefix}SELECT {OPERATION_COLUMNS} FROM operation WHERE organization_id = "
    ));
    q.push_bind(organization_id);
    if let Some(kind) = &f.kind {
        q.push(" AND kind = ").push_bind(*kind);
    }
    if let Some(asset) = f.asset_id {
        q.push(" AND asset_id = ").push_bind(asset);
    }
    if let Some(t) = f.created_after {
        q.push(" AND created_at > ").push_bind(t);
    }
    if let Some(t) = f.created_before {
        q.push(" AND created_at < ").push_bind(t);
    }
    if let Some((at, id)) = after {
        q.push(" AND (created_at, id) > (")
            .push_bind(at)
            .push(", ")
            .push_bind(id)
            .push(")");
    }
    q.push(" ORDER BY created_at, id LIMIT ").push_bind(limit);
    q
}

/// The operations whose workflow instances are among `instance_ids`, as
/// `(instance id, operation id)` pairs.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_ids_by_instances(
    db: impl PgExecutor<'_>,
    instance_ids: &[Uuid],
) -> StoreResult<Vec<(Uuid, Uuid)>> {
    Ok(
        sqlx::query_as("SELECT instance_id, id FROM operation WHERE instance_id = ANY($1)")
            .bind(instance_ids)
            .fetch_all(db)
            .await?,
    )
}

/// The organization and API key of operation `id`'s request, whatever its
/// organization (the operator's commands).
///
/// # Errors
/// [`StoreError`].
pub async fn operation_caller(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<Option<CallerRow>> {
    Ok(
        sqlx::query_as("SELECT organization_id, api_key_id FROM operation WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// Records operation `id`'s workflow instance. Guarded: only while none is recorded
/// (a repeated start keeps the first); true when this call recorded it.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_instance_set(
    db: impl PgExecutor<'_>,
    id: Uuid,
    instance_id: Uuid,
) -> StoreResult<bool> {
    let done =
        sqlx::query("UPDATE operation SET instance_id = $2 WHERE id = $1 AND instance_id IS NULL")
            .bind(id)
            .bind(instance_id)
            .execute(db)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// The operation whose workflow instance is `instance_id`, if any.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_id_by_instance(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> StoreResult<Option<Uuid>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM operation WHERE instance_id = $1")
            .bind(instance_id)
            .fetch_optional(db)
            .await?,
    )
}

/// Records a cancel of operation `id` (set once: a repeat keeps the first instant).
/// Takes the row lock, so it waits for an enqueue step holding
/// [`operation_write_guard`] and orders after it.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_cancel_request(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<()> {
    sqlx::query(
        "UPDATE operation SET cancel_requested_at = coalesce(cancel_requested_at, now())
          WHERE id = $1",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

/// Counts one manual retry of operation `id` (the count only grows).
///
/// # Errors
/// [`StoreError`].
pub async fn operation_retries_increment(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<()> {
    sqlx::query("UPDATE operation SET retries = retries + 1 WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// How many times operation `id` was retried; `None` without an operation row.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_retries_get(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<Option<i32>> {
    Ok(
        sqlx::query_scalar("SELECT retries FROM operation WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// The cancel state of an operation row, read under its row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationLockRow {
    /// When a cancel was requested, if one was.
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

/// Locks operation `id`'s row (`FOR UPDATE`) and reads its cancel state; `None`
/// without a row. Run it inside a transaction.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_lock(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> StoreResult<Option<OperationLockRow>> {
    Ok(
        sqlx::query_as("SELECT cancel_requested_at FROM operation WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// Takes operation `id`'s row lock for a step that is about to queue a transaction:
/// `Some(transaction)` holding the lock (link the request in it, then commit), or `None`
/// when a cancel was recorded for the operation (nothing may be queued any more). A
/// missing operation row (a workflow started outside the API) holds no lock and is never
/// cancelled this way.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_write_guard(
    db: &PgPool,
    id: Uuid,
) -> StoreResult<Option<Transaction<'static, Postgres>>> {
    let mut tx = db.begin().await?;
    let lock = operation_lock(&mut *tx, id).await?;
    if lock.is_some_and(|l| l.cancel_requested_at.is_some()) {
        tx.rollback().await?;
        return Ok(None);
    }
    Ok(Some(tx))
}

// ---------------------------------------------------------------------------------------
// operation_tx
// ---------------------------------------------------------------------------------------

/// A new `operation_tx` row: `link` of operation `operation_id` made the queue
/// request `txq_request_id`, whose verdict is delivered to `instance_id` as
/// `signal_name`.
#[derive(Debug, Clone, Copy)]
pub struct NewOperationTxRow<'a> {
    /// The operation.
    pub operation_id: Uuid,
    /// The link (column `step`): `<write>` or `<write>#<attempt>`.
    pub link: &'a str,
    /// The transaction-queue request.
    pub txq_request_id: Uuid,
    /// The workflow instance that waits for the verdict.
    pub instance_id: Uuid,
    /// The signal the verdict is delivered as (`tx.<link>`).
    pub signal_name: &'a str,
}

/// Links an operation's write attempt to its queue request. Idempotent: a repeat
/// (a replayed enqueue step) keeps the first row.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_tx_insert(
    db: impl PgExecutor<'_>,
    l: &NewOperationTxRow<'_>,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO operation_tx (operation_id, step, txq_request_id, instance_id, signal_name)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (operation_id, step) DO NOTHING",
    )
    .bind(l.operation_id)
    .bind(l.link)
    .bind(l.txq_request_id)
    .bind(l.instance_id)
    .bind(l.signal_name)
    .execute(db)
    .await?;
    Ok(())
}

/// One link of an operation to a queue request.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationTxLinkRow {
    /// The link (column `step`).
    pub link: String,
    /// The transaction-queue request.
    pub txq_request_id: Uuid,
}

/// The links of operation `operation_id`, in link order (creation, then link name).
///
/// # Errors
/// [`StoreError`].
pub async fn operation_tx_links(
    db: impl PgExecutor<'_>,
    operation_id: Uuid,
) -> StoreResult<Vec<OperationTxLinkRow>> {
    Ok(sqlx::query_as(
        "SELECT step AS link, txq_request_id FROM operation_tx
          WHERE operation_id = $1 ORDER BY created_at, step",
    )
    .bind(operation_id)
    .fetch_all(db)
    .await?)
}

/// One link of one of several operations ([`operation_tx_links_of`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationTxLinkOfRow {
    /// The operation.
    pub operation_id: Uuid,
    /// The link (column `step`).
    pub link: String,
    /// The transaction-queue request.
    pub txq_request_id: Uuid,
}

/// The links of every operation of `operation_ids`, each operation's in link order (as
/// [`operation_tx_links`]). One statement (primary-key lookups).
///
/// # Errors
/// [`StoreError`].
pub async fn operation_tx_links_of(
    db: impl PgExecutor<'_>,
    operation_ids: &[Uuid],
) -> StoreResult<Vec<OperationTxLinkOfRow>> {
    Ok(sqlx::query_as(
        "SELECT operation_id, step AS link, txq_request_id FROM operation_tx
          WHERE operation_id = ANY($1) ORDER BY operation_id, created_at, step",
    )
    .bind(operation_ids)
    .fetch_all(db)
    .await?)
}

/// Where the verdict of a queue request goes: the waiting instance and its signal.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationTxSignalRow {
    /// The transaction-queue request.
    pub txq_request_id: Uuid,
    /// The workflow instance that waits for its verdict.
    pub instance_id: Uuid,
    /// The signal name (`tx.<link>`).
    pub signal_name: String,
}

/// The links of the queue requests `txq_request_ids` (none for a request no operation
/// made), ordered by instance so that concurrent deliveries lock instances in one order.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_tx_by_requests(
    db: impl PgExecutor<'_>,
    txq_request_ids: &[Uuid],
) -> StoreResult<Vec<OperationTxSignalRow>> {
    Ok(sqlx::query_as(
        "SELECT txq_request_id, instance_id, signal_name FROM operation_tx
          WHERE txq_request_id = ANY($1) ORDER BY instance_id, txq_request_id",
    )
    .bind(txq_request_ids)
    .fetch_all(db)
    .await?)
}

/// Which operation (and link) of an organization made a queue request.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationTxOwnerRow {
    /// The queue request.
    pub txq_request_id: Uuid,
    /// The operation that made it.
    pub operation_id: Uuid,
    /// Its link (column `step`).
    pub link: String,
}

/// The links, among `txq_request_ids`, made by operations of `organization_id`.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_tx_owned(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    txq_request_ids: &[Uuid],
) -> StoreResult<Vec<OperationTxOwnerRow>> {
    Ok(sqlx::query_as(
        "SELECT ot.txq_request_id, ot.operation_id, ot.step AS link
           FROM operation_tx ot JOIN operation o ON o.id = ot.operation_id
          WHERE o.organization_id = $1 AND ot.txq_request_id = ANY($2)",
    )
    .bind(organization_id)
    .bind(txq_request_ids)
    .fetch_all(db)
    .await?)
}

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

// ---------------------------------------------------------------------------------------
// Assets
// ---------------------------------------------------------------------------------------

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

// --- webhook events (issue 21) -------------------------------------------------

/// The operation a transition reports: its id, organization and webhook mark.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OperationEventContext {
    /// Operation id.
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// What its webhook events reported so far (`None`: nothing yet).
    pub webhook_mark: Option<serde_json::Value>,
}

/// The event context of the operation whose instance is `instance_id`, if any.
pub async fn operation_event_context_by_instance(
    db: impl PgExecutor<'_>,
    instance_id: Uuid,
) -> StoreResult<Option<OperationEventContext>> {
    Ok(sqlx::query_as(
        "SELECT id, organization_id, webhook_mark FROM operation WHERE instance_id = $1",
    )
    .bind(instance_id)
    .fetch_optional(db)
    .await?)
}

/// The event context of operation `id`, if any.
pub async fn operation_event_context(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> StoreResult<Option<OperationEventContext>> {
    Ok(
        sqlx::query_as("SELECT id, organization_id, webhook_mark FROM operation WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// Locks operation `id`'s row (`FOR UPDATE`) and reads what its webhook events
/// reported so far: `None` without an operation row, `Some(None)` when nothing was
/// reported yet. Every writer of an operation's events takes this lock before it reads
/// the operation's state, so their events are written in commit order.
///
/// # Errors
/// [`StoreError`].
pub async fn operation_webhook_mark_lock(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> StoreResult<Option<Option<serde_json::Value>>> {
    Ok(
        sqlx::query_scalar("SELECT webhook_mark FROM operation WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(db)
            .await?,
    )
}

/// Records what the webhook events of operation `id` reported.
pub async fn operation_webhook_mark_set(
    db: impl PgExecutor<'_>,
    id: Uuid,
    mark: &serde_json::Value,
) -> StoreResult<()> {
    sqlx::query("UPDATE operation SET webhook_mark = $2 WHERE id = $1")
        .bind(id)
        .bind(mark)
        .execute(db)
        .await?;
    Ok(())
}
