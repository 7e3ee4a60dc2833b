//! Decimal string <-> integer base-unit scaling, done in U256 arithmetic.
//!
//! `rust_decimal` only covers 28 significant digits, while a U256 has 78 and
//! tokens may have up to 36 decimals, so the scaling here is hand-written.

use alloy_primitives::U256;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Result, UnitsError};

/// Maximum number of digits accepted in the integer part (and, separately,
/// the fractional part) of a decimal string: `U256::MAX` has 78 digits.
pub const MAX_DIGITS: usize = 78;

/// Number of decimal places between a token's base unit and its display unit
/// (ERC-20 `decimals()`; 18 for ether/wei, 6 for USDC). Validated to `0..=36`.
///
/// Serde: a JSON number (`6`); a decimal string (`"6"`) is accepted on input.
/// Values above 36 fail with [`UnitsError::DecimalsOutOfRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Decimals(u8);

impl Decimals {
    /// Largest accepted number of decimals.
    pub const MAX: u8 = 36;
    /// The decimals of the native currency of EVM chains (1 ether = 10^18 wei).
    pub const ETHER: Self = Self(18);

    /// Validates `d`. Errors: [`UnitsError::DecimalsOutOfRange`] if `d > 36`.
    pub const fn new(d: u8) -> Result<Self> {
        if d > Self::MAX {
            Err(UnitsError::DecimalsOutOfRange)
        } else {
            Ok(Self(d))
        }
    }

    /// The number of decimal places.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl TryFrom<u8> for Decimals {
    type Error = UnitsError;
    fn try_from(d: u8) -> Result<Self> {
        Self::new(d)
    }
}

impl Serialize for Decimals {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u8(self.0)
    }
}

impl<'de> Deserialize<'de> for Decimals {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = crate::serde_int::deserialize_u256(d)?;
        let small = u8::try_from(v)
            .map_err(|_| serde::de::Error::custom(UnitsError::DecimalsOutOfRange))?;
        Self::new(small).map_err(serde::de::Error::custom)
    }
}

/// How to treat digits beyond the target unit's decimals when parsing.
///
/// Amounts are never negative, so "down" and "toward zero" coincide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// Fail with [`UnitsError::PrecisionLoss`] when the input has more fractional
    /// digits than the unit's decimals, whatever they are (`"1.0000000"` of a 6-decimals
    /// token is refused like `"1.0000001"`): a string that claims more precision than
    /// the unit has is refused, never rounded or trimmed.
    Exact,
    /// Truncate extra digits (toward zero).
    Down,
    /// Round up (away from zero) if any dropped digit is non-zero.
    Up,
    /// Round to nearest; ties go to the even base unit (banker's rounding).
    HalfEven,
}

