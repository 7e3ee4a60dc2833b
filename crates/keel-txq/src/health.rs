//! Queue health for Platform Status: per (chain, sender) what is waiting, in flight and
//! how old, read from the database only ([`queue_health`]).

use crate::store;
use crate::{Result, TxqError};
use alloy::primitives::Address;
use chrono::{DateTime, Utc};
use keel_store::StoreError;
use keel_units::ChainId;

/// One (chain, sender) of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderHealth {
    /// The chain.
    pub chain_id: ChainId,
    /// The sender (an operator address of this installation, not an organization's).
    pub sender: Address,
    /// The next nonce the queue will assign.
    pub next_nonce: u64,
    /// Unsettled requests (`queued`, `waiting_funding`, `signed`, `broadcast`).
    pub depth: u64,
    /// Of them, paused in `waiting_funding`.
    pub waiting_funding: u64,
    /// Of them, signed or broadcast and not settled.
    pub in_flight: u64,
    /// When the oldest unsettled request was enqueued (database clock).
    pub oldest_unsettled_at: Option<DateTime<Utc>>,
    /// Replacement attempts (fee bumps, attempt > 1) created in the last hour.
    pub replacements_last_hour: u64,
    /// The sender's balance at the node's `pending` block, wei, as a runner's queue
    /// last read it (every [`crate::BALANCE_REFRESH`] for each registered sender);
    /// `None` before any runner registered it.
    pub balance_wei: Option<keel_units::Wei>,
    /// When that balance was read (database clock).
    pub balance_checked_at: Option<DateTime<Utc>>,
}

/// Every sender the queue knows (`txq_sender`, and every sender a runner registered:
/// `txq_sender_balance`), by chain and address: depth, waiting funding, in flight,
/// oldest unsettled, replacements in the last hour, last seen balance. One statement;
/// no node is asked. Open funding requests: [`crate::funding_requests`].
///
/// # Errors
/// [`TxqError::Store`] when the database fails or a row does not decode.
pub async fn queue_health(db: &keel_store::PgPool) -> Result<Vec<SenderHealth>> {
    let decode = |_| TxqError::Store(StoreError::Decode);
    store::senders_health(db)
        .await?
        .into_iter()
        .map(|r| {
            Ok(SenderHealth {
                chain_id: r.chain_id,
                sender: r.sender.0,
                next_nonce: u64::try_from(r.next_nonce).map_err(decode)?,
                depth: u64::try_from(r.depth).map_err(decode)?,
                waiting_funding: u64::try_from(r.waiting_funding).map_err(decode)?,
                in_flight: u64::try_from(r.in_flight).map_err(decode)?,
                oldest_unsettled_at: r.oldest_unsettled_at,
                replacements_last_hour: u64::try_from(r.replacements_last_hour).map_err(decode)?,
                balance_wei: r
                    .balance_wei
                    .as_deref()
                    .map(str::parse::<keel_units::Wei>)
                    .transpose()
                    .map_err(|_| TxqError::Store(StoreError::Decode))?,
                balance_checked_at: r.balance_checked_at,
            })
        })
        .collect()
}

/// Live custody submissions of one (chain, provider, phase, provider status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustodyCount {
    /// The chain.
    pub chain_id: ChainId,
    /// The provider's bounded name (`fireblocks`).
    pub provider: String,
    /// The submission phase (`ready`, `creating`, `in_doubt`, `submitted`,
    /// `cancelling`).
    pub phase: String,
    /// The provider's last status (Fireblocks name); `None` before the first read.
    pub status: Option<String>,
    /// How many submissions.
    pub live: u64,
}

/// The custody submission that waits longest for an approval at its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingApproval {
    /// The queue request.
    pub request_id: uuid::Uuid,
    /// The chain.
    pub chain_id: ChainId,
    /// The provider's bounded name.
    pub provider: String,
    /// The provider's transaction id.
    pub provider_tx_id: Option<String>,
    /// `PENDING_AUTHORIZATION` or `PENDING_3RD_PARTY_MANUAL_APPROVAL`.
    pub status: Option<String>,
    /// Since when it has had that status (database clock).
    pub since: DateTime<Utc>,
}

/// Custody health for Platform Status: live submissions (not settled, not superseded)
/// by chain, provider, phase and provider status, and the oldest pending approval. Two
/// statements; no provider is asked.
///
/// # Errors
/// [`TxqError::Store`] when the database fails or a row does not decode.
pub async fn custody_health(
    db: &keel_store::PgPool,
) -> Result<(Vec<CustodyCount>, Option<PendingApproval>)> {
    let decode = |_| TxqError::Store(StoreError::Decode);
    let counts = store::custody_counts(db)
        .await?
        .into_iter()
        .map(|r| {
            Ok(CustodyCount {
                chain_id: r.chain_id,
                provider: r.provider,
                phase: r.phase.as_str().to_owned(),
                status: r.status,
                live: u64::try_from(r.live).map_err(decode)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let approvals = keel_custody::all_approval_statuses();
    let oldest = store::custody_oldest_approval(db, &approvals)
        .await?
        .map(|r| {
            Ok::<_, TxqError>(PendingApproval {
                request_id: r.request_id,
                chain_id: r.chain_id,
                provider: r.provider,
                provider_tx_id: r.provider_tx_id,
                status: r.status,
                since: r.since,
            })
        })
        .transpose()?;
    Ok((counts, oldest))
}
