//! `operation_tx` (migration `0007`): the **links** of transaction-queue requests to
//! their operation (see the [vocabulary](super#vocabulary)).

use sqlx::PgExecutor;
use uuid::Uuid;

use super::*;

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
