//! User operations: the ERC-7769 JSON-RPC form ([`UserOperation`], unpacked fields) and
//! the on-chain v0.7+/v0.8 form ([`PackedUserOperation`]), conversions both ways, and the
//! operation hashes of EntryPoint v0.7 and v0.8.
//!
//! Packing (ERC-4337 v0.7+):
//! - `initCode = factory ‖ factoryData` (empty without a factory);
//! - `accountGasLimits = verificationGasLimit (16 bytes) ‖ callGasLimit (16 bytes)`;
//! - `gasFees = maxPriorityFeePerGas (16 bytes) ‖ maxFeePerGas (16 bytes)`;
//! - `paymasterAndData = paymaster ‖ paymasterVerificationGasLimit (16) ‖
//!   paymasterPostOpGasLimit (16) ‖ paymasterData` (empty without a paymaster).
//!
//! Hashes:
//! - v0.7 ([`user_op_hash_v07`]): `keccak256(abi.encode(keccak256(pack(op)), entryPoint, chainId))`
//!   where `pack(op) = abi.encode(sender, nonce, keccak256(initCode), keccak256(callData),
//!   accountGasLimits, preVerificationGas, gasFees, keccak256(paymasterAndData))`.
//! - v0.8 ([`user_op_hash_v08`]): EIP-712 with domain `{name: "ERC4337", version: "1",
//!   chainId, verifyingContract: entryPoint}` over `PackedUserOperation(address sender,
//!   uint256 nonce,bytes initCode,bytes callData,bytes32 accountGasLimits,uint256
//!   preVerificationGas,bytes32 gasFees,bytes paymasterAndData)`. **EIP-7702 rule**: when
//!   `initCode` starts with the marker `0x7702` padded with zeros to 20 bytes
//!   ([`EIP7702_MARKER`]), the hashed `initCode` is `delegate ‖ initCode[20..]`, the
//!   delegate being the address the sender's code (`0xef0100 ‖ delegate`) points at.
//!
//! Every hash takes a [`ResolvedEntryPoint`]: chain id and EntryPoint come from the
//! resolution boundary only.

use crate::entry_point::ResolvedEntryPoint;
use alloy::primitives::{Address, B256, Bytes, U256, address, keccak256};
use alloy::sol_types::SolValue;
use keel_abi::erc4337::IEntryPointV08;
use keel_units::Wei;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The EIP-7702 `initCode` marker of EntryPoint v0.8: `0x7702` left-aligned in 20 bytes.
/// As a `factory` it means "the sender is an EIP-7702 account" (ERC-7769 also allows the
/// short form `"0x7702"` on input).
pub const EIP7702_MARKER: Address = address!("0x7702000000000000000000000000000000000000");

/// Offset of the paymaster data inside `paymasterAndData` (20 + 16 + 16 bytes).
pub const PAYMASTER_DATA_OFFSET: usize = 52;

/// `keccak256("PackedUserOperation(address sender,uint256 nonce,bytes initCode,bytes callData,bytes32 accountGasLimits,uint256 preVerificationGas,bytes32 gasFees,bytes paymasterAndData)")`.
pub fn packed_user_op_typehash() -> B256 {
    keccak256(
        "PackedUserOperation(address sender,uint256 nonce,bytes initCode,bytes callData,bytes32 accountGasLimits,uint256 preVerificationGas,bytes32 gasFees,bytes paymasterAndData)",
    )
}

/// Why a user operation cannot be converted or hashed. Messages never echo field values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UserOpError {
    /// A field packed into 16 bytes (`maxFeePerGas`, `maxPriorityFeePerGas`) exceeds `u128`.
    #[error("{field} exceeds 128 bits")]
    FieldTooLarge {
        /// The ERC-7769 field name.
        field: &'static str,
    },
    /// `initCode` is 1–19 bytes long and is not the EIP-7702 marker (no factory address).
    #[error("initCode is shorter than a factory address")]
    InitCodeTooShort,
    /// `paymasterAndData` is non-empty but shorter than 52 bytes.
    #[error("paymasterAndData is shorter than 52 bytes")]
    PaymasterAndDataTooShort,
    /// `factoryData` (or a paymaster field) was given without `factory` (or `paymaster`).
    #[error("{field} given without {requires}")]
    Orphan {
        /// The field given.
        field: &'static str,
        /// The field it needs.
        requires: &'static str,
    },
    /// The operation is an EIP-7702 one (marker `initCode`) but no delegate is known.
    #[error("EIP-7702 operation without a delegate (eip7702Auth or the sender's code)")]
    MissingEip7702Delegate,
}

/// ERC-7769 `eip7702Auth`: the EIP-7702 authorization a 7702 account's operation carries.
/// All numbers are `0x` hex quantities on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Eip7702Auth {
    /// EIP-155 chain id of the authorization (0 = any chain).
    pub chain_id: U256,
    /// The delegate contract the sender's code will point at.
    pub address: Address,
    /// The authority's account nonce.
    pub nonce: U256,
    /// Signature parity (0 or 1).
    pub y_parity: U256,
    /// Signature `r`.
    pub r: U256,
    /// Signature `s`.
    pub s: U256,
}

