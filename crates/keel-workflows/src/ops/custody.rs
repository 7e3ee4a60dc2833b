//! Custody-provider wake-ups: a verified provider webhook (received by the Platform
//! API) makes the queue's live submission of that transaction due for a read of the
//! provider at once ([`Ops::custody_wake`]). The webhook's body is never taken as the
//! truth; the queue's custody pass reads the provider.

use super::Ops;
use super::read::txq_err;
use crate::error::Result;

impl Ops {
    /// Wakes the transaction queue's live custody submission with this provider
    /// transaction id or external id (either may be absent; both absent match nothing):
    /// it becomes due for a read of its provider now. Returns whether a live
    /// submission matched (an event for a transaction the queue does not follow
    /// matches none). One statement ([`keel_txq::custody_wake`]).
    ///
    /// # Errors
    /// [`crate::OpsError::Store`] when the database fails.
    pub async fn custody_wake(
        &self,
        provider_tx_id: Option<&str>,
        external_tx_id: Option<&str>,
    ) -> Result<bool> {
        keel_txq::custody_wake(&self.db, provider_tx_id, external_tx_id)
            .await
            .map_err(txq_err)
    }
}
