//! The funding pause of `txq_request` (`migrations/0008_txq_funding.sql`): `queued` ⇄
//! `waiting_funding`, the shortfall, expiry, and the open funding requests.

use super::unreadable;
use crate::Result;
use keel_units::ChainId;
use keel_units::db::DbAddress;
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

/// The open funding request of a `waiting_funding` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct FundingRow {
    pub id: Uuid,
    pub chain_id: ChainId,
    pub sender: DbAddress,
    pub value_wei: String,
    pub funding_required_wei: String,
    pub funding_gas_limit: i64,
    pub funding_max_fee_wei: String,
    /// The L1 data fee counted when the wait began, wei (OP Stack chains; else NULL).
    pub funding_l1_fee_wei: Option<String>,
    pub funding_deadline: chrono::DateTime<chrono::Utc>,
    pub idempotency_key: String,
    /// `funding_deadline <= now()` on the database clock.
    pub expired: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

const FUNDING_COLUMNS: &str = "id, chain_id, sender, value_wei, funding_required_wei, funding_gas_limit, \
     funding_max_fee_wei, funding_l1_fee_wei, funding_deadline, idempotency_key, funding_deadline <= now() AS expired, created_at, updated_at";

/// `queued` → `waiting_funding` with its funding request; the deadline is set on the
/// first detection only (`now()` + the pause) and kept afterwards. Returns the
/// request's idempotency key and deadline when it moved; `None` when the request is no
/// longer queued or has no funding pause.
pub(crate) async fn request_wait_funding(
    db: impl PgExecutor<'_>,
    id: Uuid,
    required_wei: &str,
    gas_limit: i64,
    max_fee_wei: &str,
    l1_fee_wei: Option<&str>,
) -> Result<Option<(String, chrono::DateTime<chrono::Utc>)>> {
    sqlx::query_as(
        "UPDATE txq_request
            SET state = 'waiting_funding',
                funding_deadline = coalesce(funding_deadline, now() + funding_pause_ms * interval '1 millisecond'),
                funding_required_wei = $2, funding_gas_limit = $3, funding_max_fee_wei = $4,
                funding_l1_fee_wei = $5, updated_at = now()
          WHERE id = $1 AND state = 'queued' AND funding_pause_ms IS NOT NULL
      RETURNING idempotency_key, funding_deadline",
    )
    .bind(id)
    .bind(required_wei)
    .bind(gas_limit)
    .bind(max_fee_wei)
    .bind(l1_fee_wei)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Updates the shortfall of a request still `waiting_funding`.
pub(crate) async fn request_update_funding(
    db: impl PgExecutor<'_>,
    id: Uuid,
    required_wei: &str,
    max_fee_wei: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE txq_request SET funding_required_wei = $2, funding_max_fee_wei = $3, updated_at = now()
          WHERE id = $1 AND state = 'waiting_funding'",
    )
    .bind(id)
    .bind(required_wei)
    .bind(max_fee_wei)
    .execute(db)
    .await?;
    Ok(())
}

/// `waiting_funding` → `queued` (the balance suffices); false when it moved meanwhile.
pub(crate) async fn request_resume(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_request SET state = 'queued', updated_at = now()
          WHERE id = $1 AND state = 'waiting_funding'",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// `waiting_funding` past its deadline (database clock) → `settled` with `verdict`;
/// returns the request's idempotency key when it moved, `None` when it is not waiting
/// any more or its deadline has not passed.
pub(crate) async fn request_expire_funding(
    db: impl PgExecutor<'_>,
    id: Uuid,
    verdict: &serde_json::Value,
    kind: &str,
) -> Result<Option<String>> {
    sqlx::query_scalar(
        "UPDATE txq_request SET state = 'settled', verdict = $2, verdict_kind = $3, settled_at = now(), updated_at = now()
          WHERE id = $1 AND state = 'waiting_funding' AND funding_deadline <= now()
         RETURNING idempotency_key",
    )
    .bind(id)
    .bind(verdict)
    .bind(kind)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Counts one more broadcast refused for insufficient funds; returns the new count.
pub(crate) async fn request_funding_refused(db: impl PgExecutor<'_>, id: Uuid) -> Result<i32> {
    let row = sqlx::query(
        "UPDATE txq_request SET funding_refusals = funding_refusals + 1, updated_at = now()
          WHERE id = $1 RETURNING funding_refusals",
    )
    .bind(id)
    .fetch_one(db)
    .await
    .map_err(unreadable("txq_request"))?;
    Ok(row.try_get(0)?)
}

/// Open funding requests (`waiting_funding`), optionally of one chain and one sender,
/// oldest first.
pub(crate) async fn funding_open(
    db: impl PgExecutor<'_>,
    chain_id: Option<i64>,
    sender: Option<&[u8]>,
) -> Result<Vec<FundingRow>> {
    sqlx::query_as::<_, FundingRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {FUNDING_COLUMNS} FROM txq_request
          WHERE state = 'waiting_funding' AND ($1::int8 IS NULL OR chain_id = $1)
            AND ($2::bytea IS NULL OR sender = $2)
          ORDER BY created_at, id"
    )))
    .bind(chain_id)
    .bind(sender)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// A `queued` request of a sender that has a `waiting_funding` request: it waits
/// behind the sender's oldest open funding request (`behind`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct QueuedBehindRow {
    pub id: Uuid,
    pub chain_id: ChainId,
    pub sender: DbAddress,
    pub behind: Uuid,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Every `queued` request whose sender has an open funding request (of every chain, or
/// of `chain_id`), with that sender's oldest `waiting_funding` request, oldest first.
pub(crate) async fn funding_queued_behind(
    db: impl PgExecutor<'_>,
    chain_id: Option<i64>,
) -> Result<Vec<QueuedBehindRow>> {
    sqlx::query_as::<_, QueuedBehindRow>(
        "SELECT q.id, q.chain_id, q.sender, w.id AS behind, q.created_at
           FROM txq_request q
           JOIN LATERAL (
                SELECT id FROM txq_request w
                 WHERE w.chain_id = q.chain_id AND w.sender = q.sender
                   AND w.state = 'waiting_funding'
                 ORDER BY w.created_at, w.id LIMIT 1) w ON true
          WHERE q.state = 'queued' AND ($1::int8 IS NULL OR q.chain_id = $1)
          ORDER BY q.created_at, q.id",
    )
    .bind(chain_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// The open funding request of one request, when it is `waiting_funding`.
pub(crate) async fn funding_of(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<FundingRow>> {
    sqlx::query_as::<_, FundingRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {FUNDING_COLUMNS} FROM txq_request WHERE id = $1 AND state = 'waiting_funding'"
    )))
    .bind(id)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}
