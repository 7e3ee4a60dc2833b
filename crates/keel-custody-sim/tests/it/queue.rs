//! The custody path of the transaction queue (`keel_txq`, custody senders) against the
//! simulator as a process on a real Anvil and a real PostgreSQL: each fault knob, each
//! checked on chain (a counter contract incremented once per effect, and the vault's
//! transaction count), plus a SIGKILL of the queue process while a create is in doubt.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use anvil_tests::TestChain;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_custody::{CustodyProvider, FireblocksConfig, FireblocksProvider, Secret, SecretSource};
use keel_store::testing::TestDatabase;
use keel_txq::{
    CustodySender, CustodySenderConfig, CustodyView, FailureCode, RequestState, SettlementVerdict,
    TxQueue, TxQueueConfig, TxRequest,
};
use keel_units::{ChainId, Wei};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::harness::{API_KEY, ASSET, Sim, VAULT, sent_count};

/// How long a test waits for a verdict or a state.
pub(crate) const DEADLINE: Duration = Duration::from_secs(90);

/// Deploys a contract whose every call increments slot 0: the on-chain effect count.
pub(crate) async fn deploy_counter(chain: &TestChain) -> Address {
    use alloy::network::TransactionBuilder;
    use alloy::rpc::types::TransactionRequest;
    // runtime: PUSH1 0 SLOAD PUSH1 1 ADD PUSH1 0 SSTORE STOP (10 bytes)
    let runtime = alloy::hex::decode("60005460010160005500").unwrap();
    let len = u8::try_from(runtime.len()).unwrap();
    let mut init = vec![
        0x60, len, 0x60, 0x0c, 0x60, 0x00, 0x39, 0x60, len, 0x60, 0x00, 0xf3,
    ];
    init.extend_from_slice(&runtime);
    let receipt = chain
        .provider()
        .send_transaction(TransactionRequest::default().with_deploy_code(Bytes::from(init)))
        .await
        .unwrap()
        .get_receipt()
        .await
        .unwrap();
    receipt.contract_address.unwrap()
}

/// The counter's value: how many calls took effect.
pub(crate) async fn effects(chain: &TestChain, counter: Address) -> U256 {
    chain
        .provider()
        .get_storage_at(counter, U256::ZERO)
        .await
        .unwrap()
}

pub(crate) fn pool(chain: &TestChain) -> Arc<UpstreamPool> {
    Arc::new(
        UpstreamPool::new(
            ChainId(chain.chain_id()),
            UpstreamConfig::new(vec![chain.endpoint().to_string()]),
        )
        .unwrap(),
    )
}

/// Test pacing: fast polls, silent-drop recovery off unless a test turns it on.
pub(crate) fn sender_config(vault: Address) -> CustodySenderConfig {
    CustodySenderConfig {
        poll_interval_ms: 50,
        max_poll_interval_ms: 200,
        silent_drop_after_secs: None,
        clock_skew_secs: 1,
        ..CustodySenderConfig::new(VAULT, ASSET, vault)
    }
}

pub(crate) fn queue_with(
    db_pool: keel_store::PgPool,
    chain: Arc<UpstreamPool>,
    provider: Arc<dyn CustodyProvider>,
    config: &CustodySenderConfig,
) -> TxQueue {
    let mut q = TxQueue::new(
        db_pool,
        chain,
        TxQueueConfig {
            poll_interval: Duration::from_millis(50),
            ..TxQueueConfig::default()
        },
    )
    .unwrap();
    q.add_custody_sender(CustodySender::new(provider, config).unwrap());
    q
}

/// A chain, a database, the simulator, a funded vault, a counter contract and a queue
/// with the vault as a custody sender, running in the background.
struct Rig {
    chain: TestChain,
    db: TestDatabase,
    sim: Sim,
    vault: Address,
    counter: Address,
    queue: Arc<TxQueue>,
    stop: CancellationToken,
}

impl Rig {
    async fn start(tune: impl FnOnce(&mut CustodySenderConfig)) -> Rig {
        let chain = TestChain::start().await.unwrap();
        let db = TestDatabase::create().await.unwrap();
        let sim = Sim::start(&chain).await;
        let vault = sim.funded_vault(&chain, VAULT).await;
        let counter = deploy_counter(&chain).await;
        let mut config = sender_config(vault);
        tune(&mut config);
        let queue = Arc::new(queue_with(
            db.pool().clone(),
            pool(&chain),
            Arc::new(sim.provider()),
            &config,
        ));
        let stop = CancellationToken::new();
        let (q, s) = (queue.clone(), stop.clone());
        tokio::spawn(async move { q.run(s).await });
        Rig {
            chain,
            db,
            sim,
            vault,
            counter,
            queue,
            stop,
        }
    }

