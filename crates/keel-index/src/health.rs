//! Ledger Index health for Platform Status, from the database ([`index_health`]): per
//! chain the indexed tip against the last head the tip-ingest owner observed
//! (migration `0050_index_head_observation.sql`), the lag, the history ranges by state
//! and the owner epoch.
//!
//! The owner's observation alone cannot show a stopped indexer's lag (it stops
//! observing when it stops), so [`ChainHealth::judge`] weighs it against a head read
//! independently of the owner (Platform Status reads the node itself, with a short
//! timeout) and says whether the chain is red ([`IndexVerdict`]).

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
    /// `Some(since)` while an operator's re-index rebuilds the chain.
    pub rebuilding_since: Option<DateTime<Utc>>,
}

/// Where the head an [`IndexVerdict`] measures the lag against comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadSource {
    /// Read from the chain's node now, independently of the tip owner.
    Node,
    /// The tip owner's last recorded observation (the node could not be read).
    Owner,
    /// No head is known.
    Unknown,
}

impl HeadSource {
    /// `node`, `owner` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Owner => "owner",
            Self::Unknown => "unknown",
        }
    }
}

/// A chain's index judged against an independently observed head
/// ([`ChainHealth::judge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexVerdict {
    /// The head the lag is measured against: the higher of the node's (read now) and
    /// the owner's last observation.
    pub head: Option<u64>,
    /// Where `head` comes from.
    pub head_source: HeadSource,
    /// Blocks the indexed tip is below `head` (all of `head` with no tip).
    pub lag_blocks: u64,
    /// Seconds the tip has been behind: since the owner saw it behind, else (the owner
    /// saw it caught up, or stopped observing) since the owner's last observation; 0
    /// when not behind.
    pub lag_seconds: u64,
    /// True when the tip owner recorded an observation within `stale_after` (a live
    /// owner re-records every few seconds).
    pub owner_live: bool,
    /// True when no fresh head is known: the node could not be read and the owner's
    /// observation is older than `stale_after` (or missing).
    pub stale: bool,
    /// Red: degraded, no live owner, a stale head, or a lag above the tolerance.
    pub red: bool,
    /// Why it is red (`degraded`, `no_live_owner`, `stale_head`, `lagging`), in that
    /// order; empty when green.
    pub reasons: Vec<&'static str>,
}

impl ChainHealth {
    /// Judges the chain at `now` against `node_head` (the chain's head read now from
    /// its node, independently of the tip owner; `None` when it could not be read):
    /// the lag is measured against the higher of it and the owner's observation; the
    /// owner is live when its observation is at most `stale_after` old; the chain is
    /// red when degraded, without a live owner, without a fresh head, or more than
    /// `lag_tolerance_blocks` behind.
    pub fn judge(
        &self,
        now: DateTime<Utc>,
        node_head: Option<u64>,
        stale_after: std::time::Duration,
        lag_tolerance_blocks: u64,
    ) -> IndexVerdict {
        let stale_after = chrono::Duration::from_std(stale_after).unwrap_or(chrono::Duration::MAX);
        let owner_live = self
            .head_observed_at
            .is_some_and(|at| now.signed_duration_since(at) <= stale_after);
        let (head, head_source) = match (node_head, self.head) {
            (Some(n), Some(o)) => (Some(n.max(o)), HeadSource::Node),
            (Some(n), None) => (Some(n), HeadSource::Node),
            (None, Some(o)) => (Some(o), HeadSource::Owner),
            (None, None) => (None, HeadSource::Unknown),
        };
        let stale = node_head.is_none() && !owner_live;
        let lag_blocks = match (head, self.tip) {
            (Some(h), Some(t)) => h.saturating_sub(t),
            (Some(h), None) => h,
            _ => 0,
        };
        let secs = |at: DateTime<Utc>| {
            u64::try_from(now.signed_duration_since(at).num_seconds()).unwrap_or(0)
        };
        let lag_seconds = if lag_blocks == 0 {
            0
        } else {
            match (self.behind_since, self.head_observed_at) {
                (Some(since), _) => secs(since),
                (None, Some(at)) => secs(at),
                (None, None) => 0,
            }
        };
        let mut reasons = Vec::new();
        if self.degraded_at.is_some() {
            reasons.push("degraded");
        }
        if !owner_live {
            reasons.push("no_live_owner");
        }
        if stale {
            reasons.push("stale_head");
        }
        if lag_blocks > lag_tolerance_blocks {
            reasons.push("lagging");
        }
        IndexVerdict {
            head,
            head_source,
            lag_blocks,
            lag_seconds,
            owner_live,
            stale,
            red: !reasons.is_empty(),
            reasons,
        }
    }
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
                rebuilding_since: r.rebuild_started_at,
            })
        })
        .collect()
}
