//! The per-chain platform contracts and their registration in the `Directory`.
//!
//! [`deploy_platform`] deploys, from the signer's account, in this order: `Directory`,
//! `PriceResolver`, `PriceFeedFactory`, `AssetFactory(admin, priceResolver)` and
//! `EntryPointReference(entryPoint)`, then records each (and the EntryPoint itself)
//! in the `Directory` under the names in [`names`]. [`read_back`] reads every one of
//! them back from the chain and checks it against the deployment.

use crate::bindings::{
    AssetFactory, BatchPay, Directory, EntryPointReference, PriceFeedFactory, PriceResolver,
    SponsorPaymaster, SystemFactory,
};
use crate::{AbiError, Result, directory_key};
use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use alloy::rpc::types::TransactionReceipt;

/// `Directory` names of the platform entries (ASCII, see [`crate::directory_key`]).
pub mod names {
    /// The `Directory` itself.
    pub const DIRECTORY: &str = "directory";
    /// `PriceResolver`.
    pub const PRICE_RESOLVER: &str = "priceResolver";
    /// `PriceFeedFactory`.
    pub const PRICE_FEED_FACTORY: &str = "priceFeedFactory";
    /// `AssetFactory`.
    pub const ASSET_FACTORY: &str = "assetFactory";
    /// `EntryPointReference`.
    pub const ENTRY_POINT_REFERENCE: &str = "entryPointReference";
    /// `BatchPay` (many payments in one transaction: distributions).
    pub const BATCH_PAY: &str = "batchPay";
    /// `SystemFactory` (deploys and records organization systems, issue 37).
    pub const SYSTEM_FACTORY: &str = "systemFactory";
    /// The ERC-4337 EntryPoint.
    pub const ENTRY_POINT: &str = "entryPoint";
    /// Keel's ERC-4337 `SponsorPaymaster` (see [`super::deploy_sponsor_paymaster`]).
    pub const SPONSOR_PAYMASTER: &str = "sponsorPaymaster";
}

/// One deployed platform contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployedContract {
    /// Its `Directory` name (one of [`names`]).
    pub name: &'static str,
    /// Its address.
    pub address: Address,
    /// The deploying transaction, when this run deployed it (`None` for the EntryPoint,
    /// which is deployed elsewhere).
    pub tx_hash: Option<B256>,
    /// The block of the deployment, when known.
    pub block: Option<u64>,
}

/// The platform of one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformDeployment {
    /// EIP-155 chain id the contracts live on.
    pub chain_id: u64,
    /// The admin holding every role.
    pub admin: Address,
    /// `directory`, `priceResolver`, `priceFeedFactory`, `assetFactory`,
    /// `entryPointReference`, `entryPoint`, in that order.
    pub contracts: Vec<DeployedContract>,
}

impl PlatformDeployment {
    /// The address recorded under `name`, if any.
    pub fn address(&self, name: &str) -> Option<Address> {
        self.contracts
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.address)
    }
}

fn rpc(step: &'static str) -> impl FnOnce(alloy::contract::Error) -> AbiError {
    move |source| AbiError::Rpc {
        step,
        source: Box::new(source),
    }
}

fn pending(
    step: &'static str,
) -> impl FnOnce(alloy::providers::PendingTransactionError) -> AbiError {
    move |e| AbiError::Rpc {
        step,
        source: Box::new(alloy::contract::Error::PendingTransactionError(e)),
    }
}

fn deployed(
    name: &'static str,
    receipt: &TransactionReceipt,
    step: &'static str,
) -> Result<DeployedContract> {
    if !receipt.status() {
        return Err(AbiError::Reverted { step });
    }
    let address = receipt.contract_address.ok_or(AbiError::NoCode { step })?;
    Ok(DeployedContract {
        name,
        address,
        tx_hash: Some(receipt.transaction_hash),
        block: receipt.block_number,
    })
}