    async fn enqueue(&self, key: &str) -> Uuid {
        self.queue
            .enqueue(&call(self.vault, self.counter, key))
            .await
            .unwrap()
    }

    /// Waits for the request's verdict.
    async fn verdict(&self, id: Uuid) -> SettlementVerdict {
        tokio::time::timeout(
            DEADLINE,
            self.queue.await_verdict(id, Duration::from_millis(50)),
        )
        .await
        .expect("a verdict in time")
        .unwrap()
    }

    /// Waits until the request's custody view satisfies `done`.
    async fn view_until(&self, id: Uuid, done: impl Fn(&CustodyView) -> bool) -> CustodyView {
        let start = Instant::now();
        loop {
            if let Some(v) = self.queue.status(id).await.unwrap().custody
                && done(&v)
            {
                return v;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "custody view not reached in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A call of the counter from the vault (the calldata carries an ERC-8021-like suffix).
pub(crate) fn call(vault: Address, counter: Address, key: &str) -> TxRequest {
    TxRequest {
        sender: vault,
        idempotency_key: key.to_owned(),
        to: Some(counter),
        value: Wei::new(U256::ZERO),
        data: Bytes::from(vec![0xde, 0xad, 0x80, 0x21]),
        gas_limit: None,
        authorization_list: Vec::new(),
    }
}

fn external(id: Uuid, resubmission: u32) -> String {
    format!("keel.{id}.{resubmission}")
}

/// The request's status once its custody submission is marked `done`, which the queue
/// does right after the settlement in a statement of its own (a caller that saw the
/// verdict may read between the two), or as it is after 30 s.
async fn status_once_done(queue: &TxQueue, id: Uuid) -> keel_txq::RequestStatus {
    let start = Instant::now();
    loop {
        let status = queue.status(id).await.unwrap();
        let done = status.custody.as_ref().is_some_and(|c| c.phase == "done");
        if done || start.elapsed() > Duration::from_secs(30) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn assert_confirmed(v: &SettlementVerdict) {
    assert!(
        matches!(v, SettlementVerdict::Confirmed { .. }),
        "expected confirmed, got {v:?}"
    );
}

#[tokio::test]
async fn a_custody_request_lands_once_without_a_local_nonce_and_settles_from_the_chain() {
    let rig = Rig::start(|_| {}).await;
    // A provider's contract call carries no EIP-7702 authorization list: refused at
    // enqueue, nothing recorded.
    let key = alloy::signers::local::PrivateKeySigner::random();
    let auth = alloy::eips::eip7702::Authorization {
        chain_id: U256::ZERO,
        address: rig.counter,
        nonce: 0,
    };
    let sig = alloy::signers::SignerSync::sign_hash_sync(&key, &auth.signature_hash()).unwrap();
    let set_code = TxRequest {
        authorization_list: vec![auth.into_signed(sig)],
        ..call(rig.vault, rig.counter, "set-code")
    };
    assert!(matches!(
        rig.queue.enqueue(&set_code).await,
        Err(keel_txq::TxqError::InvalidRequest("authorization_list"))
    ));
    let id = rig.enqueue("mint-1").await;
    let verdict = rig.verdict(id).await;
    assert_confirmed(&verdict);
    let status = status_once_done(&rig.queue, id).await;
    assert_eq!(status.state, RequestState::Settled);
    assert_eq!(
        status.nonce, None,
        "a custody request never takes a local nonce"
    );
    let view = status.custody.unwrap();
    assert_eq!(view.external_tx_id, external(id, 0));
    assert_eq!(view.phase, "done");
    // The chain settles it: the receipt at depth may come before the provider's COMPLETED.
    assert!(
        matches!(view.status.as_deref(), Some("CONFIRMING" | "COMPLETED")),
        "{:?}",
        view.status
    );
    assert!(view.provider_tx_id.is_some());
    let SettlementVerdict::Confirmed { hash, .. } = verdict else {
        unreachable!()
    };
    assert_eq!(view.tx_hash, Some(hash));
    let receipt = rig
        .chain
        .provider()
        .get_transaction_receipt(hash)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(receipt.from, rig.vault);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);

    // The same idempotency key again: the same request, nothing new at the provider.
    assert_eq!(rig.enqueue("mint-1").await, id);
    let stats = rig.sim.admin_get("/admin/stats").await;
    assert_eq!(stats["createsReceived"], 1);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
}

#[tokio::test]
async fn a_lost_create_answer_is_looked_up_by_external_id_and_lands_once() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin("/admin/faults/transaction", json!({"loseResponse": true}))
        .await;
    let id = rig.enqueue("mint-lost").await;
    assert_confirmed(&rig.verdict(id).await);
    let stats = rig.sim.admin_get("/admin/stats").await;
    assert_eq!(
        stats["createsReceived"], 1,
        "no second create after the lost answer"
    );
    assert_eq!(stats["transactions"], 1);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn a_lost_hash_is_recovered_by_external_id_before_the_request_settles() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin("/admin/faults/transaction", json!({"loseHash": true}))
        .await;
    let id = rig.enqueue("mint-lost-hash").await;
    let verdict = rig.verdict(id).await;
    let SettlementVerdict::Confirmed { hash, .. } = verdict else {
        panic!("expected confirmed, got {verdict:?}")
    };
    let view = rig.queue.status(id).await.unwrap().custody.unwrap();
    assert_eq!(
        view.status.as_deref(),
        Some("COMPLETED"),
        "settled only after COMPLETED"
    );
    assert_eq!(view.tx_hash, Some(hash), "the recovered hash is persisted");
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn a_5xx_create_stays_in_doubt_until_absence_is_provable_then_lands_once() {
    let rig = Rig::start(|c| c.clock_skew_secs = 0).await;
    rig.sim
        .admin(
            "/admin/faults/http",
            json!({"kind": "server_error", "status": 503}),
        )
        .await;
    let id = rig.enqueue("mint-5xx").await;
    // The provider did nothing, but Keel cannot know: in doubt, and lookups that find
    // nothing do not allow a create before the create's JWT has expired.
    let view = rig
        .view_until(id, |v| v.phase == "in_doubt" && v.polls == 0)
        .await;
    assert_eq!(view.provider_tx_id, None);
    assert_eq!(
        rig.sim.admin_get("/admin/stats").await["createsReceived"],
        1
    );
    assert_confirmed(&rig.verdict(id).await);
    let stats = rig.sim.admin_get("/admin/stats").await;
    assert_eq!(
        stats["createsReceived"], 2,
        "created again once absence was proven"
    );
    assert_eq!(stats["transactions"], 1);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_and_lands_once() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin(
            "/admin/faults/http",
            json!({"kind": "rate_limit", "count": 2, "retryAfterSecs": 1}),
        )
        .await;
    let id = rig.enqueue("mint-429").await;
    assert_confirmed(&rig.verdict(id).await);
    let stats = rig.sim.admin_get("/admin/stats").await;
    assert_eq!(stats["transactions"], 1);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn an_approval_wait_at_the_provider_is_visible_and_lands_once_approved() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let id = rig.enqueue("mint-approval").await;
    let view = rig.view_until(id, |v| v.awaiting_approval).await;
    assert_eq!(view.status.as_deref(), Some("PENDING_AUTHORIZATION"));
    let status = rig.queue.status(id).await.unwrap();
    assert_eq!(status.state, RequestState::Queued);
    assert_eq!(status.verdict, None);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::ZERO);
    let pid = view.provider_tx_id.unwrap();
    // Platform Status' custody section: the live submission by provider status, and
    // the oldest approval pending at the provider.
    let (counts, oldest) = keel_txq::custody_health(rig.db.pool()).await.unwrap();
    assert_eq!(counts.len(), 1, "{counts:?}");
    assert_eq!(counts[0].provider, "fireblocks");
    assert_eq!(counts[0].phase, "submitted");
    assert_eq!(counts[0].status.as_deref(), Some("PENDING_AUTHORIZATION"));
    assert_eq!(counts[0].live, 1);
    let oldest = oldest.expect("an approval is pending");
    assert_eq!(oldest.request_id, id);
    assert_eq!(oldest.provider_tx_id.as_deref(), Some(pid.as_str()));
    rig.sim
        .admin(&format!("/admin/transactions/{pid}/approve"), json!({}))
        .await;
    assert_confirmed(&rig.verdict(id).await);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
    // Settled: nothing live, nothing pending.
    let (counts, oldest) = keel_txq::custody_health(rig.db.pool()).await.unwrap();
    assert!(counts.is_empty(), "{counts:?}");
    assert!(oldest.is_none());
}

#[tokio::test]
async fn rejections_settle_failed_with_the_provider_reason_and_never_block_other_requests() {
    let rig = Rig::start(|_| {}).await;
    // The faults apply to the next create, in order: each request is created before
    // the next fault is set.
    let mut failing = Vec::new();
    for (behavior, sub, key) in [
        ("reject", "REJECTED_BY_USER", "mint-rejected"),
        ("block", "BLOCKED_BY_POLICY", "mint-blocked"),
    ] {
        rig.sim
            .admin(
                "/admin/faults/transaction",
                json!({"behavior": behavior, "subStatus": sub}),
            )
            .await;
        let id = rig.enqueue(key).await;
        rig.view_until(id, |v| v.provider_tx_id.is_some()).await;
        failing.push((id, sub));
    }
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let waiting = rig.enqueue("mint-approval-rejected").await;
    let pid = rig
        .view_until(waiting, |v| v.awaiting_approval)
        .await
        .provider_tx_id
        .unwrap();

    // Another request goes through while one waits for approval and two were refused.
    let ok = rig.enqueue("mint-ok").await;
    assert_confirmed(&rig.verdict(ok).await);
    assert!(
        rig.queue
            .status(waiting)
            .await
            .unwrap()
            .custody
            .unwrap()
            .awaiting_approval
    );

    for ((id, sub), code) in failing
        .into_iter()
        .zip([FailureCode::CustodyRejected, FailureCode::CustodyBlocked])
    {
        match rig.verdict(id).await {
            SettlementVerdict::Failed {
                code: got, reason, ..
            } => {
                assert_eq!(got, code);
                assert_eq!(reason.as_deref(), Some(sub), "the provider's sub-status");
            }
            other => panic!("expected failed, got {other:?}"),
        }
        let view = rig.queue.status(id).await.unwrap().custody.unwrap();
        assert!(
            !view.awaiting_approval,
            "a rejection never sits in an approval wait"
        );
        assert_eq!(view.tx_hash, None);
    }

    // Rejected at the approval step.
    rig.sim
        .admin(&format!("/admin/transactions/{pid}/reject"), json!({}))
        .await;
    match rig.verdict(waiting).await {
        SettlementVerdict::Failed { code, .. } => assert_eq!(code, FailureCode::CustodyRejected),
        other => panic!("expected failed, got {other:?}"),
    }
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn a_revert_after_broadcast_settles_reverted_from_the_chain() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin("/admin/faults/transaction", json!({"behavior": "revert"}))
        .await;
    let id = rig.enqueue("mint-revert").await;
    match rig.verdict(id).await {
        SettlementVerdict::Reverted { hash, .. } => {
            let receipt = rig
                .chain
                .provider()
                .get_transaction_receipt(hash)
                .await
                .unwrap()
                .unwrap();
            assert!(!receipt.status());
        }
        other => panic!("expected reverted, got {other:?}"),
    }
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::ZERO);
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn a_silent_drop_is_cancelled_confirmed_and_resubmitted_once() {
    let rig = Rig::start(|c| c.silent_drop_after_secs = Some(1)).await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "silent_drop"}),
        )
        .await;
    // An operation's write (`op/…`): organization-scoped, so recovered automatically.
    let id = rig.enqueue("op/drop/mint").await;
    assert_confirmed(&rig.verdict(id).await);
    let view = rig.queue.status(id).await.unwrap().custody.unwrap();
    assert_eq!(view.resubmission, 1);
    assert_eq!(view.external_tx_id, external(id, 1));
    // Keel settles from the chain's receipt; the provider moves its own record from
    // CONFIRMING to COMPLETED on its own clock, so its view is probed until it settles.
    let start = Instant::now();
    let statuses = loop {
        let txs = rig.sim.admin_get("/admin/transactions").await;
        let statuses: Vec<String> = txs
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["status"].as_str().unwrap().to_owned())
            .collect();
        if statuses.last().is_none_or(|s| s != "CONFIRMING")
            || start.elapsed() > Duration::from_secs(30)
        {
            break statuses;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(statuses, ["CANCELLED", "COMPLETED"]);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

#[tokio::test]
async fn a_silent_drop_without_recovery_is_flagged_when_the_poll_budget_runs_out() {
    let rig = Rig::start(|c| c.poll_budget_secs = 1).await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "silent_drop"}),
        )
        .await;
    let id = rig.enqueue("op/stuck/mint").await;
    let view = rig.view_until(id, |v| v.budget_exceeded).await;
    assert_eq!(view.status.as_deref(), Some("QUEUED"));
    assert_eq!(view.resubmission, 0);
    let status = rig.queue.status(id).await.unwrap();
    assert_eq!(status.verdict, None, "it may still land: not failed");
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 0);
}