/// A user operation in the ERC-7769 JSON-RPC form of EntryPoint v0.7/v0.8 (unpacked
/// fields). Units: gas limits in gas, fees in **wei per gas** ([`Wei`]), `nonce` is the
/// ERC-4337 two-dimensional nonce (`key << 64 | sequence`).
///
/// Serde (camelCase, every number a `0x` hex quantity as ERC-7769 requires): `factory`
/// and `factoryData` appear together or not at all, likewise `paymaster`,
/// `paymasterVerificationGasLimit`, `paymasterPostOpGasLimit` and `paymasterData`;
/// `factory` accepts `"0x7702"` for the EIP-7702 marker. Decimal strings are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserOperation {
    /// The smart account.
    pub sender: Address,
    /// The account nonce (key ‖ sequence).
    pub nonce: U256,
    /// The factory creating the account (or [`EIP7702_MARKER`]), when it does not exist yet.
    pub factory: Option<Address>,
    /// The factory's calldata (empty without a factory).
    pub factory_data: Bytes,
    /// The account's calldata.
    pub call_data: Bytes,
    /// Gas of the execution call.
    pub call_gas_limit: u128,
    /// Gas of account creation plus `validateUserOp`.
    pub verification_gas_limit: u128,
    /// Gas paid for bundle overhead and calldata, not metered by the EntryPoint.
    pub pre_verification_gas: U256,
    /// EIP-1559 fee cap, wei per gas (≤ 2^128 − 1).
    pub max_fee_per_gas: Wei,
    /// EIP-1559 priority fee, wei per gas (≤ 2^128 − 1).
    pub max_priority_fee_per_gas: Wei,
    /// The paymaster, when one pays.
    pub paymaster: Option<Address>,
    /// Gas of `validatePaymasterUserOp` (0 without a paymaster).
    pub paymaster_verification_gas_limit: u128,
    /// Gas of `postOp` (0 without a paymaster).
    pub paymaster_post_op_gas_limit: u128,
    /// The paymaster's data (for Keel's SponsorPaymaster: window and signature).
    pub paymaster_data: Bytes,
    /// The account's signature over the operation hash.
    pub signature: Bytes,
    /// The EIP-7702 authorization (7702 accounts only).
    pub eip7702_auth: Option<Eip7702Auth>,
}

/// The on-chain form (`PackedUserOperation` of EntryPoint v0.7+), with serde in the
/// camelCase JSON of the struct (numbers as `0x` hex quantities).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackedUserOperation {
    /// The smart account.
    pub sender: Address,
    /// The account nonce.
    pub nonce: U256,
    /// `factory ‖ factoryData`, or empty.
    pub init_code: Bytes,
    /// The account's calldata.
    pub call_data: Bytes,
    /// `verificationGasLimit ‖ callGasLimit` (16 bytes each).
    pub account_gas_limits: B256,
    /// Pre-verification gas.
    pub pre_verification_gas: U256,
    /// `maxPriorityFeePerGas ‖ maxFeePerGas` (16 bytes each, wei per gas).
    pub gas_fees: B256,
    /// `paymaster ‖ verificationGas (16) ‖ postOpGas (16) ‖ paymasterData`, or empty.
    pub paymaster_and_data: Bytes,
    /// The account's signature.
    pub signature: Bytes,
}

fn pack_u128s(high: u128, low: u128) -> B256 {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&high.to_be_bytes());
    out[16..].copy_from_slice(&low.to_be_bytes());
    B256::from(out)
}

fn unpack_u128s(word: B256) -> (u128, u128) {
    let mut high = [0u8; 16];
    let mut low = [0u8; 16];
    high.copy_from_slice(&word[..16]);
    low.copy_from_slice(&word[16..]);
    (u128::from_be_bytes(high), u128::from_be_bytes(low))
}

fn u128_of(value: Wei, field: &'static str) -> Result<u128, UserOpError> {
    u128::try_from(value.get()).map_err(|_| UserOpError::FieldTooLarge { field })
}

/// True when `init_code` is the EIP-7702 marker as EntryPoint v0.8 reads it: at least 2
/// bytes, and its first 20 bytes (zero-padded when shorter) equal [`EIP7702_MARKER`].
pub fn is_eip7702_init_code(init_code: &[u8]) -> bool {
    if init_code.len() < 2 {
        return false;
    }
    let mut head = [0u8; 20];
    let n = init_code.len().min(20);
    head[..n].copy_from_slice(&init_code[..n]);
    head == EIP7702_MARKER.0.0
}

