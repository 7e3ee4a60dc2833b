//! The typed read of requests for other crates: what an operation view shows of its
//! transactions, without reading the queue's tables.

use crate::store::{self, ViewRow};
use crate::verdict::SettlementVerdict;
use crate::{RequestState, Result, TxqError};
use alloy::primitives::B256;
use chrono::{DateTime, Utc};
use keel_store::StoreError;
use sqlx::PgExecutor;
use uuid::Uuid;

/// One request as another crate sees it ([`requests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestView {
    /// The request's id.
    pub id: Uuid,
    /// Its state.
    pub state: RequestState,
    /// The nonce it holds, once signed (never while `queued` or `waiting_funding`).
    pub nonce: Option<u64>,
    /// The verdict, once `settled`.
    pub verdict: Option<SettlementVerdict>,
    /// The hash of its highest-numbered attempt (the latest signed transaction,
    /// possibly a replacement), once signed; the verdict's `hash` is the one that mined.
    pub last_hash: Option<B256>,
    /// The deadline of its funding pause (database clock), once it first waited for
    /// funding; kept after it resumed.
    pub funding_deadline: Option<DateTime<Utc>>,
    /// The error class of its last failed broadcast (see
    /// [`crate::BroadcastFailure::class`]), once one failed; kept after it moved on.
    pub last_broadcast_error: Option<String>,
    /// When the request was enqueued (database clock).
    pub created_at: DateTime<Utc>,
    /// When the request's row last changed (state, attempts, funding, verdict).
    pub updated_at: DateTime<Utc>,
    /// When a node first accepted one of its attempts, once one did.
    pub broadcast_at: Option<DateTime<Utc>>,
    /// When its verdict was recorded, once `settled`.
    pub settled_at: Option<DateTime<Utc>>,
    /// When the watch of a settled request ended (issue 32 §10): its verdict's block
    /// was found final for the chain ([`crate::Finality`]), or the verdict became
    /// `Failed { code: REORGED_OUT }`. `None` while a `confirmed`/`reverted` verdict is
    /// still watched (a reorg may still move or remove it), and for requests that are
    /// never watched (other failures, custody senders).
    pub final_at: Option<DateTime<Utc>>,
    /// For a custody sender's request: its latest submission at the provider (status,
    /// sub-status, provider id, approval wait, hash); `None` for local-key requests and
    /// before the first create.
    pub custody: Option<crate::CustodyView>,
}

impl TryFrom<ViewRow> for RequestView {
    type Error = TxqError;

    fn try_from(r: ViewRow) -> Result<Self> {
        let decode = || TxqError::Store(StoreError::Decode);
        let custody = r
            .custody
            .into_row(r.id)
            .map(store::CustodyViewRow::into_view);
        Ok(Self {
            id: r.id,
            state: r.state,
            nonce: r
                .nonce
                .map(u64::try_from)
                .transpose()
                .map_err(|_| decode())?,
            verdict: r
                .verdict
                .map(serde_json::from_value)
                .transpose()
                .map_err(|_| decode())?,
            // A custody request has no local attempt: its hash is the provider's.
            last_hash: match r.last_hash {
                Some(h) => Some(h.0),
                None => custody.as_ref().and_then(|c| c.tx_hash),
            },
            funding_deadline: r.funding_deadline,
            last_broadcast_error: r.last_broadcast_error,
            created_at: r.created_at,
            updated_at: r.updated_at,
            broadcast_at: r.broadcast_at,
            settled_at: r.settled_at,
            final_at: r.final_at,
            custody,
        })
    }
}

/// The requests of `ids` (of any chain), in the order of `ids`; ids of no request are
/// left out (a repeated id is returned again). One statement; reads the database only.
///
/// # Errors
/// [`TxqError::Store`] when the database fails or a row does not decode (a verdict of
/// a kind this version does not know included).
pub async fn requests(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<Vec<RequestView>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    store::requests_view(db, ids)
        .await?
        .into_iter()
        .map(RequestView::try_from)
        .collect()
}
