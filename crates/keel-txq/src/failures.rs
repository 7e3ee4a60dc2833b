//! Failed broadcasts: what went wrong the last time a request's transaction was sent
//! without a node accepting it (issue 16, class 2; `migrations/0018`).

use crate::Result;
use crate::store;
use chrono::{DateTime, Utc};
use keel_store::PgPool;
use serde::Serialize;
use std::collections::HashMap;
use uuid::Uuid;

/// The last failed broadcast of a request, for the operation view.
///
/// A broadcast fails when no node accepted the attempt (nor said it already knew it)
/// and the answer did not settle the request: the request stays in flight and the same
/// bytes (or a replacement) go out again. Serialized in camelCase, for example
/// `{"class":"internal","at":"2025-01-01T00:05:00Z","failures":12}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BroadcastFailure {
    /// The error class of the last failure, from a bounded set: a
    /// [`keel_chain::NodeErrorKind`] code (`internal`, `other`, `rate_limited`,
    /// `nonce_too_high`, `replacement_underpriced`, `fee_too_low`,
    /// `insufficient_funds`, ...) when a node answered, `unavailable` when no upstream
    /// answered at the transport level.
    pub class: String,
    /// When it failed (database clock).
    pub at: DateTime<Utc>,
    /// Failed broadcasts of the request so far.
    pub failures: u32,
}

/// The last failed broadcast of each of `ids` that has had one (requests of any chain;
/// ids without a failure, or unknown, are absent from the map). One statement.
///
/// # Errors
/// [`crate::TxqError::Store`] when the database fails.
pub async fn broadcast_failures(
    db: &PgPool,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, BroadcastFailure>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(store::broadcast_errors_of(db, ids)
        .await?
        .into_iter()
        .map(|r| {
            (
                r.id,
                BroadcastFailure {
                    class: r.last_broadcast_error,
                    at: r.last_broadcast_error_at,
                    failures: u32::try_from(r.broadcast_failures).unwrap_or(0),
                },
            )
        })
        .collect())
}
