//! SQL of the queue's tables (`migrations/0005_txq.sql`, funding pauses in
//! `migrations/0008_txq_funding.sql`, broadcast failures in
//! `migrations/0018_txq_broadcast_errors.sql`). Every function takes an executor so callers can
//! compose them in one transaction.

use crate::{RequestState, Result};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

/// A `txq_request` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RequestRow {
    pub id: Uuid,
    pub sender: Vec<u8>,
    pub to_address: Option<Vec<u8>>,
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

/// The open funding request of a `waiting_funding` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct FundingRow {
    pub id: Uuid,
    pub chain_id: i64,
    pub sender: Vec<u8>,
    pub value_wei: String,
    pub funding_required_wei: String,
    pub funding_gas_limit: i64,
    pub funding_max_fee_wei: String,
    pub funding_deadline: chrono::DateTime<chrono::Utc>,
    pub idempotency_key: String,
    /// `funding_deadline <= now()` on the database clock.
    pub expired: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Counts of unsettled requests of one (state, sender).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DepthRow {
    pub state: RequestState,
    pub sender: Vec<u8>,
    pub n: i64,
}

/// A `txq_attempt` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct AttemptRow {
    pub request_id: Uuid,
    pub attempt: i32,
    pub nonce: i64,
    pub tx_hash: Vec<u8>,
    pub raw: Vec<u8>,
    pub max_fee_per_gas: String,
    pub max_priority_fee_per_gas: String,
    pub gas_limit: i64,
    /// Milliseconds since the attempt went out (database clock): since it was
    /// persisted, or since the request's first broadcast when that came later (a first
    /// attempt can wait behind a backlog between its signature and its broadcast, and
    /// fee bumping counts from the broadcast).
    pub age_ms: i64,
}

const REQUEST_COLUMNS: &str = "id, sender, to_address, value_wei, calldata, gas_limit, state, nonce, verdict, \
     funding_pause_ms, broadcast_failures, trace_context, authorization_list, \
     (broadcast_failures <= 1 OR last_broadcast_error_at IS NULL \
      OR last_broadcast_error_at + least(interval '60 seconds', \
            interval '500 milliseconds' * power(2, least(broadcast_failures, 30) - 2)) <= now()) \
     AS broadcast_due";

const FUNDING_COLUMNS: &str = "id, chain_id, sender, value_wei, funding_required_wei, funding_gas_limit, \
     funding_max_fee_wei, funding_deadline, idempotency_key, funding_deadline <= now() AS expired, created_at, updated_at";

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
    Ok(sqlx::query_as::<_, RequestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {REQUEST_COLUMNS} FROM txq_request WHERE chain_id = $1 AND sender = $2 AND idempotency_key = $3"
    )))
    .bind(chain_id)
    .bind(sender)
    .bind(key)
    .fetch_optional(db)
    .await?)
}

pub(crate) async fn request_get(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<RequestRow>> {
    Ok(sqlx::query_as::<_, RequestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {REQUEST_COLUMNS} FROM txq_request WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(db)
    .await?)
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
    Ok(sqlx::query_as::<_, QueuedRow>(sqlx::AssertSqlSafe(format!(
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
    .await?)
}

/// One sender's slice of a signing group: the nonce its signatures start at, and its
/// attempts in nonce order.
pub(crate) struct SignedSlice<'a> {
    pub sender: &'a [u8],
    pub first: i64,
    pub attempts: Vec<NewAttempt<'a>>,
}

/// Commits a signing group in one statement (`txq_commit_signed`, migration 0013, made
/// set-based in 0015: a few statements per group instead of five per sender): per
/// slice, under the sender's row lock, when the sender's next nonce is still `first`
/// and every request is still queued, inserts the attempts, marks the requests `signed`
/// and advances the next nonce; otherwise writes nothing for that slice. Returns the
/// senders whose slice committed. Slices must be sorted by sender (lock order), each
/// sender at most once (a repeated sender fails the whole statement).
pub(crate) async fn commit_signed(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    slices: &[SignedSlice<'_>],
) -> Result<Vec<Vec<u8>>> {
    let senders: Vec<&[u8]> = slices.iter().map(|s| s.sender).collect();
    let firsts: Vec<i64> = slices.iter().map(|s| s.first).collect();
    let counts: Vec<i32> = slices
        .iter()
        .map(|s| i32::try_from(s.attempts.len()).unwrap_or(i32::MAX))
        .collect();
    let all = || slices.iter().flat_map(|s| s.attempts.iter());
    let ids: Vec<Uuid> = all().map(|a| a.request_id).collect();
    let nonces: Vec<i64> = all().map(|a| a.nonce).collect();
    let hashes: Vec<&[u8]> = all().map(|a| a.hash).collect();
    let raws: Vec<&[u8]> = all().map(|a| a.raw).collect();
    let max_fees: Vec<&str> = all().map(|a| a.max_fee.as_str()).collect();
    let tips: Vec<&str> = all().map(|a| a.priority_fee.as_str()).collect();
    let gas: Vec<i64> = all().map(|a| a.gas_limit).collect();
    let rows = sqlx::query(
        "SELECT s FROM txq_commit_signed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS s",
    )
    .bind(chain_id)
    .bind(&senders)
    .bind(&firsts)
    .bind(&counts)
    .bind(&ids)
    .bind(&nonces)
    .bind(&hashes)
    .bind(&raws)
    .bind(&max_fees)
    .bind(&tips)
    .bind(&gas)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| r.try_get::<Vec<u8>, _>(0).map_err(Into::into))
        .collect()
}

/// In-flight (`signed` or `broadcast`) requests of a chain, optionally of one sender,
/// in nonce order.
pub(crate) async fn requests_in_flight(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: Option<&[u8]>,
    state: Option<&str>,
) -> Result<Vec<RequestRow>> {
    Ok(sqlx::query_as::<_, RequestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {REQUEST_COLUMNS} FROM txq_request
          WHERE chain_id = $1 AND state IN ('signed', 'broadcast')
            AND ($2::bytea IS NULL OR sender = $2) AND ($3::text IS NULL OR state = $3)
          ORDER BY sender, nonce"
    )))
    .bind(chain_id)
    .bind(sender)
    .bind(state)
    .fetch_all(db)
    .await?)
}

