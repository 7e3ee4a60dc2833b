//! The `newHeads` watch against real Anvil through a TCP relay that can go silent
//! (issue 32 §8): a subscription whose stream stops while the connection stays open
//! and the chain keeps making blocks is counted down and opened again.

use anvil_tests::TestChain;
use keel_chain::{HeadSignal, HeadWatchConfig, watch_heads};
use keel_units::ChainId;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Relays TCP connections to a local port; `mute` silences the node → client direction
/// of every connection open now (bytes read and dropped, the connection kept open).
struct SilentRelay {
    port: u16,
    connections: Arc<AtomicUsize>,
    muted_up_to: Arc<AtomicUsize>,
}

impl SilentRelay {
    async fn start(target: u16) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        let muted_up_to = Arc::new(AtomicUsize::new(0));
        let (count, muted) = (connections.clone(), muted_up_to.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let id = count.fetch_add(1, Ordering::SeqCst) + 1;
                let muted = muted.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut cr, mut cw) = inbound.into_split();
                    let (mut sr, mut sw) = outbound.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    });
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        if id <= muted.load(Ordering::SeqCst) {
                            continue;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    up.abort();
                });
            }
        });
        Ok(Self {
            port,
            connections,
            muted_up_to,
        })
    }

    fn mute(&self) {
        self.muted_up_to
            .store(self.connections.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Waits (bounded) for a head on `heads`; returns its number.
async fn next_head(heads: &HeadSignal, within: Duration) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(h) = heads.take() {
            return Some(h.number);
        }
        if tokio::time::timeout_at(deadline, heads.notify().notified())
            .await
            .is_err()
        {
            return None;
        }
    }
}

#[tokio::test]
async fn a_silent_subscription_is_counted_down_and_opened_again() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    let chain = TestChain::builder().block_time(1).start().await.unwrap();
    let relay = SilentRelay::start(chain.port()).await.unwrap();
    let heads = Arc::new(HeadSignal::new());
    let stop = CancellationToken::new();
    let config = HeadWatchConfig {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(500),
        silence: Duration::from_secs(3),
        ..HeadWatchConfig::new(format!("ws://127.0.0.1:{}", relay.port))
    };
    let watch = tokio::spawn(watch_heads(
        ChainId(chain.chain_id()),
        config,
        heads.clone(),
        stop.clone(),
    ));
    let first = next_head(&heads, Duration::from_secs(30))
        .await
        .expect("a head by subscription");
    assert_eq!(relay.connections(), 1);

    // The stream goes silent; the connection stays open and the chain moves on.
    relay.mute();
    let _ = heads.take();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let resumed = loop {
        match next_head(&heads, Duration::from_secs(5)).await {
            Some(n) if n > first && relay.connections() >= 2 => break n,
            _ => assert!(
                tokio::time::Instant::now() < deadline,
                "the silent subscription was never reopened ({} connections)",
                relay.connections()
            ),
        }
    };
    assert!(resumed > first);
    let rendered = handle.render();
    let reconnects = rendered
        .lines()
        .find(|l| l.starts_with("keel_chain_head_subscription_reconnects_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(reconnects >= 1.0, "the outage is visible: {rendered}");
    stop.cancel();
    watch.await.unwrap();
}
