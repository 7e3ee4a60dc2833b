//! Engine and executor configuration.

use std::time::Duration;

use crate::error::{DurableError, Result};
use crate::payload::{DEFAULT_MAX_PAYLOAD_BYTES, MIN_MAX_PAYLOAD_BYTES};

/// Capped exponential backoff: attempt `n` (1-based) waits `min(base * 2^(n-1), cap)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub base: Duration,
    /// Upper bound of any delay.
    pub cap: Duration,
}

impl Backoff {
    /// The delay before attempt `n` (1-based; 0 is treated as 1).
    pub fn delay(&self, n: u32) -> Duration {
        let exp = n.saturating_sub(1).min(30);
        self.base.saturating_mul(1u32 << exp).min(self.cap)
    }
}

/// Settings shared by the engine's API and its executors.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Bound of start inputs and signal payloads, in bytes of compact JSON (default
    /// 262,144; minimum 1,024). `durable.maxPayloadBytes`.
    pub max_payload_bytes: usize,
    /// Unconsumed signals an instance may hold (default 100; at least 1).
    pub max_open_signals: u32,
    /// Attempts of a command before it is dead-lettered (default 5; at least 1). An
    /// attempt is spent by every claim, so a crashing executor exhausts it too; a
    /// segment released on a transient database failure gets it back. A dead letter
    /// fails its open instance `ATTEMPTS_EXHAUSTED` (retryable).
    pub command_max_attempts: u32,
    /// Execution lease of a segment (default 30 s, at least 1 s). A crashed executor's
    /// instance is claimable again this long after its last renewal.
    pub lease: Duration,
    /// Attempts of a step body that fails transiently, inside one segment (default 3).
    pub step_attempts: u32,
    /// Backoff between those attempts (default 50 ms, capped at 2 s).
    pub step_backoff: Backoff,
    /// Backoff of the recovery RETRY of a suspended instance (default 1 s, capped at
    /// 5 min), by consecutive suspension count.
    pub recovery_backoff: Backoff,
    /// Backoff before a command whose segment failed on infrastructure (database
    /// error, panic) is offered again (default 200 ms, capped at 30 s), by attempt.
    pub release_backoff: Backoff,
    /// A runnable command older than this is reported as stuck by the probe
    /// (default 300 s).
    pub stuck_after: Duration,
    /// Whether an executor's segment spans continue the trace recorded with their
    /// instance (the W3C `traceparent` of the span that started it, see
    /// [`keel_service::trace`]): one more primary-key read per segment. Default false;
    /// the binary turns it on with trace export. Starts record the caller's context
    /// either way (nothing without an installed propagator).
    pub continue_traces: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_open_signals: 100,
            command_max_attempts: 5,
            lease: Duration::from_secs(30),
            step_attempts: 3,
            step_backoff: Backoff {
                base: Duration::from_millis(50),
                cap: Duration::from_secs(2),
            },
            recovery_backoff: Backoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(300),
            },
            release_backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(30),
            },
            stuck_after: Duration::from_secs(300),
            continue_traces: false,
        }
    }
}

impl EngineConfig {
    /// Checks the bounds.
    ///
    /// # Errors
    /// [`DurableError::Config`] naming the key.
    pub fn validate(&self) -> Result<()> {
        let bad = |key, reason| Err(DurableError::Config { key, reason });
        if self.max_payload_bytes < MIN_MAX_PAYLOAD_BYTES {
            return bad("durable.maxPayloadBytes", "must be at least 1024");
        }
        if self.max_open_signals == 0 {
            return bad("durable.maxOpenSignals", "must be at least 1");
        }
        if self.command_max_attempts == 0 || self.command_max_attempts > 1_000 {
            return bad("durable.commandMaxAttempts", "must be 1 to 1000");
        }
        if self.lease < Duration::from_secs(1) {
            return bad("durable.leaseSeconds", "must be at least 1 second");
        }
        if self.step_attempts == 0 {
            return bad("durable.stepAttempts", "must be at least 1");
        }
        Ok(())
    }
}

/// Settings of one executor.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Segments this executor runs concurrently (default 4; at least 1).
    pub concurrency: usize,
    /// Poll interval when no notification arrives (default 1 s): the fallback for lost
    /// notifications and lapsed leases.
    pub poll_interval: Duration,
    /// How often a running segment renews its lease (default: a third of the lease).
    /// Must be shorter than the lease.
    pub renew_interval: Option<Duration>,
    /// Listen for `keel_durable` notifications (default true).
    pub listen: bool,
    /// Renew the lease of running segments (default true). Turn off only to simulate a
    /// stalled process in tests: its leases lapse and its late writes are fenced out.
    pub renew_leases: bool,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll_interval: Duration::from_secs(1),
            renew_interval: None,
            listen: true,
            renew_leases: true,
        }
    }
}

impl ExecutorConfig {
    /// Checks the bounds against the engine's lease.
    ///
    /// # Errors
    /// [`DurableError::Config`] naming the key.
    pub fn validate(&self, engine: &EngineConfig) -> Result<()> {
        let bad = |key, reason| Err(DurableError::Config { key, reason });
        if self.concurrency == 0 {
            return bad("durable.executor.concurrency", "must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return bad("durable.executor.pollIntervalMs", "must be positive");
        }
        if let Some(r) = self.renew_interval
            && (r.is_zero() || r >= engine.lease)
        {
            return bad(
                "durable.executor.renewIntervalMs",
                "must be positive and shorter than the lease",
            );
        }
        Ok(())
    }

    pub(crate) fn renew_every(&self, engine: &EngineConfig) -> Duration {
        self.renew_interval.unwrap_or(engine.lease / 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(3), Duration::from_millis(400));
        assert_eq!(b.delay(10), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn validation() {
        assert!(EngineConfig::default().validate().is_ok());
        let c = EngineConfig {
            max_payload_bytes: 1023,
            ..EngineConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(DurableError::Config {
                key: "durable.maxPayloadBytes",
                ..
            })
        ));
    }
}