/// Senders of a chain with queued, waiting or signed requests (those a sender pass has
/// work for).
pub(crate) async fn senders_with_work(
    db: impl PgExecutor<'_>,
    chain_id: i64,
) -> Result<Vec<SenderWork>> {
    Ok(sqlx::query_as::<_, SenderWork>(
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
    .await?)
}

/// A sender with requests to move, and which kinds it has besides `queued`.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SenderWork {
    pub sender: Vec<u8>,
    pub waiting_funding: bool,
    pub signed: bool,
}

/// Attempts of the given requests, by request then attempt number, each with its age
/// since it went out ([`AttemptRow::age_ms`]).
pub(crate) async fn attempts_of(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<Vec<AttemptRow>> {
    Ok(sqlx::query_as::<_, AttemptRow>(
        "SELECT a.request_id, a.attempt, a.nonce, a.tx_hash, a.raw, a.max_fee_per_gas,
                a.max_priority_fee_per_gas, a.gas_limit,
                (extract(epoch FROM now() - greatest(a.created_at, r.broadcast_at)) * 1000)::bigint AS age_ms
           FROM txq_attempt a JOIN txq_request r ON r.id = a.request_id
          WHERE a.request_id = ANY($1) ORDER BY a.request_id, a.attempt",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// Creates the sender's nonce row at `chain_nonce` when it does not exist.
pub(crate) async fn sender_init(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    chain_nonce: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO txq_sender (chain_id, sender, next_nonce) VALUES ($1, $2, $3)
         ON CONFLICT (chain_id, sender) DO NOTHING",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(chain_nonce)
    .execute(db)
    .await?;
    Ok(())
}

pub(crate) async fn sender_exists(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM txq_sender WHERE chain_id = $1 AND sender = $2")
            .bind(chain_id)
            .bind(sender)
            .fetch_optional(db)
            .await?
            .is_some(),
    )
}

pub(crate) struct NewAttempt<'a> {
    pub request_id: Uuid,
    pub attempt: i32,
    pub nonce: i64,
    pub hash: &'a [u8],
    pub raw: &'a [u8],
    pub max_fee: String,
    pub priority_fee: String,
    pub gas_limit: i64,
}

pub(crate) async fn attempt_insert(db: impl PgExecutor<'_>, a: &NewAttempt<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO txq_attempt (request_id, attempt, nonce, tx_hash, raw, max_fee_per_gas, max_priority_fee_per_gas, gas_limit)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(a.request_id)
    .bind(a.attempt)
    .bind(a.nonce)
    .bind(a.hash)
    .bind(a.raw)
    .bind(&a.max_fee)
    .bind(&a.priority_fee)
    .bind(a.gas_limit)
    .execute(db)
    .await?;
    Ok(())
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
    Ok(sqlx::query_as::<_, SettleRow>(
        "UPDATE txq_request SET state = 'settled', verdict = $2, verdict_kind = $3, settled_at = now(), updated_at = now()
          WHERE id = $1 AND state <> 'settled'
         RETURNING idempotency_key, extract(epoch FROM now() - created_at)::float8 AS secs",
    )
    .bind(id)
    .bind(verdict)
    .bind(kind)
    .fetch_optional(db)
    .await?)
}

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
) -> Result<Option<(String, chrono::DateTime<chrono::Utc>)>> {
    Ok(sqlx::query_as(
        "UPDATE txq_request
            SET state = 'waiting_funding',
                funding_deadline = coalesce(funding_deadline, now() + funding_pause_ms * interval '1 millisecond'),
                funding_required_wei = $2, funding_gas_limit = $3, funding_max_fee_wei = $4, updated_at = now()
          WHERE id = $1 AND state = 'queued' AND funding_pause_ms IS NOT NULL
      RETURNING idempotency_key, funding_deadline",
    )
    .bind(id)
    .bind(required_wei)
    .bind(gas_limit)
    .bind(max_fee_wei)
    .fetch_optional(db)
    .await?)
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
    Ok(sqlx::query_scalar(
        "UPDATE txq_request SET state = 'settled', verdict = $2, verdict_kind = $3, settled_at = now(), updated_at = now()
          WHERE id = $1 AND state = 'waiting_funding' AND funding_deadline <= now()
         RETURNING idempotency_key",
    )
    .bind(id)
    .bind(verdict)
    .bind(kind)
    .fetch_optional(db)
    .await?)
}

/// Counts one more broadcast refused for insufficient funds; returns the new count.
pub(crate) async fn request_funding_refused(db: impl PgExecutor<'_>, id: Uuid) -> Result<i32> {
    let row = sqlx::query(
        "UPDATE txq_request SET funding_refusals = funding_refusals + 1, updated_at = now()
          WHERE id = $1 RETURNING funding_refusals",
    )
    .bind(id)
    .fetch_one(db)
    .await?;
    Ok(row.try_get(0)?)
}

/// Open funding requests (`waiting_funding`), optionally of one chain and one sender,
/// oldest first.
pub(crate) async fn funding_open(
    db: impl PgExecutor<'_>,
    chain_id: Option<i64>,
    sender: Option<&[u8]>,
) -> Result<Vec<FundingRow>> {
    Ok(sqlx::query_as::<_, FundingRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {FUNDING_COLUMNS} FROM txq_request
          WHERE state = 'waiting_funding' AND ($1::int8 IS NULL OR chain_id = $1)
            AND ($2::bytea IS NULL OR sender = $2)
          ORDER BY created_at, id"
    )))
    .bind(chain_id)
    .bind(sender)
    .fetch_all(db)
    .await?)
}

