//! A pool of JSON-RPC upstreams for one chain.
//!
//! Upstreams are tried in configured order, skipping those marked unhealthy (unless
//! all are). A **transport** failure (connection refused, timeout, HTTP error status,
//! unparsable response) counts against the upstream and the request fails over to the
//! next; after `failureThreshold` consecutive failures the upstream is unhealthy for
//! `cooldown`, then tried again. A JSON-RPC **error answer** is classified
//! ([`crate::node_error`]). When it is the node's verdict on the request
//! ([`crate::NodeErrorKind::is_transaction_level`]: nonce too low, already known,
//! insufficient funds, underpriced, reverted, ...) it is returned to the caller at once:
//! a node that says "nonce too low" is healthy, and asking another node would not
//! change the answer. Any other error answer (an internal error `-32603` without a known
//! text, a gateway's or provider's error, rate limiting, unknown text) says nothing
//! about the request: it counts against the upstream like a transport failure and the
//! request fails over to the next upstream; when every upstream answered so, the last
//! such answer is returned. Each upstream has its own `governor` rate limiter (requests
//! per second with a burst).
//!
//! Health is kept per upstream **and method class** ([`MethodClass`]: reads, and sends
//! — `eth_sendRawTransaction`; issue 32 §8): an upstream that fails every send while it
//! serves reads (a provider whose write path is broken) goes into cooldown for sends
//! only and stays first in line for reads, and the other way round.

use crate::node_error::classify_payload;
use crate::{ChainError, Result};
use alloy::eips::BlockNumberOrTag;
use alloy::primitives::{Address, B256, Bytes, U64, U256};
use alloy::rpc::client::{ClientBuilder, RpcClient};
use alloy::rpc::json_rpc::{RpcRecv, RpcSend};
use alloy::rpc::types::state::StateOverride;
use alloy::rpc::types::{Log, TransactionReceipt, TransactionRequest};
use alloy::transports::{RpcError, TransportErrorKind};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use keel_units::{ChainId, GasPrice, NativeAmount, Wei};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Settings of one chain's upstream pool.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// JSON-RPC URLs in failover order (http or https). May embed API keys; never
    /// logged or shown in errors.
    pub urls: Vec<String>,
    /// Sustained requests per second per upstream (governor quota), default 500.
    /// Hosted providers sell plans by this number: set it to the plan's limit.
    pub requests_per_second: u32,
    /// Burst allowance per upstream, default 1000.
    pub burst: u32,
    /// Consecutive transport failures that mark an upstream unhealthy, default 3.
    pub failure_threshold: u32,
    /// How long an unhealthy upstream is skipped, default 5 s.
    pub cooldown: Duration,
    /// Deadline of one request to one upstream, default 10 s.
    pub request_timeout: Duration,
}

impl UpstreamConfig {
    /// Defaults for `urls`.
    pub fn new(urls: Vec<String>) -> Self {
        Self {
            urls,
            requests_per_second: 500,
            burst: 1000,
            failure_threshold: 3,
            cooldown: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// A block header as Keel reads it (`eth_getBlockByNumber(…, false)`), decoded at this
/// boundary: numbers as integers, the base fee as a [`GasPrice`] of the pool's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// The block number.
    pub number: u64,
    /// The block hash.
    pub hash: B256,
    /// The parent block's hash.
    pub parent_hash: B256,
    /// The block's timestamp, Unix seconds.
    pub timestamp: u64,
    /// The EIP-1559 base fee (wei per gas); `None` before London or on chains without it.
    pub base_fee_per_gas: Option<GasPrice>,
}

/// The wire form of [`BlockHeader`] (unknown fields, the transaction hashes included,
/// are skipped).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireHeader {
    number: U64,
    hash: B256,
    parent_hash: B256,
    timestamp: U64,
    #[serde(default)]
    base_fee_per_gas: Option<U256>,
}

/// The parameter object of `eth_getLogs`: a block range or one block hash, and the
/// emitting contracts.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct LogFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    from_block: Option<U64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    to_block: Option<U64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_hash: Option<B256>,
    address: Vec<Address>,
}

/// What a JSON-RPC method does, for health kept per upstream and class: an upstream
/// may serve one class and fail the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MethodClass {
    /// Everything but sending transactions.
    Reads,
    /// `eth_sendRawTransaction`.
    Sends,
}

