//! Settlement verdicts: the typed, final outcome of a request.

use alloy::primitives::{B256, Bytes};
use serde::{Deserialize, Serialize};

/// One signed attempt of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// 1-based attempt number.
    pub attempt: i32,
    /// The nonce it used.
    pub nonce: u64,
    /// Its transaction hash.
    pub hash: B256,
}

/// The final outcome of a request (stored as JSON in `txq_request.verdict`, tagged by
/// `kind`). Integers that can exceed 2^53 are decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
#[non_exhaustive]
pub enum SettlementVerdict {
    /// Mined with status 1 at the confirmation depth.
    #[serde(rename_all = "camelCase")]
    Confirmed {
        /// Block number of the receipt.
        block: u64,
        /// Hash of the attempt that mined.
        hash: B256,
        /// Gas used (units of gas).
        gas_used: u64,
        /// Effective gas price, wei per gas, decimal string.
        effective_gas_price: String,
        /// Every attempt.
        attempts: Vec<AttemptRecord>,
    },
    /// Mined with status 0 at the confirmation depth.
    #[serde(rename_all = "camelCase")]
    Reverted {
        /// Block number of the receipt.
        block: u64,
        /// Hash of the attempt that mined.
        hash: B256,
        /// The `Error(string)` reason when the node could tell (re-executed with
        /// `eth_call` at the parent block); `None` otherwise.
        reason: Option<String>,
        /// The raw revert data from that re-execution, for custom errors.
        revert_data: Option<Bytes>,
        /// Every attempt.
        attempts: Vec<AttemptRecord>,
    },
    /// Never took effect. `code`: `EXECUTION_REVERTED` (gas estimation reverted;
    /// `revert_data` holds the data), `GAS_REQUIRED` (the sender cannot pay gas ×
    /// max fee + value, in wei, and has no funding pause — or a node kept refusing the
    /// signed transaction for insufficient funds), `FUNDING_DEADLINE_EXPIRED` (the
    /// request waited in `waiting_funding` past its deadline; no nonce was used),
    /// `NONCE_CONSUMED_EXTERNALLY`, `INTRINSIC_GAS_TOO_LOW`,
    /// `EXCEEDS_BLOCK_GAS_LIMIT`, `REJECTED` (another node refusal), `WITHDRAWN` (the
    /// request was withdrawn before it was signed: [`crate::withdraw_by_key_prefix`]).
    #[serde(rename_all = "camelCase")]
    Failed {
        /// Stable code.
        code: String,
        /// Decoded `Error(string)` reason, when there is one.
        reason: Option<String>,
        /// Raw revert data, for contract-specific decoding.
        revert_data: Option<Bytes>,
        /// Every attempt (empty when it failed before signing).
        attempts: Vec<AttemptRecord>,
    },
}

impl SettlementVerdict {
    /// `confirmed`, `reverted` or `failed` (bounded metric label, `verdict_kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            SettlementVerdict::Confirmed { .. } => "confirmed",
            SettlementVerdict::Reverted { .. } => "reverted",
            SettlementVerdict::Failed { .. } => "failed",
        }
    }
}