/// Deploys the platform contracts with `admin` as the holder of every role (the
/// provider's signer must be `admin`) and registers them in the new `Directory`.
/// `entry_point` is the ERC-4337 EntryPoint the `EntryPointReference` points at.
///
/// # Errors
/// [`AbiError::Rpc`] when a request fails, [`AbiError::Reverted`] when a deployment or
/// registration reverts.
pub async fn deploy_platform<P: Provider + Clone>(
    provider: &P,
    admin: Address,
    entry_point: Address,
) -> Result<PlatformDeployment> {
    let chain_id = provider.get_chain_id().await.map_err(|e| AbiError::Rpc {
        step: "read chain id",
        source: Box::new(alloy::contract::Error::TransportError(e)),
    })?;

    macro_rules! deploy {
        ($name:expr, $step:literal, $builder:expr) => {{
            let receipt = $builder
                .send()
                .await
                .map_err(rpc($step))?
                .get_receipt()
                .await
                .map_err(pending($step))?;
            deployed($name, &receipt, $step)?
        }};
    }

    let p = provider.clone();
    let directory = deploy!(
        names::DIRECTORY,
        "deploy Directory",
        Directory::deploy_builder(p.clone(), admin)
    );
    let resolver = deploy!(
        names::PRICE_RESOLVER,
        "deploy PriceResolver",
        PriceResolver::deploy_builder(p.clone(), admin)
    );
    let feed_factory = deploy!(
        names::PRICE_FEED_FACTORY,
        "deploy PriceFeedFactory",
        PriceFeedFactory::deploy_builder(p.clone())
    );
    let asset_factory = deploy!(
        names::ASSET_FACTORY,
        "deploy AssetFactory",
        AssetFactory::deploy_builder(p.clone(), admin, resolver.address)
    );
    let reference = deploy!(
        names::ENTRY_POINT_REFERENCE,
        "deploy EntryPointReference",
        EntryPointReference::deploy_builder(p.clone(), entry_point)
    );
    let batch_pay = deploy!(
        names::BATCH_PAY,
        "deploy BatchPay",
        BatchPay::deploy_builder(p.clone())
    );
    let system_factory = deploy!(
        names::SYSTEM_FACTORY,
        "deploy SystemFactory",
        SystemFactory::deploy_builder(p.clone(), admin, resolver.address)
    );
    let entry = DeployedContract {
        name: names::ENTRY_POINT,
        address: entry_point,
        tx_hash: None,
        block: None,
    };
    let contracts = vec![
        directory,
        resolver,
        feed_factory,
        asset_factory,
        reference,
        batch_pay,
        system_factory,
        entry,
    ];

    let dir = Directory::new(contracts[0].address, p);
    for c in &contracts {
        let receipt = dir
            .set(directory_key(c.name), c.address)
            .send()
            .await
            .map_err(rpc("register in Directory"))?
            .get_receipt()
            .await
            .map_err(pending("register in Directory"))?;
        if !receipt.status() {
            return Err(AbiError::Reverted {
                step: "register in Directory",
            });
        }
    }
    Ok(PlatformDeployment {
        chain_id,
        admin,
        contracts,
    })
}

