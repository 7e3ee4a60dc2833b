//! Native-currency values: [`Wei`], chain-bound [`NativeAmount`] and [`GasPrice`].

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use alloy_primitives::U256;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::chain::ChainId;
use crate::decimal::{Decimals, Rounding, format_units, parse_integer, parse_units};
use crate::error::{Result, UnitsError};

/// An amount of a chain's native currency, in wei (1 ether = 10^18 wei),
/// as a U256. Not bound to a chain; see [`NativeAmount`] for that.
///
/// Arithmetic is checked and never wraps: [`UnitsError::Overflow`] /
/// [`UnitsError::Underflow`]. Serde: a decimal string of wei
/// (`"1000000000000000000"`); input also accepts `0x` hex and legacy JSON
/// integers (u64 range).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Wei(U256);

impl Wei {
    /// Zero wei.
    pub const ZERO: Self = Self(U256::ZERO);

    /// Wraps a raw wei value.
    pub const fn new(wei: U256) -> Self {
        Self(wei)
    }

    /// The raw wei value.
    pub const fn get(self) -> U256 {
        self.0
    }

    /// `self + rhs` in wei. Errors: [`UnitsError::Overflow`] above `U256::MAX`.
    pub fn checked_add(self, rhs: Self) -> Result<Self> {
        self.0
            .checked_add(rhs.0)
            .map(Self)
            .ok_or(UnitsError::Overflow)
    }

    /// `self - rhs` in wei. Errors: [`UnitsError::Underflow`] if `rhs > self`.
    pub fn checked_sub(self, rhs: Self) -> Result<Self> {
        self.0
            .checked_sub(rhs.0)
            .map(Self)
            .ok_or(UnitsError::Underflow)
    }

    /// `self * factor` in wei. Errors: [`UnitsError::Overflow`] above `U256::MAX`.
    pub fn checked_mul_u64(self, factor: u64) -> Result<Self> {
        self.0
            .checked_mul(U256::from(factor))
            .map(Self)
            .ok_or(UnitsError::Overflow)
    }

    /// Parses an ether-denominated decimal string (`"1.5"` = 1.5 * 10^18 wei).
    /// Syntax and errors as [`crate::parse_units`] with 18 decimals.
    pub fn from_ether_str(s: &str, rounding: Rounding) -> Result<Self> {
        parse_units(s, Decimals::ETHER, rounding).map(Self)
    }

    /// Canonical ether-denominated decimal string (`"1.5"`), see [`crate::format_units`].
    pub fn to_ether_string(self) -> String {
        format_units(self.0, Decimals::ETHER)
    }
}

impl From<U256> for Wei {
    fn from(wei: U256) -> Self {
        Self(wei)
    }
}

impl From<u64> for Wei {
    fn from(wei: u64) -> Self {
        Self(U256::from(wei))
    }
}

impl fmt::Display for Wei {
    /// The wei value as decimal digits, no unit suffix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Wei {
    type Err = UnitsError;
    /// Parses an integer wei string, decimal or `0x` hex; see [`crate::parse_integer`].
    fn from_str(s: &str) -> Result<Self> {
        parse_integer(s).map(Self)
    }
}

impl Serialize for Wei {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        crate::serde_int::serialize_u256(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Wei {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        crate::serde_int::deserialize_u256(d).map(Self)
    }
}

/// A native-currency amount in wei bound to an EIP-155 chain: 1 ETH on
/// mainnet is not 1 ETH on an L2. This is Keel's "native value" type; plain
/// [`Wei`] is for chain-agnostic arithmetic inside one chain's context.
///
/// Mixing chains is a runtime typed error ([`UnitsError::ChainMismatch`]),
/// since chains come from configuration rather than types. Serde: an object
/// `{"chain_id": "1", "wei": "1000"}` (both decimal strings on output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NativeAmount {
    /// The chain whose native currency this is.
    #[serde(rename = "chain_id")]
    pub chain: ChainId,
    /// The amount in wei.
    pub wei: Wei,
}

