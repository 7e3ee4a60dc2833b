//! `txq_request` (`migrations/0005_txq.sql`): enqueue, reads of queued and in-flight
//! requests, the lifecycle moves (`signed` → `broadcast` → `settled`), re-signing, gap
//! fills, withdrawal by key prefix and broadcast-failure counts (`0018`).

use super::unreadable;
use crate::{RequestState, Result};
use keel_units::db::DbAddress;
use sqlx::PgExecutor;
use uuid::Uuid;

/// A `txq_request` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RequestRow {
    pub id: Uuid,
    pub sender: DbAddress,
    pub to_address: Option<DbAddress>,
    pub value_wei: String,
    pub calldata: Vec<u8>,
    pub gas_limit: Option<i64>,
    pub state: RequestState,
    pub nonce: Option<i64>,
    pub verdict: Option<serde_json::Value>,
    /// The funding pause in milliseconds; `None`: no funding pause.
    pub funding_pause_ms: Option<i64>,
    /// Broadcasts that failed without settling the request (migration 0018).
    pub broadcast_failures: i32,
    /// Whether the request's backoff after failed broadcasts has passed (database
    /// clock; issue 32 §8): always after none or one failure; after `n` ≥ 2 the next
    /// broadcast waits min(60 s, 0.5 s × 2^(n−2)) from the last failure.
    pub broadcast_due: bool,
    /// The W3C `traceparent` of the span that enqueued it (migration 0060; `None`: not
    /// tracing).
    pub trace_context: Option<String>,
    /// The EIP-7702 authorization list (migration 0081; `None`: an EIP-1559
    /// transaction). Decoded by [`RequestRow::authorizations`].
    pub authorization_list: Option<serde_json::Value>,
}

impl RequestRow {
    /// The request's EIP-7702 authorizations (empty: an EIP-1559 transaction).
    ///
    /// # Errors
    /// [`crate::TxqError::InvalidRequest`]`("authorization_list")` when the stored list
    /// does not decode.
    pub(crate) fn authorizations(&self) -> Result<Vec<alloy::eips::eip7702::SignedAuthorization>> {
        match &self.authorization_list {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|_| crate::TxqError::InvalidRequest("authorization_list")),
        }
    }
}

const REQUEST_COLUMNS: &str = "id, sender, to_address, value_wei, calldata, gas_limit, state, nonce, verdict, \
     funding_pause_ms, broadcast_failures, trace_context, authorization_list, \
     (broadcast_failures <= 1 OR last_broadcast_error_at IS NULL \
      OR last_broadcast_error_at + least(interval '60 seconds', \
            interval '500 milliseconds' * power(2, least(broadcast_failures, 30) - 2)) <= now()) \
     AS broadcast_due";

pub(crate) struct NewRequest<'a> {
    pub id: Uuid,
    pub chain_id: i64,
    pub sender: &'a [u8],
    pub key: &'a str,
    pub to: Option<&'a [u8]>,
    pub value_wei: String,
    pub calldata: &'a [u8],
    pub gas_limit: Option<i64>,
    pub funding_pause_ms: Option<i64>,
    pub trace_context: Option<&'a str>,
    pub authorization_list: Option<&'a serde_json::Value>,
}

/// An owned [`NewRequest`] (queued in the enqueue combiner).
#[derive(Debug, Clone)]
pub(crate) struct OwnedNewRequest {
    pub id: Uuid,
    pub chain_id: i64,
    pub sender: Vec<u8>,
    pub key: String,
    pub to: Option<Vec<u8>>,
    pub value_wei: String,
    pub calldata: Vec<u8>,
    pub gas_limit: Option<i64>,
    pub funding_pause_ms: Option<i64>,
    /// The enqueuing span's W3C `traceparent` (`None`: not tracing).
    pub trace_context: Option<String>,
    /// The EIP-7702 authorization list as stored (`None`: none).
    pub authorization_list: Option<serde_json::Value>,
}

