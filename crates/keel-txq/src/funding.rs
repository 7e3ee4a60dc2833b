//! Funding requests: what a request paused in `waiting_funding` needs to proceed.

use crate::store::{self, FundingRow};
use crate::{Result, TxqError};
use alloy::primitives::{Address, U256};
use chrono::{DateTime, Utc};
use keel_store::{PgPool, StoreError};
use keel_units::{ChainId, Wei};
use serde::Serialize;
use uuid::Uuid;

/// The open funding request of a request in `waiting_funding`: send at least
/// `required_wei` to `address` before `deadline`, and the request resumes by itself.
///
/// Serialized in camelCase; wei amounts as decimal strings, the chain id as a decimal
/// string, the deadline as RFC 3339 (UTC), for example:
///
/// ```json
/// {"requestId":"6f1c…","chainId":"31337","address":"0xab…","requiredWei":"42000000000000",
///  "deadline":"2025-01-01T00:05:00Z","gasLimit":21000,"maxFeePerGasWei":"2000000000",
///  "valueWei":"0"}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FundingRequest {
    /// The paused request.
    pub request_id: Uuid,
    /// Its chain.
    pub chain_id: ChainId,
    /// Where to send the funds: the request's sender.
    pub address: Address,
    /// The shortfall in wei: `gas_limit × max_fee_per_gas_wei + value_wei − balance`,
    /// computed at the last check (on entering `waiting_funding`, then on every queue
    /// tick). Always > 0 while the request waits.
    pub required_wei: Wei,
    /// After this instant (database clock) the request settles
    /// `Failed { code: "FUNDING_DEADLINE_EXPIRED" }`. Fixed at the first detection of
    /// missing funds (detection + the request's funding pause); it never moves.
    pub deadline: DateTime<Utc>,
    /// The gas limit of the computation, units of gas (the request's fixed limit, or
    /// the estimate with headroom; a lower bound of 21,000 when the node could not
    /// estimate without funds — the next check recomputes it).
    pub gas_limit: u64,
    /// The max fee per gas of the computation, wei per gas (2 × base fee + priority fee
    /// at the last check; it follows the market).
    pub max_fee_per_gas_wei: Wei,
    /// The request's native value, wei.
    pub value_wei: Wei,
    /// When the request was enqueued (database clock).
    pub created_at: DateTime<Utc>,
    /// When the request's row last changed (the last funding check included).
    pub updated_at: DateTime<Utc>,
}

impl TryFrom<FundingRow> for FundingRequest {
    type Error = TxqError;

    fn try_from(r: FundingRow) -> Result<Self> {
        let wei = |s: &str| -> Result<Wei> {
            s.parse::<U256>()
                .map(Wei::new)
                .map_err(|_| TxqError::Store(StoreError::Decode))
        };
        Ok(Self {
            request_id: r.id,
            chain_id: r.chain_id,
            address: r.sender.0,
            required_wei: wei(&r.funding_required_wei)?,
            deadline: r.funding_deadline,
            gas_limit: u64::try_from(r.funding_gas_limit)
                .map_err(|_| TxqError::Store(StoreError::Decode))?,
            max_fee_per_gas_wei: wei(&r.funding_max_fee_wei)?,
            value_wei: wei(&r.value_wei)?,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// A request that is `queued` behind its sender's open funding request: it needs no
/// funds of its own yet (its cost is checked when its turn comes), but it cannot be
/// signed until the request it waits behind is funded (or fails its deadline). Funding
/// the address of [`FundingRequest`] `queued_behind` releases it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedBehindFunding {
    /// The blocked request (`queued`).
    pub request_id: Uuid,
    /// Its chain.
    pub chain_id: ChainId,
    /// Its sender: the address whose funding releases it.
    pub address: Address,
    /// The sender's oldest `waiting_funding` request, the one it waits behind.
    pub queued_behind: Uuid,
    /// When the request was enqueued (database clock).
    pub created_at: DateTime<Utc>,
}

/// Every request `queued` behind an open funding request (of every chain, or of
/// `chain_id`), oldest first: with [`funding_requests`], each request a funding wait
/// holds up, not only the first. Reads the database only.
///
/// # Errors
/// [`TxqError::Store`] when the database fails or a row does not decode.
pub async fn funding_queued_behind(
    db: &PgPool,
    chain_id: Option<ChainId>,
) -> Result<Vec<QueuedBehindFunding>> {
    let chain_id = match chain_id.map(|c| i64::try_from(c.get())).transpose() {
        Ok(c) => c,
        Err(_) => return Ok(Vec::new()),
    };
    Ok(store::funding_queued_behind(db, chain_id)
        .await?
        .into_iter()
        .map(|r| QueuedBehindFunding {
            request_id: r.id,
            chain_id: r.chain_id,
            address: r.sender.0,
            queued_behind: r.behind,
            created_at: r.created_at,
        })
        .collect())
}

/// Open funding requests (requests in `waiting_funding`) of every chain, or of
/// `chain_id` when given, oldest request first. Reads the database only (no node); the
/// amounts are those of each request's last check.
///
/// A chain id above `i64::MAX` has no requests (none can be recorded): an empty list.
///
/// # Errors
/// [`TxqError::Store`] when the database fails or a row does not decode.
pub async fn funding_requests(
    db: &PgPool,
    chain_id: Option<ChainId>,
) -> Result<Vec<FundingRequest>> {
    let chain_id = match chain_id.map(|c| i64::try_from(c.get())).transpose() {
        Ok(c) => c,
        Err(_) => return Ok(Vec::new()),
    };
    store::funding_open(db, chain_id, None)
        .await?
        .into_iter()
        .map(FundingRequest::try_from)
        .collect()
}
