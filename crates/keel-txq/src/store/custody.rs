//! `txq_custody_attempt` (`migrations/0040_txq_custody.sql`, cancel reasons in `0070`): the
//! custody path's submissions (`crate::custody`).

use super::unreadable;
use crate::Result;
use crate::submission::{CancelReason, CustodyPhase};
use keel_units::db::{DbAddress, DbHash};
use sqlx::PgExecutor;
use uuid::Uuid;

/// A `queued` request of a custody sender due for the custody pass, with its latest
/// submission (absent before the first).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CustodyDueRow {
    pub id: Uuid,
    /// The request's idempotency key (an operation's write: `op/…`, organization-scoped).
    pub idempotency_key: String,
    pub sender: DbAddress,
    pub to_address: Option<DbAddress>,
    pub value_wei: String,
    pub calldata: Vec<u8>,
    pub resubmission: Option<i32>,
    pub external_tx_id: Option<String>,
    pub phase: Option<CustodyPhase>,
    pub provider_tx_id: Option<String>,
    pub status: Option<String>,
    pub tx_hash: Option<DbHash>,
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
    pub cancel_reason: Option<CancelReason>,
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
    sqlx::query_as::<_, CustodyDueRow>(
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
    .await
    .map_err(unreadable("txq_custody_attempt"))
}

/// Locks `request_id` (`FOR UPDATE`) when it is still `queued`; false otherwise. Taken
/// before a custody create is committed, so a concurrent withdrawal either settles the
/// request first (no create follows) or sees the submission (and leaves it).
pub(crate) async fn request_lock_queued(conn: &mut sqlx::PgConnection, id: Uuid) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM txq_request WHERE id = $1 AND state = 'queued' FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(unreadable("txq_custody_attempt"))?
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
    from: CustodyPhase,
    to: CustodyPhase,
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
    from: CustodyPhase,
    reason: CancelReason,
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
    from: CustodyPhase,
    to: CustodyPhase,
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
    to_ready_from: Option<CustodyPhase>,
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
        CustodyPhase::Cancelling,
        CustodyPhase::Superseded,
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
    pub phase: CustodyPhase,
    pub status: Option<String>,
    pub sub_status: Option<String>,
    pub tx_hash: Option<DbHash>,
    pub budget_exceeded: bool,
    pub polls: i32,
}

impl CustodyViewRow {
    pub(crate) fn into_view(self) -> crate::CustodyView {
        // What the provider's status means is the provider's to say; this reader has the
        // stored row only, so it asks keel-custody by the stored provider name.
        let awaiting_approval = self
            .status
            .as_deref()
            .is_some_and(|s| keel_custody::approval_statuses(&self.provider).contains(&s));
        crate::CustodyView {
            request_id: self.request_id,
            provider: self.provider,
            resubmission: u32::try_from(self.resubmission).unwrap_or(0),
            external_tx_id: self.external_tx_id,
            provider_tx_id: self.provider_tx_id,
            phase: self.phase.as_str().to_owned(),
            status: self.status,
            sub_status: self.sub_status,
            tx_hash: self.tx_hash.map(|h| h.0),
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
    sqlx::query_as::<_, CustodyViewRow>(
        "SELECT DISTINCT ON (request_id) request_id, provider, resubmission, external_tx_id,
                provider_tx_id, phase, status, sub_status, tx_hash,
                budget_exceeded_at IS NOT NULL AS budget_exceeded, polls
           FROM txq_custody_attempt WHERE request_id = ANY($1)
          ORDER BY request_id, resubmission DESC",
    )
    .bind(ids)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_custody_attempt"))
}
