//! # anvil-tests
//!
//! A test harness that runs a **fresh Anvil per test** and deploys Keel's contracts on it,
//! plus the integration tests (in `tests/`) that exercise those contracts on a real node.
//!
//! - [`anvil_path`] finds the Anvil binary (`$KEEL_ANVIL`, else the npm package installed
//!   by `scripts/setup` under `tools/node_modules`).
//! - [`TestChain`] (built with [`ChainBuilder`]) owns one Anvil process on a free port
//!   with its endpoint, chain id, funded dev accounts and a ready [`DynProvider`] signing
//!   as dev account 0. Dropping it kills the node.
//! - [`deploy_keel`] deploys the ERC-4337 v0.8 EntryPoint and `SimpleAccountFactory`
//!   and then Keel's platform contracts, returning their addresses in [`Deployed`].
//! - [`create_feed`], [`create_asset`], [`set_staleness_bound`], [`submit_observation`]
//!   and [`increase_time`] drive the contracts from tests; [`confirm`] sends a contract
//!   call and requires a successful receipt; [`expect_revert`] and [`decode_revert`] turn
//!   a refusal into the contract's typed custom error so tests assert *which* error.
//!
//! - [`proxy::RpcProxy`] is a fault-injecting JSON-RPC proxy to put between the code
//!   under test and the node (dropped responses, errors, `null` results, latency,
//!   failures then recovery, geth's +10 % replacement rule); [`TestChain::provider_via`]
//!   signs as a dev account through such an endpoint.
//!
//! Every test starts its own chain, so tests are independent and run in parallel under
//! `cargo test` and `cargo nextest`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use alloy::contract::{CallBuilder, CallDecoder, SolCallBuilder};
use alloy::node_bindings::{Anvil, AnvilInstance};
use alloy::primitives::{Address, B256, I256, U256};
use alloy::providers::ext::AnvilApi;
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionReceipt;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::{SolEvent, SolInterface};
use anyhow::{Context, anyhow, bail, ensure};
use keel_abi::bindings::{AssetFactory, PriceFeed, PriceFeedFactory, PriceResolver};
use keel_abi::platform::{PlatformDeployment, names};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod proxy;

/// The alloy version the harness is built on, so tests name the same types.
pub use alloy;
/// Keel's contract bindings and deployment code the harness drives.
pub use keel_abi;

/// Path of the Anvil binary inside the npm package, relative to the workspace root.
pub const ANVIL_RELATIVE_PATH: &str = "tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil";

/// Environment variable that overrides the Anvil binary's path.
pub const ANVIL_ENV: &str = "KEEL_ANVIL";

/// How long [`ChainBuilder::start`] waits for Anvil to print its listening address.
/// Generous because tests start many nodes at once on a small machine.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The workspace root (`CARGO_MANIFEST_DIR/..`, i.e. the parent of `anvil-tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// The Anvil binary: `$KEEL_ANVIL` when set, else
/// `<workspace>/tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil` (the real
/// binary of the npm package, not the Node wrapper in `.bin/`).
///
/// # Errors
/// When the file does not exist, with a hint to run `scripts/setup`.
pub fn anvil_path() -> anyhow::Result<PathBuf> {
    resolve_anvil_path(std::env::var_os(ANVIL_ENV), &workspace_root())
}

fn resolve_anvil_path(env: Option<OsString>, workspace: &Path) -> anyhow::Result<PathBuf> {
    let (path, origin) = match env.filter(|v| !v.is_empty()) {
        Some(p) => (PathBuf::from(p), format!("${ANVIL_ENV}")),
        None => (
            workspace.join(ANVIL_RELATIVE_PATH),
            "the npm package".to_owned(),
        ),
    };
    if !path.is_file() {
        bail!(
            "Anvil binary not found at {} (from {origin}); run `scripts/setup` to install it \
             (npm @foundry-rs/anvil under tools/), or set {ANVIL_ENV} to an Anvil binary",
            path.display()
        );
    }
    Ok(path)
}

/// Configuration of a [`TestChain`]. Defaults: Anvil's chain id (31337), automine (a
/// block per transaction), Anvil's 10 dev accounts, no extra arguments.
#[derive(Debug, Clone, Default)]
#[must_use = "a ChainBuilder does nothing until `start` is awaited"]
pub struct ChainBuilder {
    chain_id: Option<u64>,
    block_time: Option<u64>,
    args: Vec<String>,
}

