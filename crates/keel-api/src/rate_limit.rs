//! Per-API-key and per-organization request rate limits, so one integrator's loop cannot
//! starve the others.
//!
//! Two keyed GCRA limiters (`governor`), one keyed by the API key's id and one by its
//! organization's id, each configured by a [`Limit`] (a sustained rate in requests per
//! second and a burst; a rate of 0 switches that limit off). [`crate::scope::authorize`]
//! checks them right after the key is authenticated and holds the route's scope, before
//! the handler: the key's limit first, then the organization's. Public routes
//! (`/healthz`, `/readyz`, `/openapi.json`, the custody webhook) and the status page are
//! never limited. The limiters live in memory: the limits are **per api replica** (N
//! replicas behind a load balancer admit up to N times the configured rates).
//!
//! ## Answers
//! A limited request answers `429 Too Many Requests`, problem `RATE_LIMITED` (retryable;
//! `detail` names the limit, "the API key's" or "the organization's", never an id) with
//! `Retry-After` (RFC 9110 §10.2.3: whole seconds until one more request is admitted,
//! rounded up, at least 1) and the RateLimit fields of
//! draft-ietf-httpapi-ratelimit-headers (-09/-10):
//!
//! ```text
//! RateLimit-Policy: "api-key";q=200;w=2, "organization";q=600;w=2
//! RateLimit: "api-key";r=0;t=1
//! ```
//!
//! `RateLimit-Policy` lists each enabled limit: `q` its burst (the requests admitted at
//! once from a full bucket), `w` the seconds a drained bucket takes to refill (burst ÷
//! rate, rounded up, at least 1). `RateLimit` gives the tighter limit's state: `r` the
//! requests left now, `t` the seconds until its bucket is full again (on a `429`, the
//! limit that refused and `t` = `Retry-After`). Answers of limited routes that were
//! admitted carry both fields too.
//!
//! ## Memory
//! Each limiter holds one small state per key id / organization id it has seen; states
//! whose bucket has refilled completely are dropped ([`governor::RateLimiter::retain_recent`])
//! whenever a limiter tracks more than [`RETAIN_ABOVE`] ids (at most once a second) and
//! at least every [`RETAIN_EVERY`].

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use keel_workflows::Caller;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

use crate::problem::Problem;

/// The `RateLimit` field (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The `RateLimit-Policy` field (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// A limiter tracking more ids than this drops the idle ones (at most once a second).
pub const RETAIN_ABOVE: usize = 10_000;
/// Idle ids are dropped at least this often.
pub const RETAIN_EVERY: Duration = Duration::from_secs(60);

/// One limit: a sustained rate and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limit {
    /// Sustained requests per second; 0 switches the limit off.
    pub requests_per_second: u32,
    /// Requests admitted at once from a full bucket (at least 1 when the limit is on).
    pub burst: u32,
}

impl Limit {
    /// No limit.
    pub const OFF: Limit = Limit {
        requests_per_second: 0,
        burst: 0,
    };

    /// `requests_per_second` sustained with `burst` at once (a rate of 0: off).
    pub const fn new(requests_per_second: u32, burst: u32) -> Self {
        Self {
            requests_per_second,
            burst,
        }
    }

    /// Whether the limit is on.
    pub const fn is_on(self) -> bool {
        self.requests_per_second > 0
    }

    /// The GCRA quota: one request replenished every `1 / rate` s, `burst` at once (a
    /// burst of 0 counts as 1); `None` when off.
    fn quota(self) -> Option<Quota> {
        let rate = NonZeroU32::new(self.requests_per_second)?;
        let burst = NonZeroU32::new(self.burst).unwrap_or(NonZeroU32::MIN);
        Some(Quota::per_second(rate).allow_burst(burst))
    }
}

/// The request rate limits of the api role ([`crate::ApiConfig::rate_limits`]); the
/// default has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimitConfig {
    /// The limit of each API key.
    pub per_key: Limit,
    /// The limit of each organization, shared by all its keys.
    pub per_organization: Limit,
}

