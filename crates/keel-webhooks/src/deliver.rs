//! Delivery: the [`Dispatcher`] (a [`keel_service::BackgroundService`] of the runner
//! role).
//!
//! Each run reaps finished attempts, claims due deliveries up to its free capacity
//! ([`crate::WebhookConfig::total_in_flight`]) and starts one attempt per claim; a claim
//! leases the delivery ([`crate::WebhookConfig::lease`]), so a dispatcher that dies
//! mid-attempt (kill -9, an aborted task, a dropped connection) loses nothing: the lease
//! lapses and another claim sends it again, with the same `webhook-id`.
//!
//! The claim keeps the order and the bounds:
//! - per endpoint, events of one operation in the order they were written: a delivery
//!   waits while an earlier one of its (endpoint, operation) is pending (leased or
//!   waiting for a retry); different operations and endpoints run in parallel;
//! - at most [`crate::WebhookConfig::per_endpoint_in_flight`] attempts per endpoint;
//! - the circuit breaker: after [`crate::WebhookConfig::breaker_threshold`] failed
//!   attempts in a row an endpoint gets no attempt for the breaker's cooldown, then one
//!   probe at a time until an attempt succeeds.
//!
//! An attempt is one POST with the Standard Webhooks headers (`webhook-id`: the event
//! id; `webhook-timestamp`: unix seconds of this attempt; `webhook-signature`: see
//! [`crate::sign`]), `content-type: application/json`, the event payload as body;
//! redirects are not followed, the request has a timeout, names resolve through
//! [`crate::guard::GuardedResolver`]. Its verdict:
//!
//! | answer | verdict |
//! |---|---|
//! | 2xx | succeeded |
//! | 410 | failed; the endpoint is disabled (`gone`) |
//! | other status (3xx, 4xx, 5xx), timeout, connection error, refused address | retried after [`crate::WebhookConfig::retry_delay_jittered`], or failed when the next attempt would fall after the retry window |
//!
//! Delivery is at least once: a receiver can see an event again (a retry after its 2xx
//! was lost, a lapsed lease) and dedupes by `webhook-id`.
//!
//! ## Metrics
//! Labels from fixed sets only (never a URL or organization):
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `keel_webhooks_deliveries_total` | counter | event_type, outcome | attempts by verdict (`succeeded`, `retry`, `failed`, `gone`) |
//! | `keel_webhooks_attempt_duration_seconds` | histogram | outcome | attempt latency, seconds |
//! | `keel_webhooks_delivery_lag_seconds` | histogram | event_type | from the event's write to its successful delivery, seconds |
//! | `keel_webhooks_retries_total` | counter | event_type | attempts after the first |
//! | `keel_webhooks_endpoints_disabled_total` | counter | reason | endpoints disabled (`gone`, `failing`) |
//! | `keel_webhooks_oldest_pending_age_seconds` | gauge | — | age of the oldest event not yet dispatch-settled |

use crate::config::WebhookConfig;
use crate::error::{Result, WebhookError};
use crate::event::known_type;
use crate::guard::{BlockedAddress, GuardedResolver, check_form};
use crate::sign::signature_header;
use crate::store::{self, AttemptResult, ClaimedDelivery, Verdict};
use chrono::Utc;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// The `NOTIFY` channel [`crate::emit_in`] wakes dispatchers on.
pub const CHANNEL: &str = "keel_webhooks";

/// The delivery service (name `webhooks-dispatch`).
pub struct Dispatcher {
    shared: Arc<Shared>,
    in_flight: JoinSet<()>,
    wake: Arc<Notify>,
    listener: Option<tokio::task::JoinHandle<()>>,
    poll: Duration,
    gauge_at: Option<Instant>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

struct Shared {
    pool: PgPool,
    config: WebhookConfig,
    client: reqwest::Client,
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if let Some(l) = self.listener.take() {
            l.abort();
        }
    }
}

