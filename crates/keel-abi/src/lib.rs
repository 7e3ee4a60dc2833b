//! # keel-abi
//!
//! Keel's own contracts as Rust:
//!
//! - [`bindings`]: alloy `sol!` bindings generated at compile time from the committed
//!   artifacts in `abi/out/` (ABI and creation bytecode), with `#[sol(rpc)]` call and
//!   deploy helpers;
//! - [`platform`]: deployment of the per-chain platform contracts (`Directory`,
//!   `PriceResolver`, `PriceFeedFactory`, `AssetFactory`, `EntryPointReference`) and
//!   their registration in the `Directory`;
//! - [`erc4337`]: the ERC-4337 EntryPoint v0.8 and `SimpleAccountFactory` at their
//!   canonical addresses through the deterministic CREATE2 deployer, from the npm
//!   artifacts of `@account-abstraction/contracts@0.8.0`;
//! - [`freshness`]: recomputes the `sourceHash` of `abi/src` to detect artifacts that
//!   were not rebuilt after a source change.
//!
//! The Solidity sources and how artifacts are built are described in `abi/README.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod bindings;
pub mod erc4337;
pub mod freshness;
pub mod platform;

use alloy::primitives::B256;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AbiError {
    /// A JSON-RPC request failed (transport or node error). Retryable when the
    /// transport failed; node-side rejections are not.
    #[error("rpc request failed during {step}")]
    Rpc {
        /// What Keel was doing (`deploy Directory`, `read back ...`).
        step: &'static str,
        /// The underlying alloy error.
        #[source]
        source: Box<alloy::contract::Error>,
    },
    /// A transaction was mined but reverted.
    #[error("transaction reverted during {step}")]
    Reverted {
        /// What Keel was doing.
        step: &'static str,
    },
    /// A deployment left no code at the expected address.
    #[error("no code at the expected address after {step}")]
    NoCode {
        /// What Keel was doing.
        step: &'static str,
    },
    /// A read-back after deployment disagreed with what was deployed.
    #[error("read-back mismatch: {0}")]
    Mismatch(&'static str),
    /// An artifact file could not be read or parsed.
    #[error("artifact {path}: {reason}")]
    Artifact {
        /// The artifact's path.
        path: String,
        /// Why it could not be used.
        reason: String,
    },
}

/// `Result` with [`AbiError`].
pub type Result<T, E = AbiError> = std::result::Result<T, E>;

/// The `Directory` key of an ASCII name: its bytes, left-aligned and zero-padded to 32
/// (Solidity `bytes32("entryPoint")`). Names longer than 32 bytes are truncated by
/// design of the encoding; Keel's names are all short constants.
pub fn directory_key(name: &str) -> B256 {
    let bytes = name.as_bytes();
    let len = bytes.len().min(32);
    B256::right_padding_from(&bytes[..len])
}

/// The inverse of [`directory_key`]: the ASCII name without its zero padding, or `None`
/// when the key is not valid UTF-8.
pub fn directory_name(key: B256) -> Option<String> {
    let end = key.iter().position(|b| *b == 0).unwrap_or(32);
    std::str::from_utf8(&key[..end]).ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_keys_round_trip() {
        let key = directory_key("entryPoint");
        assert_eq!(&key[..10], b"entryPoint");
        assert!(key[10..].iter().all(|b| *b == 0));
        assert_eq!(directory_name(key).as_deref(), Some("entryPoint"));
    }
}
