//! Chain profiles (issue 35 §3): what a chain's fee market, finality and limits are,
//! named once per kind of chain (`chains.<name>.profile`) and resolved with the chain's
//! own overrides into [`ChainSettings`], the one place the queue's and the indexer's
//! per-chain settings come from.
//!
//! | profile | fees | L1 data fee | gas per transaction | queue finality | confirmations | `eth_subscribe` |
//! |---|---|---|---|---|---|---|
//! | `anvil` | EIP-1559, 2 × base fee + the node's tip | none | block gas limit | the head (depth 0) | 1 | on the RPC port (`ws://` of the first RPC URL) |
//! | `ethereum` | EIP-1559, 2 × base fee + the node's tip | none | 2^24 (EIP-7825) | `finalized` tag (64 without it) | 2 | with `wsUrl` |
//! | `op-stack` | EIP-1559, 2 × base fee + a fixed 0.001 gwei tip | `GasPriceOracle` predeploy × 150 % | block gas limit | `finalized` tag (450 without it) | 1 | with `wsUrl` |
//! | `default` | EIP-1559, 2 × base fee + the node's tip | none | block gas limit | `finalized` tag (64 without it) | 1 | with `wsUrl` |
//!
//! Without `profile`, chain ids 1 (Ethereum), 11155111 (Sepolia), 17000 (Holesky) and
//! 560048 (Hoodi) take `ethereum`; 10 (OP Mainnet), 8453 (Base), 11155420 (OP Sepolia)
//! and 84532 (Base Sepolia) take `op-stack`; every other chain takes `default` (`anvil`
//! is only ever chosen by name: a chain id says nothing about whether a chain is a
//! disposable local node).

use super::{ConfigError, TxqSettings, invalid};
use alloy::primitives::Address;
use keel_txq::{FeeModel, Finality, L1DataFee, PriorityFee};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A kind of chain (`chains.<name>.profile`; see the module docs for what each sets).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ChainProfile {
    /// A local Anvil node: the head is final, `eth_subscribe` on the RPC port.
    Anvil,
    /// Ethereum mainnet or a public testnet: EIP-7825's per-transaction gas cap,
    /// 2 confirmations.
    Ethereum,
    /// An OP Stack chain (OP Mainnet, Base, ...): the L1 data fee from the
    /// `GasPriceOracle` predeploy counted in funding, a small fixed tip.
    OpStack,
    /// Any other EVM chain: EIP-1559 priced from the node, the node's `finalized` tag.
    Default,
}

impl ChainProfile {
    /// The profile of a chain configured without `profile`, by its EIP-155 chain id
    /// (see the module docs).
    pub fn for_chain_id(chain_id: u64) -> Self {
        match chain_id {
            1 | 11_155_111 | 17_000 | 560_048 => ChainProfile::Ethereum,
            10 | 8453 | 11_155_420 | 84_532 => ChainProfile::OpStack,
            _ => ChainProfile::Default,
        }
    }

    /// The profile's name as configured (`anvil`, `ethereum`, `op-stack`, `default`).
    pub fn name(self) -> &'static str {
        match self {
            ChainProfile::Anvil => "anvil",
            ChainProfile::Ethereum => "ethereum",
            ChainProfile::OpStack => "op-stack",
            ChainProfile::Default => "default",
        }
    }
}

/// How a chain prices gas (`chains.<name>.fees.model`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FeeModelKind {
    /// EIP-1559 type-2 transactions (max fee and tip).
    Eip1559,
    /// Legacy type-0 (EIP-155) transactions priced by `gasPrice`, for chains without
    /// EIP-1559.
    Legacy,
}

/// Where an EIP-1559 tip comes from (`chains.<name>.fees.priorityFee`): the string
/// `"node"` (`eth_maxPriorityFeePerGas`) or `"fee-history"` (what recent blocks paid,
/// `eth_feeHistory`), or a fixed tip in wei per gas (an integer).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PriorityFeeSetting {
    /// `"node"` or `"fee-history"`.
    Source(TipSource),
    /// A fixed tip, wei per gas.
    Fixed(u64),
}

/// The named tip sources of [`PriorityFeeSetting`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TipSource {
    /// `"node"`: the node's `eth_maxPriorityFeePerGas`.
    Node,
    /// `"fee-history"`: the median over `fees.feeHistoryBlocks` latest blocks of each
    /// block's `fees.feeHistoryPercentile`-th tip (`eth_feeHistory`).
    FeeHistory,
}