/// Deploys Keel's `SponsorPaymaster(entry_point, sponsor_signer)` from the provider's
/// signer (who becomes its owner and must hold the `Directory` admin role), records it in
/// the `Directory` at `directory` under [`names::SPONSOR_PAYMASTER`], and funds its
/// EntryPoint deposit with `deposit_wei` wei (`deposit()`, skipped when zero).
///
/// `entry_point` must be the **resolved** EntryPoint (the contract itself, not an
/// `EntryPointReference`): the paymaster's constructor checks its ERC-165 interface id
/// and reverts otherwise. Callers obtain it from `keel-aa`'s resolution boundary, or (at
/// bootstrap, before the `Directory` exists) from the deployment they just made.
///
/// # Errors
/// [`AbiError::Rpc`] when a request fails, [`AbiError::Reverted`] when the deployment,
/// the registration or the deposit reverts.
pub async fn deploy_sponsor_paymaster<P: Provider + Clone>(
    provider: &P,
    directory: Address,
    entry_point: Address,
    sponsor_signer: Address,
    deposit_wei: U256,
) -> Result<DeployedContract> {
    const STEP: &str = "deploy SponsorPaymaster";
    let receipt = SponsorPaymaster::deploy_builder(provider.clone(), entry_point, sponsor_signer)
        .send()
        .await
        .map_err(rpc(STEP))?
        .get_receipt()
        .await
        .map_err(pending(STEP))?;
    let paymaster = deployed(names::SPONSOR_PAYMASTER, &receipt, STEP)?;
    let dir = Directory::new(directory, provider.clone());
    let receipt = dir
        .set(directory_key(names::SPONSOR_PAYMASTER), paymaster.address)
        .send()
        .await
        .map_err(rpc("register in Directory"))?
        .get_receipt()
        .await
        .map_err(pending("register in Directory"))?;
    if !receipt.status() {
        return Err(AbiError::Reverted {
            step: "register in Directory",
        });
    }
    if !deposit_wei.is_zero() {
        let pm = SponsorPaymaster::new(paymaster.address, provider.clone());
        let receipt = pm
            .deposit()
            .value(deposit_wei)
            .send()
            .await
            .map_err(rpc("fund the paymaster deposit"))?
            .get_receipt()
            .await
            .map_err(pending("fund the paymaster deposit"))?;
        if !receipt.status() {
            return Err(AbiError::Reverted {
                step: "fund the paymaster deposit",
            });
        }
    }
    Ok(paymaster)
}

/// One read-back check: what was read and whether it matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBack {
    /// The contract's `Directory` name.
    pub name: &'static str,
    /// Its address.
    pub address: Address,
    /// What was read, in words (e.g. `Directory.get(assetFactory) = 0x…`).
    pub observed: String,
}

