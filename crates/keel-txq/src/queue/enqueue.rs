//! Enqueue: a [`TxRequest`] with its [`EnqueueOptions`] is validated and recorded,
//! idempotently by (chain, sender, key) — through the enqueue combiner (one `INSERT` for
//! concurrent enqueues) or inside the caller's transaction.

use super::{TxQueue, metrics};
use crate::store::{self, OwnedNewRequest};
use crate::{Result, TxqError};
use alloy::primitives::{Address, Bytes};
use keel_units::Wei;
use std::time::Duration;
use uuid::Uuid;

/// A transaction to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxRequest {
    /// The sender; a [`crate::TxSigner`] for it must be registered before its requests sign.
    pub sender: Address,
    /// Unique per (chain, sender), 1..=255 characters.
    pub idempotency_key: String,
    /// Recipient; `None` creates a contract.
    pub to: Option<Address>,
    /// Native value in wei.
    pub value: Wei,
    /// Calldata (the queue does not add the attribution suffix; the caller does, once).
    pub data: Bytes,
    /// Fixed gas limit; `None` estimates it (`eth_estimateGas`, with the authorization
    /// list) before signing. With authorizations, a fixed limit must include EIP-7702's
    /// 25,000 gas per authorization (`PER_EMPTY_ACCOUNT_COST`).
    pub gas_limit: Option<u64>,
    /// EIP-7702 authorizations (each signed by its authority, the account whose code
    /// is set). Empty: an EIP-1559 transaction; otherwise the request is sent as a
    /// type-4 (SetCode) transaction carrying them, which needs `to` and a local signer
    /// (a custody sender's provider cannot send one: [`TxqError::InvalidRequest`]
    /// `("authorization_list")` at enqueue). The chain skips an authorization whose
    /// chain id, nonce or signature no longer holds; the transaction is still valid.
    pub authorization_list: Vec<alloy::eips::eip7702::SignedAuthorization>,
}

/// Options of [`TxQueue::enqueue_with`]. `Default` is what [`TxQueue::enqueue`] uses: no
/// funding pause.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    /// Enables the funding pause. When the sender cannot pay for the request (balance <
    /// gas limit × max fee per gas + value, in wei) the request waits in
    /// `waiting_funding` with a [`crate::FundingRequest`] instead of failing `GAS_REQUIRED`,
    /// and resumes by itself once the balance suffices.
    ///
    /// The duration counts from the **first detection** of missing funds (not from
    /// enqueue): the deadline, database clock, is fixed then and never moves, even if
    /// the request resumes and later waits again. Past it the request settles
    /// `Failed { code: "FUNDING_DEADLINE_EXPIRED" }`. Millisecond resolution.
    /// `None` (the default): no pause, the request fails `GAS_REQUIRED`.
    pub funding_pause: Option<Duration>,
}

impl EnqueueOptions {
    /// Options with a funding pause of `deadline` (counted from the first detection of
    /// missing funds).
    pub fn funding_pause(deadline: Duration) -> Self {
        Self {
            funding_pause: Some(deadline),
        }
    }
}

impl TxQueue {
    /// Records a request without a funding pause, idempotently by (chain, sender, key).
    /// Returns its id. Same as [`TxQueue::enqueue_with`] with `EnqueueOptions::default()`.
    ///
    /// # Errors
    /// [`TxqError::IdempotencyConflict`] when the key exists with another payload (or
    /// with a funding pause); [`TxqError::InvalidRequest`] for an empty or over-long key
    /// or a zero gas limit.
    pub async fn enqueue(&self, req: &TxRequest) -> Result<Uuid> {
        self.enqueue_with(req, &EnqueueOptions::default()).await
    }

    /// Records a request with `opts`, idempotently by (chain, sender, key). Returns its
    /// id. The options are part of the payload: the same key with another funding pause
    /// is a conflict.
    ///
    /// # Errors
    /// [`TxqError::IdempotencyConflict`] when the key exists with another payload or
    /// other options; [`TxqError::InvalidRequest`] for an empty or over-long key
    /// (`idempotency_key`), a zero gas limit (`gas_limit`), a funding pause longer
    /// than `i64::MAX` milliseconds (`funding_pause`), or a contract creation from a
    /// custody sender (`to`).
    pub async fn enqueue_with(&self, req: &TxRequest, opts: &EnqueueOptions) -> Result<Uuid> {
        let owned = self.new_request(req, opts)?;
        // Concurrent enqueues of this process share one INSERT (group commit); this
        // returns once this request's row has committed.
        let inserted = self
            .enqueues
            .submit(owned.clone())
            .await
            // The answer was lost (runtime shutting down): the row may or may not
            // exist; a retry with the same key tells.
            .ok_or(TxqError::Store(keel_store::StoreError::Transient {
                kind: keel_store::TransientKind::ConnectionLost,
                sqlstate: None,
            }))??;
        let new = owned.borrowed();
        if inserted {
            metrics::enqueued(self.chain_id);
            self.wake.notify_one();
            return Ok(new.id);
        }
        self.existing_or_conflict(&self.db, &new).await
    }

