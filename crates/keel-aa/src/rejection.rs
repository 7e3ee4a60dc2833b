//! EntryPoint refusals (`FailedOp` / `FailedOpWithRevert` with an `AAxx` reason) as
//! typed values, and their ERC-7769 JSON-RPC error codes.
//!
//! | AAxx | meaning | ERC-7769 code |
//! |---|---|---|
//! | AA10, AA13–AA15 | account creation (`initCode`) | -32500 rejected |
//! | AA20, AA21, AA23, AA25, AA26 | account validation, prefund, nonce, gas | -32500 rejected |
//! | AA22, AA32 | account / paymaster validity window | -32503 time range |
//! | AA24, AA34 | account / paymaster signature | -32507 signature |
//! | AA30, AA33, AA36 | paymaster missing, reverted, over its gas limit | -32501 paymaster |
//! | AA31 | paymaster deposit too low | -32508 paymaster balance |
//! | AA40, AA41, AA51 | gas accounting | -32500 rejected |
//! | AA9x | bundle-level (beneficiary, internal, overflow) | -32500 rejected, AA96 -32506 aggregator |

use alloy::primitives::{Bytes, U256};
use alloy::sol_types::SolInterface;
use keel_abi::erc4337::IEntryPointV08::IEntryPointV08Errors;
use serde::{Deserialize, Serialize};

/// ERC-7769 JSON-RPC error codes of a bundler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Erc7769Code {
    /// -32602: invalid fields of the request.
    InvalidParams,
    /// -32500: rejected by the EntryPoint during account creation or validation.
    RejectedByEntryPoint,
    /// -32501: rejected by the paymaster's `validatePaymasterUserOp`.
    RejectedByPaymaster,
    /// -32502: banned opcode in validation (ERC-7562).
    BannedOpcode,
    /// -32503: outside the validity time range (expired or not due).
    TimeRange,
    /// -32504: an entity is throttled or banned.
    ThrottledOrBanned,
    /// -32505: an entity's stake or unstake delay is too low.
    StakeTooLow,
    /// -32506: unsupported signature aggregator.
    UnsupportedAggregator,
    /// -32507: invalid account or paymaster signature.
    InvalidSignature,
    /// -32508: the paymaster's deposit cannot cover the operation.
    PaymasterBalance,
    /// -32521: the execution call reverted (gas estimation).
    ExecutionReverted,
}

impl Erc7769Code {
    /// The JSON-RPC `error.code`.
    pub fn code(self) -> i32 {
        match self {
            Self::InvalidParams => -32602,
            Self::RejectedByEntryPoint => -32500,
            Self::RejectedByPaymaster => -32501,
            Self::BannedOpcode => -32502,
            Self::TimeRange => -32503,
            Self::ThrottledOrBanned => -32504,
            Self::StakeTooLow => -32505,
            Self::UnsupportedAggregator => -32506,
            Self::InvalidSignature => -32507,
            Self::PaymasterBalance => -32508,
            Self::ExecutionReverted => -32521,
        }
    }
}

/// The `AAxx` number of an EntryPoint reason (`"AA34 signature error"` → 34).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AaCode(pub u8);

impl AaCode {
    /// Parses the `AAxx` prefix of a reason string; `None` when it has none.
    pub fn parse(reason: &str) -> Option<Self> {
        let digits = reason.strip_prefix("AA")?.get(..2)?;
        digits.parse::<u8>().ok().map(Self)
    }

    /// The ERC-7769 code for this reason (see the module table).
    pub fn erc7769(self) -> Erc7769Code {
        match self.0 {
            22 | 32 => Erc7769Code::TimeRange,
            24 | 34 => Erc7769Code::InvalidSignature,
            30 | 33 | 36 => Erc7769Code::RejectedByPaymaster,
            31 => Erc7769Code::PaymasterBalance,
            96 => Erc7769Code::UnsupportedAggregator,
            _ => Erc7769Code::RejectedByEntryPoint,
        }
    }
}

impl std::fmt::Display for AaCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AA{:02}", self.0)
    }
}

/// A refusal of `handleOps` (or of its simulation) naming one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPointRejection {
    /// Index of the offending operation in the bundle.
    pub op_index: usize,
    /// The `AAxx` code, when the reason carries one.
    pub aa: Option<AaCode>,
    /// The EntryPoint's reason text (e.g. `AA34 signature error`).
    pub reason: String,
    /// The inner revert data of `FailedOpWithRevert` (account or paymaster revert).
    pub inner: Option<Bytes>,
}

