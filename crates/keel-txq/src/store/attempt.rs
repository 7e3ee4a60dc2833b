//! `txq_attempt` (`migrations/0005_txq.sql`): the signed transactions of a request, and
//! the signing group's commit (`txq_commit_signed`, migrations 0013 and 0015).

use super::unreadable;
use crate::Result;
use alloy::primitives::Address;
use keel_units::db::{DbAddress, DbHash};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

/// A `txq_attempt` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct AttemptRow {
    pub request_id: Uuid,
    pub attempt: i32,
    pub nonce: i64,
    pub tx_hash: DbHash,
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
) -> Result<Vec<Address>> {
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
    .await
    .map_err(unreadable("txq_attempt"))?;
    rows.iter()
        .map(|r| {
            r.try_get::<DbAddress, _>(0)
                .map(Address::from)
                .map_err(unreadable("txq_sender"))
        })
        .collect()
}

/// Attempts of the given requests, by request then attempt number, each with its age
/// since it went out ([`AttemptRow::age_ms`]).
pub(crate) async fn attempts_of(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<Vec<AttemptRow>> {
    sqlx::query_as::<_, AttemptRow>(
        "SELECT a.request_id, a.attempt, a.nonce, a.tx_hash, a.raw, a.max_fee_per_gas,
                a.max_priority_fee_per_gas, a.gas_limit,
                (extract(epoch FROM now() - greatest(a.created_at, r.broadcast_at)) * 1000)::bigint AS age_ms
           FROM txq_attempt a JOIN txq_request r ON r.id = a.request_id
          WHERE a.request_id = ANY($1) ORDER BY a.request_id, a.attempt",
    )
    .bind(ids)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_attempt"))
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