impl OwnedNewRequest {
    pub(crate) fn borrowed(&self) -> NewRequest<'_> {
        NewRequest {
            id: self.id,
            chain_id: self.chain_id,
            sender: &self.sender,
            key: &self.key,
            to: self.to.as_deref(),
            value_wei: self.value_wei.clone(),
            calldata: &self.calldata,
            gas_limit: self.gas_limit,
            funding_pause_ms: self.funding_pause_ms,
            trace_context: self.trace_context.as_deref(),
            authorization_list: self.authorization_list.as_ref(),
        }
    }
}

/// Inserts many requests in one statement (UNNEST of column arrays), skipping those
/// whose idempotency key exists (or repeats an earlier row of the batch); returns the
/// ids of the rows inserted.
///
/// Returns sqlx's error unclassified: the enqueue combiner tells a statement the
/// server rejected (nothing written; retried row by row) from a lost connection.
pub(crate) async fn requests_insert_many(
    db: impl PgExecutor<'_>,
    rows: &[&OwnedNewRequest],
) -> std::result::Result<Vec<Uuid>, sqlx::Error> {
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let chains: Vec<i64> = rows.iter().map(|r| r.chain_id).collect();
    let senders: Vec<&[u8]> = rows.iter().map(|r| r.sender.as_slice()).collect();
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let tos: Vec<Option<&[u8]>> = rows.iter().map(|r| r.to.as_deref()).collect();
    let values: Vec<&str> = rows.iter().map(|r| r.value_wei.as_str()).collect();
    let calldata: Vec<&[u8]> = rows.iter().map(|r| r.calldata.as_slice()).collect();
    let gas: Vec<Option<i64>> = rows.iter().map(|r| r.gas_limit).collect();
    let pauses: Vec<Option<i64>> = rows.iter().map(|r| r.funding_pause_ms).collect();
    let traces: Vec<Option<&str>> = rows.iter().map(|r| r.trace_context.as_deref()).collect();
    let auths: Vec<Option<&serde_json::Value>> =
        rows.iter().map(|r| r.authorization_list.as_ref()).collect();
    sqlx::query_scalar(
        "INSERT INTO txq_request (id, chain_id, sender, idempotency_key, to_address, value_wei, calldata, gas_limit, funding_pause_ms, trace_context, authorization_list)
         SELECT * FROM unnest($1::uuid[], $2::int8[], $3::bytea[], $4::text[], $5::bytea[], $6::text[], $7::bytea[], $8::int8[], $9::int8[], $10::text[], $11::jsonb[])
         ON CONFLICT (chain_id, sender, idempotency_key) DO NOTHING
         RETURNING id",
    )
    .bind(&ids)
    .bind(&chains)
    .bind(&senders)
    .bind(&keys)
    .bind(&tos)
    .bind(&values)
    .bind(&calldata)
    .bind(&gas)
    .bind(&pauses)
    .bind(&traces)
    .bind(&auths)
    .fetch_all(db)
    .await
}

/// Inserts a request unless its idempotency key exists; returns whether it inserted.
pub(crate) async fn request_insert(db: impl PgExecutor<'_>, r: &NewRequest<'_>) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO txq_request (id, chain_id, sender, idempotency_key, to_address, value_wei, calldata, gas_limit, funding_pause_ms, trace_context, authorization_list)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (chain_id, sender, idempotency_key) DO NOTHING",
    )
    .bind(r.id)
    .bind(r.chain_id)
    .bind(r.sender)
    .bind(r.key)
    .bind(r.to)
    .bind(&r.value_wei)
    .bind(r.calldata)
    .bind(r.gas_limit)
    .bind(r.funding_pause_ms)
    .bind(r.trace_context)
    .bind(r.authorization_list)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(crate) async fn request_by_key(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    key: &str,
) -> Result<Option<RequestRow>> {
    sqlx::query_as::<_, RequestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {REQUEST_COLUMNS} FROM txq_request WHERE chain_id = $1 AND sender = $2 AND idempotency_key = $3"
    )))
    .bind(chain_id)
    .bind(sender)
    .bind(key)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}

