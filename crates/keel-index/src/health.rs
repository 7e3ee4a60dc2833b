//! Ledger Index health for Platform Status, from the database only ([`index_health`]):
//! per chain the indexed tip against the last head the tip-ingest owner observed
//! (migration `0050_index_head_observation.sql`), the lag, the history ranges by state
//! and the owner epoch.

use crate::store::{chain as chain_row, range};
use crate::{IndexError, Result};
use chrono::{DateTime, Utc};
use keel_store::StoreError;
use keel_units::ChainId;

/// One chain of the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHealth {
    /// The chain.
    pub chain_id: ChainId,
    /// The fencing epoch of the current (or last) tip-ingest owner; it grows by one per
    /// ownership change.
    pub owner_epoch: u64,
    /// The indexed tip (`None`: nothing ingested yet).
    pub tip: Option<u64>,
    /// The node's head at the owner's last observation.
    pub head: Option<u64>,
    /// When that observation was recorded (re-recorded every few seconds while the
    /// owner runs: an old value means nobody ingests this chain).
    pub head_observed_at: Option<DateTime<Utc>>,
    /// Since when the tip has been below the observed head (`None`: caught up).
    pub behind_since: Option<DateTime<Utc>>,
    /// Blocks the tip is below the observed head (0 when caught up or unknown).
    pub lag_blocks: u64,
    /// When the chain was marked degraded (reorg deeper than the window), if it is.
    pub degraded_at: Option<DateTime<Utc>>,
    /// The degraded marker's reason code.
    pub degraded_reason: Option<String>,
    /// History ranges waiting for a worker.
    pub ranges_pending: u64,
    /// History ranges claimed (leased) by a worker.
    pub ranges_leased: u64,
    /// History ranges done.
    pub ranges_done: u64,
}

/// Every chain of `index_chain`, by chain id. Two statements; no node is asked.
///
/// # Errors
/// [`IndexError::Store`] when the database fails or a row does not decode.
pub async fn index_health(db: &keel_store::PgPool) -> Result<Vec<ChainHealth>> {
    let decode = |_| IndexError::Store(StoreError::Decode);
    let counts = range::range_state_counts(db).await?;
    chain_row::chains_status(db)
        .await?
        .into_iter()
        .map(|r| {
            let of = |state: &str| {
                counts
                    .iter()
                    .filter(|(c, s, _)| *c == r.chain_id && s == state)
                    .map(|(_, _, n)| u64::try_from(*n).unwrap_or(0))
                    .sum::<u64>()
            };
            let tip = r
                .tip_number
                .map(u64::try_from)
                .transpose()
                .map_err(decode)?;
            let head = r
                .head_number
                .map(u64::try_from)
                .transpose()
                .map_err(decode)?;
            Ok(ChainHealth {
                chain_id: ChainId(u64::try_from(r.chain_id).map_err(decode)?),
                owner_epoch: u64::try_from(r.owner_epoch).map_err(decode)?,
                lag_blocks: match (head, tip) {
                    (Some(h), Some(t)) => h.saturating_sub(t),
                    (Some(h), None) => h,
                    _ => 0,
                },
                tip,
                head,
                head_observed_at: r.head_observed_at,
                behind_since: r.behind_since,
                degraded_at: r.degraded_at,
                degraded_reason: r.degraded_reason,
                ranges_pending: of("pending"),
                ranges_leased: of("running"),
                ranges_done: of("completed"),
            })
        })
        .collect()
}
