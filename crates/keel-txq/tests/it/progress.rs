//! The progress seam against real PostgreSQL and real Anvil: a request's first
//! broadcast (hash, nonce) and the opening of its funding request (address, required
//! wei, deadline) reach the sink in the transaction that records them (a broadcast once,
//! an open funding request at its opening and at every funding check after); a sink
//! that fails never holds the queue back (the change is recorded without it, counted).

use crate::common::transfer;
use alloy::primitives::{B256, U256};
use alloy::signers::local::PrivateKeySigner;
use anvil_tests::TestChain;
use futures::future::BoxFuture;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{
    EnqueueOptions, LocalSigner, Progress, ProgressSink, ProgressSinkError, RequestState,
    SettlementVerdict, TxQueue, TxQueueConfig,
};
use keel_units::ChainId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Records each change as a row of `progress_record` in the recording transaction; it
/// writes its rows before it fails (so a rollback is visible) and fails every call
/// while `fail` is set, or any call that holds the key `poison`.
#[derive(Default)]
struct TableSink {
    fail: AtomicBool,
    poison: Mutex<Option<String>>,
}

impl ProgressSink for TableSink {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        progress: &'c [Progress<'c>],
    ) -> BoxFuture<'c, Result<(), ProgressSinkError>> {
        Box::pin(async move {
            assert!(!progress.is_empty(), "never called with nothing");
            let poison = self.poison.lock().unwrap().clone();
            let mut poisoned = false;
            for p in progress {
                let (id, key, what) = match p {
                    Progress::Broadcast {
                        request_id,
                        idempotency_key,
                        hash,
                        nonce,
                    } => (
                        *request_id,
                        *idempotency_key,
                        format!("broadcast {hash} {nonce}"),
                    ),
                    Progress::FundingRequested {
                        request_id,
                        idempotency_key,
                        address,
                        required_wei,
                        deadline,
                    } => (
                        *request_id,
                        *idempotency_key,
                        format!(
                            "funding {address} {} {}",
                            required_wei.get(),
                            deadline.timestamp_micros()
                        ),
                    ),
                    Progress::CustodyApprovalRequested {
                        request_id,
                        idempotency_key,
                    } => (*request_id, *idempotency_key, "custody_approval".to_owned()),
                };
                poisoned |= poison.as_deref() == Some(key);
                sqlx::query(
                    "INSERT INTO progress_record (request_id, idempotency_key, what) VALUES ($1, $2, $3)",
                )
                .bind(id)
                .bind(key)
                .bind(what)
                .execute(&mut *conn)
                .await?;
            }
            if self.fail.load(Ordering::SeqCst) || poisoned {
                return Err(ProgressSinkError::new("the test sink refuses"));
            }
            Ok(())
        })
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
            "CREATE TABLE progress_record (seq bigserial PRIMARY KEY, request_id uuid NOT NULL,
                                           idempotency_key text NOT NULL, what text NOT NULL)",
        )
        .execute(db.pool())
        .await
        .unwrap();
        Self {
            chain: TestChain::start().await.unwrap(),
            db,
            sink: Arc::new(TableSink::default()),
        }
    }

    fn queue(&self, unfunded: &PrivateKeySigner) -> TxQueue {
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
        q.add_signer(Arc::new(LocalSigner::new(
            self.chain.signer(1).unwrap().clone(),
        )));
        q.add_signer(Arc::new(LocalSigner::new(unfunded.clone())));
        q.set_progress_sink(self.sink.clone());
        q
    }

    /// The sink's committed rows of `id` (`what` of each).
    async fn records_of(&self, id: Uuid) -> Vec<String> {
        sqlx::query_scalar("SELECT what FROM progress_record WHERE request_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(self.db.pool())
            .await
            .unwrap()
    }
}

/// Three transfers (one broadcast round) and a request of an unfunded sender with a
/// funding pause, ticked until the transfers are confirmed and the other waits.
async fn run(f: &Fixture, q: &TxQueue, unfunded: &PrivateKeySigner) -> (Vec<Uuid>, Uuid) {
    let a1 = f.chain.account(1).unwrap();
    let mut sent = Vec::new();
    for k in ["t-1", "t-2", "t-3"] {
        sent.push(q.enqueue(&transfer(a1, k)).await.unwrap());
    }
    let waiting = q
        .enqueue_with(
            &transfer(unfunded.address(), "unfunded"),
            &EnqueueOptions::funding_pause(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        q.tick().await.unwrap();
        let mut done = q.status(waiting).await.unwrap().state == RequestState::WaitingFunding;
        for id in &sent {
            done &= q.status(*id).await.unwrap().verdict.is_some();
        }
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "the queue did not move");
    }
    // More passes record nothing again.
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    (sent, waiting)
}