/// `[chains.<name>.fees]`: overrides of the profile's fee model, each key optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ChainFees {
    /// `eip1559` or `legacy` (profile: `eip1559`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<FeeModelKind>,
    /// EIP-1559: percent of the latest base fee the max fee allows, on top of the tip
    /// (100..=10000; profile: 200).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_fee_multiplier_percent: Option<u64>,
    /// EIP-1559: `"node"` or a fixed tip in wei per gas (profile: `op-stack` 1000000
    /// wei = 0.001 gwei, else `"node"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_fee: Option<PriorityFeeSetting>,
    /// With `priorityFee = "fee-history"`: the latest blocks looked at (1..=1024;
    /// default 20).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fee_history_blocks: Option<u64>,
    /// With `priorityFee = "fee-history"`: the percentile of each block's tips,
    /// weighted by gas (0..=100; default 50).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fee_history_percentile: Option<u8>,
    /// EIP-1559: the least tip, wei per gas (profile: 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_priority_fee_wei: Option<u64>,
    /// Legacy: percent of `eth_gasPrice` offered (100..=10000; default 110).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gas_price_multiplier_percent: Option<u64>,
    /// Whether the chain charges an OP Stack L1 data fee, read from the
    /// `GasPriceOracle`'s `getL1Fee(bytes)` (profile: `op-stack` true, else false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l1_data_fee: Option<bool>,
    /// The oracle's address (default the OP Stack predeploy
    /// `0x420000000000000000000000000000000000000F`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l1_fee_oracle: Option<Address>,
    /// Percent of the oracle's L1 fee counted in funding checks (100..=10000; default
    /// 150).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l1_fee_multiplier_percent: Option<u64>,
}

impl ChainFees {
    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        self == &ChainFees::default()
    }
}

/// A chain's settings as the queue and the indexer use them: its profile with the
/// chain's overrides applied ([`super::ChainConfig::settings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSettings {
    /// The profile the settings start from.
    pub profile: ChainProfile,
    /// How transactions are priced.
    pub fee_model: FeeModel,
    /// The L1 data fee counted in funding checks, on OP Stack chains.
    pub l1_data_fee: Option<L1DataFee>,
    /// The most gas one transaction may use (`None`: the block gas limit alone).
    pub max_gas_per_transaction: Option<u64>,
    /// Blocks below the head after which a receipt settles a request (at least 1).
    pub confirmations: u64,
    /// When a block is final for the transaction queue and the bundler.
    pub finality: Finality,
    /// Blocks below the head after which the indexer treats a block as final in place
    /// of the node's `finalized` tag; `None`: the tag, else `index.finalityDepth`.
    pub index_finality_depth: Option<u64>,
    /// Percent a replacement raises every fee field by.
    pub bump_percent: u64,
    /// How long a transaction waits for a receipt before it is replaced (`None`: never).
    pub bump_after: Option<Duration>,
    /// The WebSocket endpoint the indexer subscribes to `newHeads` on, if any.
    pub ws_url: Option<String>,
}

/// `ws://` (or `wss://`) of an `http://` (`https://`) URL; a `ws(s)://` URL as it is.
fn ws_of(url: &str) -> Option<String> {
    if let Some(rest) = url.strip_prefix("http://") {
        Some(format!("ws://{rest}"))
    } else if let Some(rest) = url.strip_prefix("https://") {
        Some(format!("wss://{rest}"))
    } else if url.starts_with("ws://") || url.starts_with("wss://") {
        Some(url.to_owned())
    } else {
        None
    }
}

impl super::ChainConfig {
    /// The chain's profile: `profile` when set, else by chain id
    /// ([`ChainProfile::for_chain_id`]).
    pub fn profile(&self) -> ChainProfile {
        self.profile
            .unwrap_or_else(|| ChainProfile::for_chain_id(self.chain_id))
    }

