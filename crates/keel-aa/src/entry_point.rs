//! The single EntryPoint resolution boundary.
//!
//! A chain's `Directory` records, under `entryPoint`, a **configured** address. On a
//! chain that already hosts the standard deployment that address is an
//! `EntryPointReference` (a small contract whose `entryPoint()` names the real one); on
//! a local chain it is the EntryPoint itself. Off chain the reference is the wrong
//! target (no deposits, not the signature domain, no events), so every
//! account-abstraction step works with the **resolved** address, and only this module
//! produces it:
//!
//! | what the check sees | outcome |
//! |---|---|
//! | code at the configured address, `entryPoint()` answers a 32-byte address with code | [`ResolutionKind::Reference`]: resolves to that address |
//! | code at the configured address, `entryPoint()` **reverts** (or answers no address) | [`ResolutionKind::Direct`]: passes through unchanged |
//! | a transport failure, a gateway or internal error, a rate limit, a malformed answer | [`ResolveError::Unavailable`] (**retryable**), never a pass-through |
//! | no code at the configured address, or at the reference's target | [`ResolveError::NoCode`] / [`ResolveError::TargetHasNoCode`] (configuration) |
//! | no `entryPoint` entry in the `Directory` | [`ResolveError::NotRecorded`] (configuration) |
//!
//! Only an explicit revert of the `entryPoint()` probe ([`keel_chain::NodeErrorKind::ExecutionReverted`])
//! counts as "not a reference": a network blip read as a pass-through would let one
//! operation use two signature domains.
//!
//! [`ResolvedEntryPoint`] has no public constructor: it comes out of [`resolve_entry_point`]
//! / [`resolve_address`], or out of a journaled [`Resolution`] (deserialized, so a replay
//! after a directory change uses the address it recorded: resolution is not
//! retroactive). Hashes, paymaster data and receipt parsing in this crate take a
//! `&ResolvedEntryPoint`, so code cannot hash against an unresolved address.

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, Bytes};
use alloy::rpc::types::{BlockNumberOrTag, TransactionRequest};
use alloy::sol_types::SolCall;
use keel_abi::bindings::{Directory, EntryPointReference};
use keel_abi::directory_key;
use keel_abi::platform::names;
use keel_chain::{ChainError, NodeErrorKind, UpstreamPool};
use keel_units::ChainId;
use serde::{Deserialize, Serialize};

/// An EntryPoint address that went through the resolution boundary, bound to its chain.
/// It is the contract that holds deposits, defines the signature domain (EIP-712
/// `verifyingContract` with `chainId`) and emits the events receipts are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResolvedEntryPoint {
    chain: ChainId,
    address: Address,
}

impl ResolvedEntryPoint {
    /// The EntryPoint contract's address.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The chain it was resolved on (EIP-155 id, part of the signature domain).
    pub fn chain(&self) -> ChainId {
        self.chain
    }

    /// A resolved value for unit tests of this crate (published test vectors name an
    /// EntryPoint and a chain directly).
    #[cfg(test)]
    pub(crate) fn for_tests(chain: ChainId, address: Address) -> Self {
        Self { chain, address }
    }
}

/// How the configured address resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionKind {
    /// The configured address is an `EntryPointReference`; the resolved address is its
    /// `entryPoint()`.
    Reference,
    /// The configured address is not a reference; it passed through unchanged.
    Direct,
}

/// The outcome of one resolution: both addresses, kept together. Journal it with the
/// operation that used it; a replay reads it back instead of resolving again.
/// Serde: `{"configured": "0x…", "resolved": {"chain": "31337", "address": "0x…"}, "kind": "reference"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resolution {
    /// The address the `Directory` records (published to clients; accepted for gas
    /// estimation and paymaster methods, refused for submission).
    pub configured: Address,
    /// The EntryPoint every step uses.
    pub resolved: ResolvedEntryPoint,
    /// Whether the configured address was a reference.
    pub kind: ResolutionKind,
}

