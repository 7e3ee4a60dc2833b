//! `[chains.<name>]` (with `custody`) and `[custody]`: the chains a deployment serves and
//! their custody providers.

use super::{Config, ConfigError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One chain Keel works on (`[chains.<name>]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChainConfig {
    /// EIP-155 chain id (> 0).
    pub chain_id: u64,
    /// JSON-RPC upstream URLs, in failover order (at least one; http, https, ws or wss).
    /// They may embed provider API keys: printed only redacted.
    pub rpc_urls: Vec<String>,
    /// The kind of chain its defaults come from (`anvil`, `ethereum`, `op-stack`,
    /// `default`; see [`super::ChainProfile`] for what each sets). Absent: by chain id
    /// (Ethereum and its testnets `ethereum`; OP Mainnet, Base and their Sepolia
    /// testnets `op-stack`; every other chain `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<super::ChainProfile>,
    /// `[chains.<name>.fees]`: overrides of the profile's fee model (EIP-1559 or legacy
    /// `gasPrice`, the base-fee multiplier, the tip's source, the OP Stack L1 data fee).
    #[serde(default, skip_serializing_if = "super::ChainFees::is_empty")]
    pub fees: super::ChainFees,
    /// Blocks below the head after which a receipt settles a request (at least 1;
    /// profile: `ethereum` 2, else 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmations: Option<u64>,
    /// The most gas one transaction may use, whatever the block gas limit (at least
    /// 21000; profile: `ethereum` 16777216 = 2^24, EIP-7825; else the block gas limit
    /// alone). A larger write fails `EXCEEDS_BLOCK_GAS_LIMIT` before it takes a nonce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gas_per_transaction: Option<u64>,
    /// Percent a replacement raises every fee field by on this chain (10..=1000;
    /// default `txq.bumpPercent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bump_percent: Option<u64>,
    /// A transaction without a receipt this long is replaced with bumped fees on this
    /// chain, milliseconds (0: never, else 1000..=86400000; default `txq.bumpAfterMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bump_after_ms: Option<u64>,
    /// Blocks below the head after which the indexer treats a block as final on this
    /// chain, in place of the node's `finalized` tag (at least 1). Absent (the default):
    /// the node's `finalized` block, else `index.finalityDepth` below the head. A reorg
    /// at or below the final block marks the chain degraded until it is re-indexed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_finality_depth: Option<u64>,
    /// Whether the indexer subscribes to `eth_subscribe("newHeads")` (default true:
    /// on `wsUrl` when set, and for the `anvil` profile on its RPC port). `false` for a
    /// node without subscriptions; it cannot be combined with `wsUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<bool>,
    /// Blocks below the head after which a block is final for the transaction queue
    /// (issue 32 §3; profile: `anvil` 0): a request whose nonce another transaction took is re-signed at a
    /// fresh nonce only once that transaction is this deep; the bundler reports a user
    /// operation's inclusion only from a block this deep (issue 33). Absent (the default): the
    /// node's `finalized` block (64 blocks below the head on a node without the tag; 450
    /// on `op-stack`).
    /// 0 only for a local chain such as Anvil (the head is final).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finality_depth: Option<u64>,
    /// The upstream's WebSocket endpoint for `eth_subscribe("newHeads")` (`ws://` or
    /// `wss://`; optional, none by default). When set, the indexer's tip loop runs a
    /// round on every new head and polls only every `index.subscribedPollIntervalMs` as
    /// the safety net (a closed subscription is reopened with backoff). It may embed a
    /// provider API key: printed only redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ws_url: Option<String>,
    /// `[chains.<name>.custody]`: a custody provider account whose vault accounts send
    /// this chain's transactions for the templates that name them (absent: local keys
    /// only). See docs/custody.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custody: Option<ChainCustodyConfig>,
    /// `[chains.<name>.senders.<sender>]`: the chain's signer pool beyond the operator
    /// key (issue 35 §2), by name (`^[a-z0-9][a-z0-9._-]{0,63}$`; the name is for
    /// logs and `keel signer list`, the address is what metrics and Platform Status
    /// show). Each is a key of any signer kind (a table with `kind` and the kind's keys,
    /// as `[operator.signer]`; see docs/signers.md), with its own nonce stream, funding
    /// checks and funding requests. The pool is the operator and these senders, in
    /// name order; a new asset of a template without a custody vault gets the next
    /// sender of the pool (round-robin) as its issuer, and every later operation of
    /// the asset is sent by it. Absent (the default): the operator alone.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub senders: BTreeMap<String, crate::signer::SignerConfig>,
}

/// The custody platform of a `[chains.<name>.custody]` section.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CustodyProviderKind {
    /// Fireblocks (REST API v1, webhooks v2), or `keel-custody-sim`.
    Fireblocks,
}