impl MethodClass {
    /// The class of `method`.
    pub fn of(method: &str) -> Self {
        if method == "eth_sendRawTransaction" {
            MethodClass::Sends
        } else {
            MethodClass::Reads
        }
    }

    fn slot(self) -> usize {
        match self {
            MethodClass::Reads => 0,
            MethodClass::Sends => 1,
        }
    }
}

/// The health of one upstream, by position (URLs are not shown: they can hold keys).
/// The fields without a class are about reads; `sends_*` about sends
/// ([`MethodClass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamHealth {
    /// Position in the configured list.
    pub index: usize,
    /// Reads: false while in cooldown after repeated failures.
    pub healthy: bool,
    /// Reads: failures since the last success.
    pub consecutive_failures: u32,
    /// Requests sent to it (both classes).
    pub requests: u64,
    /// Failures in total (both classes).
    pub failures: u64,
    /// Sends: false while in cooldown after repeated failures.
    pub sends_healthy: bool,
    /// Sends: failures since the last success.
    pub sends_consecutive_failures: u32,
}

#[derive(Debug, Default)]
struct HealthState {
    consecutive_failures: u32,
    unhealthy_until: Option<Instant>,
    requests: u64,
    failures: u64,
}

struct Upstream {
    client: RpcClient,
    limiter: DefaultDirectRateLimiter,
    /// Per [`MethodClass`] (reads, sends).
    health: [Mutex<HealthState>; 2],
}

/// One chain's upstreams. Cheap to share behind an `Arc`.
pub struct UpstreamPool {
    chain: ChainId,
    config: UpstreamConfig,
    upstreams: Vec<Upstream>,
}

impl std::fmt::Debug for UpstreamPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamPool")
            .field("chain", &self.chain)
            .field("upstreams", &self.upstreams.len())
            .finish()
    }
}

enum Attempt<R> {
    Done(R),
    Node(crate::NodeError),
    Transport,
}

