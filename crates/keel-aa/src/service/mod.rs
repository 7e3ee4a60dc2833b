//! What the Platform API calls: [`AaService`] — acceptance with a synchronous
//! pre-check, reads of an operation by hash, and the bundler's JSON-RPC 2.0 methods
//! (ERC-7769) over them ([`AaService::rpc`]).
//!
//! ## JSON-RPC (`POST /v1/chains/{chain}/bundler`)
//!
//! | method | params | result |
//! |---|---|---|
//! | `eth_chainId` | — | the chain id, hex quantity |
//! | `eth_supportedEntryPoints` | — | `[resolved EntryPoint]` (never the configured reference) |
//!
//! Top-level addresses of results are EIP-55 checksummed.
//! | `eth_sendUserOperation` | `[userOperation, entryPoint]` | the operation hash; the resolved address only |
//! | `eth_getUserOperationByHash` | `[hash]` | `{userOperation, entryPoint, blockNumber, blockHash, transactionHash}` (block fields `null` while pending: accepted, ready, bundled) or `null` (unknown, or ended without inclusion: `failed`, `nonce_used_elsewhere` — it will never be included; see `keel_getUserOperationStatus` for why) |
//! | `eth_getUserOperationReceipt` | `[hash]` | `{userOpHash, entryPoint, sender, nonce, paymaster, actualGasCost, actualGasUsed, success, reason, logs, receipt}` or `null` (until included at the queue's depth; read from the chain, so `null` again while a reorg has its bundle out) |
//! | `keel_getUserOperationStatus` | `[hash]` | [`UserOperationStatus`]: `{status, userOpHash, entryPoint, reason, bundle, transactionHash, blockNumber, blockHash}`; `{status: "unknown"}` for an unknown hash (states: `docs/aa.md`, "Operation states") |
//! | `eth_estimateUserOperationGas` | `[userOperation, entryPoint]` (configured or resolved; gas fields and signature may be absent) | `{preVerificationGas, verificationGasLimit, callGasLimit, paymasterVerificationGasLimit, paymasterPostOpGasLimit}` (see [`crate::estimate`]) |
//! | `pm_getPaymasterStubData` (ERC-7677) | `[userOperation, entryPoint, chainId, context]` | `{paymaster, paymasterData, paymasterVerificationGasLimit, paymasterPostOpGasLimit, sponsor, isFinal: false}` |
//! | `pm_getPaymasterData` (ERC-7677) | `[userOperation, entryPoint, chainId, context]` | `{paymaster, paymasterData}`: signed by the sponsor key after the sponsorship policy |
//!
//! Errors (`error.code`): `-32700` parse error, `-32600` invalid request, `-32601` method
//! not found, `-32501` paymaster (no paymaster configured on the chain, or the
//! sponsorship policy refused: `data.reason` names the rule, `SPONSOR_…`), `-32602`
//! invalid params (a `chainId` that is not the route's, an unsupported EntryPoint, including the
//! configured reference named for submission: rebuild and re-sign against the resolved
//! EntryPoint), the EntryPoint's refusal in the pre-check with its ERC-7769 code
//! (`-32500`, `-32501`, `-32503`, `-32507`, `-32508`; `data.reason` holds the `AAxx`
//! reason), a validation rule's refusal (`-32502` ERC-7562 rule, `-32504` reputation,
//! `-32505` a stake below the minimum; the message in the reference bundler's phrasing
//! with the rule, e.g. `account uses banned opcode: TIMESTAMP (OP-011)`, `data.reason`,
//! `data.rule` and `data.entity`), `-32603` internal error (retryable: the chain or the database did not
//! answer). Messages are value-free.
//!
//! `eth_sendUserOperation` first applies the admission checks of [`crate::admission`]
//! against the latest block (fee floors, `preVerificationGas`, the bundle fit, one open
//! operation per sender, the ERC-7562 replacement rule; `-32602` or `-32505` with
//! `data.field` and `data.reason`, the message naming the field), then pre-checks the
//! operation with the same `handleOps` simulation the workflow journals (so a refusal is
//! answered at once, before anything is recorded), then starts or joins its workflow: a
//! resend answers the same hash. An accepted replacement ends the operation it replaces
//! `replaced` and tells its workflow once.

