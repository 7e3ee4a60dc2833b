//! Classification of JSON-RPC error answers from EVM nodes.
//!
//! Nodes disagree on wording and codes. [`classify`] matches the error code and then
//! **lowercased** substrings of the message against [`TABLE`], first match wins (the
//! order matters: anvil's "intrinsic gas too high -- tx.gas_limit >
//! env.block.gas_limit" is a block-gas-limit error, not an intrinsic-gas one). Code `3`
//! is always `execution reverted` (the revert data is in `error.data`, per the
//! Ethereum JSON-RPC execution-API spec, `eth_call`/`eth_estimateGas`).

use alloy::primitives::Bytes;
use alloy::sol_types::{ContractError, RevertReason as SolRevert, SolInterface};
use std::fmt;

/// What a node's error answer means for the request that caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeErrorKind {
    /// The nonce is below the account's next nonce (already used).
    NonceTooLow,
    /// The nonce is above the account's next nonce (a gap), where the node refuses it.
    NonceTooHigh,
    /// The node already has this exact transaction (success for a re-broadcast).
    AlreadyKnown,
    /// A same-nonce replacement does not raise fees enough (geth/reth: +10 % on both).
    ReplacementUnderpriced,
    /// The fee cap is below what the node or the block's base fee accepts.
    FeeTooLow,
    /// The sender cannot pay `gas × maxFeePerGas + value`.
    InsufficientFunds,
    /// The gas limit is below the transaction's intrinsic gas.
    IntrinsicGasTooLow,
    /// The gas limit exceeds the block gas limit.
    ExceedsBlockGasLimit,
    /// Execution reverted (estimation or call); see [`NodeError::revert`].
    ExecutionReverted,
    /// The node is rate limiting us (HTTP 429 is a transport error; some providers use
    /// a JSON-RPC error instead). Not about the transaction.
    RateLimited,
    /// A `getLogs`-style request covers too many blocks or results.
    RangeTooLarge,
    /// JSON-RPC `-32603` (internal error) whose message matches no known text: the
    /// upstream (a node, a gateway or a provider's proxy) failed, whatever the request
    /// was. Not about the transaction; another upstream may answer it.
    Internal,
    /// Anything else (unknown text). Not known to be about the transaction.
    Other,
}

impl NodeErrorKind {
    /// Stable snake_case code (also a bounded metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NonceTooLow => "nonce_too_low",
            Self::NonceTooHigh => "nonce_too_high",
            Self::AlreadyKnown => "already_known",
            Self::ReplacementUnderpriced => "replacement_underpriced",
            Self::FeeTooLow => "fee_too_low",
            Self::InsufficientFunds => "insufficient_funds",
            Self::IntrinsicGasTooLow => "intrinsic_gas_too_low",
            Self::ExceedsBlockGasLimit => "exceeds_block_gas_limit",
            Self::ExecutionReverted => "execution_reverted",
            Self::RateLimited => "rate_limited",
            Self::RangeTooLarge => "range_too_large",
            Self::Internal => "internal",
            Self::Other => "other",
        }
    }

    /// True when the answer is the node's verdict on the transaction or call itself
    /// (another node would say the same). Such answers are final for the request and
    /// never count against an upstream's health; the others ([`Self::RateLimited`],
    /// [`Self::Internal`], [`Self::Other`]) make [`crate::UpstreamPool`] try the
    /// chain's other upstreams.
    pub fn is_transaction_level(self) -> bool {
        !matches!(self, Self::RateLimited | Self::Internal | Self::Other)
    }

    /// True when retrying the identical request later can succeed.
    pub fn is_retryable(self) -> bool {
        !self.is_transaction_level()
    }
}

impl fmt::Display for NodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which client wrote a table entry (documentation of the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// go-ethereum (and its forks: bor, op-geth, ...).
    Geth,
    /// reth.
    Reth,
    /// Anvil (foundry).
    Anvil,
    /// Erigon.
    Erigon,
    /// Nethermind.
    Nethermind,
    /// Hyperledger Besu.
    Besu,
    /// Hosted providers' own wording.
    Provider,
}

/// One classification rule: a lowercased substring, the clients known to use it, and
/// the kind it means.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Lowercased substring of the node's message.
    pub needle: &'static str,
    /// Clients that answer with it.
    pub clients: &'static [Client],
    /// Its meaning.
    pub kind: NodeErrorKind,
}

use Client::*;
use NodeErrorKind as K;

