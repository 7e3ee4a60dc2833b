//! New heads by subscription: `eth_subscribe("newHeads")` over WebSocket (the Ethereum
//! JSON-RPC pubsub API, <https://geth.ethereum.org/docs/interacting-with-geth/rpc/pubsub>),
//! for a loop that would otherwise poll `eth_blockNumber` to learn of a new block.
//!
//! Each head is published on a [`HeadSignal`]: it wakes the caller's loop and hands it
//! the announced header (number, hash, parent hash, timestamp), so the loop need not ask
//! the node for the head or that block's header again. The loop still reads everything
//! else (logs, blocks it missed) over its HTTP upstreams, and its parent-hash walk
//! decides what is canonical: a missed, stale or reordered head changes nothing but
//! when the loop looks. The caller keeps a slower poll as the safety net. A closed or failed subscription is
//! re-established with a capped exponential backoff; while it is down the gauge
//! `keel_chain_head_subscription_up` reads 0 and a WARN says why.
//!
//! A **silent** subscription counts as down too (issue 32 §8): alloy's WebSocket
//! transport reconnects by itself and can leave a subscription that never delivers
//! again while the connection looks open. When no head arrived for
//! [`HeadWatchConfig::silence`], the node's head is read over the same connection: if
//! it moved past the last head received (or the read fails or times out), the
//! subscription is dropped, counted down, and opened again (a reconnect); a chain that
//! simply made no block keeps its subscription.
//!
//! ## Metrics (label `chain_id` only)
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `keel_chain_head_subscription_up` | gauge | 1 while a `newHeads` subscription is open and not found silent, else 0 |
//! | `keel_chain_head_subscription_heads_total` | counter | heads received (each woke the loop) |
//! | `keel_chain_head_subscription_reconnects_total` | counter | subscriptions (re)opened after the first (after a close, a failure or a silent stream) |

use crate::BlockHeader;
use alloy::primitives::U256;
use alloy::providers::{Provider, ProviderBuilder, WsConnect};
use keel_units::{ChainId, GasPrice};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TARGET: &str = "keel::chain::heads";

/// Where and how to subscribe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadWatchConfig {
    /// The upstream's WebSocket endpoint (`ws://` or `wss://`); not logged (it may
    /// carry a provider's API key in its path).
    pub ws_url: String,
    /// The first wait after a failed or closed subscription (default 500 ms); doubled
    /// per consecutive failure up to `backoff_max`.
    pub backoff_initial: Duration,
    /// The longest wait between attempts (default 30 s).
    pub backoff_max: Duration,
    /// How long without a head before the subscription is checked against the node's
    /// head (default 30 s: a few block times of Ethereum). Set it to a few block
    /// times of the chain.
    pub silence: Duration,
}

impl HeadWatchConfig {
    /// A watch of `ws_url` with the default backoff.
    pub fn new(ws_url: impl Into<String>) -> Self {
        Self {
            ws_url: ws_url.into(),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            silence: Duration::from_secs(30),
        }
    }
}

/// Where a head subscription publishes: a wake-up for the loop that follows the chain
/// and the newest head announced since that loop last took one.
///
/// [`watch_heads`] calls [`HeadSignal::publish`] per head; the loop waits on
/// [`HeadSignal::notify`] and then calls [`HeadSignal::take`]. Heads that arrive while
/// the loop is busy collapse into the newest one (the loop reads any blocks it skipped
/// by number), and a wake-up without a head (the subscription just opened) makes the
/// loop ask the node for the head itself.
#[derive(Debug, Default)]
pub struct HeadSignal {
    wake: tokio::sync::Notify,
    latest: Mutex<Option<BlockHeader>>,
}

impl HeadSignal {
    /// An empty signal (no head announced, no wake-up pending).
    pub fn new() -> Self {
        Self::default()
    }

    /// The wake-up: notified once per [`HeadSignal::publish`] or
    /// [`HeadSignal::wake_up`] (a permit is kept when nobody waits).
    pub fn notify(&self) -> &tokio::sync::Notify {
        &self.wake
    }

    /// Records `header` as the newest head (replacing one not yet taken: the node's
    /// latest announcement is its current view, even a lower block after a reorg to a
    /// shorter chain) and wakes the loop.
    pub fn publish(&self, header: BlockHeader) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(header);
        self.wake.notify_one();
    }

    /// Wakes the loop without a head (it then reads the head from the node).
    pub fn wake_up(&self) {
        self.wake.notify_one();
    }

    /// The newest head announced since the last call, if any (each head is handed out
    /// once: a round without one reads the node's head itself).
    pub fn take(&self) -> Option<BlockHeader> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Describes the metrics of this module (units in the descriptions); called by the
/// crate's [`crate::describe_metrics`].
pub(crate) fn describe_metrics() {
    metrics::describe_gauge!(
        "keel_chain_head_subscription_up",
        metrics::Unit::Count,
        "1 while a newHeads subscription to the chain's WebSocket upstream is open, else 0 (boolean)."
    );
    metrics::describe_counter!(
        "keel_chain_head_subscription_heads_total",
        metrics::Unit::Count,
        "New heads received by subscription; each woke the tip loop (count)."
    );
    metrics::describe_counter!(
        "keel_chain_head_subscription_reconnects_total",
        metrics::Unit::Count,
        "newHeads subscriptions opened again after the first (count)."
    );
}

