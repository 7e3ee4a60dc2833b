//! Broadcasts that keep failing (issue 16, class 2) and passes that outlive their
//! cancellation token (issue 16, class 5), behind the fault-injecting proxy
//! (`anvil_tests::proxy`) in front of real Anvil, against real PostgreSQL.

use crate::common::{Transfer, transfer};
use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use anvil_tests::TestChain;
use anvil_tests::proxy::{RpcProxy, Rule};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{Finality, LocalSigner, RequestState, SettlementVerdict, TxQueue, TxQueueConfig};
use keel_units::ChainId;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The process-wide metrics recorder of this test binary (installed once).
fn metrics() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("no other recorder in this binary");
        handle
    })
}

/// A queue for dev account `idx` whose chain is reached through `urls`, in order.
fn queue(
    db: &TestDatabase,
    chain: &TestChain,
    urls: &[&RpcProxy],
    idx: usize,
    config: TxQueueConfig,
) -> TxQueue {
    let mut upstream = UpstreamConfig::new(urls.iter().map(|p| p.url().to_string()).collect());
    upstream.request_timeout = Duration::from_secs(10);
    let pool = UpstreamPool::new(ChainId(chain.chain_id()), upstream).unwrap();
    let mut q = TxQueue::new(db.pool().clone(), Arc::new(pool), config).unwrap();
    q.add_signer(Arc::new(LocalSigner::new(
        chain.signer(idx).unwrap().clone(),
    )));
    q
}

async fn automine(chain: &TestChain, on: bool) {
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (on,))
        .await
        .unwrap();
}

async fn attempts(db: &TestDatabase, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM txq_attempt WHERE request_id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// Ticks until `id` settles, at most `ticks` times (each tick is a full pass; nothing
/// here waits on a clock).
async fn settle_within(q: &TxQueue, id: Uuid, ticks: usize) -> Option<SettlementVerdict> {
    for _ in 0..ticks {
        q.tick().await.unwrap();
        if let Some(v) = q.status(id).await.unwrap().verdict {
            return Some(v);
        }
    }
    None
}

/// The input with one upstream: the send's reply is lost (the node got the
/// transaction), the transaction mines, and every re-broadcast's "nonce too low" comes
/// back as `-32603 internal error`. The `signed` request is reconciled by the receipt
/// of its persisted attempt and settles `Confirmed`; the failures are recorded with
/// their class, readable by request id, and counted.
#[tokio::test]
async fn a_signed_request_whose_rebroadcasts_fail_settles_by_its_receipt() {
    let handle = metrics();
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(1).unwrap();
    automine(&chain, false).await;
    let q = queue(
        &db,
        &chain,
        &[&proxy],
        1,
        TxQueueConfig {
            bump_after: None,
            ..Default::default()
        },
    );
    let lost = proxy.add_rule(Rule::drop_response("eth_sendRawTransaction").times(1));
    let rewrite = proxy.add_rule(Rule::rewrite_error(
        "eth_sendRawTransaction",
        "nonce too low",
        -32603,
        "internal error",
    ));
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    q.tick().await.unwrap();
    assert_eq!(proxy.hits(lost), 1, "the node got it, the reply was lost");
    let status = q.status(id).await.unwrap();
    assert_eq!(status.state, RequestState::Signed);
    assert_eq!(
        status.broadcast_failure.as_ref().map(|f| f.class.as_str()),
        Some("unavailable")
    );
    chain.mine().await.unwrap();
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        1,
        "the transaction is on chain"
    );

    let verdict = settle_within(&q, id, 5).await;
    assert!(
        proxy.hits(rewrite) >= 1,
        "a re-broadcast got the rewritten answer"
    );
    match verdict {
        Some(SettlementVerdict::Confirmed { attempts, hash, .. }) => {
            assert_eq!(attempts.len(), 1);
            assert_eq!(attempts[0].hash, hash);
        }
        other => panic!("a mined signed request must settle: {other:?}"),
    }
    let failures = keel_txq::broadcast_failures(db.pool(), &[id])
        .await
        .unwrap();
    let failure = failures.get(&id).expect("recorded");
    assert_eq!(failure.class, "internal", "{failure:?}");
    assert!(failure.failures >= 2, "{failure:?}");
    let rendered = handle.render();
    let counted = rendered.lines().any(|l| {
        l.starts_with("keel_txq_broadcast_failures_total{")
            && l.contains("class=\"internal\"")
            && l.contains(&format!("chain_id=\"{}\"", chain.chain_id()))
    });
    assert!(counted, "{rendered}");
}

