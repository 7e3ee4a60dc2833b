//! The API's JSON shapes (all camelCase).
//!
//! Request bodies are deserialized from these types. Responses are serialized by the
//! operations service's own view types (`keel_workflows::ops::OperationView`, ...);
//! the types here named like the responses (`Operation`, `Asset`, ...) are their
//! **mirrors** for the OpenAPI document: the unit tests deserialize fully populated
//! service views into them with `deny_unknown_fields`, so the document cannot drift
//! from what is served without a test failing.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------

/// `POST /v1/assets`: create an asset from one of the organization's templates. The
/// chain, price resolver and staleness bound come from the template, never from the
/// request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "name": "Example Fund Share", "symbol": "EFS", "decimals": 18,
    "templateId": "default", "initialPrice": "1.25"
}))]
pub struct CreateAssetRequest {
    /// ERC-20 name, 1 to 64 printable characters.
    pub name: String,
    /// ERC-20 symbol, 1 to 16 ASCII letters or digits.
    pub symbol: String,
    /// ERC-20 decimals, 0 to 36.
    #[schema(minimum = 0, maximum = 36)]
    pub decimals: u8,
    /// The id of one of the organization's asset templates.
    pub template_id: String,
    /// Initial price in quote units per token, as a **decimal string** (JSON numbers
    /// are refused), at most the template's price decimals of fractional digits,
    /// greater than zero.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$", example = "1.25")]
    pub initial_price: String,
}

/// `POST /v1/assets/{id}/mint` and `/transfer`: move `amount` token units to
/// `recipient`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "recipient": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "amount": "12.5"
}))]
pub struct TokenAmountRequest {
    /// Receiver: `0x` and 40 hex digits (an EIP-55 checksum is verified when the
    /// digits are mixed-case); not the zero address.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub recipient: String,
    /// Token units as a **decimal string** (JSON numbers are refused), greater than
    /// zero, at most the token's decimals of fractional digits.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$", example = "12.5")]
    pub amount: String,
}

/// The body of `pause`, `unpause`, `approve` and `reject`: empty, or `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

// ---------------------------------------------------------------------------------------
// Response mirrors
// ---------------------------------------------------------------------------------------

/// The state of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperationState {
    /// Accepted; waits behind another operation of its asset (see `queuedBehind`).
    Queued,
    /// Accepted and being worked on.
    Running,
    /// Waiting for something outside Keel (see `wait`).
    Waiting,
    /// Stopped on a transient failure; resumes by itself (see `error`).
    Suspended,
    /// Ended successfully (see `result`).
    Completed,
    /// Ended with a failure (see `error`).
    Failed,
    /// Ended by cancellation.
    Cancelled,
}

/// An operation's status (`GET /v1/operations/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Operation {
    /// Operation id.
    pub id: Uuid,
    /// `asset.create`, `asset.mint`, `asset.transfer`, `asset.pause` or `asset.unpause`.
    #[schema(example = "asset.create")]
    pub kind: String,
    /// The asset it acts on.
    pub asset_id: Uuid,
    /// Its state; `completed`, `failed` and `cancelled` are terminal.
    pub state: OperationState,
    /// For a `queued` operation: the operation of the same asset it waits behind (null
    /// otherwise).
    pub queued_behind: Option<Uuid>,
    /// What a `waiting` operation waits for (null otherwise).
    pub wait: Option<OperationWait>,
    /// When a cancel was requested (RFC 3339, UTC), or null. A transaction signed before
    /// the cancel runs to its verdict; `milestones.confirmed` lists what landed.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// The four milestones: accepted → submitted → confirmed → indexed.
    pub milestones: Milestones,
    /// The workflow's last progress snapshot (free-form JSON), or null.
    pub progress: Option<Value>,
    /// The result of a completed operation (free-form JSON, e.g. token and feed
    /// addresses and `indexedBlock`), or null.
    pub result: Option<Value>,
    /// The failure of a `failed` operation (or the transient reason while
    /// `suspended`), or null.
    pub error: Option<OperationError>,
}

/// The answer to an accepted `POST` (`202`, or `200` once terminal): the operation's
/// status plus `created` and `statusUrl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationAccepted {
    /// The operation's status.
    #[serde(flatten)]
    pub operation: Operation,
    /// False when the `Idempotency-Key` named an existing operation (a replay).
    pub created: bool,
    /// Where to poll the status: `/v1/operations/{id}` (also the `Location` header).
    #[schema(example = "/v1/operations/6f1c2a52-5b5e-4d43-9d1e-0c2f5d1e3a10")]
    pub status_url: String,
}

/// What a waiting operation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitFor {
    /// An approval decision (`POST /v1/operations/{id}/approve|reject`).
    Approval,
    /// A transaction's settlement.
    Transaction,
    /// Gas funds for the sender (see `GET /v1/funding-requests`).
    Funding,
    /// A timer.
    Timer,
}