    /// The chain's settings: its profile (module docs) under the chain's own keys, and
    /// `[txq]`'s bump policy where the chain sets none.
    pub fn settings(&self, txq: &TxqSettings) -> ChainSettings {
        let profile = self.profile();
        let f = &self.fees;
        let fee_model = match f.model.unwrap_or(FeeModelKind::Eip1559) {
            FeeModelKind::Legacy => FeeModel::Legacy {
                gas_price_multiplier_percent: f.gas_price_multiplier_percent.unwrap_or(110),
            },
            FeeModelKind::Eip1559 => FeeModel::Eip1559 {
                base_fee_multiplier_percent: f.base_fee_multiplier_percent.unwrap_or(200),
                priority_fee: match f.priority_fee {
                    Some(PriorityFeeSetting::Source(TipSource::Node)) => PriorityFee::Node,
                    Some(PriorityFeeSetting::Source(TipSource::FeeHistory)) => {
                        PriorityFee::FeeHistory {
                            blocks: f.fee_history_blocks.unwrap_or(20),
                            percentile: f.fee_history_percentile.unwrap_or(50),
                        }
                    }
                    Some(PriorityFeeSetting::Fixed(wei)) => PriorityFee::Fixed(u128::from(wei)),
                    None if profile == ChainProfile::OpStack => PriorityFee::Fixed(1_000_000),
                    None => PriorityFee::Node,
                },
                min_priority_fee_per_gas: u128::from(f.min_priority_fee_wei.unwrap_or(0)),
            },
        };
        let l1 = f.l1_data_fee.unwrap_or(profile == ChainProfile::OpStack);
        let l1_data_fee = l1.then(|| L1DataFee {
            oracle: f.l1_fee_oracle.unwrap_or(L1DataFee::OP_STACK_ORACLE),
            multiplier_percent: f.l1_fee_multiplier_percent.unwrap_or(150),
        });
        let max_gas_per_transaction = self.max_gas_per_transaction.or(match profile {
            ChainProfile::Ethereum => Some(1 << 24),
            _ => None,
        });
        let confirmations = self
            .confirmations
            .unwrap_or(match profile {
                ChainProfile::Ethereum => 2,
                _ => 1,
            })
            .max(1);
        let finality = match (self.finality_depth, profile) {
            (Some(depth), _) => Finality::Depth(depth),
            (None, ChainProfile::Anvil) => Finality::Depth(0),
            (None, ChainProfile::OpStack) => Finality::Finalized {
                fallback_depth: 450,
            },
            (None, _) => Finality::Finalized { fallback_depth: 64 },
        };
        let bump_after_ms = self.bump_after_ms.unwrap_or(txq.bump_after_ms);
        let subscribe = self.subscribe.unwrap_or(true);
        let ws_url = if subscribe {
            self.ws_url.clone().or_else(|| {
                (profile == ChainProfile::Anvil)
                    .then(|| self.rpc_urls.first().and_then(|u| ws_of(u)))
                    .flatten()
            })
        } else {
            None
        };
        ChainSettings {
            profile,
            fee_model,
            l1_data_fee,
            max_gas_per_transaction,
            confirmations,
            finality,
            index_finality_depth: self.index_finality_depth,
            bump_percent: self.bump_percent.unwrap_or(txq.bump_percent),
            bump_after: (bump_after_ms > 0).then(|| Duration::from_millis(bump_after_ms)),
            ws_url,
        }
    }

