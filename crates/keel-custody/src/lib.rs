//! # keel-custody
//!
//! Custody-provider submission (issue 19, first half): a custody platform that signs
//! **and broadcasts** for a vault account, seen through one seam.
//!
//! - [`provider`]: the [`CustodyProvider`] trait — create a contract call from a vault
//!   account, get by provider id, get by external id, cancel; and what the provider's
//!   statuses mean (phase, rank, ending) and how long a create stays in doubt.
//! - [`types`]: typed identifiers ([`ExternalTxId`], [`ProviderTxId`], …), statuses
//!   ([`TxStatus`] with its [`StatusPhase`] and rank), sub-statuses ([`SubStatus`]),
//!   hashes and the provider's view of a transaction. Every provider string maps to a
//!   closed enum with an `Unknown(String)` arm.
//! - [`error`]: [`CustodyError`], classified ([`ErrorClass`]) as retryable, permanent,
//!   in doubt (a create whose answer was lost: look it up by external id) or duplicate
//!   external id (look it up).
//! - [`fireblocks`]: [`FireblocksProvider`], the Fireblocks REST API (JWT RS256 auth,
//!   governor rate limit per account, `Retry-After` on 429).
//! - [`webhook`]: Fireblocks webhooks v2 — [`WebhookVerifier`] (detached JWS RS512 over
//!   the raw body against a cached JWKS, bounded refetch on an unknown `kid`) and the
//!   typed [`WebhookEvent`].
//! - [`secret`]: secrets named in configuration (`env:NAME`, `file:PATH`), never shown.
//!
//! `keel-custody-sim` is the faithful local provider the tests run against (and the
//! independent verifier of this crate's request signing). The protocol as built and the
//! planned integration with the transaction queue: `docs/custody.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod error;
pub mod fireblocks;
pub mod provider;
pub mod secret;
pub mod types;
pub mod webhook;

pub use error::{CustodyError, ErrorClass, Result, TransportStage};
pub use fireblocks::{FireblocksConfig, FireblocksProvider};
pub use provider::{
    CancelOutcome, CustodyFuture, CustodyProvider, all_approval_statuses, approval_statuses,
};
pub use secret::{Secret, SecretSource};
pub use types::{
    AssetId, BlockInfo, ContractCall, Created, Ending, ExternalTxId, ProviderReason,
    ProviderTransaction, ProviderTxId, StatusPhase, SubStatus, TxHash, TxStatus, VaultAccountId,
};
pub use webhook::{
    WebhookError, WebhookEvent, WebhookEventType, WebhookVerifier, WebhookVerifierConfig,
};
