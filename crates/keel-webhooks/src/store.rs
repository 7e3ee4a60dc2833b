//! Every SQL statement on this crate's tables (`migrations/0032_webhooks.sql`),
//! noun-first, over any executor (the outbox write over the caller's transaction).

use crate::error::Result;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

/// Writes an event and its deliveries (see [`crate::emit_in`]); returns the number of
/// deliveries (0: no subscribed endpoint, nothing written).
pub(crate) async fn event_fan_out(
    conn: &mut PgConnection,
    id: Uuid,
    organization_id: Uuid,
    event_type: &str,
    operation_id: Option<Uuid>,
    payload: &Value,
    created_at: DateTime<Utc>,
) -> Result<u64> {
    let (n, _): (i64, i64) = sqlx::query_as(
        "WITH ep AS (
    SELECT id FROM webhook_endpoint
     WHERE organization_id = $2 AND enabled AND deleted_at IS NULL
       AND ($3 = ANY (event_types) OR '*' = ANY (event_types))
), e AS (
    INSERT INTO webhook_event (id, organization_id, event_type, operation_id, payload, created_at)
    SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM ep)
    RETURNING id, seq
), d AS (
    INSERT INTO webhook_delivery (id, event_id, endpoint_id, seq, operation_id, event_type, created_at)
    SELECT gen_random_uuid(), e.id, ep.id, e.seq, $4, $3, $6 FROM e CROSS JOIN ep
    RETURNING 1
), n AS (
    SELECT pg_notify('keel_webhooks', '') FROM e
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM n)",
    )
    .bind(id)
    .bind(organization_id)
    .bind(event_type)
    .bind(operation_id)
    .bind(payload)
    .bind(created_at)
    .fetch_one(conn)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// A test event for one endpoint (marked `is_test` on event and delivery).
pub(crate) async fn test_event_insert(
    db: impl PgExecutor<'_>,
    id: Uuid,
    organization_id: Uuid,
    endpoint_id: Uuid,
    payload: &Value,
    created_at: DateTime<Utc>,
) -> Result<()> {
    let _: (i64, i64) = sqlx::query_as(
        "WITH e AS (
    INSERT INTO webhook_event (id, organization_id, event_type, payload, is_test, created_at)
    VALUES ($1, $2, 'webhook.test', $4, true, $5)
    RETURNING id, seq
), d AS (
    INSERT INTO webhook_delivery (id, event_id, endpoint_id, seq, event_type, is_test, created_at)
    SELECT gen_random_uuid(), e.id, $3, e.seq, 'webhook.test', true, $5 FROM e
    RETURNING 1
), n AS (
    SELECT pg_notify('keel_webhooks', '') FROM e
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM n)",
    )
    .bind(id)
    .bind(organization_id)
    .bind(endpoint_id)
    .bind(payload)
    .bind(created_at)
    .fetch_one(db)
    .await?;
    Ok(())
}

/// An endpoint row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EndpointRow {
    /// Endpoint id.
    pub id: Uuid,
    /// Owner.
    pub organization_id: Uuid,
    /// Delivery URL.
    pub url: String,
    /// Free text.
    pub description: String,
    /// Subscribed types (or `*`).
    pub event_types: Vec<String>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why Keel disabled it (`gone`, `failing`), if it did.
    pub disabled_reason: Option<String>,
    /// Current signing secret.
    pub secret: String,
    /// The previous secret, signing until `previous_secret_expires_at`.
    pub previous_secret: Option<String>,
    /// End of the rotation overlap.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

macro_rules! endpoint_cols {
    () => {
        "id, organization_id, url, description, event_types, enabled, disabled_reason, \
         secret, previous_secret, previous_secret_expires_at, created_at, updated_at"
    };
}

/// A new endpoint.
#[derive(Debug, Clone)]
pub(crate) struct NewEndpointRow<'a> {
    pub(crate) id: Uuid,
    pub(crate) organization_id: Uuid,
    pub(crate) url: &'a str,
    pub(crate) description: &'a str,
    pub(crate) event_types: &'a [String],
    pub(crate) enabled: bool,
    pub(crate) secret: &'a str,
}