/// The wait of a `waiting` operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationWait {
    /// What it waits for.
    #[serde(rename = "for")]
    pub waits_for: WaitFor,
    /// The deadline (RFC 3339, UTC), when there is one: an approval not decided by
    /// then fails the operation `APPROVAL_EXPIRED`; a funding wait not funded by then
    /// fails `FUNDING_DEADLINE_EXPIRED`.
    pub until: Option<DateTime<Utc>>,
    /// The workflow step whose transaction it waits for, if any.
    pub step: Option<String>,
    /// For a transaction wait: the error class of the last broadcast that no node
    /// accepted (`internal`, `unavailable`, `rate_limited`, `nonce_too_high`, ...), or
    /// null when every broadcast went through so far.
    pub last_broadcast_error: Option<String>,
}

/// Accepted → submitted → confirmed → indexed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Milestones {
    /// When the operation was accepted (RFC 3339, UTC).
    pub accepted: DateTime<Utc>,
    /// Every transaction signed (and, when `broadcast`, submitted), by step.
    pub submitted: Vec<TxMilestone>,
    /// Every transaction confirmed, by step, with its block.
    pub confirmed: Vec<TxMilestone>,
    /// The index block that reflects the operation, once read-after-write passed.
    pub indexed: Option<IndexedMilestone>,
}

/// A transaction of an operation step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TxMilestone {
    /// The workflow step (`deploy-token`, `create-feed`, `mint`, ...).
    pub step: String,
    /// The transaction hash (`0x` + 64 hex digits): the latest attempt's, the mined
    /// one once confirmed.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub tx_hash: Option<String>,
    /// The sender's nonce.
    pub nonce: Option<u64>,
    /// Whether a node accepted the transaction.
    pub broadcast: bool,
    /// The block number, once confirmed (null in `submitted`).
    pub block: Option<u64>,
}

/// The indexed milestone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexedMilestone {
    /// The Ledger Index block that reflects the operation.
    pub block: u64,
}

/// The failure of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationError {
    /// Stable code (`EXECUTION_REVERTED`, `APPROVAL_EXPIRED`, `APPROVAL_REJECTED`,
    /// `GAS_REQUIRED`, `FUNDING_DEADLINE_EXPIRED`, ...).
    pub code: String,
    /// Whether a retry can help.
    pub retryable: bool,
    /// Value-free description.
    pub detail: String,
    /// The decoded revert reason, when a transaction reverted.
    pub reason: Option<String>,
}

/// The lifecycle of an asset (from its `asset.create` operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AssetStatus {
    /// Its creation is in progress; token operations answer `409 ASSET_NOT_READY`.
    Creating,
    /// Created; mintable.
    Active,
    /// Its creation failed or was cancelled.
    Failed,
}

/// An asset: identity from Keel's records, on-chain state from the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Asset {
    /// Asset id.
    pub id: Uuid,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// The template it was created from.
    pub template_id: String,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// `creating`, `active` or `failed`.
    pub status: AssetStatus,
    /// Its `asset.create` operation.
    pub create_operation_id: Option<Uuid>,
    /// The token contract (EIP-55 checksummed), once deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub token_address: Option<String>,
    /// The price feed contract (EIP-55 checksummed), once deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub feed_address: Option<String>,
    /// Total supply in token units (decimal string), from the index.
    pub supply: Option<String>,
    /// Whether the token is paused, from the index.
    pub paused: Option<bool>,
    /// The feed's staleness bound in seconds (decimal string), from the index.
    pub staleness_bound_seconds: Option<String>,
    /// The feed's latest observation, from the index.
    pub latest_observation: Option<Observation>,
    /// The index block this view reflects (null before the index saw the chain).
    pub indexed_block: Option<u64>,
    /// True when the Ledger Index of the asset's chain is degraded (the chain
    /// reorganized below its finalized block; ingest stopped): the index state shown
    /// may include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
}

/// `GET /v1/assets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssetList {
    /// The caller's assets, oldest first (at most 1000).
    pub assets: Vec<Asset>,
}

/// A price observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Observation {
    /// The answer in the feed's decimals (signed integer string).
    pub answer: String,
    /// The round id (integer string).
    pub round_id: String,
    /// The round's timestamp, unix seconds (integer string).
    pub updated_at: String,
    /// The block of the observation.
    pub block: u64,
}

/// A holder's balance of an asset, from the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Balance {
    /// The asset.
    pub asset_id: Uuid,
    /// The holder (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// Token units (decimal string with the token's decimals).
    pub balance: String,
    /// Base units (decimal integer string).
    pub balance_base_units: String,
    /// The index block this balance reflects.
    pub indexed_block: u64,
    /// True when the Ledger Index of the asset's chain is degraded: the balance may
    /// include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
}

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
}

/// `GET /v1/funding-requests`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FundingRequestList {
    /// The caller's open funding requests, oldest first.
    pub funding_requests: Vec<FundingRequest>,
}