    /// The rules of the chain's profile keys (`chains.<chain>.…`, named in full).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub(super) fn validate_profile(&self, chain: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("chains.{chain}.{k}");
        let f = &self.fees;
        let percent = |k: &str, v: Option<u64>| match v {
            Some(v) if !(100..=10_000).contains(&v) => {
                Err(invalid(&key(k), "must be within 100..=10000 percent"))
            }
            _ => Ok(()),
        };
        percent(
            "fees.baseFeeMultiplierPercent",
            f.base_fee_multiplier_percent,
        )?;
        percent(
            "fees.gasPriceMultiplierPercent",
            f.gas_price_multiplier_percent,
        )?;
        percent("fees.l1FeeMultiplierPercent", f.l1_fee_multiplier_percent)?;
        if f.model == Some(FeeModelKind::Legacy) {
            for (k, set) in [
                (
                    "fees.baseFeeMultiplierPercent",
                    f.base_fee_multiplier_percent.is_some(),
                ),
                ("fees.priorityFee", f.priority_fee.is_some()),
                ("fees.minPriorityFeeWei", f.min_priority_fee_wei.is_some()),
                ("fees.feeHistoryBlocks", f.fee_history_blocks.is_some()),
                (
                    "fees.feeHistoryPercentile",
                    f.fee_history_percentile.is_some(),
                ),
            ] {
                if set {
                    return Err(invalid(
                        &key(k),
                        "applies to EIP-1559 fees only (fees.model is legacy)",
                    ));
                }
            }
        } else if f.gas_price_multiplier_percent.is_some() {
            return Err(invalid(
                &key("fees.gasPriceMultiplierPercent"),
                "applies to legacy fees only (set fees.model = \"legacy\")",
            ));
        }
        let history = f.priority_fee == Some(PriorityFeeSetting::Source(TipSource::FeeHistory));
        for (k, set) in [
            ("fees.feeHistoryBlocks", f.fee_history_blocks.is_some()),
            (
                "fees.feeHistoryPercentile",
                f.fee_history_percentile.is_some(),
            ),
        ] {
            if set && !history && f.model != Some(FeeModelKind::Legacy) {
                return Err(invalid(
                    &key(k),
                    "applies only with fees.priorityFee = \"fee-history\"",
                ));
            }
        }
        if f.fee_history_blocks
            .is_some_and(|b| !(1..=1024).contains(&b))
        {
            return Err(invalid(
                &key("fees.feeHistoryBlocks"),
                "must be within 1..=1024 (eth_feeHistory's bound)",
            ));
        }
        if f.fee_history_percentile.is_some_and(|p| p > 100) {
            return Err(invalid(
                &key("fees.feeHistoryPercentile"),
                "must be within 0..=100",
            ));
        }
        if f.l1_data_fee == Some(false)
            && (f.l1_fee_oracle.is_some() || f.l1_fee_multiplier_percent.is_some())
        {
            return Err(invalid(
                &key("fees.l1DataFee"),
                "is false while fees.l1FeeOracle or fees.l1FeeMultiplierPercent is set",
            ));
        }
        if f.l1_fee_oracle.is_some_and(|a| a.is_zero()) {
            return Err(invalid(
                &key("fees.l1FeeOracle"),
                "must not be the zero address",
            ));
        }
        if self.max_gas_per_transaction.is_some_and(|g| g < 21_000) {
            return Err(invalid(
                &key("maxGasPerTransaction"),
                "must be at least 21000 (the intrinsic gas of a transfer)",
            ));
        }
        if self.confirmations == Some(0) {
            return Err(invalid(&key("confirmations"), "must be at least 1"));
        }
        if self
            .bump_percent
            .is_some_and(|p| !(10..=1_000).contains(&p))
        {
            return Err(invalid(
                &key("bumpPercent"),
                "must be within 10..=1000 (geth and reth refuse replacements below +10 %)",
            ));
        }
        if self
            .bump_after_ms
            .is_some_and(|ms| ms != 0 && !(1_000..=86_400_000).contains(&ms))
        {
            return Err(invalid(
                &key("bumpAfterMs"),
                "must be 0 (never) or within 1000..=86400000 milliseconds",
            ));
        }
        if self.index_finality_depth == Some(0) {
            return Err(invalid(
                &key("indexFinalityDepth"),
                "must be at least 1 (the index must be able to repair a reorg of the head)",
            ));
        }
        if self.subscribe == Some(false) && self.ws_url.is_some() {
            return Err(invalid(
                &key("subscribe"),
                "is false while wsUrl is set (remove one)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(toml: &str) -> super::super::ChainConfig {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn known_chain_ids_take_their_profile_and_others_the_default() {
        for (id, p) in [
            (1, ChainProfile::Ethereum),
            (11_155_111, ChainProfile::Ethereum),
            (10, ChainProfile::OpStack),
            (8453, ChainProfile::OpStack),
            (84_532, ChainProfile::OpStack),
            (31_337, ChainProfile::Default),
            (137, ChainProfile::Default),
        ] {
            assert_eq!(ChainProfile::for_chain_id(id), p, "{id}");
        }
    }

    #[test]
    fn profiles_resolve_with_the_chains_overrides() {
        let txq = TxqSettings::default();
        let eth = chain("chainId = 1\nrpcUrls = [\"https://x\"]").settings(&txq);
        assert_eq!(eth.profile, ChainProfile::Ethereum);
        assert_eq!(eth.max_gas_per_transaction, Some(16_777_216));
        assert_eq!(eth.confirmations, 2);
        assert_eq!(eth.finality, Finality::Finalized { fallback_depth: 64 });
        assert_eq!(eth.l1_data_fee, None);
        assert_eq!(eth.ws_url, None);

        let base = chain("chainId = 8453\nrpcUrls = [\"https://x\"]").settings(&txq);
        assert_eq!(base.l1_data_fee, Some(L1DataFee::op_stack()));
        assert!(matches!(
            base.fee_model,
            FeeModel::Eip1559 {
                priority_fee: PriorityFee::Fixed(1_000_000),
                ..
            }
        ));

        let anvil =
            chain("chainId = 31337\nprofile = \"anvil\"\nrpcUrls = [\"http://127.0.0.1:8545\"]")
                .settings(&txq);
        assert_eq!(anvil.finality, Finality::Depth(0));
        assert_eq!(anvil.ws_url.as_deref(), Some("ws://127.0.0.1:8545"));

        let legacy = chain(
            "chainId = 56\nrpcUrls = [\"https://x\"]\nbumpPercent = 25\nconfirmations = 5\n\
             finalityDepth = 15\nindexFinalityDepth = 15\n[fees]\nmodel = \"legacy\"\n\
             gasPriceMultiplierPercent = 120",
        )
        .settings(&txq);
        assert_eq!(
            legacy.fee_model,
            FeeModel::Legacy {
                gas_price_multiplier_percent: 120
            }
        );
        assert_eq!(legacy.bump_percent, 25);
        assert_eq!(legacy.confirmations, 5);
        assert_eq!(legacy.finality, Finality::Depth(15));
        assert_eq!(legacy.index_finality_depth, Some(15));
        assert_eq!(legacy.bump_after, Some(Duration::from_secs(30)));

        let tip = chain(
            "chainId = 10\nrpcUrls = [\"https://x\"]\n[fees]\npriorityFee = \"node\"\n\
             l1DataFee = false",
        )
        .settings(&txq);
        assert_eq!(tip.l1_data_fee, None);
        let history = chain(
            "chainId = 5\nrpcUrls = [\"https://x\"]\n[fees]\npriorityFee = \"fee-history\"\n\
             feeHistoryPercentile = 60",
        )
        .settings(&txq);
        assert!(matches!(
            history.fee_model,
            FeeModel::Eip1559 {
                priority_fee: PriorityFee::FeeHistory {
                    blocks: 20,
                    percentile: 60
                },
                ..
            }
        ));
        assert!(matches!(
            tip.fee_model,
            FeeModel::Eip1559 {
                priority_fee: PriorityFee::Node,
                ..
            }
        ));
    }

    #[test]
    fn contradictory_profile_keys_are_refused_by_name() {
        for (toml, key) in [
            (
                "[fees]\nmodel = \"legacy\"\npriorityFee = 5",
                "chains.c.fees.priorityFee",
            ),
            (
                "[fees]\ngasPriceMultiplierPercent = 120",
                "chains.c.fees.gasPriceMultiplierPercent",
            ),
            (
                "[fees]\nbaseFeeMultiplierPercent = 99",
                "chains.c.fees.baseFeeMultiplierPercent",
            ),
            (
                "[fees]\nl1DataFee = false\nl1FeeMultiplierPercent = 150",
                "chains.c.fees.l1DataFee",
            ),
            (
                "maxGasPerTransaction = 20000",
                "chains.c.maxGasPerTransaction",
            ),
            ("bumpPercent = 5", "chains.c.bumpPercent"),
            (
                "[fees]\nfeeHistoryPercentile = 50",
                "chains.c.fees.feeHistoryPercentile",
            ),
            (
                "[fees]\npriorityFee = \"fee-history\"\nfeeHistoryBlocks = 2000",
                "chains.c.fees.feeHistoryBlocks",
            ),
            ("bumpAfterMs = 10", "chains.c.bumpAfterMs"),
            ("confirmations = 0", "chains.c.confirmations"),
            ("indexFinalityDepth = 0", "chains.c.indexFinalityDepth"),
            (
                "subscribe = false\nwsUrl = \"ws://127.0.0.1:1\"",
                "chains.c.subscribe",
            ),
        ] {
            let c = chain(&format!("chainId = 5\nrpcUrls = [\"http://x\"]\n{toml}"));
            let e = c.validate_profile("c").unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")), "{toml}: {e}");
        }
    }
}
