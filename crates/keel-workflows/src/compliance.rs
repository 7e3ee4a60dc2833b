//! Compliance refusals of organization systems' tokens (issue 37 §2): the codes
//! `Compliance.check` returns and `RegulatedToken` reverts with
//! (`ComplianceRefused(uint8)`), as the typed codes the API and the operations use.

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

#[cfg(test)]
mod tests {
    use super::*;

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
