//! The transaction queue against real PostgreSQL and real Anvil.

use crate::common::{Transfer, transfer};
use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::{SolCall, SolInterface};
use anvil_tests::TestChain;
use keel_abi::bindings::PriceFeed;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    FailureCode, Finality, LocalSigner, RequestState, SettlementVerdict, TxQueue, TxQueueConfig,
    TxRequest, TxqError,
};
use keel_units::{ChainId, Wei};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

struct Fixture {
    chain: TestChain,
    db: TestDatabase,
}

impl Fixture {
    async fn new() -> Self {
        Self {
            chain: TestChain::start().await.unwrap(),
            db: TestDatabase::create().await.unwrap(),
        }
    }

    /// A fresh queue (as after a process restart) with signers for dev accounts `idx`.
    fn queue(&self, idx: &[usize]) -> TxQueue {
        self.queue_with(idx, local())
    }

    /// Turns automine off (nothing mines until `mine()`) and returns a queue for dev
    /// account `idx` that replaces a transaction as soon as it has no receipt
    /// (`bump_after = 0`).
    async fn stalled_queue(&self, idx: usize) -> TxQueue {
        self.stalled_queue_bumping_after(idx, Duration::ZERO).await
    }

    /// As [`Fixture::stalled_queue`], replacing after `bump_after`.
    async fn stalled_queue_bumping_after(&self, idx: usize, bump_after: Duration) -> TxQueue {
        self.chain
            .provider()
            .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
            .await
            .unwrap();
        self.queue_with(
            &[idx],
            TxQueueConfig {
                bump_after: Some(bump_after),
                ..local()
            },
        )
    }

    /// Moves request `id`'s signature (its attempts' `created_at`) an hour back.
    async fn backdate_signature(&self, id: Uuid) {
        sqlx::query(
            "UPDATE txq_attempt SET created_at = now() - interval '1 hour' WHERE request_id = $1",
        )
        .bind(id)
        .execute(self.db.pool())
        .await
        .unwrap();
    }

    /// Moves request `id`'s first broadcast an hour back.
    async fn backdate_broadcast(&self, id: Uuid) {
        sqlx::query(
            "UPDATE txq_request SET broadcast_at = now() - interval '1 hour' WHERE id = $1",
        )
        .bind(id)
        .execute(self.db.pool())
        .await
        .unwrap();
    }

    /// Attempts persisted for request `id`.
    async fn attempts(&self, id: Uuid) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM txq_attempt WHERE request_id = $1")
            .bind(id)
            .fetch_one(self.db.pool())
            .await
            .unwrap()
    }

    fn queue_with(&self, idx: &[usize], config: TxQueueConfig) -> TxQueue {
        let pool = UpstreamPool::new(
            ChainId(self.chain.chain_id()),
            UpstreamConfig::new(vec![self.chain.endpoint().to_string()]),
        )
        .unwrap();
        let mut q = TxQueue::new(self.db.pool().clone(), Arc::new(pool), config).unwrap();
        for i in idx {
            q.add_signer(Arc::new(LocalSigner::new(
                self.chain.signer(*i).unwrap().clone(),
            )));
        }
        q
    }
}

/// The queue's defaults with the local chain's finality (the head is final), as the
/// `chains.local` profile sets it for Anvil.
fn local() -> TxQueueConfig {
    TxQueueConfig {
        finality: Finality::Depth(0),
        ..TxQueueConfig::default()
    }
}

/// Sends a plain transfer from dev account `idx` outside Keel (as any wallet holding
/// the key would), at `nonce` when given, with fees far above the queue's (so it
/// replaces a pool transaction of the same nonce); returns its hash.
async fn outside_transfer(f: &Fixture, idx: usize, nonce: Option<u64>) -> alloy::primitives::B256 {
    let sender = f.chain.account(idx).unwrap();
    let mut tx = alloy::rpc::types::TransactionRequest::default()
        .from(sender)
        .to(Address::repeat_byte(0x99))
        .value(U256::from(5u64))
        .max_fee_per_gas(100_000_000_000)
        .max_priority_fee_per_gas(50_000_000_000);
    if let Some(n) = nonce {
        tx = tx.nonce(n);
    }
    *f.chain
        .provider_for(idx)
        .unwrap()
        .send_transaction(tx)
        .await
        .unwrap()
        .tx_hash()
}

/// Wei received by the queue's test recipient (`transfer`'s `to`).
async fn received(f: &Fixture) -> U256 {
    f.chain
        .provider()
        .get_balance(Address::repeat_byte(0x42))
        .await
        .unwrap()
}

/// Runs queue passes until every id is settled (bounded: a probe, not a sleep).
async fn settle_all(q: &TxQueue, ids: &[Uuid]) -> Vec<SettlementVerdict> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        q.tick().await.unwrap();
        let mut verdicts = Vec::new();
        for id in ids {
            if let Some(v) = q.status(*id).await.unwrap().verdict {
                verdicts.push(v);
            }
        }
        if verdicts.len() == ids.len() {
            return verdicts;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} settled",
            verdicts.len(),
            ids.len()
        );
    }
}

fn confirmed_nonce(v: &SettlementVerdict) -> u64 {
    match v {
        SettlementVerdict::Confirmed { attempts, .. } => attempts[0].nonce,
        other => panic!("expected confirmed, got {other:?}"),
    }
}

#[tokio::test]
async fn enqueue_is_idempotent_and_conflicts_on_other_payload() {
    let f = Fixture::new().await;
    let q = f.queue(&[0]);
    let sender = f.chain.account(0).unwrap();
    let a = q.enqueue(&transfer(sender, "k1")).await.unwrap();
    assert_eq!(q.enqueue(&transfer(sender, "k1")).await.unwrap(), a);
    assert!(matches!(
        q.enqueue(&transfer(sender, "k1").worth(2)).await,
        Err(TxqError::IdempotencyConflict)
    ));
    assert!(matches!(
        q.enqueue(&transfer(sender, "")).await,
        Err(TxqError::InvalidRequest("idempotency_key"))
    ));
    let b = q.enqueue(&transfer(sender, "k2")).await.unwrap();
    assert_ne!(a, b);
    settle_all(&q, &[a, b]).await;
    // After settlement the key still answers with the same request, not a new one.
    assert_eq!(q.enqueue(&transfer(sender, "k1")).await.unwrap(), a);
    assert_eq!(
        f.chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        2
    );
}

#[tokio::test]
async fn five_senders_times_two_hundred_confirm_with_contiguous_nonces() {
    let f = Fixture::new().await;
    let senders: Vec<usize> = (1..=5).collect();
    let q = Arc::new(f.queue(&senders));
    let mut tasks = Vec::new();
    for s in &senders {
        let sender = f.chain.account(*s).unwrap();
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..200 {
                ids.push(
                    q.enqueue(&transfer(sender, &format!("req-{i}")).worth(i + 1))
                        .await
                        .unwrap(),
                );
            }
            ids
        }));
    }
    let mut per_sender = Vec::new();
    for t in tasks {
        per_sender.push(t.await.unwrap());
    }
    let all: Vec<Uuid> = per_sender.iter().flatten().copied().collect();
    settle_all(&q, &all).await;
    for (s, ids) in senders.iter().zip(&per_sender) {
        let mut nonces = Vec::new();
        for id in ids {
            nonces.push(confirmed_nonce(
                &q.status(*id).await.unwrap().verdict.unwrap(),
            ));
        }
        nonces.sort_unstable();
        assert_eq!(
            nonces,
            (0..200).collect::<Vec<u64>>(),
            "contiguous, no duplicates"
        );
        let on_chain = f
            .chain
            .provider()
            .get_transaction_count(f.chain.account(*s).unwrap())
            .await
            .unwrap();
        assert_eq!(on_chain, 200, "exactly one transaction per request");
    }
}