/// `GET /healthz` and `GET /readyz` when healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Address, B256, U256};
    use keel_workflows::ops::{
        AssetView, BalanceView, ErrorView, IndexedMilestone as IM, Milestones as MS,
        ObservationView, OperationView, TxMilestone as TM, WaitView,
    };

    fn round_trip<T: serde::de::DeserializeOwned>(v: &impl Serialize) -> T {
        let json = serde_json::to_value(v).unwrap();
        serde_json::from_value(json).unwrap()
    }

    fn tx(block: Option<u64>) -> TM {
        TM {
            step: "mint".into(),
            tx_hash: Some(B256::repeat_byte(0xab)),
            nonce: Some(7),
            broadcast: true,
            block,
        }
    }

    #[test]
    fn operation_mirror_matches_the_served_view() {
        for (state, wait) in [
            ("waiting", Some("approval")),
            ("waiting", Some("funding")),
            ("completed", None),
            ("queued", None),
            ("cancelled", None),
        ] {
            let full = OperationView {
                id: Uuid::new_v4(),
                kind: "asset.mint".into(),
                asset_id: Uuid::new_v4(),
                state,
                queued_behind: None,
                cancel_requested_at: Some(Utc::now()),
                wait: wait.map(|w| WaitView {
                    waits_for: w,
                    until: Some(Utc::now()),
                    step: Some("mint".into()),
                    last_broadcast_error: Some("internal".into()),
                }),
                milestones: MS {
                    accepted: Utc::now(),
                    submitted: vec![tx(None)],
                    confirmed: vec![tx(Some(12))],
                    indexed: Some(IM { block: 13 }),
                },
                progress: Some(serde_json::json!({"phase": "x"})),
                result: Some(serde_json::json!({"indexedBlock": 13})),
                error: Some(ErrorView {
                    code: "EXECUTION_REVERTED".into(),
                    retryable: false,
                    detail: "reverted".into(),
                    reason: Some("nope".into()),
                }),
            };
            let m: Operation = round_trip(&full);
            assert_eq!(m.id, full.id);
            let empty = OperationView {
                wait: None,
                progress: None,
                result: None,
                error: None,
                milestones: MS {
                    accepted: Utc::now(),
                    submitted: vec![],
                    confirmed: vec![],
                    indexed: None,
                },
                ..full
            };
            let _: Operation = round_trip(&empty);
        }
        for s in [
            "running",
            "waiting",
            "suspended",
            "completed",
            "failed",
            "cancelled",
        ] {
            let _: OperationState = serde_json::from_value(serde_json::json!(s)).unwrap();
        }
        for s in ["approval", "transaction", "funding", "timer"] {
            let _: WaitFor = serde_json::from_value(serde_json::json!(s)).unwrap();
        }
    }

    #[test]
    fn asset_balance_and_funding_mirrors_match() {
        for status in ["creating", "active", "failed"] {
            let full = AssetView {
                id: Uuid::new_v4(),
                name: "A".into(),
                symbol: "A".into(),
                decimals: 18,
                template_id: "t".into(),
                chain_id: 31337,
                status,
                create_operation_id: Some(Uuid::new_v4()),
                token_address: Some(Address::repeat_byte(1)),
                feed_address: Some(Address::repeat_byte(2)),
                supply: Some("1.5".into()),
                paused: Some(false),
                staleness_bound_seconds: Some("3600".into()),
                latest_observation: Some(ObservationView {
                    answer: "125".into(),
                    round_id: "1".into(),
                    updated_at: "1700000000".into(),
                    block: 9,
                }),
                indexed_block: Some(10),
                index_degraded: false,
            };
            let _: Asset = round_trip(&full);
            let empty = AssetView {
                create_operation_id: None,
                token_address: None,
                feed_address: None,
                supply: None,
                paused: None,
                staleness_bound_seconds: None,
                latest_observation: None,
                indexed_block: None,
                index_degraded: true,
                ..full
            };
            let _: Asset = round_trip(&empty);
        }
        let b = BalanceView {
            asset_id: Uuid::new_v4(),
            address: Address::repeat_byte(3),
            balance: "1.5".into(),
            balance_base_units: "1500".into(),
            indexed_block: 4,
            index_degraded: false,
        };
        let _: Balance = round_trip(&b);
        let f = crate::handlers::FundingRequestItem {
            operation_id: Uuid::new_v4(),
            step: "mint".into(),
            request: keel_txq::FundingRequest {
                request_id: Uuid::new_v4(),
                chain_id: keel_units::ChainId(31337),
                address: Address::repeat_byte(4),
                required_wei: keel_units::Wei::new(U256::from(42u64)),
                deadline: Utc::now(),
                gas_limit: 21_000,
                max_fee_per_gas_wei: keel_units::Wei::new(U256::from(2u64)),
                value_wei: keel_units::Wei::new(U256::ZERO),
            },
        };
        let _: FundingRequest = round_trip(&f);
    }
}
