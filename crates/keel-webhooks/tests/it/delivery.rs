//! Delivery to a real receiver: failures, timeouts, 500-then-200 and closed
//! connections are retried until every event arrives, in order per operation, signed
//! (verified independently), duplicated only as retries of the same `webhook-id`; an
//! aborted dispatcher loses nothing; 410 and a failing window disable the endpoint with
//! a notice; rotation overlaps sign with both secrets; refused addresses are refused at
//! registration and again at delivery; a failing endpoint's circuit breaker stops the
//! attempts, probes after its cooldown and closes on recovery.

use crate::receiver::{Entry, Receiver, Request, verify_independently};
use crate::*;
use keel_webhooks::event::{
    ENDPOINT_DISABLED, OPERATION_ACCEPTED, OPERATION_CONFIRMED, OPERATION_STATE_CHANGED,
};
use keel_webhooks::{EndpointInput, UrlPolicy, WebhookError, Webhooks};
use std::collections::{HashMap, HashSet};

/// Checks the receiver's log for `behaviour`: every id of `expected` (per operation,
/// in write order) acknowledged exactly once; no request of an event before the
/// previous event of its operation was acknowledged; every repeat identical.
fn check_order_and_duplicates(
    r: &Receiver,
    behaviour: &str,
    expected: &[(String, Option<Uuid>, String)],
) {
    let log = r.log();
    let mut acked: HashSet<String> = HashSet::new();
    let prev: HashMap<&str, Option<&str>> = {
        let mut last: HashMap<Option<Uuid>, &str> = HashMap::new();
        expected
            .iter()
            .map(|(id, op, _)| {
                let p = op.and_then(|o| last.insert(Some(o), id.as_str()));
                (id.as_str(), p)
            })
            .collect()
    };
    let mut bodies: HashMap<String, String> = HashMap::new();
    for e in &log {
        match e {
            Entry::Request(q) if q.behaviour == behaviour => {
                let p = prev
                    .get(q.id.as_str())
                    .unwrap_or_else(|| panic!("unexpected event at {behaviour}"));
                if let Some(p) = p {
                    assert!(
                        acked.contains(*p),
                        "{behaviour}: an event was sent before the previous event of its operation was acknowledged"
                    );
                }
                let first = bodies.entry(q.id.clone()).or_insert_with(|| q.body.clone());
                assert_eq!(first, &q.body, "a repeat carries the same body");
            }
            Entry::Ack { behaviour: b, id } if b == behaviour => {
                assert!(acked.insert(id.clone()), "{behaviour}: acknowledged twice");
            }
            _ => {}
        }
    }
    let want: HashSet<String> = expected.iter().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(acked, want, "{behaviour}: every event arrived");
}