pub(crate) async fn request_get(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<RequestRow>> {
    sqlx::query_as::<_, RequestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {REQUEST_COLUMNS} FROM txq_request WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// A queued request with its sender's next nonce as read in the same statement.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct QueuedRow {
    #[sqlx(flatten)]
    pub request: RequestRow,
    /// `txq_sender.next_nonce` of the request's sender (read without a lock;
    /// [`commit_signed`] checks it again under the lock).
    pub next_nonce: i64,
}

/// Queued requests of each of `senders` (at most `limit` per sender, oldest first), with
/// each sender's next nonce; senders without a `txq_sender` row are left out. Rows come
/// grouped by sender.
pub(crate) async fn requests_queued_many(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    senders: &[&[u8]],
    limit: i64,
) -> Result<Vec<QueuedRow>> {
    sqlx::query_as::<_, QueuedRow>(sqlx::AssertSqlSafe(format!(
        "SELECT q.*, s.next_nonce
           FROM unnest($2::bytea[]) AS w(sender)
           JOIN txq_sender s ON s.chain_id = $1 AND s.sender = w.sender
          CROSS JOIN LATERAL (
                SELECT {REQUEST_COLUMNS}, created_at FROM txq_request
                 WHERE chain_id = $1 AND sender = w.sender AND state = 'queued'
                 ORDER BY created_at, id LIMIT $3) AS q
          ORDER BY q.sender, q.created_at, q.id"
    )))
    .bind(chain_id)
    .bind(senders)
    .bind(limit)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// In-flight (`signed` or `broadcast`) requests of a chain, optionally of one sender,
/// in nonce order.
pub(crate) async fn requests_in_flight(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: Option<&[u8]>,
    state: Option<&str>,
) -> Result<Vec<RequestRow>> {
    sqlx::query_as::<_, RequestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {REQUEST_COLUMNS} FROM txq_request
          WHERE chain_id = $1 AND state IN ('signed', 'broadcast')
            AND ($2::bytea IS NULL OR sender = $2) AND ($3::text IS NULL OR state = $3)
          ORDER BY sender, nonce"
    )))
    .bind(chain_id)
    .bind(sender)
    .bind(state)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Senders of a chain with queued, waiting or signed requests (those a sender pass has
/// work for).
pub(crate) async fn senders_with_work(
    db: impl PgExecutor<'_>,
    chain_id: i64,
) -> Result<Vec<SenderWork>> {
    sqlx::query_as::<_, SenderWork>(
        // One scan per partial index (settled rows, the bulk of the table, are never
        // read): a single `state IN (...)` filter plans as a sequential scan.
        "SELECT sender,
                bool_or(state = 'waiting_funding') AS waiting_funding,
                bool_or(state = 'signed') AS signed
           FROM (SELECT sender, state FROM txq_request WHERE chain_id = $1 AND state = 'queued'
                 UNION ALL
                 SELECT sender, state FROM txq_request WHERE chain_id = $1 AND state = 'waiting_funding'
                 UNION ALL
                 SELECT sender, state FROM txq_request WHERE chain_id = $1 AND state = 'signed') AS w
          GROUP BY sender",
    )
    .bind(chain_id)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// A sender with requests to move, and which kinds it has besides `queued`.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SenderWork {
    pub sender: DbAddress,
    pub waiting_funding: bool,
    pub signed: bool,
}

/// A request that [`request_settle`] moved to `settled`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SettleRow {
    pub idempotency_key: String,
    /// Seconds since enqueue.
    pub secs: f64,
}

/// Any unsettled state → `settled` with `verdict`; `None` when it was settled already
/// (a settled verdict is never overwritten).
pub(crate) async fn request_settle(
    db: impl PgExecutor<'_>,
    id: Uuid,
    verdict: &serde_json::Value,
    kind: &str,
) -> Result<Option<SettleRow>> {
    sqlx::query_as::<_, SettleRow>(
        "UPDATE txq_request SET state = 'settled', verdict = $2, verdict_kind = $3, settled_at = now(), updated_at = now()
          WHERE id = $1 AND state <> 'settled'
         RETURNING idempotency_key, extract(epoch FROM now() - created_at)::float8 AS secs",
    )
    .bind(id)
    .bind(verdict)
    .bind(kind)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Locks a request that is still `broadcast` (for adding a replacement attempt); false
/// when it settled meanwhile.
pub(crate) async fn request_lock_broadcast(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM txq_request WHERE id = $1 AND state = 'broadcast' FOR UPDATE")
            .bind(id)
            .fetch_optional(db)
            .await
            .map_err(unreadable("txq_request"))?
            .is_some(),
    )
}