/// The open funding request of one request, when it is `waiting_funding`.
pub(crate) async fn funding_of(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<FundingRow>> {
    Ok(sqlx::query_as::<_, FundingRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {FUNDING_COLUMNS} FROM txq_request WHERE id = $1 AND state = 'waiting_funding'"
    )))
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Unsettled requests of a chain counted by (state, sender).
pub(crate) async fn depth(db: impl PgExecutor<'_>, chain_id: i64) -> Result<Vec<DepthRow>> {
    Ok(sqlx::query_as::<_, DepthRow>(
        // One scan per partial index, as in `senders_with_work`.
        "SELECT state, sender, count(*) AS n
           FROM (SELECT state, sender FROM txq_request WHERE chain_id = $1 AND state = 'queued'
                 UNION ALL
                 SELECT state, sender FROM txq_request WHERE chain_id = $1 AND state = 'waiting_funding'
                 UNION ALL
                 SELECT state, sender FROM txq_request
                  WHERE chain_id = $1 AND state IN ('signed', 'broadcast')) AS d
          GROUP BY state, sender",
    )
    .bind(chain_id)
    .fetch_all(db)
    .await?)
}

/// Locks a request that is still `broadcast` (for adding a replacement attempt); false
/// when it settled meanwhile.
pub(crate) async fn request_lock_broadcast(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM txq_request WHERE id = $1 AND state = 'broadcast' FOR UPDATE")
            .bind(id)
            .fetch_optional(db)
            .await?
            .is_some(),
    )
}

/// Nonces of a sender in `[from, to)` that a gap filler must never take: those held by
/// live (`signed` or `broadcast`) requests, and those of requests settled `confirmed`
/// or `reverted` (mined there once: when such a nonce is free again a reorg took the
/// transaction back, and its own signed bytes are what may fill it, issue 32 §10).
pub(crate) async fn live_nonces(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    from: i64,
    to: i64,
) -> Result<Vec<i64>> {
    let rows = sqlx::query(
        "SELECT nonce FROM txq_request
          WHERE chain_id = $1 AND sender = $2 AND state IN ('signed', 'broadcast')
            AND nonce >= $3 AND nonce < $4
         UNION
         SELECT nonce FROM txq_request
          WHERE chain_id = $1 AND sender = $2 AND state = 'settled'
            AND verdict_kind IN ('confirmed', 'reverted')
            AND nonce >= $3 AND nonce < $4
         ORDER BY nonce",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(from)
    .bind(to)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| r.try_get::<i64, _>(0).map_err(Into::into))
        .collect()
}