/// A `signed` request whose every broadcast fails (the only upstream answers internal
/// errors) while another transaction takes its nonce: reconciled by the chain's nonce
/// (issue 32 §3), it is re-signed at a fresh nonce instead of failing, and once the
/// upstream accepts sends again the new attempt confirms: one effect.
#[tokio::test]
async fn a_signed_request_whose_nonce_the_chain_passed_is_re_signed() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(5).unwrap();
    let q = queue(
        &db,
        &chain,
        &[&proxy],
        5,
        TxQueueConfig {
            finality: Finality::Depth(0),
            ..TxQueueConfig::default()
        },
    );
    let refuse = proxy.add_rule(Rule::error(
        "eth_sendRawTransaction",
        -32603,
        "internal error",
    ));
    let id = q
        .enqueue(
            &transfer(sender, "mint")
                .to(Address::repeat_byte(0x52))
                .worth(7),
        )
        .await
        .unwrap();
    q.tick().await.unwrap();
    assert_eq!(q.status(id).await.unwrap().state, RequestState::Signed);
    // Something else uses nonce 0 of the same account (automine: mined at once).
    let other = alloy::rpc::types::TransactionRequest::default()
        .from(sender)
        .to(Address::repeat_byte(0x99))
        .value(U256::from(5u64))
        .nonce(0);
    chain
        .provider_for(5)
        .unwrap()
        .send_transaction(other)
        .await
        .unwrap()
        .get_receipt()
        .await
        .unwrap();
    // The confirmation pass sees the nonce passed and none of the attempts known.
    let mut ticks = 0;
    while attempts(&db, id).await < 2 {
        q.tick().await.unwrap();
        ticks += 1;
        assert!(ticks < 10, "never re-signed");
    }
    assert!(proxy.hits(refuse) >= 1, "the broadcasts failed");
    let status = q.status(id).await.unwrap();
    assert_eq!(status.state, RequestState::Signed, "re-signed, not failed");
    assert_eq!(status.nonce, Some(1), "at the next free nonce");
    proxy.remove_rule(refuse);
    match settle_within(&q, id, 10).await {
        Some(SettlementVerdict::Confirmed { attempts, hash, .. }) => {
            assert_eq!(attempts.len(), 2);
            assert_eq!(attempts[1].nonce, 1);
            assert_eq!(attempts[1].hash, hash, "the re-signed attempt mined");
        }
        other => panic!("{other:?}"),
    }
    let p = chain.provider();
    assert_eq!(p.get_transaction_count(sender).await.unwrap(), 2);
    assert_eq!(
        p.get_balance(Address::repeat_byte(0x52)).await.unwrap(),
        U256::from(7u64),
        "exactly one effect"
    );
}