impl ChainBuilder {
    /// A builder with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// EIP-155 chain id (`--chain-id`).
    pub fn chain_id(mut self, chain_id: u64) -> Self {
        self.chain_id = Some(chain_id);
        self
    }

    /// Interval mining every `seconds` (`--block-time`) instead of automine.
    pub fn block_time(mut self, seconds: u64) -> Self {
        self.block_time = Some(seconds);
        self
    }

    /// One extra command-line argument, passed verbatim (e.g. `--slots-in-an-epoch`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Extra command-line arguments, passed verbatim in order.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Settings for load tests (see the field notes: automine stalls near the default
    /// 1,000 pending transactions): `--max-transactions 100000 --gas-limit 1000000000`.
    pub fn high_throughput(self) -> Self {
        self.args(["--max-transactions", "100000", "--gas-limit", "1000000000"])
    }

    /// Starts Anvil on a free port of 127.0.0.1 and connects a provider signing as dev
    /// account 0. The (blocking) start runs on tokio's blocking pool, so several chains
    /// can start concurrently.
    ///
    /// # Errors
    /// When the binary is missing ([`anvil_path`]), Anvil fails to start or to report its
    /// port within [`STARTUP_TIMEOUT`], or prints no dev accounts.
    pub async fn start(self) -> anyhow::Result<TestChain> {
        let mut anvil = Anvil::at(anvil_path()?)
            .host("127.0.0.1")
            .timeout(u64::try_from(STARTUP_TIMEOUT.as_millis()).unwrap_or(u64::MAX));
        if let Some(id) = self.chain_id {
            anvil = anvil.chain_id(id);
        }
        if let Some(secs) = self.block_time {
            anvil = anvil.block_time(secs);
        }
        // Anvil persists older block states under `--cache-path` (by default
        // ~/.foundry/anvil/tmp, never removed when the node is killed, as every test's
        // node is: a full test run left ~30 GB there). A directory of the chain's own,
        // removed when the chain is dropped.
        let states = tempfile::Builder::new()
            .prefix("keel-anvil-states-")
            .tempdir()
            .context("a directory for Anvil's persisted states")?;
        anvil = anvil.args(self.args.clone()).args([
            "--cache-path".to_owned(),
            states.path().display().to_string(),
        ]);
        let instance = tokio::task::spawn_blocking(move || anvil.try_spawn())
            .await
            .context("the task starting Anvil panicked")?
            .context("Anvil did not start")?;
        TestChain::from_instance(instance, states)
    }
}

/// One running Anvil node, fresh for one test. Dropping it kills the node.
#[derive(Debug)]
pub struct TestChain {
    anvil: AnvilInstance,
    endpoint: alloy::transports::http::reqwest::Url,
    signers: Vec<PrivateKeySigner>,
    provider: DynProvider,
    /// Anvil's persisted states (`--cache-path`); declared after `anvil`, so it is
    /// removed after the node is killed.
    _states: tempfile::TempDir,
}

impl TestChain {
    /// Starts a chain with the defaults (see [`ChainBuilder`]).
    ///
    /// # Errors
    /// As [`ChainBuilder::start`].
    pub async fn start() -> anyhow::Result<Self> {
        ChainBuilder::new().start().await
    }

    /// A [`ChainBuilder`] to configure the chain before starting it.
    pub fn builder() -> ChainBuilder {
        ChainBuilder::new()
    }

    fn from_instance(anvil: AnvilInstance, states: tempfile::TempDir) -> anyhow::Result<Self> {
        let signers: Vec<PrivateKeySigner> = anvil
            .keys()
            .iter()
            .map(|k| PrivateKeySigner::from(k.clone()))
            .collect();
        let first = signers
            .first()
            .cloned()
            .ok_or_else(|| anyhow!("Anvil printed no dev accounts"))?;
        let endpoint = anvil.endpoint_url();
        let provider = signing_provider(first, &endpoint, anvil.chain_id());
        Ok(Self {
            anvil,
            endpoint,
            signers,
            provider,
            _states: states,
        })
    }

