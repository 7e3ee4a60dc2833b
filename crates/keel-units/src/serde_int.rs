//! Shared serde encoding for unsigned integers (wei, base units, chain ids).
//!
//! Output: a JSON string of decimal digits (`"1000000000000000000"`).
//! Input: that, a `0x`-prefixed hex string (`"0xde0b6b3a7640000"`), or a
//! legacy non-negative integer JSON number (u64 range, the older encoding).
//! Floats and negative numbers are rejected with a value-free message.

use alloy_primitives::U256;
use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

use crate::decimal::parse_integer;
use crate::error::UnitsError;

struct U256Visitor;

impl Visitor<'_> for U256Visitor {
    type Value = U256;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an unsigned integer as a decimal string, a 0x-hex string or a JSON integer")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<U256, E> {
        parse_integer(v).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<U256, E> {
        Ok(U256::from(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<U256, E> {
        Ok(U256::from(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<U256, E> {
        u64::try_from(v)
            .map(U256::from)
            .map_err(|_| E::custom(UnitsError::Negative))
    }

    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<U256, E> {
        Err(E::custom(UnitsError::malformed(
            "floating-point JSON numbers are not accepted; send a decimal string",
        )))
    }
}

/// Serializes a U256 as a JSON decimal string. For `#[serde(with = "keel_units::serde_u256")]`
/// on raw integer fields (e.g. token base units) outside this crate's types.
pub mod serde_u256 {
    use super::*;

    /// Writes `value` as a decimal string, e.g. `"1000"`.
    pub fn serialize<S: Serializer>(value: &U256, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    /// Reads a decimal string, `0x` hex string or legacy JSON integer.
    /// Errors (as serde custom errors carrying a [`UnitsError`] message):
    /// negative, malformed, too many digits, overflow, float.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<U256, D::Error> {
        d.deserialize_any(U256Visitor)
    }
}

pub(crate) use serde_u256::deserialize as deserialize_u256;
pub(crate) use serde_u256::serialize as serialize_u256;