impl UpstreamPool {
    /// Builds the pool (no request is made).
    ///
    /// # Errors
    /// [`ChainError::Config`] for an empty URL list, a URL that is not http(s), or a
    /// zero rate.
    pub fn new(chain: ChainId, config: UpstreamConfig) -> Result<Self> {
        let bad = |key, reason| ChainError::Config { key, reason };
        if config.urls.is_empty() {
            return Err(bad("chains.*.rpcUrls", "needs at least one URL"));
        }
        let rate = NonZeroU32::new(config.requests_per_second)
            .ok_or(bad("chains.*.requestsPerSecond", "must be at least 1"))?;
        let burst =
            NonZeroU32::new(config.burst).ok_or(bad("chains.*.burst", "must be at least 1"))?;
        let mut upstreams = Vec::with_capacity(config.urls.len());
        for url in &config.urls {
            let parsed: alloy::transports::http::reqwest::Url = url
                .parse()
                .map_err(|_| bad("chains.*.rpcUrls", "not a valid URL"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(bad("chains.*.rpcUrls", "upstream pools speak http(s)"));
            }
            upstreams.push(Upstream {
                client: ClientBuilder::default().http(parsed),
                limiter: RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)),
                health: Default::default(),
            });
        }
        Ok(Self {
            chain,
            config,
            upstreams,
        })
    }

    /// The chain this pool serves.
    pub fn chain(&self) -> ChainId {
        self.chain
    }

    /// Health of every upstream, in configured order.
    pub fn health(&self) -> Vec<UpstreamHealth> {
        let now = Instant::now();
        self.upstreams
            .iter()
            .enumerate()
            .map(|(index, u)| {
                let r = u.health[MethodClass::Reads.slot()]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let s = u.health[MethodClass::Sends.slot()]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                UpstreamHealth {
                    index,
                    healthy: r.unhealthy_until.is_none_or(|t| t <= now),
                    consecutive_failures: r.consecutive_failures,
                    requests: r.requests + s.requests,
                    failures: r.failures + s.failures,
                    sends_healthy: s.unhealthy_until.is_none_or(|t| t <= now),
                    sends_consecutive_failures: s.consecutive_failures,
                }
            })
            .collect()
    }

    /// Upstream indices in the order to try `method`: those healthy for its class in
    /// configured order, then the unhealthy ones (so a request is still attempted when
    /// all are in cooldown).
    fn order(&self, method: &str) -> Vec<usize> {
        let now = Instant::now();
        let class = MethodClass::of(method).slot();
        let (mut healthy, mut sick) = (Vec::new(), Vec::new());
        for (i, u) in self.upstreams.iter().enumerate() {
            let h = u.health[class].lock().unwrap_or_else(|p| p.into_inner());
            if h.unhealthy_until.is_none_or(|t| t <= now) {
                healthy.push(i);
            } else {
                sick.push(i);
            }
        }
        healthy.append(&mut sick);
        healthy
    }

    fn record(&self, index: usize, method: &str, transport_ok: bool) {
        let Some(u) = self.upstreams.get(index) else {
            return;
        };
        let class = MethodClass::of(method);
        let mut h = u.health[class.slot()]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        h.requests += 1;
        if transport_ok {
            h.consecutive_failures = 0;
            h.unhealthy_until = None;
        } else {
            h.failures += 1;
            h.consecutive_failures += 1;
            if h.consecutive_failures >= self.config.failure_threshold {
                if h.unhealthy_until.is_none() {
                    tracing::warn!(target: "keel::chain", chain = %self.chain, upstream = index,
                        class = if class == MethodClass::Sends { "sends" } else { "reads" }, "upstream marked unhealthy");
                }
                h.unhealthy_until = Some(Instant::now() + self.config.cooldown);
            }
        }
    }

    /// Waits until `u`'s rate limiter admits `n` requests (a JSON-RPC batch of `n`
    /// calls counts as `n` against a provider's plan); a batch larger than the burst
    /// waits for a full burst.
    async fn admit(&self, u: &Upstream, n: usize) {
        let n = u32::try_from(n)
            .unwrap_or(u32::MAX)
            .clamp(1, self.config.burst.max(1));
        match NonZeroU32::new(n) {
            Some(n) if n.get() > 1 => {
                if u.limiter.until_n_ready(n).await.is_err() {
                    u.limiter.until_ready().await;
                }
            }
            _ => u.limiter.until_ready().await,
        }
    }

    async fn attempt<P: RpcSend + Clone, R: RpcRecv>(
        &self,
        index: usize,
        method: &'static str,
        params: P,
    ) -> Attempt<R> {
        let Some(u) = self.upstreams.get(index) else {
            return Attempt::Transport;
        };
        u.limiter.until_ready().await;
        let call = u.client.request::<P, R>(method, params);
        match tokio::time::timeout(self.config.request_timeout, call).await {
            Ok(Ok(r)) => Attempt::Done(r),
            Ok(Err(RpcError::ErrorResp(payload))) => Attempt::Node(classify_payload(&payload)),
            Ok(Err(RpcError::Transport(TransportErrorKind::HttpError(e)))) if e.status == 429 => {
                Attempt::Transport
            }
            Ok(Err(_)) | Err(_) => Attempt::Transport,
        }
    }

    /// Sends one JSON-RPC request, failing over across upstreams on transport errors
    /// and on error answers that are not the node's verdict on the request (see the
    /// module documentation).
    ///
    /// # Errors
    /// [`ChainError::Node`] with the classified answer when a node answers with its
    /// verdict on the request (no failover), or with the last answer when every
    /// upstream answered an error that is not one; [`ChainError::Unavailable`] when
    /// every upstream failed at the transport level.
    pub async fn request<P: RpcSend + Clone, R: RpcRecv>(
        &self,
        method: &'static str,
        params: P,
    ) -> Result<R> {
        let order = self.order(method);
        let chain_label = self.chain.get().to_string();
        let mut not_a_verdict = None;
        for &index in &order {
            match self.attempt::<P, R>(index, method, params.clone()).await {
                Attempt::Done(r) => {
                    self.record(index, method, true);
                    metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label, "method" => method, "outcome" => "ok").increment(1);
                    return Ok(r);
                }
                Attempt::Node(error) if error.kind.is_transaction_level() => {
                    // The node answered about the request: the upstream is fine.
                    self.record(index, method, true);
                    metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label, "method" => method, "outcome" => error.kind.as_str()).increment(1);
                    return Err(ChainError::Node { method, error });
                }
                Attempt::Node(error) => {
                    // Not about the request (internal or gateway error, unknown text):
                    // another upstream may answer it.
                    self.record(index, method, false);
                    metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label.clone(), "method" => method, "outcome" => error.kind.as_str()).increment(1);
                    tracing::debug!(target: "keel::chain", chain = %self.chain, upstream = index, method, kind = error.kind.as_str(), "error answer that is not a verdict on the request, failing over");
                    not_a_verdict = Some(error);
                }
                Attempt::Transport => {
                    self.record(index, method, false);
                    metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label.clone(), "method" => method, "outcome" => "transport_error").increment(1);
                    tracing::debug!(target: "keel::chain", chain = %self.chain, upstream = index, method, "transport failure, failing over");
                }
            }
        }
        if let Some(error) = not_a_verdict {
            return Err(ChainError::Node { method, error });
        }
        Err(ChainError::Unavailable {
            chain: self.chain,
            method,
            attempts: order.len(),
        })
    }

    /// Checks every upstream's `eth_chainId` against the configured chain (EIP-155).
    ///
    /// # Errors
    /// [`ChainError::WrongChain`] for the first upstream on another chain;
    /// [`ChainError::Unavailable`] when an upstream cannot be reached.
    pub async fn verify_chain_id(&self) -> Result<()> {
        for index in 0..self.upstreams.len() {
            match self.attempt::<(), U64>(index, "eth_chainId", ()).await {
                Attempt::Done(id) => {
                    self.record(index, "eth_chainId", true);
                    let actual = id.to::<u64>();
                    if actual != self.chain.get() {
                        return Err(ChainError::WrongChain {
                            index,
                            expected: self.chain,
                            actual,
                        });
                    }
                }
                Attempt::Node(error) => {
                    return Err(ChainError::Node {
                        method: "eth_chainId",
                        error,
                    });
                }
                Attempt::Transport => {
                    self.record(index, "eth_chainId", false);
                    return Err(ChainError::Unavailable {
                        chain: self.chain,
                        method: "eth_chainId",
                        attempts: 1,
                    });
                }
            }
        }
        Ok(())
    }

    /// `eth_blockNumber`: the head block number.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn block_number(&self) -> Result<u64> {
        Ok(self
            .request::<_, U64>("eth_blockNumber", ())
            .await?
            .to::<u64>())
    }

    /// `eth_getBlockByNumber(block, false)`: the block's header, `None` when the node
    /// has no such block (a number above its head, a tag it does not know the block
    /// for).
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn header(&self, block: BlockNumberOrTag) -> Result<Option<BlockHeader>> {
        let wire: Option<WireHeader> = self.request("eth_getBlockByNumber", (block, false)).await?;
        Ok(wire.map(|h| BlockHeader {
            number: h.number.to::<u64>(),
            hash: h.hash,
            parent_hash: h.parent_hash,
            timestamp: h.timestamp.to::<u64>(),
            base_fee_per_gas: h.base_fee_per_gas.map(|w| GasPrice::new(self.chain, w)),
        }))
    }

    /// The gas limit of `block` (`eth_getBlockByNumber(block, false)`'s `gasLimit`), gas
    /// units; `None` when the node has no such block. What a transaction's gas limit may
    /// not exceed to be included in a block like it.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn block_gas_limit(&self, block: BlockNumberOrTag) -> Result<Option<u64>> {
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct WireGasLimit {
            gas_limit: U64,
        }
        let wire: Option<WireGasLimit> =
            self.request("eth_getBlockByNumber", (block, false)).await?;
        Ok(wire.map(|h| h.gas_limit.saturating_to::<u64>()))
    }

    /// The header of the node's `finalized` block; `None` when the node has none yet.
    /// A node that does not know the tag answers an error ([`ChainError::Node`]):
    /// callers that fall back to `head − confirmations` do so on any error.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn finalized(&self) -> Result<Option<BlockHeader>> {
        self.header(BlockNumberOrTag::Finalized).await
    }

    /// `eth_getLogs` of the contracts `addresses` over the blocks `from..=to`. A node
    /// that refuses the span answers [`crate::NodeErrorKind::RangeTooLarge`].
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn logs_in_range(
        &self,
        addresses: &[Address],
        from: u64,
        to: u64,
    ) -> Result<Vec<Log>> {
        let filter = LogFilter {
            from_block: Some(U64::from(from)),
            to_block: Some(U64::from(to)),
            block_hash: None,
            address: addresses.to_vec(),
        };
        self.request("eth_getLogs", (filter,)).await
    }

    /// `eth_getLogs` of the contracts `addresses` in the block with hash `hash`
    /// (EIP-234): the logs of exactly that block, whatever is canonical now. A node
    /// that no longer knows the block answers an error.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn logs_by_block_hash(&self, addresses: &[Address], hash: B256) -> Result<Vec<Log>> {
        let filter = LogFilter {
            from_block: None,
            to_block: None,
            block_hash: Some(hash),
            address: addresses.to_vec(),
        };
        self.request("eth_getLogs", (filter,)).await
    }

    /// `eth_estimateGas(tx)` at the pending state: the gas the node estimates (no
    /// headroom added). A reverting call answers
    /// [`crate::NodeErrorKind::ExecutionReverted`] with the revert decoded.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn estimate_gas(&self, tx: &TransactionRequest) -> Result<u64> {
        Ok(self
            .request::<_, U64>("eth_estimateGas", (tx.clone(),))
            .await?
            .to::<u64>())
    }

    /// `eth_estimateGas(tx, block, overrides)`: the estimate at `block` with the state
    /// `overrides` applied (e.g. a sender's balance raised so that an account that
    /// cannot pay yet still gets an estimate).
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn estimate_gas_with_overrides(
        &self,
        tx: &TransactionRequest,
        block: BlockNumberOrTag,
        overrides: &StateOverride,
    ) -> Result<u64> {
        Ok(self
            .request::<_, U64>("eth_estimateGas", (tx.clone(), block, overrides.clone()))
            .await?
            .to::<u64>())
    }

    /// `eth_call(tx, block)`: the call's return data. A reverting call answers
    /// [`crate::NodeErrorKind::ExecutionReverted`] with the revert decoded
    /// ([`crate::NodeError::revert`]).
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn call(&self, tx: &TransactionRequest, block: BlockNumberOrTag) -> Result<Bytes> {
        self.request("eth_call", (tx.clone(), block)).await
    }

    /// Whether the node knows the transaction `hash` (`eth_getTransactionByHash`
    /// answers a transaction, mined or pending, rather than `null`). The transaction is
    /// not decoded, so any transaction type counts.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn transaction_known(&self, hash: B256) -> Result<bool> {
        let tx: Option<serde::de::IgnoredAny> =
            self.request("eth_getTransactionByHash", (hash,)).await?;
        Ok(tx.is_some())
    }

    /// `eth_gasPrice` as a [`GasPrice`] bound to this chain (wei per gas).
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn gas_price(&self) -> Result<GasPrice> {
        let wei: U256 = self.request("eth_gasPrice", ()).await?;
        Ok(GasPrice::new(self.chain, wei))
    }

    /// `eth_maxPriorityFeePerGas` (EIP-1559 tip suggestion) bound to this chain.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn max_priority_fee(&self) -> Result<GasPrice> {
        let wei: U256 = self.request("eth_maxPriorityFeePerGas", ()).await?;
        Ok(GasPrice::new(self.chain, wei))
    }

    /// The tip recent blocks paid, from `eth_feeHistory(blocks, "latest", [percentile])`:
    /// the median over the `blocks` latest blocks of each block's `percentile`-th
    /// effective priority fee (weighted by gas, as the JSON-RPC method defines it),
    /// leaving out blocks that paid none (empty blocks report 0). 0 when no block in
    /// the range paid a tip. `blocks` is 1..=1024 and `percentile` 0..=100 (the method's
    /// bounds; out-of-range values are clamped).
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn fee_history_tip(&self, blocks: u64, percentile: f64) -> Result<GasPrice> {
        let blocks = blocks.clamp(1, 1024);
        let percentile = percentile.clamp(0.0, 100.0);
        let history: alloy::rpc::types::FeeHistory = self
            .request(
                "eth_feeHistory",
                (U64::from(blocks), BlockNumberOrTag::Latest, [percentile]),
            )
            .await?;
        let mut paid: Vec<u128> = history
            .reward
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.first().copied())
            .filter(|tip| *tip > 0)
            .collect();
        paid.sort_unstable();
        let median = paid.get(paid.len() / 2).copied().unwrap_or(0);
        Ok(GasPrice::new(self.chain, U256::from(median)))
    }

    /// `eth_getBalance(address, tag)` as a [`NativeAmount`] of this chain.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn balance(&self, address: Address, tag: BlockNumberOrTag) -> Result<NativeAmount> {
        let wei: U256 = self.request("eth_getBalance", (address, tag)).await?;
        Ok(NativeAmount::new(self.chain, Wei::new(wei)))
    }

    /// `eth_getBalance(address, tag)` for each of `addresses` in one JSON-RPC batch
    /// (JSON-RPC 2.0 §6), with the same failover as [`UpstreamPool::request`]; one
    /// [`NativeAmount`] (wei) of this chain per address, in order.
    ///
    /// # Errors
    /// [`ChainError::Node`] when the node answers an item with an error;
    /// [`ChainError::Unavailable`] when no upstream answered the batch.
    pub async fn balances(
        &self,
        addresses: &[Address],
        tag: BlockNumberOrTag,
    ) -> Result<Vec<NativeAmount>> {
        const METHOD: &str = "eth_getBalance";
        let params: Vec<(Address, BlockNumberOrTag)> =
            addresses.iter().map(|a| (*a, tag)).collect();
        self.batch::<_, U256>(METHOD, &params)
            .await?
            .into_iter()
            .map(|r| {
                r.map(|wei| NativeAmount::new(self.chain, Wei::new(wei)))
                    .map_err(|error| ChainError::Node {
                        method: METHOD,
                        error,
                    })
            })
            .collect()
    }

    /// `eth_getTransactionCount(address, tag)`: the next nonce at `tag`
    /// (`pending` includes the node's pool).
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn nonce(&self, address: Address, tag: BlockNumberOrTag) -> Result<u64> {
        Ok(self
            .request::<_, U64>("eth_getTransactionCount", (address, tag))
            .await?
            .to::<u64>())
    }

    /// `eth_sendRawTransaction` of signed EIP-2718 bytes; returns the hash the node
    /// reports. "Already known" answers come back as [`ChainError::Node`] with
    /// [`crate::NodeErrorKind::AlreadyKnown`]: the caller decides that it is success.
    ///
    /// # Errors
    /// As [`UpstreamPool::request`].
    pub async fn send_raw_transaction(&self, raw: &Bytes) -> Result<B256> {
        self.request("eth_sendRawTransaction", (raw.clone(),)).await
    }

    /// `eth_sendRawTransaction` for each of `raws` in one JSON-RPC batch (JSON-RPC 2.0
    /// §6), with the same failover as [`UpstreamPool::request`] when the batch fails at
    /// the transport level (sending the same signed bytes to another node is harmless:
    /// it answers "already known" or accepts them). Returns one outcome per item, in
    /// order: the transaction hash, or the node's classified refusal of that item
    /// (a refusal never marks the upstream unhealthy).
    ///
    /// # Errors
    /// [`ChainError::Unavailable`] when no upstream answered the batch.
    pub async fn send_raw_transactions(
        &self,
        raws: &[Bytes],
    ) -> Result<Vec<std::result::Result<B256, crate::NodeError>>> {
        let params: Vec<(Bytes,)> = raws.iter().map(|r| (r.clone(),)).collect();
        self.batch("eth_sendRawTransaction", &params).await
    }

    /// Receipts of `hashes` (`None` when not mined or unknown), in one JSON-RPC batch
    /// per attempt, with the same failover as [`UpstreamPool::request`].
    ///
    /// # Errors
    /// [`ChainError::Node`] when the node answers an item with an error;
    /// [`ChainError::Unavailable`] when no upstream answered the batch.
    pub async fn receipts(&self, hashes: &[B256]) -> Result<Vec<Option<TransactionReceipt>>> {
        const METHOD: &str = "eth_getTransactionReceipt";
        let params: Vec<(B256,)> = hashes.iter().map(|h| (*h,)).collect();
        self.batch(METHOD, &params)
            .await?
            .into_iter()
            .map(|r| {
                r.map_err(|error| ChainError::Node {
                    method: METHOD,
                    error,
                })
            })
            .collect()
    }

    /// Whether the node knows each of `hashes` (`eth_getTransactionByHash` answers a
    /// transaction, mined or pending, rather than `null`), in one JSON-RPC batch per
    /// attempt, with the same failover as [`UpstreamPool::request`]; in order.
    ///
    /// # Errors
    /// [`ChainError::Node`] when the node answers an item with an error;
    /// [`ChainError::Unavailable`] when no upstream answered the batch.
    pub async fn transactions_known(&self, hashes: &[B256]) -> Result<Vec<bool>> {
        const METHOD: &str = "eth_getTransactionByHash";
        let params: Vec<(B256,)> = hashes.iter().map(|h| (*h,)).collect();
        self.batch::<_, Option<serde::de::IgnoredAny>>(METHOD, &params)
            .await?
            .into_iter()
            .map(|r| {
                r.map(|tx| tx.is_some()).map_err(|error| ChainError::Node {
                    method: METHOD,
                    error,
                })
            })
            .collect()
    }

    /// One JSON-RPC batch (JSON-RPC 2.0 §6) of `method` with each of `params`, failing
    /// over across upstreams when the batch fails at the transport level. The upstream's
    /// rate limiter counts every call of the batch. One outcome per item, in order: the
    /// result, or the node's classified answer. An item answered with an error that is
    /// not the node's verdict on it (see the module documentation) is sent again, with
    /// the other such items, to the next upstream (and counts against the one that
    /// answered it); when no upstream gives a better answer, its last answer is the
    /// outcome.
    async fn batch<P: RpcSend, R: RpcRecv>(
        &self,
        method: &'static str,
        params: &[P],
    ) -> Result<Vec<std::result::Result<R, crate::NodeError>>> {
        if params.is_empty() {
            return Ok(Vec::new());
        }
        let order = self.order(method);
        let chain_label = self.chain.get().to_string();
        // Per item: its final outcome, or the last answer that was not a verdict.
        let mut done: Vec<Option<std::result::Result<R, crate::NodeError>>> =
            std::iter::repeat_with(|| None).take(params.len()).collect();
        let mut not_a_verdict: Vec<Option<crate::NodeError>> = vec![None; params.len()];
        let mut pending: Vec<usize> = (0..params.len()).collect();
        'upstreams: for &index in &order {
            if pending.is_empty() {
                break;
            }
            let Some(u) = self.upstreams.get(index) else {
                continue;
            };
            self.admit(u, pending.len()).await;
            let mut batch = u.client.new_batch();
            let mut waiters = Vec::with_capacity(pending.len());
            for &item in &pending {
                match batch.add_call::<_, R>(method, &params[item]) {
                    Ok(w) => waiters.push((item, w)),
                    Err(_) => continue 'upstreams,
                }
            }
            let sent = tokio::time::timeout(self.config.request_timeout, batch.send()).await;
            if !matches!(sent, Ok(Ok(()))) {
                self.record(index, method, false);
                metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label.clone(), "method" => method, "outcome" => "transport_error").increment(1);
                continue;
            }
            let mut still = Vec::new();
            let mut healthy = true;
            for (item, w) in waiters {
                match w.await {
                    Ok(r) => {
                        metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label.clone(), "method" => method, "outcome" => "ok").increment(1);
                        done[item] = Some(Ok(r));
                    }
                    Err(RpcError::ErrorResp(payload)) => {
                        let error = classify_payload(&payload);
                        metrics::counter!("keel_chain_rpc_requests_total", "chain_id" => chain_label.clone(), "method" => method, "outcome" => error.kind.as_str()).increment(1);
                        if error.kind.is_transaction_level() {
                            done[item] = Some(Err(error));
                        } else {
                            healthy = false;
                            not_a_verdict[item] = Some(error);
                            still.push(item);
                        }
                    }
                    Err(_) => {
                        healthy = false;
                        still.push(item);
                    }
                }
            }
            self.record(index, method, healthy);
            if !still.is_empty() {
                tracing::debug!(target: "keel::chain", chain = %self.chain, upstream = index, method, items = still.len(), "batch items without a verdict, failing over");
            }
            pending = still;
        }
        let mut out = Vec::with_capacity(params.len());
        for (outcome, fallback) in done.into_iter().zip(not_a_verdict) {
            match (outcome, fallback) {
                (Some(outcome), _) => out.push(outcome),
                (None, Some(error)) => out.push(Err(error)),
                (None, None) => {
                    return Err(ChainError::Unavailable {
                        chain: self.chain,
                        method,
                        attempts: order.len(),
                    });
                }
            }
        }
        Ok(out)
    }
}