    /// The HTTP JSON-RPC endpoint (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> &alloy::transports::http::reqwest::Url {
        &self.endpoint
    }

    /// The TCP port Anvil listens on.
    pub fn port(&self) -> u16 {
        self.anvil.port()
    }

    /// The chain id Anvil was started with (31337 unless configured).
    pub fn chain_id(&self) -> u64 {
        self.anvil.chain_id()
    }

    /// Addresses of the funded dev accounts (Anvil's standard mnemonic), index 0 first.
    pub fn accounts(&self) -> Vec<Address> {
        self.signers.iter().map(PrivateKeySigner::address).collect()
    }

    /// Address of dev account `index`.
    ///
    /// # Errors
    /// When there is no such account.
    pub fn account(&self, index: usize) -> anyhow::Result<Address> {
        Ok(self.signer(index)?.address())
    }

    /// Signers of the dev accounts, index 0 first.
    pub fn signers(&self) -> &[PrivateKeySigner] {
        &self.signers
    }

    /// Signer of dev account `index`.
    ///
    /// # Errors
    /// When there is no such account.
    pub fn signer(&self, index: usize) -> anyhow::Result<&PrivateKeySigner> {
        self.signers.get(index).ok_or_else(|| {
            anyhow!(
                "no dev account {index} (this chain has {})",
                self.signers.len()
            )
        })
    }

    /// The provider signing as dev account 0 (the admin in [`deploy_keel`]). Cheap to
    /// clone.
    pub fn provider(&self) -> &DynProvider {
        &self.provider
    }

    /// A new provider signing as dev account `index`.
    ///
    /// # Errors
    /// When there is no such account.
    pub fn provider_for(&self, index: usize) -> anyhow::Result<DynProvider> {
        Ok(signing_provider(
            self.signer(index)?.clone(),
            &self.endpoint,
            self.chain_id(),
        ))
    }

    /// A new provider signing as dev account `index` that sends its requests to
    /// `endpoint` instead of the node (e.g. a [`proxy::RpcProxy::url`]), built like
    /// [`TestChain::provider_for`].
    ///
    /// # Errors
    /// When there is no such account.
    pub fn provider_via(
        &self,
        index: usize,
        endpoint: &alloy::transports::http::reqwest::Url,
    ) -> anyhow::Result<DynProvider> {
        Ok(signing_provider(
            self.signer(index)?.clone(),
            endpoint,
            self.chain_id(),
        ))
    }

    /// Moves the chain's clock forward by `seconds` and mines a block, so the next
    /// transactions and calls see the later time.
    ///
    /// # Errors
    /// When a request fails.
    pub async fn increase_time(&self, seconds: u64) -> anyhow::Result<()> {
        increase_time(&self.provider, seconds).await
    }

    /// Mines one block now (`evm_mine`).
    ///
    /// # Errors
    /// When the request fails.
    pub async fn mine(&self) -> anyhow::Result<()> {
        self.provider
            .evm_mine(None)
            .await
            .context("evm_mine failed")?;
        Ok(())
    }

    /// The latest block number.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn block_number(&self) -> anyhow::Result<u64> {
        self.provider
            .get_block_number()
            .await
            .context("eth_blockNumber failed")
    }
}

/// A provider that signs as `signer`: gas estimation, the chain id, and nonces read
/// from the node (`eth_getTransactionCount(pending)`) for every transaction.
///
/// Not `ProviderBuilder::new()`'s recommended fillers: their cached nonce manager
/// reserves a nonce before gas estimation, so a send refused by estimation (a revert the
/// test expects) leaves a nonce gap, and Anvil then holds every later transaction of that
/// account forever. Reading the nonce each time avoids that; the price is that one
/// account's transactions must be sent one after another (await each before the next).
fn signing_provider(
    signer: PrivateKeySigner,
    endpoint: &alloy::transports::http::reqwest::Url,
    chain_id: u64,
) -> DynProvider {
    ProviderBuilder::new()
        .disable_recommended_fillers()
        .with_gas_estimation()
        .with_simple_nonce_management()
        .with_chain_id(chain_id)
        .wallet(signer)
        .connect_http(endpoint.clone())
        .erased()
}

/// `evm_increaseTime(seconds)` then `evm_mine`: the next block's timestamp is at least
/// `seconds` later.
///
/// # Errors
/// When a request fails.
pub async fn increase_time<P: Provider>(provider: &P, seconds: u64) -> anyhow::Result<()> {
    provider
        .anvil_increase_time(seconds)
        .await
        .context("evm_increaseTime failed")?;
    provider.evm_mine(None).await.context("evm_mine failed")?;
    Ok(())
}

