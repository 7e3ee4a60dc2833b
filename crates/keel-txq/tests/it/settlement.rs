//! The settlement seam against real PostgreSQL and real Anvil: every request that
//! settles reaches the sink exactly once, in the transaction that settles it, on every
//! settle path; a failing sink leaves the request unsettled until a later pass.

use crate::common::{Transfer, transfer};
use alloy::primitives::{Address, Bytes, U256};
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolCall;
use anvil_tests::TestChain;
use futures::future::BoxFuture;
use keel_abi::bindings::PriceFeed;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    EnqueueOptions, FailureCode, LocalSigner, RequestState, Settled, SettlementSink,
    SettlementSinkError, SettlementVerdict, TxQueue, TxQueueConfig, TxRequest, TxqError,
};
use keel_units::{ChainId, Wei};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// A sink that records each settlement as a row of `sink_record` in the settling
/// transaction. It writes its rows before it fails (so a rollback is visible), and
/// fails every call while `fail` is set, or any call that holds the key `poison`.
#[derive(Default)]
struct TableSink {
    fail: AtomicBool,
    poison: Mutex<Option<String>>,
    /// Every request it was handed, whether it failed or not.
    asked: Mutex<HashSet<Uuid>>,
}

impl SettlementSink for TableSink {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        settled: &'c [Settled<'c>],
    ) -> BoxFuture<'c, Result<(), SettlementSinkError>> {
        Box::pin(async move {
            assert!(!settled.is_empty(), "never called with nothing");
            self.asked
                .lock()
                .unwrap()
                .extend(settled.iter().map(|s| s.request_id));
            for s in settled {
                let verdict = serde_json::to_value(s.verdict).map_err(SettlementSinkError::new)?;
                sqlx::query(
                    "INSERT INTO sink_record (request_id, idempotency_key, verdict) VALUES ($1, $2, $3)",
                )
                .bind(s.request_id)
                .bind(s.idempotency_key)
                .bind(verdict)
                .execute(&mut *conn)
                .await?;
            }
            let poison = self.poison.lock().unwrap().clone();
            let poisoned = poison.is_some_and(|p| settled.iter().any(|s| s.idempotency_key == p));
            if self.fail.load(Ordering::SeqCst) || poisoned {
                return Err(SettlementSinkError::new("the test sink refuses"));
            }
            Ok(())
        })
    }

    /// Reorged-out verdicts go to `sink_reorged`, under the same failure rules.
    fn reorged<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        reorged: &'c [Settled<'c>],
    ) -> BoxFuture<'c, Result<(), SettlementSinkError>> {
        Box::pin(async move {
            for s in reorged {
                let verdict = serde_json::to_value(s.verdict).map_err(SettlementSinkError::new)?;
                sqlx::query("INSERT INTO sink_reorged (request_id, verdict) VALUES ($1, $2)")
                    .bind(s.request_id)
                    .bind(verdict)
                    .execute(&mut *conn)
                    .await?;
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(SettlementSinkError::new("the test sink refuses"));
            }
            Ok(())
        })
    }
}

impl TableSink {
    fn asked(&self, id: Uuid) -> bool {
        self.asked.lock().unwrap().contains(&id)
    }
}

struct Fixture {
    chain: TestChain,
    db: TestDatabase,
    sink: Arc<TableSink>,
}