pub(crate) async fn endpoint_insert(
    db: impl PgExecutor<'_>,
    e: &NewEndpointRow<'_>,
) -> Result<EndpointRow> {
    Ok(sqlx::query_as(concat!("INSERT INTO webhook_endpoint (id, organization_id, url, description, event_types, enabled, secret)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING ", endpoint_cols!()))
    .bind(e.id)
    .bind(e.organization_id)
    .bind(e.url)
    .bind(e.description)
    .bind(e.event_types)
    .bind(e.enabled)
    .bind(e.secret)
    .fetch_one(db)
    .await?)
}

pub(crate) async fn endpoint_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> Result<Option<EndpointRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        endpoint_cols!(),
        " FROM webhook_endpoint
          WHERE id = $1 AND organization_id = $2 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(organization_id)
    .fetch_optional(db)
    .await?)
}

/// Endpoints of an organization, oldest first, after the keyset `(created_at, id)`.
pub(crate) async fn endpoint_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<EndpointRow>> {
    let (at, id) = after.unzip();
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        endpoint_cols!(),
        " FROM webhook_endpoint
          WHERE organization_id = $1 AND deleted_at IS NULL
            AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3))
          ORDER BY created_at, id LIMIT $4"
    ))
    .bind(organization_id)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// A change to an endpoint (`None`: unchanged).
#[derive(Debug, Clone, Default)]
pub(crate) struct EndpointChange<'a> {
    pub(crate) url: Option<&'a str>,
    pub(crate) description: Option<&'a str>,
    pub(crate) event_types: Option<&'a [String]>,
    pub(crate) enabled: Option<bool>,
}

pub(crate) async fn endpoint_update(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
    c: &EndpointChange<'_>,
) -> Result<Option<EndpointRow>> {
    Ok(sqlx::query_as(concat!(
        "UPDATE webhook_endpoint
            SET url = coalesce($3, url), description = coalesce($4, description),
                event_types = coalesce($5, event_types), enabled = coalesce($6, enabled),
                disabled_reason = CASE WHEN $6 THEN NULL ELSE disabled_reason END,
                consecutive_failures = CASE WHEN $6 THEN 0 ELSE consecutive_failures END,
                breaker_open_until = CASE WHEN $6 THEN NULL ELSE breaker_open_until END,
                failing_since = CASE WHEN $6 THEN NULL ELSE failing_since END,
                updated_at = now()
          WHERE id = $1 AND organization_id = $2 AND deleted_at IS NULL
      RETURNING ",
        endpoint_cols!()
    ))
    .bind(id)
    .bind(organization_id)
    .bind(c.url)
    .bind(c.description)
    .bind(c.event_types)
    .bind(c.enabled)
    .fetch_optional(db)
    .await?)
}

/// Rotates the secret: the current one becomes the previous one for `overlap_secs`.
pub(crate) async fn endpoint_rotate(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
    secret: &str,
    overlap_secs: f64,
) -> Result<Option<EndpointRow>> {
    Ok(sqlx::query_as(concat!(
        "UPDATE webhook_endpoint
            SET previous_secret = secret, secret = $3,
                previous_secret_expires_at = now() + make_interval(secs => $4),
                updated_at = now()
          WHERE id = $1 AND organization_id = $2 AND deleted_at IS NULL
      RETURNING ",
        endpoint_cols!()
    ))
    .bind(id)
    .bind(organization_id)
    .bind(secret)
    .bind(overlap_secs)
    .fetch_optional(db)
    .await?)
}

/// Cancels the pending deliveries of an endpoint and settles the events that have no
/// pending delivery left; returns the number cancelled.
pub(crate) async fn endpoint_cancel_pending(
    conn: &mut PgConnection,
    endpoint_id: Uuid,
) -> Result<u64> {
    let events: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE webhook_delivery SET state = 'cancelled', settled_at = now(), lease_until = NULL
          WHERE endpoint_id = $1 AND state = 'pending'
      RETURNING event_id",
    )
    .bind(endpoint_id)
    .fetch_all(&mut *conn)
    .await?;
    let ids: Vec<Uuid> = events.iter().map(|(id,)| *id).collect();
    events_settle(conn, &ids).await?;
    Ok(events.len() as u64)
}