#[tokio::test]
async fn every_event_arrives_in_order_signed_despite_failures_timeouts_and_closed_connections() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    let mut secrets = HashMap::new();
    for (b, url) in [
        ("ok", r.url("ok", "a")),
        ("flaky", r.url("flaky", "a")),
        ("slow", r.url("slow", "a")),
        ("close", r.raw_url()),
    ] {
        let (_, secret) = endpoint(pool, org, &url).await;
        secrets.insert(b, secret);
    }
    // Another organization's event and a rolled-back one reach none of them.
    endpoint(pool, Uuid::new_v4(), &r.url("ok", "other")).await;
    let ops: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    for round in 0..4u32 {
        for op in &ops {
            let ty = [
                OPERATION_ACCEPTED,
                OPERATION_STATE_CHANGED,
                OPERATION_CONFIRMED,
                OPERATION_STATE_CHANGED,
            ][round as usize];
            emit(pool, org, ty, Some(*op), round).await;
        }
    }
    emit(pool, org, OPERATION_ACCEPTED, None, 99).await;
    let mut tx = pool.begin().await.unwrap();
    let data = serde_json::json!({"rolled": "back"});
    let n = keel_webhooks::emit_in(
        &mut tx,
        &keel_webhooks::NewEvent {
            organization_id: org,
            event_type: OPERATION_ACCEPTED,
            operation_id: Some(Uuid::new_v4()),
            data: &data,
        },
    )
    .await
    .unwrap();
    assert_eq!(n, 4, "one delivery per subscribed endpoint");
    tx.rollback().await.unwrap();

    let running = Running::start(pool, test_config());
    until_settled(pool).await;
    running.stop().await;

    let all = events(pool).await;
    assert_eq!(
        all.len(),
        6 * 4 + 1,
        "the rolled-back event was never written"
    );
    let (other,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM webhook_delivery d JOIN webhook_endpoint e ON e.id = d.endpoint_id WHERE e.organization_id <> $1",
    )
    .bind(org)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(other, 0);
    for b in ["ok", "flaky", "slow", "close"] {
        check_order_and_duplicates(&r, b, &all);
    }
    // Retries were what made them arrive.
    assert_eq!(r.requests("flaky").len(), 3 * all.len());
    assert!(r.requests("slow").len() >= 2 * all.len());
    assert!(r.requests("close").len() >= 2 * all.len());
    let classes: Vec<(Option<i32>, Option<String>)> = sqlx::query_as(
        "SELECT a.http_status, a.error_class FROM webhook_attempt a
           JOIN webhook_delivery d ON d.id = a.delivery_id JOIN webhook_endpoint e ON e.id = d.endpoint_id
          WHERE e.url LIKE '%/slow/%' ORDER BY a.id LIMIT 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(classes, [(None, Some("timeout".to_owned()))]);
    let (failed_flaky,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM webhook_attempt a JOIN webhook_delivery d ON d.id = a.delivery_id
           JOIN webhook_endpoint e ON e.id = d.endpoint_id
          WHERE e.url LIKE '%/flaky/%' AND a.http_status = 500 AND a.error_class = 'http_5xx'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(failed_flaky as usize, 2 * all.len());

    // Every request verifies with its endpoint's secret, by an independent implementation.
    let pairs: Vec<(String, Request)> = ["ok", "flaky", "slow", "close"]
        .iter()
        .flat_map(|b| r.requests(b).into_iter().map(|q| (secrets[b].clone(), q)))
        .collect();
    let (implementation, ok) = verify_independently(&pairs);
    assert!(
        ok.iter().all(|v| *v),
        "{implementation}: every signature verifies"
    );
    // And none verifies with another endpoint's secret.
    let wrong: Vec<(String, Request)> = r
        .requests("ok")
        .into_iter()
        .map(|q| (secrets["flaky"].clone(), q))
        .collect();
    let (_, ok) = verify_independently(&wrong);
    assert!(ok.iter().all(|v| !*v));
    let (settled_states,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_delivery WHERE state <> 'succeeded'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(settled_states, 0);
}

#[tokio::test]
async fn an_aborted_dispatcher_loses_nothing_the_next_one_resends_the_same_webhook_id() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    endpoint(pool, org, &r.url("hang", "a")).await;
    let op = Uuid::new_v4();
    emit(pool, org, OPERATION_ACCEPTED, Some(op), 0).await;
    emit(pool, org, OPERATION_STATE_CHANGED, Some(op), 1).await;
    let first = Running::start(pool, test_config());
    r.hung.notified().await;
    // Mid-delivery: the request is at the receiver, unanswered.
    first.abort().await;
    let second = Running::start(pool, test_config());
    until_settled(pool).await;
    second.stop().await;
    let all = events(pool).await;
    check_order_and_duplicates(&r, "hang", &all);
    let reqs = r.requests("hang");
    assert_eq!(reqs.len(), 3, "the interrupted event was sent again");
    assert_eq!(reqs[0].id, reqs[1].id, "with the same webhook-id");
    let attempts: Vec<(i32,)> =
        sqlx::query_as("SELECT attempts FROM webhook_delivery ORDER BY seq")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(attempts, [(2,), (1,)]);
}

#[tokio::test]
async fn gone_disables_the_endpoint_cancels_its_pending_deliveries_and_notifies() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    let (gone, _) = endpoint(pool, org, &r.url("gone", "a")).await;
    endpoint(pool, org, &r.url("ok", "a")).await;
    let op = Uuid::new_v4();
    emit(pool, org, OPERATION_ACCEPTED, Some(op), 0).await;
    emit(pool, org, OPERATION_STATE_CHANGED, Some(op), 1).await;
    let running = Running::start(pool, test_config());
    until_settled(pool).await;
    running.stop().await;
    let (enabled, reason): (bool, Option<String>) =
        sqlx::query_as("SELECT enabled, disabled_reason FROM webhook_endpoint WHERE id = $1")
            .bind(gone)
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(!enabled);
    assert_eq!(reason.as_deref(), Some("gone"));
    let states: Vec<(String,)> =
        sqlx::query_as("SELECT state FROM webhook_delivery WHERE endpoint_id = $1 ORDER BY seq")
            .bind(gone)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(states, [("failed".to_owned(),), ("cancelled".to_owned(),)]);
    assert_eq!(
        r.requests("gone").len(),
        1,
        "no second request to a gone endpoint"
    );
    // The other endpoint got both events and the notice.
    let ok: Vec<serde_json::Value> = r
        .requests("ok")
        .iter()
        .map(|q| serde_json::from_str(&q.body).unwrap())
        .collect();
    assert_eq!(ok.len(), 3);
    let notices: Vec<&serde_json::Value> = ok
        .iter()
        .filter(|v| v["type"] == ENDPOINT_DISABLED)
        .collect();
    assert_eq!(notices.len(), 1);
    let notice = notices[0];
    assert_eq!(notice["data"]["endpointId"], gone.to_string());
    assert_eq!(notice["data"]["reason"], "gone");
}