/// Raises the sender's next nonce to `at_least` (never lowers it); returns the value
/// before.
pub(crate) async fn sender_raise_next(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    at_least: i64,
) -> Result<Option<i64>> {
    let row = sqlx::query(
        "UPDATE txq_sender s SET next_nonce = $3, updated_at = now()
           FROM (SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2 FOR UPDATE) old
          WHERE s.chain_id = $1 AND s.sender = $2 AND old.next_nonce < $3
         RETURNING old.next_nonce",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(at_least)
    .fetch_optional(db)
    .await?;
    row.map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
}

/// Of `senders`, those with a nonce row and no `signed` or `broadcast` request (idle:
/// nothing of theirs can be in a node's pool), with their next nonce.
pub(crate) async fn senders_idle(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    senders: &[&[u8]],
) -> Result<Vec<(Vec<u8>, i64)>> {
    let rows = sqlx::query(
        "SELECT s.sender, s.next_nonce FROM txq_sender s
          WHERE s.chain_id = $1 AND s.sender = ANY($2)
            AND NOT EXISTS (SELECT 1 FROM txq_request r
                             WHERE r.chain_id = $1 AND r.sender = s.sender
                               AND r.state IN ('signed', 'broadcast'))",
    )
    .bind(chain_id)
    .bind(senders)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get::<Vec<u8>, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect()
}

/// Locks the sender's nonce row (the lock every nonce assignment takes) and returns
/// its next nonce; `None` without a row.
pub(crate) async fn sender_lock(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> Result<Option<i64>> {
    let row = sqlx::query(
        "SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2 FOR UPDATE",
    )
    .bind(chain_id)
    .bind(sender)
    .fetch_optional(db)
    .await?;
    row.map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
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
    .await?;
    if locked.is_none() {
        return Ok(None);
    }
    let max: Option<i32> =
        sqlx::query_scalar("SELECT max(attempt) FROM txq_attempt WHERE request_id = $1")
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
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

/// Hands `nonce` back to `sender` (its next nonce `nonce + 1` becomes `nonce`) when no
/// live (`signed`, `broadcast`) request holds `nonce` or a higher one: the request that
/// held it was refused by a node before any node accepted it (issue 33 §1), so no pool
/// holds a transaction at it and the next request may take it instead of a gap-filling
/// self-transfer. True when it was handed back. Guarded by the counter's value, so a
/// signing round that committed meanwhile (the counter moved on) wins.
pub(crate) async fn sender_release_nonce(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    nonce: i64,
) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_sender SET next_nonce = $3, updated_at = now() \
         WHERE chain_id = $1 AND sender = $2 AND next_nonce = $3 + 1 \
           AND NOT EXISTS (SELECT 1 FROM txq_request r WHERE r.chain_id = $1 AND r.sender = $2 \
             AND r.state IN ('signed', 'broadcast') AND r.nonce >= $3)",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(nonce)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The sender's next nonce, if its row exists.
pub(crate) async fn sender_next(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> Result<Option<i64>> {
    let row = sqlx::query("SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2")
        .bind(chain_id)
        .bind(sender)
        .fetch_optional(db)
        .await?;
    row.map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
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
    Ok(sqlx::query_as::<_, MarkedRow>(
        "UPDATE txq_request SET state = 'broadcast', broadcast_at = coalesce(broadcast_at, now()), updated_at = now()
          WHERE id = ANY($1) AND state = 'signed'
         RETURNING id, idempotency_key, extract(epoch FROM now() - created_at)::float8 AS secs",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
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
    Ok(sqlx::query_as::<_, SettledRow>(
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
    .await?)
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
    .await?;
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
    Ok(sqlx::query_as::<_, WithdrawRow>(
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
    .await?)
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

/// The last broadcast failure of a request (migration 0018).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct BroadcastErrorRow {
    pub id: Uuid,
    pub last_broadcast_error: String,
    pub last_broadcast_error_at: chrono::DateTime<chrono::Utc>,
    pub broadcast_failures: i32,
}

/// The last broadcast failure of each of `ids` that has one.
pub(crate) async fn broadcast_errors_of(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
) -> Result<Vec<BroadcastErrorRow>> {
    Ok(sqlx::query_as::<_, BroadcastErrorRow>(
        "SELECT id, last_broadcast_error, last_broadcast_error_at, broadcast_failures
           FROM txq_request
          WHERE id = ANY($1) AND last_broadcast_error IS NOT NULL AND last_broadcast_error_at IS NOT NULL",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// A request as [`crate::requests`] reads it: the row's state, nonce, verdict, funding
/// deadline and last broadcast error, and the hash of its highest-numbered attempt.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ViewRow {
    pub id: Uuid,
    pub state: RequestState,
    pub nonce: Option<i64>,
    pub verdict: Option<serde_json::Value>,
    pub last_hash: Option<Vec<u8>>,
    pub funding_deadline: Option<chrono::DateTime<chrono::Utc>>,
    pub last_broadcast_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    pub broadcast_at: Option<chrono::DateTime<chrono::Utc>>,
    pub settled_at: Option<chrono::DateTime<chrono::Utc>>,
    pub final_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The latest custody submission (`txq_custody_attempt`), for custody requests.
    #[sqlx(flatten)]
    pub custody: CustodyJoin,
}

/// The latest custody submission's columns of a [`ViewRow`] (all `NULL` otherwise).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyJoin {
    pub c_provider: Option<String>,
    pub c_resubmission: Option<i32>,
    pub c_external_tx_id: Option<String>,
    pub c_provider_tx_id: Option<String>,
    pub c_phase: Option<String>,
    pub c_status: Option<String>,
    pub c_sub_status: Option<String>,
    pub c_tx_hash: Option<Vec<u8>>,
    pub c_budget_exceeded: Option<bool>,
    pub c_polls: Option<i32>,
}

impl CustodyJoin {
    /// The submission as a [`CustodyViewRow`], when the request has one.
    pub(crate) fn into_row(self, request_id: Uuid) -> Option<CustodyViewRow> {
        Some(CustodyViewRow {
            request_id,
            provider: self.c_provider?,
            resubmission: self.c_resubmission?,
            external_tx_id: self.c_external_tx_id?,
            provider_tx_id: self.c_provider_tx_id,
            phase: self.c_phase?,
            status: self.c_status,
            sub_status: self.c_sub_status,
            tx_hash: self.c_tx_hash,
            budget_exceeded: self.c_budget_exceeded.unwrap_or(false),
            polls: self.c_polls.unwrap_or(0),
        })
    }
}

/// The requests of `ids` (any chain) in the order of `ids`; unknown ids are left out,
/// a repeated id is returned again. One statement.
pub(crate) async fn requests_view(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<Vec<ViewRow>> {
    Ok(sqlx::query_as::<_, ViewRow>(
        "SELECT r.id, r.state, r.nonce, r.verdict,
                (SELECT a.tx_hash FROM txq_attempt a WHERE a.request_id = r.id
                  ORDER BY a.attempt DESC LIMIT 1) AS last_hash,
                r.funding_deadline, r.last_broadcast_error, r.created_at, r.updated_at,
                r.broadcast_at, r.settled_at, r.final_at,
                c.provider AS c_provider, c.resubmission AS c_resubmission,
                c.external_tx_id AS c_external_tx_id, c.provider_tx_id AS c_provider_tx_id,
                c.phase AS c_phase, c.status AS c_status, c.sub_status AS c_sub_status,
                c.tx_hash AS c_tx_hash, c.budget_exceeded_at IS NOT NULL AS c_budget_exceeded,
                c.polls AS c_polls
           FROM unnest($1::uuid[]) WITH ORDINALITY AS q(id, ord)
           JOIN txq_request r ON r.id = q.id
           LEFT JOIN LATERAL (
                SELECT * FROM txq_custody_attempt ca WHERE ca.request_id = r.id
                 ORDER BY ca.resubmission DESC LIMIT 1) c ON true
          ORDER BY q.ord",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// One (chain, sender) of the queue as Platform Status shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SenderHealthRow {
    pub chain_id: i64,
    pub sender: Vec<u8>,
    pub depth: i64,
    pub waiting_funding: i64,
    pub in_flight: i64,
    pub oldest_unsettled_at: Option<chrono::DateTime<chrono::Utc>>,
    pub replacements_last_hour: i64,
    pub next_nonce: i64,
}

/// Live custody submissions (not `done`, not `superseded`) counted by chain, provider,
/// phase and provider status.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyCountRow {
    pub chain_id: i64,
    pub provider: String,
    pub phase: String,
    pub status: Option<String>,
    pub live: i64,
}

/// [`CustodyCountRow`]s, ordered by chain, provider, phase, status (the partial index
/// `txq_custody_attempt_live` of migration 0040 covers the live rows).
pub(crate) async fn custody_counts(db: impl PgExecutor<'_>) -> Result<Vec<CustodyCountRow>> {
    Ok(sqlx::query_as::<_, CustodyCountRow>(
        "SELECT r.chain_id, a.provider, a.phase, a.status, count(*)::int8 AS live
           FROM txq_custody_attempt a JOIN txq_request r ON r.id = a.request_id
          WHERE a.phase NOT IN ('done', 'superseded')
          GROUP BY r.chain_id, a.provider, a.phase, a.status
          ORDER BY r.chain_id, a.provider, a.phase, a.status NULLS FIRST",
    )
    .fetch_all(db)
    .await?)
}

/// The live custody submission waiting longest for an approval at its provider.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyApprovalRow {
    pub request_id: Uuid,
    pub chain_id: i64,
    pub provider: String,
    pub provider_tx_id: Option<String>,
    pub status: Option<String>,
    pub since: chrono::DateTime<chrono::Utc>,
}

/// The oldest live submission whose provider status is an approval wait
/// (`PENDING_AUTHORIZATION`, `PENDING_3RD_PARTY_MANUAL_APPROVAL`), by `status_since`.
pub(crate) async fn custody_oldest_approval(
    db: impl PgExecutor<'_>,
) -> Result<Option<CustodyApprovalRow>> {
    Ok(sqlx::query_as::<_, CustodyApprovalRow>(
        "SELECT a.request_id, r.chain_id, a.provider, a.provider_tx_id, a.status,
                a.status_since AS since
           FROM txq_custody_attempt a JOIN txq_request r ON r.id = a.request_id
          WHERE a.phase NOT IN ('done', 'superseded')
            AND a.status IN ('PENDING_AUTHORIZATION', 'PENDING_3RD_PARTY_MANUAL_APPROVAL')
          ORDER BY a.status_since, a.request_id
          LIMIT 1",
    )
    .fetch_optional(db)
    .await?)
}

/// Every sender of `txq_sender` with its unsettled requests (depth, waiting funding,
/// in flight, oldest unsettled) and its replacements (attempts above the first) in the
/// last hour of the database clock (indexes of `migrations/0051_txq_status.sql`).
pub(crate) async fn senders_health(db: impl PgExecutor<'_>) -> Result<Vec<SenderHealthRow>> {
    Ok(sqlx::query_as(
        "SELECT s.chain_id, s.sender, s.next_nonce,
                coalesce(u.depth, 0) AS depth,
                coalesce(u.waiting_funding, 0) AS waiting_funding,
                coalesce(u.in_flight, 0) AS in_flight,
                u.oldest_unsettled_at,
                coalesce(x.replacements, 0) AS replacements_last_hour
           FROM txq_sender s
           LEFT JOIN LATERAL (
                SELECT count(*) AS depth,
                       count(*) FILTER (WHERE r.state = 'waiting_funding') AS waiting_funding,
                       count(*) FILTER (WHERE r.state IN ('signed', 'broadcast')) AS in_flight,
                       min(r.created_at) AS oldest_unsettled_at
                  FROM txq_request r
                 WHERE r.chain_id = s.chain_id AND r.sender = s.sender AND r.state <> 'settled'
           ) u ON true
           LEFT JOIN LATERAL (
                SELECT count(*) AS replacements
                  FROM txq_attempt a JOIN txq_request r ON r.id = a.request_id
                 WHERE a.attempt > 1 AND a.created_at > now() - interval '1 hour'
                   AND r.chain_id = s.chain_id AND r.sender = s.sender
           ) x ON true
          ORDER BY s.chain_id, s.sender",
    )
    .fetch_all(db)
    .await?)
}

// ---- The custody path (`migrations/0040_txq_custody.sql`, `crate::custody`). ----

/// A `queued` request of a custody sender due for the custody pass, with its latest
/// submission (absent before the first).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyDueRow {
    pub id: Uuid,
    /// The request's idempotency key (an operation's write: `op/…`, organization-scoped).
    pub idempotency_key: String,
    pub sender: Vec<u8>,
    pub to_address: Option<Vec<u8>>,
    pub value_wei: String,
    pub calldata: Vec<u8>,
    pub resubmission: Option<i32>,
    pub external_tx_id: Option<String>,
    pub phase: Option<String>,
    pub provider_tx_id: Option<String>,
    pub status: Option<String>,
    pub tx_hash: Option<Vec<u8>>,
    pub polls: Option<i32>,
    /// `absent_after <= now()`: a lookup's `None` now proves absence.
    pub absent_proven: Option<bool>,
    /// Seconds since the submission's row was created.
    pub age_secs: Option<f64>,
    /// Seconds since its status last changed.
    pub status_secs: Option<f64>,
    pub budget_exceeded: Option<bool>,
    /// The last wake-up hint when the row was read.
    pub woken_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Why Keel cancels (or cancelled) the submission at the provider (migration 0070):
    /// `approval_expired`, `withdrawn`.
    pub cancel_reason: Option<String>,
}

/// `queued` requests of `senders` (custody senders) on `chain_id` without a
/// submission or whose live submission is due (`next_poll_at <= now()`), oldest first,
/// at most `limit`.
pub(crate) async fn custody_due(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    senders: &[Vec<u8>],
    limit: i64,
) -> Result<Vec<CustodyDueRow>> {
    Ok(sqlx::query_as::<_, CustodyDueRow>(
        "SELECT r.id, r.idempotency_key, r.sender, r.to_address, r.value_wei, r.calldata,
                a.resubmission, a.external_tx_id, a.phase, a.provider_tx_id, a.status, a.tx_hash,
                a.polls, a.absent_after <= now() AS absent_proven,
                extract(epoch FROM now() - a.created_at)::float8 AS age_secs,
                extract(epoch FROM now() - a.status_since)::float8 AS status_secs,
                a.budget_exceeded_at IS NOT NULL AS budget_exceeded, a.woken_at,
                a.cancel_reason
           FROM txq_request r
           LEFT JOIN LATERAL (
                SELECT * FROM txq_custody_attempt c WHERE c.request_id = r.id
                 ORDER BY c.resubmission DESC LIMIT 1) a ON true
          WHERE r.chain_id = $1 AND r.state = 'queued' AND r.sender = ANY($2)
            AND (a.request_id IS NULL OR (a.phase <> 'done' AND a.next_poll_at <= now()))
          ORDER BY r.created_at, r.id
          LIMIT $3",
    )
    .bind(chain_id)
    .bind(senders)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Locks `request_id` (`FOR UPDATE`) when it is still `queued`; false otherwise. Taken
/// before a custody create is committed, so a concurrent withdrawal either settles the
/// request first (no create follows) or sees the submission (and leaves it).
pub(crate) async fn request_lock_queued(conn: &mut sqlx::PgConnection, id: Uuid) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM txq_request WHERE id = $1 AND state = 'queued' FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
            .is_some(),
    )
}

/// Records submission `resubmission` of `request_id` in phase `ready` (no-op when it
/// exists).
pub(crate) async fn custody_insert(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
    external_tx_id: &str,
    provider: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO txq_custody_attempt (request_id, resubmission, external_tx_id, provider)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
    )
    .bind(request_id)
    .bind(resubmission)
    .bind(external_tx_id)
    .bind(provider)
    .execute(db)
    .await?;
    Ok(())
}

/// Moves a submission from phase `from` to `to` (guarded); returns whether it moved.
pub(crate) async fn custody_move(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
    from: &str,
    to: &str,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE txq_custody_attempt SET phase = $4, updated_at = now()
          WHERE request_id = $1 AND resubmission = $2 AND phase = $3",
    )
    .bind(request_id)
    .bind(resubmission)
    .bind(from)
    .bind(to)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// Marks the live custody submissions of `request_ids` (their latest resubmission,
/// not yet `done` or `superseded`) to be cancelled at the provider because the request
/// was withdrawn (`cancel_reason = 'withdrawn'`, unless a reason is set), and makes
/// them due now. Returns the submissions marked.
pub(crate) async fn custody_withdraw_requested(
    db: impl PgExecutor<'_>,
    request_ids: &[Uuid],
) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE txq_custody_attempt a SET cancel_reason = 'withdrawn', next_poll_at = now(),
                updated_at = now()
          WHERE a.request_id = ANY($1) AND a.cancel_reason IS NULL
            AND a.phase NOT IN ('done', 'superseded')
            AND a.resubmission = (SELECT max(c.resubmission) FROM txq_custody_attempt c
                                   WHERE c.request_id = a.request_id)",
    )
    .bind(request_ids)
    .execute(db)
    .await?
    .rows_affected())
}

/// A cancel Keel asked the provider for, accepted: phase `from` → `cancelling` with
/// `reason` (kept when one is set already), due now. False when the phase moved.
pub(crate) async fn custody_cancelling(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
    from: &str,
    reason: &str,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE txq_custody_attempt
            SET phase = 'cancelling', cancel_reason = coalesce(cancel_reason, $4),
                next_poll_at = now(), updated_at = now()
          WHERE request_id = $1 AND resubmission = $2 AND phase = $3",
    )
    .bind(request_id)
    .bind(resubmission)
    .bind(from)
    .bind(reason)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// A lost create answer: phase `in_doubt`, absence provable from `now() + doubt_ms`,
/// next read after `next_ms`.
pub(crate) async fn custody_in_doubt(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
    doubt_ms: i64,
    next_ms: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE txq_custody_attempt
            SET phase = 'in_doubt', absent_after = now() + make_interval(secs => $3::float8 / 1000),
                next_poll_at = now() + make_interval(secs => $4::float8 / 1000), updated_at = now()
          WHERE request_id = $1 AND resubmission = $2 AND phase IN ('creating', 'in_doubt')",
    )
    .bind(request_id)
    .bind(resubmission)
    .bind(doubt_ms)
    .bind(next_ms)
    .execute(db)
    .await?;
    Ok(())
}

/// What a read of the provider said about a submission.
pub(crate) struct CustodyObserved<'a> {
    pub provider_tx_id: &'a str,
    pub status: &'a str,
    pub sub_status: Option<&'a str>,
    pub rank: i16,
    pub tx_hash: Option<&'a [u8]>,
    /// The next read after this many milliseconds (unless woken meanwhile).
    pub next_ms: i64,
    /// The row's `woken_at` when it was read.
    pub woken_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Records a read of the provider (phase `from` → `to`, e.g. `in_doubt` → `submitted`):
/// the provider id, status, sub-status and rank, the hash once known (kept once set;
/// `hash_at` on its first write), one more poll, the next read after `seen.next_ms` — or
/// at once when a wake-up hint arrived since the row was read (`woken_at` then differs).
/// Returns whether the row was in phase `from`.
pub(crate) async fn custody_observed(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
    from: &str,
    to: &str,
    seen: &CustodyObserved<'_>,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE txq_custody_attempt
            SET phase = $4, provider_tx_id = $5, status = $6, sub_status = $7, status_rank = $8,
                status_since = CASE WHEN status IS DISTINCT FROM $6 THEN now() ELSE status_since END,
                hash_at = CASE WHEN tx_hash IS NULL AND $9::bytea IS NOT NULL THEN now() ELSE hash_at END,
                tx_hash = COALESCE(tx_hash, $9), polls = polls + 1,
                next_poll_at = CASE WHEN woken_at IS DISTINCT FROM $11 THEN now()
                                    ELSE now() + make_interval(secs => $10::float8 / 1000) END,
                updated_at = now()
          WHERE request_id = $1 AND resubmission = $2 AND phase = $3",
    )
    .bind(request_id)
    .bind(resubmission)
    .bind(from)
    .bind(to)
    .bind(seen.provider_tx_id)
    .bind(seen.status)
    .bind(seen.sub_status)
    .bind(seen.rank)
    .bind(seen.tx_hash)
    .bind(seen.next_ms)
    .bind(seen.woken_at)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// Defers a live submission's next read by `next_ms` (an error, a `None` before
/// absence is provable, a create to retry); optionally back to phase `ready`.
pub(crate) async fn custody_defer(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
    next_ms: i64,
    to_ready_from: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE txq_custody_attempt
            SET next_poll_at = now() + make_interval(secs => $3::float8 / 1000),
                phase = CASE WHEN phase = $4 THEN 'ready' ELSE phase END, updated_at = now()
          WHERE request_id = $1 AND resubmission = $2 AND phase NOT IN ('superseded', 'done')",
    )
    .bind(request_id)
    .bind(resubmission)
    .bind(next_ms)
    .bind(to_ready_from)
    .execute(db)
    .await?;
    Ok(())
}

/// Flags a submission's poll budget as exceeded; returns whether this call set it.
pub(crate) async fn custody_budget_exceeded(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
    resubmission: i32,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE txq_custody_attempt SET budget_exceeded_at = now(), updated_at = now()
          WHERE request_id = $1 AND resubmission = $2 AND budget_exceeded_at IS NULL",
    )
    .bind(request_id)
    .bind(resubmission)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// A cancelled submission: `cancelling` → `superseded`, and resubmission + 1 recorded
/// `ready` under `external_tx_id`, in the caller's transaction. Returns whether it
/// moved.
pub(crate) async fn custody_supersede(
    conn: &mut sqlx::PgConnection,
    request_id: Uuid,
    resubmission: i32,
    external_tx_id: &str,
    provider: &str,
) -> Result<bool> {
    if !custody_move(
        &mut *conn,
        request_id,
        resubmission,
        "cancelling",
        "superseded",
    )
    .await?
    {
        return Ok(false);
    }
    custody_insert(
        &mut *conn,
        request_id,
        resubmission + 1,
        external_tx_id,
        provider,
    )
    .await?;
    Ok(true)
}

/// Makes the live submission with this provider id or external id due now; returns
/// how many rows matched.
pub(crate) async fn custody_wake(
    db: impl PgExecutor<'_>,
    provider_tx_id: Option<&str>,
    external_tx_id: Option<&str>,
) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE txq_custody_attempt SET next_poll_at = now(), woken_at = clock_timestamp(),
                updated_at = now()
          WHERE phase NOT IN ('superseded', 'done')
            AND (provider_tx_id = $1 OR external_tx_id = $2)",
    )
    .bind(provider_tx_id)
    .bind(external_tx_id)
    .execute(db)
    .await?
    .rows_affected())
}

