//! The seam: [`CustodyProvider`], what Keel asks of any custody platform that signs and
//! broadcasts for a vault account.

use std::future::Future;
use std::pin::Pin;

use crate::error::CustodyError;
use crate::types::{ContractCall, Created, ExternalTxId, ProviderTransaction, ProviderTxId};

/// A boxed future of the seam.
pub type CustodyFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CustodyError>> + Send + 'a>>;

/// What a cancel request got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The provider accepted the cancel; the transaction moves to `CANCELLING` /
    /// `CANCELLED`. Confirm with a read before resubmitting.
    Accepted,
    /// The provider declined (already signed, broadcast or terminal).
    Declined,
}

/// A custody platform that signs **and broadcasts** for a vault account.
///
/// Contract for callers (the transaction queue's custody path):
/// - persist the call's [`ExternalTxId`] before [`create_contract_call`](Self::create_contract_call);
/// - after any create error of class [`InDoubt`](crate::ErrorClass::InDoubt) or
///   [`Duplicate`](crate::ErrorClass::Duplicate), call
///   [`get_by_external_id`](Self::get_by_external_id), never create again with the
///   same id (the provider would refuse) nor with a new one (that could double-spend);
/// - a provider's `COMPLETED` is not finality: read the receipt and depth on chain.
pub trait CustodyProvider: Send + Sync {
    /// A short, bounded name for logs and metric labels (`fireblocks`).
    fn name(&self) -> &'static str;

    /// Creates a contract call from `call.vault`.
    ///
    /// # Errors
    /// [`CustodyError::InDoubt`] when the answer was lost after sending;
    /// [`CustodyError::DuplicateExternalTxId`] when the external id exists; retryable
    /// errors only when nothing reached the provider (connect failure, 429).
    fn create_contract_call<'a>(&'a self, call: &'a ContractCall) -> CustodyFuture<'a, Created>;

    /// Reads a transaction by the provider's id.
    ///
    /// # Errors
    /// [`CustodyError::NotFound`] for an unknown id; retryable errors for 5xx/network.
    fn get<'a>(&'a self, id: &'a ProviderTxId) -> CustodyFuture<'a, ProviderTransaction>;

    /// Reads the transaction created with `external_tx_id`; `None` when the provider
    /// has none (the create never took effect).
    ///
    /// # Errors
    /// Retryable errors for 5xx/network (the answer is then unknown, not `None`).
    fn get_by_external_id<'a>(
        &'a self,
        external_tx_id: &'a ExternalTxId,
    ) -> CustodyFuture<'a, Option<ProviderTransaction>>;

    /// Asks the provider to cancel a transaction that is not yet broadcast.
    ///
    /// # Errors
    /// [`CustodyError::NotFound`] for an unknown id; retryable errors for 5xx/network.
    fn cancel<'a>(&'a self, id: &'a ProviderTxId) -> CustodyFuture<'a, CancelOutcome>;
}
