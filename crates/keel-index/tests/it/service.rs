//! The crate's background services: the tip follow loop plans history below the
//! settled height and follows the head, the history loop drains the planned ranges,
//! and both stop on their cancellation token.

use crate::common::env_on;
use alloy::primitives::Address;
use anvil_tests::TestChain;
use keel_index::history::pending_ranges;
use keel_index::{HistoryConfig, HistoryWorker, TipConfig, follow_tip, read, work_history};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_tip_and_history_services_index_everything_and_stop_on_cancel() -> anyhow::Result<()> {
    // `finalized` is head − 2: the early mint ends below it, in the planned history.
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await?;
    let env = env_on(chain).await?;
    let asset = env.mintable("SVC").await?;
    let early = Address::repeat_byte(0x11);
    env.mint(asset.token, early, 5).await?;
    let early_block = env.chain.block_number().await?;
    for _ in 0..4 {
        env.chain.mine().await?;
    }
    let db = env.db.pool().clone();
    let stop = CancellationToken::new();
    let poll = Duration::from_millis(50);

    let tip = tokio::spawn({
        let (db, node, stop) = (db.clone(), env.node.clone(), stop.clone());
        async move { follow_tip(db, node, TipConfig::new(2), 2, "svc-1", poll, stop).await }
    });
    let worker = Arc::new(HistoryWorker::new(
        db.clone(),
        env.node.clone(),
        "svc-1/history",
        HistoryConfig::default(),
    )?);
    let (_serving_tx, serving) = tokio::sync::watch::channel(true);
    let history = tokio::spawn(work_history(worker, serving, poll, stop.clone()));

    // A transfer after the services started: the tip ingests it.
    let late = Address::repeat_byte(0x22);
    env.mint(asset.token, late, 7).await?;
    let head = env.chain.block_number().await?;
    read::wait_for_block(&db, env.chain_id, head, Duration::from_secs(30), poll).await?;
    // The history below the first tip block is worked off by the history service.
    keel_store::testing::until("the history drained", Duration::from_secs(30), || async {
        anyhow::Ok(pending_ranges(&db, env.chain_id).await? == 0)
    })
    .await;
    let planned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM index_range WHERE chain_id = $1 AND to_block >= $2",
    )
    .bind(i64::try_from(env.chain_id.get())?)
    .bind(i64::try_from(early_block)?)
    .fetch_one(&db)
    .await?;
    assert!(
        planned > 0,
        "the early mint was left to the history service"
    );
    let balances = read::balances(&db, env.chain_id, asset.token).await?;
    assert!(balances.contains(&(early, "5".to_owned())), "{balances:?}");
    assert!(balances.contains(&(late, "7".to_owned())), "{balances:?}");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), tip).await??;
    tokio::time::timeout(Duration::from_secs(10), history).await??;
    Ok(())
}

/// A TCP forwarder to Anvil's port that can cut every open connection (a WebSocket
/// upstream going away mid-run) while still accepting new ones.
struct CuttableProxy {
    port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    open: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl CuttableProxy {
    async fn start(target: u16) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (count, tasks) = (connections.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tasks.lock().unwrap().push(task.abort_handle());
            }
        });
        Ok(Self {
            port,
            connections,
            open,
        })
    }

    /// Closes every connection open now.
    fn cut(&self) {
        for t in self.open.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// With a `newHeads` subscription the tip follows new blocks although its fallback poll
/// is ten minutes: each head wakes a round. A cut WebSocket is reopened (a second
/// connection through the proxy) and new blocks keep arriving in the index.
#[tokio::test]
async fn new_heads_by_subscription_wake_the_tip_and_a_cut_websocket_is_reopened()
-> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let proxy = CuttableProxy::start(chain.port()).await?;
    let env = env_on(chain).await?;
    let db = env.db.pool().clone();
    let stop = CancellationToken::new();
    let fallback = Duration::from_secs(600);
    let heads = keel_chain::HeadWatchConfig {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(500),
        ..keel_chain::HeadWatchConfig::new(format!("ws://127.0.0.1:{}", proxy.port))
    };
    let tip = tokio::spawn({
        let (db, node, stop) = (db.clone(), env.node.clone(), stop.clone());
        async move {
            keel_index::follow_tip_with_heads(
                db,
                node,
                TipConfig::new(2),
                2,
                "heads-1",
                fallback,
                Some(heads),
                stop,
            )
            .await;
        }
    });
    let probe = Duration::from_millis(50);
    // The first rounds catch up with the head at start.
    let start = env.chain.block_number().await?;
    read::wait_for_block(&db, env.chain_id, start, Duration::from_secs(30), probe).await?;
    // A new block: only its head can start the next round (the poll is 10 min away).
    let asset = env.mintable("HEAD").await?;
    env.mint(asset.token, Address::repeat_byte(0x33), 3).await?;
    let head = env.chain.block_number().await?;
    read::wait_for_block(&db, env.chain_id, head, Duration::from_secs(30), probe).await?;
    let balances = read::balances(&db, env.chain_id, asset.token).await?;
    assert!(
        balances.contains(&(Address::repeat_byte(0x33), "3".to_owned())),
        "{balances:?}"
    );
    assert_eq!(proxy.connections(), 1, "one subscription so far");

    // The WebSocket goes away; the watch reopens it, and later blocks are followed.
    proxy.cut();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        env.chain.mine().await?;
        let head = env.chain.block_number().await?;
        if read::wait_for_block(&db, env.chain_id, head, Duration::from_secs(2), probe)
            .await
            .is_ok()
            && proxy.connections() >= 2
        {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the tip did not follow after the WebSocket was cut ({} connections)",
            proxy.connections()
        );
    }
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), tip).await??;
    Ok(())
}