impl Resolution {
    /// True when `address` names this resolution's EntryPoint for a **submission**:
    /// only the resolved address does (the operation's signature is bound to it).
    pub fn accepts_for_submission(&self, address: Address) -> bool {
        address == self.resolved.address
    }

    /// True when `address` is either the configured or the resolved address (what gas
    /// estimation and the paymaster methods accept).
    pub fn accepts_for_estimation(&self, address: Address) -> bool {
        address == self.resolved.address || address == self.configured
    }
}

/// Why a resolution has no outcome. [`ResolveError::is_retryable`] tells a workflow
/// whether to retry the step (network) or fail it (configuration).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The check could not complete: transport failure, gateway/internal error, rate
    /// limit, or an answer that is neither a result nor a revert. Retryable; never
    /// read as a pass-through.
    #[error("EntryPoint resolution on chain {chain} could not complete during {step}")]
    Unavailable {
        /// The chain.
        chain: ChainId,
        /// `Directory.get`, `eth_getCode`, `entryPoint()` probe, `eth_getCode (target)`.
        step: &'static str,
        /// The chain access error.
        #[source]
        source: ChainError,
    },
    /// The `Directory` has no `entryPoint` entry. Not retryable (run `keel chain bootstrap`).
    #[error("the Directory {directory} on chain {chain} records no EntryPoint")]
    NotRecorded {
        /// The chain.
        chain: ChainId,
        /// The `Directory` read.
        directory: Address,
    },
    /// No contract at the configured address. Not retryable (configuration).
    #[error("no code at the configured EntryPoint {address} on chain {chain}")]
    NoCode {
        /// The chain.
        chain: ChainId,
        /// The configured address.
        address: Address,
    },
    /// The reference points at an address without code. Not retryable (configuration).
    #[error(
        "the EntryPointReference {reference} on chain {chain} points at {target}, which has no code"
    )]
    TargetHasNoCode {
        /// The chain.
        chain: ChainId,
        /// The reference.
        reference: Address,
        /// Its `entryPoint()`.
        target: Address,
    },
}

impl ResolveError {
    /// True for [`ResolveError::Unavailable`]: the same resolution may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Stable code (bounded metric label / journal field).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "entry_point_resolution_unavailable",
            Self::NotRecorded { .. } => "entry_point_not_recorded",
            Self::NoCode { .. } => "entry_point_no_code",
            Self::TargetHasNoCode { .. } => "entry_point_reference_target_no_code",
        }
    }
}

fn unavailable(chain: ChainId, step: &'static str) -> impl FnOnce(ChainError) -> ResolveError {
    move |source| ResolveError::Unavailable {
        chain,
        step,
        source,
    }
}

async fn code_at(
    pool: &UpstreamPool,
    address: Address,
    step: &'static str,
) -> Result<Bytes, ResolveError> {
    pool.request::<_, Bytes>("eth_getCode", (address, BlockNumberOrTag::Latest))
        .await
        .map_err(unavailable(pool.chain(), step))
}

/// Reads the `Directory` at `directory` (entry [`names::ENTRY_POINT`]) and resolves the
/// address it records with [`resolve_address`]. This is the only lookup of the
/// EntryPoint in Keel's account-abstraction code.
///
/// # Errors
/// [`ResolveError::Unavailable`] (retryable) when a request fails,
/// [`ResolveError::NotRecorded`] when the entry is missing, else as [`resolve_address`].
pub async fn resolve_entry_point(
    pool: &UpstreamPool,
    directory: Address,
) -> Result<Resolution, ResolveError> {
    let chain = pool.chain();
    let call = Directory::getCall {
        name: directory_key(names::ENTRY_POINT),
    };
    let tx = TransactionRequest::default()
        .with_to(directory)
        .with_input(call.abi_encode());
    let out = pool
        .call(&tx, BlockNumberOrTag::Latest)
        .await
        .map_err(unavailable(chain, "Directory.get(entryPoint)"))?;
    let configured =
        Directory::getCall::abi_decode_returns(&out).map_err(|_| ResolveError::Unavailable {
            chain,
            step: "Directory.get(entryPoint)",
            source: ChainError::Config {
                key: "directory",
                reason: "Directory.get answered data that is not an address",
            },
        })?;
    if configured == Address::ZERO {
        return Err(ResolveError::NotRecorded { chain, directory });
    }
    resolve_address(pool, configured).await
}

