//! Token identity ([`TokenRef`]) and token-bound amounts ([`TokenAmount`]).

use std::cmp::Ordering;
use std::fmt;

use alloy_primitives::{Address, U256};
use rust_decimal::Decimal;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::chain::ChainId;
use crate::decimal::{Decimals, Rounding, format_units, parse_units};
use crate::error::{Result, UnitsError};

/// A token: its contract address on an EIP-155 chain plus its decimals.
/// Two refs are the same token only if all three fields are equal.
///
/// Serde: `{"chain_id": "1", "address": "0x…", "decimals": 6}` (address as
/// lowercase `0x` hex on output, decimals as a JSON number validated 0..=36).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenRef {
    /// Chain the token contract lives on.
    #[serde(rename = "chain_id")]
    pub chain: ChainId,
    /// Token contract address.
    pub address: Address,
    /// Places between base units and display units (ERC-20 `decimals()`).
    pub decimals: Decimals,
}

impl TokenRef {
    /// A token at `address` on `chain` with `decimals`.
    pub const fn new(chain: ChainId, address: Address, decimals: Decimals) -> Self {
        Self {
            chain,
            address,
            decimals,
        }
    }

    fn ensure_same(&self, other: &Self) -> Result<()> {
        if self == other {
            Ok(())
        } else {
            Err(UnitsError::TokenMismatch {
                left: *self,
                right: *other,
            })
        }
    }
}

impl fmt::Display for TokenRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on chain {} with {} decimals",
            self.address,
            self.chain,
            self.decimals.get()
        )
    }
}

/// An amount of a specific token, held as integer base units (U256) and
/// displayed by shifting the point left by the token's decimals.
///
/// Mixing tokens is a runtime typed error ([`UnitsError::TokenMismatch`]):
/// token identity comes from requests and configuration, not types. Mixing a
/// token amount with [`crate::Wei`] or [`crate::GasPrice`] is a compile error.
///
/// Serde: `{"token": <TokenRef>, "amount": "100.5"}` where `amount` is the
/// canonical decimal string in display units. On input `amount` must parse
/// with [`Rounding::Exact`]; a legacy JSON integer (u64 range, whole tokens)
/// is accepted, floats are rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenAmount {
    token: TokenRef,
    base_units: U256,
}

impl TokenAmount {
    /// An amount of `base_units` smallest units of `token`.
    pub const fn from_base_units(token: TokenRef, base_units: U256) -> Self {
        Self { token, base_units }
    }

    /// Parses a display-unit decimal string: `"100.5"` of a 6-decimals token
    /// is 100_500_000 base units. Syntax and errors as [`crate::parse_units`].
    pub fn from_decimal_str(s: &str, token: TokenRef, rounding: Rounding) -> Result<Self> {
        parse_units(s, token.decimals, rounding).map(|v| Self::from_base_units(token, v))
    }

    /// Converts a `rust_decimal::Decimal` in display units (its value: a scale
    /// beyond the token's decimals made of trailing zeros is not precision).
    /// Errors: [`UnitsError::Negative`], [`UnitsError::PrecisionLoss`] (with
    /// `Exact`), [`UnitsError::Overflow`].
    pub fn from_decimal(value: Decimal, token: TokenRef, rounding: Rounding) -> Result<Self> {
        Self::from_decimal_str(&value.normalize().to_string(), token, rounding)
    }

    /// The token this amount is denominated in.
    pub const fn token(&self) -> TokenRef {
        self.token
    }

    /// The amount in the token's base (smallest) units.
    pub const fn base_units(&self) -> U256 {
        self.base_units
    }

    /// Canonical display-unit decimal string, see [`crate::format_units`].
    pub fn to_decimal_string(&self) -> String {
        format_units(self.base_units, self.token.decimals)
    }

    /// The display-unit value as a `rust_decimal::Decimal`, normalized (no
    /// trailing zeros). Errors: [`UnitsError::ExceedsDecimalRange`] when the
    /// base units exceed a 96-bit mantissa or decimals exceed 28.
    pub fn to_decimal(&self) -> Result<Decimal> {
        let mantissa =
            i128::try_from(self.base_units).map_err(|_| UnitsError::ExceedsDecimalRange)?;
        Decimal::try_from_i128_with_scale(mantissa, u32::from(self.token.decimals.get()))
            .map(|d| d.normalize())
            .map_err(|_| UnitsError::ExceedsDecimalRange)
    }

    /// Sum in base units. Errors: [`UnitsError::TokenMismatch`], [`UnitsError::Overflow`].
    pub fn checked_add(&self, rhs: &Self) -> Result<Self> {
        self.token.ensure_same(&rhs.token)?;
        let sum = self
            .base_units
            .checked_add(rhs.base_units)
            .ok_or(UnitsError::Overflow)?;
        Ok(Self::from_base_units(self.token, sum))
    }

    /// Difference in base units. Errors: [`UnitsError::TokenMismatch`], [`UnitsError::Underflow`].
    pub fn checked_sub(&self, rhs: &Self) -> Result<Self> {
        self.token.ensure_same(&rhs.token)?;
        let diff = self
            .base_units
            .checked_sub(rhs.base_units)
            .ok_or(UnitsError::Underflow)?;
        Ok(Self::from_base_units(self.token, diff))
    }

    /// Compares two amounts of the same token. Errors: [`UnitsError::TokenMismatch`].
    pub fn try_cmp(&self, rhs: &Self) -> Result<Ordering> {
        self.token.ensure_same(&rhs.token)?;
        Ok(self.base_units.cmp(&rhs.base_units))
    }
}

impl fmt::Display for TokenAmount {
    /// The canonical decimal string in display units, no symbol.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_decimal_string())
    }
}

#[derive(Serialize, Deserialize)]
struct Wire {
    token: TokenRef,
    amount: DecimalText,
}

/// A decimal amount as text; deserializes from a string or a legacy JSON integer.
struct DecimalText(String);

impl Serialize for DecimalText {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for DecimalText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DecimalText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal amount as a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<DecimalText, E> {
                Ok(DecimalText(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<DecimalText, E> {
                Ok(DecimalText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<DecimalText, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(UnitsError::Negative))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_f64<E: de::Error>(self, _v: f64) -> std::result::Result<DecimalText, E> {
                Err(E::custom(UnitsError::malformed(
                    "floating-point JSON numbers are not accepted; send a decimal string",
                )))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for TokenAmount {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        Wire {
            token: self.token,
            amount: DecimalText(self.to_decimal_string()),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for TokenAmount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        Self::from_decimal_str(&wire.amount.0, wire.token, Rounding::Exact)
            .map_err(de::Error::custom)
    }
}