/// `[chains.<name>.custody]`: one provider account (workspace API user) and its vault
/// accounts (`vaults.<name>`), the senders a template can choose. Holds secret
/// *sources* (`env:NAME`, `file:PATH`), never secret values, so it may be printed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChainCustodyConfig {
    /// The provider (`fireblocks`).
    pub provider: CustodyProviderKind,
    /// The API origin without a path (`https://api.fireblocks.io`, or the simulator's).
    pub base_url: String,
    /// The API key (`env:NAME` or `file:PATH`).
    pub api_key: keel_custody::SecretSource,
    /// The API user's RSA private key, PEM (`env:NAME` or `file:PATH`).
    pub private_key: keel_custody::SecretSource,
    /// Sustained request rate of the account, requests per second (1..=10000;
    /// default 20).
    #[serde(default = "default_custody_rps")]
    pub requests_per_second: u32,
    /// Burst above the sustained rate, requests (default 20).
    #[serde(default = "default_custody_rps")]
    pub burst: u32,
    /// Timeout of one provider request, milliseconds (100..=600000; default 10000).
    #[serde(default = "default_custody_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The vault accounts, by name (the name a template's `--sender` gives). Each one
    /// is a sender of this chain: `vaultAccountId` (a string: quote it in an
    /// environment override, `'"7"'`), `assetId`, `address`, and the poll, budget,
    /// silent-drop (`silentDropAfterSecs = 0`: never) and clock-skew settings of
    /// `keel_txq::CustodySenderConfig`.
    #[serde(default)]
    pub vaults: BTreeMap<String, keel_txq::CustodySenderConfig>,
}

fn default_custody_rps() -> u32 {
    20
}
fn default_custody_timeout_ms() -> u64 {
    10_000
}

impl Config {
    /// The custody vault `vault` of chain `chain` as a template's sender (its name and
    /// configured address).
    ///
    /// # Errors
    /// [`ConfigError::UnknownSender`] when the chain has no such vault (or no custody
    /// section).
    pub fn template_sender(
        &self,
        chain: &str,
        vault: &str,
    ) -> Result<keel_workflows::tenancy::TemplateSender, ConfigError> {
        self.chains
            .get(chain)
            .and_then(|c| c.custody.as_ref())
            .and_then(|c| c.vaults.get(vault))
            .map(|v| keel_workflows::tenancy::TemplateSender {
                vault: vault.to_owned(),
                address: v.address,
            })
            .ok_or_else(|| ConfigError::UnknownSender {
                chain: chain.to_owned(),
                vault: vault.to_owned(),
            })
    }
}

impl ChainCustodyConfig {
    /// The adapter's configuration (the other adapter settings at their defaults).
    pub fn fireblocks(&self) -> keel_custody::FireblocksConfig {
        keel_custody::FireblocksConfig {
            requests_per_second: self.requests_per_second,
            burst: self.burst,
            request_timeout_ms: self.request_timeout_ms,
            ..keel_custody::FireblocksConfig::new(
                self.base_url.clone(),
                self.api_key.clone(),
                self.private_key.clone(),
            )
        }
    }
}

/// `[custody]`: inbound provider webhooks (role `api`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustodySettings {
    /// The JWKS URL the webhooks of `POST /v1/custody/webhooks/fireblocks` are verified
    /// against (Fireblocks: `https://keys.fireblocks.io/.well-known/jwks.json`; the
    /// simulator: `<base>/.well-known/jwks.json`). Empty (default): the route answers
    /// 404.
    pub webhook_jwks_url: String,
}
