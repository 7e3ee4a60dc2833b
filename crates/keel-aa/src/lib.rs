//! # keel-aa
//!
//! ERC-4337 (EntryPoint v0.8) for Keel. What is here (`docs/aa.md` describes the
//! durable user-operation flow and the bundler as built):
//!
//! - [`entry_point`]: the **single EntryPoint resolution boundary**. A `Directory`'s
//!   configured address resolves to a [`ResolvedEntryPoint`] (a reference resolves to
//!   its target, anything else passes through, a network failure is a retryable
//!   [`ResolveError`]); every other module takes `&ResolvedEntryPoint`.
//! - [`user_op`]: [`UserOperation`] (ERC-7769 JSON-RPC form, unpacked fields, `keel-units`
//!   fees) and [`PackedUserOperation`] (on-chain form), conversions both ways, the v0.7
//!   and v0.8 (EIP-712, with the EIP-7702 `initCode` rule) operation hashes.
//! - [`paymaster`]: `paymasterData` of Keel's `SponsorPaymaster` (validity window and
//!   the sponsor key's signature), and the ERC-7677 stub.
//! - [`receipt`]: one operation's outcome from its bundle's receipt (only its own logs,
//!   success, gas cost and used, revert reason).
//! - [`rejection`]: `FailedOp`/`FailedOpWithRevert` `AAxx` reasons as typed values and
//!   their ERC-7769 error codes.
//! - [`admission`]: what `eth_sendUserOperation` checks before simulating (fee floors,
//!   `preVerificationGas`, bundle fit, one operation per sender, replacement), the bundle
//!   gas budget and the required `preVerificationGas`.
//! - [`eip7702`]: operations of EIP-7702 accounts (`eip7702Auth` checks, the
//!   authorization list of simulations and of type-4 bundle transactions).
//! - [`policy`]: sponsorship policy (accounts, targets and selectors, gas ceiling, daily
//!   budget) with typed refusal codes.
//! - [`store`]: the SQL of `aa_user_operation`, `aa_bundle`, `aa_sponsorship_spend`
//!   (migration 0045).
//! - [`flow`]: acceptance ([`flow::submit`], key `aa:<chainId>:<hash>`) and the durable
//!   workflow `aa.user-operation` (resolve, record, validate, sponsor, await the outcome).
//! - [`bundler`]: the `aa-bundler` service packing ready operations into `handleOps`
//!   transactions on the transaction queue and reporting each outcome once.
//! - [`estimate`]: `eth_estimateUserOperationGas` and the ERC-7677 paymaster methods.
//! - [`runway`]: the paymaster's EntryPoint deposit runway (funding requests).
//! - [`service`]: what the Platform API calls (the ERC-7769 JSON-RPC methods, REST reads).
//! - [`debug`]: the `debug_bundler_*` namespace of the conformance suite (off by default).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod bundler;
pub mod debug;
pub mod eip7702;
pub mod entry_point;
pub mod estimate;
pub mod flow;
pub mod paymaster;
pub mod policy;
pub mod receipt;
pub mod rejection;
pub mod runway;
pub mod service;
pub mod store;
pub mod user_op;
pub mod validation;

pub use entry_point::{
    Resolution, ResolutionKind, ResolveError, ResolvedEntryPoint, resolve_address,
    resolve_entry_point,
};
pub use paymaster::{
    SponsorError, ValidityWindow, sign_sponsorship, sponsor_hash, stub_paymaster_data,
};
pub use receipt::{UserOperationReceipt, user_operation_receipt};
pub use rejection::{AaCode, EntryPointRejection, Erc7769Code};
pub use user_op::{
    EIP7702_MARKER, Eip7702Auth, MalformedField, PackedUserOperation, UserOpError, UserOperation,
    parse_user_operation, user_op_hash_v07, user_op_hash_v08,
};

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_counter!(
        "keel_aa_bundles_total",
        ::metrics::Unit::Count,
        "handleOps bundles by outcome (submitted, included, final, reorged, failed) (count)."
    );
    ::metrics::describe_counter!(
        "keel_aa_user_operations_total",
        ::metrics::Unit::Count,
        "User operations by bundler outcome (included, moved, final, reorged, failed, nonce_used_elsewhere, rebundled) (count)."
    );
    ::metrics::describe_counter!(
        "keel_aa_unreadable_rows_total",
        ::metrics::Unit::Count,
        "Stored rows of keel-aa's tables that did not decode (a state this build does not know, a hash or address of the wrong length, a negative chain id), by table; each was refused (count)."
    );
    ::metrics::describe_gauge!(
        "keel_aa_stale_user_operations",
        ::metrics::Unit::Count,
        "User operations still accepted, ready or bundled after the watchdog's threshold, by chain and state (operations)."
    );
    ::metrics::describe_gauge!(
        "keel_aa_paymaster_deposit_wei",
        ::metrics::Unit::Count,
        "The SponsorPaymaster's deposit at the EntryPoint at the last runway check, by chain (wei)."
    );
    ::metrics::describe_gauge!(
        "keel_aa_deposit_funding_request_open",
        ::metrics::Unit::Count,
        "1 while a funding request of the SponsorPaymaster's EntryPoint deposit is open, by chain (flag)."
    );
}
