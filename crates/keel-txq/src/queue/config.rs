//! The queue's settings ([`TxQueueConfig`]) and when a block is final for it
//! ([`Finality`]).

use std::time::Duration;

/// Broadcasts of one sender in flight at once (default of
/// [`TxQueueConfig::broadcast_in_flight`]).
const DEFAULT_BROADCAST_IN_FLIGHT: usize = 16;

/// Queue settings.
#[derive(Debug, Clone)]
pub struct TxQueueConfig {
    /// Blocks a receipt must be deep (1 = in the head block) to settle.
    pub confirmations: u64,
    /// Sleep between passes when nothing woke the loop.
    pub poll_interval: Duration,
    /// Queued requests signed per sender per pass.
    pub sign_batch: i64,
    /// Percent added to an estimate for the gas limit (default 20).
    pub gas_limit_headroom_percent: u64,
    /// Nonce recovery runs every this many ticks of [`TxQueue::run`] (default 40).
    pub recovery_every_ticks: u64,
    /// A broadcast transaction without a receipt for this long after its broadcast,
    /// while no transaction of its sender was newly included for as long, is replaced at
    /// the same nonce with bumped fees; `None` disables fee bumping (default 30 s). Of
    /// one sender's stuck transactions, only the lowest nonce is replaced unless the
    /// others are underpriced too (max fee below the current base fee, or tip below the
    /// node's suggestion): later nonces waiting behind a stuck one mine once it does.
    pub bump_after: Option<Duration>,
    /// Percent by which a replacement raises both the max fee and the priority fee
    /// (default 12; geth and reth refuse replacements below +10 %).
    pub bump_percent: u64,
    /// Upper bound of the max fee per gas, wei (the per-chain cap; default 1,000 gwei).
    pub max_fee_cap: u128,
    /// For requests with a funding pause: how many times a broadcast refused by the node
    /// for insufficient funds (after the queue's own balance check let the request
    /// sign) is retried with the same bytes, one retry per pass, before the request
    /// settles `Failed { code: "GAS_REQUIRED" }` (default 10). Requests without a
    /// funding pause settle on the first refusal.
    pub funding_broadcast_retries: u32,
    /// Broadcasts of one sender outstanding at once (default 16; at least 1). Higher
    /// is faster against a node that promotes out-of-order nonces reliably; Anvil 1.7.1
    /// can leave a transaction queued for good when many arrive concurrently (then only
    /// a fee bump gets it mined), so keep it modest on Anvil.
    pub broadcast_in_flight: usize,
    /// Broadcasts per JSON-RPC batch (`eth_sendRawTransaction` × n in one HTTP
    /// request; default 16; 1 = one request per transaction). With n > 1, up to
    /// `broadcast_in_flight / n` batches (at least 1) are outstanding at once, each of
    /// one sender, spread over the senders first. A node
    /// answers each item separately; a batch that fails at the transport level leaves
    /// its requests `signed` for the next pass (same bytes).
    pub broadcast_batch: usize,
    /// When a block counts as final on this chain (default: the node's `finalized`
    /// tag, 64 blocks below the head where the node has none). The queue re-signs a
    /// request at a fresh nonce only once the transaction that took its nonce is in a
    /// final block (then none of the request's attempts can ever be mined, whatever
    /// reorg comes; see `queue/resign.rs`). `Finality::Depth(0)` (the head is final)
    /// only for a local development chain.
    pub finality: Finality,
    /// How the chain prices gas (default: EIP-1559, twice the base fee plus the node's
    /// tip suggestion).
    pub fee_model: FeeModel,
    /// The L1 data fee an OP Stack chain charges on top of execution gas (default
    /// none): counted in every funding check and in what a funding request asks for.
    pub l1_data_fee: Option<L1DataFee>,
    /// The most gas one transaction may use on this chain, whatever the block gas limit
    /// (Ethereum since Osaka: 2^24 = 16,777,216, EIP-7825); `None` (default): only the
    /// latest block's gas limit bounds it. A request above it fails
    /// `EXCEEDS_BLOCK_GAS_LIMIT` before it takes a nonce.
    pub max_gas_per_transaction: Option<u64>,
}