fn all_digits(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

fn push_digit(acc: U256, digit: u8) -> Result<U256> {
    acc.checked_mul(U256::from(10u8))
        .and_then(|v| v.checked_add(U256::from(digit)))
        .ok_or(UnitsError::Overflow)
}

/// Parses a decimal string into integer base units: `"100.5"` with 6
/// decimals is `100_500_000`.
///
/// Accepted syntax: one or more ASCII digits, optionally followed by `.` and
/// one or more digits. `"0.5"`, `"5"`, `"5.0"` and leading zeros (`"007"`) are
/// accepted; `".5"`, `"5."`, `"+5"`, `"1e3"`, `" 5"`, `"1_000"` and `""` are not.
///
/// Errors: [`UnitsError::Negative`] for a leading `-`;
/// [`UnitsError::Malformed`] for any other syntax error;
/// [`UnitsError::TooManyDigits`] if either part has more than [`MAX_DIGITS`]
/// digits (checked before any arithmetic); [`UnitsError::Overflow`] if the
/// scaled value exceeds `U256::MAX`; [`UnitsError::PrecisionLoss`] with
/// [`Rounding::Exact`] when the input has more fractional digits than `decimals`
/// (zeros included: `"1.50"` with 1 decimal is refused).
pub fn parse_units(s: &str, decimals: Decimals, rounding: Rounding) -> Result<U256> {
    if s.starts_with('-') {
        return Err(UnitsError::Negative);
    }
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    if int.is_empty() {
        return Err(UnitsError::malformed("missing integer part"));
    }
    if !all_digits(int) {
        return Err(UnitsError::malformed("only digits and one '.' are allowed"));
    }
    let frac = match frac {
        Some("") => return Err(UnitsError::malformed("missing digits after '.'")),
        Some(f) if !all_digits(f) => {
            return Err(UnitsError::malformed("only digits and one '.' are allowed"));
        }
        Some(f) => f,
        None => "",
    };
    if int.len() > MAX_DIGITS || frac.len() > MAX_DIGITS {
        return Err(UnitsError::TooManyDigits { max: MAX_DIGITS });
    }

    let d = usize::from(decimals.get());
    let (kept, dropped) = frac.split_at(frac.len().min(d));
    let mut acc = U256::ZERO;
    for b in int.bytes().chain(kept.bytes()) {
        acc = push_digit(acc, b - b'0')?;
    }
    for _ in kept.len()..d {
        acc = push_digit(acc, 0)?;
    }

    let dropped_nonzero = dropped.bytes().any(|b| b != b'0');
    let round_up = match rounding {
        Rounding::Exact if !dropped.is_empty() => {
            return Err(UnitsError::PrecisionLoss {
                decimals: decimals.get(),
            });
        }
        Rounding::Exact | Rounding::Down => false,
        Rounding::Up => dropped_nonzero,
        Rounding::HalfEven => {
            let mut it = dropped.bytes();
            match it.next() {
                Some(b'6'..=b'9') => true,
                Some(b'5') => it.any(|b| b != b'0') || acc.bit(0),
                _ => false,
            }
        }
    };
    if round_up {
        acc = acc
            .checked_add(U256::from(1u8))
            .ok_or(UnitsError::Overflow)?;
    }
    Ok(acc)
}

/// Formats integer base units as a canonical decimal string: no trailing
/// fractional zeros, no `.` for integral values, `"0"` for zero, no leading
/// zeros. `100_500_000` with 6 decimals is `"100.5"`. Inverse of
/// [`parse_units`] with [`Rounding::Exact`].
pub fn format_units(value: U256, decimals: Decimals) -> String {
    let digits = value.to_string();
    let d = usize::from(decimals.get());
    if d == 0 {
        return digits;
    }
    let padded = if digits.len() <= d {
        format!("{}{digits}", "0".repeat(d + 1 - digits.len()))
    } else {
        digits
    };
    let (int, frac) = padded.split_at(padded.len() - d);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        int.to_owned()
    } else {
        format!("{int}.{frac}")
    }
}

/// Parses an unsigned integer string: decimal digits (`"1000"`) or
/// JSON-RPC-style hex with a `0x`/`0X` prefix (`"0x3e8"`).
///
/// Errors: [`UnitsError::Negative`], [`UnitsError::Malformed`],
/// [`UnitsError::TooManyDigits`] (more than 78 decimal digits),
/// [`UnitsError::Overflow`] (above `U256::MAX`).
pub fn parse_integer(s: &str) -> Result<U256> {
    if s.starts_with('-') {
        return Err(UnitsError::Negative);
    }
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(UnitsError::malformed(
                "hex integers need one or more hex digits after '0x'",
            ));
        }
        let significant = hex.trim_start_matches('0');
        if significant.len() > 64 {
            return Err(UnitsError::Overflow);
        }
        if significant.is_empty() {
            return Ok(U256::ZERO);
        }
        return U256::from_str_radix(significant, 16).map_err(|_| UnitsError::Overflow);
    }
    if s.is_empty() || !all_digits(s) {
        return Err(UnitsError::malformed(
            "integers must be decimal digits or 0x-prefixed hex",
        ));
    }
    parse_units(s, Decimals(0), Rounding::Exact)
}
