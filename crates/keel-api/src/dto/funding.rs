//! Funding requests and EntryPoint deposit requests.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// An open funding request: an operation's transaction waits until its sender holds
/// enough native currency for gas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FundingRequest {
    /// The operation that waits.
    pub operation_id: Uuid,
    /// Its workflow step.
    pub step: String,
    /// The transaction-queue request that waits.
    pub request_id: Uuid,
    /// EIP-155 chain id (decimal string).
    #[schema(example = "31337")]
    pub chain_id: String,
    /// Where to send the funds: the transaction's sender (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// The shortfall in wei (decimal string) at the last check.
    pub required_wei: String,
    /// After this instant (RFC 3339, UTC) the operation fails
    /// `FUNDING_DEADLINE_EXPIRED`.
    pub deadline: DateTime<Utc>,
    /// The gas limit of the computation, units of gas.
    pub gas_limit: u64,
    /// The max fee per gas of the computation, wei per gas (decimal string).
    pub max_fee_per_gas_wei: String,
    /// The transaction's native value, wei (decimal string).
    pub value_wei: String,
    /// When the transaction was queued (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When the request last changed (RFC 3339, UTC; the last funding check included).
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/funding-requests`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FundingRequestList {
    /// The caller's open funding requests, oldest first.
    pub funding_requests: Vec<FundingRequest>,
    /// Open funding requests of Keel's SponsorPaymaster deposit at the EntryPoint (the
    /// paymaster deposit runway, docs/aa.md), oldest first; the platform's, the same for
    /// every organization.
    #[serde(default)]
    pub entry_point_deposits: Vec<EntryPointDepositRequest>,
    /// The caller's transactions held up behind an open funding request of their
    /// sender (a sender's transactions are sent in order, so one that waits for funds
    /// holds up the later ones), oldest first. Funding the sender releases them.
    #[serde(default)]
    pub queued_behind_funding: Vec<QueuedBehindFunding>,
}

/// A transaction `queued` behind an open funding request of its sender: it needs no
/// funds reported of its own yet (its cost is checked when its turn comes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueuedBehindFunding {
    /// The operation that waits.
    pub operation_id: Uuid,
    /// Its workflow step.
    pub step: String,
    /// The transaction-queue request that waits.
    pub request_id: Uuid,
    /// EIP-155 chain id (decimal string).
    #[schema(example = "31337")]
    pub chain_id: String,
    /// The sender whose funding releases it (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// The operation it waits behind, when it is the caller's (`null`: another
    /// organization's, on the same sender).
    pub queued_behind: Option<Uuid>,
    /// The queue request it waits behind: the `requestId` of the sender's funding
    /// request (listed in `fundingRequests` when it is the caller's).
    pub queued_behind_request_id: Uuid,
    /// When the transaction was queued (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
}

/// A funding request of the SponsorPaymaster's **EntryPoint deposit**: its deposit
/// (`EntryPoint.balanceOf(paymaster)`) is below the configured minimum
/// (`aa.runwayMinimumWei`). Fund it with `EntryPoint.depositTo(paymaster)` (value =
/// at least `requiredWei`); ETH sent to the paymaster's address does not count. Closed
/// by the next check that sees the deposit at the minimum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryPointDepositRequest {
    /// EIP-155 chain id (decimal string).
    #[schema(example = "31337")]
    pub chain_id: String,
    /// Where the funds go: the EntryPoint (resolved address, EIP-55 checksummed),
    /// credited to `paymaster` with `depositTo(paymaster)`.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub entry_point: String,
    /// The deposit's owner: Keel's SponsorPaymaster (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub paymaster: String,
    /// The deposit at the last check, wei (decimal string).
    pub deposit_wei: String,
    /// The configured minimum, wei (decimal string).
    pub minimum_wei: String,
    /// `minimumWei - depositWei` at the last check, wei (decimal string).
    pub required_wei: String,
    /// When the deposit was first seen below the minimum (RFC 3339, UTC).
    pub opened_at: DateTime<Utc>,
    /// The last check (RFC 3339, UTC).
    pub updated_at: DateTime<Utc>,
}
