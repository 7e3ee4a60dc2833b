//! The queue behind the fault-injecting proxy (`anvil_tests::proxy`): lost responses,
//! temporarily missing receipts, and geth's replacement rule.

use crate::common::transfer;
use alloy::providers::Provider;
use anvil_tests::TestChain;
use anvil_tests::proxy::{RpcProxy, Rule};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_store::testing::TestDatabase;
use keel_txq::{LocalSigner, RequestState, SettlementVerdict, TxQueue, TxQueueConfig};
use keel_units::ChainId;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

fn queue(
    db: &TestDatabase,
    chain: &TestChain,
    proxy: &RpcProxy,
    idx: usize,
    config: TxQueueConfig,
) -> TxQueue {
    let mut upstream = UpstreamConfig::new(vec![proxy.url().to_string()]);
    upstream.request_timeout = Duration::from_secs(5);
    let pool = UpstreamPool::new(ChainId(chain.chain_id()), upstream).unwrap();
    let mut q = TxQueue::new(db.pool().clone(), Arc::new(pool), config).unwrap();
    q.add_signer(Arc::new(LocalSigner::new(
        chain.signer(idx).unwrap().clone(),
    )));
    q
}

async fn settle(q: &TxQueue, id: Uuid, between: impl AsyncFn()) -> SettlementVerdict {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        q.tick().await.unwrap();
        if let Some(v) = q.status(id).await.unwrap().verdict {
            return v;
        }
        between().await;
        assert!(Instant::now() < deadline, "never settled");
    }
}