/// A submission row as [`crate::CustodyView`] reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyViewRow {
    pub request_id: Uuid,
    pub provider: String,
    pub resubmission: i32,
    pub external_tx_id: String,
    pub provider_tx_id: Option<String>,
    pub phase: String,
    pub status: Option<String>,
    pub sub_status: Option<String>,
    pub tx_hash: Option<Vec<u8>>,
    pub budget_exceeded: bool,
    pub polls: i32,
}

impl CustodyViewRow {
    pub(crate) fn into_view(self) -> crate::CustodyView {
        let awaiting_approval = self
            .status
            .as_deref()
            .map(keel_custody::TxStatus::parse)
            .is_some_and(|s| s.phase() == keel_custody::StatusPhase::AwaitingApproval);
        crate::CustodyView {
            request_id: self.request_id,
            provider: self.provider,
            resubmission: u32::try_from(self.resubmission).unwrap_or(0),
            external_tx_id: self.external_tx_id,
            provider_tx_id: self.provider_tx_id,
            phase: self.phase,
            status: self.status,
            sub_status: self.sub_status,
            tx_hash: self
                .tx_hash
                .and_then(|h| alloy::primitives::B256::try_from(h.as_slice()).ok()),
            awaiting_approval,
            budget_exceeded: self.budget_exceeded,
            polls: u32::try_from(self.polls).unwrap_or(0),
        }
    }
}