impl EntryPointRejection {
    /// Decodes `FailedOp(uint256,string)` or `FailedOpWithRevert(uint256,string,bytes)`
    /// revert data; `None` for any other data.
    pub fn decode(revert_data: &[u8]) -> Option<Self> {
        let op_index = |i: U256| usize::try_from(i).unwrap_or(usize::MAX);
        match IEntryPointV08Errors::abi_decode(revert_data).ok()? {
            IEntryPointV08Errors::FailedOp(e) => Some(Self {
                op_index: op_index(e.opIndex),
                aa: AaCode::parse(&e.reason),
                reason: e.reason,
                inner: None,
            }),
            IEntryPointV08Errors::FailedOpWithRevert(e) => Some(Self {
                op_index: op_index(e.opIndex),
                aa: AaCode::parse(&e.reason),
                reason: e.reason,
                inner: Some(e.inner),
            }),
            _ => None,
        }
    }

    /// The ERC-7769 code: from the `AAxx` code, else -32500.
    pub fn erc7769(&self) -> Erc7769Code {
        self.aa
            .map(AaCode::erc7769)
            .unwrap_or(Erc7769Code::RejectedByEntryPoint)
    }
}

/// The readable text of an account's, factory's or paymaster's revert data (the `inner`
/// of `FailedOpWithRevert`): a Solidity `Error(string)` message, a `Panic(uint256)` code,
/// or the 4-byte selector of a custom error; `None` for empty data. Only printable ASCII
/// is kept, at most 200 characters (the text is chosen by the contract, never by Keel).
pub fn revert_reason_text(data: &[u8]) -> Option<String> {
    if data.is_empty() {
        return None;
    }
    let text = alloy::sol_types::decode_revert_reason(data)
        .map(|t| t.strip_prefix("revert: ").map(str::to_owned).unwrap_or(t))
        .filter(|t| !t.is_empty());
    let text = match text {
        Some(t) => t,
        None if data.len() >= 4 => {
            format!("custom error {}", alloy::hex::encode_prefixed(&data[..4]))
        }
        None => return None,
    };
    let clean: String = text
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(200)
        .collect();
    (!clean.trim().is_empty()).then_some(clean)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::sol_types::SolError;
    use keel_abi::erc4337::IEntryPointV08;

    #[test]
    fn aa_codes_map_to_erc7769() {
        let cases = [
            ("AA34 signature error", -32507),
            ("AA24 signature error", -32507),
            ("AA22 expired or not due", -32503),
            ("AA32 paymaster expired or not due", -32503),
            ("AA31 paymaster deposit too low", -32508),
            ("AA33 reverted", -32501),
            ("AA21 didn't pay prefund", -32500),
            ("AA25 invalid account nonce", -32500),
        ];
        for (reason, code) in cases {
            let aa = AaCode::parse(reason).unwrap();
            assert_eq!(aa.erc7769().code(), code, "{reason}");
            assert_eq!(&aa.to_string(), &reason[..4]);
        }
        assert_eq!(AaCode::parse("no code"), None);
        assert_eq!(AaCode::parse("AA"), None);
    }

    #[test]
    fn failed_op_revert_data_decodes() {
        let data = IEntryPointV08::FailedOp {
            opIndex: U256::from(3),
            reason: "AA34 signature error".into(),
        }
        .abi_encode();
        let r = EntryPointRejection::decode(&data).unwrap();
        assert_eq!(r.op_index, 3);
        assert_eq!(r.aa, Some(AaCode(34)));
        assert_eq!(r.erc7769(), Erc7769Code::InvalidSignature);
        let data = IEntryPointV08::FailedOpWithRevert {
            opIndex: U256::ZERO,
            reason: "AA33 reverted".into(),
            inner: Bytes::from_static(&[1, 2, 3, 4]),
        }
        .abi_encode();
        let r = EntryPointRejection::decode(&data).unwrap();
        assert_eq!(
            r.inner.as_ref().map(|b| b.to_vec()),
            Some(vec![1u8, 2, 3, 4])
        );
        assert_eq!(r.erc7769().code(), -32501);
        assert_eq!(EntryPointRejection::decode(&[0xde, 0xad]), None);
    }

    /// Every shape of inner revert data gives a readable, bounded text.
    #[test]
    fn revert_reason_text_reads_every_shape() {
        use alloy::sol_types::{Panic, Revert};
        let msg = Revert::from("testWallet: dead signature").abi_encode();
        assert_eq!(
            revert_reason_text(&msg).as_deref(),
            Some("testWallet: dead signature")
        );
        let panic = Panic::from(0x11u64).abi_encode();
        let text = revert_reason_text(&panic).unwrap();
        assert!(text.contains("overflow") || text.contains("0x11"), "{text}");
        let custom = [0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1];
        assert_eq!(
            revert_reason_text(&custom).as_deref(),
            Some("custom error 0xdeadbeef")
        );
        assert_eq!(revert_reason_text(&[]), None);
        let long = Revert::from("x".repeat(1_000)).abi_encode();
        assert_eq!(revert_reason_text(&long).unwrap().len(), 200);
        let control = Revert::from("a\nb\u{7}c").abi_encode();
        assert_eq!(revert_reason_text(&control).as_deref(), Some("abc"));
    }
}