impl Dispatcher {
    /// A dispatcher on `pool`; `poll` bounds how long a run waits for an attempt to end
    /// before claiming again. Starts a `LISTEN` on [`CHANNEL`] (reconnecting) that
    /// wakes it when an event is written.
    ///
    /// # Errors
    /// [`WebhookError::Config`]; [`WebhookError::Client`].
    pub fn new(pool: PgPool, config: WebhookConfig, poll: Duration) -> Result<Self> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.request_timeout)
            .connect_timeout(config.connect_timeout)
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: config.policy.allow_private,
            }))
            .no_proxy()
            .user_agent("Keel-Webhooks/1")
            .build()
            .map_err(|_| WebhookError::Client)?;
        let wake = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(pool.clone(), wake.clone()));
        Ok(Self {
            shared: Arc::new(Shared {
                pool,
                config,
                client,
            }),
            in_flight: JoinSet::new(),
            wake,
            listener: Some(listener),
            poll,
            gauge_at: None,
        })
    }

    /// Attempts under way.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

async fn listen(pool: PgPool, wake: Arc<Notify>) {
    loop {
        match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(mut l) => {
                if l.listen(CHANNEL).await.is_ok() {
                    // A wake after (re)connecting: events written meanwhile are claimed.
                    wake.notify_one();
                    while l.recv().await.is_ok() {
                        wake.notify_one();
                    }
                }
            }
            Err(e) => {
                tracing::warn!(target: "keel::webhooks", error = %keel_store::StoreError::from(e), "webhook listener failed");
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl keel_service::BackgroundService for Dispatcher {
    type Error = WebhookError;

    fn name(&self) -> &'static str {
        "webhooks-dispatch"
    }

    async fn run_once(&mut self) -> Result<keel_service::Report> {
        while self.in_flight.try_join_next().is_some() {}
        let total = usize::try_from(self.shared.config.total_in_flight).unwrap_or(64);
        let free = total.saturating_sub(self.in_flight.len());
        let mut claimed = 0u64;
        if free > 0 {
            let c = &self.shared.config;
            let batch = store::deliveries_claim(
                &self.shared.pool,
                i64::try_from(free).unwrap_or(64),
                c.lease().as_secs_f64(),
                i64::from(c.per_endpoint_in_flight),
                i32::try_from(c.breaker_threshold).unwrap_or(i32::MAX),
            )
            .await?;
            claimed = batch.len() as u64;
            for d in batch {
                self.in_flight.spawn(attempt(self.shared.clone(), d));
            }
        }
        if self
            .gauge_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
        {
            self.gauge_at = Some(Instant::now());
            let age = store::oldest_pending_age(&self.shared.pool).await?;
            metrics::gauge!("keel_webhooks_oldest_pending_age_seconds").set(age);
        }
        if self.in_flight.is_empty() {
            return Ok(keel_service::Report::idle(claimed));
        }
        // Attempts run: claim again when one ends, an event is written, or after `poll`.
        tokio::select! {
            _ = self.in_flight.join_next() => {}
            () = self.wake.notified() => {}
            () = tokio::time::sleep(self.poll) => {}
        }
        Ok(keel_service::Report::more_pending(claimed))
    }

    fn cancel_safe(&self) -> bool {
        // Leased claims lapse; an interrupted attempt is sent again.
        true
    }

    fn wake(&self) -> Option<&Notify> {
        Some(&self.wake)
    }
}

/// The error class of a failed request (a fixed set).
fn error_class(e: &reqwest::Error) -> &'static str {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.is::<BlockedAddress>() {
            return "blocked_address";
        }
        src = s.source();
    }
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "network"
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        300..=399 => "http_3xx",
        400..=499 => "http_4xx",
        _ => "http_5xx",
    }
}