/// The substring table, checked in order.
pub const TABLE: &[Rule] = &[
    // Must precede every "intrinsic gas" rule.
    Rule {
        needle: "tx.gas_limit > env.block.gas_limit",
        clients: &[Anvil],
        kind: K::ExceedsBlockGasLimit,
    },
    Rule {
        needle: "exceeds block gas limit",
        clients: &[Geth, Reth, Erigon, Besu],
        kind: K::ExceedsBlockGasLimit,
    },
    Rule {
        needle: "gaslimitexceeded",
        clients: &[Nethermind],
        kind: K::ExceedsBlockGasLimit,
    },
    Rule {
        needle: "gas limit reached",
        clients: &[Geth],
        kind: K::ExceedsBlockGasLimit,
    },
    Rule {
        needle: "nonce too low",
        clients: &[Geth, Reth, Anvil, Erigon, Besu],
        kind: K::NonceTooLow,
    },
    Rule {
        needle: "oldnonce",
        clients: &[Nethermind],
        kind: K::NonceTooLow,
    },
    Rule {
        needle: "nonce too high",
        clients: &[Geth, Reth, Anvil, Erigon],
        kind: K::NonceTooHigh,
    },
    Rule {
        needle: "nonce too far in future",
        clients: &[Besu],
        kind: K::NonceTooHigh,
    },
    Rule {
        needle: "noncegap",
        clients: &[Nethermind],
        kind: K::NonceTooHigh,
    },
    Rule {
        needle: "nonce has max value",
        clients: &[Geth],
        kind: K::NonceTooHigh,
    },
    Rule {
        needle: "already known",
        clients: &[Geth, Reth, Erigon],
        kind: K::AlreadyKnown,
    },
    Rule {
        needle: "transaction already imported",
        clients: &[Anvil],
        kind: K::AlreadyKnown,
    },
    Rule {
        needle: "alreadyknown",
        clients: &[Nethermind],
        kind: K::AlreadyKnown,
    },
    Rule {
        needle: "known transaction",
        clients: &[Besu],
        kind: K::AlreadyKnown,
    },
    Rule {
        needle: "already exists",
        clients: &[Provider],
        kind: K::AlreadyKnown,
    },
    Rule {
        needle: "replacement transaction underpriced",
        clients: &[Geth, Reth, Anvil, Erigon, Besu],
        kind: K::ReplacementUnderpriced,
    },
    Rule {
        needle: "replacement underpriced",
        clients: &[Besu, Provider],
        kind: K::ReplacementUnderpriced,
    },
    Rule {
        needle: "feetoolowtocompete",
        clients: &[Nethermind],
        kind: K::ReplacementUnderpriced,
    },
    Rule {
        needle: "replacementnotallowed",
        clients: &[Nethermind],
        kind: K::ReplacementUnderpriced,
    },
    Rule {
        needle: "insufficient funds",
        clients: &[Geth, Reth, Anvil, Erigon],
        kind: K::InsufficientFunds,
    },
    Rule {
        needle: "insufficientfunds",
        clients: &[Nethermind],
        kind: K::InsufficientFunds,
    },
    Rule {
        needle: "upfront cost exceeds account balance",
        clients: &[Besu],
        kind: K::InsufficientFunds,
    },
    Rule {
        needle: "intrinsic gas too low",
        clients: &[Geth, Reth, Anvil, Erigon, Nethermind],
        kind: K::IntrinsicGasTooLow,
    },
    Rule {
        needle: "intrinsic gas exceeds gas limit",
        clients: &[Besu],
        kind: K::IntrinsicGasTooLow,
    },
    Rule {
        needle: "intrinsicgastoolow",
        clients: &[Nethermind],
        kind: K::IntrinsicGasTooLow,
    },
    Rule {
        needle: "transaction underpriced",
        clients: &[Geth, Reth, Erigon],
        kind: K::FeeTooLow,
    },
    Rule {
        needle: "max fee per gas less than block base fee",
        clients: &[Geth, Reth, Anvil, Erigon],
        kind: K::FeeTooLow,
    },
    Rule {
        needle: "gas price below minimum",
        clients: &[Besu],
        kind: K::FeeTooLow,
    },
    Rule {
        needle: "feetoolow",
        clients: &[Nethermind],
        kind: K::FeeTooLow,
    },
    Rule {
        needle: "execution reverted",
        clients: &[Geth, Reth, Anvil, Erigon, Nethermind, Besu],
        kind: K::ExecutionReverted,
    },
    Rule {
        needle: "reverted",
        clients: &[Besu, Nethermind],
        kind: K::ExecutionReverted,
    },
    Rule {
        needle: "rate limit",
        clients: &[Provider],
        kind: K::RateLimited,
    },
    Rule {
        needle: "too many requests",
        clients: &[Provider],
        kind: K::RateLimited,
    },
    Rule {
        needle: "exceeded its compute units",
        clients: &[Provider],
        kind: K::RateLimited,
    },
    Rule {
        needle: "query returned more than",
        clients: &[Provider, Geth],
        kind: K::RangeTooLarge,
    },
    Rule {
        needle: "block range",
        clients: &[Provider, Erigon],
        kind: K::RangeTooLarge,
    },
    Rule {
        needle: "too many results",
        clients: &[Provider],
        kind: K::RangeTooLarge,
    },
    Rule {
        needle: "response size exceeded",
        clients: &[Provider],
        kind: K::RangeTooLarge,
    },
];

