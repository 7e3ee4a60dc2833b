//! Reads behind Platform Status and queue depth (`crate::health`, indexes of
//! `migrations/0051_txq_status.sql`): per-sender counts, live custody submissions, the
//! oldest approval wait.

use super::unreadable;
use crate::{RequestState, Result};
use keel_units::ChainId;
use keel_units::db::DbAddress;
use sqlx::PgExecutor;
use uuid::Uuid;

/// Counts of unsettled requests of one (state, sender).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DepthRow {
    pub state: RequestState,
    pub sender: DbAddress,
    pub n: i64,
}

/// Unsettled requests of a chain counted by (state, sender).
pub(crate) async fn depth(db: impl PgExecutor<'_>, chain_id: i64) -> Result<Vec<DepthRow>> {
    sqlx::query_as::<_, DepthRow>(
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
    .await
    .map_err(unreadable("txq_request"))
}

/// One (chain, sender) of the queue as Platform Status shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SenderHealthRow {
    pub chain_id: ChainId,
    pub sender: DbAddress,
    pub depth: i64,
    pub waiting_funding: i64,
    pub in_flight: i64,
    pub oldest_unsettled_at: Option<chrono::DateTime<chrono::Utc>>,
    pub replacements_last_hour: i64,
    pub next_nonce: i64,
    pub balance_wei: Option<String>,
    pub balance_checked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Live custody submissions (not `done`, not `superseded`) counted by chain, provider,
/// phase and provider status.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyCountRow {
    pub chain_id: ChainId,
    pub provider: String,
    pub phase: crate::CustodyPhase,
    pub status: Option<String>,
    pub live: i64,
}

/// [`CustodyCountRow`]s, ordered by chain, provider, phase, status (the partial index
/// `txq_custody_attempt_live` of migration 0040 covers the live rows).
pub(crate) async fn custody_counts(db: impl PgExecutor<'_>) -> Result<Vec<CustodyCountRow>> {
    sqlx::query_as::<_, CustodyCountRow>(
        "SELECT r.chain_id, a.provider, a.phase, a.status, count(*)::int8 AS live
           FROM txq_custody_attempt a JOIN txq_request r ON r.id = a.request_id
          WHERE a.phase NOT IN ('done', 'superseded')
          GROUP BY r.chain_id, a.provider, a.phase, a.status
          ORDER BY r.chain_id, a.provider, a.phase, a.status NULLS FIRST",
    )
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// The live custody submission waiting longest for an approval at its provider.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyApprovalRow {
    pub request_id: Uuid,
    pub chain_id: ChainId,
    pub provider: String,
    pub provider_tx_id: Option<String>,
    pub status: Option<String>,
    pub since: chrono::DateTime<chrono::Utc>,
}

/// The oldest live submission whose provider status is an approval wait at its
/// provider (`approvals`: (provider name, status) pairs, from
/// `keel_custody::all_approval_statuses`), by `status_since`.
pub(crate) async fn custody_oldest_approval(
    db: impl PgExecutor<'_>,
    approvals: &[(&str, &str)],
) -> Result<Option<CustodyApprovalRow>> {
    let providers: Vec<&str> = approvals.iter().map(|(p, _)| *p).collect();
    let statuses: Vec<&str> = approvals.iter().map(|(_, s)| *s).collect();
    sqlx::query_as::<_, CustodyApprovalRow>(
        "SELECT a.request_id, r.chain_id, a.provider, a.provider_tx_id, a.status,
                a.status_since AS since
           FROM txq_custody_attempt a JOIN txq_request r ON r.id = a.request_id
          WHERE a.phase NOT IN ('done', 'superseded')
            AND (a.provider, a.status) IN (SELECT * FROM unnest($1::text[], $2::text[]))
          ORDER BY a.status_since, a.request_id
          LIMIT 1",
    )
    .bind(&providers)
    .bind(&statuses)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Every sender of `txq_sender` or `txq_sender_balance` (a sender a runner registered,
/// sent from or not) with its unsettled requests (depth, waiting funding, in flight,
/// oldest unsettled), its replacements (attempts above the first) in the last hour of
/// the database clock (indexes of `migrations/0051_txq_status.sql`) and its last seen
/// balance (`migrations/0086_txq_sender_balance.sql`). A sender without a nonce row
/// shows the chain's nonce as its next one (the queue starts there).
pub(crate) async fn senders_health(db: impl PgExecutor<'_>) -> Result<Vec<SenderHealthRow>> {
    sqlx::query_as(
        "SELECT k.chain_id, k.sender, coalesce(s.next_nonce, b.chain_nonce, 0) AS next_nonce,
                coalesce(u.depth, 0) AS depth,
                coalesce(u.waiting_funding, 0) AS waiting_funding,
                coalesce(u.in_flight, 0) AS in_flight,
                u.oldest_unsettled_at,
                coalesce(x.replacements, 0) AS replacements_last_hour,
                b.balance_wei, b.checked_at AS balance_checked_at
           FROM (SELECT chain_id, sender FROM txq_sender
                 UNION
                 SELECT chain_id, sender FROM txq_sender_balance) k
           LEFT JOIN txq_sender s ON s.chain_id = k.chain_id AND s.sender = k.sender
           LEFT JOIN txq_sender_balance b ON b.chain_id = k.chain_id AND b.sender = k.sender
           LEFT JOIN LATERAL (
                SELECT count(*) AS depth,
                       count(*) FILTER (WHERE r.state = 'waiting_funding') AS waiting_funding,
                       count(*) FILTER (WHERE r.state IN ('signed', 'broadcast')) AS in_flight,
                       min(r.created_at) AS oldest_unsettled_at
                  FROM txq_request r
                 WHERE r.chain_id = k.chain_id AND r.sender = k.sender AND r.state <> 'settled'
           ) u ON true
           LEFT JOIN LATERAL (
                SELECT count(*) AS replacements
                  FROM txq_attempt a JOIN txq_request r ON r.id = a.request_id
                 WHERE a.attempt > 1 AND a.created_at > now() - interval '1 hour'
                   AND r.chain_id = k.chain_id AND r.sender = k.sender
           ) x ON true
          ORDER BY k.chain_id, k.sender",
    )
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// Records the balances (wei, decimal strings) and chain nonces the queue just read for
/// its registered senders (`txq_sender_balance`), one statement.
pub(crate) async fn sender_balances_record(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    senders: &[Vec<u8>],
    balances_wei: &[String],
    chain_nonces: &[i64],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO txq_sender_balance (chain_id, sender, balance_wei, chain_nonce, checked_at)
         SELECT $1, s, b, n, now() FROM unnest($2::bytea[], $3::text[], $4::int8[]) AS t(s, b, n)
         ON CONFLICT (chain_id, sender) DO UPDATE
            SET balance_wei = excluded.balance_wei, chain_nonce = excluded.chain_nonce,
                checked_at = excluded.checked_at",
    )
    .bind(chain_id)
    .bind(senders)
    .bind(balances_wei)
    .bind(chain_nonces)
    .execute(db)
    .await?;
    Ok(())
}
