//! Operations' webhook events are written in the transaction of the change they report:
//! the acceptance, a verdict in the queue's settling transaction, a cancel through the
//! engine's transition hook; each only for organizations with a subscribed endpoint.

use crate::common::{Env, new_asset, op_request, queue};
use alloy::primitives::Address;
use keel_txq::EnqueueOptions;
use keel_webhooks::{EndpointInput, UrlPolicy, WebhookConfig, Webhooks};
use keel_workflows::store::{self, NewOperationTxRow};
use keel_workflows::{OperationEvents, OperationView, Ops, Renderer};
use serde_json::{Value, json};
use std::sync::Arc;
use uuid::Uuid;

/// (type, payload) of the events of operation `op`, in write order.
async fn events_of(pool: &sqlx::PgPool, op: Uuid) -> Vec<(String, Value)> {
    sqlx::query_as(
        "SELECT event_type, payload FROM webhook_event WHERE operation_id = $1 ORDER BY seq",
    )
    .bind(op)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn acceptance_verdict_and_cancel_write_their_events_with_the_change() {
    let env = Env::new().await;
    let render: Renderer =
        Arc::new(|v: &OperationView| json!({"id": v.id.to_string(), "state": v.state.as_str()}));
    let events = OperationEvents::new(env.engine.clone(), render);
    assert!(env.engine.set_transition_hook(Arc::new(events.clone())));
    let ops = Ops::new(env.pool().clone(), env.engine.clone()).with_events(events);
    let hooks = Webhooks::new(
        env.pool().clone(),
        WebhookConfig {
            policy: UrlPolicy {
                allow_http: true,
                allow_private: true,
            },
            ..WebhookConfig::default()
        },
    );
    let (endpoint, _secret) = hooks
        .create(
            env.caller.organization_id,
            &EndpointInput {
                url: Some("http://127.0.0.1:9/hook".into()),
                event_types: Some(vec!["*".into()]),
                ..EndpointInput::default()
            },
        )
        .await
        .unwrap();

    let accepted = ops
        .create_asset(env.caller, "k1", &new_asset("Alpha"))
        .await
        .unwrap();
    let op = accepted.operation.id;
    let got = events_of(env.pool(), op).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "operation.accepted");
    let p = &got[0].1;
    assert_eq!(p["type"], "operation.accepted");
    assert_eq!(p["organizationId"], env.caller.organization_id.to_string());
    assert_eq!(p["data"], json!({"id": op.to_string(), "state": "running"}));
    assert!(p["id"].as_str().is_some() && p["createdAt"].as_str().is_some());

    // Organization B has no endpoint: nothing is written for its operations.
    let other = ops
        .create_asset(env.stranger, "k1", &new_asset("Beta"))
        .await
        .unwrap();
    assert!(events_of(env.pool(), other.operation.id).await.is_empty());

    // A queued write withdrawn by the cancel: its verdict (in the settling transaction),
    // then the cancelled state (through the transition hook of the engine's cancel).
    let row = store::operation_get(env.pool(), env.caller.organization_id, op)
        .await
        .unwrap()
        .unwrap();
    let instance = row.instance_id.unwrap();
    let q = queue(&env, 31337, "http://127.0.0.1:1");
    let mut tx = env.pool().begin().await.unwrap();
    let request = q
        .enqueue_in(
            &mut tx,
            &op_request(Address::repeat_byte(7), op, "create-feed"),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    store::operation_tx_insert(
        &mut *tx,
        &NewOperationTxRow {
            operation_id: op,
            link: "create-feed",
            txq_request_id: request,
            instance_id: instance,
            signal_name: "tx.create-feed",
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    ops.cancel(env.caller, op).await.unwrap();
    let got = events_of(env.pool(), op).await;
    let types: Vec<&str> = got.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "operation.accepted",
            "operation.transaction_settled",
            "operation.state_changed"
        ]
    );
    assert_eq!(got[2].1["data"]["state"], "cancelled");

    // One pending delivery per event to the subscribed endpoint.
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM webhook_delivery WHERE endpoint_id = $1 AND state = 'pending' AND operation_id = $2",
    )
    .bind(endpoint.id)
    .bind(op)
    .fetch_one(env.pool())
    .await
    .unwrap();
    assert_eq!(n, 3);
}
