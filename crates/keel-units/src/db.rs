//! PostgreSQL column types for chain values (feature `sqlx`).
//!
//! One rule per value, decoded at the row so a store never hand-converts:
//!
//! * [`ChainId`] is stored as `BIGINT` (`INT8`). EIP-155 chain ids are `u64`; a value
//!   above `i64::MAX` cannot be stored and fails to encode with
//!   [`UnitsError::Overflow`]; a negative stored value fails to decode. Use
//!   [`ChainId::to_db`] / [`ChainId::from_db`] where a raw `i64` is needed (array
//!   binds, `query!` macros).
//! * [`DbHash`] is a 32-byte hash (transaction hash, block hash, user operation hash)
//!   stored as `BYTEA`; any other stored length fails to decode — it is never read
//!   as the zero hash.
//! * [`DbAddress`] is a 20-byte EVM address stored as `BYTEA`; any other stored
//!   length fails to decode.
//!
//! A decode failure surfaces as `sqlx::Error::ColumnDecode`, which callers map to
//! their "stored row is unreadable" error.

use alloy_primitives::{Address, B256};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};
use sqlx::{Decode, Encode, Type};

use crate::{ChainId, UnitsError};

impl ChainId {
    /// The chain id as the `BIGINT` PostgreSQL stores.
    ///
    /// # Errors
    /// [`UnitsError::Overflow`] when the id exceeds `i64::MAX`.
    pub fn to_db(self) -> Result<i64, UnitsError> {
        i64::try_from(self.0).map_err(|_| UnitsError::Overflow)
    }

    /// A chain id read from a `BIGINT` column.
    ///
    /// # Errors
    /// [`UnitsError::Overflow`] when the stored value is negative.
    pub fn from_db(raw: i64) -> Result<Self, UnitsError> {
        u64::try_from(raw)
            .map(Self)
            .map_err(|_| UnitsError::Overflow)
    }
}

impl Type<Postgres> for ChainId {
    fn type_info() -> PgTypeInfo {
        <i64 as Type<Postgres>>::type_info()
    }
}

impl PgHasArrayType for ChainId {
    fn array_type_info() -> PgTypeInfo {
        <i64 as PgHasArrayType>::array_type_info()
    }
}

impl Encode<'_, Postgres> for ChainId {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let raw = self.to_db()?;
        <i64 as Encode<'_, Postgres>>::encode_by_ref(&raw, buf)
    }
}

impl Decode<'_, Postgres> for ChainId {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        let raw = <i64 as Decode<'_, Postgres>>::decode(value)?;
        Ok(Self::from_db(raw)?)
    }
}

/// Fixed-length byte column decoding shared by [`DbHash`] and [`DbAddress`].
fn decode_fixed<'r>(value: PgValueRef<'r>, len: usize) -> Result<&'r [u8], BoxDynError> {
    let bytes = <&[u8] as Decode<'_, Postgres>>::decode(value)?;
    if bytes.len() == len {
        Ok(bytes)
    } else {
        Err(Box::new(StoredLengthError { expected: len }))
    }
}

/// A `BYTEA` column held a value of the wrong length (the value itself is never shown).
#[derive(Debug, thiserror::Error)]
#[error("stored value is not {expected} bytes long")]
pub struct StoredLengthError {
    /// The length the column's type requires, in bytes.
    pub expected: usize,
}

macro_rules! fixed_bytes_column {
    ($(#[$doc:meta])* $name:ident, $inner:ty, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub $inner);

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }

        impl From<$name> for $inner {
            fn from(v: $name) -> Self {
                v.0
            }
        }

        impl Type<Postgres> for $name {
            fn type_info() -> PgTypeInfo {
                <&[u8] as Type<Postgres>>::type_info()
            }
        }

        impl PgHasArrayType for $name {
            fn array_type_info() -> PgTypeInfo {
                <&[u8] as PgHasArrayType>::array_type_info()
            }
        }

        impl Encode<'_, Postgres> for $name {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&[u8] as Encode<'_, Postgres>>::encode(self.0.as_slice(), buf)
            }
        }

        impl Decode<'_, Postgres> for $name {
            fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
                let bytes = decode_fixed(value, $len)?;
                Ok(Self(<$inner>::from_slice(bytes)))
            }
        }
    };
}

fixed_bytes_column!(
    /// A 32-byte hash column (`BYTEA`, exactly 32 bytes): a transaction, block or user
    /// operation hash. Decoding any other length fails with [`StoredLengthError`].
    DbHash,
    B256,
    32
);

fixed_bytes_column!(
    /// A 20-byte EVM address column (`BYTEA`, exactly 20 bytes). Decoding any other
    /// length fails with [`StoredLengthError`].
    DbAddress,
    Address,
    20
);