use crate::admission::{self, ChainView, Refusal};
use crate::flow::{self, AaEnv, SubmitError, Submitted};
use crate::store::{self, UserOperationRow};
use crate::{Erc7769Code, Resolution, UserOperation, resolve_entry_point, user_operation_receipt};
use alloy::primitives::{Address, B256};
use keel_durable::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use uuid::Uuid;

mod rpc;
mod send;
mod view;

pub(crate) use rpc::CallError;
pub use rpc::chain_view;
use rpc::hex_u64;
use view::b256;
pub use view::{
    DepositRequestView, StatusBundle, StatusReason, UserOperationStatus, UserOperationView, status,
    status_of,
};

/// The account-abstraction service of the API.
#[derive(Clone)]
pub struct AaService {
    env: Arc<AaEnv>,
    engine: Engine,
    debug_namespace: bool,
}

impl std::fmt::Debug for AaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AaService").finish_non_exhaustive()
    }
}

/// Why [`AaService::send`] refused, beyond [`SubmitError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Acceptance refused (see [`SubmitError`]).
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The EntryPoint refused the operation in the pre-check.
    #[error("the EntryPoint refused the user operation")]
    Rejected {
        /// The ERC-7769 code.
        code: Erc7769Code,
        /// The `AAxx` reason.
        reason: String,
        /// The revert data of the account, factory or paymaster
        /// (`FailedOpWithRevert.inner`), when the EntryPoint passed it on.
        revert: Option<alloy::primitives::Bytes>,
    },
    /// Keel's validation rules refused the operation (an ERC-7562 rule broken in the
    /// traced validation, or an entity's reputation), not the EntryPoint.
    #[error("the user operation breaks a validation rule")]
    Violation {
        /// The ERC-7769 code (-32502, -32504 or -32505).
        code: Erc7769Code,
        /// Keel's reason (`OP-011 account TIMESTAMP`).
        reason: String,
        /// The rule and entity, and the client-facing message
        /// (`account uses banned opcode: TIMESTAMP (OP-011)`).
        breach: crate::validation::Breach,
    },
    /// Admission refused the operation before simulating it ([`crate::admission`]):
    /// a fee floor, `preVerificationGas`, the bundle fit, one operation per sender, the
    /// replacement rule. Names the field.
    #[error("the user operation was refused at admission")]
    Refused(#[source] Refusal),
    /// The chain did not answer the pre-check; retry.
    #[error("the chain did not answer")]
    Unavailable,
    /// The database did not answer; retry.
    #[error("the database did not answer")]
    Store(#[source] keel_store::StoreError),
}

impl SendError {
    /// The JSON-RPC `error.code` (ERC-7769, or -32603 for a retryable failure).
    pub fn code(&self) -> i32 {
        match self {
            Self::Submit(e) => e.erc7769().map_or(-32603, Erc7769Code::code),
            Self::Rejected { code, .. } | Self::Violation { code, .. } => code.code(),
            Self::Refused(r) => r.code.code(),
            Self::Unavailable | Self::Store(_) => -32603,
        }
    }

    /// True when the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Submit(e) => e.is_retryable(),
            Self::Rejected { .. } | Self::Violation { .. } | Self::Refused(_) => false,
            Self::Unavailable | Self::Store(_) => true,
        }
    }
}

/// A failed read (value-free).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The database failed.
    #[error("database")]
    Store(#[from] keel_store::StoreError),
    /// The chain failed.
    #[error("chain access")]
    Chain(#[from] keel_chain::ChainError),
    /// A stored row holds a value that does not decode (the table and column named,
    /// never the value).
    #[error("a stored {table} row is unreadable ({column})")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
}

impl AaService {
    /// The service over `env`, starting workflows on `engine`.
    pub fn new(env: Arc<AaEnv>, engine: Engine) -> Self {
        Self {
            env,
            engine,
            debug_namespace: false,
        }
    }

    /// The same service answering the `debug_bundler_*` methods ([`crate::debug`]) when
    /// `on` (configuration `aa.debugMethods`; off by default: they let a client change
    /// the bundling mode and drop operations).
    #[must_use]
    pub fn with_debug_namespace(mut self, on: bool) -> Self {
        self.debug_namespace = on;
        self
    }

    /// The served chain ids.
    pub fn chain_ids(&self) -> Vec<u64> {
        self.env.served_chain_ids()
    }
}
