//! Audit retention deletes only eligible rows (settled longer ago than the window, not
//! a test, nothing pending), attempts then deliveries then events, leaves an event
//! whose delivery dispatch holds locked for a later pass, and runs while deliveries run
//! on the same tables.

use crate::receiver::Receiver;
use crate::*;
use keel_webhooks::event::{OPERATION_ACCEPTED, OPERATION_STATE_CHANGED};
use keel_webhooks::{Webhooks, retention_pass};

const WINDOW: Duration = Duration::from_secs(30 * 86_400);

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(pool).await.unwrap();
    n
}

#[tokio::test]
async fn retention_deletes_only_eligible_rows_while_deliveries_run() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    let (ok, _) = endpoint(pool, org, &r.url("ok", "a")).await;
    // Four old events (one will be held by dispatch) and a test event, delivered.
    for n in 0..4 {
        emit(pool, org, OPERATION_ACCEPTED, Some(Uuid::new_v4()), n).await;
    }
    Webhooks::new(pool.clone(), test_config())
        .send_test(org, ok)
        .await
        .unwrap();
    let running = Running::start(pool, test_config());
    until_settled(pool).await;
    running.stop().await;
    sqlx::query("UPDATE webhook_event SET dispatch_settled_at = now() - interval '40 days'")
        .execute(pool)
        .await
        .unwrap();
    // A recent settled event, and an unsettled one (its second endpoint keeps failing).
    emit(pool, org, OPERATION_ACCEPTED, Some(Uuid::new_v4()), 10).await;
    let running = Running::start(pool, test_config());
    until_settled(pool).await;
    endpoint(pool, org, &r.url("fail", "a")).await;
    emit(pool, org, OPERATION_STATE_CHANGED, Some(Uuid::new_v4()), 11).await;

    // Dispatch holds the delivery of one old event (its row lock) during the pass.
    let held: Uuid = sqlx::query_scalar(
        "SELECT d.id FROM webhook_delivery d JOIN webhook_event e ON e.id = d.event_id
          WHERE NOT e.is_test AND e.dispatch_settled_at < now() - interval '39 days'
          ORDER BY e.seq LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM webhook_delivery WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *holder)
        .await
        .unwrap();
    // New events are written and delivered while the pass runs.
    let writer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            for n in 0..20 {
                emit(
                    &pool,
                    org,
                    OPERATION_ACCEPTED,
                    Some(Uuid::new_v4()),
                    100 + n,
                )
                .await;
            }
        })
    };
    let first = retention_pass(pool, WINDOW, 2, 100).await.unwrap();
    writer.await.unwrap();
    assert_eq!(first.deleted_events, 3);
    assert_eq!(first.deleted_deliveries, 3);
    assert_eq!(first.deleted_attempts, 3);
    assert_eq!(first.deleted_children(), 6);
    assert_eq!(
        first.remaining_eligible, 1,
        "the held event waits for a later pass"
    );
    assert_eq!(first.failures, 0);
    holder.rollback().await.unwrap();
    let (held_there,): (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM webhook_delivery WHERE id = $1)")
            .bind(held)
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(held_there);

    let second = retention_pass(pool, WINDOW, 2, 100).await.unwrap();
    assert_eq!(second.deleted_events, 1);
    assert_eq!(second.remaining_eligible, 0);
    // Kept: the test event, the recent one, the unsettled one, the 20 new ones.
    assert_eq!(
        count(pool, "SELECT count(*) FROM webhook_event WHERE is_test").await,
        1
    );
    assert!(
        count(
            pool,
            "SELECT count(*) FROM webhook_event WHERE dispatch_settled_at IS NULL"
        )
        .await
            >= 1,
        "the unsettled event is kept"
    );
    // Every new event is still delivered to the working endpoint.
    until(
        pool,
        "the new events delivered to the working endpoint",
        "SELECT count(*) = 0 FROM webhook_delivery d JOIN webhook_endpoint e ON e.id = d.endpoint_id
          WHERE e.url LIKE '%/ok/%' AND d.state <> 'succeeded'",
    )
    .await;
    running.stop().await;
    assert_eq!(
        count(pool, "SELECT count(*) FROM webhook_event WHERE NOT is_test").await,
        1 + 1 + 20
    );
    let acked: std::collections::HashSet<String> = r.acks("ok").into_iter().collect();
    let (new_ids,): (Vec<Uuid>,) = sqlx::query_as(
        "SELECT array_agg(id) FROM webhook_event WHERE (payload->'data'->>'n')::int >= 100",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(new_ids.len(), 20);
    assert!(new_ids.iter().all(|id| acked.contains(&id.to_string())));
}