/// Which limit: the `limit` label of the rate-limit metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The API key's limit (label `key`, policy `"api-key"`).
    Key,
    /// The organization's limit (label `organization`, policy `"organization"`).
    Organization,
}

impl Which {
    /// The metric label: `key` or `organization`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Organization => "organization",
        }
    }

    /// The policy name of the RateLimit fields: `api-key` or `organization`.
    pub fn policy(self) -> &'static str {
        match self {
            Self::Key => "api-key",
            Self::Organization => "organization",
        }
    }

    fn whose(self) -> &'static str {
        match self {
            Self::Key => "the API key's",
            Self::Organization => "the organization's",
        }
    }
}

type KeyedLimiter =
    RateLimiter<Uuid, DefaultKeyedStateStore<Uuid>, DefaultClock, StateInformationMiddleware>;

/// One enabled limit's limiter.
struct Bucket {
    which: Which,
    limit: Limit,
    quota: Quota,
    limiter: KeyedLimiter,
    /// When the limiter was built (the origin of `last_retain_ms`).
    origin: Instant,
    /// Milliseconds after `origin` of the last `retain_recent`.
    last_retain_ms: AtomicU64,
}

impl Bucket {
    fn new(which: Which, limit: Limit) -> Option<Self> {
        let quota = limit.quota()?;
        Some(Self {
            which,
            limit,
            quota,
            limiter: RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>(),
            origin: Instant::now(),
            last_retain_ms: AtomicU64::new(0),
        })
    }

    fn burst(&self) -> u32 {
        self.quota.burst_size().get()
    }

    /// `"<policy>";q=<burst>;w=<seconds to refill>`.
    fn policy_item(&self) -> String {
        let window = ceil_secs(self.quota.burst_size_replenished_in()).max(1);
        format!("\"{}\";q={};w={window}", self.which.policy(), self.burst())
    }

    /// Seconds until the bucket is full again when `remaining` requests are left.
    fn reset_secs(&self, remaining: u32) -> u64 {
        let missing = self.burst().saturating_sub(remaining);
        ceil_secs(self.quota.replenish_interval() * missing)
    }

    /// Admits one request of `id`: the requests left, or how long until one more is
    /// admitted.
    fn check(&self, id: Uuid) -> Result<u32, Duration> {
        let outcome = match self.limiter.check_key(&id) {
            Ok(state) => Ok(state.remaining_burst_capacity()),
            Err(not_until) => Err(not_until.wait_time_from(self.limiter.clock().now())),
        };
        self.maybe_retain();
        outcome
    }

    /// Drops the ids whose bucket is full (indistinguishable from a fresh one): when
    /// more than [`RETAIN_ABOVE`] are tracked (at most once a second), and at least
    /// every [`RETAIN_EVERY`]. One caller does it; the others go on.
    fn maybe_retain(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_retain_ms.load(Ordering::Relaxed);
        let since = now.saturating_sub(last);
        let due = since >= RETAIN_EVERY.as_millis() as u64
            || (since >= 1_000 && self.limiter.len() > RETAIN_ABOVE);
        if due
            && self
                .last_retain_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The limiters of one API (built from [`RateLimitConfig`]; shared by every request).
pub struct RateLimits {
    buckets: Vec<Bucket>,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RateLimits");
        for b in &self.buckets {
            d.field(b.which.label(), &b.limit);
        }
        d.finish()
    }
}

/// What an admitted request's answer carries: the `RateLimit` and `RateLimit-Policy`
/// values (none when no limit is on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// `RateLimit-Policy`.
    pub policy: String,
    /// `RateLimit`: the tighter limit's state.
    pub rate: String,
}

impl Admitted {
    /// Sets both fields on `response`.
    pub fn apply(&self, response: &mut Response) {
        set(response, RATELIMIT_POLICY, &self.policy);
        set(response, RATELIMIT, &self.rate);
    }
}

/// A refused request: which limit, and the fields of its `429`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// The limit that refused.
    pub which: Which,
    /// `Retry-After`: whole seconds, at least 1.
    pub retry_after_secs: u64,
    /// `RateLimit-Policy`.
    pub policy: String,
    /// `RateLimit`: `"<policy>";r=0;t=<retry_after_secs>`.
    pub rate: String,
}

