//! `keel_txq::requests`, the typed read other crates use, against real PostgreSQL and
//! real Anvil.

use crate::common::transfer;
use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use anvil_tests::TestChain;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    EnqueueOptions, LocalSigner, RequestState, SettlementVerdict, TxQueue, TxQueueConfig, TxRequest,
};
use keel_units::ChainId;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

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

/// An EIP-7702 authorization of `delegate` at nonce 0 on `chain_id`, signed by `key`.
fn authorization(
    key: &PrivateKeySigner,
    chain_id: u64,
    delegate: Address,
) -> alloy::eips::eip7702::SignedAuthorization {
    use alloy::signers::SignerSync;
    let auth = alloy::eips::eip7702::Authorization {
        chain_id: U256::from(chain_id),
        address: delegate,
        nonce: 0,
    };
    let sig = key.sign_hash_sync(&auth.signature_hash()).unwrap();
    auth.into_signed(sig)
}

#[tokio::test]
async fn a_request_with_an_authorization_list_is_sent_replaced_and_mined_as_a_type_4_transaction() {
    use alloy::consensus::Transaction as _;
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
    let sender = chain.account(1).unwrap();
    // The authority: a fresh EOA delegating its code to the predeployed CREATE2 deployer.
    let eoa = PrivateKeySigner::random();
    let delegate = keel_abi::erc4337::CREATE2_DEPLOYER;
    let auth = authorization(&eoa, chain.chain_id(), delegate);
    let request = TxRequest {
        // No fixed gas: the estimate includes the authorization's intrinsic cost.
        gas_limit: None,
        authorization_list: vec![auth],
        ..transfer(sender, "set-code")
    };

    // The enqueue rules: the same key with another list is a conflict; a SetCode
    // transaction cannot create a contract.
    let id = q.enqueue(&request).await.unwrap();
    assert_eq!(q.enqueue(&request).await.unwrap(), id);
    let other = TxRequest {
        authorization_list: vec![authorization(&eoa, 0, delegate)],
        ..request.clone()
    };
    assert!(matches!(
        q.enqueue(&other).await,
        Err(keel_txq::TxqError::IdempotencyConflict)
    ));
    let create = TxRequest {
        idempotency_key: "create".to_owned(),
        to: None,
        ..request.clone()
    };
    assert!(matches!(
        q.enqueue(&create).await,
        Err(keel_txq::TxqError::InvalidRequest("to"))
    ));

    // Signed as type 4 with nothing mining, then replaced with bumped fees: the
    // replacement carries the same authorization.
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    q.tick().await.unwrap();
    let first = view(&db, id).await.last_hash.expect("signed");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        q.tick().await.unwrap();
        if view(&db, id).await.last_hash != Some(first) {
            break;
        }
        assert!(Instant::now() < deadline, "never replaced");
    }
    let raws: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT raw FROM txq_attempt WHERE request_id = $1 ORDER BY attempt")
            .bind(id)
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert!(raws.len() >= 2);
    for raw in &raws {
        use alloy::eips::Decodable2718;
        let tx = alloy::consensus::TxEnvelope::decode_2718(&mut raw.as_slice()).unwrap();
        assert_eq!(tx.tx_type(), alloy::consensus::TxType::Eip7702);
        assert_eq!(tx.authorization_list().map(<[_]>::len), Some(1));
    }

    // Mined: the EOA's code is the delegation designator.
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
    let Some(SettlementVerdict::Confirmed { hash, .. }) = v.verdict else {
        panic!("not confirmed: {v:?}");
    };
    let tx = chain
        .provider()
        .get_transaction_by_hash(hash)
        .await
        .unwrap()
        .expect("mined");
    assert_eq!(tx.inner.tx_type(), alloy::consensus::TxType::Eip7702);
    let mut code = vec![0xef, 0x01, 0x00];
    code.extend_from_slice(delegate.as_slice());
    assert_eq!(
        chain.provider().get_code_at(eoa.address()).await.unwrap(),
        Bytes::from(code)
    );
}
