//! The seam: [`CustodyProvider`], what Keel asks of any custody platform that signs and
//! broadcasts for a vault account.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::CustodyError;
use crate::types::{
    ContractCall, Created, Ending, ExternalTxId, ProviderTransaction, ProviderTxId, StatusPhase,
    TxStatus,
};

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
/// - a provider's `COMPLETED` is not finality: read the receipt and depth on chain;
/// - what a status means is the provider's to say ([`status_phase`](Self::status_phase),
///   [`status_rank`](Self::status_rank), [`status_ending`](Self::status_ending)), and so
///   is how long a create's answer stays in doubt ([`in_doubt_window`](Self::in_doubt_window)):
///   the queue decides on those alone, so a second provider is one module implementing
///   this trait (plus its line in [`approval_statuses`]).
pub trait CustodyProvider: Send + Sync {
    /// A short, bounded name for logs and metric labels (`fireblocks`); stored with each
    /// submission.
    fn name(&self) -> &'static str;

    /// The provider-neutral phase of one of this provider's statuses; a status it does
    /// not know is [`StatusPhase::Unknown`] (in flight, never final).
    fn status_phase(&self, status: &TxStatus) -> StatusPhase;

    /// The order of this provider's statuses along a transaction's life (0 for an
    /// unknown status; terminal statuses share the top rank): a read or webhook of a
    /// lower rank after a higher one changes nothing.
    fn status_rank(&self, status: &TxStatus) -> u8;

    /// How a status of phase [`StatusPhase::Rejected`] ended (`None` for any other).
    fn status_ending(&self, status: &TxStatus) -> Option<Ending>;

    /// How long after a create was sent the provider could still accept it (for
    /// Fireblocks the lifetime of the request's JWT, 29 s): only after this window (plus
    /// the caller's clock skew) does a lookup by external id that finds nothing prove
    /// the create absent.
    fn in_doubt_window(&self) -> Duration;

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

/// The statuses of provider `provider` (a [`CustodyProvider::name`]) that wait for an
/// approval at the provider (phase [`StatusPhase::AwaitingApproval`]), spelled as
/// stored; empty for a provider this build does not know. For readers that hold the
/// stored rows but no provider (status pages, health).
pub fn approval_statuses(provider: &str) -> &'static [&'static str] {
    match provider {
        crate::fireblocks::NAME => crate::fireblocks::status::APPROVAL_STATUSES,
        _ => &[],
    }
}

/// Every known provider's approval statuses ([`approval_statuses`]) as (provider name,
/// status) pairs.
pub fn all_approval_statuses() -> Vec<(&'static str, &'static str)> {
    [crate::fireblocks::NAME]
        .into_iter()
        .flat_map(|p| approval_statuses(p).iter().map(move |s| (p, *s)))
        .collect()
}