impl Limited {
    /// The `429 RATE_LIMITED` problem (retryable; `detail` names the limit, never an id).
    pub fn problem(&self) -> Problem {
        let mut p = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "RATE_LIMITED",
            format!(
                "{} request rate limit is exhausted; retry after the Retry-After seconds",
                self.which.whose()
            ),
        );
        p.retryable = true;
        p
    }
}

impl IntoResponse for Limited {
    fn into_response(self) -> Response {
        let mut res = self.problem().into_response();
        set(
            &mut res,
            header::RETRY_AFTER,
            &self.retry_after_secs.to_string(),
        );
        set(&mut res, RATELIMIT_POLICY, &self.policy);
        set(&mut res, RATELIMIT, &self.rate);
        res
    }
}

fn set(response: &mut Response, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, v);
    }
}

impl RateLimits {
    /// The limiters of `config` (none for a limit that is off).
    pub fn new(config: RateLimitConfig) -> Self {
        let buckets = [
            (Which::Key, config.per_key),
            (Which::Organization, config.per_organization),
        ]
        .into_iter()
        .filter_map(|(which, limit)| Bucket::new(which, limit))
        .collect();
        Self { buckets }
    }

    /// Whether any limit is on.
    pub fn is_on(&self) -> bool {
        !self.buckets.is_empty()
    }

    /// How many ids `which`'s limiter tracks now (0 when off).
    pub fn tracked(&self, which: Which) -> usize {
        self.buckets
            .iter()
            .find(|b| b.which == which)
            .map_or(0, |b| b.limiter.len())
    }

