//! The operation view projected from stored rows: the operation, its linked queue
//! requests (queued, withdrawn, and really settled on Anvil) and its instance.

use crate::common::{Env, new_asset, op_request, queue};
use anvil_tests::TestChain;
use keel_durable::{RunStatus, WaitDescription, WaitKind};
use keel_txq::{LocalSigner, SettlementVerdict};
use keel_workflows::ops::view::project;
use keel_workflows::store::{self, NewOperationTxRow};
use keel_workflows::{OperationState, WaitFor};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Links request `request` to operation `op` as `link`, as the enqueue step does.
async fn link(env: &Env, op: Uuid, link: &str, request: Uuid) {
    let row = store::operation_get(env.pool(), env.caller.organization_id, op)
        .await
        .unwrap()
        .unwrap();
    store::operation_tx_insert(
        env.pool(),
        &NewOperationTxRow {
            operation_id: op,
            link,
            txq_request_id: request,
            instance_id: row.instance_id.unwrap(),
            signal_name: &format!("tx.{link}"),
        },
    )
    .await
    .unwrap();
}

/// A queued (unsigned) request is no milestone yet; waiting on its signal reads as a
/// transaction wait on that link. A cancel withdraws it and the operation ends
/// `cancelled`, saying that nothing landed.
#[tokio::test]
async fn a_queued_write_then_a_cancel() {
    let env = Env::new().await;
    let accepted = env
        .ops
        .create_asset(env.caller, "k", &new_asset("Alpha"))
        .await
        .unwrap();
    let op = accepted.operation.id;
    let q = queue(&env, 31337, "http://127.0.0.1:1");
    let sender = alloy::primitives::Address::repeat_byte(9);
    let request = q
        .enqueue(&op_request(sender, op, "create-feed"))
        .await
        .unwrap();
    link(&env, op, "create-feed", request).await;

    let view = env.ops.operation(env.caller, op).await.unwrap();
    assert_eq!(view.state, OperationState::Running);
    assert!(view.milestones.submitted.is_empty());
    assert!(view.milestones.confirmed.is_empty());
    assert_eq!(view.wait, None);
    assert_eq!(
        view.milestones.accepted,
        accepted.operation.milestones.accepted
    );

    // The same stored rows under an instance that waits for the link's verdict.
    let row = store::operation_get(env.pool(), env.caller.organization_id, op)
        .await
        .unwrap()
        .unwrap();
    let mut status = env.engine.status(row.instance_id.unwrap()).await.unwrap();
    status.status = RunStatus::Waiting;
    status.wait = Some(WaitDescription {
        kind: WaitKind::Signal,
        name: Some("tx.create-feed".into()),
        deadline: None,
    });
    let txs = env.ops.linked_requests(op).await.unwrap();
    let waiting = project(&row, Some(&status), txs, None);
    assert_eq!(waiting.state, OperationState::Waiting);
    let wait = waiting.wait.unwrap();
    assert_eq!(wait.waits_for, WaitFor::Transaction);
    assert_eq!(wait.link.as_deref(), Some("create-feed"));
    assert_eq!(wait.last_broadcast_error, None);

    let cancelled = env.ops.cancel(env.caller, op).await.unwrap();
    assert_eq!(cancelled.state, OperationState::Cancelled);
    assert!(cancelled.cancel_requested_at.is_some());
    let e = cancelled.error.unwrap();
    assert_eq!(e.code, "CANCELLED");
    assert!(
        e.detail.contains("none of its transactions landed"),
        "{}",
        e.detail
    );
    let txs = env.ops.linked_requests(op).await.unwrap();
    assert_eq!(txs[0].request.state, keel_txq::RequestState::Settled);
    let verdict: SettlementVerdict = txs[0].request.verdict.clone().unwrap();
    assert!(
        matches!(verdict, SettlementVerdict::Failed { ref code, .. } if *code == keel_txq::FailureCode::Withdrawn),
        "{verdict:?}"
    );
    // Nothing else may be queued for it, and a second cancel is refused: it ended.
    assert!(
        store::operation_write_guard(env.pool(), op)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        env.ops.cancel(env.caller, op).await.unwrap_err().code(),
        "OPERATION_ENDED"
    );
    assert!(
        env.ops
            .funding_requests(env.caller, None)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A request that really settles on Anvil shows as submitted (its hash and nonce,
/// broadcast) and confirmed (with its block), by link.
#[tokio::test]
async fn a_settled_write_is_submitted_and_confirmed() {
    let chain = TestChain::start().await.unwrap();
    let env = Env::on_chain(chain.chain_id()).await;
    let accepted = env
        .ops
        .create_asset(env.caller, "k", &new_asset("Alpha"))
        .await
        .unwrap();
    let op = accepted.operation.id;
    let mut q = queue(&env, chain.chain_id(), chain.endpoint().as_str());
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(0).unwrap().clone())));
    let sender = chain.account(0).unwrap();
    let request = q
        .enqueue(&op_request(sender, op, "create-feed"))
        .await
        .unwrap();
    link(&env, op, "create-feed", request).await;

    let deadline = Instant::now() + Duration::from_secs(120);
    let verdict = loop {
        q.tick().await.unwrap();
        if let Some(v) = q.status(request).await.unwrap().verdict {
            break v;
        }
        assert!(Instant::now() < deadline, "the request did not settle");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let SettlementVerdict::Confirmed { hash, block, .. } = verdict else {
        panic!("expected a confirmation, got {verdict:?}");
    };

    let view = env.ops.operation(env.caller, op).await.unwrap();
    assert_eq!(view.milestones.submitted.len(), 1);
    let s = &view.milestones.submitted[0];
    assert_eq!(s.link, "create-feed");
    assert_eq!(s.tx_hash, Some(hash));
    assert_eq!(s.nonce, Some(0));
    assert!(s.broadcast);
    assert_eq!(s.block, Some(block), "a mined submission carries its block");
    let broadcast_at = s.broadcast_at.expect("a broadcast submission has its time");
    let confirmed_at = s.confirmed_at.expect("a confirmed submission has its time");
    assert!(view.created_at <= broadcast_at && broadcast_at <= confirmed_at);
    assert!(
        confirmed_at <= view.updated_at,
        "the confirmation moved updatedAt"
    );
    assert_eq!(view.milestones.confirmed.len(), 1);
    let c = &view.milestones.confirmed[0];
    assert_eq!(
        (c.link.as_str(), c.tx_hash, c.block),
        ("create-feed", Some(hash), Some(block))
    );
    assert_eq!(
        (c.broadcast_at, c.confirmed_at),
        (s.broadcast_at, s.confirmed_at)
    );
    assert_eq!(
        view.completed_at, None,
        "the operation itself has not ended"
    );
    // The list shows the same view.
    let list = env
        .ops
        .operations(env.caller, &Default::default(), None, 10)
        .await
        .unwrap();
    // (without the attribution, which only the single-operation read fills)
    let single = keel_workflows::OperationView {
        attribution: None,
        ..view.clone()
    };
    assert_eq!(list.operations, vec![single]);
    assert_eq!(view.milestones.indexed, None);
    // A wait on a settled link is a plain transaction wait (the verdict is on its way).
    let row = store::operation_get(env.pool(), env.caller.organization_id, op)
        .await
        .unwrap()
        .unwrap();
    let mut status = env.engine.status(row.instance_id.unwrap()).await.unwrap();
    status.status = RunStatus::Waiting;
    status.wait = Some(WaitDescription {
        kind: WaitKind::Signal,
        name: Some("tx.create-feed".into()),
        deadline: None,
    });
    let txs = env.ops.linked_requests(op).await.unwrap();
    let w = project(&row, Some(&status), txs, None).wait.unwrap();
    assert_eq!(w.waits_for, WaitFor::Transaction);
}