    /// [`TxQueue::enqueue_with`] inside the caller's transaction `conn`: the request
    /// row commits (or rolls back) with whatever else the caller writes there — for a
    /// workflow, the link that routes the request's verdict to it, so no verdict can
    /// settle before its link exists. One plain `INSERT` (no group commit). The queue
    /// is not woken (it sees the row at its next round, or call [`TxQueue::wake`] after
    /// the commit).
    ///
    /// # Errors
    /// As [`TxQueue::enqueue_with`]. A store error leaves `conn`'s transaction aborted:
    /// roll it back.
    pub async fn enqueue_in(
        &self,
        conn: &mut sqlx::PgConnection,
        req: &TxRequest,
        opts: &EnqueueOptions,
    ) -> Result<Uuid> {
        let owned = self.new_request(req, opts)?;
        let new = owned.borrowed();
        if store::request_insert(&mut *conn, &new).await? {
            metrics::enqueued(self.chain_id);
            return Ok(new.id);
        }
        self.existing_or_conflict(&mut *conn, &new).await
    }

    /// Validates `req` and `opts` into a row to insert.
    fn new_request(&self, req: &TxRequest, opts: &EnqueueOptions) -> Result<OwnedNewRequest> {
        let key_len = req.idempotency_key.chars().count();
        if key_len == 0 || key_len > 255 {
            return Err(TxqError::InvalidRequest("idempotency_key"));
        }
        if req.to.is_none() && self.custody.contains_key(&req.sender) {
            // A custody provider's contract call needs a destination.
            return Err(TxqError::InvalidRequest("to"));
        }
        let authorization_list = if req.authorization_list.is_empty() {
            None
        } else if self.custody.contains_key(&req.sender) {
            // A custody provider's contract call carries no authorization list.
            return Err(TxqError::InvalidRequest("authorization_list"));
        } else if req.to.is_none() {
            // EIP-7702: a SetCode transaction cannot create a contract.
            return Err(TxqError::InvalidRequest("to"));
        } else {
            Some(
                serde_json::to_value(&req.authorization_list)
                    .map_err(|_| TxqError::InvalidRequest("authorization_list"))?,
            )
        };
        let gas_limit = match req.gas_limit {
            Some(0) => return Err(TxqError::InvalidRequest("gas_limit")),
            Some(g) => Some(i64::try_from(g).map_err(|_| TxqError::InvalidRequest("gas_limit"))?),
            None => None,
        };
        let funding_pause_ms = opts
            .funding_pause
            .map(|d| i64::try_from(d.as_millis()))
            .transpose()
            .map_err(|_| TxqError::InvalidRequest("funding_pause"))?;
        let owned = OwnedNewRequest {
            id: Uuid::new_v4(),
            chain_id: self.chain_id,
            sender: req.sender.to_vec(),
            key: req.idempotency_key.clone(),
            to: req.to.map(|a| a.to_vec()),
            value_wei: req.value.get().to_string(),
            calldata: req.data.to_vec(),
            gas_limit,
            funding_pause_ms,
            // The enqueuing span (a workflow segment's step): the request's broadcast
            // and settlement spans join its trace (`None` without trace export).
            trace_context: keel_service::trace::current_traceparent(),
            authorization_list,
        };
        Ok(owned)
    }

    /// The id of the request already recorded under `new`'s key when it has the same
    /// payload; [`TxqError::IdempotencyConflict`] otherwise.
    async fn existing_or_conflict(
        &self,
        db: impl sqlx::PgExecutor<'_>,
        new: &store::NewRequest<'_>,
    ) -> Result<Uuid> {
        let existing = store::request_by_key(db, self.chain_id, new.sender, new.key)
            .await?
            .ok_or(TxqError::NotFound)?;
        let same = existing.to_address.as_ref().map(|a| a.0.as_slice()) == new.to
            && existing.value_wei == new.value_wei
            && existing.calldata == new.calldata
            && existing.gas_limit == new.gas_limit
            && existing.funding_pause_ms == new.funding_pause_ms
            && existing.authorization_list.as_ref() == new.authorization_list;
        if same {
            Ok(existing.id)
        } else {
            Err(TxqError::IdempotencyConflict)
        }
    }
}
