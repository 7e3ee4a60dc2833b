//! What the workflows and their callers agree on: the inputs and outputs of every
//! workflow, the signal names, the approval decision and the typed failure
//! [`OpFailure`]. Every type here is journaled or stored as JSON (camelCase): renaming a
//! Rust field keeps its serde name.

use alloy::primitives::{Address, B256, U256};
use keel_durable::WorkflowFailure;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The code of an enqueue step that found its operation cancelled (journaled as that
/// step's result; the workflow then ends `cancelled`).
pub const CANCELLED: &str = "CANCELLED";

/// The signal an approval decision is delivered as.
pub const APPROVAL_SIGNAL: &str = "approval";

/// Prefix of the signal a transaction's verdict is delivered as (`tx.<link>`, the link
/// being the write's name, or `<write>#<attempt>` for a later attempt).
pub const TX_SIGNAL_PREFIX: &str = "tx.";

/// The typed failure of an operation (the workflow's `Error`). `detail` is value-free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpFailure {
    /// Stable code: `EXECUTION_REVERTED`, `GAS_REQUIRED`, `FUNDING_DEADLINE_EXPIRED`,
    /// `NONCE_CONSUMED_EXTERNALLY`, `APPROVAL_EXPIRED`, `APPROVAL_REJECTED`,
    /// `CHAIN_NOT_CONFIGURED`, `REJECTED`, ...
    pub code: String,
    /// Whether retrying the operation can help.
    pub retryable: bool,
    /// A value-free description.
    pub detail: String,
    /// The on-chain write that failed (`create-feed`, `mint`, ...), when a transaction
    /// did. Serialized as `step` (its stored name).
    #[serde(rename = "step")]
    pub write: Option<String>,
    /// The decoded revert reason (`Error(string)`) or custom error name, when the chain
    /// reported one. Contract texts, not caller input.
    pub reason: Option<String>,
}

impl OpFailure {
    /// A failure with `code`, `retryable` and a value-free `detail`, not tied to a write.
    pub fn new(code: &str, retryable: bool, detail: &str) -> Self {
        Self {
            code: code.to_owned(),
            retryable,
            detail: detail.to_owned(),
            write: None,
            reason: None,
        }
    }
}

/// The failure type of every workflow body here.
pub(crate) type Failure = WorkflowFailure<OpFailure>;

/// A confirmed transaction of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Landed {
    /// The hash of the attempt that mined.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
}

/// Input of `asset.create` (built by the operations service from the request and the
/// asset's template).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateInput {
    /// The operation.
    pub operation_id: Uuid,
    /// The asset (its 16 bytes, left-padded, are the on-chain asset id).
    pub asset_id: Uuid,
    /// EIP-155 chain id (from the template).
    pub chain_id: u64,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// Decimals of the feed's answers (from the template).
    pub price_decimals: u8,
    /// The first observation: the initial price scaled by `price_decimals`, as a
    /// decimal integer string (an `int256` answer).
    pub price_answer: String,
    /// Staleness bound installed on the `PriceResolver`, seconds (from the template).
    pub staleness_bound_seconds: u64,
    /// Funding pause deadline, seconds, when the template enables the pause.
    pub funding_deadline_seconds: Option<u64>,
}

/// Output of `asset.create`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateOutput {
    /// The token contract.
    pub token: Address,
    /// The price feed contract.
    pub feed: Address,
    /// The index block that showed the asset (read-after-write).
    pub indexed_block: u64,
}

/// The token operation of a [`TokenOpInput`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum TokenAction {
    /// `AssetToken.mint(recipient, amount)`.
    Mint {
        /// The receiver of the tokens (serialized as `to`, its journaled name).
        #[serde(rename = "to")]
        recipient: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.transfer(recipient, amount)` from the operator's (issuer's) holdings.
    Transfer {
        /// The receiver of the tokens (serialized as `to`, its journaled name).
        #[serde(rename = "to")]
        recipient: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.pause()`.
    Pause,
    /// `AssetToken.unpause()`.
    Unpause,
}

/// Input of the token operations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOpInput {
    /// The operation.
    pub operation_id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The token contract.
    pub token: Address,
    /// What to do.
    pub action: TokenAction,
    /// When set, the operation waits for an approval this many seconds before it fails
    /// `APPROVAL_EXPIRED`.
    pub approval_ttl_seconds: Option<u64>,
    /// Funding pause deadline, seconds, when the template enables the pause.
    pub funding_deadline_seconds: Option<u64>,
}

/// Output of the token operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOpOutput {
    /// The transaction.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
    /// The index block that reflects it (read-after-write).
    pub indexed_block: u64,
}

/// An approval decision (the payload of the [`APPROVAL_SIGNAL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// Approved (true) or rejected (false).
    pub approved: bool,
    /// The deciding API key.
    pub api_key_id: Uuid,
}

/// The on-chain asset id of a Keel asset: its UUID's 16 bytes, left-padded to 32.
pub fn onchain_asset_id(asset_id: Uuid) -> B256 {
    B256::left_padding_from(asset_id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_ids_are_left_padded_uuids() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let b = onchain_asset_id(id);
        assert!(b[..16].iter().all(|x| *x == 0));
        assert_eq!(&b[16..], id.as_bytes());
    }

    /// The Rust names changed, the journaled JSON names did not.
    #[test]
    fn renamed_fields_keep_their_journaled_names() {
        let action = TokenAction::Mint {
            recipient: Address::repeat_byte(1),
            amount: U256::from(5u64),
        };
        let v = serde_json::to_value(&action).unwrap();
        assert_eq!(v["type"], "mint");
        assert!(v.get("to").is_some(), "{v}");
        let mut f = OpFailure::new("GAS_REQUIRED", true, "d");
        f.write = Some("mint".into());
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["step"], "mint");
    }
}
