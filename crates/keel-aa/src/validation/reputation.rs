//! The ERC-7562 reputation of entities (paymasters and factories): `opsSeen` and
//! `opsIncluded` per (chain, address) in `aa_reputation`, decayed hourly by 23/24 on
//! read and write ([`crate::store::reputation_get`]).
//!
//! `maxSeen = opsSeen / inclusion_denominator`; **banned** when
//! `maxSeen > opsIncluded + ban_slack`, **throttled** when
//! `maxSeen > opsIncluded + throttling_slack`, else **ok** (new entities are ok).
//! A banned entity is refused (GREP-010); a throttled one is refused once
//! `throttled_mempool_count` of its operations are open (GREP-020); both with ERC-7769
//! code -32504.

use crate::store::ReputationRow;
use serde::{Deserialize, Serialize};

/// The reputation constants (ERC-7562 "Constants"; bundler values by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReputationParams {
    /// `MIN_INCLUSION_RATE_DENOMINATOR` (10 for a bundler).
    pub inclusion_denominator: i64,
    /// `THROTTLING_SLACK` (10).
    pub throttling_slack: i64,
    /// `BAN_SLACK` (50).
    pub ban_slack: i64,
    /// `THROTTLED_ENTITY_MEMPOOL_COUNT` (4): open operations a throttled entity may have.
    pub throttled_mempool_count: i64,
    /// `BAN_OPS_SEEN_PENALTY` (10000): `opsSeen` of an entity whose operation failed in a
    /// bundle after its validation.
    pub ban_ops_seen_penalty: i64,
}

impl Default for ReputationParams {
    fn default() -> Self {
        Self {
            inclusion_denominator: 10,
            throttling_slack: 10,
            ban_slack: 50,
            throttled_mempool_count: 4,
            ban_ops_seen_penalty: 10_000,
        }
    }
}

/// An entity's reputation status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Status {
    /// Unlimited.
    Ok,
    /// Limited to [`ReputationParams::throttled_mempool_count`] open operations.
    Throttled,
    /// Refused.
    Banned,
}

impl Status {
    /// `ok`, `throttled`, `banned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Throttled => "throttled",
            Self::Banned => "banned",
        }
    }
}

impl ReputationParams {
    /// The status of `row` under these constants.
    pub fn status(&self, row: ReputationRow) -> Status {
        let max_seen = row.ops_seen / self.inclusion_denominator.max(1);
        if max_seen > row.ops_included.saturating_add(self.ban_slack) {
            Status::Banned
        } else if max_seen > row.ops_included.saturating_add(self.throttling_slack) {
            Status::Throttled
        } else {
            Status::Ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ops_seen: i64, ops_included: i64) -> ReputationRow {
        ReputationRow {
            ops_seen,
            ops_included,
        }
    }

    #[test]
    fn status_follows_the_erc7562_formulas() {
        let p = ReputationParams::default();
        assert_eq!(p.status(row(0, 0)), Status::Ok);
        assert_eq!(p.status(row(109, 0)), Status::Ok);
        assert_eq!(p.status(row(110, 0)), Status::Throttled);
        assert_eq!(p.status(row(120, 1)), Status::Throttled);
        assert_eq!(p.status(row(120, 2)), Status::Ok);
        assert_eq!(p.status(row(509, 0)), Status::Throttled);
        assert_eq!(p.status(row(510, 0)), Status::Banned);
        assert_eq!(p.status(row(10_000, 0)), Status::Banned);
        assert_eq!(p.status(row(10_000, 950)), Status::Throttled);
        assert_eq!(p.status(row(10_000, 990)), Status::Ok);
    }
}