/// Reads every contract of `deployment` back from the chain: its `Directory` entry, and
/// one view of the contract itself (roles, wiring, the EntryPoint's code).
///
/// # Errors
/// [`AbiError::Mismatch`] naming the first disagreement, [`AbiError::NoCode`] when a
/// contract has no code, [`AbiError::Rpc`] for failed reads.
pub async fn read_back<P: Provider + Clone>(
    provider: &P,
    deployment: &PlatformDeployment,
) -> Result<Vec<ReadBack>> {
    let addr = |name: &str| {
        deployment
            .address(name)
            .ok_or(AbiError::Mismatch("deployment lacks a platform entry"))
    };
    let p = provider.clone();
    let dir = Directory::new(addr(names::DIRECTORY)?, p.clone());
    let mut out = Vec::new();
    for c in &deployment.contracts {
        let code = provider
            .get_code_at(c.address)
            .await
            .map_err(|e| AbiError::Rpc {
                step: "read code",
                source: Box::new(alloy::contract::Error::TransportError(e)),
            })?;
        if code.is_empty() {
            return Err(AbiError::NoCode { step: "read back" });
        }
        let registered = dir
            .get(directory_key(c.name))
            .call()
            .await
            .map_err(rpc("Directory.get"))?;
        if registered != c.address {
            return Err(AbiError::Mismatch(
                "Directory entry differs from the deployed address",
            ));
        }
        let observed = match c.name {
            names::DIRECTORY => {
                let n = dir.names().call().await.map_err(rpc("Directory.names"))?;
                if n.len() != deployment.contracts.len() {
                    return Err(AbiError::Mismatch(
                        "Directory lists an unexpected number of names",
                    ));
                }
                format!("Directory.names() lists {} entries", n.len())
            }
            names::PRICE_RESOLVER => {
                let r = PriceResolver::new(c.address, p.clone());
                let role = r
                    .DEFAULT_ADMIN_ROLE()
                    .call()
                    .await
                    .map_err(rpc("PriceResolver role"))?;
                if !r
                    .hasRole(role, deployment.admin)
                    .call()
                    .await
                    .map_err(rpc("PriceResolver.hasRole"))?
                {
                    return Err(AbiError::Mismatch(
                        "PriceResolver admin role not held by the admin",
                    ));
                }
                format!(
                    "PriceResolver.hasRole(DEFAULT_ADMIN_ROLE, {}) = true",
                    deployment.admin
                )
            }
            names::PRICE_FEED_FACTORY => {
                let f = PriceFeedFactory::new(c.address, p.clone());
                let is_feed = f
                    .isFeed(c.address)
                    .call()
                    .await
                    .map_err(rpc("PriceFeedFactory.isFeed"))?;
                if is_feed {
                    return Err(AbiError::Mismatch(
                        "PriceFeedFactory claims itself as a feed",
                    ));
                }
                "PriceFeedFactory.isFeed(self) = false".to_owned()
            }
            names::ASSET_FACTORY => {
                let f = AssetFactory::new(c.address, p.clone());
                let resolver = f
                    .priceResolver()
                    .call()
                    .await
                    .map_err(rpc("AssetFactory.priceResolver"))?;
                if resolver != addr(names::PRICE_RESOLVER)? {
                    return Err(AbiError::Mismatch(
                        "AssetFactory points at another PriceResolver",
                    ));
                }
                format!("AssetFactory.priceResolver() = {resolver}")
            }
            names::SYSTEM_FACTORY => {
                let f = SystemFactory::new(c.address, p.clone());
                let resolver = f
                    .priceResolver()
                    .call()
                    .await
                    .map_err(rpc("SystemFactory.priceResolver"))?;
                if resolver != addr(names::PRICE_RESOLVER)? {
                    return Err(AbiError::Mismatch(
                        "SystemFactory points at another PriceResolver",
                    ));
                }
                format!("SystemFactory.priceResolver() = {resolver}")
            }
            names::ENTRY_POINT_REFERENCE => {
                let r = EntryPointReference::new(c.address, p.clone());
                let ep = r
                    .entryPoint()
                    .call()
                    .await
                    .map_err(rpc("EntryPointReference.entryPoint"))?;
                if ep != addr(names::ENTRY_POINT)? {
                    return Err(AbiError::Mismatch(
                        "EntryPointReference points at another EntryPoint",
                    ));
                }
                format!("EntryPointReference.entryPoint() = {ep}")
            }
            names::SPONSOR_PAYMASTER => {
                let pm = SponsorPaymaster::new(c.address, p.clone());
                let ep = pm
                    .entryPoint()
                    .call()
                    .await
                    .map_err(rpc("SponsorPaymaster.entryPoint"))?;
                if ep != addr(names::ENTRY_POINT)? {
                    return Err(AbiError::Mismatch(
                        "SponsorPaymaster is bound to another EntryPoint",
                    ));
                }
                let deposit = pm
                    .getDeposit()
                    .call()
                    .await
                    .map_err(rpc("SponsorPaymaster.getDeposit"))?;
                let signer = pm
                    .sponsorSigner()
                    .call()
                    .await
                    .map_err(rpc("SponsorPaymaster.sponsorSigner"))?;
                format!(
                    "SponsorPaymaster.entryPoint() = {ep}, sponsorSigner() = {signer}, deposit {deposit} wei"
                )
            }
            names::ENTRY_POINT => {
                let ep = crate::erc4337::IEntryPointV08::new(c.address, p.clone());
                let creator = ep
                    .senderCreator()
                    .call()
                    .await
                    .map_err(rpc("EntryPoint.senderCreator"))?;
                if creator == Address::ZERO {
                    return Err(AbiError::Mismatch("EntryPoint has no SenderCreator"));
                }
                format!(
                    "EntryPoint.senderCreator() = {creator} ({} bytes of code)",
                    code.len()
                )
            }
            _ => format!("{} bytes of code", code.len()),
        };
        out.push(ReadBack {
            name: c.name,
            address: c.address,
            observed: format!("Directory.get({}) ok; {observed}", c.name),
        });
    }
    Ok(out)
}
