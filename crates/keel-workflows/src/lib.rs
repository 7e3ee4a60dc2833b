//! # keel-workflows
//!
//! Keel's asset-issuance workflows, the operations service the Platform API calls, and
//! the verdict relay that connects the transaction queue to the workflows.
//!
//! - [`workflows`]: `asset.create` (feed, token, first observation, staleness bound,
//!   unpause, read-after-write — fail-closed), `asset.mint`, `asset.transfer`,
//!   `asset.pause`, `asset.unpause` (one at a time per asset, optional approval wait).
//!   [`workflows::register_all`] registers exactly [`workflows::WORKFLOWS`].
//! - [`ops`]: [`ops::Ops`], the API's service: idempotent acceptance (organization +
//!   `Idempotency-Key`, request hash), the operation status projection (state, wait,
//!   milestones accepted → submitted → confirmed → indexed, result, typed error),
//!   approvals, retries (a retryable transaction failure is sent again as a new,
//!   separately keyed attempt once the operation is retried; landed writes never are),
//!   asset and balance reads from the Ledger Index.
//! - [`tenancy`]: organizations, API keys (stored as SHA-256 of a 256-bit token),
//!   asset templates.
//! - [`relay`]: delivers each settled verdict to its workflow as the signal
//!   `tx.<step>` (deduplicated by the queue request id).
//! - [`platform`]: the runner-side chain context ([`platform::Platform`]).
//!
//! Tables: `migrations/0007_platform_api.sql`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
pub mod ops;
pub mod platform;
pub mod relay;
pub mod tenancy;
pub mod workflows;

pub use error::{OpsError, Result};
pub use ops::Ops;
pub use platform::{ChainContext, Platform, PlatformAddresses};
pub use tenancy::Caller;