#[tokio::test]
async fn crash_between_persist_and_broadcast_sends_the_same_bytes_once() {
    let f = Fixture::new().await;
    let sender = f.chain.account(0).unwrap();
    let ids = {
        let q = f.queue(&[0]);
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(
                q.enqueue(&transfer(sender, &format!("c{i}")).worth(7))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(q.sign_pending(sender).await.unwrap(), 3);
        for id in &ids {
            assert_eq!(q.status(*id).await.unwrap().state, RequestState::Signed);
        }
        // The process dies here: signed and persisted, nothing broadcast.
        assert_eq!(
            f.chain
                .provider()
                .get_transaction_count(sender)
                .await
                .unwrap(),
            0
        );
        ids
    };
    let persisted: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT tx_hash FROM txq_attempt ORDER BY nonce")
            .fetch_all(f.db.pool())
            .await
            .unwrap();
    let restarted = f.queue(&[0]);
    let verdicts = settle_all(&restarted, &ids).await;
    for (v, hash) in verdicts.iter().zip(&persisted) {
        match v {
            SettlementVerdict::Confirmed {
                hash: mined,
                attempts,
                ..
            } => {
                assert_eq!(
                    mined.as_slice(),
                    hash.as_slice(),
                    "the persisted bytes were broadcast"
                );
                assert_eq!(attempts.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        f.chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        3
    );
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM txq_attempt")
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    assert_eq!(attempts, 3, "no second signature");
}

#[tokio::test]
async fn estimation_revert_fails_without_consuming_a_nonce() {
    let f = Fixture::new().await;
    let admin = f.chain.account(0).unwrap();
    let feed = PriceFeed::deploy(
        f.chain.provider().clone(),
        8u8,
        "X".to_owned(),
        admin,
        admin,
    )
    .await
    .unwrap();
    let outsider = f.chain.account(3).unwrap();
    let q = f.queue(&[3]);
    let bad = q
        .enqueue(&TxRequest {
            sender: outsider,
            idempotency_key: "submit".into(),
            to: Some(*feed.address()),
            value: Wei::ZERO,
            data: PriceFeed::submitCall {
                answer: alloy::primitives::I256::ONE,
            }
            .abi_encode()
            .into(),
            gas_limit: None,
            authorization_list: Vec::new(),
        })
        .await
        .unwrap();
    let good = q.enqueue(&transfer(outsider, "after")).await.unwrap();
    let verdicts = settle_all(&q, &[bad, good]).await;
    match &verdicts[0] {
        SettlementVerdict::Failed {
            code,
            revert_data,
            attempts,
            ..
        } => {
            assert_eq!(*code, FailureCode::ExecutionReverted);
            assert!(attempts.is_empty());
            let data = revert_data.as_ref().unwrap();
            assert!(matches!(
                PriceFeed::PriceFeedErrors::abi_decode(data),
                Ok(PriceFeed::PriceFeedErrors::AccessControlUnauthorizedAccount(_))
            ));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        confirmed_nonce(&verdicts[1]),
        0,
        "the failed request took no nonce"
    );
}

#[tokio::test]
async fn mined_revert_is_a_reverted_verdict_with_its_error() {
    let f = Fixture::new().await;
    let admin = f.chain.account(0).unwrap();
    let feed = PriceFeed::deploy(
        f.chain.provider().clone(),
        8u8,
        "X".to_owned(),
        admin,
        admin,
    )
    .await
    .unwrap();
    let outsider = f.chain.account(4).unwrap();
    let q = f.queue(&[4]);
    // A fixed gas limit skips estimation, so the revert happens on chain.
    let id = q
        .enqueue(&TxRequest {
            sender: outsider,
            idempotency_key: "submit".into(),
            to: Some(*feed.address()),
            value: Wei::ZERO,
            data: PriceFeed::submitCall {
                answer: alloy::primitives::I256::ONE,
            }
            .abi_encode()
            .into(),
            gas_limit: Some(100_000),
            authorization_list: Vec::new(),
        })
        .await
        .unwrap();
    match &settle_all(&q, &[id]).await[0] {
        SettlementVerdict::Reverted {
            revert_data,
            attempts,
            ..
        } => {
            assert_eq!(attempts.len(), 1);
            let data = revert_data.as_ref().unwrap();
            assert!(matches!(
                PriceFeed::PriceFeedErrors::abi_decode(data),
                Ok(PriceFeed::PriceFeedErrors::AccessControlUnauthorizedAccount(_))
            ));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn unfunded_sender_fails_gas_required_without_a_nonce() {
    let f = Fixture::new().await;
    let poor = PrivateKeySigner::random();
    let address = poor.address();
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
    q.add_signer(Arc::new(LocalSigner::new(poor)));
    let id = q.enqueue(&transfer(address, "x")).await.unwrap();
    match &settle_all(&q, &[id]).await[0] {
        SettlementVerdict::Failed { code, attempts, .. } => {
            assert_eq!(*code, FailureCode::GasRequired);
            assert!(attempts.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let next: i64 = sqlx::query_scalar("SELECT next_nonce FROM txq_sender")
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    assert_eq!(next, 0);
}

/// Issue 32 §3: a request signed (persisted, not yet sent) when another transaction
/// from its key takes its nonce is re-signed at a fresh nonce, not failed: none of its
/// attempts can ever be mined, so the new signature is its only effect.
#[tokio::test]
async fn nonce_taken_by_another_transaction_re_signs_the_request_at_a_fresh_nonce() {
    let f = Fixture::new().await;
    let sender = f.chain.account(5).unwrap();
    let q = f.queue(&[5]);
    let id = q.enqueue(&transfer(sender, "mine")).await.unwrap();
    q.sign_pending(sender).await.unwrap();
    // Before Keel broadcasts, something else uses nonce 0 of the same account.
    let other = outside_transfer(&f, 5, Some(0)).await;
    let p = f.chain.provider();
    // Mined by automine; its receipt can lag the send on a loaded machine.
    keel_store::testing::until(
        "the outside transaction's receipt",
        std::time::Duration::from_secs(30),
        || async { p.get_transaction_receipt(other).await.map(|r| r.is_some()) },
    )
    .await;
    match &settle_all(&q, &[id]).await[0] {
        SettlementVerdict::Confirmed { attempts, hash, .. } => {
            assert_eq!(
                attempts.len(),
                2,
                "the first signature and the re-signed one"
            );
            assert_eq!(attempts[0].nonce, 0);
            assert_eq!(attempts[1].nonce, 1, "the next free nonce");
            assert_eq!(*hash, attempts[1].hash);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 2);
    assert_eq!(received(&f).await, U256::from(1u64), "exactly one effect");
}

/// Issue 32 §3, the input: the queue is idle, a transaction is sent from the
/// sender's key outside Keel, then a request is recorded. The idle sender adopts the
/// chain's nonce before signing: the request confirms with its first signature.
#[tokio::test]
async fn an_outside_transaction_while_idle_is_adopted_before_the_next_request_signs() {
    let f = Fixture::new().await;
    let sender = f.chain.account(4).unwrap();
    let q = f.queue(&[4]);
    let first = q.enqueue(&transfer(sender, "first")).await.unwrap();
    assert_eq!(confirmed_nonce(&settle_all(&q, &[first]).await[0]), 0);
    // Idle; one plain transaction from the same key, outside Keel (nonce 1).
    let hash = outside_transfer(&f, 4, None).await;
    let p = f.chain.provider();
    // Mined by automine; its receipt can lag the send on a loaded machine.
    keel_store::testing::until(
        "the outside transaction's receipt",
        std::time::Duration::from_secs(30),
        || async { p.get_transaction_receipt(hash).await.map(|r| r.is_some()) },
    )
    .await;
    let mint = q.enqueue(&transfer(sender, "mint").worth(2)).await.unwrap();
    match &settle_all(&q, &[mint]).await[0] {
        SettlementVerdict::Confirmed { attempts, .. } => {
            assert_eq!(attempts.len(), 1, "signed at the adopted nonce, no re-sign");
            assert_eq!(attempts[0].nonce, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 3);
    assert_eq!(received(&f).await, U256::from(3u64), "each request once");
}

/// Issue 32 §3, busy queue: three requests wait in the pool (nonces 0..=2) when an
/// outside transaction replaces the middle one (same nonce, higher fees) and mines.
/// The requests at 0 and 2 confirm as signed; the one whose nonce was taken is
/// re-signed at nonce 3. Each request takes effect exactly once.
#[tokio::test]
async fn an_outside_transaction_while_busy_re_signs_only_the_request_it_displaced() {
    let f = Fixture::new().await;
    let sender = f.chain.account(3).unwrap();
    let q = f
        .stalled_queue_bumping_after(3, Duration::from_secs(3600))
        .await;
    let ids = [
        q.enqueue(&transfer(sender, "a")).await.unwrap(),
        q.enqueue(&transfer(sender, "b").worth(2)).await.unwrap(),
        q.enqueue(&transfer(sender, "c").worth(4)).await.unwrap(),
    ];
    q.tick().await.unwrap();
    for id in ids {
        assert_eq!(q.status(id).await.unwrap().state, RequestState::Broadcast);
    }
    outside_transfer(&f, 3, Some(1)).await;
    f.chain.mine().await.unwrap();
    let p = f.chain.provider();
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 3);
    p.raw_request::<_, ()>("evm_setAutomine".into(), (true,))
        .await
        .unwrap();
    let verdicts = settle_all(&q, &ids).await;
    let nonces: Vec<Vec<u64>> = verdicts
        .iter()
        .map(|v| match v {
            SettlementVerdict::Confirmed { attempts, hash, .. } => {
                assert_eq!(attempts.last().unwrap().hash, *hash);
                attempts.iter().map(|a| a.nonce).collect()
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(nonces, vec![vec![0], vec![1, 3], vec![2]]);
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 4);
    assert_eq!(received(&f).await, U256::from(7u64), "each request once");
}

/// Issue 32 §3, Keel's counter above the chain's, busy: a pool drops the transaction
/// at nonce 0 while nonce 1 waits behind it. The same bytes go out again (nothing is
/// re-signed: the nonce is free and the attempt may still be anywhere).
#[tokio::test]
async fn a_dropped_transaction_below_a_waiting_one_is_re_sent_with_the_same_bytes() {
    let f = Fixture::new().await;
    let sender = f.chain.account(2).unwrap();
    let q = f
        .stalled_queue_bumping_after(2, Duration::from_secs(3600))
        .await;
    let a = q.enqueue(&transfer(sender, "a")).await.unwrap();
    let b = q.enqueue(&transfer(sender, "b").worth(2)).await.unwrap();
    q.tick().await.unwrap();
    let hash: Vec<u8> = sqlx::query_scalar("SELECT tx_hash FROM txq_attempt WHERE request_id = $1")
        .bind(a)
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    let p = f.chain.provider();
    p.raw_request::<_, serde_json::Value>(
        "anvil_dropTransaction".into(),
        (alloy::primitives::B256::try_from(hash.as_slice()).unwrap(),),
    )
    .await
    .unwrap();
    f.chain.mine().await.unwrap();
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 0, "a gap");
    p.raw_request::<_, ()>("evm_setAutomine".into(), (true,))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let verdicts = loop {
        q.tick().await.unwrap();
        let (va, vb) = (
            q.status(a).await.unwrap().verdict,
            q.status(b).await.unwrap().verdict,
        );
        if let (Some(va), Some(vb)) = (va, vb) {
            break [va, vb];
        }
        // b was accepted while automine was off: a block mines it once a is back.
        f.chain.mine().await.unwrap();
        assert!(Instant::now() < deadline, "never settled");
    };
    for (v, nonce) in verdicts.iter().zip([0, 1]) {
        match v {
            SettlementVerdict::Confirmed { attempts, .. } => {
                assert_eq!(attempts.len(), 1, "the same bytes, no re-sign");
                assert_eq!(attempts[0].nonce, nonce);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 2);
    assert_eq!(received(&f).await, U256::from(3u64));
}

/// Issue 32 §3, Keel's counter above the chain's while idle: two requests failed after
/// signing (their nonces 0 and 1 are held by no node). Before the next request signs,
/// the idle sender's gap is filled, so it confirms without waiting for the periodic
/// recovery.
#[tokio::test]
async fn an_idle_sender_above_the_chain_fills_its_gap_before_signing() {
    let f = Fixture::new().await;
    let sender = f.chain.account(1).unwrap();
    let q = f.queue(&[1]);
    let a = q.enqueue(&transfer(sender, "a")).await.unwrap();
    let b = q.enqueue(&transfer(sender, "b").worth(2)).await.unwrap();
    assert_eq!(q.sign_pending(sender).await.unwrap(), 2);
    // Both fail after signing (as a node refusal at broadcast settles them).
    sqlx::query(
        "UPDATE txq_request SET state = 'settled', settled_at = now(), verdict_kind = 'failed',
                verdict = '{\"kind\":\"failed\",\"code\":\"REJECTED\",\"reason\":null,\"revertData\":null,\"attempts\":[]}'
          WHERE id = ANY($1)",
    )
    .bind(vec![a, b])
    .execute(f.db.pool())
    .await
    .unwrap();
    let c = q.enqueue(&transfer(sender, "c").worth(4)).await.unwrap();
    // `tick` runs no periodic recovery: only the reconciliation before signing can
    // fill the gap.
    let mut verdict = None;
    for _ in 0..20 {
        q.tick().await.unwrap();
        verdict = q.status(c).await.unwrap().verdict;
        if verdict.is_some() {
            break;
        }
    }
    assert_eq!(confirmed_nonce(&verdict.expect("settled")), 2);
    let p = f.chain.provider();
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 3);
    assert_eq!(
        received(&f).await,
        U256::from(4u64),
        "only c paid the recipient"
    );
}

/// Issue 32 §3, the safety rule: a request whose nonce another transaction took is
/// re-signed only once that transaction is final (here 3 blocks deep): before, a reorg
/// could still take it back and let one of the request's own attempts mine.
#[tokio::test]
async fn a_taken_nonce_is_re_signed_only_once_the_taking_transaction_is_final() {
    let f = Fixture::new().await;
    let sender = f.chain.account(6).unwrap();
    let q = f.queue_with(
        &[6],
        TxQueueConfig {
            finality: Finality::Depth(3),
            ..TxQueueConfig::default()
        },
    );
    let id = q.enqueue(&transfer(sender, "mine")).await.unwrap();
    q.sign_pending(sender).await.unwrap();
    outside_transfer(&f, 6, Some(0)).await;
    for _ in 0..5 {
        q.tick().await.unwrap();
    }
    assert_eq!(f.attempts(id).await, 1, "not final yet: not re-signed");
    let status = q.status(id).await.unwrap();
    assert!(status.verdict.is_none(), "{status:?}");
    for _ in 0..3 {
        f.chain.mine().await.unwrap();
    }
    match &settle_all(&q, &[id]).await[0] {
        SettlementVerdict::Confirmed { attempts, .. } => {
            assert_eq!(attempts.len(), 2);
            assert_eq!(attempts[1].nonce, 1);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(received(&f).await, U256::from(1u64), "exactly one effect");
}

#[tokio::test]
async fn reorg_before_the_confirmation_depth_puts_the_request_back_in_flight() {
    let f = Fixture::new().await;
    let sender = f.chain.account(6).unwrap();
    let config = TxQueueConfig {
        confirmations: 3,
        ..TxQueueConfig::default()
    };
    let q = f.queue_with(&[6], config);
    let id = q
        .enqueue(&transfer(sender, "reorged").worth(9))
        .await
        .unwrap();
    q.tick().await.unwrap();
    let p = f.chain.provider();
    let hash: Vec<u8> = sqlx::query_scalar("SELECT tx_hash FROM txq_attempt")
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    let hash = alloy::primitives::B256::try_from(hash.as_slice()).unwrap();
    let first = p
        .get_transaction_receipt(hash)
        .await
        .unwrap()
        .expect("mined by automine");
    let first_block = first.block_number.unwrap();
    assert_eq!(
        q.status(id).await.unwrap().state,
        RequestState::Broadcast,
        "one block deep is not settled"
    );

    // Replace the head block with an empty one: the transaction leaves the chain.
    p.raw_request::<_, ()>("anvil_reorg".into(), (1u64, Vec::<(Bytes, u64)>::new()))
        .await
        .unwrap();
    assert!(
        p.get_transaction_receipt(hash).await.unwrap().is_none(),
        "receipt removed by the reorg"
    );

    // The queue re-broadcasts the same bytes; mine until it is deep enough.
    let deadline = Instant::now() + Duration::from_secs(60);
    let verdict = loop {
        q.tick().await.unwrap();
        if let Some(v) = q.status(id).await.unwrap().verdict {
            break v;
        }
        f.chain.mine().await.unwrap();
        assert!(Instant::now() < deadline, "never settled after the reorg");
    };
    match verdict {
        SettlementVerdict::Confirmed {
            hash: mined,
            attempts,
            block,
            ..
        } => {
            assert_eq!(mined, hash, "same signed bytes");
            assert_eq!(attempts.len(), 1, "no new attempt, same nonce");
            assert_eq!(attempts[0].nonce, 0);
            assert_ne!(
                block, first_block,
                "confirmed in the new chain, not the reorged block"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 1);
}

#[tokio::test]
async fn stuck_transaction_is_replaced_with_bumped_fees_and_one_attempt_mines() {
    let f = Fixture::new().await;
    let sender = f.chain.account(7).unwrap();
    let p = f.chain.provider();
    let q = f.stalled_queue(7).await;
    let suffix = keel_chain::AttributionSuffix::new(&["keel"]).unwrap();
    let mut req = transfer(sender, "stuck").worth(3);
    req.data = suffix.append_to(&[]);
    req.gas_limit = Some(30_000);
    let id = q.enqueue(&req).await.unwrap();
    // With `bump_after = 0` every confirmation pass replaces: the first tick signs and
    // broadcasts attempt 1 and its confirmation pass replaces it by attempt 2; the
    // second tick adds attempt 3. No block is mined meanwhile.
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    f.chain.mine().await.unwrap();
    let verdict = settle_all(&q, &[id]).await.remove(0);
    let rows: Vec<(Vec<u8>, String, String, i64)> = sqlx::query_as(
        "SELECT raw, max_fee_per_gas, max_priority_fee_per_gas, nonce FROM txq_attempt ORDER BY attempt",
    )
    .fetch_all(f.db.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    for pair in rows.windows(2) {
        let (prev_max, next_max): (u128, u128) =
            (pair[0].1.parse().unwrap(), pair[1].1.parse().unwrap());
        let (prev_tip, next_tip): (u128, u128) =
            (pair[0].2.parse().unwrap(), pair[1].2.parse().unwrap());
        assert!(
            next_max * 100 >= prev_max * 110,
            "max fee +10 %: {prev_max} -> {next_max}"
        );
        assert!(
            next_tip * 100 >= prev_tip * 110,
            "tip +10 %: {prev_tip} -> {next_tip}"
        );
        assert_eq!(pair[0].3, pair[1].3, "same nonce");
    }
    for (raw, ..) in &rows {
        use alloy::consensus::Transaction as _;
        use alloy::eips::Decodable2718;
        let tx = alloy::consensus::TxEnvelope::decode_2718(&mut raw.as_slice()).unwrap();
        assert_eq!(
            tx.input(),
            suffix.bytes(),
            "suffix identical on every attempt"
        );
    }
    match verdict {
        SettlementVerdict::Confirmed { hash, attempts, .. } => {
            assert_eq!(attempts.len(), 3);
            assert!(
                attempts.iter().any(|a| a.hash == hash),
                "one of our attempts mined"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        p.get_transaction_count(sender).await.unwrap(),
        1,
        "exactly one transaction took effect"
    );
}

#[tokio::test]
async fn fee_bumping_counts_from_the_broadcast_not_from_the_signature() {
    let f = Fixture::new().await;
    let sender = f.chain.account(6).unwrap();
    let p = f.chain.provider();
    let q = f
        .stalled_queue_bumping_after(6, Duration::from_secs(60))
        .await;
    let id = q.enqueue(&transfer(sender, "late")).await.unwrap();
    assert_eq!(q.sign_pending(sender).await.unwrap(), 1);
    // Signed an hour before its broadcast, as behind a long backlog.
    f.backdate_signature(id).await;
    assert_eq!(q.sender_pass(sender).await.unwrap(), 1);
    assert_eq!(q.status(id).await.unwrap().state, RequestState::Broadcast);
    // Unmined (automine is off), but sent just now: not stuck.
    q.confirm_pass().await.unwrap();
    assert_eq!(
        f.attempts(id).await,
        1,
        "not replaced right after its broadcast"
    );
    // Unmined for longer than `bump_after` since the broadcast: replaced.
    f.backdate_broadcast(id).await;
    q.confirm_pass().await.unwrap();
    assert_eq!(
        f.attempts(id).await,
        2,
        "replaced once stuck since its broadcast"
    );
    f.chain.mine().await.unwrap();
    let verdict = settle_all(&q, &[id]).await.remove(0);
    assert_eq!(confirmed_nonce(&verdict), 0);
    assert_eq!(
        p.get_transaction_count(sender).await.unwrap(),
        1,
        "exactly one transaction took effect"
    );
}

#[tokio::test]
async fn a_sender_whose_transactions_keep_being_included_is_not_bumped() {
    let f = Fixture::new().await;
    let sender = f.chain.account(5).unwrap();
    let p = f.chain.provider();
    let q = f
        .stalled_queue_bumping_after(5, Duration::from_secs(60))
        .await;
    let a = q.enqueue(&transfer(sender, "first")).await.unwrap();
    // Signed and broadcast: two moves.
    assert_eq!(q.sender_pass(sender).await.unwrap(), 2);
    f.chain.mine().await.unwrap();
    let b = q
        .enqueue(&transfer(sender, "second").worth(2))
        .await
        .unwrap();
    assert_eq!(q.sender_pass(sender).await.unwrap(), 2);
    // b has waited an hour since its broadcast by the clock, but a (nonce 0) was only
    // just included: the sender is moving and b is next in line, not stuck.
    f.backdate_signature(b).await;
    f.backdate_broadcast(b).await;
    q.confirm_pass().await.unwrap();
    assert!(q.status(a).await.unwrap().verdict.is_some(), "a settled");
    assert_eq!(
        f.attempts(b).await,
        1,
        "not replaced while its sender's transactions are included"
    );
    f.chain.mine().await.unwrap();
    let verdict = settle_all(&q, &[b]).await.remove(0);
    assert_eq!(confirmed_nonce(&verdict), 1);
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 2);
}

#[tokio::test]
async fn nonce_recovery_fills_a_gap_left_by_a_request_that_failed_after_signing() {
    let f = Fixture::new().await;
    let sender = f.chain.account(8).unwrap();
    let q = f.queue(&[8]);
    let a = q.enqueue(&transfer(sender, "a")).await.unwrap();
    let b = q.enqueue(&transfer(sender, "b").worth(2)).await.unwrap();
    assert_eq!(q.sign_pending(sender).await.unwrap(), 2);
    // Request a (nonce 0) fails after signing (as a node refusal at broadcast would
    // settle it); its nonce is now a hole below b's.
    sqlx::query(
        "UPDATE txq_request SET state = 'settled', settled_at = now(), verdict_kind = 'failed',
                verdict = '{\"kind\":\"failed\",\"code\":\"REJECTED\",\"reason\":null,\"revertData\":null,\"attempts\":[]}'
          WHERE id = $1",
    )
    .bind(a)
    .execute(f.db.pool())
    .await
    .unwrap();
    q.tick().await.unwrap();
    let p = f.chain.provider();
    assert_eq!(
        p.get_transaction_count(sender).await.unwrap(),
        0,
        "b waits behind the gap"
    );
    assert_eq!(q.status(b).await.unwrap().state, RequestState::Broadcast);

    assert_eq!(q.recover_nonces(sender).await.unwrap(), (false, 1));
    assert_eq!(q.recover_nonces(sender).await.unwrap().1, 0, "filled once");
    let verdict = settle_all(&q, &[b]).await.remove(0);
    assert_eq!(confirmed_nonce(&verdict), 1);
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 2);
    let (to, value): (Vec<u8>, String) = sqlx::query_as(
        "SELECT to_address, value_wei FROM txq_request WHERE idempotency_key = 'keel:nonce-gap-fill:0'",
    )
    .fetch_one(f.db.pool())
    .await
    .unwrap();
    assert_eq!(to, sender.to_vec(), "a self-transfer");
    assert_eq!(value, "0");
}

#[tokio::test]
async fn nonce_advanced_outside_keel_is_adopted() {
    let f = Fixture::new().await;
    let sender = f.chain.account(9).unwrap();
    let q = f.queue(&[9]);
    let first = q.enqueue(&transfer(sender, "first")).await.unwrap();
    settle_all(&q, &[first]).await;
    f.chain
        .provider()
        .raw_request::<_, ()>("anvil_setNonce".into(), (sender, U256::from(10u64)))
        .await
        .unwrap();
    assert_eq!(q.recover_nonces(sender).await.unwrap(), (true, 0));
    let next = q.enqueue(&transfer(sender, "next")).await.unwrap();
    let verdict = settle_all(&q, &[next]).await.remove(0);
    assert_eq!(confirmed_nonce(&verdict), 10);
}

/// Compile-time: the loop's future is `Send`, so an `Arc<TxQueue>` runs it with
/// `tokio::spawn` (no `spawn_blocking` + `Handle::block_on` needed).
#[allow(dead_code)]
fn run_future_is_send(queue: Arc<TxQueue>, token: tokio_util::sync::CancellationToken) {
    fn assert_send<T: Send>(_: T) {}
    assert_send(queue.run(token.clone()));
    assert_send(async move { queue.run(token).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_run_loop_wakes_on_enqueue_and_keeps_the_confirmation_interval() {
    // The loop's runs, counted by service (`keel_service_runs_total`): what makes "the
    // first tick went by" and "the confirmation pass did not run again" observable. The
    // recorder is the process's: nextest runs each test in a process of its own, so the
    // counts are this test's loop's (under plain `cargo test`, other tests' loops in the
    // same binary would add to them).
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    let runs = |service: &str| -> u64 {
        let label = format!("service=\"{service}\"");
        metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("keel_service_runs_total{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let until_runs = async |service: &str, n: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while runs(service) < n {
            assert!(
                Instant::now() < deadline,
                "{service} did not reach {n} runs"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let f = Fixture::new().await;
    let sender = f.chain.account(1).unwrap();
    // An interval no test waits for: only the wake-up can move the request after the
    // loop's first tick.
    let q = Arc::new(f.queue_with(
        &[1],
        TxQueueConfig {
            poll_interval: Duration::from_secs(3600),
            ..TxQueueConfig::default()
        },
    ));
    let token = tokio_util::sync::CancellationToken::new();
    let handle = tokio::spawn({
        let q = q.clone();
        let token = token.clone();
        async move { q.run(token).await }
    });
    // The first tick (recovery, an empty round, an empty confirmation pass) went by.
    until_runs("txq-rounds", 1).await;
    until_runs("txq-confirm", 1).await;
    let confirm_runs = runs("txq-confirm");
    let round_runs = runs("txq-rounds");
    let id = q.enqueue(&transfer(sender, "woken")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = q.status(id).await.unwrap();
        if status.state == RequestState::Broadcast {
            assert_eq!(status.nonce, Some(0));
            break;
        }
        assert_ne!(
            status.state,
            RequestState::Settled,
            "only the confirmation pass settles"
        );
        assert!(
            Instant::now() < deadline,
            "the enqueue did not wake the loop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Mined (automine), but the confirmation pass keeps its interval.
    assert_eq!(
        f.chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        1
    );
    // The woken rounds are done (the one that signed, then one that found nothing), and
    // the confirmation pass has not run since the first tick.
    until_runs("txq-rounds", round_runs + 2).await;
    assert_eq!(
        runs("txq-confirm"),
        confirm_runs,
        "the wake ran the confirmation pass"
    );
    assert_eq!(q.status(id).await.unwrap().state, RequestState::Broadcast);
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("the loop stops on cancel")
        .unwrap();
    // A tick settles it.
    let verdict = settle_all(&q, &[id]).await.remove(0);
    assert_eq!(confirmed_nonce(&verdict), 0);
}

#[tokio::test]
async fn concurrent_enqueues_stay_idempotent() {
    let f = Fixture::new().await;
    let q = f.queue(&[0]);
    let sender = f.chain.account(0).unwrap();
    // Every key twice with the same payload, plus one conflicting payload, at once.
    let reqs: Vec<TxRequest> = (0..64)
        .map(|i| transfer(sender, &format!("c{}", i % 32)))
        .chain(std::iter::once(transfer(sender, "c0").worth(2)))
        .collect();
    let results = futures::future::join_all(reqs.iter().map(|r| q.enqueue(r))).await;
    let mut by_key: std::collections::HashMap<(String, U256), Vec<&Result<Uuid, TxqError>>> =
        std::collections::HashMap::new();
    for (r, res) in reqs.iter().zip(&results) {
        by_key
            .entry((r.idempotency_key.clone(), r.value.get()))
            .or_default()
            .push(res);
    }
    for ((key, value), res) in &by_key {
        if key == "c0" {
            continue;
        }
        assert_eq!(*value, U256::from(1u64));
        let (a, b) = (res[0].as_ref().unwrap(), res[1].as_ref().unwrap());
        assert_eq!(a, b, "the same key answers with the same request");
    }
    // `c0`: whichever payload was recorded first wins; the other one conflicts.
    let same = &by_key[&("c0".to_owned(), U256::from(1u64))];
    let other = &by_key[&("c0".to_owned(), U256::from(2u64))];
    if other[0].is_ok() {
        assert!(
            same.iter()
                .all(|r| matches!(r, Err(TxqError::IdempotencyConflict)))
        );
    } else {
        assert!(matches!(other[0], Err(TxqError::IdempotencyConflict)));
        assert_eq!(same[0].as_ref().unwrap(), same[1].as_ref().unwrap());
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM txq_request")
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    assert_eq!(rows, 32);
}

#[tokio::test]
async fn concurrent_enqueues_share_commits_and_each_returns_its_own_durable_row() {
    let f = Fixture::new().await;
    let q = f.queue(&[0]);
    let sender = f.chain.account(0).unwrap();
    let reqs: Vec<TxRequest> = (0..64)
        .map(|i| transfer(sender, &format!("g{i}")).worth(i + 1))
        .collect();
    let ids: Vec<Uuid> = futures::future::join_all(reqs.iter().map(|r| q.enqueue(r)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let distinct: std::collections::HashSet<&Uuid> = ids.iter().collect();
    assert_eq!(distinct.len(), 64, "one request per key");
    // Every id handed out is committed, with its own payload.
    for (r, id) in reqs.iter().zip(&ids) {
        let value: String = sqlx::query_scalar(
            "SELECT value_wei FROM txq_request WHERE id = $1 AND idempotency_key = $2",
        )
        .bind(id)
        .bind(&r.idempotency_key)
        .fetch_one(f.db.pool())
        .await
        .unwrap();
        assert_eq!(value, r.value.get().to_string());
    }
    // Group commit: the 64 rows were written by fewer statements than requests (rows
    // of one statement share its transaction timestamp).
    let statements: i64 = sqlx::query_scalar("SELECT count(DISTINCT created_at) FROM txq_request")
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    assert!(statements < 64, "{statements} statements for 64 enqueues");
}

#[tokio::test]
async fn batched_broadcasts_confirm_in_order_and_a_refused_item_settles_alone() {
    let f = Fixture::new().await;
    let sender = f.chain.account(7).unwrap();
    let q = f.queue_with(
        &[7],
        TxQueueConfig {
            broadcast_batch: 8,
            ..TxQueueConfig::default()
        },
    );
    let mut ids = Vec::new();
    for i in 0..15 {
        ids.push(
            q.enqueue(&transfer(sender, &format!("b{i}")).worth(i + 1))
                .await
                .unwrap(),
        );
    }
    // Last (no later nonce waits behind its gap): a gas limit below a transfer's
    // intrinsic 21,000, which the node refuses in the same JSON-RPC batch as 7 others.
    let mut low = transfer(sender, "low-gas");
    low.gas_limit = Some(20_000);
    let low = q.enqueue(&low).await.unwrap();
    let mut all = ids.clone();
    all.push(low);
    let verdicts = settle_all(&q, &all).await;
    let mut nonces: Vec<u64> = verdicts[..15].iter().map(confirmed_nonce).collect();
    nonces.sort_unstable();
    assert_eq!(nonces, (0..15).collect::<Vec<u64>>());
    match &verdicts[15] {
        SettlementVerdict::Failed { code, .. } => {
            assert_eq!(*code, FailureCode::IntrinsicGasTooLow)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f.chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        15,
        "exactly one transaction per accepted request"
    );
}

/// A signer that, on its first signature, lets another queue process (`rival`) sign
/// and commit `contested`'s queued requests first: the signatures this queue is making
/// then start at a nonce that is no longer next.
struct RacedSigner {
    inner: LocalSigner,
    rival: Arc<TxQueue>,
    contested: Address,
    fired: std::sync::atomic::AtomicBool,
}

impl keel_txq::TxSigner for RacedSigner {
    fn address(&self) -> Address {
        keel_txq::TxSigner::address(&self.inner)
    }

    fn sign(&self, tx: alloy::consensus::TypedTransaction) -> keel_txq::SignFuture<'_> {
        Box::pin(async move {
            if !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                self.rival
                    .sign_pending(self.contested)
                    .await
                    .expect("the rival signs");
            }
            self.inner.sign(tx).await
        })
    }
}

#[tokio::test]
async fn a_signing_group_whose_nonce_moved_meanwhile_commits_nothing_for_that_sender() {
    let f = Fixture::new().await;
    let (contested, other) = (f.chain.account(1).unwrap(), f.chain.account(2).unwrap());
    // The rival process signs for the contested sender only.
    let rival = Arc::new(f.queue(&[1]));
    let mut q = f.queue(&[2]);
    q.add_signer(Arc::new(RacedSigner {
        inner: LocalSigner::new(f.chain.signer(1).unwrap().clone()),
        rival: rival.clone(),
        contested,
        fired: Default::default(),
    }));
    let mut ids = Vec::new();
    for i in 0..5 {
        for sender in [contested, other] {
            ids.push(
                q.enqueue(&transfer(sender, &format!("r{i}")))
                    .await
                    .unwrap(),
            );
        }
    }
    // One round: both senders' requests form one signing group; the contested sender's
    // signatures start at nonce 0, which the rival takes (nonces 0..5) before the group
    // commits.
    q.tick().await.unwrap();
    let attempts_of = |sender: Address| {
        let pool = f.db.pool().clone();
        async move {
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT a.nonce, count(*) OVER () FROM txq_attempt a JOIN txq_request r ON r.id = a.request_id
                  WHERE r.sender = $1 ORDER BY a.nonce",
            )
            .bind(sender.as_slice())
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let mine = attempts_of(contested).await;
    assert_eq!(
        mine.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..5).collect::<Vec<i64>>(),
        "one attempt per request, the rival's: the losing signatures were discarded unbroadcast"
    );
    let signed_by_rival: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM txq_request WHERE sender = $1 AND state = 'signed'",
    )
    .bind(contested.as_slice())
    .fetch_one(f.db.pool())
    .await
    .unwrap();
    assert_eq!(signed_by_rival, 5, "signed by the rival, not yet broadcast");
    let next: i64 = sqlx::query_scalar("SELECT next_nonce FROM txq_sender WHERE sender = $1")
        .bind(contested.as_slice())
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    assert_eq!(next, 5, "the nonce advanced once");
    // The group's other sender committed in the same statement.
    assert_eq!(
        attempts_of(other)
            .await
            .iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        (0..5).collect::<Vec<i64>>()
    );
    let verdicts = settle_all(&q, &ids).await;
    assert!(
        verdicts
            .iter()
            .all(|v| matches!(v, SettlementVerdict::Confirmed { .. }))
    );
    for sender in [contested, other] {
        assert_eq!(
            f.chain
                .provider()
                .get_transaction_count(sender)
                .await
                .unwrap(),
            5,
            "exactly one transaction per request"
        );
    }
}

#[tokio::test]
async fn of_a_senders_stuck_transactions_only_the_lowest_nonce_is_replaced() {
    let f = Fixture::new().await;
    let sender = f.chain.account(6).unwrap();
    let p = f.chain.provider();
    let q = f.stalled_queue(6).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            q.enqueue(&transfer(sender, &format!("stuck-{i}")))
                .await
                .unwrap(),
        );
    }
    // Nothing mines: every transaction is stuck. Their fees are the market's, so
    // nonces 1 and 2 only wait for nonce 0: it alone is replaced, on every pass.
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    let attempts: Vec<(i64, i64)> =
        sqlx::query_as("SELECT nonce, count(*) FROM txq_attempt GROUP BY nonce ORDER BY nonce")
            .fetch_all(f.db.pool())
            .await
            .unwrap();
    assert_eq!(attempts, vec![(0, 3), (1, 1), (2, 1)]);
    f.chain.mine().await.unwrap();
    let verdicts = settle_all(&q, &ids).await;
    assert!(
        verdicts
            .iter()
            .all(|v| matches!(v, SettlementVerdict::Confirmed { .. })),
        "{verdicts:?}"
    );
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 3);
}

/// The signed EIP-2718 bytes of a plain transfer from dev account `idx` at `nonce`,
/// for a replacement branch of `anvil_reorg`.
async fn outside_raw(f: &Fixture, idx: usize, nonce: u64) -> Bytes {
    use alloy::eips::Encodable2718;
    use keel_txq::TxSigner;
    let signer = LocalSigner::new(f.chain.signer(idx).unwrap().clone());
    let tx = alloy::consensus::TxEip1559 {
        chain_id: f.chain.chain_id(),
        nonce,
        gas_limit: 21_000,
        max_fee_per_gas: 100_000_000_000,
        max_priority_fee_per_gas: 1_000_000_000,
        to: alloy::primitives::TxKind::Call(Address::repeat_byte(0x99)),
        value: U256::from(5u64),
        access_list: Default::default(),
        input: Bytes::new(),
    };
    Bytes::from(signer.sign(tx.into()).await.unwrap().encoded_2718())
}

/// `final_at IS NOT NULL` and `reorgs` of request `id` (migration 0065).
async fn watch_state(f: &Fixture, id: Uuid) -> (bool, i32) {
    sqlx::query_as("SELECT final_at IS NOT NULL, reorgs FROM txq_request WHERE id = $1")
        .bind(id)
        .fetch_one(f.db.pool())
        .await
        .unwrap()
}

/// Issue 32 §10: a reorg after the verdict takes the transaction out and its nonce is
/// still free. The settled request is still watched (its block is not final): the same
/// signed bytes go out again, the transaction lands in a new block, and the verdict
/// stands with that block. Once the block is final the watch ends. One effect.
#[tokio::test]
async fn a_verdict_reorged_out_with_its_nonce_free_lands_again_with_the_same_bytes() {
    let f = Fixture::new().await;
    let sender = f.chain.account(7).unwrap();
    let q = f.queue_with(
        &[7],
        TxQueueConfig {
            finality: Finality::Depth(3),
            ..TxQueueConfig::default()
        },
    );
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    let (first_block, hash) = match &settle_all(&q, &[id]).await[0] {
        SettlementVerdict::Confirmed { block, hash, .. } => (*block, *hash),
        other => panic!("{other:?}"),
    };
    assert_eq!(watch_state(&f, id).await, (false, 0), "watched until final");
    let p = f.chain.provider();
    p.raw_request::<_, ()>("anvil_reorg".into(), (1u64, Vec::<(Bytes, u64)>::new()))
        .await
        .unwrap();
    assert!(p.get_transaction_receipt(hash).await.unwrap().is_none());
    assert_eq!(received(&f).await, U256::ZERO, "the effect is gone for now");
    assert_eq!(
        q.recover_nonces(sender).await.unwrap(),
        (false, 0),
        "a nonce a reorg freed is never filled with a gap transfer while our attempt exists"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let block = loop {
        q.tick().await.unwrap();
        if let Some(SettlementVerdict::Confirmed { block, hash: h, .. }) =
            q.status(id).await.unwrap().verdict
            && block != first_block
        {
            assert_eq!(h, hash, "the same signed bytes");
            break block;
        }
        assert!(Instant::now() < deadline, "never re-included");
    };
    let receipt = p.get_transaction_receipt(hash).await.unwrap().unwrap();
    assert_eq!(receipt.block_number, Some(block));
    assert_eq!(watch_state(&f, id).await, (false, 1));
    let view = |f: &Fixture| {
        let db = f.db.pool().clone();
        async move { keel_txq::requests(&db, &[id]).await.unwrap().remove(0) }
    };
    assert_eq!(view(&f).await.final_at, None, "RequestView: still watched");
    for _ in 0..3 {
        f.chain.mine().await.unwrap();
    }
    q.tick().await.unwrap();
    assert_eq!(
        watch_state(&f, id).await,
        (true, 1),
        "final: the watch ended"
    );
    assert!(
        view(&f).await.final_at.is_some(),
        "RequestView::final_at: the watch ended"
    );
    assert_eq!(received(&f).await, U256::from(1u64), "exactly one effect");
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 1);
}

/// Issue 32 §10: a reorg after the verdict replaces the block with one where another
/// transaction of the sender takes the request's nonce. The verdict becomes
/// `REORGED_OUT` (no effect on chain), the queue sends nothing more for it and nonce
/// recovery fills nothing: the chain keeps zero effects of the request.
#[tokio::test]
async fn a_verdict_whose_nonce_another_transaction_took_in_a_reorg_is_reorged_out() {
    let f = Fixture::new().await;
    let sender = f.chain.account(8).unwrap();
    let q = f.queue(&[8]);
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    let hash = match &settle_all(&q, &[id]).await[0] {
        SettlementVerdict::Confirmed { hash, attempts, .. } => {
            assert_eq!(attempts[0].nonce, 0);
            *hash
        }
        other => panic!("{other:?}"),
    };
    let other = outside_raw(&f, 8, 0).await;
    let p = f.chain.provider();
    p.raw_request::<_, ()>("anvil_reorg".into(), (1u64, vec![(other, 0u64)]))
        .await
        .unwrap();
    assert!(p.get_transaction_receipt(hash).await.unwrap().is_none());
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 1);
    let mut verdict = None;
    for _ in 0..10 {
        q.tick().await.unwrap();
        verdict = q.status(id).await.unwrap().verdict;
        if matches!(verdict, Some(SettlementVerdict::Failed { .. })) {
            break;
        }
    }
    match verdict {
        Some(SettlementVerdict::Failed { code, attempts, .. }) => {
            assert_eq!(code, FailureCode::ReorgedOut);
            assert_eq!(attempts.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(watch_state(&f, id).await, (true, 1));
    // Nothing more is sent for it, and no gap transfer takes anything.
    for _ in 0..5 {
        q.tick().await.unwrap();
    }
    assert_eq!(q.recover_nonces(sender).await.unwrap(), (false, 0));
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 1);
    assert_eq!(
        received(&f).await,
        U256::ZERO,
        "no effect, and no second one"
    );
}

/// Issue 32 §10: a reorg re-includes the settled transaction itself (same height, new
/// block): the verdict stands and the watch ends once final.
#[tokio::test]
async fn a_verdict_whose_transaction_the_reorg_re_includes_stands() {
    let f = Fixture::new().await;
    let sender = f.chain.account(9).unwrap();
    let q = f.queue(&[9]);
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    let before = settle_all(&q, &[id]).await.remove(0);
    let raw: Vec<u8> = sqlx::query_scalar("SELECT raw FROM txq_attempt WHERE request_id = $1")
        .bind(id)
        .fetch_one(f.db.pool())
        .await
        .unwrap();
    let p = f.chain.provider();
    p.raw_request::<_, ()>("anvil_reorg".into(), (1u64, vec![(Bytes::from(raw), 0u64)]))
        .await
        .unwrap();
    q.tick().await.unwrap();
    assert_eq!(q.status(id).await.unwrap().verdict, Some(before));
    assert_eq!(
        watch_state(&f, id).await,
        (true, 0),
        "depth 0: final at once"
    );
    assert_eq!(received(&f).await, U256::from(1u64));
}

/// Issue 33 §1: a request whose gas limit exceeds the block gas limit fails
/// `EXCEEDS_BLOCK_GAS_LIMIT` before a nonce is assigned (no attempt, no gap to fill),
/// at several values around Anvil's 30,000,000 gas; one at the limit is signed and
/// mines. The sender's transactions on chain are exactly the ones that mined: no
/// zero-value gap fill was ever needed.
#[tokio::test]
async fn a_request_over_the_block_gas_limit_fails_before_a_nonce_is_assigned() {
    let f = Fixture::new().await;
    let sender = f.chain.account(4).unwrap();
    let q = f.queue(&[4]);
    let limit = f
        .chain
        .provider()
        .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
        .await
        .unwrap()
        .unwrap()
        .header
        .gas_limit;
    assert_eq!(limit, 30_000_000, "Anvil's default block gas limit");
    let start = f
        .chain
        .provider()
        .get_transaction_count(sender)
        .await
        .unwrap();
    let mut over = Vec::new();
    let mut ids = Vec::new();
    for (i, gas) in [limit + 1, limit + 1_000, 2 * limit, u64::MAX / 2]
        .into_iter()
        .enumerate()
    {
        let mut t = transfer(sender, &format!("over-{i}"));
        t.gas_limit = Some(gas);
        let id = q.enqueue(&t).await.unwrap();
        over.push(id);
        ids.push(id);
        // Each followed by a request that fits: the nonces stay contiguous.
        let mut fits = transfer(sender, &format!("fits-{i}"));
        fits.gas_limit = Some(if i == 0 { limit } else { 21_000 });
        ids.push(q.enqueue(&fits).await.unwrap());
    }
    let verdicts = settle_all(&q, &ids).await;
    let mut nonces = Vec::new();
    for (id, v) in ids.iter().zip(&verdicts) {
        if over.contains(id) {
            match v {
                SettlementVerdict::Failed { code, attempts, .. } => {
                    assert_eq!(*code, FailureCode::ExceedsBlockGasLimit);
                    assert!(attempts.is_empty(), "no nonce was assigned");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(f.attempts(*id).await, 0);
        } else {
            nonces.push(confirmed_nonce(v));
        }
    }
    let expected: Vec<u64> = (start..start + 4).collect();
    assert_eq!(
        nonces, expected,
        "the requests that fit took contiguous nonces"
    );
    // Nonce recovery finds no gap: the chain's count is exactly the mined requests.
    let (_, filled) = q.recover_nonces(sender).await.unwrap();
    assert_eq!(filled, 0);
    assert_eq!(
        f.chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        start + 4
    );
    let gap_fills: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM txq_request WHERE idempotency_key LIKE 'keel:nonce-gap-fill:%'",
    )
    .fetch_one(f.db.pool())
    .await
    .unwrap();
    assert_eq!(gap_fills, 0);
}

/// Issue 33 §1: a signed request that no node accepted and that a node refused for good
/// (here `INTRINSIC_GAS_TOO_LOW`: gas limits below 21,000 pass the queue's own checks)
/// hands its nonce back when nothing above it is signed: the next request takes that
/// nonce, and no zero-value gap fill is ever signed.
#[tokio::test]
async fn a_refused_request_hands_its_nonce_back_when_nothing_above_it_is_signed() {
    let f = Fixture::new().await;
    let sender = f.chain.account(5).unwrap();
    let q = f.queue(&[5]);
    let start = f
        .chain
        .provider()
        .get_transaction_count(sender)
        .await
        .unwrap();
    for (i, gas) in [1u64, 20_000, 20_999].into_iter().enumerate() {
        let mut t = transfer(sender, &format!("low-{i}"));
        t.gas_limit = Some(gas);
        let id = q.enqueue(&t).await.unwrap();
        match &settle_all(&q, &[id]).await[0] {
            SettlementVerdict::Failed { code, attempts, .. } => {
                assert_eq!(*code, FailureCode::IntrinsicGasTooLow, "gas {gas}");
                assert_eq!(attempts.len(), 1, "signed, refused at broadcast");
                assert_eq!(attempts[0].nonce, start, "gas {gas}: the nonce came back");
            }
            other => panic!("{other:?}"),
        }
    }
    let ok = q.enqueue(&transfer(sender, "after")).await.unwrap();
    assert_eq!(confirmed_nonce(&settle_all(&q, &[ok]).await[0]), start);
    let (_, filled) = q.recover_nonces(sender).await.unwrap();
    assert_eq!(filled, 0, "no gap to fill");
    assert_eq!(
        f.chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        start + 1
    );
}
