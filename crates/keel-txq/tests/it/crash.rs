//! Durability of the queue under real process kills (SIGKILL of a queue process at the
//! dangerous points, then a restart): each request takes effect exactly once on chain,
//! with the bytes that were persisted.

use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::Provider;
use anvil_tests::TestChain;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{SettlementVerdict, TxQueue, TxQueueConfig, TxRequest};
use keel_units::{ChainId, Wei};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

struct Worker(Child);

impl Worker {
    fn start(
        db: &TestDatabase,
        chain: &TestChain,
        key_index: usize,
        mode: &str,
        confirmations: u64,
    ) -> Self {
        Self::start_final_at(db, chain, key_index, mode, confirmations, 0)
    }

    /// As [`Worker::start`], a block being final `finality_depth` blocks below the head.
    fn start_final_at(
        db: &TestDatabase,
        chain: &TestChain,
        key_index: usize,
        mode: &str,
        confirmations: u64,
        finality_depth: u64,
    ) -> Self {
        let key = chain.signer(key_index).unwrap().to_bytes();
        let child = Command::new(env!("CARGO_BIN_EXE_keel-txq-crash-worker"))
            .env("KEEL_TXQ_FINALITY_DEPTH", finality_depth.to_string())
            .env("KEEL_TXQ_DB", db.url())
            .env("KEEL_TXQ_RPC", chain.endpoint().to_string())
            .env("KEEL_TXQ_CHAIN_ID", chain.chain_id().to_string())
            .env("KEEL_TXQ_KEY", key.to_string())
            .env("KEEL_TXQ_MODE", mode)
            .env("KEEL_TXQ_CONFIRMATIONS", confirmations.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Self(child)
    }

    /// Blocks until the worker prints a line starting with `prefix`.
    fn wait_for(&mut self, prefix: &str) {
        let out = self.0.stdout.as_mut().unwrap();
        let mut reader = BufReader::new(out);
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).unwrap();
            assert!(n > 0, "worker exited before printing {prefix:?}");
            if line.starts_with(prefix) {
                return;
            }
        }
    }

    fn kill(mut self) {
        self.0.kill().unwrap(); // SIGKILL
        self.0.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn reader(db: &TestDatabase, chain: &TestChain) -> TxQueue {
    let pool = UpstreamPool::new(
        ChainId(chain.chain_id()),
        UpstreamConfig::new(vec![chain.endpoint().to_string()]),
    )
    .unwrap();
    TxQueue::new(db.pool().clone(), Arc::new(pool), TxQueueConfig::default()).unwrap()
}

async fn enqueue_n(q: &TxQueue, sender: Address, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            q.enqueue(&TxRequest {
                sender,
                idempotency_key: format!("crash-{i}"),
                to: Some(Address::repeat_byte(0x24)),
                value: Wei::new(U256::from(1000 + i)),
                data: Bytes::new(),
                gas_limit: Some(21_000),
                authorization_list: Vec::new(),
            })
            .await
            .unwrap(),
        );
    }
    ids
}

async fn count(db: &TestDatabase, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db.pool()).await.unwrap()
}

async fn await_settled(q: &TxQueue, ids: &[Uuid]) -> Vec<SettlementVerdict> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut out = Vec::new();
        for id in ids {
            if let Some(v) = q.status(*id).await.unwrap().verdict {
                out.push(v);
            }
        }
        if out.len() == ids.len() {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} settled",
            out.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn assert_exactly_once(
    db: &TestDatabase,
    chain: &TestChain,
    sender: Address,
    verdicts: &[SettlementVerdict],
    n: usize,
) {
    let mut nonces: Vec<u64> = verdicts
        .iter()
        .map(|v| match v {
            SettlementVerdict::Confirmed { attempts, hash, .. } => {
                assert_eq!(attempts.len(), 1, "no second signature");
                assert_eq!(attempts[0].hash, *hash, "the persisted bytes mined");
                attempts[0].nonce
            }
            other => panic!("{other:?}"),
        })
        .collect();
    nonces.sort_unstable();
    assert_eq!(nonces, (0..n as u64).collect::<Vec<_>>());
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        n as u64,
        "one transaction per request"
    );
    assert_eq!(
        count(db, "SELECT count(*) FROM txq_attempt").await,
        n as i64
    );
}

#[tokio::test]
async fn kill_between_persist_and_broadcast() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(1).unwrap();
    let q = reader(&db, &chain);
    let ids = enqueue_n(&q, sender, 20).await;

    let mut w = Worker::start(&db, &chain, 1, "sign-only", 1);
    w.wait_for("signed");
    w.kill();
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM txq_request WHERE state = 'signed'"
        )
        .await,
        20
    );
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        0,
        "nothing broadcast"
    );

    let _w = Worker::start(&db, &chain, 1, "run", 1);
    let verdicts = await_settled(&q, &ids).await;
    assert_exactly_once(&db, &chain, sender, &verdicts, 20).await;
}

#[tokio::test]
async fn kill_between_broadcast_and_receipt() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(2).unwrap();
    let q = reader(&db, &chain);
    let ids = enqueue_n(&q, sender, 20).await;

    // A confirmation depth it can never reach: everything is broadcast, nothing settles.
    let mut w = Worker::start(&db, &chain, 2, "run", 1_000_000);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(
        &db,
        "SELECT count(*) FROM txq_request WHERE state = 'broadcast'",
    )
    .await
        < 20
    {
        w.wait_for("tick");
        assert!(Instant::now() < deadline);
    }
    w.kill();

    let _w = Worker::start(&db, &chain, 2, "run", 1);
    let verdicts = await_settled(&q, &ids).await;
    assert_exactly_once(&db, &chain, sender, &verdicts, 20).await;
}

