//! An operator's re-index of one chain (issue 32 §2): the way back from a degraded
//! chain (or any doubt about a chain's rows) without SQL, through `keel index reindex
//! --chain NAME [--from-block N]` or the admin API route.
//!
//! [`reindex()`] resets the chain in one transaction and leaves the rebuild to the
//! indexer role, which does it as it indexes any chain the first time:
//!
//! 1. It takes a new owner epoch (owner id `reindex:<by>`): the live tip owner is
//!    fenced (its next write commits nothing, [`IndexError::Fenced`]); its follow loop
//!    ([`crate::follow_tip`]) sees the re-index as the newest owner and starts over:
//!    it plans history and takes ownership again. A history worker holding a range at
//!    or above the first block commits nothing either (its range row is gone).
//! 2. It deletes, at and above the first block (`--from-block`, default the lowest
//!    `from_block` of the scope an operator configured), every raw log and projection
//!    row with ordinary `DELETE`s, so the balance triggers move
//!    `index_holder_balance` with them; then it recomputes every holder balance of the
//!    chain from its transfers (repairing damage a `TRUNCATE` left behind); it deletes
//!    the contracts discovered at or above the first block (they are discovered again),
//!    the hash window, and the history ranges reaching the first block (the part of
//!    one below it is planned again).
//! 3. It clears the checkpoint, the recorded finalized block and the degraded marker,
//!    and records `rebuild_started_at` / `rebuild_from_block` (migration 0062).
//!
//! The indexer's tip owner then plans history from the first block up to the settled
//! height, every replica's history workers fetch it, and the tip continues above it.
//! Reads say `indexRebuilding` ([`crate::read::ChainHealth::rebuilding_since`]) until
//! the chain has a tip again and every history range is completed (the tip owner
//! clears the marker then). Locks: every range row of the chain, then the chain row,
//! the order a history completion takes them, so the re-index and a completing worker
//! cannot deadlock.

use crate::Result;
use crate::scope::{chain_i64, to_i64};
use crate::store::{block, chain as chain_row, ledger, logs, range, scope as scope_rows};
use keel_store::PgPool;
use keel_units::ChainId;

/// The owner id prefix a re-index records when it takes the chain's epoch.
pub const REINDEX_OWNER_PREFIX: &str = "reindex:";

/// What [`reindex()`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reindexed {
    /// The chain.
    pub chain: ChainId,
    /// The first block rebuilt.
    pub from_block: u64,
    /// The owner epoch the re-index took (the live owner's was lower: it is fenced).
    pub epoch: i64,
    /// Whether the chain was marked degraded (the marker is cleared).
    pub was_degraded: bool,
    /// History ranges deleted (those reaching the first block).
    pub ranges_cut: u64,
}

/// Re-indexes `chain` from `from_block` (default: the lowest `from_block` of the scope
/// an operator configured, else 0), as the module describes; `requested_by` names the
/// operator or key in the recorded owner id and the log (no secret).
///
/// Safe while the indexer role runs: the new epoch fences the live tip owner, and the
/// locks order the reset against every history write.
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn reindex(
    db: &PgPool,
    chain: ChainId,
    from_block: Option<u64>,
    requested_by: &str,
) -> Result<Reindexed> {
    let c = chain_i64(chain);
    let mut tx = db.begin().await?;
    chain_row::chain_ensure(&mut *tx, c).await?;
    range::ranges_lock_all(&mut *tx, c).await?;
    let epoch = chain_row::chain_take_ownership(
        &mut *tx,
        c,
        &format!("{REINDEX_OWNER_PREFIX}{requested_by}"),
    )
    .await?;
    let was_degraded = chain_row::chain_degraded_at(&mut *tx, c).await?.is_some();
    let from = match from_block {
        Some(f) => f,
        None => scope_rows::scope_configured_start(&mut *tx, c)
            .await?
            .and_then(|f| u64::try_from(f).ok())
            .unwrap_or(0),
    };
    let above = to_i64(from) - 1;
    logs::projections_delete_above(&mut tx, c, above).await?;
    ledger::balances_recompute(&mut tx, c).await?;
    scope_rows::scopes_delete_discovered_above(&mut *tx, c, above).await?;
    block::blocks_delete_all(&mut *tx, c).await?;
    let ranges_cut = range::ranges_cut_at(&mut *tx, c, to_i64(from)).await?;
    chain_row::chain_start_rebuild(&mut *tx, c, to_i64(from)).await?;
    tx.commit().await?;
    metrics::gauge!("keel_index_chain_degraded", "chain_id" => chain.get().to_string()).set(0.0);
    metrics::counter!("keel_index_reindex_total", "chain_id" => chain.get().to_string())
        .increment(1);
    tracing::warn!(target: "keel::index::reindex", chain = %chain, from_block = from, epoch, was_degraded, ranges_cut, requested_by, "chain re-index started: rows at and above the first block deleted, balances recomputed, degraded marker cleared; the indexer role rebuilds it");
    Ok(Reindexed {
        chain,
        from_block: from,
        epoch,
        was_degraded,
        ranges_cut,
    })
}

/// True when the chain's current owner id was recorded by a re-index (the tip follow
/// loop then starts over instead of ending as a handed-over owner).
///
/// # Errors
/// [`crate::IndexError::Store`].
pub async fn owned_by_reindex(db: &PgPool, chain: ChainId) -> Result<bool> {
    Ok(chain_row::chain_owner_id(db, chain_i64(chain))
        .await?
        .is_some_and(|o| o.starts_with(REINDEX_OWNER_PREFIX)))
}
