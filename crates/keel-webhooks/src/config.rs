//! The settings of delivery and retention, and the retry schedule.

use crate::error::{Result, WebhookError};
use crate::guard::UrlPolicy;
use std::time::Duration;

/// Delivery, retry and retention settings (`[webhooks]` of the binary's configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WebhookConfig {
    /// Which endpoint URLs are allowed (default: https only, no private ranges).
    pub policy: UrlPolicy,
    /// Whole-request timeout of one attempt (default 10 s).
    pub request_timeout: Duration,
    /// TCP/TLS connect timeout (default 5 s).
    pub connect_timeout: Duration,
    /// Delay after the first failed attempt (default 5 s); each later delay is 3 times
    /// the previous one, capped at [`WebhookConfig::retry_max`], each with ±20 % jitter.
    pub retry_initial: Duration,
    /// Longest delay between attempts (default 8 h).
    pub retry_max: Duration,
    /// How long a delivery is retried, from its creation (default 72 h); an endpoint
    /// that failed every attempt for this long is disabled when a delivery gives up.
    pub window: Duration,
    /// Attempts in flight per endpoint (default 4).
    pub per_endpoint_in_flight: u32,
    /// Attempts in flight per dispatcher (default 64).
    pub total_in_flight: u32,
    /// Failed attempts in a row that open an endpoint's circuit breaker (default 5).
    pub breaker_threshold: u32,
    /// How long an opened breaker stays open (default 30 s), doubling with each further
    /// failed probe up to 1 h; while it is half-open one attempt (the probe) runs at a time.
    pub breaker_cooldown: Duration,
    /// How long the previous secret keeps signing after a rotation, unless the rotation
    /// names its own (default 24 h).
    pub rotation_overlap: Duration,
    /// Added to the timeouts for a claim's lease (default 30 s; see [`WebhookConfig::lease`]).
    pub lease_margin: Duration,
    /// Audit retention window from `dispatch_settled_at` (default 30 days).
    pub retention: Duration,
    /// Events per retention batch (default 500).
    pub retention_batch: i64,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            policy: UrlPolicy::default(),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            retry_initial: Duration::from_secs(5),
            retry_max: Duration::from_secs(8 * 3600),
            window: Duration::from_secs(72 * 3600),
            per_endpoint_in_flight: 4,
            total_in_flight: 64,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(30),
            rotation_overlap: Duration::from_secs(24 * 3600),
            lease_margin: Duration::from_secs(30),
            retention: Duration::from_secs(30 * 24 * 3600),
            retention_batch: 500,
        }
    }
}

impl WebhookConfig {
    /// Checks the bounds.
    ///
    /// # Errors
    /// [`WebhookError::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |key, reason| Err(WebhookError::Config { key, reason });
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("requestTimeout", "timeouts must be positive");
        }
        if self.retry_initial.is_zero() || self.retry_max < self.retry_initial {
            return bad("retryInitial", "must be positive and at most retryMax");
        }
        if self.window < self.retry_initial {
            return bad("window", "must be at least retryInitial");
        }
        if self.per_endpoint_in_flight == 0 || self.total_in_flight == 0 {
            return bad("perEndpointInFlight", "must be at least 1");
        }
        if self.breaker_threshold == 0 {
            return bad("breakerThreshold", "must be at least 1");
        }
        if self.retention_batch < 1 {
            return bad("retentionBatch", "must be at least 1");
        }
        Ok(())
    }

    /// How long a claim leases a delivery: the connect and request timeouts plus
    /// [`WebhookConfig::lease_margin`] (a dispatcher that died mid-attempt leaves it to
    /// another after this).
    pub fn lease(&self) -> Duration {
        self.request_timeout + self.connect_timeout + self.lease_margin
    }

    /// The delay after failed attempt `attempt` (1 = the first), without jitter:
    /// `retry_initial × 3^(attempt-1)`, capped at `retry_max`. With the defaults:
    /// 5 s, 15 s, 45 s, 2 min 15 s, 6 min 45 s, 20 min 15 s, 1 h 45 s, 3 h 2 min, then
    /// 8 h, until 72 h after the delivery was created (about 15 attempts).
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let factor = 3u64.saturating_pow(exp);
        let secs = self.retry_initial.as_secs_f64() * factor as f64;
        Duration::from_secs_f64(secs.min(self.retry_max.as_secs_f64()))
    }

    /// [`WebhookConfig::retry_delay`] with jitter: uniformly within ±20 %.
    pub fn retry_delay_jittered(&self, attempt: u32) -> Duration {
        use rand::Rng;
        let d = self.retry_delay(attempt).as_secs_f64();
        Duration::from_secs_f64(d * rand::rng().random_range(0.8..=1.2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_spans_about_three_days() {
        let c = WebhookConfig::default();
        assert_eq!(c.retry_delay(1), Duration::from_secs(5));
        assert_eq!(c.retry_delay(2), Duration::from_secs(15));
        assert_eq!(c.retry_delay(9), Duration::from_secs(8 * 3600));
        assert_eq!(c.retry_delay(40), Duration::from_secs(8 * 3600));
        let mut t = Duration::ZERO;
        let mut attempts = 1;
        while t + c.retry_delay(attempts) <= c.window {
            t += c.retry_delay(attempts);
            attempts += 1;
        }
        assert!((14..=17).contains(&attempts), "{attempts}");
        let j = c.retry_delay_jittered(3).as_secs_f64();
        assert!((36.0..=54.0).contains(&j), "{j}");
        c.validate().unwrap();
    }
}
