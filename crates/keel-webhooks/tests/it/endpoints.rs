//! The endpoint service behind `/v1/webhook-endpoints`: create (secret shown once),
//! list (keyset pages), change, delete (pending deliveries cancelled), test deliveries
//! (marked as tests, to that endpoint only) and the delivery list with its attempts.

use crate::receiver::Receiver;
use crate::*;
use keel_webhooks::event::{OPERATION_ACCEPTED, OPERATION_STATE_CHANGED};
use keel_webhooks::{EndpointInput, WebhookError, Webhooks};

fn input(url: &str, types: &[&str]) -> EndpointInput {
    EndpointInput {
        url: Some(url.to_owned()),
        event_types: Some(types.iter().map(|t| (*t).to_owned()).collect()),
        ..EndpointInput::default()
    }
}

#[tokio::test]
async fn endpoints_are_managed_per_organization_and_test_deliveries_are_marked() {
    let db = database().await;
    let pool = db.pool();
    let r = Receiver::start().await;
    let hooks = Webhooks::new(pool.clone(), test_config());
    let (org, stranger) = (Uuid::new_v4(), Uuid::new_v4());
    let (a, secret) = hooks
        .create(org, &input(&r.url("ok", "a"), &[OPERATION_ACCEPTED]))
        .await
        .unwrap();
    assert!(secret.starts_with("whsec_"));
    assert!(a.enabled);
    let (b, _) = hooks
        .create(org, &input(&r.url("ok", "b"), &["*"]))
        .await
        .unwrap();
    let (c, _) = hooks
        .create(org, &input(&r.url("ok", "c"), &["*"]))
        .await
        .unwrap();
    // Bad input names its rule; nothing is written.
    for (i, want) in [
        (input(&r.url("ok", "x"), &["operation.nope"]), "type"),
        (input(&r.url("ok", "x"), &[]), "field"),
        (input("ftp://example.com/x", &["*"]), "url"),
        (
            EndpointInput {
                description: Some("d".repeat(300)),
                ..input(&r.url("ok", "x"), &["*"])
            },
            "field",
        ),
    ] {
        let e = hooks.create(org, &i).await.unwrap_err();
        let ok = match want {
            "type" => matches!(e, WebhookError::UnknownEventType),
            "url" => matches!(e, WebhookError::InvalidUrl { .. }),
            _ => matches!(e, WebhookError::InvalidField { .. }),
        };
        assert!(ok, "{e}");
    }
    // Keyset pages, oldest first; another organization sees none of them.
    let first = hooks.list(org, None, 2).await.unwrap();
    assert_eq!(first.iter().map(|e| e.id).collect::<Vec<_>>(), [a.id, b.id]);
    let last = &first[1];
    let rest = hooks
        .list(org, Some((last.created_at, last.id)), 2)
        .await
        .unwrap();
    assert_eq!(rest.iter().map(|e| e.id).collect::<Vec<_>>(), [c.id]);
    assert!(hooks.list(stranger, None, 10).await.unwrap().is_empty());
    assert!(matches!(
        hooks.get(stranger, a.id).await,
        Err(WebhookError::NotFound)
    ));
    // Changes.
    let changed = hooks
        .update(
            org,
            c.id,
            &EndpointInput {
                enabled: Some(false),
                description: Some("paused".into()),
                ..EndpointInput::default()
            },
        )
        .await
        .unwrap();
    assert!(!changed.enabled);
    assert_eq!(changed.description, "paused");
    assert_eq!(changed.url, c.url);

    // A test delivery goes to `a` only (which does not subscribe to its type), marked.
    let test_id = hooks.send_test(org, a.id).await.unwrap();
    // Operation events reach `a` (accepted only) and `b`; `c` is disabled.
    emit(pool, org, OPERATION_ACCEPTED, Some(Uuid::new_v4()), 1).await;
    emit(pool, org, OPERATION_STATE_CHANGED, Some(Uuid::new_v4()), 2).await;
    let running = Running::start(pool, test_config());
    until_settled(pool).await;
    running.stop().await;
    let got: Vec<serde_json::Value> = r
        .requests("ok")
        .iter()
        .map(|q| serde_json::from_str(&q.body).unwrap())
        .collect();
    assert_eq!(got.len(), 1 + 1 + 2);
    let test: Vec<&serde_json::Value> =
        got.iter().filter(|v| v["type"] == "webhook.test").collect();
    assert_eq!(test.len(), 1);
    assert_eq!(test[0]["id"], test_id.to_string());
    assert_eq!(test[0]["data"]["test"], true);
    let deliveries = hooks.deliveries(org, a.id, None, 10).await.unwrap();
    assert_eq!(deliveries.len(), 2);
    for d in &deliveries {
        assert_eq!(d.delivery.state, "succeeded");
        assert_eq!(d.attempts.len(), 1);
        assert_eq!(d.attempts[0].http_status, Some(200));
        assert_eq!(d.attempts[0].error_class, None);
    }
    assert!(
        deliveries
            .iter()
            .any(|d| d.delivery.is_test && d.delivery.event_id == test_id)
    );
    assert!(matches!(
        hooks.deliveries(stranger, a.id, None, 10).await,
        Err(WebhookError::NotFound)
    ));

    // Delete: gone for reads; its pending deliveries are cancelled.
    let fail = Webhooks::new(pool.clone(), test_config());
    let (d, _) = fail
        .create(org, &input(&r.url("fail", "d"), &["*"]))
        .await
        .unwrap();
    emit(pool, org, OPERATION_ACCEPTED, Some(Uuid::new_v4()), 3).await;
    hooks.delete(org, d.id).await.unwrap();
    assert!(matches!(
        hooks.get(org, d.id).await,
        Err(WebhookError::NotFound)
    ));
    assert!(matches!(
        hooks.delete(org, d.id).await,
        Err(WebhookError::NotFound)
    ));
    let (state,): (String,) =
        sqlx::query_as("SELECT state FROM webhook_delivery WHERE endpoint_id = $1")
            .bind(d.id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(state, "cancelled");
}

#[tokio::test]
async fn disabling_an_endpoint_cancels_its_pending_deliveries_and_settles_their_events() {
    let db = database().await;
    let pool = db.pool();
    let org = Uuid::new_v4();
    let hooks = Webhooks::new(pool.clone(), test_config());
    let (id, _) = endpoint(pool, org, "http://127.0.0.1:9/never").await;
    emit(pool, org, OPERATION_ACCEPTED, Some(Uuid::new_v4()), 1).await;
    let pending = |pool: &PgPool| {
        let pool = pool.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM webhook_event WHERE dispatch_settled_at IS NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            n
        }
    };
    assert_eq!(pending(pool).await, 1);
    let off = hooks
        .update(
            org,
            id,
            &EndpointInput {
                enabled: Some(false),
                ..EndpointInput::default()
            },
        )
        .await
        .unwrap();
    assert!(!off.enabled);
    let (state,): (String,) =
        sqlx::query_as("SELECT state FROM webhook_delivery WHERE endpoint_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(state, "cancelled");
    assert_eq!(pending(pool).await, 0, "the event is dispatch-settled");
}
