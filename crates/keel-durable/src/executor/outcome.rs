//! How a segment ended: the outcome its command is settled with (stored in
//! `durable_command.outcome`) or what happened instead, and the `outcome` label of
//! `keel_durable_commands_settled_total`.

/// The end of one segment (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Settled: the instance completed.
    Completed,
    /// Settled: the instance failed.
    Failed,
    /// Settled: the instance was cancelled (or the command found it cancelled).
    Cancelled,
    /// Settled: the instance blocks on a signal or timer.
    Waiting,
    /// Settled: a step's transient retries were exhausted; a recovery RETRY is queued.
    Suspended,
    /// Settled alone: a signal for a completed instance.
    Rejected,
    /// Settled alone: a signal for a failed instance (kept for a retry).
    Parked,
    /// Settled alone: the command has nothing left to do (its instance had ended).
    Stale,
    /// Nothing written: the lease was lost (fenced out).
    Fenced,
    /// Put back in the queue with a backoff.
    Released,
    /// The claim returned no lease token (cannot happen; nothing written).
    NoToken,
    /// The settle failed; the lease lapses and the command runs again.
    SettleFailed,
}

impl Outcome {
    /// The stored outcome code and metric label.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Waiting => "waiting",
            Self::Suspended => "suspended",
            Self::Rejected => "rejected",
            Self::Parked => "parked",
            Self::Stale => "stale",
            Self::Fenced => "fenced",
            Self::Released => "released",
            Self::NoToken => "no_token",
            Self::SettleFailed => "settle_failed",
        }
    }

    /// Settled by the segment-settle statement ([`super::settle`]), whose notification
    /// (or follow-up insert) tells the executors what the release made claimable.
    pub(crate) const fn is_plain_settle(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Cancelled | Self::Waiting | Self::Suspended
        )
    }
}
