//! Settlement verdicts: the typed, final outcome of a request.

use alloy::primitives::{B256, Bytes};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

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
    /// Never took effect; `code` says why ([`FailureCode`]).
    #[serde(rename_all = "camelCase")]
    Failed {
        /// Stable code (JSON: the SCREAMING_SNAKE_CASE name, e.g. `"GAS_REQUIRED"`).
        code: FailureCode,
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

/// Why a request never took effect: the `code` of [`SettlementVerdict::Failed`].
/// Serialized (and stored in `txq_request.verdict`) as the SCREAMING_SNAKE_CASE name.
///
/// [`FailureCode::Unknown`] holds any other string. This version never emits it, and no
/// earlier one emitted another code (the codes below are all the queue ever wrote), but
/// instances of different versions share one database during a rolling upgrade: a
/// verdict written by a newer version with a code this one does not know still reads,
/// instead of failing the whole request's status.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum FailureCode {
    /// Gas estimation reverted; the verdict's `revert_data` holds the data (and `reason`
    /// the decoded `Error(string)`, when there is one).
    ExecutionReverted,
    /// The sender cannot pay gas × max fee + value (wei) and the request has no funding
    /// pause, or a node kept refusing the signed transaction for insufficient funds.
    GasRequired,
    /// The request waited in `waiting_funding` past its deadline; no nonce was used.
    FundingDeadlineExpired,
    /// Another transaction took the request's nonce. Written by earlier versions only:
    /// this one re-signs such a request at a fresh nonce once the other transaction is
    /// final (issue 32 §3); kept so their verdicts still read.
    NonceConsumedExternally,
    /// A node refused the transaction: intrinsic gas too low.
    IntrinsicGasTooLow,
    /// The transaction's gas limit exceeds the block gas limit: found before signing
    /// against the latest block's gas limit (no nonce assigned, the attempts empty), or
    /// a node refused the signed transaction for it.
    ExceedsBlockGasLimit,
    /// Another node refusal (gas estimation).
    Rejected,
    /// Withdrawn before it was signed ([`crate::withdraw_by_key_prefix`]).
    Withdrawn,
    /// Custody sender: the provider rejected the transaction (Fireblocks `REJECTED`,
    /// e.g. an approver said no); `reason` holds the provider's sub-status.
    CustodyRejected,
    /// Custody sender: the provider's policy blocked it (`BLOCKED`); `reason` holds the
    /// sub-status.
    CustodyBlocked,
    /// Custody sender: cancelled at the provider (`CANCELLED`) by someone other than
    /// the queue's silent-drop recovery; `reason` holds the sub-status.
    CustodyCancelled,
    /// Custody sender: the provider reports `FAILED` without a transaction on chain;
    /// `reason` holds the sub-status.
    CustodyFailed,
    /// Custody sender: the provider refused the create itself (HTTP 4xx other than
    /// credentials or a duplicate external id): nothing was created.
    CustodyRefused,
    /// Custody sender, a platform-scoped request (not an operation's write): its
    /// submission stayed pre-broadcast without a hash past the poll budget (a silent
    /// drop, which is recovered automatically only for organization-scoped writes); it
    /// was cancelled at the provider, the cancel confirmed, and nothing reached the
    /// chain.
    CustodyTimedOut,
    /// The request had settled `confirmed` or `reverted`, then a reorg took its
    /// transaction out of the chain and another transaction of its sender took its
    /// nonce on the final chain: none of its attempts can ever be mined, its effect is
    /// absent. Written over the earlier verdict by the watch that follows a settled
    /// write until its block is final (issue 32 §10); the queue does not re-send it
    /// (whether the operation is re-sent is the operation kind's rule, docs/architecture.md).
    ReorgedOut,
    /// Custody sender: the provider's approval (`PENDING_AUTHORIZATION`) did not come
    /// within the vault's approval deadline (`approvalDeadlineSecs`); the transaction
    /// was cancelled at the provider, the cancel confirmed, and nothing reached the
    /// chain (an approval given at the provider afterwards has nothing to approve).
    CustodyApprovalExpired,
    /// A code this version does not know (written by a newer one); never emitted.
    #[serde(untagged)]
    Unknown(String),
}

impl FailureCode {
    /// Every code this version emits.
    pub const KNOWN: [FailureCode; 16] = [
        FailureCode::ExecutionReverted,
        FailureCode::GasRequired,
        FailureCode::FundingDeadlineExpired,
        FailureCode::NonceConsumedExternally,
        FailureCode::IntrinsicGasTooLow,
        FailureCode::ExceedsBlockGasLimit,
        FailureCode::Rejected,
        FailureCode::Withdrawn,
        FailureCode::CustodyRejected,
        FailureCode::CustodyBlocked,
        FailureCode::CustodyCancelled,
        FailureCode::CustodyFailed,
        FailureCode::CustodyRefused,
        FailureCode::CustodyTimedOut,
        FailureCode::ReorgedOut,
        FailureCode::CustodyApprovalExpired,
    ];