/// Addresses of everything [`deploy_keel`] deployed.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// The admin holding every platform role (dev account 0).
    pub admin: Address,
    /// ERC-4337 EntryPoint v0.8 (always [`keel_abi::erc4337::ENTRY_POINT_V08`]).
    pub entry_point: Address,
    /// `SimpleAccountFactory` bound to the EntryPoint.
    pub simple_account_factory: Address,
    /// Keel's `Directory`.
    pub directory: Address,
    /// Keel's `PriceResolver`.
    pub price_resolver: Address,
    /// Keel's `PriceFeedFactory`.
    pub price_feed_factory: Address,
    /// Keel's `AssetFactory`.
    pub asset_factory: Address,
    /// Keel's `EntryPointReference`.
    pub entry_point_reference: Address,
    /// The platform as `keel_abi` describes it (input of `keel_abi::platform::read_back`).
    pub platform: PlatformDeployment,
}

/// Deploys, from dev account 0 of `chain`, the ERC-4337 v0.8 EntryPoint and
/// `SimpleAccountFactory` (through the CREATE2 deployer, from the npm artifacts) and then
/// Keel's platform with dev account 0 as admin.
///
/// # Errors
/// When the artifacts are missing or any deployment fails.
pub async fn deploy_keel(chain: &TestChain) -> anyhow::Result<Deployed> {
    let provider = chain.provider();
    let admin = chain.account(0)?;
    let artifacts = keel_abi::erc4337::artifacts_dir(&workspace_root());
    let aa = keel_abi::erc4337::deploy_v08(provider, admin, &artifacts)
        .await
        .context("deploying the ERC-4337 v0.8 EntryPoint and SimpleAccountFactory")?;
    let platform = keel_abi::platform::deploy_platform(provider, admin, aa.entry_point)
        .await
        .context("deploying Keel's platform")?;
    let get = |name: &str| {
        platform
            .address(name)
            .ok_or_else(|| anyhow!("the platform deployment lacks {name}"))
    };
    Ok(Deployed {
        admin,
        entry_point: aa.entry_point,
        simple_account_factory: aa.simple_account_factory,
        directory: get(names::DIRECTORY)?,
        price_resolver: get(names::PRICE_RESOLVER)?,
        price_feed_factory: get(names::PRICE_FEED_FACTORY)?,
        asset_factory: get(names::ASSET_FACTORY)?,
        entry_point_reference: get(names::ENTRY_POINT_REFERENCE)?,
        platform,
    })
}

/// Sends a contract call as a transaction, waits for its receipt and requires success.
///
/// # Errors
/// When sending fails (including a revert found by gas estimation) or the transaction
/// was mined but reverted.
pub async fn confirm<P, D>(call: &CallBuilder<P, D>) -> anyhow::Result<TransactionReceipt>
where
    P: Provider,
    D: CallDecoder,
{
    let receipt = call
        .send()
        .await
        .context("sending the transaction failed")?
        .get_receipt()
        .await
        .context("waiting for the receipt failed")?;
    ensure!(
        receipt.status(),
        "transaction {} was mined but reverted",
        receipt.transaction_hash
    );
    Ok(receipt)
}

/// The custom error `E` (a contract's `…Errors` enum) carried by a failed call or send,
/// or `None` when the error holds no revert data or the data is not one of `E`'s errors.
pub fn decode_revert<E: SolInterface>(err: &alloy::contract::Error) -> Option<E> {
    err.as_decoded_interface_error::<E>()
}

/// Sends `call` as a transaction expecting the node to refuse it with a revert, and
/// returns the revert decoded as `E` (the contract's `…Errors` enum). Nothing is mined:
/// the revert is reported by gas estimation (`eth_estimateGas`), which alloy runs before
/// signing.
///
/// # Errors
/// When the transaction was accepted, or the error carried no revert data decodable as
/// `E` (the message then shows the raw error).
pub async fn expect_revert<E, P, D>(call: &CallBuilder<P, D>) -> anyhow::Result<E>
where
    E: SolInterface,
    P: Provider,
    D: CallDecoder,
{
    match call.send().await {
        Ok(pending) => {
            let hash = *pending.tx_hash();
            bail!("expected a revert, but transaction {hash} was accepted")
        }
        Err(err) => decode_revert::<E>(&err).ok_or_else(|| {
            anyhow!(
                "expected a revert decodable as {}, got: {err} (revert data: {:?})",
                std::any::type_name::<E>(),
                err.as_revert_data()
            )
        }),
    }
}