/// Deletes (soft) an endpoint and cancels its pending deliveries; false when absent.
pub(crate) async fn endpoint_delete(
    conn: &mut PgConnection,
    organization_id: Uuid,
    id: Uuid,
) -> Result<bool> {
    let deleted = sqlx::query(
        "UPDATE webhook_endpoint SET deleted_at = now(), enabled = false, updated_at = now()
          WHERE id = $1 AND organization_id = $2 AND deleted_at IS NULL",
    )
    .bind(id)
    .bind(organization_id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if deleted {
        endpoint_cancel_pending(conn, id).await?;
    }
    Ok(deleted)
}

/// A claimed delivery: what the dispatcher needs to send it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ClaimedDelivery {
    pub(crate) id: Uuid,
    pub(crate) event_id: Uuid,
    pub(crate) endpoint_id: Uuid,
    pub(crate) event_type: String,
    /// The fence: attempts counted by this claim.
    pub(crate) attempts: i32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) body: String,
    pub(crate) event_created_at: DateTime<Utc>,
    pub(crate) url: String,
    pub(crate) secret: String,
    pub(crate) previous_secret: Option<String>,
    pub(crate) previous_secret_expires_at: Option<DateTime<Utc>>,
    pub(crate) db_now: DateTime<Utc>,
}

/// Claims (leases for `lease_secs`) up to `limit` due deliveries: of enabled endpoints
/// whose breaker is closed, each the earliest pending delivery of its (endpoint,
/// operation), at most `per_endpoint` leased per endpoint (1 while the endpoint has
/// `breaker_threshold` or more failures in a row: the probe). The claim counts an
/// attempt (the fence of [`attempt_record`]).
pub(crate) async fn deliveries_claim(
    db: impl PgExecutor<'_>,
    limit: i64,
    lease_secs: f64,
    per_endpoint: i64,
    breaker_threshold: i32,
) -> Result<Vec<ClaimedDelivery>> {
    Ok(sqlx::query_as(
        "WITH busy AS (
    SELECT endpoint_id, count(*) AS n FROM webhook_delivery
     WHERE state = 'pending' AND lease_until > now() GROUP BY endpoint_id
), cand AS (
    SELECT d.id, d.seq, d.next_attempt_at,
           row_number() OVER (PARTITION BY d.endpoint_id ORDER BY d.next_attempt_at, d.seq) AS rn,
           coalesce(b.n, 0) AS busy_n,
           CASE WHEN ep.consecutive_failures >= $4::int4 THEN 1::int8 ELSE $3::int8 END AS cap
      FROM webhook_delivery d
      JOIN webhook_endpoint ep ON ep.id = d.endpoint_id
      LEFT JOIN busy b ON b.endpoint_id = d.endpoint_id
     WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       AND (d.lease_until IS NULL OR d.lease_until <= now())
       AND ep.enabled AND ep.deleted_at IS NULL
       AND (ep.breaker_open_until IS NULL OR ep.breaker_open_until <= now())
       AND (d.operation_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM webhook_delivery p
             WHERE p.endpoint_id = d.endpoint_id AND p.operation_id = d.operation_id
               AND p.state = 'pending' AND p.seq < d.seq))
), picked AS (
    SELECT id FROM cand WHERE rn + busy_n <= cap ORDER BY next_attempt_at, seq LIMIT $1::int8
)
UPDATE webhook_delivery d
   SET lease_until = now() + make_interval(secs => $2), attempts = d.attempts + 1
  FROM picked, webhook_event ev, webhook_endpoint ep
 WHERE d.id = picked.id AND ev.id = d.event_id AND ep.id = d.endpoint_id
   AND d.state = 'pending' AND (d.lease_until IS NULL OR d.lease_until <= now())
RETURNING d.id, d.event_id, d.endpoint_id, d.event_type, d.attempts, d.created_at,
          ev.payload::text AS body, ev.created_at AS event_created_at, ep.url, ep.secret,
          ep.previous_secret, ep.previous_secret_expires_at, now() AS db_now",
    )
    .bind(limit)
    .bind(lease_secs)
    .bind(per_endpoint)
    .bind(breaker_threshold)
    .fetch_all(db)
    .await?)
}