/// With two upstreams, the first rewriting the node's "nonce too low" as an internal
/// error: the broadcast fails over to the second upstream, whose verdict (ours mined)
/// moves the request to `broadcast` in the sender pass itself.
#[tokio::test]
async fn an_internal_error_fails_over_to_the_other_upstream() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let first = RpcProxy::start(chain.endpoint()).await.unwrap();
    let second = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(2).unwrap();
    automine(&chain, false).await;
    let q = queue(
        &db,
        &chain,
        &[&first, &second],
        2,
        TxQueueConfig {
            bump_after: None,
            ..Default::default()
        },
    );
    // The first send reaches the node through the first upstream, whose reply is
    // lost; the second upstream is down for that one request.
    let _ = first.add_rule(Rule::drop_response("eth_sendRawTransaction").times(1));
    let down = second.add_rule(Rule::fail_then_recover("eth_sendRawTransaction", 1));
    let rewrite = first.add_rule(Rule::rewrite_error(
        "eth_sendRawTransaction",
        "nonce too low",
        -32603,
        "internal error",
    ));
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    q.sender_pass(sender).await.unwrap();
    assert_eq!(second.hits(down), 1);
    assert_eq!(q.status(id).await.unwrap().state, RequestState::Signed);
    chain.mine().await.unwrap();

    q.sender_pass(sender).await.unwrap();
    assert_eq!(
        first.hits(rewrite),
        1,
        "the first upstream rewrote the verdict"
    );
    assert_eq!(
        q.status(id).await.unwrap().state,
        RequestState::Broadcast,
        "the second upstream's \"nonce too low\" (ours mined) is acceptance"
    );
    let verdict = settle_within(&q, id, 5).await;
    assert!(
        matches!(verdict, Some(SettlementVerdict::Confirmed { .. })),
        "{verdict:?}"
    );
}

/// Fee bumping never replaces nonce N+1 while nonce N of the same sender is unsent:
/// N's broadcast fails (internal error), N+1 is accepted and has no receipt (nothing
/// mines while N is missing), and bumping is due at once. N+1 keeps its one attempt
/// until N is out.
#[tokio::test]
async fn a_later_nonce_is_not_bumped_while_a_lower_one_is_unsent() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(3).unwrap();
    automine(&chain, false).await;
    let q = queue(
        &db,
        &chain,
        &[&proxy],
        3,
        TxQueueConfig {
            bump_after: Some(Duration::ZERO),
            ..Default::default()
        },
    );
    let low = q.enqueue(&transfer(sender, "n")).await.unwrap();
    let high = q.enqueue(&transfer(sender, "n+1")).await.unwrap();
    // Both go out in one batch; only the first item (nonce N) is refused.
    let refuse =
        proxy.add_rule(Rule::error("eth_sendRawTransaction", -32603, "internal error").times(1));
    q.tick().await.unwrap();
    assert_eq!(proxy.hits(refuse), 1);
    let (l, h) = (q.status(low).await.unwrap(), q.status(high).await.unwrap());
    assert_eq!((l.state.as_str(), l.nonce), ("signed", Some(0)));
    assert_eq!((h.state.as_str(), h.nonce), ("broadcast", Some(1)));
    for _ in 0..3 {
        q.confirm_pass().await.unwrap();
    }
    assert_eq!(
        attempts(&db, high).await,
        1,
        "nonce 1 was replaced while nonce 0 was unsent"
    );
    assert_eq!(q.status(low).await.unwrap().state, RequestState::Signed);

    // Nonce 0 goes out with the next pass; both mine.
    proxy.clear_rules();
    automine(&chain, true).await;
    for id in [low, high] {
        let v = settle_within(&q, id, 10).await;
        assert!(
            matches!(v, Some(SettlementVerdict::Confirmed { .. })),
            "{v:?}"
        );
    }
}

