//! Amounts and prices from the API's decimal strings, with the token's (or feed's)
//! decimals, exactly: a string with more fractional digits than the decimals allow is
//! refused, never rounded. Errors name the request field, never its value.

use crate::error::{OpsError, Result};
use alloy::primitives::U256;
use keel_units::{Decimals, Rounding, format_units, parse_units};

/// `d` as [`Decimals`] (0..=36).
///
/// # Errors
/// [`OpsError::Amount`] (`DECIMALS_OUT_OF_RANGE`) for `field`.
pub fn decimals(d: u8, field: &'static str) -> Result<Decimals> {
    Decimals::new(d).map_err(|source| OpsError::Amount { field, source })
}

/// A token amount `s` (token units, decimal string) in base units of a token with
/// `token_decimals`; it must be greater than zero.
///
/// # Errors
/// [`OpsError::Amount`] for a malformed, negative or too precise amount (the units
/// error's code); [`OpsError::InvalidField`] for zero.
pub fn token_amount(s: &str, token_decimals: u8, field: &'static str) -> Result<U256> {
    let v = parse_units(s, decimals(token_decimals, field)?, Rounding::Exact)
        .map_err(|source| OpsError::Amount { field, source })?;
    if v.is_zero() {
        return Err(OpsError::InvalidField {
            field,
            reason: "must be greater than zero",
        });
    }
    Ok(v)
}

/// The feed answer of an initial price `s` (quote units, decimal string) with
/// `price_decimals`: greater than zero and at most `i128::MAX` (it is submitted as an
/// `int256` answer and read back as a signed integer). Field `initialPrice`.
///
/// # Errors
/// [`OpsError::Amount`] for a malformed, negative or too precise price;
/// [`OpsError::InvalidField`] for zero or an answer that does not fit.
pub fn price_answer(s: &str, price_decimals: u8) -> Result<U256> {
    let field = "initialPrice";
    let answer = parse_units(s, decimals(price_decimals, field)?, Rounding::Exact)
        .map_err(|source| OpsError::Amount { field, source })?;
    if answer.is_zero() || answer > U256::from(i128::MAX as u128) {
        return Err(OpsError::InvalidField {
            field,
            reason: "must be greater than zero and fit the feed's answer",
        });
    }
    Ok(answer)
}

/// Whether a mint of `amount` base units exceeds the template's approval `threshold`
/// (token units, decimal string) for a token with `token_decimals`. Threshold digits
/// beyond the token's decimals are rounded down (a finer threshold than the token can
/// express asks for an approval from the next representable amount on). Field `amount`.
///
/// # Errors
/// [`OpsError::Amount`] when the threshold cannot be read with these decimals.
pub fn above_threshold(amount: U256, threshold: &str, token_decimals: u8) -> Result<bool> {
    let field = "amount";
    let th = parse_units(threshold, decimals(token_decimals, field)?, Rounding::Down)
        .map_err(|source| OpsError::Amount { field, source })?;
    Ok(amount > th)
}

/// `base` base units as token units (decimal string) with `token_decimals`.
///
/// # Errors
/// [`OpsError::Amount`] (`decimals`) when the decimals are out of range.
pub fn format_amount(base: U256, token_decimals: u8) -> Result<String> {
    Ok(format_units(base, decimals(token_decimals, "decimals")?))
}