#[tokio::test]
async fn an_endpoint_failing_for_the_whole_window_is_disabled_with_a_notice() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    let (failing, _) = endpoint(pool, org, &r.url("fail", "a")).await;
    endpoint(pool, org, &r.url("ok", "a")).await;
    emit(pool, org, OPERATION_ACCEPTED, Some(Uuid::new_v4()), 0).await;
    let config = WebhookConfig {
        window: Duration::from_millis(600),
        ..test_config()
    };
    let running = Running::start(pool, config);
    until_settled(pool).await;
    running.stop().await;
    let (enabled, reason): (bool, Option<String>) =
        sqlx::query_as("SELECT enabled, disabled_reason FROM webhook_endpoint WHERE id = $1")
            .bind(failing)
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(!enabled);
    assert_eq!(reason.as_deref(), Some("failing"));
    assert!(
        r.requests("fail").len() >= 2,
        "it was retried within the window"
    );
    let (state,): (String,) =
        sqlx::query_as("SELECT state FROM webhook_delivery WHERE endpoint_id = $1")
            .bind(failing)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(state, "failed");
    let notices: Vec<serde_json::Value> = r
        .requests("ok")
        .iter()
        .map(|q| serde_json::from_str(&q.body).unwrap())
        .filter(|v: &serde_json::Value| v["type"] == ENDPOINT_DISABLED)
        .collect();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0]["data"]["reason"], "failing");
}

#[tokio::test]
async fn during_a_rotation_overlap_both_secrets_sign() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    let hooks = Webhooks::new(pool.clone(), test_config());
    let (id, s1) = endpoint(pool, org, &r.url("ok", "a")).await;
    let deliver = || async {
        let running = Running::start(pool, test_config());
        until_settled(pool).await;
        running.stop().await;
    };
    emit(pool, org, OPERATION_ACCEPTED, None, 1).await;
    deliver().await;
    let (view, s2) = hooks.rotate_secret(org, id, None).await.unwrap();
    assert_ne!(s1, s2);
    assert!(view.previous_secret_expires_at.is_some());
    emit(pool, org, OPERATION_ACCEPTED, None, 2).await;
    deliver().await;
    let (view, s3) = hooks
        .rotate_secret(org, id, Some(Duration::ZERO))
        .await
        .unwrap();
    assert!(view.previous_secret_expires_at.is_none(), "no overlap");
    emit(pool, org, OPERATION_ACCEPTED, None, 3).await;
    deliver().await;
    let reqs = r.requests("ok");
    assert_eq!(reqs.len(), 3);
    let cases = [
        (&s1, 0, true),
        (&s2, 0, false),
        (&s1, 1, true),
        (&s2, 1, true),
        (&s2, 2, false),
        (&s3, 2, true),
    ];
    let pairs: Vec<(String, Request)> = cases
        .iter()
        .map(|(s, i, _)| ((*s).clone(), reqs[*i].clone()))
        .collect();
    let (implementation, ok) = verify_independently(&pairs);
    let want: Vec<bool> = cases.iter().map(|c| c.2).collect();
    assert_eq!(ok, want, "{implementation}");
    assert_eq!(reqs[1].signature.split(' ').count(), 2);
}