/// A pass under way when its cancellation token fires writes nothing afterwards: the
/// receipt of a mined request arrives after the token fired, and the request stays
/// `broadcast` (the next owner settles it).
#[tokio::test]
async fn a_confirmation_pass_writes_nothing_after_its_token_fired() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(4).unwrap();
    automine(&chain, false).await;
    let q = Arc::new(queue(
        &db,
        &chain,
        &[&proxy],
        4,
        TxQueueConfig {
            bump_after: None,
            ..Default::default()
        },
    ));
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    q.sender_pass(sender).await.unwrap();
    assert_eq!(q.status(id).await.unwrap().state, RequestState::Broadcast);
    chain.mine().await.unwrap();

    // The pass's receipt request is held by the proxy while the token fires.
    let held = proxy.add_rule(Rule::latency(
        "eth_getTransactionReceipt",
        Duration::from_secs(4),
    ));
    proxy.reset_counts();
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let q = q.clone();
        let token = token.clone();
        async move { q.run(token).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.count("eth_getTransactionReceipt") == 0 {
        assert!(
            Instant::now() < deadline,
            "the pass never asked for receipts"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    token.cancel();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("run returns after the token fired")
        .unwrap();
    assert!(proxy.hits(held) >= 1);
    assert_eq!(
        q.status(id).await.unwrap().state,
        RequestState::Broadcast,
        "settled after the token fired"
    );

    // The receipt was there: a pass of the next owner settles it.
    proxy.clear_rules();
    let v = settle_within(&q, id, 3).await;
    assert!(
        matches!(v, Some(SettlementVerdict::Confirmed { .. })),
        "{v:?}"
    );
}

/// The same for the sender round: the token fires while the round reads the sender's
/// balance (before anything is signed); the round signs, commits and sends nothing,
/// and the request stays `queued`.
#[tokio::test]
async fn a_sender_round_signs_and_sends_nothing_after_its_token_fired() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(6).unwrap();
    let q = Arc::new(queue(&db, &chain, &[&proxy], 6, TxQueueConfig::default()));
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    let held = proxy.add_rule(Rule::latency("eth_getBalance", Duration::from_secs(4)));
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let q = q.clone();
        let token = token.clone();
        async move { q.run(token).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.count("eth_getBalance") == 0 {
        assert!(
            Instant::now() < deadline,
            "the round never read the balance"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    token.cancel();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("run returns after the token fired")
        .unwrap();
    assert!(proxy.hits(held) >= 1);
    let status = q.status(id).await.unwrap();
    assert_eq!(
        (status.state.as_str(), status.nonce),
        ("queued", None),
        "signed after the token fired"
    );
    assert_eq!(
        proxy.count("eth_sendRawTransaction"),
        0,
        "sent after the token fired"
    );

    proxy.clear_rules();
    let v = settle_within(&q, id, 5).await;
    assert!(
        matches!(v, Some(SettlementVerdict::Confirmed { .. })),
        "{v:?}"
    );
}

/// Issue 32 §8: a `signed` request whose every broadcast fails backs off (per request,
/// persisted): over 40 back-to-back passes it is sent a handful of times, not once per
/// pass, and the passes it skipped are counted. Once the upstream accepts sends again it
/// goes out and confirms.
#[tokio::test]
async fn a_request_whose_broadcasts_keep_failing_backs_off() {
    let handle = metrics();
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(7).unwrap();
    let q = queue(&db, &chain, &[&proxy], 7, TxQueueConfig::default());
    let refuse = proxy.add_rule(Rule::error(
        "eth_sendRawTransaction",
        -32603,
        "internal error",
    ));
    let id = q.enqueue(&transfer(sender, "mint")).await.unwrap();
    let passes = 40;
    for _ in 0..passes {
        q.tick().await.unwrap();
    }
    let sends = proxy.hits(refuse);
    assert!(sends >= 2, "it was tried: {sends}");
    assert!(
        sends < passes / 2,
        "{sends} sends in {passes} passes: no backoff"
    );
    assert_eq!(q.status(id).await.unwrap().state, RequestState::Signed);
    let rendered = handle.render();
    assert!(
        rendered
            .lines()
            .any(|l| l.starts_with("keel_txq_broadcasts_deferred_total{")
                && l.contains(&format!("chain_id=\"{}\"", chain.chain_id()))),
        "{rendered}"
    );
    proxy.remove_rule(refuse);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        q.tick().await.unwrap();
        if let Some(v) = q.status(id).await.unwrap().verdict {
            assert!(matches!(v, SettlementVerdict::Confirmed { .. }), "{v:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never sent after the upstream recovered"
        );
    }
}