#[tokio::test]
async fn a_platform_scoped_silent_drop_is_not_resubmitted_and_fails_typed_after_the_poll_budget() {
    // Recovery is on for the sender, but this write is platform-scoped (not an
    // operation's `op/…` key): it is never resubmitted; past the poll budget it is
    // cancelled at the provider and, once the cancel is confirmed, fails typed.
    let rig = Rig::start(|c| {
        c.silent_drop_after_secs = Some(1);
        c.poll_budget_secs = 2;
    })
    .await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "silent_drop"}),
        )
        .await;
    let id = rig.enqueue("platform/directory-update").await;
    assert!(!keel_txq::organization_scoped("platform/directory-update"));
    match rig.verdict(id).await {
        SettlementVerdict::Failed { code, reason, .. } => {
            assert_eq!(code, keel_txq::FailureCode::CustodyTimedOut);
            assert_eq!(code.to_string(), "CUSTODY_TIMED_OUT");
            assert_eq!(reason.as_deref(), Some("POLL_BUDGET_EXCEEDED"));
        }
        other => panic!("expected CUSTODY_TIMED_OUT, got {other:?}"),
    }
    let view = rig.queue.status(id).await.unwrap().custody.unwrap();
    assert_eq!(view.resubmission, 0, "never resubmitted");
    assert!(view.budget_exceeded);
    let txs = rig.sim.admin_get("/admin/transactions").await;
    let statuses: Vec<&str> = txs
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["CANCELLED"], "one create, cancelled");
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::ZERO);
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 0);
}