/// What an attempt decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// 2xx: the delivery succeeded.
    Succeeded,
    /// Try again at this time.
    Retry(DateTime<Utc>),
    /// The retry window is over: the delivery failed for good.
    GiveUp,
    /// HTTP 410: the delivery failed and the endpoint is disabled.
    Gone,
}

/// One attempt's result.
#[derive(Debug, Clone)]
pub(crate) struct AttemptResult<'a> {
    pub(crate) delivery_id: Uuid,
    pub(crate) fence: i32,
    pub(crate) endpoint_id: Uuid,
    pub(crate) event_id: Uuid,
    pub(crate) http_status: Option<i32>,
    pub(crate) latency_ms: i32,
    pub(crate) error_class: Option<&'a str>,
    pub(crate) verdict: Verdict,
}

/// What [`attempt_record`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Recorded {
    /// False: the lease was lost (another claim counted a later attempt); nothing written.
    pub(crate) applied: bool,
    /// The endpoint was disabled by this attempt, with this reason.
    pub(crate) disabled: Option<&'static str>,
}

/// Records an attempt, fenced by the claim's attempt count: the attempt row, the
/// delivery's new state, the endpoint's breaker, the event's `dispatch_settled_at` when
/// nothing of it is pending any more; an endpoint answering 410, or without a success
/// since the first attempt of a delivery that gives up (it failed for that delivery's
/// whole retry window), is disabled (its pending deliveries
/// cancelled, a `webhook_endpoint.disabled` notice emitted to the organization's other
/// endpoints).
pub(crate) async fn attempt_record(
    conn: &mut PgConnection,
    a: &AttemptResult<'_>,
    breaker_threshold: i32,
    breaker_cooldown_secs: f64,
) -> Result<Recorded> {
    use sqlx::Connection;
    let mut tx = conn.begin().await?;
    let (state, next_at): (&str, Option<DateTime<Utc>>) = match a.verdict {
        Verdict::Succeeded => ("succeeded", None),
        Verdict::Retry(at) => ("pending", Some(at)),
        Verdict::GiveUp | Verdict::Gone => ("failed", None),
    };
    let moved = sqlx::query(
        "UPDATE webhook_delivery
            SET state = $3, next_attempt_at = coalesce($4, next_attempt_at), lease_until = NULL,
                settled_at = CASE WHEN $3 <> 'pending' THEN now() END
          WHERE id = $1 AND state = 'pending' AND attempts = $2",
    )
    .bind(a.delivery_id)
    .bind(a.fence)
    .bind(state)
    .bind(next_at)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if moved == 0 {
        tx.rollback().await?;
        return Ok(Recorded::default());
    }
    sqlx::query(
        "INSERT INTO webhook_attempt (delivery_id, http_status, latency_ms, error_class, next_retry_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(a.delivery_id)
    .bind(a.http_status)
    .bind(a.latency_ms)
    .bind(a.error_class)
    .bind(next_at)
    .execute(&mut *tx)
    .await?;
    if a.verdict == Verdict::Succeeded {
        sqlx::query(
            "UPDATE webhook_endpoint
                SET consecutive_failures = 0, breaker_open_until = NULL, failing_since = NULL
              WHERE id = $1 AND (consecutive_failures <> 0 OR failing_since IS NOT NULL)",
        )
        .bind(a.endpoint_id)
        .execute(&mut *tx)
        .await?;
    } else {
        sqlx::query(
            "UPDATE webhook_endpoint
                SET consecutive_failures = consecutive_failures + 1,
                    failing_since = coalesce(failing_since, now()),
                    breaker_open_until = CASE WHEN consecutive_failures + 1 >= $2
                        THEN now() + make_interval(secs => least($3 * power(2, least(consecutive_failures + 1 - $2, 6)), 3600))
                        ELSE breaker_open_until END
              WHERE id = $1",
        )
        .bind(a.endpoint_id)
        .bind(breaker_threshold)
        .bind(breaker_cooldown_secs)
        .execute(&mut *tx)
        .await?;
    }
    let disable: Option<&'static str> = match a.verdict {
        Verdict::Gone => Some("gone"),
        Verdict::GiveUp => {
            // Failing for the whole window: no attempt of the endpoint succeeded since
            // this delivery's first attempt (the failure streak began no later).
            let (failing,): (bool,) = sqlx::query_as(
                "SELECT coalesce(failing_since <= (SELECT min(attempted_at) FROM webhook_attempt
                                                    WHERE delivery_id = $2), false)
                   FROM webhook_endpoint WHERE id = $1",
            )
            .bind(a.endpoint_id)
            .bind(a.delivery_id)
            .fetch_one(&mut *tx)
            .await?;
            failing.then_some("failing")
        }
        _ => None,
    };
    let mut disabled = None;
    if let Some(reason) = disable {
        let row: Option<(Uuid,)> = sqlx::query_as(
            "UPDATE webhook_endpoint SET enabled = false, disabled_reason = $2, updated_at = now()
              WHERE id = $1 AND enabled RETURNING organization_id",
        )
        .bind(a.endpoint_id)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some((organization_id,)) = row {
            endpoint_cancel_pending(&mut tx, a.endpoint_id).await?;
            let data = serde_json::json!({
                "endpointId": a.endpoint_id.to_string(),
                "reason": reason,
            });
            crate::emit_in(
                &mut tx,
                &crate::NewEvent {
                    organization_id,
                    event_type: crate::event::ENDPOINT_DISABLED,
                    operation_id: None,
                    data: &data,
                },
            )
            .await?;
            disabled = Some(reason);
        }
    }
    events_settle(&mut tx, &[a.event_id]).await?;
    tx.commit().await?;
    Ok(Recorded {
        applied: true,
        disabled,
    })
}

