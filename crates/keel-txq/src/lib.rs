//! # keel-txq
//!
//! Every on-chain write Keel makes goes through this queue, keyed by (chain, sender).
//! Its promise: per request (identified by an idempotency key) at most one transaction
//! takes effect on chain, a sender's nonces are used in order, and every request ends
//! with a typed [`SettlementVerdict`].
//!
//! ## Lifecycle of a request
//!
//! | state | meaning | moved by |
//! |---|---|---|
//! | `queued` | recorded, no nonce yet | [`TxQueue::enqueue`] |
//! | `signed` | a nonce is assigned and the signed raw transaction is **persisted**; it may not have reached a node | the sender pass |
//! | `broadcast` | a node accepted an attempt (or said it already knew it) | the sender pass |
//! | `settled` | the verdict is final: `confirmed`, `reverted` or `failed` | the confirmation pass, or the sender pass for failures before signing |
//!
//! - **Enqueue** is idempotent by (chain, sender, key): the same key and payload
//!   return the existing request; a different payload is [`TxqError::IdempotencyConflict`].
//! - **Signing** happens in one database transaction that locks the sender's row
//!   (`txq_sender`, `FOR UPDATE`), takes its next nonce, signs through the
//!   [`TxSigner`] seam and inserts the attempt (raw bytes and hash) before committing.
//!   A request that fails before signing (gas estimation reverts, the sender cannot
//!   pay) consumes no nonce and settles `failed`.
//! - **Broadcast** happens after the commit, outside any transaction. A crash between
//!   the two leaves a `signed` request whose exact bytes the next pass re-broadcasts.
//!   "Already known" is success. "Nonce too low" is resolved by looking for a receipt
//!   of any attempt of that nonce: ours mined means broadcast; none mined (after
//!   confirming that the chain's nonce passed ours) means another transaction took
//!   the nonce: the request settles `failed` with `NONCE_CONSUMED_EXTERNALLY`.
//! - **Confirmation**: receipts of every attempt of in-flight requests are fetched in
//!   one batch; a receipt at least `confirmations` blocks deep settles the request
//!   (`confirmed`, or `reverted` with the decoded reason). A receipt that disappears
//!   in a reorg before that depth leaves the request in flight, and the same signed
//!   bytes are re-broadcast when the node no longer knows the transaction.
//! - A caller (a workflow step) reads the verdict with [`TxQueue::status`] or waits for
//!   it with [`TxQueue::await_verdict`].
//!
//! - **Fee bumping**: a `broadcast` transaction without a receipt after `bump_after`
//!   is replaced at the same nonce with both fees raised by `bump_percent` (≥ 10 %,
//!   the geth/reth replacement rule) and at least the market's, capped per chain; each
//!   attempt is persisted before broadcast and whichever attempt mines settles.
//!
//! - **Nonce recovery** ([`TxQueue::recover_nonces`], at start and periodically):
//!   adopts a nonce advanced outside Keel and fills gaps left by requests that failed
//!   after signing with zero-value self-transfers.
//!
//! Not here yet: funding pauses
//! (the request fails `GAS_REQUIRED` instead), running the confirmation pass as a
//! cluster singleton in the runner role, the benchmark.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod queue;
mod signer;
mod store;
mod verdict;

pub use error::{Result, TxqError};
pub use queue::{RequestStatus, TxQueue, TxQueueConfig, TxRequest};
pub use signer::{LocalSigner, SignFuture, SignerError, TxSigner};
pub use verdict::{AttemptRecord, SettlementVerdict};