/// Locks a request still in flight (`signed` or `broadcast`) at `nonce` and returns its
/// highest attempt number; `None` when it moved meanwhile (settled, or re-signed by
/// another pass).
pub(crate) async fn request_lock_at_nonce(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    nonce: i64,
) -> Result<Option<i32>> {
    let locked = sqlx::query(
        "SELECT 1 FROM txq_request
          WHERE id = $1 AND state IN ('signed', 'broadcast') AND nonce = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(nonce)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unreadable("txq_request"))?;
    if locked.is_none() {
        return Ok(None);
    }
    let max: Option<i32> =
        sqlx::query_scalar("SELECT max(attempt) FROM txq_attempt WHERE request_id = $1")
            .bind(id)
            .fetch_one(&mut *conn)
            .await
            .map_err(unreadable("txq_request"))?;
    Ok(Some(max.unwrap_or(0)))
}

/// A re-signed request (issue 32 §3): `signed` again at its new `nonce` (its new
/// attempt is inserted beside), its broadcast failures cleared (they were about the
/// old nonce); and the sender's next nonce moved past it.
pub(crate) async fn request_resigned(
    conn: &mut sqlx::PgConnection,
    chain_id: i64,
    sender: &[u8],
    id: Uuid,
    nonce: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE txq_request SET state = 'signed', nonce = $2, broadcast_failures = 0,
                updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(nonce)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE txq_sender SET next_nonce = greatest(next_nonce, $3 + 1), updated_at = now()
          WHERE chain_id = $1 AND sender = $2",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(nonce)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Records a gap-filling request already `signed` at `nonce` (a zero-value
/// self-transfer); false when its key exists (filled before).
pub(crate) async fn request_insert_gap_fill(
    db: impl PgExecutor<'_>,
    id: Uuid,
    chain_id: i64,
    sender: &[u8],
    nonce: i64,
) -> Result<bool> {
    let r = sqlx::query(
        "INSERT INTO txq_request (id, chain_id, sender, idempotency_key, to_address, value_wei, calldata, gas_limit, state, nonce)
         VALUES ($1, $2, $3, 'keel:nonce-gap-fill:' || $4::text, $3, '0', ''::bytea, 21000, 'signed', $4)
         ON CONFLICT (chain_id, sender, idempotency_key) DO NOTHING",
    )
    .bind(id)
    .bind(chain_id)
    .bind(sender)
    .bind(nonce)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A request [`requests_mark_broadcast_many`] moved to `broadcast`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct MarkedRow {
    pub id: Uuid,
    pub idempotency_key: String,
    /// Seconds since enqueue.
    pub secs: f64,
}

/// `signed` → `broadcast` for many requests in one statement (the ones a node accepted
/// in one broadcast round); returns the requests that moved. Requests no longer
/// `signed` (settled meanwhile, or marked already) are left alone.
pub(crate) async fn requests_mark_broadcast_many(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
) -> Result<Vec<MarkedRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as::<_, MarkedRow>(
        "UPDATE txq_request SET state = 'broadcast', broadcast_at = coalesce(broadcast_at, now()), updated_at = now()
          WHERE id = ANY($1) AND state = 'signed'
         RETURNING id, idempotency_key, extract(epoch FROM now() - created_at)::float8 AS secs",
    )
    .bind(ids)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// A request that settled in [`requests_settle_many`].
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SettledRow {
    pub id: Uuid,
    pub idempotency_key: String,
    pub kind: String,
    /// Seconds since enqueue.
    pub secs: f64,
}

/// Any unsettled state → `settled` for many requests in one statement, each with its
/// verdict (JSON text) and kind; returns the ones that moved. A settled verdict is
/// never overwritten (`state <> 'settled'`), so each verdict is recorded exactly once
/// and only the returned rows may be counted.
pub(crate) async fn requests_settle_many(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
    verdicts: &[String],
    kinds: &[&str],
) -> Result<Vec<SettledRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as::<_, SettledRow>(
        "UPDATE txq_request r
            SET state = 'settled', verdict = v.verdict::jsonb, verdict_kind = v.kind,
                settled_at = now(), updated_at = now()
           FROM unnest($1::uuid[], $2::text[], $3::text[]) AS v(id, verdict, kind)
          WHERE r.id = v.id AND r.state <> 'settled'
         RETURNING r.id, r.idempotency_key, v.kind,
                   extract(epoch FROM now() - r.created_at)::float8 AS secs",
    )
    .bind(ids)
    .bind(verdicts)
    .bind(kinds)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// A request [`requests_withdraw_by_key_prefix`] found.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct WithdrawRow {
    pub id: Uuid,
    pub idempotency_key: String,
    /// True: settled by this statement; false: in flight (`signed` or `broadcast`).
    pub withdrawn: bool,
}

/// Locks (`FOR UPDATE`) the `queued` / `waiting_funding` requests of `chain_id` whose
/// idempotency key starts with `prefix`, so that the withdrawal statement after it (a
/// fresh snapshot) sees every custody submission committed before the lock was granted.
pub(crate) async fn requests_lock_by_key_prefix(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    prefix: &str,
) -> Result<()> {
    sqlx::query(
        "SELECT id FROM txq_request
          WHERE chain_id = $1 AND starts_with(idempotency_key, $2)
            AND state IN ('queued', 'waiting_funding')
          ORDER BY id FOR UPDATE",
    )
    .bind(chain_id)
    .bind(prefix)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))?;
    Ok(())
}

