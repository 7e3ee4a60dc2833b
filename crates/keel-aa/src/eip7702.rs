//! User operations of EIP-7702 accounts (issue 33 §5): an externally owned account
//! whose code points at a delegate contract (`0xef0100 ‖ delegate`, EIP-7702), set by
//! an authorization the account signs.
//!
//! An operation carries the authorization in ERC-7769's `eip7702Auth` when its sender
//! is not delegated yet (or is to be delegated anew). Keel then:
//!
//! - checks it at `eth_sendUserOperation` ([`check`], before any simulation): the
//!   signature's `yParity` is 0 or 1, `s` is in the lower half of the curve order
//!   (EIP-2, as EIP-7702 requires), the nonce fits 64 bits, the chain id is 0 or the
//!   route's chain, and the signer — the authority — is the operation's `sender`. Each
//!   refusal is JSON-RPC `-32602` naming the field (`eip7702Auth`,
//!   `eip7702Auth.chainId`);
//! - simulates, traces and estimates the operation with the authorization applied
//!   (`authorizationList` in `eth_call`, `debug_traceCall` and `eth_estimateGas`, as
//!   geth and Anvil accept it): an authorization the chain would skip (its nonce is not
//!   the account's) leaves the sender without code, and the EntryPoint refuses the
//!   operation (`-32500`, `AA20 account not deployed`);
//! - requires `preVerificationGas` to cover the authorization's intrinsic cost,
//!   [`PER_AUTHORIZATION_GAS`] (EIP-7702 `PER_EMPTY_ACCOUNT_COST`, charged to the
//!   bundle transaction), and estimates it so;
//! - sends a bundle holding such operations as an EIP-7702 (type 4, SetCode)
//!   transaction whose authorization list carries theirs ([`authorization_list`]).
//!
//! Once the sender's code is the delegation, its later operations need no
//! `eip7702Auth` (EntryPoint v0.8 treats the sender as a deployed account). The
//! `initCode` marker `0x7702` ([`crate::EIP7702_MARKER`]) additionally asks the
//! EntryPoint to call the sender with `factoryData` as its initialisation, and makes
//! the operation hash commit to the delegate ([`crate::user_op`]).

use crate::admission::Refusal;
use crate::user_op::{Eip7702Auth, UserOperation};
use alloy::eips::eip7702::{Authorization, SignedAuthorization};
use alloy::primitives::U256;

/// The intrinsic gas of one authorization in a type-4 transaction, gas units (EIP-7702
/// `PER_EMPTY_ACCOUNT_COST`; the chain refunds part of it when the account exists).
pub const PER_AUTHORIZATION_GAS: u128 = 25_000;

/// Half the secp256k1 group order: a signature's `s` must not exceed it (EIP-2, which
/// EIP-7702 applies to authorizations).
const SECP256K1_HALF_ORDER: U256 = U256::from_be_slice(&[
    0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0x5d, 0x57, 0x6e, 0x73, 0x57, 0xa4, 0x50, 0x1d, 0xdf, 0xe9, 0x2f, 0x46, 0x68, 0x1b, 0x20, 0xa0,
]);

/// The authorization of `auth` in alloy's form, unchecked (nothing is recovered).
///
/// # Errors
/// A [`Refusal`] naming `eip7702Auth` when `yParity` is not 0 or 1, `s` is above half
/// the curve order (EIP-2) or the nonce does not fit 64 bits (EIP-7702 bounds it by
/// 2^64 − 1).
pub fn signed_authorization(auth: &Eip7702Auth) -> Result<SignedAuthorization, Refusal> {
    let malformed = || Refusal::invalid("eip7702Auth", "EIP7702_AUTH_MALFORMED");
    let y_parity = match u8::try_from(auth.y_parity) {
        Ok(y @ (0 | 1)) => y,
        _ => return Err(malformed()),
    };
    if auth.s > SECP256K1_HALF_ORDER || auth.s.is_zero() || auth.r.is_zero() {
        return Err(malformed());
    }
    let nonce = u64::try_from(auth.nonce).map_err(|_| malformed())?;
    Ok(SignedAuthorization::new_unchecked(
        Authorization {
            chain_id: auth.chain_id,
            address: auth.address,
            nonce,
        },
        y_parity,
        auth.r,
        auth.s,
    ))
}

/// The admission checks of an operation's `eip7702Auth` on chain `chain_id` (see the
/// module docs); an operation without one passes.
///
/// # Errors
/// The first [`Refusal`] that applies: `EIP7702_AUTH_MALFORMED` (field `eip7702Auth`),
/// `EIP7702_AUTH_CHAIN_ID` (field `eip7702Auth.chainId`: neither 0 nor the chain),
/// `EIP7702_AUTH_NOT_SENDER` (field `eip7702Auth`: the signature does not recover to
/// `sender`).
pub fn check(op: &UserOperation, chain_id: u64) -> Result<(), Refusal> {
    let Some(auth) = &op.eip7702_auth else {
        return Ok(());
    };
    let signed = signed_authorization(auth)?;
    if !auth.chain_id.is_zero() && auth.chain_id != U256::from(chain_id) {
        return Err(Refusal::invalid(
            "eip7702Auth.chainId",
            "EIP7702_AUTH_CHAIN_ID",
        ));
    }
    match signed.recover_authority() {
        Ok(authority) if authority == op.sender => Ok(()),
        _ => Err(Refusal::invalid("eip7702Auth", "EIP7702_AUTH_NOT_SENDER")),
    }
}

