//! An operator's re-index of a chain's Ledger Index through the Platform API (issue 32
//! §2): [`Ops::reindex_chain`] over [`keel_index::reindex()`].

use super::Ops;
use crate::error::{OpsError, Result};
use crate::tenancy::Caller;
use keel_units::ChainId;

impl Ops {
    /// Starts a re-index of `chain` from `from_block` (default: the lowest configured
    /// scope block) as [`keel_index::reindex()`] does: the live tip owner is fenced,
    /// the rows at and above the first block are deleted (balances follow and are
    /// recomputed), the degraded marker is cleared, and the indexer role rebuilds the
    /// chain while reads say `indexRebuilding`. The caller's scope (`admin`) is checked
    /// by the API; its key id is recorded in the owner id and the log.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] when the chain was never indexed (no `index_chain` row);
    /// [`OpsError::Index`] / [`OpsError::Store`] when the database fails.
    pub async fn reindex_chain(
        &self,
        caller: Caller,
        chain: ChainId,
        from_block: Option<u64>,
    ) -> Result<keel_index::Reindexed> {
        if !keel_index::read::chain_known(&self.db, chain).await? {
            return Err(OpsError::NotFound { what: "chain" });
        }
        Ok(keel_index::reindex(
            &self.db,
            chain,
            from_block,
            &format!("api-key:{}", caller.api_key_id),
        )
        .await?)
    }
}