/// Issue 32 §5: a withdrawal (the cancel of an operation) of a custody request waiting
/// for an approval at the provider cancels it there: the request settles `WITHDRAWN`
/// (reason `CANCELLED_AT_PROVIDER`) once the provider confirms, an approval given at the
/// provider afterwards has nothing to approve, and nothing reaches the chain. Before,
/// the request stayed `PENDING_AUTHORIZATION` and approving it later landed it.
#[tokio::test]
async fn a_withdrawn_custody_request_is_cancelled_at_the_provider_and_never_lands() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let id = rig.enqueue("op/1/mint").await;
    let view = rig.view_until(id, |v| v.awaiting_approval).await;
    let pid = view.provider_tx_id.unwrap();
    let w = keel_txq::withdraw_by_key_prefix(
        rig.db.pool(),
        ChainId(rig.chain.chain_id()),
        "op/1/",
        None,
    )
    .await
    .unwrap();
    // At the provider: not withdrawn here, but in flight, until the provider confirms.
    assert_eq!(w.withdrawn, Vec::<Uuid>::new());
    assert_eq!(w.in_flight, vec![id]);
    match rig.verdict(id).await {
        SettlementVerdict::Failed { code, reason, .. } => {
            assert_eq!(code, FailureCode::Withdrawn);
            assert_eq!(reason.as_deref(), Some("CANCELLED_AT_PROVIDER"));
        }
        other => panic!("expected withdrawn, got {other:?}"),
    }
    let status = status_once_done(&rig.queue, id).await;
    assert_eq!(status.custody.unwrap().status.as_deref(), Some("CANCELLED"));
    // Approving it at the provider now is refused: nothing is left to approve.
    assert_eq!(
        rig.sim
            .admin_status(&format!("/admin/transactions/{pid}/approve"), json!({}))
            .await,
        409
    );
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::ZERO);
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 0);
}