impl UserOperation {
    /// The packed form. `initCode` is `factory ‖ factoryData` as given (for a 7702
    /// operation, the 20-byte marker, not the delegate).
    ///
    /// # Errors
    /// [`UserOpError::FieldTooLarge`] when a fee exceeds 128 bits.
    pub fn pack(&self) -> Result<PackedUserOperation, UserOpError> {
        let init_code = match self.factory {
            Some(f) => [f.as_slice(), self.factory_data.as_ref()].concat().into(),
            None => Bytes::new(),
        };
        let paymaster_and_data = match self.paymaster {
            Some(p) => [
                p.as_slice(),
                &self.paymaster_verification_gas_limit.to_be_bytes(),
                &self.paymaster_post_op_gas_limit.to_be_bytes(),
                self.paymaster_data.as_ref(),
            ]
            .concat()
            .into(),
            None => Bytes::new(),
        };
        Ok(PackedUserOperation {
            sender: self.sender,
            nonce: self.nonce,
            init_code,
            call_data: self.call_data.clone(),
            account_gas_limits: pack_u128s(self.verification_gas_limit, self.call_gas_limit),
            pre_verification_gas: self.pre_verification_gas,
            gas_fees: pack_u128s(
                u128_of(self.max_priority_fee_per_gas, "maxPriorityFeePerGas")?,
                u128_of(self.max_fee_per_gas, "maxFeePerGas")?,
            ),
            paymaster_and_data,
            signature: self.signature.clone(),
        })
    }

    /// The v0.8 operation hash (EIP-712, see the module docs). For an EIP-7702
    /// operation the delegate is `eip7702_auth.address` (what the sender's code will
    /// point at once the authorization is included).
    ///
    /// # Errors
    /// As [`UserOperation::pack`]; [`UserOpError::MissingEip7702Delegate`] for a 7702
    /// operation without `eip7702Auth` (use [`user_op_hash_v08`] with the on-chain delegate).
    pub fn hash_v08(&self, entry_point: &ResolvedEntryPoint) -> Result<B256, UserOpError> {
        let delegate = self.eip7702_auth.as_ref().map(|a| a.address);
        user_op_hash_v08(&self.pack()?, entry_point, delegate)
    }

    /// The v0.7 operation hash (see the module docs).
    ///
    /// # Errors
    /// As [`UserOperation::pack`].
    pub fn hash_v07(&self, entry_point: &ResolvedEntryPoint) -> Result<B256, UserOpError> {
        Ok(user_op_hash_v07(&self.pack()?, entry_point))
    }
}

impl PackedUserOperation {
    /// The unpacked (ERC-7769) form; `eip7702_auth` is `None` (it is not on chain).
    /// `pack(unpack(p)) == p` for every valid `p`.
    ///
    /// # Errors
    /// [`UserOpError::InitCodeTooShort`] for a 1–19-byte `initCode` that is not the
    /// EIP-7702 marker; [`UserOpError::PaymasterAndDataTooShort`] for a 1–51-byte
    /// `paymasterAndData`.
    pub fn unpack(&self) -> Result<UserOperation, UserOpError> {
        let (factory, factory_data) = match self.init_code.len() {
            0 => (None, Bytes::new()),
            n if n < 20 => return Err(UserOpError::InitCodeTooShort),
            _ => (
                Some(Address::from_slice(&self.init_code[..20])),
                self.init_code.slice(20..),
            ),
        };
        let (paymaster, pm_verification, pm_post_op, paymaster_data) =
            match self.paymaster_and_data.len() {
                0 => (None, 0, 0, Bytes::new()),
                n if n < PAYMASTER_DATA_OFFSET => {
                    return Err(UserOpError::PaymasterAndDataTooShort);
                }
                _ => {
                    let d = &self.paymaster_and_data;
                    let mut v = [0u8; 16];
                    let mut p = [0u8; 16];
                    v.copy_from_slice(&d[20..36]);
                    p.copy_from_slice(&d[36..52]);
                    (
                        Some(Address::from_slice(&d[..20])),
                        u128::from_be_bytes(v),
                        u128::from_be_bytes(p),
                        d.slice(PAYMASTER_DATA_OFFSET..),
                    )
                }
            };
        let (verification_gas_limit, call_gas_limit) = unpack_u128s(self.account_gas_limits);
        let (max_priority, max_fee) = unpack_u128s(self.gas_fees);
        Ok(UserOperation {
            sender: self.sender,
            nonce: self.nonce,
            factory,
            factory_data,
            call_data: self.call_data.clone(),
            call_gas_limit,
            verification_gas_limit,
            pre_verification_gas: self.pre_verification_gas,
            max_fee_per_gas: Wei::new(U256::from(max_fee)),
            max_priority_fee_per_gas: Wei::new(U256::from(max_priority)),
            paymaster,
            paymaster_verification_gas_limit: pm_verification,
            paymaster_post_op_gas_limit: pm_post_op,
            paymaster_data,
            signature: self.signature.clone(),
            eip7702_auth: None,
        })
    }

    /// The `sol!` struct of `keel-abi` (the `handleOps` / `getUserOpHash` argument).
    pub fn to_sol(&self) -> IEntryPointV08::PackedUserOperation {
        IEntryPointV08::PackedUserOperation {
            sender: self.sender,
            nonce: self.nonce,
            initCode: self.init_code.clone(),
            callData: self.call_data.clone(),
            accountGasLimits: self.account_gas_limits,
            preVerificationGas: self.pre_verification_gas,
            gasFees: self.gas_fees,
            paymasterAndData: self.paymaster_and_data.clone(),
            signature: self.signature.clone(),
        }
    }