/// One attempt of `d`, recorded (a failed record leaves the lease to lapse).
async fn attempt(shared: Arc<Shared>, d: ClaimedDelivery) {
    let c = &shared.config;
    let id = d.event_id.to_string();
    let timestamp = Utc::now().timestamp();
    let mut secrets: Vec<&str> = vec![d.secret.as_str()];
    if let (Some(prev), Some(until)) = (&d.previous_secret, d.previous_secret_expires_at)
        && until > d.db_now
    {
        secrets.push(prev.as_str());
    }
    let signature = signature_header(&secrets, &id, timestamp, d.body.as_bytes());
    let started = Instant::now();
    let answer: std::result::Result<u16, &'static str> = match check_form(&d.url, c.policy) {
        Err(_) => Err("blocked_address"),
        Ok(url) => {
            let sent = shared
                .client
                .post(url)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature)
                .body(d.body.clone())
                .send()
                .await;
            match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    // Read (and drop) a bounded part of the body so the connection can be
                    // reused; the whole request is under the client's timeout.
                    let _ = resp.bytes().await;
                    Ok(status)
                }
                Err(e) => Err(error_class(&e)),
            }
        }
    };
    let latency = started.elapsed();
    let (http_status, error_class, verdict) = match answer {
        Ok(s) if (200..300).contains(&s) => (Some(s), None, Verdict::Succeeded),
        Ok(410) => (Some(410), Some("gone"), Verdict::Gone),
        Ok(s) => (Some(s), Some(status_class(s)), retry_or_give_up(c, &d)),
        Err(class) => (None, Some(class), retry_or_give_up(c, &d)),
    };
    let outcome = match verdict {
        Verdict::Succeeded => "succeeded",
        Verdict::Retry(_) => "retry",
        Verdict::GiveUp => "failed",
        Verdict::Gone => "gone",
    };
    let event_type = known_type(&d.event_type).unwrap_or("unknown");
    metrics::counter!("keel_webhooks_deliveries_total", "event_type" => event_type, "outcome" => outcome).increment(1);
    metrics::histogram!("keel_webhooks_attempt_duration_seconds", "outcome" => outcome)
        .record(latency.as_secs_f64());
    if verdict == Verdict::Succeeded {
        // From the event's write (the state change's transaction) to its delivery.
        let lag = (Utc::now() - d.event_created_at)
            .to_std()
            .unwrap_or_default();
        metrics::histogram!("keel_webhooks_delivery_lag_seconds", "event_type" => event_type)
            .record(lag.as_secs_f64());
    }
    if d.attempts > 1 {
        metrics::counter!("keel_webhooks_retries_total", "event_type" => event_type).increment(1);
    }
    let result = AttemptResult {
        delivery_id: d.id,
        fence: d.attempts,
        endpoint_id: d.endpoint_id,
        event_id: d.event_id,
        http_status: http_status.map(i32::from),
        latency_ms: i32::try_from(latency.as_millis()).unwrap_or(i32::MAX),
        error_class,
        verdict,
    };
    let recorded = match shared.pool.acquire().await {
        Ok(mut conn) => {
            store::attempt_record(
                &mut conn,
                &result,
                i32::try_from(c.breaker_threshold).unwrap_or(i32::MAX),
                c.breaker_cooldown.as_secs_f64(),
            )
            .await
        }
        Err(e) => Err(e.into()),
    };
    match recorded {
        Ok(r) => {
            if let Some(reason) = r.disabled {
                metrics::counter!("keel_webhooks_endpoints_disabled_total", "reason" => reason)
                    .increment(1);
                tracing::warn!(target: "keel::webhooks", endpoint = %d.endpoint_id, reason, "webhook endpoint disabled");
            }
        }
        Err(e) => {
            tracing::warn!(target: "keel::webhooks", delivery = %d.id, error = %e, "webhook attempt not recorded; the lease will lapse");
        }
    }
}

fn retry_or_give_up(c: &WebhookConfig, d: &ClaimedDelivery) -> Verdict {
    let delay = c.retry_delay_jittered(u32::try_from(d.attempts).unwrap_or(u32::MAX));
    let Ok(delay) = chrono::Duration::from_std(delay) else {
        return Verdict::GiveUp;
    };
    let Ok(window) = chrono::Duration::from_std(c.window) else {
        return Verdict::GiveUp;
    };
    let next = d.db_now + delay;
    if next > d.created_at + window {
        Verdict::GiveUp
    } else {
        Verdict::Retry(next)
    }
}