impl Fixture {
    async fn new() -> Self {
        let db = TestDatabase::create().await.unwrap();
        sqlx::query(
            "CREATE TABLE sink_record (seq bigserial PRIMARY KEY, request_id uuid NOT NULL,
                                       idempotency_key text NOT NULL, verdict jsonb NOT NULL)",
        )
        .execute(db.pool())
        .await
        .unwrap();
        sqlx::query("CREATE TABLE sink_reorged (request_id uuid NOT NULL, verdict jsonb NOT NULL)")
            .execute(db.pool())
            .await
            .unwrap();
        Self {
            chain: TestChain::start().await.unwrap(),
            db,
            sink: Arc::new(TableSink::default()),
        }
    }

    /// A queue with the sink, signers for dev accounts `idx` and for `extra` keys.
    fn queue(&self, idx: &[usize], extra: &[PrivateKeySigner]) -> TxQueue {
        let pool = UpstreamPool::new(
            ChainId(self.chain.chain_id()),
            UpstreamConfig::new(vec![self.chain.endpoint().to_string()]),
        )
        .unwrap();
        let mut q = TxQueue::new(
            self.db.pool().clone(),
            Arc::new(pool),
            TxQueueConfig::default(),
        )
        .unwrap();
        for i in idx {
            q.add_signer(Arc::new(LocalSigner::new(
                self.chain.signer(*i).unwrap().clone(),
            )));
        }
        for key in extra {
            q.add_signer(Arc::new(LocalSigner::new(key.clone())));
        }
        q.set_settlement_sink(self.sink.clone());
        q
    }

    /// The sink's rows: request id → (idempotency key, verdict) of each, in order.
    async fn records(&self) -> Vec<(Uuid, String, serde_json::Value)> {
        sqlx::query_as("SELECT request_id, idempotency_key, verdict FROM sink_record ORDER BY seq")
            .fetch_all(self.db.pool())
            .await
            .unwrap()
    }

    /// Asserts that the sink holds exactly the settled requests of the queue, each once,
    /// with its idempotency key and its stored verdict.
    async fn assert_each_settled_request_recorded_once(&self) {
        let records = self.records().await;
        let mut seen = HashMap::new();
        for (id, key, verdict) in &records {
            assert!(
                seen.insert(*id, (key.clone(), verdict.clone())).is_none(),
                "request {id} reached the sink twice: {records:?}"
            );
        }
        let settled: Vec<(Uuid, String, serde_json::Value)> = sqlx::query_as(
            "SELECT id, idempotency_key, verdict FROM txq_request WHERE state = 'settled'",
        )
        .fetch_all(self.db.pool())
        .await
        .unwrap();
        assert_eq!(seen.len(), settled.len(), "{records:?} vs {settled:?}");
        for (id, key, verdict) in settled {
            assert_eq!(seen.get(&id), Some(&(key, verdict)), "request {id}");
        }
    }

    /// The sink rows of `id`.
    async fn records_of(&self, id: Uuid) -> usize {
        self.records()
            .await
            .iter()
            .filter(|(r, ..)| *r == id)
            .count()
    }

    async fn feed(&self) -> Address {
        let admin = self.chain.account(0).unwrap();
        *PriceFeed::deploy(
            self.chain.provider().clone(),
            8u8,
            "X".to_owned(),
            admin,
            admin,
        )
        .await
        .unwrap()
        .address()
    }
}

/// `submit` on the feed by a non-submitter: reverts (at estimation without a gas limit,
/// on chain with one).
fn unauthorized_submit(sender: Address, feed: Address, key: &str, gas: Option<u64>) -> TxRequest {
    TxRequest {
        sender,
        idempotency_key: key.to_owned(),
        to: Some(feed),
        value: Wei::ZERO,
        data: PriceFeed::submitCall {
            answer: alloy::primitives::I256::ONE,
        }
        .abi_encode()
        .into(),
        gas_limit: gas,
        authorization_list: Vec::new(),
    }
}

/// Runs queue passes until `done` holds (a bounded probe, not a sleep).
async fn tick_until(q: &TxQueue, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        q.tick().await.unwrap();
        if done().await {
            return;
        }
        assert!(Instant::now() < deadline, "never reached: {what}");
    }
}

async fn all_settled(q: &TxQueue, ids: &[Uuid]) -> bool {
    for id in ids {
        if q.status(*id).await.unwrap().verdict.is_none() {
            return false;
        }
    }
    true
}

fn code(v: &SettlementVerdict) -> Option<&FailureCode> {
    match v {
        SettlementVerdict::Failed { code, .. } => Some(code),
        _ => None,
    }
}