/// The intrinsic gas `op`'s authorization adds to a bundle transaction, gas units:
/// [`PER_AUTHORIZATION_GAS`] with an `eip7702Auth`, else 0.
pub fn authorization_gas(op: &UserOperation) -> u128 {
    if op.eip7702_auth.is_some() {
        PER_AUTHORIZATION_GAS
    } else {
        0
    }
}

/// The authorization list of a transaction carrying `ops` (`handleOps`, or its
/// simulation): each operation's `eip7702Auth` in order, those that do not convert left
/// out (admission refused them already). `None` when no operation has one (an EIP-1559
/// transaction or call).
pub fn authorization_list<'a>(
    ops: impl IntoIterator<Item = &'a UserOperation>,
) -> Option<Vec<SignedAuthorization>> {
    let list: Vec<SignedAuthorization> = ops
        .into_iter()
        .filter_map(|op| op.eip7702_auth.as_ref())
        .filter_map(|a| signed_authorization(a).ok())
        .collect();
    (!list.is_empty()).then_some(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::{Address, address};
    use alloy::signers::SignerSync;
    use alloy::signers::local::PrivateKeySigner;

    const DELEGATE: Address = address!("0x00000000000000000000000000000000000a7702");

    fn signed_by(key: &PrivateKeySigner, chain_id: u64, nonce: u64) -> Eip7702Auth {
        let auth = Authorization {
            chain_id: U256::from(chain_id),
            address: DELEGATE,
            nonce,
        };
        let sig = key.sign_hash_sync(&auth.signature_hash()).expect("signs");
        Eip7702Auth {
            chain_id: auth.chain_id,
            address: DELEGATE,
            nonce: U256::from(nonce),
            y_parity: U256::from(u8::from(sig.v())),
            r: sig.r(),
            s: sig.s(),
        }
    }

    fn op_of(sender: Address, eip7702_auth: Option<Eip7702Auth>) -> UserOperation {
        UserOperation {
            sender,
            nonce: U256::ZERO,
            factory: None,
            factory_data: Default::default(),
            call_data: Default::default(),
            call_gas_limit: 100_000,
            verification_gas_limit: 100_000,
            pre_verification_gas: U256::from(100_000u64),
            max_fee_per_gas: keel_units::Wei::from(2u64),
            max_priority_fee_per_gas: keel_units::Wei::from(1u64),
            paymaster: None,
            paymaster_verification_gas_limit: 0,
            paymaster_post_op_gas_limit: 0,
            paymaster_data: Default::default(),
            signature: Default::default(),
            eip7702_auth,
        }
    }

    #[test]
    fn an_authorization_by_the_sender_on_this_chain_or_any_chain_passes() {
        let key = PrivateKeySigner::random();
        for chain in [0, 31_337] {
            let op = op_of(key.address(), Some(signed_by(&key, chain, 0)));
            assert_eq!(check(&op, 31_337), Ok(()));
        }
        assert_eq!(check(&op_of(key.address(), None), 31_337), Ok(()));
    }

    #[test]
    fn each_broken_authorization_is_refused_naming_its_field() {
        let key = PrivateKeySigner::random();
        let other = PrivateKeySigner::random();
        let reason = |op: &UserOperation| check(op, 31_337).map_err(|r| (r.field, r.reason));
        // Signed by another key than the sender's.
        let op = op_of(key.address(), Some(signed_by(&other, 31_337, 0)));
        assert_eq!(reason(&op), Err(("eip7702Auth", "EIP7702_AUTH_NOT_SENDER")));
        // Another chain.
        let op = op_of(key.address(), Some(signed_by(&key, 1, 0)));
        assert_eq!(
            reason(&op),
            Err(("eip7702Auth.chainId", "EIP7702_AUTH_CHAIN_ID"))
        );
        // yParity out of range, high s, zero r, nonce over 64 bits.
        let good = signed_by(&key, 31_337, 0);
        let mut bad = Vec::new();
        bad.push(Eip7702Auth {
            y_parity: U256::from(27u8),
            ..good.clone()
        });
        bad.push(Eip7702Auth {
            s: SECP256K1_HALF_ORDER + U256::from(1u8),
            ..good.clone()
        });
        bad.push(Eip7702Auth {
            r: U256::ZERO,
            ..good.clone()
        });
        bad.push(Eip7702Auth {
            nonce: U256::from(u64::MAX) + U256::from(1u8),
            ..good.clone()
        });
        for b in bad {
            let op = op_of(key.address(), Some(b));
            assert_eq!(reason(&op), Err(("eip7702Auth", "EIP7702_AUTH_MALFORMED")));
        }
    }

    #[test]
    fn the_authorization_list_keeps_each_operations_authorization_in_order() {
        let (a, b) = (PrivateKeySigner::random(), PrivateKeySigner::random());
        let ops = [
            op_of(a.address(), Some(signed_by(&a, 31_337, 3))),
            op_of(b.address(), None),
            op_of(b.address(), Some(signed_by(&b, 0, 0))),
        ];
        let list = authorization_list(&ops).expect("two authorizations");
        let authorities: Vec<Address> = list
            .iter()
            .map(|s| s.recover_authority().expect("recovers"))
            .collect();
        assert_eq!(authorities, vec![a.address(), b.address()]);
        assert_eq!(list[0].nonce, 3);
        assert!(authorization_list(&ops[1..2]).is_none());
        assert_eq!(authorization_gas(&ops[0]), PER_AUTHORIZATION_GAS);
        assert_eq!(authorization_gas(&ops[1]), 0);
    }
}