    /// From the `sol!` struct of `keel-abi`.
    pub fn from_sol(op: &IEntryPointV08::PackedUserOperation) -> Self {
        Self {
            sender: op.sender,
            nonce: op.nonce,
            init_code: op.initCode.clone(),
            call_data: op.callData.clone(),
            account_gas_limits: op.accountGasLimits,
            pre_verification_gas: op.preVerificationGas,
            gas_fees: op.gasFees,
            paymaster_and_data: op.paymasterAndData.clone(),
            signature: op.signature.clone(),
        }
    }
}

/// The v0.7 operation hash: `keccak256(abi.encode(keccak256(pack(op)), entryPoint, chainId))`.
pub fn user_op_hash_v07(op: &PackedUserOperation, entry_point: &ResolvedEntryPoint) -> B256 {
    let packed = (
        op.sender,
        op.nonce,
        keccak256(&op.init_code),
        keccak256(&op.call_data),
        op.account_gas_limits,
        op.pre_verification_gas,
        op.gas_fees,
        keccak256(&op.paymaster_and_data),
    )
        .abi_encode();
    keccak256(
        (
            keccak256(packed),
            entry_point.address(),
            U256::from(entry_point.chain().get()),
        )
            .abi_encode(),
    )
}

/// The EIP-712 domain separator of EntryPoint v0.8 on its chain:
/// `keccak256(abi.encode(EIP712Domain typehash, keccak256("ERC4337"), keccak256("1"), chainId, entryPoint))`.
pub fn domain_separator_v08(entry_point: &ResolvedEntryPoint) -> B256 {
    let typehash = keccak256(
        "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)",
    );
    keccak256(
        (
            typehash,
            keccak256("ERC4337"),
            keccak256("1"),
            U256::from(entry_point.chain().get()),
            entry_point.address(),
        )
            .abi_encode(),
    )
}

/// The hash of `initCode` as v0.8 puts it in the struct hash: for the EIP-7702 marker
/// `keccak256(delegate ‖ initCode[20..])`, else `keccak256(initCode)`.
///
/// # Errors
/// [`UserOpError::MissingEip7702Delegate`] for a marker `initCode` with no delegate.
pub fn init_code_hash_v08(
    init_code: &[u8],
    eip7702_delegate: Option<Address>,
) -> Result<B256, UserOpError> {
    if !is_eip7702_init_code(init_code) {
        return Ok(keccak256(init_code));
    }
    let delegate = eip7702_delegate.ok_or(UserOpError::MissingEip7702Delegate)?;
    let rest = init_code.get(20..).unwrap_or_default();
    Ok(keccak256([delegate.as_slice(), rest].concat()))
}

/// The v0.8 operation hash (what `EntryPoint.getUserOpHash` returns and the account
/// signs): EIP-712 over the packed struct (signature excluded) in the EntryPoint's domain.
/// `eip7702_delegate` is needed only when `initCode` is the EIP-7702 marker.
///
/// # Errors
/// [`UserOpError::MissingEip7702Delegate`] as [`init_code_hash_v08`].
pub fn user_op_hash_v08(
    op: &PackedUserOperation,
    entry_point: &ResolvedEntryPoint,
    eip7702_delegate: Option<Address>,
) -> Result<B256, UserOpError> {
    let struct_hash = keccak256(
        (
            packed_user_op_typehash(),
            op.sender,
            op.nonce,
            init_code_hash_v08(&op.init_code, eip7702_delegate)?,
            keccak256(&op.call_data),
            op.account_gas_limits,
            op.pre_verification_gas,
            op.gas_fees,
            keccak256(&op.paymaster_and_data),
        )
            .abi_encode(),
    );
    let mut digest = Vec::with_capacity(66);
    digest.extend_from_slice(&[0x19, 0x01]);
    digest.extend_from_slice(domain_separator_v08(entry_point).as_slice());
    digest.extend_from_slice(struct_hash.as_slice());
    Ok(keccak256(digest))
}

/// The EIP-7702 delegate an account's code designates (`0xef0100 ‖ delegate`), or
/// `None` when `code` is not a delegation designator.
pub fn eip7702_delegate_of(code: &[u8]) -> Option<Address> {
    (code.len() == 23 && code[..3] == [0xef, 0x01, 0x00]).then(|| Address::from_slice(&code[3..]))
}

// ---- serde of the ERC-7769 form ----

mod quantity {
    //! `0x` hex quantities (ERC-7769): no leading zeros on output, hex only on input.
    use alloy::primitives::U256;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer};

    pub(super) fn parse(s: &str) -> Result<U256, &'static str> {
        let digits = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .ok_or("expected a 0x-prefixed hex quantity")?;
        if digits.is_empty() || digits.len() > 64 {
            return Err("expected 1 to 64 hex digits");
        }
        U256::from_str_radix(digits, 16).map_err(|_| "expected hex digits")
    }

    pub(super) fn de_u256<'de, D: Deserializer<'de>>(d: D) -> Result<U256, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(D::Error::custom)
    }

    pub(super) fn de_u128<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        let v = de_u256(d)?;
        u128::try_from(v).map_err(|_| D::Error::custom("quantity exceeds 128 bits"))
    }
}