/// Resolves `configured` on the pool's chain (see the module table): a reference
/// resolves to its `entryPoint()`, any other contract passes through unchanged.
///
/// # Errors
/// [`ResolveError::Unavailable`] (retryable) for every failure that is not an answer,
/// [`ResolveError::NoCode`] / [`ResolveError::TargetHasNoCode`] for addresses without code.
pub async fn resolve_address(
    pool: &UpstreamPool,
    configured: Address,
) -> Result<Resolution, ResolveError> {
    let chain = pool.chain();
    if code_at(pool, configured, "eth_getCode").await?.is_empty() {
        return Err(ResolveError::NoCode {
            chain,
            address: configured,
        });
    }
    let probe = TransactionRequest::default()
        .with_to(configured)
        .with_input(EntryPointReference::entryPointCall {}.abi_encode());
    let target = match pool.call(&probe, BlockNumberOrTag::Latest).await {
        Ok(out) => decode_reference_answer(&out),
        Err(ChainError::Node { error, .. }) if error.kind == NodeErrorKind::ExecutionReverted => {
            None
        }
        Err(e) => return Err(unavailable(chain, "entryPoint() probe")(e)),
    };
    let Some(target) = target else {
        return Ok(Resolution {
            configured,
            resolved: ResolvedEntryPoint {
                chain,
                address: configured,
            },
            kind: ResolutionKind::Direct,
        });
    };
    if code_at(pool, target, "eth_getCode (target)")
        .await?
        .is_empty()
    {
        return Err(ResolveError::TargetHasNoCode {
            chain,
            reference: configured,
            target,
        });
    }
    Ok(Resolution {
        configured,
        resolved: ResolvedEntryPoint {
            chain,
            address: target,
        },
        kind: ResolutionKind::Reference,
    })
}

/// The target of a successful `entryPoint()` probe: exactly one ABI word holding a
/// non-zero address (upper 12 bytes zero). Anything else is "not a reference".
fn decode_reference_answer(out: &[u8]) -> Option<Address> {
    if out.len() != 32 || out[..12].iter().any(|b| *b != 0) {
        return None;
    }
    let address = Address::from_slice(&out[12..]);
    (address != Address::ZERO).then_some(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_answers_decode_only_as_one_address_word() {
        let mut word = [0u8; 32];
        assert_eq!(decode_reference_answer(&word), None, "zero address");
        word[31] = 1;
        assert_eq!(
            decode_reference_answer(&word),
            Some(Address::with_last_byte(1))
        );
        word[0] = 1;
        assert_eq!(decode_reference_answer(&word), None, "dirty upper bytes");
        assert_eq!(decode_reference_answer(&[]), None, "empty answer");
        assert_eq!(decode_reference_answer(&[0u8; 64]), None, "two words");
    }

    #[test]
    fn submission_accepts_only_the_resolved_address() {
        let r = Resolution {
            configured: Address::with_last_byte(1),
            resolved: ResolvedEntryPoint::for_tests(ChainId(1), Address::with_last_byte(2)),
            kind: ResolutionKind::Reference,
        };
        assert!(!r.accepts_for_submission(Address::with_last_byte(1)));
        assert!(r.accepts_for_submission(Address::with_last_byte(2)));
        assert!(r.accepts_for_estimation(Address::with_last_byte(1)));
        assert!(r.accepts_for_estimation(Address::with_last_byte(2)));
        assert!(!r.accepts_for_estimation(Address::with_last_byte(3)));
        let json = serde_json::to_value(r).unwrap();
        assert_eq!(json["kind"], "reference");
        let back: Resolution = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }
}