/// Sets `dispatch_settled_at` on the events among `ids` none of whose deliveries is
/// pending. The event rows are locked first (in id order) and checked in a later
/// statement: two transactions settling the last two deliveries of one event
/// concurrently are serialized, so the second sees the first's change (no event is
/// left unsettled by both).
async fn events_settle(conn: &mut PgConnection, ids: &[Uuid]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT id FROM webhook_event WHERE id = ANY ($1) ORDER BY id FOR UPDATE")
        .bind(ids)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE webhook_event e SET dispatch_settled_at = now()
          WHERE e.id = ANY ($1) AND e.dispatch_settled_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM webhook_delivery d
                             WHERE d.event_id = e.id AND d.state = 'pending')",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// A delivery as `GET /v1/webhook-endpoints/{id}/deliveries` lists it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeliveryRow {
    /// Delivery id.
    pub id: Uuid,
    /// The event (also the `webhook-id`).
    pub event_id: Uuid,
    /// Its type.
    pub event_type: String,
    /// `pending`, `succeeded`, `failed`, `cancelled`.
    pub state: String,
    /// Whether it is a test delivery.
    pub is_test: bool,
    /// Attempts made (or under way).
    pub attempts: i32,
    /// The next attempt, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// When it settled.
    pub settled_at: Option<DateTime<Utc>>,
}

/// An attempt row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AttemptRow {
    /// Its delivery.
    pub delivery_id: Uuid,
    /// When it was made.
    pub attempted_at: DateTime<Utc>,
    /// The HTTP status, when there was a response.
    pub http_status: Option<i32>,
    /// Milliseconds from sending to the response (or the error).
    pub latency_ms: i32,
    /// The error class (`timeout`, `connect`, `http_5xx`, ...), `None` on success.
    pub error_class: Option<String>,
    /// The retry it scheduled.
    pub next_retry_at: Option<DateTime<Utc>>,
}