/// How a chain prices gas (see [`TxQueueConfig::fee_model`]). Either way a replacement
/// raises every fee field the transaction has by at least
/// [`TxQueueConfig::bump_percent`] and at least 1 wei, so it always clears the node's
/// replacement rule (geth and reth: +10 % on each field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeeModel {
    /// EIP-1559 (type-2) transactions: `maxFeePerGas` = the latest base fee ×
    /// `base_fee_multiplier_percent` / 100 + the tip; `maxPriorityFeePerGas` = the tip.
    Eip1559 {
        /// Percent of the latest base fee the max fee allows (at least 100; default
        /// 200: the fee survives six consecutive full blocks at +12.5 % each).
        base_fee_multiplier_percent: u64,
        /// Where the tip comes from.
        priority_fee: PriorityFee,
        /// The least tip, wei per gas (default 0; e.g. Polygon PoS refuses tips
        /// below 25 gwei).
        min_priority_fee_per_gas: u128,
    },
    /// Legacy (type-0, EIP-155) transactions for chains without EIP-1559: `gasPrice` =
    /// the node's `eth_gasPrice` × `gas_price_multiplier_percent` / 100. EIP-7702
    /// requests cannot be sent on such a chain ([`crate::TxqError::InvalidRequest`]
    /// `("authorization_list")`).
    Legacy {
        /// Percent of `eth_gasPrice` offered (at least 100; default 110).
        gas_price_multiplier_percent: u64,
    },
}

impl Default for FeeModel {
    fn default() -> Self {
        FeeModel::Eip1559 {
            base_fee_multiplier_percent: 200,
            priority_fee: PriorityFee::Node,
            min_priority_fee_per_gas: 0,
        }
    }
}

/// The source of an EIP-1559 tip (see [`FeeModel::Eip1559`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityFee {
    /// The node's suggestion, `eth_maxPriorityFeePerGas`.
    Node,
    /// A fixed tip, wei per gas (an L2 whose sequencer orders by arrival: a few wei
    /// suffice).
    Fixed(u128),
    /// What recent blocks paid: the median over the `blocks` latest blocks of each
    /// block's `percentile`-th tip, from `eth_feeHistory` (blocks without tips left
    /// out; see `keel_chain::UpstreamPool::fee_history_tip`). Follows a busy market
    /// faster than a node's suggestion; 0 on a chain where nobody tips.
    FeeHistory {
        /// Blocks looked at (1..=1024).
        blocks: u64,
        /// The percentile of each block's tips, weighted by gas (0..=100).
        percentile: u8,
    },
}

/// The L1 data fee of an OP Stack chain (see [`TxQueueConfig::l1_data_fee`]): read per
/// transaction from the `GasPriceOracle` predeploy's `getL1Fee(bytes)` with the
/// unsigned RLP-encoded transaction (the oracle adds the signature's 68 bytes), wei.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L1DataFee {
    /// The oracle (OP Stack: `0x420000000000000000000000000000000000000F`,
    /// [`L1DataFee::OP_STACK_ORACLE`]).
    pub oracle: alloy::primitives::Address,
    /// Percent of the oracle's figure counted (at least 100; default 150: the L1 base
    /// fee moves between the check and the inclusion).
    pub multiplier_percent: u64,
}

impl L1DataFee {
    /// The OP Stack `GasPriceOracle` predeploy.
    pub const OP_STACK_ORACLE: alloy::primitives::Address =
        alloy::primitives::address!("420000000000000000000000000000000000000F");

    /// The OP Stack oracle at the default multiplier.
    pub fn op_stack() -> Self {
        Self {
            oracle: Self::OP_STACK_ORACLE,
            multiplier_percent: 150,
        }
    }
}

/// When a block is final for a queue (see [`TxQueueConfig::finality`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finality {
    /// The node's `finalized` block; where the node has no such tag (or answers none),
    /// the block `fallback_depth` below the head.
    Finalized {
        /// Blocks below the head that count as final on a node without the tag.
        fallback_depth: u64,
    },
    /// The block this many blocks below the head (0: the head itself, for a local
    /// chain such as Anvil, whose `finalized` tag lags 64 blocks behind a head that
    /// only moves when transactions arrive).
    Depth(u64),
}

impl Default for Finality {
    fn default() -> Self {
        Finality::Finalized { fallback_depth: 64 }
    }
}

impl Default for TxQueueConfig {
    fn default() -> Self {
        Self {
            confirmations: 1,
            poll_interval: Duration::from_millis(250),
            sign_batch: 256,
            gas_limit_headroom_percent: 20,
            recovery_every_ticks: 40,
            bump_after: Some(Duration::from_secs(30)),
            bump_percent: 12,
            max_fee_cap: 1_000_000_000_000,
            funding_broadcast_retries: 10,
            broadcast_in_flight: DEFAULT_BROADCAST_IN_FLIGHT,
            broadcast_batch: 16,
            finality: Finality::default(),
            fee_model: FeeModel::default(),
            l1_data_fee: None,
            max_gas_per_transaction: None,
        }
    }
}
