//! Typed, unit-bearing values for Keel, used wherever amounts cross the API,
//! journal and chain boundaries.
//!
//! * [`ChainId`]: an EIP-155 chain id.
//! * [`Wei`]: native currency in wei (U256), chain-agnostic, checked arithmetic.
//! * [`NativeAmount`]: wei bound to a chain (Keel's "native value").
//! * [`GasPrice`]: wei per gas bound to a chain (legacy / EIP-1559 fee fields).
//! * [`TokenRef`] + [`TokenAmount`]: token base units (U256) bound to a token
//!   (chain, address, [`Decimals`]).
//! * [`parse_units`] / [`format_units`]: decimal string <-> base units with an
//!   explicit [`Rounding`] mode, done in U256 arithmetic (78 integer digits,
//!   up to 36 decimals, beyond `rust_decimal`'s 28 digits).
//!
//! # Guarantees
//! Mixing kinds (wei with a gas price, a gas price with a token amount) does
//! not compile: they are distinct types with no cross-type operators.
//! Mixing chains or tokens of the same kind is a runtime typed error
//! ([`UnitsError::ChainMismatch`], [`UnitsError::TokenMismatch`]) because
//! chains and tokens are data from configuration and requests. No value ever
//! wraps: every arithmetic operation is checked.
//!
//! # Encoding
//! Integers (wei, base units, wei per gas, chain ids) serialize as JSON
//! decimal strings and deserialize from decimal strings, `0x` hex strings or
//! legacy JSON integers (u64 range); floats are rejected. Token amounts
//! serialize as canonical decimal strings in display units. [`Decimals`] is
//! a JSON number. Deserialization needs a self-describing format (JSON).
//!
//! # Example
//! ```
//! use keel_units::{Address, ChainId, Decimals, Rounding, TokenAmount, TokenRef, UnitsError};
//!
//! let usdc = TokenRef::new(ChainId(1), Address::ZERO, Decimals::new(6)?);
//! let a = TokenAmount::from_decimal_str("100.5", usdc, Rounding::Exact)?;
//! assert_eq!(a.base_units().to_string(), "100500000");
//! assert_eq!(a.to_decimal_string(), "100.5");
//! let err = TokenAmount::from_decimal_str("1.23456789", usdc, Rounding::Exact).unwrap_err();
//! assert_eq!(err.code(), "AMOUNT_PRECISION_LOSS");
//! # Ok::<(), UnitsError>(())
//! ```
//!
//! With the feature `sqlx`, [`ChainId`] is a PostgreSQL `BIGINT` column type and
//! `db::{DbHash, DbAddress}` are the 32- and 20-byte `BYTEA` column types: stores
//! decode them at the row and never convert by hand.
//!
//! Errors are one [`UnitsError`] enum with stable [`UnitsError::code`]s and
//! messages that never echo input values.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod chain;
#[cfg(feature = "sqlx")]
pub mod db;
mod decimal;
mod error;
mod native;
mod serde_int;
mod token;

pub use chain::ChainId;
pub use decimal::{Decimals, MAX_DIGITS, Rounding, format_units, parse_integer, parse_units};
pub use error::{Result, UnitsError};
pub use native::{GasPrice, NativeAmount, Wei};
pub use serde_int::serde_u256;
pub use token::{TokenAmount, TokenRef};

/// Re-export of the U256 and Address types used in this crate's API.
pub use alloy_primitives::{Address, U256};
