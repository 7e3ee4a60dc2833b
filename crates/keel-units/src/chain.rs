//! EIP-155 chain identifiers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Result, UnitsError};

/// An EIP-155 chain id (e.g. 1 = Ethereum mainnet, 10 = OP Mainnet), the
/// value signed into transactions for replay protection.
///
/// Serde: written as a decimal string (`"1"`), like every integer in this
/// crate. Read from a decimal string, a `0x` hex string (`"0x1"`, as returned
/// by `eth_chainId`) or a legacy JSON number (`1`). Values above `u64::MAX`
/// fail with [`UnitsError::Overflow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainId(pub u64);

impl ChainId {
    /// The raw EIP-155 chain id.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Returns `Ok(())` if `self == other`, else [`UnitsError::ChainMismatch`]
    /// with `left = self`, `right = other`.
    pub fn ensure_same(self, other: Self) -> Result<()> {
        if self == other {
            Ok(())
        } else {
            Err(UnitsError::ChainMismatch {
                left: self,
                right: other,
            })
        }
    }
}

impl From<u64> for ChainId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl fmt::Display for ChainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for ChainId {
    type Err = UnitsError;
    /// Parses a decimal or `0x` hex string. Errors as [`crate::parse_integer`],
    /// plus [`UnitsError::Overflow`] above `u64::MAX`.
    fn from_str(s: &str) -> Result<Self> {
        let v = crate::decimal::parse_integer(s)?;
        u64::try_from(v).map(Self).map_err(|_| UnitsError::Overflow)
    }
}

impl Serialize for ChainId {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ChainId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = crate::serde_int::deserialize_u256(d)?;
        u64::try_from(v)
            .map(Self)
            .map_err(|_| serde::de::Error::custom(UnitsError::Overflow))
    }
}
