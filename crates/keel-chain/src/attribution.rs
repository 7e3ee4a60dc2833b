//! The ERC-8021 transaction attribution suffix, schema 0.
//!
//! Layout appended to calldata (read backwards by indexers from the end):
//! `codes` (the attribution codes joined by `,`, ASCII) ‖ `codesLength` (1 byte) ‖
//! `schemaId` (1 byte, `0x00`) ‖ the 16-byte ERC-8021 marker `0x8021` repeated 8 times.
//! Contracts ignore trailing calldata beyond their ABI arguments, so the suffix does
//! not change execution; it costs 16 gas per non-zero byte (EIP-2028).

use crate::{ChainError, Result};
use alloy::primitives::Bytes;

/// The 16-byte ERC-8021 marker.
pub const MARKER: [u8; 16] = [
    0x80, 0x21, 0x80, 0x21, 0x80, 0x21, 0x80, 0x21, 0x80, 0x21, 0x80, 0x21, 0x80, 0x21, 0x80, 0x21,
];
/// Schema 0: canonical codes, comma separated.
pub const SCHEMA_CANONICAL: u8 = 0x00;

/// A precomputed suffix. Build it once at startup from configuration and append the
/// same bytes to every attempt, replacements included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributionSuffix {
    bytes: Bytes,
}

impl AttributionSuffix {
    /// Computes the schema-0 suffix for `codes`.
    ///
    /// # Errors
    /// [`ChainError::Config`] (`attribution.codes`) when there is no code, a code is
    /// empty, is not printable ASCII or contains a comma, or the joined codes exceed
    /// 255 bytes (the length field is one byte).
    pub fn new<S: AsRef<str>>(codes: &[S]) -> Result<Self> {
        let bad = |reason| ChainError::Config {
            key: "attribution.codes",
            reason,
        };
        if codes.is_empty() {
            return Err(bad("needs at least one code"));
        }
        let mut joined = Vec::new();
        for (i, code) in codes.iter().enumerate() {
            let code = code.as_ref();
            if code.is_empty() {
                return Err(bad("a code is empty"));
            }
            if !code.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
                return Err(bad("codes must be printable ASCII without commas"));
            }
            if i > 0 {
                joined.push(b',');
            }
            joined.extend_from_slice(code.as_bytes());
        }
        let len = u8::try_from(joined.len()).map_err(|_| bad("joined codes exceed 255 bytes"))?;
        let mut bytes = joined;
        bytes.push(len);
        bytes.push(SCHEMA_CANONICAL);
        bytes.extend_from_slice(&MARKER);
        Ok(Self {
            bytes: Bytes::from(bytes),
        })
    }

    /// The suffix bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// `calldata ‖ suffix`.
    pub fn append_to(&self, calldata: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(calldata.len() + self.bytes.len());
        out.extend_from_slice(calldata);
        out.extend_from_slice(&self.bytes);
        Bytes::from(out)
    }

    /// The codes carried by `calldata`'s schema-0 suffix, if it ends with one.
    pub fn parse(calldata: &[u8]) -> Option<Vec<String>> {
        let n = calldata.len();
        if n < 18 || calldata[n - 16..] != MARKER || calldata[n - 17] != SCHEMA_CANONICAL {
            return None;
        }
        let len = usize::from(calldata[n - 18]);
        let start = (n - 18).checked_sub(len)?;
        let codes = std::str::from_utf8(&calldata[start..n - 18]).ok()?;
        Some(codes.split(',').map(str::to_owned).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erc8021_test_vector() {
        let s = AttributionSuffix::new(&["baseapp", "morpho"]).unwrap();
        assert_eq!(
            s.bytes().to_string(),
            "0x626173656170702c6d6f7270686f0e0080218021802180218021802180218021"
        );
    }

    #[test]
    fn append_and_parse_round_trip() {
        let s = AttributionSuffix::new(&["keel"]).unwrap();
        let calldata = [0xa9, 0x05, 0x9c, 0xbb, 1, 2, 3];
        let full = s.append_to(&calldata);
        assert_eq!(&full[..calldata.len()], &calldata);
        assert_eq!(
            AttributionSuffix::parse(&full),
            Some(vec!["keel".to_owned()])
        );
        // The same bytes every time (replacements must carry an identical suffix).
        assert_eq!(s.append_to(&calldata), full);
        assert_eq!(AttributionSuffix::parse(&calldata), None);
    }

    #[test]
    fn invalid_codes_are_refused() {
        assert!(AttributionSuffix::new::<&str>(&[]).is_err());
        assert!(AttributionSuffix::new(&[""]).is_err());
        assert!(AttributionSuffix::new(&["a,b"]).is_err());
        assert!(AttributionSuffix::new(&["caf\u{e9}"]).is_err());
        let long = "x".repeat(256);
        assert!(AttributionSuffix::new(&[long.as_str()]).is_err());
        let max = "x".repeat(255);
        assert!(AttributionSuffix::new(&[max.as_str()]).is_ok());
    }
}
