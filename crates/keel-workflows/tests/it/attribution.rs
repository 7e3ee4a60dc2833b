//! Actor attribution through the service (issue 23): the operation's view says which key
//! started it and which cancelled it, taken from the authenticated caller.

use crate::common::{Env, new_asset};
use keel_durable::{Actor, ActorKind, AttributionStatus};
use keel_workflows::OperationState;

#[tokio::test]
async fn the_view_names_the_key_that_started_and_the_key_that_cancelled() {
    let env = Env::new().await;
    let created = env
        .ops
        .create_asset(env.caller, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    let id = created.operation.id;
    let a = created.operation.attribution.expect("attribution");
    let started = a.started.expect("started");
    assert_eq!(
        started.actor,
        Actor::service(&env.caller.api_key_id.to_string())
    );
    assert_eq!(started.actor.status(), AttributionStatus::Verified);
    assert!(started.at <= created.operation.updated_at + chrono::Duration::seconds(1));
    assert!(a.approval.is_none() && a.cancelled.is_none() && a.retried.is_empty());

    // A colleague's key cancels (no executor runs: an immediate cancel).
    let view = env.ops.cancel(env.colleague, id).await.unwrap();
    assert_eq!(view.state, OperationState::Cancelled);
    let a = view.attribution.expect("attribution");
    let cancelled = a.cancelled.expect("cancelled");
    assert_eq!(cancelled.actor.kind(), ActorKind::Service);
    assert_eq!(
        cancelled.actor.id(),
        Some(env.colleague.api_key_id.to_string().as_str())
    );
    // Still the original starter.
    assert_eq!(
        a.started.unwrap().actor.id(),
        Some(env.caller.api_key_id.to_string().as_str())
    );
    // Lists carry no attribution.
    let list = env
        .ops
        .operations(env.caller, &Default::default(), None, 10)
        .await
        .unwrap();
    assert!(!list.operations.is_empty());
    assert!(list.operations.iter().all(|v| v.attribution.is_none()));
}

#[tokio::test]
async fn an_operator_cancel_is_recorded_as_the_operator_not_the_requesting_key() {
    let env = Env::new().await;
    let created = env
        .ops
        .create_asset(env.caller, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    let id = created.operation.id;
    let caller = env.ops.operator_caller(id).await.unwrap();
    let view = env
        .ops
        .cancel_by(caller, id, &Actor::system("operator-cli"))
        .await
        .unwrap();
    let cancelled = view.attribution.unwrap().cancelled.unwrap();
    assert_eq!(cancelled.actor, Actor::system("operator-cli"));
}