#[tokio::test]
async fn kill_mid_pass_then_restart() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(3).unwrap();
    let q = reader(&db, &chain);
    let ids = enqueue_n(&q, sender, 60).await;

    let w = Worker::start(&db, &chain, 3, "run", 1);
    // Kill as soon as the first attempts are persisted, wherever the pass is.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&db, "SELECT count(*) FROM txq_attempt").await < 5 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    w.kill();

    let _w = Worker::start(&db, &chain, 3, "run", 1);
    let verdicts = await_settled(&q, &ids).await;
    assert_exactly_once(&db, &chain, sender, &verdicts, 60).await;
}

/// Issue 32 §3, the dangerous point of a re-sign: a request is signed (killed before
/// its broadcast), a transaction sent outside Keel takes its nonce, and the next
/// process re-signs it at a fresh nonce, persists the new attempt and is killed before
/// broadcasting it. A third process sends the persisted new bytes: the request confirms
/// with them and takes effect exactly once.
#[tokio::test]
async fn kill_between_persisting_a_re_signed_attempt_and_its_broadcast() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(4).unwrap();
    let q = reader(&db, &chain);
    let ids = enqueue_n(&q, sender, 1).await;

    let mut w = Worker::start(&db, &chain, 4, "sign-only", 1);
    w.wait_for("signed");
    w.kill();
    // Nonce 0 is taken by a transaction from the same key, outside Keel.
    let other = alloy::rpc::types::TransactionRequest::default()
        .from(sender)
        .to(Address::repeat_byte(0x99))
        .value(U256::from(5u64))
        .nonce(0);
    chain
        .provider_for(4)
        .unwrap()
        .send_transaction(other)
        .await
        .unwrap()
        .get_receipt()
        .await
        .unwrap();

    let mut w = Worker::start(&db, &chain, 4, "pass-once", 1);
    w.wait_for("passed");
    w.kill();
    assert_eq!(
        count(&db, "SELECT count(*) FROM txq_attempt").await,
        2,
        "the re-signed attempt is persisted"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM txq_request WHERE state = 'signed' AND nonce = 1"
        )
        .await,
        1
    );
    let p = chain.provider();
    assert_eq!(
        p.get_transaction_count(sender).await.unwrap(),
        1,
        "only the outside transaction: the new attempt was not broadcast"
    );
    let recipient = Address::repeat_byte(0x24);
    assert_eq!(p.get_balance(recipient).await.unwrap(), U256::ZERO);

    let _w = Worker::start(&db, &chain, 4, "run", 1);
    let verdicts = await_settled(&q, &ids).await;
    let persisted: Vec<u8> =
        sqlx::query_scalar("SELECT tx_hash FROM txq_attempt WHERE attempt = 2")
            .fetch_one(db.pool())
            .await
            .unwrap();
    match &verdicts[0] {
        SettlementVerdict::Confirmed { attempts, hash, .. } => {
            assert_eq!(attempts.len(), 2, "no third signature");
            assert_eq!(
                hash.as_slice(),
                persisted.as_slice(),
                "the persisted bytes mined"
            );
            assert_eq!(attempts[1].nonce, 1);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 2);
    assert_eq!(
        p.get_balance(recipient).await.unwrap(),
        U256::from(1000u64),
        "exactly one effect"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM txq_attempt").await, 2);
}

/// Issue 32 §10, durability of the watch: the queue process settles a request and is
/// killed; a reorg then takes the transaction out while no queue runs (its nonce stays
/// free). The next process finds the settled request still watched (the watch lives in
/// the database, not in memory), sends the same signed bytes again, and the verdict
/// stands with the new block: one effect.
#[tokio::test]
async fn kill_after_the_verdict_then_a_reorg_while_down() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let sender = chain.account(5).unwrap();
    let q = reader(&db, &chain);
    let ids = enqueue_n(&q, sender, 1).await;

    let w = Worker::start_final_at(&db, &chain, 5, "run", 1, 1_000);
    let (block, hash) = match &await_settled(&q, &ids).await[0] {
        SettlementVerdict::Confirmed { block, hash, .. } => (*block, *hash),
        other => panic!("{other:?}"),
    };
    w.kill();
    let p = chain.provider();
    p.raw_request::<_, ()>("anvil_reorg".into(), (1u64, Vec::<(Bytes, u64)>::new()))
        .await
        .unwrap();
    assert!(p.get_transaction_receipt(hash).await.unwrap().is_none());

    let _w = Worker::start_final_at(&db, &chain, 5, "run", 1, 1_000);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(SettlementVerdict::Confirmed {
            block: b, hash: h, ..
        }) = q.status(ids[0]).await.unwrap().verdict
            && b != block
        {
            assert_eq!(h, hash, "the same signed bytes");
            break;
        }
        assert!(Instant::now() < deadline, "never re-included");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(p.get_transaction_receipt(hash).await.unwrap().is_some());
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 1);
    assert_eq!(
        p.get_balance(Address::repeat_byte(0x24)).await.unwrap(),
        U256::from(1000u64),
        "exactly one effect"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM txq_attempt").await, 1);
}
