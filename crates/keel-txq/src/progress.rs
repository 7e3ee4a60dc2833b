//! The progress seam: a request's first broadcast and the opening of its funding
//! request are pushed to a [`ProgressSink`] inside the database transaction that
//! records them, like every verdict is pushed to a [`crate::SettlementSink`].
//!
//! | change | recorded by | what the sink gets |
//! |---|---|---|
//! | `signed` → `broadcast` (a node first accepted an attempt) | the broadcast stage, one guarded `UPDATE` for the accepted requests of a round | [`Progress::Broadcast`]: the request, its key, the accepted attempt's hash and nonce |
//! | `queued` → `waiting_funding` (the sender cannot pay, the request has a funding pause) | the sender pass | [`Progress::FundingRequested`]: the request, its key, the address to fund, the required wei, the deadline |
//! | a custody submission first read `PENDING_AUTHORIZATION` (an approval wait at the provider) | the custody pass, with the status it records | [`Progress::CustodyApprovalRequested`]: the request, its key |
//!
//! Only the rows the guarded update moved are passed (never one twice for one change);
//! [`ProgressSink::record`] runs on the transaction's connection, after the update and
//! before the commit, so what it writes commits with the change or not at all.
//!
//! A failing sink never holds the queue back: the transaction rolls back, the queue
//! counts `keel_txq_progress_sink_failures_total{chain_id, change}` (`change`:
//! `broadcast`, `funding`), logs a WARN and records the changes again at once, one
//! request per transaction with the sink; a request the sink still refuses is recorded
//! **without** the sink (the node accepted the transaction: the queue's state must say
//! so), so its sink misses that change (keel-workflows then reports it with the
//! operation's next change). Without a sink each change is one autocommit statement.

use alloy::primitives::{Address, B256};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use keel_units::Wei;
use uuid::Uuid;

/// One change of a request recorded in the current transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<'a> {
    /// A node accepted an attempt of the request for the first time (`signed` →
    /// `broadcast`).
    Broadcast {
        /// The request's id.
        request_id: Uuid,
        /// Its idempotency key.
        idempotency_key: &'a str,
        /// The hash of the accepted attempt.
        hash: B256,
        /// Its nonce.
        nonce: u64,
    },
    /// The request opened a funding request (`queued` → `waiting_funding`): its sender
    /// cannot pay for it (see [`crate::FundingRequest`]). Offered again, with the
    /// current shortfall, at every later funding check while the request still waits
    /// (in the transaction that updates the shortfall), so a sink must treat a repeat
    /// as the same open request: a first report that failed or that the sink could not
    /// yet attribute is made on a later check.
    FundingRequested {
        /// The request's id.
        request_id: Uuid,
        /// Its idempotency key.
        idempotency_key: &'a str,
        /// Where to send funds: the sender.
        address: Address,
        /// The shortfall, wei.
        required_wei: Wei,
        /// After this instant (database clock) the request fails
        /// `FUNDING_DEADLINE_EXPIRED`.
        deadline: DateTime<Utc>,
    },
    /// A custody sender's submission was first read waiting for an approval at its
    /// provider (`PENDING_AUTHORIZATION`), in the transaction that records that status
    /// (issue 32 §5: the approval wait is announced, not only visible).
    CustodyApprovalRequested {
        /// The request's id.
        request_id: Uuid,
        /// Its idempotency key.
        idempotency_key: &'a str,
    },
}

impl Progress<'_> {
    /// The request the change is of.
    pub fn request_id(&self) -> Uuid {
        match self {
            Self::Broadcast { request_id, .. }
            | Self::FundingRequested { request_id, .. }
            | Self::CustodyApprovalRequested { request_id, .. } => *request_id,
        }
    }

    /// The metric label of the change: `broadcast`, `funding` or `custody_approval`.
    pub fn change(&self) -> &'static str {
        match self {
            Self::Broadcast { .. } => "broadcast",
            Self::FundingRequested { .. } => "funding",
            Self::CustodyApprovalRequested { .. } => "custody_approval",
        }
    }
}

/// Receives a request's first broadcast and the opening of its funding request (again
/// at every funding check while it stays open, see [`Progress::FundingRequested`])
/// inside the transaction that records them.
///
/// `record` runs on `conn`, that transaction's connection, after the recording
/// statement and before the commit. It must not commit or roll back itself, and should
/// be quick (it holds the requests' row locks). `progress` is never empty.
///
/// # Errors
/// Any [`ProgressSinkError`] rolls the transaction back; the queue then records the
/// change again, one request at a time, and finally without the sink (see the module
/// docs).
pub trait ProgressSink: Send + Sync {
    /// Records `progress` on `conn` (see the trait docs).
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        progress: &'c [Progress<'c>],
    ) -> BoxFuture<'c, Result<(), ProgressSinkError>>;
}

/// A [`ProgressSink`] failed: its transaction was rolled back. Value-free message; the
/// cause is the error's source.
#[derive(Debug, thiserror::Error)]
#[error("the progress sink failed")]
pub struct ProgressSinkError {
    #[source]
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl ProgressSinkError {
    /// Wraps the sink's own error.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl From<sqlx::Error> for ProgressSinkError {
    fn from(e: sqlx::Error) -> Self {
        Self::new(e)
    }
}