/// Issue 32 §5: an approval at the provider that never comes ends at the vault's
/// approval deadline: the transaction is cancelled there and the request fails
/// `CUSTODY_APPROVAL_EXPIRED`; approving afterwards mints nothing. Before, it waited
/// `PENDING_AUTHORIZATION` for ever.
#[tokio::test]
async fn an_approval_that_never_comes_expires_and_is_cancelled_at_the_provider() {
    let rig = Rig::start(|c| c.approval_deadline_secs = Some(1)).await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let id = rig.enqueue("op/2/mint").await;
    let view = rig.view_until(id, |v| v.awaiting_approval).await;
    let pid = view.provider_tx_id.unwrap();
    match rig.verdict(id).await {
        SettlementVerdict::Failed { code, reason, .. } => {
            assert_eq!(code, FailureCode::CustodyApprovalExpired);
            assert_eq!(code.as_str(), "CUSTODY_APPROVAL_EXPIRED");
            assert_eq!(reason.as_deref(), Some("APPROVAL_DEADLINE_PASSED"));
        }
        other => panic!("expected an expired approval, got {other:?}"),
    }
    let status = status_once_done(&rig.queue, id).await;
    assert_eq!(status.custody.unwrap().status.as_deref(), Some("CANCELLED"));
    assert_eq!(
        rig.sim
            .admin_status(&format!("/admin/transactions/{pid}/approve"), json!({}))
            .await,
        409
    );
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::ZERO);
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 0);
}