#[tokio::test]
async fn lost_send_response_makes_no_second_logical_transaction() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(1).unwrap();
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let q = queue(
        &db,
        &chain,
        &proxy,
        1,
        TxQueueConfig {
            bump_after: None,
            ..Default::default()
        },
    );
    let rule = proxy.add_rule(Rule::drop_response("eth_sendRawTransaction").times(1));
    let id = q.enqueue(&transfer(sender, "lost")).await.unwrap();
    q.tick().await.unwrap();
    assert_eq!(
        proxy.hits(rule),
        1,
        "the node got the transaction, the caller saw a timeout"
    );
    assert_eq!(
        q.status(id).await.unwrap().state,
        RequestState::Signed,
        "not known to be broadcast"
    );
    let verdict = settle(&q, id, async || chain.mine().await.unwrap()).await;
    match verdict {
        SettlementVerdict::Confirmed { attempts, .. } => assert_eq!(attempts.len(), 1),
        other => panic!("{other:?}"),
    }
    assert!(
        proxy.count("eth_sendRawTransaction") >= 2,
        "the same bytes were sent again"
    );
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn receipt_temporarily_null_after_mining_is_not_a_failure() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(2).unwrap();
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let q = queue(
        &db,
        &chain,
        &proxy,
        2,
        TxQueueConfig {
            bump_after: None,
            ..Default::default()
        },
    );
    let id = q.enqueue(&transfer(sender, "null")).await.unwrap();
    q.tick().await.unwrap();
    chain.mine().await.unwrap();
    let rule = proxy.add_rule(Rule::null_result("eth_getTransactionReceipt").times(3));
    for _ in 0..3 {
        q.tick().await.unwrap();
        assert_eq!(
            q.status(id).await.unwrap().state,
            RequestState::Broadcast,
            "a null receipt is not a verdict"
        );
    }
    assert_eq!(proxy.hits(rule), 3);
    let verdict = settle(&q, id, async || {}).await;
    assert!(
        matches!(verdict, SettlementVerdict::Confirmed { .. }),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn replacements_follow_geths_ten_percent_rule() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(3).unwrap();
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let geth = proxy.add_rule(Rule::geth_replacement(10));
    let q = queue(
        &db,
        &chain,
        &proxy,
        3,
        TxQueueConfig {
            bump_after: Some(Duration::ZERO),
            ..Default::default()
        },
    );
    let id = q.enqueue(&transfer(sender, "bumped")).await.unwrap();
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    assert_eq!(proxy.hits(geth), 0, "every replacement met the +10 % rule");
    let verdict = settle(&q, id, async || chain.mine().await.unwrap()).await;
    match verdict {
        SettlementVerdict::Confirmed { attempts, hash, .. } => {
            assert!(attempts.len() >= 3);
            assert_eq!(
                attempts.last().unwrap().hash,
                hash,
                "the last accepted replacement mined"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(sender)
            .await
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn an_underpriced_replacement_is_refused_and_the_original_still_settles() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(4).unwrap();
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    // A node stricter than Keel's 12 % bump (+50 %): every replacement is refused.
    let geth = proxy.add_rule(Rule::geth_replacement(50));
    let q = queue(
        &db,
        &chain,
        &proxy,
        4,
        TxQueueConfig {
            bump_after: Some(Duration::ZERO),
            ..Default::default()
        },
    );
    let id = q.enqueue(&transfer(sender, "cheap")).await.unwrap();
    q.tick().await.unwrap();
    q.tick().await.unwrap();
    assert!(
        proxy.hits(geth) >= 1,
        "the node refused an underpriced replacement"
    );
    assert_eq!(
        q.status(id).await.unwrap().state,
        RequestState::Broadcast,
        "a refused replacement is not a verdict"
    );
    let verdict = settle(&q, id, async || chain.mine().await.unwrap()).await;
    match verdict {
        SettlementVerdict::Confirmed { attempts, hash, .. } => {
            assert_eq!(attempts[0].hash, hash, "the original mined");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_bump_below_ten_percent_is_refused_at_configuration() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let pool = UpstreamPool::new(
        ChainId(chain.chain_id()),
        UpstreamConfig::new(vec![chain.endpoint().to_string()]),
    )
    .unwrap();
    let err = TxQueue::new(
        db.pool().clone(),
        Arc::new(pool),
        TxQueueConfig {
            bump_percent: 9,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            keel_txq::TxqError::Config {
                key: "bumpPercent",
                ..
            }
        ),
        "{err:?}"
    );
}

/// A watch pass cut short (its receipts read failed) is looked at again on the next
/// pass though the chain stands still: a settled write on a chain whose head is final
/// (depth 0) is marked final once the RPC recovers, without waiting for a new block.
/// Before the fix the failed pass was remembered as done and, with the head unchanged,
/// every later pass skipped the write (its watch never ended on an idle chain).
#[tokio::test]
async fn a_failed_watch_pass_is_retried_while_the_chain_stands_still() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let sender = chain.account(2).unwrap();
    let q = queue(
        &db,
        &chain,
        &proxy,
        2,
        TxQueueConfig {
            finality: keel_txq::Finality::Depth(0),
            ..Default::default()
        },
    );
    let id = q.enqueue(&transfer(sender, "watch")).await.unwrap();
    settle(&q, id, async || {}).await;
    let is_final = async || -> bool {
        sqlx::query_scalar("SELECT final_at IS NOT NULL FROM txq_request WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    assert!(!is_final().await, "the settling pass watches next time");
    let rule = proxy.add_rule(
        Rule::error("eth_getTransactionReceipt", -32603, "internal error").times(u64::MAX),
    );
    q.tick().await.unwrap();
    assert!(proxy.hits(rule) > 0, "the watch pass read receipts");
    assert!(!is_final().await, "the watch pass failed");
    proxy.remove_rule(rule);
    let head = chain.block_number().await.unwrap();
    q.tick().await.unwrap();
    assert_eq!(chain.block_number().await.unwrap(), head, "no block since");
    assert!(is_final().await, "the failed pass is looked at again");
}

/// Two writes mined in one block but settled in different passes (one receipt read
/// answered null once): the second is marked final as well, without a new block. Before
/// the fix the watch remembered only how many rows it saw, so the second write (one row
/// again, the head unchanged) was skipped until the chain moved.
#[tokio::test]
async fn writes_of_one_block_settled_in_different_passes_are_all_marked_final() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    chain
        .provider()
        .raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let mut q = queue(
        &db,
        &chain,
        &proxy,
        2,
        TxQueueConfig {
            finality: keel_txq::Finality::Depth(0),
            bump_after: None,
            ..Default::default()
        },
    );
    q.add_signer(Arc::new(keel_txq::LocalSigner::new(
        chain.signer(3).unwrap().clone(),
    )));
    let a = q
        .enqueue(&transfer(chain.account(2).unwrap(), "one-block-a"))
        .await
        .unwrap();
    let b = q
        .enqueue(&transfer(chain.account(3).unwrap(), "one-block-b"))
        .await
        .unwrap();
    q.tick().await.unwrap();
    chain.mine().await.unwrap();
    let head = chain.block_number().await.unwrap();
    let rule = proxy.add_rule(Rule::null_result("eth_getTransactionReceipt").times(1));
    let unfinal = async || -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM txq_request WHERE state = 'settled' AND final_at IS NULL",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        q.tick().await.unwrap();
        if unsettled(&q, &[a, b]).await == 0 && unfinal().await == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a write of the block never final"
        );
    }
    assert_eq!(proxy.hits(rule), 1, "one receipt read was answered null");
    assert_eq!(chain.block_number().await.unwrap(), head, "no block since");
    let blocks: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT (verdict->>'block')::int8 FROM txq_request ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(blocks, [Some(head as i64), Some(head as i64)], "one block");
}

/// How many of `ids` have no verdict yet.
async fn unsettled(q: &TxQueue, ids: &[Uuid]) -> usize {
    let mut open = 0;
    for id in ids {
        if q.status(*id).await.unwrap().verdict.is_none() {
            open += 1;
        }
    }
    open
}