impl NativeAmount {
    /// Binds `wei` to `chain`.
    pub const fn new(chain: ChainId, wei: Wei) -> Self {
        Self { chain, wei }
    }

    /// Sum in wei. Errors: [`UnitsError::ChainMismatch`], [`UnitsError::Overflow`].
    pub fn checked_add(self, rhs: Self) -> Result<Self> {
        self.chain.ensure_same(rhs.chain)?;
        Ok(Self::new(self.chain, self.wei.checked_add(rhs.wei)?))
    }

    /// Difference in wei. Errors: [`UnitsError::ChainMismatch`], [`UnitsError::Underflow`].
    pub fn checked_sub(self, rhs: Self) -> Result<Self> {
        self.chain.ensure_same(rhs.chain)?;
        Ok(Self::new(self.chain, self.wei.checked_sub(rhs.wei)?))
    }

    /// Compares two amounts of the same chain. Errors: [`UnitsError::ChainMismatch`].
    pub fn try_cmp(&self, rhs: &Self) -> Result<Ordering> {
        self.chain.ensure_same(rhs.chain)?;
        Ok(self.wei.cmp(&rhs.wei))
    }
}

/// A gas price in wei per unit of gas, bound to an EIP-155 chain. Used for
/// legacy `gasPrice` and for the EIP-1559 fields `maxFeePerGas`,
/// `maxPriorityFeePerGas` and `baseFeePerGas`, which are all wei per gas.
///
/// Adding, subtracting or comparing prices of different chains fails with
/// [`UnitsError::ChainMismatch`]; mixing a gas price with a [`Wei`] amount is
/// a compile error (distinct types). Serde: an object
/// `{"chain_id": "1", "wei_per_gas": "30000000000"}`; `wei_per_gas` is a
/// decimal string on output, and also accepts `0x` hex or a JSON integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GasPrice {
    /// The chain this price applies to.
    #[serde(rename = "chain_id")]
    pub chain: ChainId,
    /// Price in wei per unit of gas.
    #[serde(with = "crate::serde_int::serde_u256")]
    pub wei_per_gas: U256,
}

impl GasPrice {
    /// A price of `wei_per_gas` wei per gas on `chain`.
    pub const fn new(chain: ChainId, wei_per_gas: U256) -> Self {
        Self { chain, wei_per_gas }
    }

    /// Sum, e.g. base fee + priority fee. Errors: [`UnitsError::ChainMismatch`], [`UnitsError::Overflow`].
    pub fn checked_add(self, rhs: Self) -> Result<Self> {
        self.chain.ensure_same(rhs.chain)?;
        let sum = self
            .wei_per_gas
            .checked_add(rhs.wei_per_gas)
            .ok_or(UnitsError::Overflow)?;
        Ok(Self::new(self.chain, sum))
    }

    /// Difference. Errors: [`UnitsError::ChainMismatch`], [`UnitsError::Underflow`].
    pub fn checked_sub(self, rhs: Self) -> Result<Self> {
        self.chain.ensure_same(rhs.chain)?;
        let diff = self
            .wei_per_gas
            .checked_sub(rhs.wei_per_gas)
            .ok_or(UnitsError::Underflow)?;
        Ok(Self::new(self.chain, diff))
    }

    /// Compares two prices of the same chain. Errors: [`UnitsError::ChainMismatch`].
    pub fn try_cmp(&self, rhs: &Self) -> Result<Ordering> {
        self.chain.ensure_same(rhs.chain)?;
        Ok(self.wei_per_gas.cmp(&rhs.wei_per_gas))
    }

    /// The fee for `gas` units at this price: `wei_per_gas * gas` wei on the
    /// same chain. Errors: [`UnitsError::Overflow`].
    pub fn fee_for_gas(self, gas: u64) -> Result<NativeAmount> {
        let wei = Wei(self.wei_per_gas).checked_mul_u64(gas)?;
        Ok(NativeAmount::new(self.chain, wei))
    }
}
