//! Compliance refusals of organization systems' tokens (issue 37 §2): the codes
//! `Compliance.check` returns and `RegulatedToken` reverts with
//! (`ComplianceRefused(uint8)`), as the typed codes the API and the operations use;
//! and the agent controls' reverts (§3) as operation failure codes.

use alloy::sol_types::SolError;
use keel_abi::bindings::RegulatedToken;

/// The typed code of `Compliance.check`'s refusal `code` (1..=6); `None` for 0 (allowed)
/// and unknown values.
///
/// | on chain | code |
/// |---|---|
/// | 1 | `COMPLIANCE_NOT_ELIGIBLE`: the recipient is not registered, or attested ineligible |
/// | 2 | `COMPLIANCE_EXPIRED`: the recipient's attestation has expired |
/// | 3 | `COMPLIANCE_COUNTRY_NOT_ALLOWED`: the recipient's country is not allowed |
/// | 4 | `COMPLIANCE_MAX_HOLDERS`: the asset has its maximum number of holders |
/// | 5 | `COMPLIANCE_MAX_BALANCE`: the recipient would hold more than the maximum |
/// | 6 | `COMPLIANCE_LOCKED_UP`: transfers are locked up until a date |
pub fn refusal_code(code: u8) -> Option<&'static str> {
    Some(match code {
        1 => "COMPLIANCE_NOT_ELIGIBLE",
        2 => "COMPLIANCE_EXPIRED",
        3 => "COMPLIANCE_COUNTRY_NOT_ALLOWED",
        4 => "COMPLIANCE_MAX_HOLDERS",
        5 => "COMPLIANCE_MAX_BALANCE",
        6 => "COMPLIANCE_LOCKED_UP",
        _ => return None,
    })
}

/// Every code [`refusal_code`] can return, in on-chain order.
pub const REFUSAL_CODES: [&str; 6] = [
    "COMPLIANCE_NOT_ELIGIBLE",
    "COMPLIANCE_EXPIRED",
    "COMPLIANCE_COUNTRY_NOT_ALLOWED",
    "COMPLIANCE_MAX_HOLDERS",
    "COMPLIANCE_MAX_BALANCE",
    "COMPLIANCE_LOCKED_UP",
];

/// The typed code of revert data `data` when it is `ComplianceRefused(code)`.
pub fn decode_refusal(data: &[u8]) -> Option<&'static str> {
    let refused = RegulatedToken::ComplianceRefused::abi_decode(data).ok()?;
    refusal_code(refused.code)
}

/// The typed failure code of a `RegulatedToken` revert other than a compliance refusal
/// (issue 37 §3): the agent controls' errors.
///
/// | custom error | code |
/// |---|---|
/// | `AddressFrozen(account)` | `ADDRESS_FROZEN`: the sender or the receiver is frozen |
/// | `InsufficientUnfrozenBalance(account, available)` | `INSUFFICIENT_UNFROZEN_BALANCE`: the move needs frozen tokens |
/// | `InvalidFrozenAmount(account, frozen, requested)` | `INVALID_FROZEN_AMOUNT`: a freeze above the balance, or an unfreeze above the frozen amount |
/// | `InvalidBatch()` | `INVALID_BATCH`: batch arrays of different lengths, or empty |
pub fn decode_agent_error(data: &[u8]) -> Option<&'static str> {
    let selector: [u8; 4] = data.get(..4)?.try_into().ok()?;
    Some(match selector {
        RegulatedToken::AddressFrozen::SELECTOR => "ADDRESS_FROZEN",
        RegulatedToken::InsufficientUnfrozenBalance::SELECTOR => "INSUFFICIENT_UNFROZEN_BALANCE",
        RegulatedToken::InvalidFrozenAmount::SELECTOR => "INVALID_FROZEN_AMOUNT",
        RegulatedToken::InvalidBatch::SELECTOR => "INVALID_BATCH",
        _ => return None,
    })
}

/// Every code [`decode_agent_error`] can return.
pub const AGENT_ERROR_CODES: [&str; 4] = [
    "ADDRESS_FROZEN",
    "INSUFFICIENT_UNFROZEN_BALANCE",
    "INVALID_FROZEN_AMOUNT",
    "INVALID_BATCH",
];

/// The typed failure code of revert data `data` of an organization system's token:
/// [`decode_refusal`], else [`decode_agent_error`].
pub fn decode_failure(data: &[u8]) -> Option<&'static str> {
    decode_refusal(data).or_else(|| decode_agent_error(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::{Address, U256};

    #[test]
    fn every_agent_error_decodes_to_its_code() {
        let a = Address::repeat_byte(7);
        let cases = [
            RegulatedToken::AddressFrozen { account: a }.abi_encode(),
            RegulatedToken::InsufficientUnfrozenBalance {
                account: a,
                available: U256::from(1),
            }
            .abi_encode(),
            RegulatedToken::InvalidFrozenAmount {
                account: a,
                frozen: U256::from(1),
                requested: U256::from(2),
            }
            .abi_encode(),
            RegulatedToken::InvalidBatch {}.abi_encode(),
        ];
        for (data, code) in cases.iter().zip(AGENT_ERROR_CODES) {
            assert_eq!(decode_agent_error(data), Some(code));
            assert_eq!(decode_failure(data), Some(code));
        }
        assert_eq!(decode_agent_error(&[0x01, 0x02]), None);
        assert_eq!(decode_agent_error(&[0u8; 4]), None);
        let refusal = RegulatedToken::ComplianceRefused { code: 5 }.abi_encode();
        assert_eq!(decode_failure(&refusal), Some("COMPLIANCE_MAX_BALANCE"));
        assert_eq!(decode_agent_error(&refusal), None);
    }

    #[test]
    fn every_on_chain_code_has_its_typed_code_and_decodes_from_revert_data() {
        for (i, code) in REFUSAL_CODES.iter().enumerate() {
            let on_chain = u8::try_from(i + 1).unwrap();
            assert_eq!(refusal_code(on_chain), Some(*code));
            let data = RegulatedToken::ComplianceRefused { code: on_chain }.abi_encode();
            assert_eq!(decode_refusal(&data), Some(*code));
        }
        assert_eq!(refusal_code(0), None);
        assert_eq!(refusal_code(7), None);
        assert_eq!(decode_refusal(&[0xde, 0xad]), None);
    }
}