/// Settles every `queued` / `waiting_funding` request of `chain_id` whose idempotency key
/// starts with `prefix` with `verdict` (one statement), except custody requests with a
/// submission (they may be at the provider), and lists the unsettled ones that were
/// already signed or submitted to a custody provider ([`WithdrawRow::withdrawn`] false).
pub(crate) async fn requests_withdraw_by_key_prefix(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    prefix: &str,
    verdict: &serde_json::Value,
    kind: &str,
) -> Result<Vec<WithdrawRow>> {
    sqlx::query_as::<_, WithdrawRow>(
        "WITH w AS (
             UPDATE txq_request
                SET state = 'settled', verdict = $3, verdict_kind = $4, settled_at = now(),
                    updated_at = now()
              WHERE chain_id = $1 AND starts_with(idempotency_key, $2)
                AND state IN ('queued', 'waiting_funding')
                AND NOT EXISTS (SELECT 1 FROM txq_custody_attempt c WHERE c.request_id = txq_request.id)
          RETURNING id, idempotency_key
         )
         SELECT id, idempotency_key, true AS withdrawn FROM w
         UNION ALL
         SELECT id, idempotency_key, false AS withdrawn FROM txq_request
          WHERE chain_id = $1 AND starts_with(idempotency_key, $2)
            AND (state IN ('signed', 'broadcast')
                 OR (state = 'queued'
                     AND EXISTS (SELECT 1 FROM txq_custody_attempt c WHERE c.request_id = txq_request.id)))",
    )
    .bind(chain_id)
    .bind(prefix)
    .bind(verdict)
    .bind(kind)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Records one failed broadcast per request (`ids[i]` failed with error class
/// `classes[i]`): the class and time of the last failure and the failure count, for
/// requests still in flight. One statement.
pub(crate) async fn requests_broadcast_failed(
    db: impl PgExecutor<'_>,
    ids: &[uuid::Uuid],
    classes: &[&str],
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE txq_request r
            SET last_broadcast_error = f.class, last_broadcast_error_at = now(),
                broadcast_failures = r.broadcast_failures + 1, updated_at = now()
           FROM unnest($1::uuid[], $2::text[]) AS f(id, class)
          WHERE r.id = f.id AND r.state IN ('signed', 'broadcast')",
    )
    .bind(ids)
    .bind(classes)
    .execute(db)
    .await?;
    Ok(())
}
