//! Webhook audit retention: one pass of the daily cron job `webhooks-retention/daily`.
//!
//! An event is eligible when its `dispatch_settled_at` is older than the window
//! ([`crate::WebhookConfig::retention`], default 30 days; the window starts only at
//! that marker), it is not a test event, and none of its deliveries is `pending` or a
//! test delivery. An event without the marker is never eligible.
//!
//! Each batch is one transaction: lock up to `batch` eligible events with
//! `FOR UPDATE SKIP LOCKED`, lock their deliveries the same way and keep only the events
//! whose deliveries were all locked (a delivery or event that dispatch holds right now
//! wins; its event waits for a later pass); then delete the attempt rows (receipts),
//! then the delivery rows, then the events. Batches repeat until one deletes nothing
//! or `max_batches` ran. The pass reports deleted child rows (attempts + deliveries)
//! and events, the eligible events left, failed batches and its duration.

use crate::error::Result;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What one retention pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebhookRetentionReport {
    /// Attempt (receipt) rows deleted.
    pub deleted_attempts: u64,
    /// Delivery rows deleted.
    pub deleted_deliveries: u64,
    /// Event rows deleted.
    pub deleted_events: u64,
    /// Eligible events left after the pass (locked, beyond the cap, in a failed batch).
    pub remaining_eligible: u64,
    /// Batches that failed and were rolled back.
    pub failures: u32,
    /// Wall time of the pass.
    pub duration: Duration,
}

impl WebhookRetentionReport {
    /// Child rows (attempts and deliveries) deleted.
    pub fn deleted_children(&self) -> u64 {
        self.deleted_attempts + self.deleted_deliveries
    }

    /// Rows deleted in all.
    pub fn deleted(&self) -> u64 {
        self.deleted_children() + self.deleted_events
    }
}

macro_rules! eligible {
    () => {
        "e.dispatch_settled_at IS NOT NULL
   AND e.dispatch_settled_at < now() - make_interval(secs => $1)
   AND NOT e.is_test
   AND NOT EXISTS (SELECT 1 FROM webhook_delivery d
                    WHERE d.event_id = e.id AND (d.state = 'pending' OR d.is_test))"
    };
}

/// One batch, skipping the events in `skip` (held by dispatch earlier in this pass):
/// (attempts, deliveries, events) deleted; the events it had to leave are added to `skip`.
async fn batch(
    pool: &PgPool,
    window_secs: f64,
    limit: i64,
    skip: &mut Vec<Uuid>,
) -> Result<(u64, u64, u64)> {
    let mut tx = pool.begin().await?;
    let events: Vec<(Uuid,)> = sqlx::query_as(concat!(
        "SELECT e.id FROM webhook_event e WHERE ",
        eligible!(),
        " AND e.id <> ALL ($3) ORDER BY e.dispatch_settled_at, e.seq LIMIT $2 FOR UPDATE OF e SKIP LOCKED"
    ))
    .bind(window_secs)
    .bind(limit)
    .bind(&*skip)
    .fetch_all(&mut *tx)
    .await?;
    if events.is_empty() {
        tx.rollback().await?;
        return Ok((0, 0, 0));
    }
    let selected: Vec<Uuid> = events.into_iter().map(|(id,)| id).collect();
    // Deliveries of those events that could be locked; an event keeps all of its rows
    // unless every delivery of it was locked here.
    let keep: Vec<(Uuid,)> = sqlx::query_as(
        "WITH locked AS (
    SELECT id, event_id FROM webhook_delivery WHERE event_id = ANY ($1)
       FOR UPDATE SKIP LOCKED
)
SELECT e FROM unnest($1::uuid[]) AS e
 WHERE (SELECT count(*) FROM webhook_delivery d WHERE d.event_id = e)
     = (SELECT count(*) FROM locked l WHERE l.event_id = e)",
    )
    .bind(&selected)
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<Uuid> = keep.into_iter().map(|(id,)| id).collect();
    skip.extend(selected.iter().filter(|id| !ids.contains(id)));
    let attempts = sqlx::query(
        "DELETE FROM webhook_attempt a USING webhook_delivery d
          WHERE a.delivery_id = d.id AND d.event_id = ANY ($1)",
    )
    .bind(&ids)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let deliveries = sqlx::query("DELETE FROM webhook_delivery WHERE event_id = ANY ($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let deleted = sqlx::query("DELETE FROM webhook_event WHERE id = ANY ($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok((attempts, deliveries, deleted))
}

/// Runs one retention pass (at most `max_batches` batches of `batch_size` events).
///
/// # Errors
/// [`crate::WebhookError::Store`] when the final count fails; failed batches are
/// counted in the report instead.
pub async fn retention_pass(
    pool: &PgPool,
    window: Duration,
    batch_size: i64,
    max_batches: u32,
) -> Result<WebhookRetentionReport> {
    let started = Instant::now();
    let secs = window.as_secs_f64();
    let mut r = WebhookRetentionReport::default();
    let mut skip = Vec::new();
    for _ in 0..max_batches {
        let skipped = skip.len();
        match batch(pool, secs, batch_size, &mut skip).await {
            // Nothing selected: done.
            Ok((0, 0, 0)) if skip.len() == skipped => break,
            Ok((a, d, e)) => {
                r.deleted_attempts += a;
                r.deleted_deliveries += d;
                r.deleted_events += e;
            }
            Err(e) => {
                r.failures += 1;
                tracing::warn!(target: "keel::webhooks", error = %e, "webhook retention batch failed");
            }
        }
    }
    let (left,): (i64,) = sqlx::query_as(concat!(
        "SELECT count(*) FROM webhook_event e WHERE ",
        eligible!()
    ))
    .bind(secs)
    .fetch_one(pool)
    .await?;
    r.remaining_eligible = u64::try_from(left).unwrap_or(0);
    r.duration = started.elapsed();
    tracing::info!(target: "keel::webhooks", deleted_events = r.deleted_events,
        deleted_children = r.deleted_children(), remaining_eligible = r.remaining_eligible,
        failures = r.failures, duration_ms = r.duration.as_millis() as u64,
        "webhook retention pass");
    Ok(r)
}