fn ser_hex<S: Serializer>(v: &U256, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:#x}"))
}

fn ser_hex_u128<S: Serializer>(v: &u128, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:#x}"))
}

fn ser_hex_wei<S: Serializer>(v: &Wei, s: S) -> Result<S::Ok, S::Error> {
    ser_hex(&v.get(), s)
}

fn de_wei<'de, D: Deserializer<'de>>(d: D) -> Result<Wei, D::Error> {
    quantity::de_u256(d).map(Wei::new)
}

fn de_factory<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Address>, D::Error> {
    use serde::de::Error as _;
    let s: Option<String> = Option::deserialize(d)?;
    match s.as_deref() {
        None => Ok(None),
        Some("0x7702") => Ok(Some(EIP7702_MARKER)),
        Some(other) => other
            .parse::<Address>()
            .map(Some)
            .map_err(|_| D::Error::custom("factory is not a 20-byte address")),
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    sender: Address,
    #[serde(serialize_with = "ser_hex", deserialize_with = "quantity::de_u256")]
    nonce: U256,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_factory"
    )]
    factory: Option<Address>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    factory_data: Option<Bytes>,
    call_data: Bytes,
    #[serde(
        serialize_with = "ser_hex_u128",
        deserialize_with = "quantity::de_u128"
    )]
    call_gas_limit: u128,
    #[serde(
        serialize_with = "ser_hex_u128",
        deserialize_with = "quantity::de_u128"
    )]
    verification_gas_limit: u128,
    #[serde(serialize_with = "ser_hex", deserialize_with = "quantity::de_u256")]
    pre_verification_gas: U256,
    #[serde(serialize_with = "ser_hex_wei", deserialize_with = "de_wei")]
    max_fee_per_gas: Wei,
    #[serde(serialize_with = "ser_hex_wei", deserialize_with = "de_wei")]
    max_priority_fee_per_gas: Wei,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    paymaster: Option<Address>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_opt_u128",
        deserialize_with = "de_opt_u128"
    )]
    paymaster_verification_gas_limit: Option<u128>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_opt_u128",
        deserialize_with = "de_opt_u128"
    )]
    paymaster_post_op_gas_limit: Option<u128>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    paymaster_data: Option<Bytes>,
    signature: Bytes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    eip7702_auth: Option<Eip7702Auth>,
}

fn ser_opt_u128<S: Serializer>(v: &Option<u128>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => ser_hex_u128(v, s),
        None => s.serialize_none(),
    }
}

fn de_opt_u128<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u128>, D::Error> {
    use serde::de::Error as _;
    let s: Option<String> = Option::deserialize(d)?;
    s.map(|s| {
        quantity::parse(&s)
            .map_err(D::Error::custom)
            .and_then(|v| u128::try_from(v).map_err(|_| D::Error::custom("exceeds 128 bits")))
    })
    .transpose()
}

impl Serialize for UserOperation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let with_factory = self.factory.is_some();
        let with_paymaster = self.paymaster.is_some();
        Wire {
            sender: self.sender,
            nonce: self.nonce,
            factory: self.factory,
            factory_data: with_factory.then(|| self.factory_data.clone()),
            call_data: self.call_data.clone(),
            call_gas_limit: self.call_gas_limit,
            verification_gas_limit: self.verification_gas_limit,
            pre_verification_gas: self.pre_verification_gas,
            max_fee_per_gas: self.max_fee_per_gas,
            max_priority_fee_per_gas: self.max_priority_fee_per_gas,
            paymaster: self.paymaster,
            paymaster_verification_gas_limit: with_paymaster
                .then_some(self.paymaster_verification_gas_limit),
            paymaster_post_op_gas_limit: with_paymaster.then_some(self.paymaster_post_op_gas_limit),
            paymaster_data: with_paymaster.then(|| self.paymaster_data.clone()),
            signature: self.signature.clone(),
            eip7702_auth: self.eip7702_auth.clone(),
        }
        .serialize(s)
    }
}

impl TryFrom<Wire> for UserOperation {
    type Error = UserOpError;