/// Like [`expect_revert`], through `eth_call` (a read-only simulation) instead of a send.
///
/// # Errors
/// When the call succeeded, or its error is not decodable as `E`.
pub async fn expect_call_revert<E, P, D>(call: &CallBuilder<P, D>) -> anyhow::Result<E>
where
    E: SolInterface,
    P: Provider,
    D: CallDecoder,
{
    match call.call_raw().await {
        Ok(out) => bail!("expected a revert, but the call returned {out}"),
        Err(err) => decode_revert::<E>(&err).ok_or_else(|| {
            anyhow!(
                "expected a revert decodable as {}, got: {err}",
                std::any::type_name::<E>()
            )
        }),
    }
}

/// Every log of `receipt` emitted by `emitter` that decodes as event `E`, in order.
pub fn events<E: SolEvent>(receipt: &TransactionReceipt, emitter: Address) -> Vec<E> {
    receipt
        .inner
        .logs()
        .iter()
        .filter(|log| log.address() == emitter && log.topics().first() == Some(&E::SIGNATURE_HASH))
        .filter_map(|log| log.log_decode::<E>().ok())
        .map(|log| log.inner.data)
        .collect()
}

/// Deploys a `PriceFeed` through the `PriceFeedFactory` at `factory` and returns its
/// address, read from the receipt's `FeedCreated` event (the receipt also carries the
/// feed's `RoleGranted` logs, before it).
///
/// # Errors
/// When the transaction fails or has no `FeedCreated` event.
pub async fn create_feed(
    provider: &DynProvider,
    factory: Address,
    decimals: u8,
    description: &str,
    admin: Address,
    updater: Address,
) -> anyhow::Result<Address> {
    let f = PriceFeedFactory::new(factory, provider.clone());
    let receipt = confirm(&f.createFeed(decimals, description.to_owned(), admin, updater))
        .await
        .context("PriceFeedFactory.createFeed")?;
    let created = events::<PriceFeedFactory::FeedCreated>(&receipt, factory);
    match created.as_slice() {
        [one] => Ok(one.feed),
        other => bail!(
            "expected one FeedCreated event, found {} in {}",
            other.len(),
            receipt.transaction_hash
        ),
    }
}

/// Arguments of `AssetFactory.createAsset` / `predictAddress`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssetSpec {
    /// Keel asset id.
    pub asset_id: B256,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// Receives every role of the token.
    pub token_admin: Address,
    /// The asset's price feed.
    pub price_feed: Address,
}

impl AssetSpec {
    /// The `createAsset` call for this spec on the factory `factory`.
    pub fn create_call<'a>(
        &self,
        factory: &'a AssetFactory::AssetFactoryInstance<DynProvider>,
    ) -> SolCallBuilder<&'a DynProvider, AssetFactory::createAssetCall> {
        factory.createAsset(
            self.asset_id,
            self.name.clone(),
            self.symbol.clone(),
            self.decimals,
            self.token_admin,
            self.price_feed,
        )
    }

    /// The address the factory at `factory` gives this asset (`predictAddress`).
    ///
    /// # Errors
    /// When the call fails.
    pub async fn predict(
        &self,
        factory: &AssetFactory::AssetFactoryInstance<DynProvider>,
    ) -> anyhow::Result<Address> {
        factory
            .predictAddress(
                self.asset_id,
                self.name.clone(),
                self.symbol.clone(),
                self.decimals,
                self.token_admin,
                self.price_feed,
            )
            .call()
            .await
            .context("AssetFactory.predictAddress")
    }
}