fn mined(v: &SettlementVerdict) -> (B256, u64) {
    match v {
        SettlementVerdict::Confirmed { hash, .. } => (*hash, 0),
        other => panic!("not confirmed: {other:?}"),
    }
}

#[tokio::test]
async fn first_broadcasts_reach_the_sink_once_and_open_funding_requests_at_every_check() {
    let f = Fixture::new().await;
    let unfunded = PrivateKeySigner::random();
    let q = f.queue(&unfunded);
    let (sent, waiting) = run(&f, &q, &unfunded).await;
    for id in &sent {
        let status = q.status(*id).await.unwrap();
        let (hash, _) = mined(status.verdict.as_ref().unwrap());
        let nonce = status.nonce.unwrap();
        assert_eq!(
            f.records_of(*id).await,
            [format!("broadcast {hash} {nonce}")],
            "one first broadcast, with the accepted attempt's hash and nonce"
        );
    }
    // The request as opened and as re-offered by each later check: the sender, the
    // shortfall then (it follows the fees; the deadline never moves).
    let funding = q.status(waiting).await.unwrap().funding.unwrap();
    let records = f.records_of(waiting).await;
    assert!(!records.is_empty(), "the opening reached the sink");
    for record in &records {
        let parts: Vec<&str> = record.split(' ').collect();
        assert_eq!(parts[0], "funding", "{records:?}");
        assert_eq!(parts[1], unfunded.address().to_string());
        assert!(parts[2].parse::<U256>().unwrap() > U256::ZERO);
        assert_eq!(parts[3], funding.deadline.timestamp_micros().to_string());
    }
}

#[test]
fn a_failing_sink_never_holds_the_queue_back_and_is_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let f = Fixture::new().await;
                let unfunded = PrivateKeySigner::random();
                let q = f.queue(&unfunded);
                // The broadcast round's call fails for `t-2`: the others are recorded
                // one by one with the sink, `t-2` without it; every funding call fails.
                *f.sink.poison.lock().unwrap() = Some("t-2".to_owned());
                f.sink.fail.store(false, Ordering::SeqCst);
                let fail_funding = FailFunding(f.sink.clone());
                let mut q = q;
                q.set_progress_sink(Arc::new(fail_funding));
                let (sent, waiting) = run(&f, &q, &unfunded).await;
                for (i, id) in sent.iter().enumerate() {
                    let status = q.status(*id).await.unwrap();
                    assert!(matches!(
                        status.verdict,
                        Some(SettlementVerdict::Confirmed { .. })
                    ));
                    let want = usize::from(i != 1);
                    assert_eq!(f.records_of(*id).await.len(), want, "request {i}");
                }
                assert_eq!(
                    q.status(waiting).await.unwrap().state,
                    RequestState::WaitingFunding,
                    "the funding wait was recorded without the sink"
                );
                assert!(f.records_of(waiting).await.is_empty(), "rolled back");
            });
    });
    let mut failures: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let DebugValue::Counter(n) = value else {
                return None;
            };
            (key.name() == "keel_txq_progress_sink_failures_total").then(|| {
                let change = key
                    .labels()
                    .find(|l| l.key() == "change")
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default();
                (change, n)
            })
        })
        .collect();
    failures.sort();
    // The round's call and `t-2` alone; every funding call: the opening and each check
    // after it while the request waits (each re-offers it, each fails).
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert_eq!(failures[0], ("broadcast".to_owned(), 2));
    assert_eq!(failures[1].0, "funding");
    assert!(failures[1].1 >= 1, "{failures:?}");
}

/// The table sink, failing every funding request.
struct FailFunding(Arc<TableSink>);

impl ProgressSink for FailFunding {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        progress: &'c [Progress<'c>],
    ) -> BoxFuture<'c, Result<(), ProgressSinkError>> {
        Box::pin(async move {
            self.0.record(conn, progress).await?;
            if progress
                .iter()
                .any(|p| matches!(p, Progress::FundingRequested { .. }))
            {
                return Err(ProgressSinkError::new("the test sink refuses funding"));
            }
            Ok(())
        })
    }
}