/// A decoded revert: the human reason when the data is `Error(string)` or
/// `Panic(uint256)`, and the raw data for custom errors (decode them with the
/// contract's `…Errors` enum, see [`RevertReason::decode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevertReason {
    /// `Error(string)` message or `Panic` description, when the data is one of those.
    pub message: Option<String>,
    /// The raw revert data (selector + ABI-encoded arguments); empty for a bare revert.
    pub data: Bytes,
}

impl RevertReason {
    /// Decodes revert data (Solidity ABI: `Error(string)` selector `0x08c379a0`,
    /// `Panic(uint256)` selector `0x4e487b71`, else a custom error).
    pub fn from_data(data: Bytes) -> Self {
        let message = match SolRevert::decode(&data) {
            Some(SolRevert::ContractError(ContractError::Revert(r))) => Some(r.reason),
            Some(SolRevert::ContractError(ContractError::Panic(p))) => Some(p.to_string()),
            Some(SolRevert::RawString(s)) => Some(s),
            Some(SolRevert::ContractError(ContractError::CustomError(_))) | None => None,
        };
        Self { message, data }
    }

    /// Decodes the data as one of a contract's custom errors.
    pub fn decode<E: SolInterface>(&self) -> Option<E> {
        E::abi_decode(&self.data).ok()
    }

    /// The 4-byte selector of a custom error, if the data has one.
    pub fn selector(&self) -> Option<[u8; 4]> {
        self.data.get(..4).and_then(|s| s.try_into().ok())
    }
}

/// A classified node answer. `Display` shows the kind and code, never the node's
/// message (it carries addresses and balances).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeError {
    /// What it means.
    pub kind: NodeErrorKind,
    /// The JSON-RPC error code.
    pub code: i64,
    /// The decoded revert, for [`NodeErrorKind::ExecutionReverted`] with data.
    pub revert: Option<RevertReason>,
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.kind, self.code)?;
        if let Some(RevertReason {
            message: Some(m), ..
        }) = &self.revert
        {
            write!(f, ": {m}")?;
        }
        Ok(())
    }
}

/// Classifies a JSON-RPC error answer.
///
/// `data` is the error object's `data` member when it is hex revert data.
pub fn classify(code: i64, message: &str, data: Option<Bytes>) -> NodeError {
    let lower = message.to_ascii_lowercase();
    let kind = if code == 3 {
        K::ExecutionReverted
    } else {
        TABLE
            .iter()
            .find(|r| lower.contains(r.needle))
            .map(|r| r.kind)
            .unwrap_or(match code {
                -32005 => K::RateLimited,
                -32603 => K::Internal,
                _ => K::Other,
            })
    };
    let revert =
        (kind == K::ExecutionReverted).then(|| RevertReason::from_data(data.unwrap_or_default()));
    NodeError { kind, code, revert }
}