/// Deliveries of an endpoint, newest first, before the keyset `(created_at, id)`.
pub(crate) async fn deliveries_list(
    db: impl PgExecutor<'_>,
    endpoint_id: Uuid,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<DeliveryRow>> {
    let (at, id) = before.unzip();
    Ok(sqlx::query_as(
        "SELECT id, event_id, event_type, state, is_test, attempts,
                CASE WHEN state = 'pending' THEN next_attempt_at END AS next_attempt_at,
                created_at, settled_at
           FROM webhook_delivery
          WHERE endpoint_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
          ORDER BY created_at DESC, id DESC LIMIT $4",
    )
    .bind(endpoint_id)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// The attempts of these deliveries, in attempt order.
pub(crate) async fn attempts_of(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<Vec<AttemptRow>> {
    Ok(sqlx::query_as(
        "SELECT delivery_id, attempted_at, http_status, latency_ms, error_class, next_retry_at
           FROM webhook_attempt WHERE delivery_id = ANY ($1) ORDER BY id",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// Age, seconds, of the oldest event with a pending delivery (0 when none).
pub(crate) async fn oldest_pending_age(db: impl PgExecutor<'_>) -> Result<f64> {
    let (age,): (Option<f64>,) = sqlx::query_as(
        "SELECT extract(epoch FROM now() - min(created_at))::float8
           FROM webhook_event WHERE dispatch_settled_at IS NULL",
    )
    .fetch_one(db)
    .await?;
    Ok(age.unwrap_or(0.0).max(0.0))
}

/// Whether the organization has an enabled endpoint (a cheap check before building an
/// event that nobody would receive).
pub async fn organization_has_endpoints(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
) -> Result<bool> {
    let (yes,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM webhook_endpoint
                         WHERE organization_id = $1 AND enabled AND deleted_at IS NULL)",
    )
    .bind(organization_id)
    .fetch_one(db)
    .await?;
    Ok(yes)
}

/// Endpoint health counts and the oldest undelivered delivery, for Platform Status
/// ([`crate::health`]): `(healthy, failing, breaker_open, disabled, pending deliveries,
/// oldest pending delivery's creation)`. Deleted endpoints are not counted.
pub(crate) async fn endpoints_health(
    db: impl PgExecutor<'_>,
) -> Result<(i64, i64, i64, i64, i64, Option<DateTime<Utc>>)> {
    Ok(sqlx::query_as(
        "SELECT
           count(*) FILTER (WHERE enabled AND failing_since IS NULL
                             AND (breaker_open_until IS NULL OR breaker_open_until <= now())),
           count(*) FILTER (WHERE enabled AND failing_since IS NOT NULL
                             AND (breaker_open_until IS NULL OR breaker_open_until <= now())),
           count(*) FILTER (WHERE enabled AND breaker_open_until > now()),
           count(*) FILTER (WHERE NOT enabled),
           (SELECT count(*) FROM webhook_delivery WHERE state = 'pending'),
           (SELECT min(created_at) FROM webhook_delivery WHERE state = 'pending')
         FROM webhook_endpoint WHERE deleted_at IS NULL",
    )
    .fetch_one(db)
    .await?)
}

/// The disabled endpoints (id, organization, reason code, since), at most `limit`,
/// most recently changed first. The URL is not read.
pub(crate) async fn endpoints_disabled(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<(Uuid, Uuid, Option<String>, DateTime<Utc>)>> {
    Ok(sqlx::query_as(
        "SELECT id, organization_id, disabled_reason, updated_at FROM webhook_endpoint
          WHERE deleted_at IS NULL AND NOT enabled ORDER BY updated_at DESC, id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// An enabled endpoint that fails or whose breaker is open.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct UnhealthyRow {
    pub id: Uuid,
    pub organization_id: Uuid,
    pub breaker_open: bool,
    pub failing_since: Option<DateTime<Utc>>,
    pub consecutive_failures: i32,
    pub breaker_open_until: Option<DateTime<Utc>>,
}

/// The enabled endpoints that fail or whose breaker is open, at most `limit`: breaker
/// open first, then by how long they fail. The URL is not read.
pub(crate) async fn endpoints_unhealthy(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<UnhealthyRow>> {
    Ok(sqlx::query_as(
        "SELECT id, organization_id,
                coalesce(breaker_open_until > now(), false) AS breaker_open,
                failing_since, consecutive_failures,
                CASE WHEN breaker_open_until > now() THEN breaker_open_until END
                  AS breaker_open_until
           FROM webhook_endpoint
          WHERE deleted_at IS NULL AND enabled
            AND (failing_since IS NOT NULL OR breaker_open_until > now())
          ORDER BY coalesce(breaker_open_until > now(), false) DESC,
                   failing_since NULLS LAST, id
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?)
}