    /// The stored name (`"GAS_REQUIRED"`, ...; an unknown code as stored).
    pub fn as_str(&self) -> &str {
        match self {
            FailureCode::ExecutionReverted => "EXECUTION_REVERTED",
            FailureCode::GasRequired => "GAS_REQUIRED",
            FailureCode::FundingDeadlineExpired => "FUNDING_DEADLINE_EXPIRED",
            FailureCode::NonceConsumedExternally => "NONCE_CONSUMED_EXTERNALLY",
            FailureCode::IntrinsicGasTooLow => "INTRINSIC_GAS_TOO_LOW",
            FailureCode::ExceedsBlockGasLimit => "EXCEEDS_BLOCK_GAS_LIMIT",
            FailureCode::Rejected => "REJECTED",
            FailureCode::Withdrawn => "WITHDRAWN",
            FailureCode::CustodyRejected => "CUSTODY_REJECTED",
            FailureCode::CustodyBlocked => "CUSTODY_BLOCKED",
            FailureCode::CustodyCancelled => "CUSTODY_CANCELLED",
            FailureCode::CustodyFailed => "CUSTODY_FAILED",
            FailureCode::CustodyRefused => "CUSTODY_REFUSED",
            FailureCode::CustodyTimedOut => "CUSTODY_TIMED_OUT",
            FailureCode::ReorgedOut => "REORGED_OUT",
            FailureCode::CustodyApprovalExpired => "CUSTODY_APPROVAL_EXPIRED",
            FailureCode::Unknown(s) => s,
        }
    }
}

impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureCode {
    type Err = std::convert::Infallible;

    /// A known name gives its variant; any other string [`FailureCode::Unknown`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(FailureCode::KNOWN
            .into_iter()
            .find(|c| c.as_str() == s)
            .unwrap_or_else(|| FailureCode::Unknown(s.to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::{AttemptRecord, FailureCode, SettlementVerdict};
    use alloy::primitives::{B256, Bytes};

    fn attempts() -> Vec<AttemptRecord> {
        vec![AttemptRecord {
            attempt: 1,
            nonce: 7,
            hash: B256::repeat_byte(0xab),
        }]
    }

    /// The JSON of every verdict kind, as stored in `txq_request.verdict` (these strings
    /// are the stored shape: they must never change).
    #[test]
    fn verdict_json_is_byte_identical_and_round_trips() {
        let h = "0xabababababababababababababababababababababababababababababababab";
        let cases = [
            (
                SettlementVerdict::Confirmed {
                    block: 12,
                    hash: B256::repeat_byte(0xab),
                    gas_used: 21000,
                    effective_gas_price: "1000000007".into(),
                    attempts: attempts(),
                },
                format!(
                    r#"{{"kind":"confirmed","block":12,"hash":"{h}","gasUsed":21000,"effectiveGasPrice":"1000000007","attempts":[{{"attempt":1,"nonce":7,"hash":"{h}"}}]}}"#
                ),
            ),
            (
                SettlementVerdict::Reverted {
                    block: 13,
                    hash: B256::repeat_byte(0xab),
                    reason: Some("stale".into()),
                    revert_data: Some(Bytes::from_static(&[0x08, 0xc3])),
                    attempts: attempts(),
                },
                format!(
                    r#"{{"kind":"reverted","block":13,"hash":"{h}","reason":"stale","revertData":"0x08c3","attempts":[{{"attempt":1,"nonce":7,"hash":"{h}"}}]}}"#
                ),
            ),
            (
                SettlementVerdict::Failed {
                    code: FailureCode::ExecutionReverted,
                    reason: None,
                    revert_data: Some(Bytes::new()),
                    attempts: vec![],
                },
                r#"{"kind":"failed","code":"EXECUTION_REVERTED","reason":null,"revertData":"0x","attempts":[]}"#.to_owned(),
            ),
        ];
        for (verdict, json) in cases {
            assert_eq!(serde_json::to_string(&verdict).unwrap(), json);
            assert_eq!(
                serde_json::from_str::<SettlementVerdict>(&json).unwrap(),
                verdict
            );
        }
        for code in FailureCode::KNOWN {
            let verdict = SettlementVerdict::Failed {
                code: code.clone(),
                reason: None,
                revert_data: None,
                attempts: attempts(),
            };
            let json = format!(
                r#"{{"kind":"failed","code":"{}","reason":null,"revertData":null,"attempts":[{{"attempt":1,"nonce":7,"hash":"{h}"}}]}}"#,
                code.as_str()
            );
            assert_eq!(serde_json::to_string(&verdict).unwrap(), json);
            assert_eq!(
                serde_json::from_str::<SettlementVerdict>(&json).unwrap(),
                verdict
            );
            assert_eq!(code.as_str().parse::<FailureCode>(), Ok(code));
        }
    }

    /// A verdict stored before the typed code (a plain string in the JSON), and one with
    /// a code this version does not know, still read; both write back unchanged.
    #[test]
    fn stored_verdicts_read_including_unknown_codes() {
        let old = r#"{"kind":"failed","code":"GAS_REQUIRED","reason":null,"revertData":null,"attempts":[]}"#;
        let v: SettlementVerdict = serde_json::from_str(old).unwrap();
        assert!(matches!(
            &v,
            SettlementVerdict::Failed {
                code: FailureCode::GasRequired,
                ..
            }
        ));
        assert_eq!(serde_json::to_string(&v).unwrap(), old);
        let newer = r#"{"kind":"failed","code":"SOMETHING_NEW","reason":"x","revertData":null,"attempts":[]}"#;
        let v: SettlementVerdict = serde_json::from_str(newer).unwrap();
        assert!(matches!(
            &v,
            SettlementVerdict::Failed { code: FailureCode::Unknown(c), .. } if c == "SOMETHING_NEW"
        ));
        assert_eq!(serde_json::to_string(&v).unwrap(), newer);
        // Reading as a JSON value first (as `txq_request.verdict` is read) is the same.
        let value: serde_json::Value = serde_json::from_str(old).unwrap();
        let v: SettlementVerdict = serde_json::from_value(value).unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), old);
    }
}