/// Classifies an alloy error payload (`RpcError::ErrorResp`).
pub fn classify_payload(payload: &alloy::rpc::json_rpc::ErrorPayload) -> NodeError {
    let data = payload
        .data
        .as_ref()
        .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
        .and_then(|s| s.parse::<Bytes>().ok());
    classify(payload.code, &payload.message, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::sol_types::{Revert, SolError};

    /// Real answers, one or more per client, with the kind each must map to.
    const SAMPLES: &[(Client, i64, &str, NodeErrorKind)] = &[
        // nonce too low
        (
            Geth,
            -32000,
            "nonce too low: address 0x71C7656EC7ab88b098defB751B7401B5f6d8976F, tx: 3 state: 5",
            K::NonceTooLow,
        ),
        (Reth, -32003, "nonce too low", K::NonceTooLow),
        (Anvil, -32003, "nonce too low", K::NonceTooLow),
        (Erigon, -32000, "nonce too low", K::NonceTooLow),
        (
            Nethermind,
            -32010,
            "OldNonce, Current nonce: 5, nonce of rejected tx: 3",
            K::NonceTooLow,
        ),
        (Besu, -32001, "Nonce too low", K::NonceTooLow),
        // nonce too high / gap
        (
            Geth,
            -32000,
            "nonce too high: address 0x71C7656EC7ab88b098defB751B7401B5f6d8976F, tx: 9 state: 5",
            K::NonceTooHigh,
        ),
        (Reth, -32003, "nonce too high", K::NonceTooHigh),
        (Anvil, -32003, "nonce too high", K::NonceTooHigh),
        (Erigon, -32000, "nonce too high", K::NonceTooHigh),
        (
            Nethermind,
            -32010,
            "NonceGap, Future nonce. Expected nonce: 5",
            K::NonceTooHigh,
        ),
        (Besu, -32001, "Nonce too far in future", K::NonceTooHigh),
        // already known
        (Geth, -32000, "already known", K::AlreadyKnown),
        (Reth, -32003, "already known", K::AlreadyKnown),
        (
            Anvil,
            -32003,
            "transaction already imported",
            K::AlreadyKnown,
        ),
        (
            Erigon,
            -32000,
            "ALREADY_EXISTS: already known",
            K::AlreadyKnown,
        ),
        (Nethermind, -32010, "AlreadyKnown", K::AlreadyKnown),
        (Besu, -32000, "Known transaction", K::AlreadyKnown),
        // replacement underpriced
        (
            Geth,
            -32000,
            "replacement transaction underpriced",
            K::ReplacementUnderpriced,
        ),
        (
            Reth,
            -32003,
            "replacement transaction underpriced",
            K::ReplacementUnderpriced,
        ),
        (
            Anvil,
            -32003,
            "replacement transaction underpriced",
            K::ReplacementUnderpriced,
        ),
        (
            Erigon,
            -32000,
            "replacement transaction underpriced",
            K::ReplacementUnderpriced,
        ),
        (
            Nethermind,
            -32010,
            "FeeTooLowToCompete",
            K::ReplacementUnderpriced,
        ),
        (
            Besu,
            -32000,
            "Replacement transaction underpriced",
            K::ReplacementUnderpriced,
        ),
        // insufficient funds
        (
            Geth,
            -32000,
            "insufficient funds for gas * price + value: address 0x71C7656EC7ab88b098defB751B7401B5f6d8976F have 0 want 21000000000000",
            K::InsufficientFunds,
        ),
        (
            Reth,
            -32003,
            "insufficient funds for gas * price + value: have 0 want 21000",
            K::InsufficientFunds,
        ),
        (
            Anvil,
            -32003,
            "Insufficient funds for gas * price + value",
            K::InsufficientFunds,
        ),
        (
            Erigon,
            -32000,
            "insufficient funds for gas * price + value: address 0x71C7 have 0 want 1",
            K::InsufficientFunds,
        ),
        (
            Nethermind,
            -32010,
            "InsufficientFunds, Account balance: 0, cumulative cost: 21000",
            K::InsufficientFunds,
        ),
        (
            Besu,
            -32004,
            "Upfront cost exceeds account balance",
            K::InsufficientFunds,
        ),
        // intrinsic gas too low
        (
            Geth,
            -32000,
            "intrinsic gas too low: gas 20000, minimum needed 21000",
            K::IntrinsicGasTooLow,
        ),
        (Reth, -32003, "intrinsic gas too low", K::IntrinsicGasTooLow),
        (
            Anvil,
            -32003,
            "intrinsic gas too low",
            K::IntrinsicGasTooLow,
        ),
        (
            Erigon,
            -32000,
            "intrinsic gas too low: have 20000, want 21000",
            K::IntrinsicGasTooLow,
        ),
        (
            Nethermind,
            -32010,
            "IntrinsicGasTooLow",
            K::IntrinsicGasTooLow,
        ),
        (
            Besu,
            -32003,
            "Intrinsic gas exceeds gas limit",
            K::IntrinsicGasTooLow,
        ),
        // exceeds block gas limit
        (
            Geth,
            -32000,
            "exceeds block gas limit",
            K::ExceedsBlockGasLimit,
        ),
        (
            Reth,
            -32003,
            "exceeds block gas limit",
            K::ExceedsBlockGasLimit,
        ),
        (
            Anvil,
            -32003,
            "intrinsic gas too high -- tx.gas_limit > env.block.gas_limit",
            K::ExceedsBlockGasLimit,
        ),
        (
            Erigon,
            -32000,
            "exceeds block gas limit",
            K::ExceedsBlockGasLimit,
        ),
        (
            Nethermind,
            -32010,
            "GasLimitExceeded, Gas limit: 40000000, gas limit of rejected tx: 50000000",
            K::ExceedsBlockGasLimit,
        ),
        (
            Besu,
            -32000,
            "Transaction gas limit exceeds block gas limit",
            K::ExceedsBlockGasLimit,
        ),
        // execution reverted
        (
            Geth,
            3,
            "execution reverted: not allowed",
            K::ExecutionReverted,
        ),
        (Reth, 3, "execution reverted", K::ExecutionReverted),
        (
            Anvil,
            3,
            "execution reverted: custom error 0xd93c0665",
            K::ExecutionReverted,
        ),
        (Erigon, -32000, "execution reverted", K::ExecutionReverted),
        (Nethermind, -32015, "VM execution error.", K::Other),
        (Nethermind, -32015, "reverted", K::ExecutionReverted),
        (Besu, -32000, "Execution reverted", K::ExecutionReverted),
        // not about the transaction
        (
            Provider,
            429,
            "Your app has exceeded its compute units per second capacity",
            K::RateLimited,
        ),
        (Provider, -32005, "limit exceeded", K::RateLimited),
        (
            Provider,
            -32602,
            "query returned more than 10000 results",
            K::RangeTooLarge,
        ),
        (
            Geth,
            -32601,
            "the method eth_foo does not exist/is not available",
            K::Other,
        ),
        (Provider, -32603, "internal error", K::Internal),
        (Provider, -32603, "Internal JSON-RPC error.", K::Internal),
        // A known text wins over the generic internal-error code.
        (Provider, -32603, "nonce too low", K::NonceTooLow),
        (Provider, -32000, "upstream connect error", K::Other),
    ];

    #[test]
    fn every_sample_maps_to_its_kind() {
        for (client, code, message, kind) in SAMPLES {
            let got = classify(*code, message, None).kind;
            assert_eq!(got, *kind, "{client:?} {code} {message:?}");
        }
    }

    #[test]
    fn every_required_kind_is_covered_for_every_client() {
        let required = [
            K::NonceTooLow,
            K::NonceTooHigh,
            K::AlreadyKnown,
            K::ReplacementUnderpriced,
            K::InsufficientFunds,
            K::IntrinsicGasTooLow,
            K::ExceedsBlockGasLimit,
            K::ExecutionReverted,
        ];
        for client in [Geth, Reth, Anvil, Erigon, Nethermind, Besu] {
            for kind in required {
                assert!(
                    SAMPLES
                        .iter()
                        .any(|(c, _, _, k)| *c == client && *k == kind),
                    "no sample for {client:?} {kind:?}"
                );
            }
        }
    }

    #[test]
    fn transaction_level_errors_do_not_count_against_health() {
        for kind in [
            K::NonceTooLow,
            K::AlreadyKnown,
            K::InsufficientFunds,
            K::ExecutionReverted,
        ] {
            assert!(kind.is_transaction_level());
            assert!(!kind.is_retryable());
        }
        for kind in [K::RateLimited, K::Internal, K::Other] {
            assert!(!kind.is_transaction_level(), "{kind:?}");
            assert!(kind.is_retryable(), "{kind:?}");
        }
    }

    #[test]
    fn revert_reason_is_decoded_and_display_is_value_free() {
        let data: Bytes = Revert::from("amount too large").abi_encode().into();
        let e = classify(
            3,
            "execution reverted: amount too large",
            Some(data.clone()),
        );
        assert_eq!(e.kind, K::ExecutionReverted);
        let revert = e.revert.clone().unwrap();
        assert_eq!(revert.message.as_deref(), Some("amount too large"));
        assert_eq!(revert.selector(), Some([0x08, 0xc3, 0x79, 0xa0]));
        let shown = classify(
            -32000,
            "insufficient funds for gas * price + value: address 0xabc have 1 want 2",
            None,
        )
        .to_string();
        assert!(
            !shown.contains("0xabc") && !shown.contains("want"),
            "{shown}"
        );
        // Custom error data is kept raw for the contract's own decoder.
        let custom = classify(
            3,
            "execution reverted",
            Some(Bytes::from(vec![0xd9, 0x3c, 0x06, 0x65])),
        );
        let r = custom.revert.unwrap();
        assert_eq!(r.message, None);
        assert_eq!(r.selector(), Some([0xd9, 0x3c, 0x06, 0x65]));
    }
}
