//! `operation` (migration `0007`, retries in `0011`, cancels in `0020`): the API's
//! operations, their workflow instance, locks and guards, and the webhook events' mark
//! (issue 21).

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool, Postgres, QueryBuilder, Transaction};
use uuid::Uuid;

use super::*;

/// An `operation` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OperationRow {
    /// Operation id.
    pub id: Uuid,
    /// `asset.create`, `asset.mint`, ... (also the workflow's name); a stored kind this
    /// build does not know fails the row's decoding.
    pub kind: crate::kinds::OperationKind,
    /// The asset; `None` for an operation on no asset (`organization.system`).
    pub asset_id: Option<Uuid>,
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
    /// The asset; `None` for an operation on no asset (`organization.system`).
    pub asset_id: Option<Uuid>,
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