/// Issue 32 §5: a withdrawal after the provider signed cannot take the transaction
/// back: nothing is withdrawn, no cancel is asked for, and the verdict says it landed.
#[tokio::test]
async fn a_withdrawal_after_signing_runs_to_the_verdict_and_it_landed() {
    let rig = Rig::start(|_| {}).await;
    rig.sim
        .admin(
            "/admin/faults/transaction",
            json!({"behavior": "require_approval"}),
        )
        .await;
    let id = rig.enqueue("op/3/mint").await;
    let view = rig.view_until(id, |v| v.awaiting_approval).await;
    rig.sim
        .admin(
            &format!(
                "/admin/transactions/{}/approve",
                view.provider_tx_id.unwrap()
            ),
            json!({}),
        )
        .await;
    // Signed and broadcast by the provider: the queue knows its hash.
    rig.view_until(id, |v| v.tx_hash.is_some()).await;
    let w = keel_txq::withdraw_by_key_prefix(
        rig.db.pool(),
        ChainId(rig.chain.chain_id()),
        "op/3/",
        None,
    )
    .await
    .unwrap();
    assert_eq!(w.withdrawn, Vec::<Uuid>::new());
    assert_confirmed(&rig.verdict(id).await);
    assert_eq!(effects(&rig.chain, rig.counter).await, U256::from(1));
    assert_eq!(sent_count(&rig.chain, rig.vault).await, 1);
}

// ---- SIGKILL while a create is in doubt ----

const WORKER_ENV: &str = "KEEL_CUSTODY_QUEUE_WORKER";

/// The queue process of `a_kill_9_while_a_create_is_in_doubt_lands_once`: this test
/// binary re-run with only this test and the worker's settings in the environment.
#[tokio::test]
#[ignore = "run as a child process by a_kill_9_while_a_create_is_in_doubt_lands_once"]
async fn custody_queue_worker_process() {
    let Ok(settings) = std::env::var(WORKER_ENV) else {
        // Not a test of its own: the entry point of the queue process that
        // `a_kill_9_while_a_create_is_in_doubt_lands_once` starts (with its settings).
        eprintln!("{WORKER_ENV} is not set: nothing to run outside the kill test");
        return;
    };
    let settings: serde_json::Value = serde_json::from_str(&settings).unwrap();
    let s = |k: &str| settings[k].as_str().unwrap().to_owned();
    let db = keel_store::connect(&keel_store::StoreConfig::new(s("db")))
        .await
        .unwrap();
    let chain = Arc::new(
        UpstreamPool::new(
            ChainId(settings["chainId"].as_u64().unwrap()),
            UpstreamConfig::new(vec![s("rpc")]),
        )
        .unwrap(),
    );
    let provider = provider_for(&s("sim"), &s("key"));
    let config: CustodySenderConfig = serde_json::from_value(settings["sender"].clone()).unwrap();
    let q = queue_with(db, chain, Arc::new(provider), &config);
    println!("worker ready");
    q.run(CancellationToken::new()).await;
}

fn provider_for(base: &str, private_pem: &str) -> FireblocksProvider {
    FireblocksProvider::with_secrets(
        &FireblocksConfig::new(
            base.to_owned(),
            SecretSource::Env("UNUSED_IN_TESTS".into()),
            SecretSource::Env("UNUSED_IN_TESTS".into()),
        ),
        Secret::new(API_KEY),
        &Secret::new(private_pem.to_owned()),
    )
    .unwrap()
}