    fn try_from(w: Wire) -> Result<Self, UserOpError> {
        let orphan = |field, requires| UserOpError::Orphan { field, requires };
        if w.factory.is_none() && w.factory_data.as_ref().is_some_and(|d| !d.is_empty()) {
            return Err(orphan("factoryData", "factory"));
        }
        if w.paymaster.is_none() {
            if w.paymaster_verification_gas_limit.is_some_and(|v| v != 0) {
                return Err(orphan("paymasterVerificationGasLimit", "paymaster"));
            }
            if w.paymaster_post_op_gas_limit.is_some_and(|v| v != 0) {
                return Err(orphan("paymasterPostOpGasLimit", "paymaster"));
            }
            if w.paymaster_data.as_ref().is_some_and(|d| !d.is_empty()) {
                return Err(orphan("paymasterData", "paymaster"));
            }
        }
        for (field, fee) in [
            ("maxFeePerGas", w.max_fee_per_gas),
            ("maxPriorityFeePerGas", w.max_priority_fee_per_gas),
        ] {
            u128_of(fee, field)?;
        }
        Ok(Self {
            sender: w.sender,
            nonce: w.nonce,
            factory: w.factory,
            factory_data: w.factory_data.unwrap_or_default(),
            call_data: w.call_data,
            call_gas_limit: w.call_gas_limit,
            verification_gas_limit: w.verification_gas_limit,
            pre_verification_gas: w.pre_verification_gas,
            max_fee_per_gas: w.max_fee_per_gas,
            max_priority_fee_per_gas: w.max_priority_fee_per_gas,
            paymaster: w.paymaster,
            paymaster_verification_gas_limit: w.paymaster_verification_gas_limit.unwrap_or(0),
            paymaster_post_op_gas_limit: w.paymaster_post_op_gas_limit.unwrap_or(0),
            paymaster_data: w.paymaster_data.unwrap_or_default(),
            signature: w.signature,
            eip7702_auth: w.eip7702_auth,
        })
    }
}

impl<'de> Deserialize<'de> for UserOperation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        Self::try_from(Wire::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// Why a JSON user operation was refused by [`parse_user_operation`]: the ERC-7769 field at
/// fault and what is wrong with it. Never holds a value the client sent (a field name the
/// client invented is named only when it is a plain identifier of at most 64 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed user operation: {field} {problem}")]
pub struct MalformedField {
    /// The field's JSON name, a dotted path inside `eip7702Auth`
    /// (`eip7702Auth.chainId`), or `userOperation` for the whole value.
    pub field: String,
    /// What is wrong, e.g. `is missing`, `is not a 0x-prefixed hex quantity`.
    pub problem: &'static str,
}

/// The problem text of one of this module's own serde messages, else a generic one.
fn problem_of(message: &str) -> &'static str {
    const KNOWN: [(&str, &str); 6] = [
        (
            "expected a 0x-prefixed hex quantity",
            "is not a 0x-prefixed hex quantity",
        ),
        (
            "expected 1 to 64 hex digits",
            "must have 1 to 64 hex digits",
        ),
        ("expected hex digits", "is not a 0x-prefixed hex quantity"),
        ("quantity exceeds 128 bits", "exceeds 128 bits"),
        ("exceeds 128 bits", "exceeds 128 bits"),
        (
            "factory is not a 20-byte address",
            "is not a 20-byte address or 0x7702",
        ),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| message.starts_with(m))
        .map_or("does not have the ERC-7769 form (0x hex)", |(_, p)| p)
}