/// The latest submission of each of `ids` that has one.
pub(crate) async fn custody_views(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
) -> Result<Vec<CustodyViewRow>> {
    Ok(sqlx::query_as::<_, CustodyViewRow>(
        "SELECT DISTINCT ON (request_id) request_id, provider, resubmission, external_tx_id,
                provider_tx_id, phase, status, sub_status, tx_hash,
                budget_exceeded_at IS NOT NULL AS budget_exceeded, polls
           FROM txq_custody_attempt WHERE request_id = ANY($1)
          ORDER BY request_id, resubmission DESC",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// A settled write still watched until its block is final (migration 0065).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct WatchedRow {
    pub id: Uuid,
    pub sender: Vec<u8>,
    pub nonce: Option<i64>,
    pub verdict: serde_json::Value,
    /// A reorg has its transaction out of the chain (`reorged_at` set).
    pub reorged: bool,
}

/// Up to `limit` settled `confirmed`/`reverted` requests of a chain with a nonce (a
/// custody sender's have none: the provider watches those) whose block was not yet
/// found final, oldest settlement first.
pub(crate) async fn requests_watched(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    limit: i64,
) -> Result<Vec<WatchedRow>> {
    Ok(sqlx::query_as::<_, WatchedRow>(
        "SELECT id, sender, nonce, verdict, reorged_at IS NOT NULL AS reorged FROM txq_request
          WHERE chain_id = $1 AND state = 'settled' AND final_at IS NULL
            AND verdict_kind IN ('confirmed', 'reverted') AND nonce IS NOT NULL
          ORDER BY settled_at LIMIT $2",
    )
    .bind(chain_id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Ends the watch of these requests: their verdict's block is final.
pub(crate) async fn requests_mark_final(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE txq_request SET final_at = now(), reorged_at = NULL, updated_at = now()
          WHERE id = ANY($1) AND state = 'settled' AND final_at IS NULL",
    )
    .bind(ids)
    .execute(db)
    .await?;
    Ok(())
}

/// A watched request whose transaction is mined again (after a reorg, in another block,
/// or another of its attempts): its verdict (same kind) is replaced and the reorg mark
/// cleared. False when it is no longer watched.
pub(crate) async fn request_watch_update(
    db: impl PgExecutor<'_>,
    id: Uuid,
    verdict: &serde_json::Value,
    kind: &str,
) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_request SET verdict = $2, verdict_kind = $3, reorged_at = NULL, updated_at = now()
          WHERE id = $1 AND state = 'settled' AND final_at IS NULL",
    )
    .bind(id)
    .bind(verdict)
    .bind(kind)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Marks a watched request's transaction as taken out of the chain by a reorg (first
/// detection only: `reorged_at` set, `reorgs` counted). True when it was newly marked.
pub(crate) async fn request_mark_reorged(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_request SET reorged_at = now(), reorgs = reorgs + 1, updated_at = now()
          WHERE id = $1 AND state = 'settled' AND final_at IS NULL AND reorged_at IS NULL",
    )
    .bind(id)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Replaces a watched request's verdict with `verdict` (`failed`, `REORGED_OUT`) and
/// ends its watch; returns its idempotency key, `None` when it is no longer watched.
pub(crate) async fn request_reorged_out(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    verdict: &serde_json::Value,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "UPDATE txq_request SET verdict = $2, verdict_kind = 'failed', final_at = now(),
                reorged_at = coalesce(reorged_at, now()), updated_at = now()
          WHERE id = $1 AND state = 'settled' AND final_at IS NULL
         RETURNING idempotency_key",
    )
    .bind(id)
    .bind(verdict)
    .fetch_optional(&mut *conn)
    .await?)
}
