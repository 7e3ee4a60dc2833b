//! Reads behind [`crate::requests`]: a request with its last attempt's hash, its last
//! broadcast failure and its latest custody submission.

use super::unreadable;
use crate::{RequestState, Result};
use keel_units::db::DbHash;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::CustodyViewRow;

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
    sqlx::query_as::<_, BroadcastErrorRow>(
        "SELECT id, last_broadcast_error, last_broadcast_error_at, broadcast_failures
           FROM txq_request
          WHERE id = ANY($1) AND last_broadcast_error IS NOT NULL AND last_broadcast_error_at IS NOT NULL",
    )
    .bind(ids)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_request"))
}

/// A request as [`crate::requests`] reads it: the row's state, nonce, verdict, funding
/// deadline and last broadcast error, and the hash of its highest-numbered attempt.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ViewRow {
    pub id: Uuid,
    pub state: RequestState,
    pub nonce: Option<i64>,
    pub verdict: Option<serde_json::Value>,
    pub last_hash: Option<DbHash>,
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
    pub c_phase: Option<crate::CustodyPhase>,
    pub c_status: Option<String>,
    pub c_sub_status: Option<String>,
    pub c_tx_hash: Option<DbHash>,
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
    sqlx::query_as::<_, ViewRow>(
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
    .await
    .map_err(unreadable("txq_request"))
}