#[tokio::test]
async fn every_settle_path_reaches_the_sink_exactly_once() {
    let f = Fixture::new().await;
    let feed = f.feed().await;
    let unfunded = PrivateKeySigner::random();
    let q = f.queue(&[1, 2, 3, 4, 5], std::slice::from_ref(&unfunded));
    let (a1, a2, a3, a4, a5) = (
        f.chain.account(1).unwrap(),
        f.chain.account(2).unwrap(),
        f.chain.account(3).unwrap(),
        f.chain.account(4).unwrap(),
        f.chain.account(5).unwrap(),
    );
    // Withdrawn (before any pass: still queued).
    let withdrawn = q.enqueue(&transfer(a5, "op/w/1")).await.unwrap();
    let w =
        keel_txq::withdraw_by_key_prefix(f.db.pool(), q.chain_id(), "op/w/", Some(f.sink.as_ref()))
            .await
            .unwrap();
    assert_eq!(w.withdrawn, vec![withdrawn]);
    // A second withdrawal moves nothing and hands nothing to the sink.
    let again =
        keel_txq::withdraw_by_key_prefix(f.db.pool(), q.chain_id(), "op/w/", Some(f.sink.as_ref()))
            .await
            .unwrap();
    assert!(again.withdrawn.is_empty());
    // Confirmed (two: one batch of the confirmation pass).
    let confirmed = q.enqueue(&transfer(a1, "ok-1")).await.unwrap();
    let confirmed2 = q.enqueue(&transfer(a1, "ok-2")).await.unwrap();
    // Reverted on chain (a fixed gas limit skips estimation).
    let reverted = q
        .enqueue(&unauthorized_submit(a4, feed, "revert", Some(100_000)))
        .await
        .unwrap();
    // Failed before signing: gas estimation reverts.
    let estimation = q
        .enqueue(&unauthorized_submit(a3, feed, "estimate", None))
        .await
        .unwrap();
    // Failed at broadcast: the node refuses a gas limit below the intrinsic 21,000.
    let refused = q
        .enqueue(&transfer(a2, "low-gas").gas(Some(20_000)))
        .await
        .unwrap();
    // Funding deadline expired.
    let expired = q
        .enqueue_with(
            &transfer(unfunded.address(), "too-late"),
            &EnqueueOptions::funding_pause(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let ids = [
        withdrawn, confirmed, confirmed2, reverted, estimation, refused, expired,
    ];
    tick_until(&q, "every request settled", async || {
        all_settled(&q, &ids).await
    })
    .await;
    let verdict = |id| {
        let q = &q;
        async move { q.status(id).await.unwrap().verdict.unwrap() }
    };
    assert_eq!(
        code(&verdict(withdrawn).await),
        Some(&FailureCode::Withdrawn)
    );
    assert!(matches!(
        verdict(confirmed).await,
        SettlementVerdict::Confirmed { .. }
    ));
    assert!(matches!(
        verdict(confirmed2).await,
        SettlementVerdict::Confirmed { .. }
    ));
    assert!(matches!(
        verdict(reverted).await,
        SettlementVerdict::Reverted { .. }
    ));
    assert_eq!(
        code(&verdict(estimation).await),
        Some(&FailureCode::ExecutionReverted)
    );
    assert_eq!(
        code(&verdict(refused).await),
        Some(&FailureCode::IntrinsicGasTooLow)
    );
    assert_eq!(
        code(&verdict(expired).await),
        Some(&FailureCode::FundingDeadlineExpired)
    );
    // More passes settle nothing again.
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    for id in ids {
        assert_eq!(f.records_of(id).await, 1, "request {id}");
    }
    f.assert_each_settled_request_recorded_once().await;
}

#[tokio::test]
async fn a_failing_sink_leaves_requests_unsettled_until_a_later_pass() {
    let f = Fixture::new().await;
    let feed = f.feed().await;
    let unfunded = PrivateKeySigner::random();
    let q = f.queue(&[1, 3, 5], std::slice::from_ref(&unfunded));
    let (a1, a3, a5) = (
        f.chain.account(1).unwrap(),
        f.chain.account(3).unwrap(),
        f.chain.account(5).unwrap(),
    );
    f.sink.fail.store(true, Ordering::SeqCst);

    // A withdrawal whose sink fails is rolled back and returned as an error.
    let withdrawn = q.enqueue(&transfer(a5, "op/w/1")).await.unwrap();
    let err =
        keel_txq::withdraw_by_key_prefix(f.db.pool(), q.chain_id(), "op/w/", Some(f.sink.as_ref()))
            .await
            .unwrap_err();
    assert!(matches!(err, TxqError::Sink(_)), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(
        q.status(withdrawn).await.unwrap().state,
        RequestState::Queued
    );
    assert_eq!(f.records_of(withdrawn).await, 0, "rolled back");
    f.sink.fail.store(false, Ordering::SeqCst);
    let w =
        keel_txq::withdraw_by_key_prefix(f.db.pool(), q.chain_id(), "op/w/", Some(f.sink.as_ref()))
            .await
            .unwrap();
    assert_eq!(w.withdrawn, vec![withdrawn]);
    assert_eq!(f.records_of(withdrawn).await, 1);
    f.sink.fail.store(true, Ordering::SeqCst);

    // Every pass path, while the sink fails.
    let confirmed = q.enqueue(&transfer(a1, "ok-1")).await.unwrap();
    let confirmed2 = q.enqueue(&transfer(a1, "ok-2")).await.unwrap();
    let estimation = q
        .enqueue(&unauthorized_submit(a3, feed, "estimate", None))
        .await
        .unwrap();
    let expired = q
        .enqueue_with(
            &transfer(unfunded.address(), "too-late"),
            &EnqueueOptions::funding_pause(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let ids = [confirmed, confirmed2, estimation, expired];
    tick_until(&q, "the sink was asked for every request", async || {
        ids.iter().all(|id| f.sink.asked(*id))
    })
    .await;
    // One more pass with the sink still failing: nothing wedges, nothing settles.
    q.tick().await.unwrap();
    for id in ids {
        let status = q.status(id).await.unwrap();
        assert_eq!(status.verdict, None, "request {id} stays unsettled");
        assert_eq!(f.records_of(id).await, 0, "rolled back: {id}");
    }
    assert_eq!(
        q.status(confirmed).await.unwrap().state,
        RequestState::Broadcast
    );
    assert_eq!(
        q.status(estimation).await.unwrap().state,
        RequestState::Queued
    );
    assert_eq!(
        q.status(expired).await.unwrap().state,
        RequestState::WaitingFunding
    );

    // Healthy again: the next passes settle each of them, and deliver each once.
    f.sink.fail.store(false, Ordering::SeqCst);
    tick_until(&q, "every request settled", async || {
        all_settled(&q, &ids).await
    })
    .await;
    q.tick().await.unwrap();
    for id in ids {
        assert_eq!(f.records_of(id).await, 1, "request {id}");
    }
    f.assert_each_settled_request_recorded_once().await;
}

#[tokio::test]
async fn a_request_the_sink_refuses_does_not_hold_back_its_batch() {
    let f = Fixture::new().await;
    let q = f.queue(&[1], &[]);
    let a1 = f.chain.account(1).unwrap();
    *f.sink.poison.lock().unwrap() = Some("poison".to_owned());
    let poisoned = q.enqueue(&transfer(a1, "poison")).await.unwrap();
    let others = [
        q.enqueue(&transfer(a1, "fine-1")).await.unwrap(),
        q.enqueue(&transfer(a1, "fine-2")).await.unwrap(),
    ];
    tick_until(&q, "the others settled", async || {
        all_settled(&q, &others).await
    })
    .await;
    assert!(f.sink.asked(poisoned));
    let status = q.status(poisoned).await.unwrap();
    assert_eq!(status.state, RequestState::Broadcast, "mined, not settled");
    assert_eq!(f.records_of(poisoned).await, 0);
    for id in others {
        assert_eq!(f.records_of(id).await, 1);
    }

    *f.sink.poison.lock().unwrap() = None;
    tick_until(&q, "the refused request settled", async || {
        all_settled(&q, &[poisoned]).await
    })
    .await;
    assert_eq!(f.records_of(poisoned).await, 1);
    f.assert_each_settled_request_recorded_once().await;
}

#[tokio::test]
async fn without_a_sink_settling_is_unchanged() {
    let f = Fixture::new().await;
    let pool = UpstreamPool::new(
        ChainId(f.chain.chain_id()),
        UpstreamConfig::new(vec![f.chain.endpoint().to_string()]),
    )
    .unwrap();
    let mut q = TxQueue::new(
        f.db.pool().clone(),
        Arc::new(pool),
        TxQueueConfig::default(),
    )
    .unwrap();
    q.add_signer(Arc::new(LocalSigner::new(
        f.chain.signer(1).unwrap().clone(),
    )));
    let a1 = f.chain.account(1).unwrap();
    let id = q.enqueue(&transfer(a1, "plain")).await.unwrap();
    let w = keel_txq::withdraw_by_key_prefix(f.db.pool(), q.chain_id(), "none/", None)
        .await
        .unwrap();
    assert!(w.withdrawn.is_empty() && w.in_flight.is_empty());
    tick_until(&q, "settled", async || all_settled(&q, &[id]).await).await;
    assert!(f.records().await.is_empty());
}

/// Issue 32 §10: a settled verdict that a reorg takes back (another transaction of the
/// sender takes its nonce on the new branch) becomes `REORGED_OUT` only once that
/// transaction is final (default finality: the node's `finalized` block, 64 below the
/// head on Anvil), and reaches the sink's `reorged` once, in the transaction that
/// stores it; a failing sink rolls it back until a later pass.
#[tokio::test]
async fn a_reorged_out_verdict_reaches_the_sink_once_and_only_when_final() {
    let f = Fixture::new().await;
    let sender = f.chain.account(6).unwrap();
    let q = f.queue(&[6], &[]);
    let id = q.enqueue(&transfer(sender, "reorged")).await.unwrap();
    tick_until(&q, "settled", async || all_settled(&q, &[id]).await).await;
    assert_eq!(f.records_of(id).await, 1);
    // The new branch: another transfer of the sender at the request's nonce.
    let raw = {
        use alloy::eips::Encodable2718;
        use keel_txq::TxSigner;
        let signer = LocalSigner::new(f.chain.signer(6).unwrap().clone());
        let tx = alloy::consensus::TxEip1559 {
            chain_id: f.chain.chain_id(),
            nonce: 0,
            gas_limit: 21_000,
            max_fee_per_gas: 100_000_000_000,
            max_priority_fee_per_gas: 1_000_000_000,
            to: alloy::primitives::TxKind::Call(Address::repeat_byte(0x99)),
            value: U256::from(5u64),
            access_list: Default::default(),
            input: Bytes::new(),
        };
        Bytes::from(signer.sign(tx.into()).await.unwrap().encoded_2718())
    };
    use alloy::providers::Provider;
    let p = f.chain.provider();
    p.raw_request::<_, ()>("anvil_reorg".into(), (1u64, vec![(raw, 0u64)]))
        .await
        .unwrap();
    for _ in 0..5 {
        q.tick().await.unwrap();
    }
    let reorged = |db: &TestDatabase| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sink_reorged")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(reorged(&f.db).await, 0, "not final yet: the verdict stands");
    assert!(matches!(
        q.status(id).await.unwrap().verdict,
        Some(SettlementVerdict::Confirmed { .. })
    ));
    p.raw_request::<_, ()>("anvil_mine".into(), (U256::from(70u64),))
        .await
        .unwrap();
    f.sink.fail.store(true, Ordering::SeqCst);
    q.tick().await.unwrap();
    assert!(
        matches!(
            q.status(id).await.unwrap().verdict,
            Some(SettlementVerdict::Confirmed { .. })
        ),
        "a failing sink rolls the change back"
    );
    f.sink.fail.store(false, Ordering::SeqCst);
    tick_until(&q, "reorged out", async || {
        matches!(
            q.status(id).await.unwrap().verdict,
            Some(SettlementVerdict::Failed { .. })
        )
    })
    .await;
    for _ in 0..3 {
        q.tick().await.unwrap();
    }
    let rows: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT verdict FROM sink_reorged ORDER BY verdict::text")
            .fetch_all(f.db.pool())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1, "once: {rows:?}");
    assert_eq!(rows[0]["code"], "REORGED_OUT");
    assert_eq!(
        code(&q.status(id).await.unwrap().verdict.unwrap()),
        Some(&FailureCode::ReorgedOut)
    );
}