/// Deploys the `AssetToken` of `spec` through the `AssetFactory` at `factory` (the
/// provider's account needs `DEPLOYER_ROLE`) and returns its address and the receipt,
/// the address read from the receipt's `AssetCreated` event.
///
/// # Errors
/// When the transaction fails (e.g. `AssetAlreadyDeployed`) or has no `AssetCreated`.
pub async fn create_asset(
    provider: &DynProvider,
    factory: Address,
    spec: &AssetSpec,
) -> anyhow::Result<(Address, TransactionReceipt)> {
    let f = AssetFactory::new(factory, provider.clone());
    let receipt = confirm(&spec.create_call(&f))
        .await
        .context("AssetFactory.createAsset")?;
    let created = events::<AssetFactory::AssetCreated>(&receipt, factory);
    match created.as_slice() {
        [one] if one.assetId == spec.asset_id => Ok((one.token, receipt)),
        other => bail!(
            "expected one AssetCreated event for {}, found {other:?}",
            spec.asset_id
        ),
    }
}

/// Installs a staleness bound of `seconds` for `feed` in the `PriceResolver` at
/// `resolver` (the provider's account needs its `DEFAULT_ADMIN_ROLE`).
///
/// # Errors
/// When the transaction fails.
pub async fn set_staleness_bound(
    provider: &DynProvider,
    resolver: Address,
    feed: Address,
    seconds: u64,
) -> anyhow::Result<TransactionReceipt> {
    let r = PriceResolver::new(resolver, provider.clone());
    confirm(&r.setStalenessBound(feed, U256::from(seconds)))
        .await
        .context("PriceResolver.setStalenessBound")
}

/// Submits `answer` to the `PriceFeed` at `feed` (the provider's account needs
/// `UPDATER_ROLE`): a new round timestamped with the block that includes it.
///
/// # Errors
/// When the transaction fails.
pub async fn submit_observation(
    provider: &DynProvider,
    feed: Address,
    answer: i128,
) -> anyhow::Result<TransactionReceipt> {
    let f = PriceFeed::new(feed, provider.clone());
    let answer = I256::try_from(answer).context("answer out of int256 range")?;
    confirm(&f.submit(answer)).await.context("PriceFeed.submit")
}

/// A price feed plus the asset token priced by it, both administered by dev account 0
/// (see [`deploy_asset_with_feed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssetWithFeed {
    /// The `PriceFeed` (dev account 0 is admin and updater).
    pub feed: Address,
    /// The `AssetToken` (dev account 0 holds every role); starts paused.
    pub token: Address,
    /// What the token was created with.
    pub spec: AssetSpec,
}

/// Creates a feed (8 decimals, dev account 0 as admin and updater) and an asset token
/// with id `keccak256(symbol)`, 18 decimals, priced by that feed, administered by dev
/// account 0. No staleness bound and no observation are installed.
///
/// # Errors
/// When a transaction fails.
pub async fn deploy_asset_with_feed(
    chain: &TestChain,
    deployed: &Deployed,
    symbol: &str,
) -> anyhow::Result<AssetWithFeed> {
    let admin = chain.account(0)?;
    let feed = create_feed(
        chain.provider(),
        deployed.price_feed_factory,
        8,
        &format!("{symbol} / USD"),
        admin,
        admin,
    )
    .await?;
    let spec = AssetSpec {
        asset_id: alloy::primitives::keccak256(symbol.as_bytes()),
        name: format!("Keel {symbol}"),
        symbol: symbol.to_owned(),
        decimals: 18,
        token_admin: admin,
        price_feed: feed,
    };
    let (token, _) = create_asset(chain.provider(), deployed.asset_factory, &spec).await?;
    Ok(AssetWithFeed { feed, token, spec })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_anvil_names_scripts_setup() {
        let dir = std::env::temp_dir().join("keel-anvil-tests-no-such-workspace");
        let err = resolve_anvil_path(None, &dir).unwrap_err().to_string();
        assert!(err.contains("scripts/setup"), "{err}");
        assert!(err.contains(ANVIL_RELATIVE_PATH), "{err}");
        let err = resolve_anvil_path(Some(dir.join("anvil").into_os_string()), &dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("$KEEL_ANVIL"), "{err}");
    }

    #[test]
    fn env_override_wins_and_empty_is_ignored() {
        let this_file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let got = resolve_anvil_path(
            Some(this_file.clone().into_os_string()),
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(got, this_file);
        let err = resolve_anvil_path(Some(OsString::new()), Path::new("/nonexistent")).unwrap_err();
        assert!(err.to_string().contains("npm package"), "{err}");
    }

    #[test]
    fn workspace_root_is_the_workspace() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
        assert!(workspace_root().join("anvil-tests").is_dir());
    }
}