/// The backquoted name in a serde `missing field` / `unknown field` message, when it is a
/// plain identifier (so a client's invented key is never echoed unless harmless).
fn quoted_name(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    let name = &message[start..start + len];
    (!name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    .then(|| name.to_owned())
}

/// Parses the ERC-7769 JSON form of a user operation (as [`UserOperation`]'s serde does),
/// naming the field at fault when it does not parse.
///
/// # Errors
/// [`MalformedField`]: the operation is not an object, a required field is missing
/// (`sender`, `nonce`, `callData`, `callGasLimit`, `verificationGasLimit`,
/// `preVerificationGas`, `maxFeePerGas`, `maxPriorityFeePerGas`, `signature`), a field is
/// unknown, a value does not have its form (0x hex quantity, 20-byte address, 0x bytes),
/// a fee exceeds 128 bits, or a factory / paymaster field is given without `factory` /
/// `paymaster` (ERC-7769 "optional fields appear together").
pub fn parse_user_operation(value: &serde_json::Value) -> Result<UserOperation, MalformedField> {
    if !value.is_object() {
        return Err(MalformedField {
            field: "userOperation".to_owned(),
            problem: "is not a JSON object",
        });
    }
    let wire: Wire = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        if message.starts_with("missing field") {
            let name = quoted_name(&message).unwrap_or_else(|| "userOperation".to_owned());
            let field = if path == "." {
                name
            } else {
                format!("{path}.{name}")
            };
            MalformedField {
                field,
                problem: "is missing",
            }
        } else if message.starts_with("unknown field") {
            MalformedField {
                field: quoted_name(&message).unwrap_or_else(|| "userOperation".to_owned()),
                problem: "is not a field of a user operation (ERC-7769)",
            }
        } else {
            MalformedField {
                field: if path == "." {
                    "userOperation".to_owned()
                } else {
                    path
                },
                problem: problem_of(&message),
            }
        }
    })?;
    UserOperation::try_from(wire).map_err(|e| match e {
        UserOpError::Orphan { field, requires } => MalformedField {
            field: field.to_owned(),
            problem: if requires == "factory" {
                "is given without factory"
            } else {
                "is given without paymaster"
            },
        },
        UserOpError::FieldTooLarge { field } => MalformedField {
            field: field.to_owned(),
            problem: "exceeds 128 bits",
        },
        _ => MalformedField {
            field: "userOperation".to_owned(),
            problem: "does not pack",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::b256;
    use keel_units::ChainId;

    const EP08: Address = address!("0x4337084D9E255Ff0702461CF8895CE9E3b5Ff108");
    const ADDR: Address = address!("0x1234567890123456789012345678901234567890");

    /// viem's base operation (src/account-abstraction/utils/userOperation/getUserOperationHash.test.ts).
    fn viem_base() -> UserOperation {
        UserOperation {
            sender: ADDR,
            nonce: U256::ZERO,
            factory: None,
            factory_data: Bytes::new(),
            call_data: Bytes::new(),
            call_gas_limit: 6_942_069,
            verification_gas_limit: 6_942_069,
            pre_verification_gas: U256::from(6_942_069u64),
            max_fee_per_gas: Wei::from(69_420u64),
            max_priority_fee_per_gas: Wei::from(69u64),
            paymaster: None,
            paymaster_verification_gas_limit: 0,
            paymaster_post_op_gas_limit: 0,
            paymaster_data: Bytes::new(),
            signature: Bytes::new(),
            eip7702_auth: None,
        }
    }

    fn auth() -> Eip7702Auth {
        Eip7702Auth {
            chain_id: U256::from(1),
            address: ADDR,
            nonce: U256::ZERO,
            y_parity: U256::ZERO,
            r: U256::ZERO,
            s: U256::ZERO,
        }
    }

    fn with_paymaster(mut op: UserOperation, v: u128, p: u128, data: &[u8]) -> UserOperation {
        op.paymaster = Some(ADDR);
        op.paymaster_verification_gas_limit = v;
        op.paymaster_post_op_gas_limit = p;
        op.paymaster_data = Bytes::copy_from_slice(data);
        op
    }

    #[test]
    fn viem_v08_vectors() {
        let ep = ResolvedEntryPoint::for_tests(ChainId(1), EP08);
        let deadbeef = [0xde, 0xad, 0xbe, 0xef];
        let mut factory = viem_base();
        factory.factory = Some(ADDR);
        factory.factory_data = Bytes::copy_from_slice(&deadbeef);
        let mut auth_with_data = with_paymaster(viem_base(), 6_942_069, 6_942_069, &deadbeef);
        auth_with_data.factory = Some(EIP7702_MARKER);
        auth_with_data.factory_data = Bytes::copy_from_slice(&deadbeef);
        auth_with_data.eip7702_auth = Some(auth());
        let mut auth_no_data = auth_with_data.clone();
        auth_no_data.factory_data = Bytes::new();
        let cases = [
            (
                "default",
                viem_base(),
                b256!("0xa2224e732a1d4e2f923c7c05d586a0aa6cbc42172ec02f31d35fa9a2b8ba9208"),
            ),
            (
                "factory + factoryData",
                factory,
                b256!("0x3146c70a9ef7538e9b9aca8b00ad4b127ca7eef7817a557f1801acbf8d68c206"),
            ),
            (
                "paymaster",
                with_paymaster(viem_base(), 0, 0, &[]),
                b256!("0x364bff8f9104a3854dce4f61f8479ce3019a3bd23e1c8db4da0d7c22850835b9"),
            ),
            (
                "paymasterVerificationGasLimit",
                with_paymaster(viem_base(), 6_942_069, 0, &[]),
                b256!("0x9cb735eb4278caf0a9f53ad81e5f592e965c9d034f6e2780befa4cd09a990b04"),
            ),
            (
                "paymasterPostOpGasLimit",
                with_paymaster(viem_base(), 6_942_069, 6_942_069, &[]),
                b256!("0x745602113988c3a6f18215d96eecc85775998dcb190e374a0955e637d40fe018"),
            ),
            (
                "paymasterData",
                with_paymaster(viem_base(), 6_942_069, 6_942_069, &deadbeef),
                b256!("0xf10ef9afcf27a4fd17e477cd19f37e588e3ff7d48eade07ab5b7eb8caf75667f"),
            ),
            (
                "authorization + factoryData",
                auth_with_data,
                b256!("0xd96232eb5d02f483166b9b23dca3ec2b963d70f09b961fce348c51d306278462"),
            ),
            (
                "authorization",
                auth_no_data,
                b256!("0x66fe6eaaaf1d6727d404384354a720cb24694c697bfbab77b3d02345c2d6e1da"),
            ),
        ];
        for (name, op, expected) in cases {
            assert_eq!(op.hash_v08(&ep).unwrap(), expected, "viem v0.8 {name}");
        }
    }

    #[test]
    fn viem_v07_vectors() {
        let ep = ResolvedEntryPoint::for_tests(ChainId(1), ADDR);
        let deadbeef = [0xde, 0xad, 0xbe, 0xef];
        let mut factory = viem_base();
        factory.factory = Some(ADDR);
        factory.factory_data = Bytes::copy_from_slice(&deadbeef);
        let cases = [
            (
                "default",
                viem_base(),
                b256!("0x1903d62bb5dc75af6fed866aa46d8e80063d9e288aa7f2caad0ff1fcae22e40d"),
            ),
            (
                "factory + factoryData",
                factory,
                b256!("0x46c1d51e831d50c1a93135f026a7d3f1921ed66e9c81da723dd3817a49f01bc1"),
            ),
            (
                "paymaster",
                with_paymaster(viem_base(), 0, 0, &[]),
                b256!("0x1f2cf8638ead0fc621c6fb1562b8222c06539efcec09be156191f72418ebb109"),
            ),
            (
                "paymasterVerificationGasLimit",
                with_paymaster(viem_base(), 6_942_069, 0, &[]),
                b256!("0x950763d3ef84eb05b6cd1d95f3b736bb02988d643c6e11a76bf8beddc611cc95"),
            ),
            (
                "paymasterPostOpGasLimit",
                with_paymaster(viem_base(), 6_942_069, 6_942_069, &[]),
                b256!("0xd6efc63c28df53b49dd6fa10cec0a92ac61f8c70e9a45265e39c955f9bf821ed"),
            ),
            (
                "paymasterData",
                with_paymaster(viem_base(), 6_942_069, 6_942_069, &deadbeef),
                b256!("0x265fc1350b3fc016d493f9533354cf1a758c0fb9ddbbfd8b19c987d4e8935eed"),
            ),
        ];
        for (name, op, expected) in cases {
            assert_eq!(op.hash_v07(&ep).unwrap(), expected, "viem v0.7 {name}");
        }
    }

    #[test]
    fn eip7702_marker_without_delegate_is_refused() {
        let ep = ResolvedEntryPoint::for_tests(ChainId(1), EP08);
        let mut op = viem_base();
        op.factory = Some(EIP7702_MARKER);
        assert_eq!(op.hash_v08(&ep), Err(UserOpError::MissingEip7702Delegate));
        assert!(is_eip7702_init_code(&[0x77, 0x02]));
        assert!(!is_eip7702_init_code(&[0x77]));
        assert!(!is_eip7702_init_code(&[0x77, 0x02, 1]));
        assert!(is_eip7702_init_code(&EIP7702_MARKER.0.0));
    }

    #[test]
    fn pack_and_unpack_round_trip() {
        let mut op = with_paymaster(viem_base(), 7, 8, &[1, 2, 3]);
        op.factory = Some(ADDR);
        op.factory_data = Bytes::from_static(&[9, 9]);
        op.call_data = Bytes::from_static(&[0xaa]);
        op.signature = Bytes::from_static(&[0x55; 65]);
        let packed = op.pack().unwrap();
        assert_eq!(packed.init_code.len(), 22);
        assert_eq!(packed.paymaster_and_data.len(), 55);
        assert_eq!(packed.unpack().unwrap(), op);
        assert_eq!(PackedUserOperation::from_sol(&packed.to_sol()), packed);
        let too_big = UserOperation {
            max_fee_per_gas: Wei::new(U256::from(u128::MAX) + U256::from(1)),
            ..viem_base()
        };
        assert_eq!(
            too_big.pack(),
            Err(UserOpError::FieldTooLarge {
                field: "maxFeePerGas"
            })
        );
        let mut short = packed.clone();
        short.paymaster_and_data = Bytes::from_static(&[1; 30]);
        assert_eq!(short.unpack(), Err(UserOpError::PaymasterAndDataTooShort));
    }

    #[test]
    fn erc7769_json_form() {
        let mut op = with_paymaster(viem_base(), 0x10, 0, &[0xde, 0xad]);
        op.factory = Some(ADDR);
        let json = serde_json::to_value(&op).unwrap();
        assert_eq!(json["nonce"], "0x0");
        assert_eq!(json["callGasLimit"], "0x69ed75");
        assert_eq!(json["maxFeePerGas"], "0x10f2c");
        assert_eq!(json["paymasterVerificationGasLimit"], "0x10");
        assert_eq!(json["paymasterData"], "0xdead");
        assert_eq!(json["factoryData"], "0x");
        assert!(json.get("eip7702Auth").is_none());
        let back: UserOperation = serde_json::from_value(json).unwrap();
        assert_eq!(back, op);

        let base = serde_json::to_value(viem_base()).unwrap();
        assert!(base.get("factory").is_none() && base.get("paymaster").is_none());
        let mut decimal = base.clone();
        decimal["callGasLimit"] = "100".into();
        assert!(serde_json::from_value::<UserOperation>(decimal).is_err());
        let mut orphan = base.clone();
        orphan["paymasterData"] = "0x01".into();
        let err = serde_json::from_value::<UserOperation>(orphan).unwrap_err();
        assert!(err.to_string().contains("paymasterData"), "{err}");
        let mut short_marker = base;
        short_marker["factory"] = "0x7702".into();
        let op: UserOperation = serde_json::from_value(short_marker).unwrap();
        assert_eq!(op.factory, Some(EIP7702_MARKER));
    }
}