#[tokio::test]
async fn a_kill_9_while_a_create_is_in_doubt_lands_once() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let counter = deploy_counter(&chain).await;
    let config = sender_config(vault);

    // The provider holds the next request 5 s before handling it (the create, here).
    sim.admin(
        "/admin/faults/http",
        json!({"kind": "slow", "delayMs": 5000}),
    )
    .await;
    let settings = json!({
        "db": db.url(),
        "rpc": chain.endpoint().to_string(),
        "chainId": chain.chain_id(),
        "sim": sim.base,
        "key": sim.key.private,
        "sender": config,
    });
    let mut worker = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "queue::custody_queue_worker_process",
            "--ignored",
            "--nocapture",
        ])
        .env(WORKER_ENV, settings.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .expect("the worker starts")
            .unwrap()
            .expect("the worker prints its readiness");
        if line.contains("worker ready") {
            break;
        }
    }

    // A reader queue in this process records the request (it does not run).
    let reader = queue_with(
        db.pool().clone(),
        pool(&chain),
        Arc::new(sim.provider()),
        &config,
    );
    let id = reader
        .enqueue(&call(vault, counter, "mint-kill"))
        .await
        .unwrap();

    // The dangerous point: the create is at the provider, its answer not recorded.
    let start = Instant::now();
    loop {
        let received = sim.admin_get("/admin/stats").await["createsReceived"].as_u64();
        if received == Some(1) {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the worker never sent the create"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let view = reader.status(id).await.unwrap().custody.unwrap();
    assert_eq!(view.phase, "creating");
    assert_eq!(view.provider_tx_id, None);
    worker.start_kill().unwrap(); // SIGKILL
    worker.wait().await.unwrap();

    // A new queue process (here) picks the request up: in doubt, found by external id
    // once the provider handled the create, never created twice.
    let restarted = Arc::new(reader);
    let stop = CancellationToken::new();
    let (q, s) = (restarted.clone(), stop.clone());
    tokio::spawn(async move { q.run(s).await });
    let verdict = tokio::time::timeout(
        DEADLINE,
        restarted.await_verdict(id, Duration::from_millis(50)),
    )
    .await
    .expect("a verdict in time")
    .unwrap();
    stop.cancel();
    assert_confirmed(&verdict);
    let stats = sim.admin_get("/admin/stats").await;
    assert_eq!(stats["createsReceived"], 1);
    assert_eq!(stats["transactions"], 1);
    assert_eq!(effects(&chain, counter).await, U256::from(1));
    assert_eq!(sent_count(&chain, vault).await, 1);
}

// ---- a reorg after the provider's COMPLETED ----

/// Waits until the proxy has forwarded at least two more receipt reads than `seen`:
/// a whole pass of the queue (head, then receipt) has then read the chain after the
/// moment `seen` was taken.
async fn two_more_receipt_reads(proxy: &anvil_tests::proxy::RpcProxy, seen: u64) {
    let start = Instant::now();
    while proxy.count("eth_getTransactionReceipt") < seen + 2 {
        assert!(
            start.elapsed() < DEADLINE,
            "the queue stopped reading the receipt"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_reorg_after_the_providers_completed_puts_the_request_back_in_flight_and_it_lands_once() {
    use alloy::providers::ext::AnvilApi;
    use alloy::rpc::types::anvil::{ReorgOptions, TransactionData};

    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    // The simulator (its own connection to Anvil) says COMPLETED at 1 confirmation; the
    // queue settles at 3 and reads the chain through a proxy that counts its reads.
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let counter = deploy_counter(&chain).await;
    let proxy = anvil_tests::proxy::RpcProxy::start(chain.endpoint())
        .await
        .unwrap();
    let upstream = Arc::new(
        UpstreamPool::new(
            ChainId(chain.chain_id()),
            UpstreamConfig::new(vec![proxy.url().to_string()]),
        )
        .unwrap(),
    );
    let mut q = TxQueue::new(
        db.pool().clone(),
        upstream,
        TxQueueConfig {
            poll_interval: Duration::from_millis(50),
            confirmations: 3,
            ..TxQueueConfig::default()
        },
    )
    .unwrap();
    q.add_custody_sender(
        CustodySender::new(Arc::new(sim.provider()), &sender_config(vault)).unwrap(),
    );
    let queue = Arc::new(q);
    let stop = CancellationToken::new();
    let (q, s) = (queue.clone(), stop.clone());
    tokio::spawn(async move { q.run(s).await });
    let _stop = stop.drop_guard();

    let id = queue
        .enqueue(&call(vault, counter, "op/reorg/mint"))
        .await
        .unwrap();

    // The queue has read COMPLETED with the hash; the receipt is 1 block deep: in flight.
    let start = Instant::now();
    let hash = loop {
        if let Some(v) = queue.status(id).await.unwrap().custody
            && v.status.as_deref() == Some("COMPLETED")
            && let Some(hash) = v.tx_hash
        {
            break hash;
        }
        assert!(start.elapsed() < DEADLINE, "COMPLETED not read in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let p = chain.provider();
    let old = p.get_transaction_receipt(hash).await.unwrap().unwrap();
    let old_block = old.block_number.unwrap();
    assert_eq!(p.get_block_number().await.unwrap(), old_block);
    // One more block: 2 deep, still short of 3.
    chain.mine().await.unwrap();
    two_more_receipt_reads(&proxy, proxy.count("eth_getTransactionReceipt")).await;
    let status = queue.status(id).await.unwrap();
    assert_ne!(status.state, RequestState::Settled, "{status:?}");
    assert_eq!(status.verdict, None);
    assert_eq!(effects(&chain, counter).await, U256::from(1));

    // Reorg away both blocks (the one holding the transaction and the one above it).
    // Anvil 1.7.1 drops the transactions of reorged-out blocks (no receipt, not in its
    // pool, the sender's nonce back): it does not come back by itself. A real network's
    // mempool would re-include it, so the reorg does: in the second new block, one
    // height above where it was.
    let raw = p.get_raw_transaction_by_hash(hash).await.unwrap().unwrap();
    p.anvil_reorg(ReorgOptions {
        depth: 2,
        tx_block_pairs: vec![(TransactionData::Raw(raw), 1)],
    })
    .await
    .unwrap();
    let new = p.get_transaction_receipt(hash).await.unwrap().unwrap();
    let new_block = new.block_number.unwrap();
    assert_eq!(new_block, old_block + 1);
    assert_ne!(new.block_hash, old.block_hash);
    assert_eq!(p.get_block_number().await.unwrap(), new_block);

    // Right after the reorg: still in flight (1 block deep again).
    let status = queue.status(id).await.unwrap();
    assert_ne!(status.state, RequestState::Settled, "{status:?}");
    assert_eq!(status.verdict, None);
    // One block: the old receipt would now be 3 deep, the new one is 2: not settled.
    chain.mine().await.unwrap();
    two_more_receipt_reads(&proxy, proxy.count("eth_getTransactionReceipt")).await;
    let status = queue.status(id).await.unwrap();
    assert_eq!(
        status.verdict, None,
        "settled on the reorged-out receipt: {status:?}"
    );
    // One more: the new receipt is 3 deep and settles.
    chain.mine().await.unwrap();
    let verdict =
        tokio::time::timeout(DEADLINE, queue.await_verdict(id, Duration::from_millis(50)))
            .await
            .expect("a verdict in time")
            .unwrap();
    match verdict {
        SettlementVerdict::Confirmed {
            block, hash: got, ..
        } => {
            assert_eq!(block, new_block, "settled from the receipt after the reorg");
            assert_eq!(got, hash);
        }
        other => panic!("expected confirmed, got {other:?}"),
    }
    let status = status_once_done(&queue, id).await;
    assert_eq!(status.state, RequestState::Settled);
    let view = status.custody.unwrap();
    assert_eq!(view.phase, "done");
    assert_eq!(view.resubmission, 0);
    assert_eq!(view.external_tx_id, external(id, 0));

    // Exactly one effect, one transaction from the vault, one create at the provider.
    assert_eq!(effects(&chain, counter).await, U256::from(1));
    assert_eq!(sent_count(&chain, vault).await, 1);
    let stats = sim.admin_get("/admin/stats").await;
    assert_eq!(stats["createsReceived"], 1);
    assert_eq!(stats["transactions"], 1);
    let txs = sim.admin_get("/admin/transactions").await;
    let statuses: Vec<&str> = txs
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["COMPLETED"]);
}