    fn policy(&self) -> String {
        self.buckets
            .iter()
            .map(Bucket::policy_item)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Admits one request of `caller`: its key's limit first, then its organization's
    /// (a request the key's limit refuses does not count against the organization).
    /// `Ok(None)` when no limit is on.
    ///
    /// # Errors
    /// [`Limited`] naming the limit that refused.
    pub fn check(&self, caller: &Caller) -> Result<Option<Admitted>, Limited> {
        if self.buckets.is_empty() {
            return Ok(None);
        }
        let mut tightest: Option<(&Bucket, u32)> = None;
        for b in &self.buckets {
            let id = match b.which {
                Which::Key => caller.api_key_id,
                Which::Organization => caller.organization_id,
            };
            match b.check(id) {
                Ok(remaining) => {
                    if tightest.is_none_or(|(_, r)| remaining < r) {
                        tightest = Some((b, remaining));
                    }
                }
                Err(wait) => {
                    crate::metrics::rate_limited(b.which);
                    let retry_after_secs = ceil_secs(wait).max(1);
                    return Err(Limited {
                        which: b.which,
                        retry_after_secs,
                        policy: self.policy(),
                        rate: format!("\"{}\";r=0;t={retry_after_secs}", b.which.policy()),
                    });
                }
            }
        }
        Ok(tightest.map(|(b, remaining)| Admitted {
            policy: self.policy(),
            rate: format!(
                "\"{}\";r={remaining};t={}",
                b.which.policy(),
                b.reset_secs(remaining)
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(key: Uuid, org: Uuid) -> Caller {
        Caller {
            organization_id: org,
            api_key_id: key,
        }
    }

    #[test]
    fn no_limits_admit_without_fields() {
        let limits = RateLimits::new(RateLimitConfig::default());
        assert!(!limits.is_on());
        for _ in 0..1000 {
            assert_eq!(
                limits.check(&caller(Uuid::new_v4(), Uuid::new_v4())),
                Ok(None)
            );
        }
    }

    /// A burst of 3 at 1 request/s: three admitted with `r` counting down, the fourth
    /// refused with `Retry-After: 1` and `r=0`; another key is still admitted.
    #[test]
    fn the_fields_count_down_and_the_refusal_says_when() {
        let limits = RateLimits::new(RateLimitConfig {
            per_key: Limit::new(1, 3),
            per_organization: Limit::OFF,
        });
        let (a, org) = (Uuid::new_v4(), Uuid::new_v4());
        let mut rates = Vec::new();
        for _ in 0..3 {
            let admitted = limits.check(&caller(a, org)).unwrap().unwrap();
            assert_eq!(admitted.policy, "\"api-key\";q=3;w=3");
            rates.push(admitted.rate);
        }
        assert_eq!(
            rates,
            [
                "\"api-key\";r=2;t=1",
                "\"api-key\";r=1;t=2",
                "\"api-key\";r=0;t=3"
            ]
        );
        let limited = limits.check(&caller(a, org)).unwrap_err();
        assert_eq!(limited.which, Which::Key);
        assert_eq!(limited.retry_after_secs, 1);
        assert_eq!(limited.rate, "\"api-key\";r=0;t=1");
        assert_eq!(limited.policy, "\"api-key\";q=3;w=3");
        let p = limited.problem();
        assert_eq!(
            (p.status, p.code.as_str(), p.retryable),
            (429, "RATE_LIMITED", true)
        );
        assert!(p.detail.starts_with("the API key's"), "{p:?}");
        assert!(!p.detail.contains(&a.to_string()) && !p.detail.contains(&org.to_string()));
        assert!(limits.check(&caller(Uuid::new_v4(), org)).is_ok());
    }

    /// Two keys of one organization share its budget; the tighter limit is reported.
    #[test]
    fn an_organization_shares_its_budget() {
        let limits = RateLimits::new(RateLimitConfig {
            per_key: Limit::new(100, 100),
            per_organization: Limit::new(1, 2),
        });
        let org = Uuid::new_v4();
        let first = limits.check(&caller(Uuid::new_v4(), org)).unwrap().unwrap();
        assert_eq!(
            first.policy,
            "\"api-key\";q=100;w=1, \"organization\";q=2;w=2"
        );
        assert_eq!(first.rate, "\"organization\";r=1;t=1");
        limits.check(&caller(Uuid::new_v4(), org)).unwrap();
        let limited = limits.check(&caller(Uuid::new_v4(), org)).unwrap_err();
        assert_eq!(limited.which, Which::Organization);
        assert!(limited.problem().detail.starts_with("the organization's"));
        assert_eq!(limited.rate, "\"organization\";r=0;t=1");
        // Another organization is unaffected.
        assert!(
            limits
                .check(&caller(Uuid::new_v4(), Uuid::new_v4()))
                .is_ok()
        );
    }

    /// The 429 answer: problem+json with `Retry-After` and both fields.
    #[test]
    fn the_429_answer_carries_its_headers() {
        let limited = Limited {
            which: Which::Organization,
            retry_after_secs: 2,
            policy: "\"organization\";q=2;w=2".to_owned(),
            rate: "\"organization\";r=0;t=2".to_owned(),
        };
        let res = limited.into_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = res.headers();
        assert_eq!(h[header::CONTENT_TYPE], crate::problem::PROBLEM_JSON);
        assert_eq!(h[header::RETRY_AFTER], "2");
        assert_eq!(h[RATELIMIT], "\"organization\";r=0;t=2");
        assert_eq!(h[RATELIMIT_POLICY], "\"organization\";q=2;w=2");
    }

    /// Full buckets are dropped: the limiter's memory stays bounded by the active ids.
    #[test]
    fn idle_ids_are_dropped() {
        let limits = RateLimits::new(RateLimitConfig {
            per_key: Limit::new(1_000_000, 1),
            per_organization: Limit::OFF,
        });
        let org = Uuid::new_v4();
        for _ in 0..(RETAIN_ABOVE + 10) {
            limits.check(&caller(Uuid::new_v4(), org)).unwrap();
        }
        assert!(limits.tracked(Which::Key) > RETAIN_ABOVE);
        // A million per second: every bucket is full again within a microsecond.
        std::thread::sleep(Duration::from_millis(1_100));
        limits.check(&caller(Uuid::new_v4(), org)).unwrap();
        assert!(
            limits.tracked(Which::Key) <= 2,
            "{}",
            limits.tracked(Which::Key)
        );
    }
}
