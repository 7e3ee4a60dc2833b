//! `keel_txq::requests`, the typed read other crates use, against real PostgreSQL and
//! real Anvil.

use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use anvil_tests::TestChain;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    EnqueueOptions, LocalSigner, RequestState, SettlementVerdict, TxQueue, TxQueueConfig, TxRequest,
};
use keel_units::{ChainId, Wei};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

fn transfer(sender: Address, key: &str) -> TxRequest {
    TxRequest {
        sender,
        idempotency_key: key.to_owned(),
        to: Some(Address::repeat_byte(0x42)),
        value: Wei::new(U256::from(1)),
        data: Bytes::new(),
        gas_limit: Some(21_000),
    }
}

fn queue(db: &TestDatabase, chain: &TestChain, config: TxQueueConfig) -> TxQueue {
    let pool = UpstreamPool::new(
        ChainId(chain.chain_id()),
        UpstreamConfig::new(vec![chain.endpoint().to_string()]),
    )
    .unwrap();
    TxQueue::new(db.pool().clone(), Arc::new(pool), config).unwrap()
}

async fn view(db: &TestDatabase, id: Uuid) -> keel_txq::RequestView {
    let mut v = keel_txq::requests(db.pool(), &[id]).await.unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

#[tokio::test]
async fn requests_reads_state_nonce_verdict_last_hash_and_funding_deadline() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let mut q = queue(
        &db,
        &chain,
        TxQueueConfig {
            bump_after: Some(Duration::ZERO),
            ..TxQueueConfig::default()
        },
    );
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(1).unwrap().clone())));
    let unfunded = PrivateKeySigner::random();
    q.add_signer(Arc::new(LocalSigner::new(unfunded.clone())));
    let sender = chain.account(1).unwrap();

    // Queued: no nonce, no verdict, no attempt.
    let id = q.enqueue(&transfer(sender, "a")).await.unwrap();
    let v = view(&db, id).await;
    assert_eq!(v.id, id);
    assert_eq!(v.state, RequestState::Queued);
    assert_eq!(
        (v.nonce, &v.verdict, v.last_hash, v.funding_deadline),
        (None, &None, None, None)
    );
    assert_eq!(v.last_broadcast_error, None);

    // Nothing mines: signed and broadcast, then replaced; last_hash follows the
    // highest-numbered attempt.
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    q.tick().await.unwrap();
    let v = view(&db, id).await;
    assert_eq!(v.state, RequestState::Broadcast);
    assert_eq!(v.nonce, Some(0));
    let first = v.last_hash.expect("a signed attempt");
    let deadline = Instant::now() + Duration::from_secs(60);
    let replaced = loop {
        q.tick().await.unwrap();
        let v = view(&db, id).await;
        if v.last_hash != Some(first) {
            break v.last_hash.unwrap();
        }
        assert!(Instant::now() < deadline, "never replaced");
    };
    let highest: Vec<u8> = sqlx::query_scalar(
        "SELECT tx_hash FROM txq_attempt WHERE request_id = $1 ORDER BY attempt DESC LIMIT 1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(replaced.as_slice(), highest.as_slice());

    // Mined and settled: the verdict, as `status` reads it.
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (true,))
        .await
        .unwrap();
    chain.mine().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let v = loop {
        q.tick().await.unwrap();
        let v = view(&db, id).await;
        if v.state == RequestState::Settled {
            break v;
        }
        assert!(Instant::now() < deadline, "never settled: {v:?}");
    };
    assert_eq!(v.verdict, q.status(id).await.unwrap().verdict);
    assert!(matches!(
        v.verdict,
        Some(SettlementVerdict::Confirmed { .. })
    ));
    assert_eq!(v.nonce, Some(0));

    // Waiting for funding: the deadline, no nonce.
    let waiting = q
        .enqueue_with(
            &transfer(unfunded.address(), "w"),
            &EnqueueOptions::funding_pause(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let w = loop {
        q.tick().await.unwrap();
        let w = view(&db, waiting).await;
        if w.state == RequestState::WaitingFunding {
            break w;
        }
        assert!(Instant::now() < deadline, "never waited: {w:?}");
    };
    assert_eq!(w.nonce, None);
    assert_eq!(
        w.funding_deadline,
        q.status(waiting).await.unwrap().funding.map(|f| f.deadline)
    );
    assert!(w.funding_deadline.is_some());

    // Many at once: in the order asked, unknown ids left out.
    let unknown = Uuid::new_v4();
    let many = keel_txq::requests(db.pool(), &[waiting, unknown, id])
        .await
        .unwrap();
    assert_eq!(
        many.iter().map(|v| v.id).collect::<Vec<_>>(),
        vec![waiting, id]
    );
    assert!(keel_txq::requests(db.pool(), &[]).await.unwrap().is_empty());
}
