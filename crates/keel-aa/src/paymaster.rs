//! `paymasterData` of Keel's `SponsorPaymaster` (`abi/src/SponsorPaymaster.sol`).
//!
//! Layout after the 52 static bytes of `paymasterAndData`:
//! `validUntil (uint48, 6 bytes) ‖ validAfter (uint48, 6 bytes) ‖ signature (65 bytes)`.
//! The sponsor key signs, EIP-191 personal-sign, the value of the contract's `getHash`:
//!
//! ```text
//! keccak256(abi.encode(sender, nonce, keccak256(initCode), keccak256(callData),
//!     accountGasLimits, preVerificationGas, gasFees,
//!     keccak256(paymasterAndData[:64]),      // without the paymaster signature
//!     chainId, entryPoint, paymaster, validUntil, validAfter))
//! ```
//!
//! so the signature covers the whole operation except the account's signature, the
//! paymaster's gas limits and the validity window. [`sign_sponsorship`] fills in
//! `paymasterData` of an operation; [`stub_paymaster_data`] is the ERC-7677
//! `pm_getPaymasterStubData` value (same length, so gas estimates hold).

use crate::entry_point::ResolvedEntryPoint;
use crate::user_op::{PAYMASTER_DATA_OFFSET, PackedUserOperation, UserOpError, UserOperation};
use alloy::primitives::{Address, B256, Bytes, U256, keccak256};
use alloy::signers::Signer;
use alloy::sol_types::SolValue;

/// Length of the sponsor signature (r ‖ s ‖ v).
pub const SPONSOR_SIGNATURE_LEN: usize = 65;

/// Offset of the signature inside `paymasterAndData` (52 + 6 + 6).
pub const SPONSOR_SIGNATURE_OFFSET: usize = PAYMASTER_DATA_OFFSET + 12;

/// The largest value of a `uint48` (seconds).
pub const MAX_UINT48: u64 = (1 << 48) - 1;

/// A sponsorship's validity window in unix seconds (`uint48` each). `valid_until == 0`
/// means no expiry. The EntryPoint refuses the operation outside the window
/// (`AA32 paymaster expired or not due`, ERC-7769 `-32503`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValidityWindow {
    /// Last second the sponsorship is valid (inclusive; 0 = no expiry).
    pub valid_until: u64,
    /// First second the sponsorship is valid.
    pub valid_after: u64,
}

/// Why sponsorship data could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SponsorError {
    /// A window bound does not fit in a `uint48`.
    #[error("validity window bound exceeds uint48")]
    WindowOutOfRange,
    /// The operation names another paymaster than the one being signed for.
    #[error("the operation names another paymaster")]
    WrongPaymaster,
    /// The operation cannot be packed.
    #[error(transparent)]
    UserOp(#[from] UserOpError),
    /// The signer failed (local keys do not; remote signers may).
    #[error("the sponsor signer failed")]
    Signer(#[source] alloy::signers::Error),
}

impl ValidityWindow {
    fn encode(&self) -> Result<[u8; 12], SponsorError> {
        if self.valid_until > MAX_UINT48 || self.valid_after > MAX_UINT48 {
            return Err(SponsorError::WindowOutOfRange);
        }
        let mut out = [0u8; 12];
        out[..6].copy_from_slice(&self.valid_until.to_be_bytes()[2..]);
        out[6..].copy_from_slice(&self.valid_after.to_be_bytes()[2..]);
        Ok(out)
    }
}

/// The ERC-7677 stub `paymasterData`: the window and a 65-byte placeholder signature
/// (`0xff…ff1c`-shaped, never valid), the same length as real data.
///
/// # Errors
/// [`SponsorError::WindowOutOfRange`].
pub fn stub_paymaster_data(window: ValidityWindow) -> Result<Bytes, SponsorError> {
    let mut data = window.encode()?.to_vec();
    data.extend_from_slice(&[0xff; SPONSOR_SIGNATURE_LEN - 1]);
    data.push(0x1c);
    Ok(data.into())
}

/// The hash the sponsor key signs for `op` (its `paymasterAndData` must already hold
/// paymaster, gas limits and window; anything after byte 64 is ignored), the contract's
/// `SponsorPaymaster.getHash`.
pub fn sponsor_hash(
    op: &PackedUserOperation,
    entry_point: &ResolvedEntryPoint,
    paymaster: Address,
    window: ValidityWindow,
) -> B256 {
    let pm = &op.paymaster_and_data;
    let head = &pm[..pm.len().min(SPONSOR_SIGNATURE_OFFSET)];
    keccak256(
        (
            op.sender,
            op.nonce,
            keccak256(&op.init_code),
            keccak256(&op.call_data),
            op.account_gas_limits,
            op.pre_verification_gas,
            op.gas_fees,
            keccak256(head),
            U256::from(entry_point.chain().get()),
            entry_point.address(),
            paymaster,
            U256::from(window.valid_until),
            U256::from(window.valid_after),
        )
            .abi_encode(),
    )
}

/// Sets `op.paymaster = paymaster` (gas limits as given in `op`) and fills
/// `op.paymasterData` with `window ‖ signature`, the signature of `signer` (the sponsor
/// key) over [`sponsor_hash`]. The account signs **after** this (its hash covers
/// `paymasterAndData`).
///
/// # Errors
/// [`SponsorError::WrongPaymaster`] when `op` names another paymaster,
/// [`SponsorError::WindowOutOfRange`], [`SponsorError::UserOp`] when `op` cannot be
/// packed, [`SponsorError::Signer`].
pub async fn sign_sponsorship<S: Signer + Sync>(
    signer: &S,
    op: &mut UserOperation,
    entry_point: &ResolvedEntryPoint,
    paymaster: Address,
    window: ValidityWindow,
) -> Result<(), SponsorError> {
    if op.paymaster.is_some_and(|p| p != paymaster) {
        return Err(SponsorError::WrongPaymaster);
    }
    op.paymaster = Some(paymaster);
    op.paymaster_data = Bytes::copy_from_slice(&window.encode()?);
    let hash = sponsor_hash(&op.pack()?, entry_point, paymaster, window);
    let signature = signer
        .sign_message(hash.as_slice())
        .await
        .map_err(SponsorError::Signer)?;
    let mut data = window.encode()?.to_vec();
    data.extend_from_slice(&signature.as_bytes());
    op.paymaster_data = data.into();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_encoding_is_two_uint48() {
        let w = ValidityWindow {
            valid_until: 0x0102_0304_0506,
            valid_after: 7,
        };
        assert_eq!(w.encode().unwrap(), [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 7]);
        let stub = stub_paymaster_data(w).unwrap();
        assert_eq!(stub.len(), 12 + SPONSOR_SIGNATURE_LEN);
        assert!(matches!(
            ValidityWindow {
                valid_until: MAX_UINT48 + 1,
                valid_after: 0
            }
            .encode(),
            Err(SponsorError::WindowOutOfRange)
        ));
    }
}