/// Why one subscription ended (value-free: no URL, no payload).
#[derive(Debug, thiserror::Error)]
enum SubscriptionEnd {
    #[error("the WebSocket connection could not be opened ({0})")]
    Connect(String),
    #[error("eth_subscribe(newHeads) was refused ({0})")]
    Subscribe(String),
    #[error("the subscription closed")]
    Closed,
    #[error("no head for the silence window while the node's head moved (or it did not answer)")]
    Silent,
}

/// Keeps a `newHeads` subscription to `config.ws_url` open until `stop` fires, and
/// publishes every head on `heads` ([`HeadSignal::publish`]; a bare wake-up when a
/// subscription opens). The chain's id `chain` labels the metrics and logs and types
/// the heads' base fee. Never returns an error: a failure is logged at WARN (once per outage,
/// then every tenth attempt), counted, and retried after the backoff; run it as a
/// supervised task beside the loop it wakes.
pub async fn watch_heads(
    chain: ChainId,
    config: HeadWatchConfig,
    heads: Arc<HeadSignal>,
    stop: CancellationToken,
) {
    let labels = [("chain_id", chain.get().to_string())];
    let up = metrics::gauge!("keel_chain_head_subscription_up", &labels);
    let received = metrics::counter!("keel_chain_head_subscription_heads_total", &labels);
    let reconnects = metrics::counter!("keel_chain_head_subscription_reconnects_total", &labels);
    up.set(0.0);
    let mut opened_before = false;
    let mut failures: u32 = 0;
    loop {
        let attempt = async {
            let provider = ProviderBuilder::new()
                .connect_ws(WsConnect::new(config.ws_url.clone()))
                .await
                .map_err(|e| SubscriptionEnd::Connect(error_kind(&e.to_string())))?;
            let mut sub = provider
                .subscribe_blocks()
                .await
                .map_err(|e| SubscriptionEnd::Subscribe(error_kind(&e.to_string())))?;
            if opened_before {
                reconnects.increment(1);
            }
            opened_before = true;
            up.set(1.0);
            if failures > 0 {
                tracing::info!(target: TARGET, chain_id = chain.get(), failures, "newHeads subscription open again");
            }
            failures = 0;
            // Heads may have been missed while no subscription was open: the loop asks
            // the node for the head once.
            heads.wake_up();
            // The last head received (a baseline read when none came yet).
            let mut last: Option<u64> = None;
            loop {
                let header = match tokio::time::timeout(config.silence, sub.recv()).await {
                    Ok(Ok(header)) => header,
                    Ok(Err(_)) => break,
                    Err(_) => {
                        // Silent: is the chain quiet, or the subscription dead?
                        let head =
                            tokio::time::timeout(config.silence, provider.get_block_number()).await;
                        match head {
                            Ok(Ok(n)) if last.is_none_or(|h| n <= h) => {
                                last = Some(last.map_or(n, |h| h.max(n)));
                                continue;
                            }
                            _ => return Err(SubscriptionEnd::Silent),
                        }
                    }
                };
                last = Some(header.number);
                received.increment(1);
                tracing::trace!(target: TARGET, chain_id = chain.get(), number = header.number, "new head");
                heads.publish(BlockHeader {
                    number: header.number,
                    hash: header.hash,
                    parent_hash: header.parent_hash,
                    timestamp: header.timestamp,
                    base_fee_per_gas: header
                        .base_fee_per_gas
                        .map(|w| GasPrice::new(chain, U256::from(w))),
                });
            }
            Err::<(), _>(SubscriptionEnd::Closed)
        };
        let ended = tokio::select! {
            () = stop.cancelled() => break,
            r = attempt => r,
        };
        up.set(0.0);
        failures = failures.saturating_add(1);
        if let Err(e) = ended
            && (failures == 1 || failures.is_multiple_of(10))
        {
            tracing::warn!(target: TARGET, chain_id = chain.get(), failures, error = %e,
                "newHeads subscription down; the tip loop polls until it is back");
        }
        let exp = failures.saturating_sub(1).min(16);
        let wait = config
            .backoff_initial
            .saturating_mul(1u32 << exp)
            .min(config.backoff_max);
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
    up.set(0.0);
}

/// The first line of a transport error, cut to 120 characters, with anything that looks
/// like a URL removed (an endpoint may hold an API key).
fn error_kind(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let cleaned: Vec<&str> = line
        .split_whitespace()
        .filter(|w| !w.contains("://"))
        .collect();
    cleaned.join(" ").chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::{BlockHeader, HeadSignal, error_kind};
    use alloy::primitives::B256;

    fn head(number: u64) -> BlockHeader {
        BlockHeader {
            number,
            hash: B256::with_last_byte(number as u8),
            parent_hash: B256::with_last_byte(number.saturating_sub(1) as u8),
            timestamp: number,
            base_fee_per_gas: None,
        }
    }

    #[test]
    fn heads_collapse_into_the_newest_and_are_taken_once() {
        let s = HeadSignal::new();
        assert_eq!(s.take(), None);
        s.publish(head(5));
        s.publish(head(7));
        assert_eq!(s.take(), Some(head(7)));
        // The latest announcement wins, even a lower block (a reorg to a shorter chain).
        s.publish(head(9));
        s.publish(head(8));
        assert_eq!(s.take(), Some(head(8)));
        assert_eq!(s.take(), None, "a head is handed out once");
        s.wake_up();
        assert_eq!(s.take(), None, "a bare wake-up carries no head");
    }

    #[test]
    fn error_text_drops_urls() {
        assert_eq!(
            error_kind("connection refused at ws://key@host:8546/abc\nmore"),
            "connection refused at"
        );
    }
}