#[tokio::test]
async fn refused_addresses_are_refused_at_registration_and_at_delivery() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let org = Uuid::new_v4();
    let strict = Webhooks::new(pool.clone(), keel_webhooks::WebhookConfig::default());
    for url in [
        r.url("ok", "a"),
        "https://127.0.0.1/hook".to_owned(),
        "https://localhost/hook".to_owned(),
        "https://169.254.169.254/latest/meta-data".to_owned(),
        "https://[::1]/hook".to_owned(),
        "https://10.0.0.1/hook".to_owned(),
    ] {
        let e = strict
            .create(
                org,
                &EndpointInput {
                    url: Some(url.clone()),
                    event_types: Some(vec!["*".into()]),
                    ..EndpointInput::default()
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(e, WebhookError::InvalidUrl { .. }), "{url}");
    }
    // Names resolve through the guard at delivery, so rebinding cannot reach loopback.
    use reqwest::dns::Resolve;
    let name: reqwest::dns::Name = "localhost".parse().unwrap();
    assert!(
        keel_webhooks::guard::GuardedResolver {
            allow_private: false
        }
        .resolve(name)
        .await
        .is_err()
    );
    // Registered while allowed, then delivered by a dispatcher that refuses loopback.
    endpoint(pool, org, &r.url("ok", "a")).await;
    emit(pool, org, OPERATION_ACCEPTED, None, 0).await;
    let config = WebhookConfig {
        policy: UrlPolicy {
            allow_http: true,
            allow_private: false,
        },
        ..test_config()
    };
    let running = Running::start(pool, config);
    until(
        pool,
        "a refused attempt",
        "SELECT EXISTS (SELECT 1 FROM webhook_attempt WHERE error_class = 'blocked_address')",
    )
    .await;
    running.stop().await;
    assert!(r.requests("ok").is_empty(), "nothing reached the receiver");
}

/// Waits (probing the receiver's log) until `behaviour` received `n` requests.
async fn until_requests(r: &Receiver, behaviour: &str, n: usize) {
    keel_store::testing::until(&format!("{n} requests at {behaviour}"), TIMEOUT, || async {
        r.requests(behaviour).len() >= n
    })
    .await;
}

#[tokio::test]
async fn a_failing_endpoint_opens_its_breaker_is_probed_after_the_cooldown_and_drains_on_recovery()
{
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    r.set_down(true);
    let org = Uuid::new_v4();
    let (id, _) = endpoint(pool, org, &r.url("switch", "a")).await;
    let ops: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    for round in 0..2u32 {
        for op in &ops {
            let ty = [OPERATION_ACCEPTED, OPERATION_STATE_CHANGED][round as usize];
            emit(pool, org, ty, Some(*op), round).await;
        }
    }
    // Retries every 40..240 ms would hammer the endpoint (8 deliveries); the breaker
    // opens after 3 failures in a row for 1 s, then 2 s after the failed probe.
    let config = WebhookConfig {
        breaker_threshold: 3,
        breaker_cooldown: Duration::from_secs(1),
        per_endpoint_in_flight: 1,
        ..test_config()
    };
    let running = Running::start(pool, config);
    // Three failures and the first probe; the second probe succeeds.
    until_requests(&r, "switch", 4).await;
    r.set_down(false);
    until_settled(pool).await;
    running.stop().await;

    let reqs = r.requests("switch");
    let gap = |i: usize| reqs[i].at.duration_since(reqs[i - 1].at);
    // Three failures in a row at the retry pace...
    assert!(gap(1) < Duration::from_millis(900), "{:?}", gap(1));
    assert!(gap(2) < Duration::from_millis(900), "{:?}", gap(2));
    // ... then nothing while the breaker is open: one probe after the cooldown, a
    // second one (it succeeds) after the doubled cooldown (the first probe failed).
    assert!(gap(3) >= Duration::from_millis(950), "{:?}", gap(3));
    assert!(gap(4) >= Duration::from_millis(1950), "{:?}", gap(4));
    // The probe that succeeded closed the breaker: the backlog drained, every event
    // once acknowledged, in order per operation.
    let all = events(pool).await;
    assert_eq!(all.len(), 8);
    check_order_and_duplicates(&r, "switch", &all);
    assert_eq!(
        reqs.len(),
        4 + all.len(),
        "four failed attempts (three, then the first probe), then each event once"
    );
    let (failures, open_until, enabled): (i32, Option<chrono::DateTime<chrono::Utc>>, bool) =
        sqlx::query_as(
            "SELECT consecutive_failures, breaker_open_until, enabled FROM webhook_endpoint WHERE id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!((failures, open_until, enabled), (0, None, true));
    let (succeeded,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_delivery WHERE state = 'succeeded'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(succeeded, 8);
}
