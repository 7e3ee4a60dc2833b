//! # keel-bootstrap
//!
//! Makes a chain ready for Keel (`keel chain bootstrap`), as a library with its own
//! tests against Anvil and PostgreSQL:
//!
//! 1. optionally deploys the ERC-4337 EntryPoint v0.8 and `SimpleAccountFactory` at
//!    their canonical addresses (dev chains, [`keel_abi::erc4337::deploy_v08`]);
//! 2. deploys the platform contracts and registers them in the new `Directory`
//!    ([`keel_abi::platform::deploy_platform`]);
//! 3. deploys the `SponsorPaymaster` bound to the EntryPoint *resolved* through
//!    keel-aa's boundary ([`keel_aa::resolve_entry_point`]) and funds its deposit;
//! 4. records every contract ([`keel_store::platform::platform_contract_upsert`]) and
//!    adds the indexed ones to the chain's index scope ([`keel_index::scope::add_scope`]);
//! 5. reads every contract back ([`keel_abi::platform::read_back`]);
//! 6. grants each custody vault the platform roles the asset workflows need
//!    ([`grant_custody_roles`]).
//!
//! It writes no table itself: the rows go through the functions of the crates that own
//! them. The deployer signs through any alloy transaction signer (a local key, a
//! keystore, a remote signer), the same seam as the queue's.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use alloy::network::{EthereumWallet, TxSigner};
use alloy::primitives::{Address, B256, Signature};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use keel_abi::bindings::{AssetFactory, PriceResolver};
use keel_abi::platform::{DeployedContract, PlatformDeployment, ReadBack, names};
use keel_store::platform::{PlatformContract, platform_contract_upsert};
use keel_units::{ChainId, Wei};
use sqlx::PgPool;
use std::path::PathBuf;

/// Why a bootstrap stopped. Messages carry no key material; what was recorded before
/// the failure stays recorded (a bootstrap can be run again: rows of the same chain and
/// name are replaced).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// The chain has no RPC URL.
    #[error("chain `{chain}` has no RPC URL")]
    NoRpcUrl {
        /// The chain's name.
        chain: String,
    },
    /// The chain's RPC URL could not be used (`chains.<name>.rpcUrls`).
    #[error("configuration key `chains.{chain}.rpcUrls`")]
    Upstream {
        /// The chain's name.
        chain: String,
        /// What was wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A chain request failed.
    #[error("{step}")]
    Rpc {
        /// The request (`eth_chainId`, `eth_getCode`, ...).
        step: &'static str,
        /// The transport's error.
        #[source]
        source: alloy::transports::TransportError,
    },
    /// The chain's RPC reports another chain id than configured.
    #[error(
        "chain `{chain}` is configured with chainId {configured} but its RPC reports {reported}"
    )]
    ChainIdMismatch {
        /// The chain's name.
        chain: String,
        /// `chains.<name>.chainId`.
        configured: u64,
        /// What `eth_chainId` answered.
        reported: u64,
    },
    /// The EntryPoint the platform should reference has no code (deploy ERC-4337 first
    /// on a dev chain, or name another EntryPoint).
    #[error("no code at the EntryPoint {0}")]
    NoEntryPoint(Address),
    /// A deployment, registration or read-back failed.
    #[error(transparent)]
    Abi(#[from] keel_abi::AbiError),
    /// The EntryPoint recorded in the new `Directory` did not resolve.
    #[error("resolving the EntryPoint recorded in the Directory")]
    Resolve(#[source] keel_aa::ResolveError),
    /// A platform contract row could not be recorded.
    #[error("recording platform contract `{name}`")]
    Record {
        /// The contract's `Directory` name.
        name: &'static str,
        /// The store's error.
        #[source]
        source: keel_store::StoreError,
    },
    /// A contract could not be added to the index scope.
    #[error("adding {name} to the index scope")]
    Scope {
        /// The contract's `Directory` name.
        name: &'static str,
        /// The index's error.
        #[source]
        source: keel_index::IndexError,
    },
    /// A role check or grant failed.
    #[error("granting {role} to vault `{vault}`")]
    Grant {
        /// The vault's name.
        vault: String,
        /// The role (`DEPLOYER_ROLE (AssetFactory)`, ...).
        role: &'static str,
        /// The call's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A role grant reverted.
    #[error("granting {role} to vault `{vault}` reverted")]
    GrantReverted {
        /// The vault's name.
        vault: String,
        /// The role.
        role: &'static str,
    },
    /// The deployment lacks a contract the next step needs.
    #[error("the deployment has no {0}")]
    Missing(&'static str),
    /// The chain id does not fit PostgreSQL's `BIGINT`.
    #[error("chain id {0} exceeds i64")]
    ChainIdRange(u64),
    /// No platform is recorded for the chain (run `keel chain bootstrap` first).
    #[error("chain `{chain}` has no recorded platform: bootstrap it first")]
    NotBootstrapped {
        /// The chain's name.
        chain: String,
    },
    /// The recorded platform contracts could not be read.
    #[error("reading the recorded platform contracts")]
    Read(#[source] keel_store::StoreError),
}

/// `Result` with [`BootstrapError`].
pub type Result<T, E = BootstrapError> = std::result::Result<T, E>;

/// The chain to bootstrap, as configured (`chains.<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainTarget {
    /// The chain's name in the configuration (for messages).
    pub name: String,
    /// Its EIP-155 chain id (checked against `eth_chainId`).
    pub chain_id: u64,
    /// Its RPC URLs; the deployment goes through the first.
    pub rpc_urls: Vec<String>,
}

/// What to deploy besides the platform contracts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapPlan {
    /// Deploy EntryPoint v0.8 and `SimpleAccountFactory` at their canonical addresses
    /// from the npm artifacts in this directory ([`keel_abi::erc4337::artifacts_dir`]),
    /// when absent (local/dev chains). `None`: the EntryPoint must exist.
    pub erc4337_artifacts: Option<PathBuf>,
    /// The EntryPoint the `EntryPointReference` records (`None`: canonical v0.8).
    pub entry_point: Option<Address>,
    /// The sponsor key's address the `SponsorPaymaster` honours (`None`: the deployer).
    pub sponsor_signer: Option<Address>,
    /// The EntryPoint deposit funded for the `SponsorPaymaster` (zero: none).
    pub paymaster_deposit: Wei,
    /// Custody vaults (`chains.<name>.custody.vaults`): name and address, granted
    /// their roles by [`grant_custody_roles`].
    pub custody_vaults: Vec<(String, Address)>,
}

/// The stages of a bootstrap, in order (for a progress display).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Deploying EntryPoint v0.8 and `SimpleAccountFactory` (only with
    /// [`BootstrapPlan::erc4337_artifacts`]).
    Erc4337,
    /// Deploying the platform contracts.
    Platform,
    /// Deploying the `SponsorPaymaster` and funding its deposit.
    Paymaster,
    /// Recording the contracts and the index scope.
    Record,
}

impl Stage {
    /// What the stage does, in words.
    pub fn message(self) -> &'static str {
        match self {
            Stage::Erc4337 => "deploying EntryPoint v0.8 and SimpleAccountFactory",
            Stage::Platform => "deploying the platform contracts",
            Stage::Paymaster => "deploying the SponsorPaymaster and funding its deposit",
            Stage::Record => "recording the contracts and the index scope",
        }
    }

    /// How many stages a bootstrap of `plan` has.
    pub fn count(plan: &BootstrapPlan) -> u64 {
        if plan.erc4337_artifacts.is_some() {
            4
        } else {
            3
        }
    }
}

/// A custody vault that holds its platform roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustodyGrant {
    /// The vault's name.
    pub vault: String,
    /// Its address.
    pub address: Address,
    /// How many roles were granted now (0: it held both already).
    pub granted: usize,
}

/// What a bootstrap did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrapped {
    /// The ERC-4337 contracts deployed (or found) when asked for.
    pub erc4337: Option<keel_abi::erc4337::Erc4337Deployment>,
    /// The platform: every contract recorded, the `SponsorPaymaster` last.
    pub deployment: PlatformDeployment,
    /// The read-back of every contract.
    pub checks: Vec<ReadBack>,
    /// The custody vaults and their grants, in configuration order.
    pub custody: Vec<CustodyGrant>,
}

/// The index scope kind of a platform contract (`None`: not indexed).
pub fn scope_kind(name: &str) -> Option<keel_index::ScopeKind> {
    match name {
        names::DIRECTORY => Some(keel_index::ScopeKind::Directory),
        names::PRICE_RESOLVER => Some(keel_index::ScopeKind::PriceResolver),
        names::PRICE_FEED_FACTORY => Some(keel_index::ScopeKind::PriceFeedFactory),
        names::ASSET_FACTORY => Some(keel_index::ScopeKind::AssetFactory),
        _ => None,
    }
}

/// A provider for `chain` whose transactions `deployer` signs, connected to its first
/// RPC URL, after checking that the node serves the configured chain id.
///
/// # Errors
/// [`BootstrapError::NoRpcUrl`], [`BootstrapError::Upstream`] (an unusable URL),
/// [`BootstrapError::Rpc`], [`BootstrapError::ChainIdMismatch`].
pub async fn connect<S>(chain: &ChainTarget, deployer: S) -> Result<DynProvider>
where
    S: TxSigner<Signature> + Send + Sync + 'static,
{
    let url = chain
        .rpc_urls
        .first()
        .ok_or_else(|| BootstrapError::NoRpcUrl {
            chain: chain.name.clone(),
        })?;
    let url: alloy::transports::http::reqwest::Url =
        url.parse().map_err(|e| BootstrapError::Upstream {
            chain: chain.name.clone(),
            source: Box::new(e),
        })?;
    let provider = ProviderBuilder::new()
        .wallet(EthereumWallet::from(deployer))
        .connect_http(url)
        .erased();
    let reported = provider
        .get_chain_id()
        .await
        .map_err(|source| BootstrapError::Rpc {
            step: "eth_chainId",
            source,
        })?;
    if reported != chain.chain_id {
        return Err(BootstrapError::ChainIdMismatch {
            chain: chain.name.clone(),
            configured: chain.chain_id,
            reported,
        });
    }
    Ok(provider)
}

/// Bootstraps `chain` (the steps in the crate documentation) with `deployer` as the
/// admin of every contract, recording into `db` (migrated). `on_stage` is called as
/// each [`Stage`] starts.
///
/// # Errors
/// [`BootstrapError`]: the first step that failed.
pub async fn bootstrap<S>(
    db: &PgPool,
    chain: &ChainTarget,
    deployer: S,
    plan: &BootstrapPlan,
    mut on_stage: impl FnMut(Stage),
) -> Result<Bootstrapped>
where
    S: TxSigner<Signature> + Send + Sync + 'static,
{
    let admin = deployer.address();
    let provider = connect(chain, deployer).await?;
    let erc4337 = match &plan.erc4337_artifacts {
        Some(dir) => {
            on_stage(Stage::Erc4337);
            Some(keel_abi::erc4337::deploy_v08(&provider, admin, dir).await?)
        }
        None => None,
    };
    let entry_point = plan
        .entry_point
        .unwrap_or(keel_abi::erc4337::ENTRY_POINT_V08);
    let code = provider
        .get_code_at(entry_point)
        .await
        .map_err(|source| BootstrapError::Rpc {
            step: "eth_getCode (EntryPoint)",
            source,
        })?;
    if code.is_empty() {
        return Err(BootstrapError::NoEntryPoint(entry_point));
    }

    on_stage(Stage::Platform);
    let mut deployment = keel_abi::platform::deploy_platform(&provider, admin, entry_point).await?;

    on_stage(Stage::Paymaster);
    // The paymaster is bound to the *resolved* EntryPoint, read through keel-aa's
    // resolution boundary from the Directory just written (the only EntryPoint lookup).
    let directory = deployment
        .address(names::DIRECTORY)
        .ok_or(BootstrapError::Missing("Directory"))?;
    let upstreams = keel_chain::UpstreamPool::new(
        ChainId(chain.chain_id),
        keel_chain::UpstreamConfig::new(chain.rpc_urls.clone()),
    )
    .map_err(|e| BootstrapError::Upstream {
        chain: chain.name.clone(),
        source: Box::new(e),
    })?;
    let resolution = keel_aa::resolve_entry_point(&upstreams, directory)
        .await
        .map_err(BootstrapError::Resolve)?;
    let paymaster = keel_abi::platform::deploy_sponsor_paymaster(
        &provider,
        directory,
        resolution.resolved.address(),
        plan.sponsor_signer.unwrap_or(admin),
        plan.paymaster_deposit.get(),
    )
    .await?;
    deployment.contracts.push(paymaster);

    on_stage(Stage::Record);
    record(db, &deployment).await?;
    let checks = keel_abi::platform::read_back(&provider, &deployment).await?;
    let custody = grant_custody_roles(&provider, &deployment, &plan.custody_vaults).await?;
    Ok(Bootstrapped {
        erc4337,
        deployment,
        checks,
        custody,
    })
}

/// Records every contract of `deployment` (replacing rows of the same chain and name)
/// and adds the indexed ones ([`scope_kind`]) to the chain's index scope from their
/// deployment block.
///
/// # Errors
/// [`BootstrapError::Record`], [`BootstrapError::Scope`],
/// [`BootstrapError::ChainIdRange`].
pub async fn record(db: &PgPool, deployment: &PlatformDeployment) -> Result<()> {
    let chain_id = i64::try_from(deployment.chain_id)
        .map_err(|_| BootstrapError::ChainIdRange(deployment.chain_id))?;
    for c in &deployment.contracts {
        platform_contract_upsert(db, &row(chain_id, c))
            .await
            .map_err(|source| BootstrapError::Record {
                name: c.name,
                source,
            })?;
    }
    for c in &deployment.contracts {
        let Some(kind) = scope_kind(c.name) else {
            continue;
        };
        keel_index::scope::add_scope(
            db,
            ChainId(deployment.chain_id),
            &keel_index::ScopeEntry {
                address: c.address,
                kind,
                organization: None,
                from_block: c.block.unwrap_or(0),
            },
        )
        .await
        .map_err(|source| BootstrapError::Scope {
            name: c.name,
            source,
        })?;
    }
    Ok(())
}

/// The platform recorded for `chain` by an earlier [`bootstrap`] ([`record`]), with
/// `admin` as its admin (the recorded rows do not name it). Rows of names Keel does not
/// know ([`names`]) or with an unreadable address are left out.
///
/// # Errors
/// [`BootstrapError::NotBootstrapped`] when nothing is recorded,
/// [`BootstrapError::Read`], [`BootstrapError::ChainIdRange`].
pub async fn recorded(
    db: &PgPool,
    chain: &ChainTarget,
    admin: Address,
) -> Result<PlatformDeployment> {
    let chain_id =
        i64::try_from(chain.chain_id).map_err(|_| BootstrapError::ChainIdRange(chain.chain_id))?;
    let rows = keel_store::platform::platform_contract_list(db, chain_id)
        .await
        .map_err(BootstrapError::Read)?;
    let known = [
        names::DIRECTORY,
        names::PRICE_RESOLVER,
        names::PRICE_FEED_FACTORY,
        names::ASSET_FACTORY,
        names::ENTRY_POINT_REFERENCE,
        names::BATCH_PAY,
        names::SYSTEM_FACTORY,
        names::ENTRY_POINT,
        names::SPONSOR_PAYMASTER,
    ];
    let contracts: Vec<DeployedContract> = rows
        .iter()
        .filter_map(|r| {
            let name = known.iter().find(|n| **n == r.name)?;
            let address = Address::try_from(r.address.as_slice()).ok()?;
            Some(DeployedContract {
                name,
                address,
                tx_hash: r
                    .deploy_tx_hash
                    .as_deref()
                    .and_then(|h| B256::try_from(h).ok()),
                block: r.deployed_block.and_then(|b| u64::try_from(b).ok()),
            })
        })
        .collect();
    if contracts.is_empty() {
        return Err(BootstrapError::NotBootstrapped {
            chain: chain.name.clone(),
        });
    }
    Ok(PlatformDeployment {
        chain_id: chain.chain_id,
        admin,
        contracts,
    })
}

/// `keel chain grant-roles`: grants `vaults` their platform roles
/// ([`grant_custody_roles`]) on the platform an earlier bootstrap recorded for `chain`,
/// signed by `admin` (the platform's admin: the bootstrap's deployer). Idempotent: a
/// role already held is skipped, so a chain bootstrapped before its vaults were
/// configured gets them, and a second run sends nothing.
///
/// # Errors
/// [`BootstrapError::NotBootstrapped`], the errors of [`connect`] and
/// [`grant_custody_roles`] (a signer that is not the admin: [`BootstrapError::Grant`],
/// refused at gas estimation, or [`BootstrapError::GrantReverted`]).
pub async fn grant_roles<S>(
    db: &PgPool,
    chain: &ChainTarget,
    admin: S,
    vaults: &[(String, Address)],
) -> Result<Vec<CustodyGrant>>
where
    S: TxSigner<Signature> + Send + Sync + 'static,
{
    let deployment = recorded(db, chain, admin.address()).await?;
    let provider = connect(chain, admin).await?;
    grant_custody_roles(&provider, &deployment, vaults).await
}

fn row(chain_id: i64, c: &DeployedContract) -> PlatformContract {
    PlatformContract {
        chain_id,
        name: c.name.to_owned(),
        address: c.address.to_vec(),
        deploy_tx_hash: c.tx_hash.map(|h| h.to_vec()),
        deployed_block: c.block.and_then(|b| i64::try_from(b).ok()),
    }
}

/// The name of `DEFAULT_ADMIN_ROLE` on the PriceResolver, as messages say it.
const RESOLVER_ADMIN: &str = "the PriceResolver's DEFAULT_ADMIN_ROLE";
/// The name of `DEPLOYER_ROLE` on the AssetFactory, as messages say it.
const FACTORY_DEPLOYER: &str = "DEPLOYER_ROLE";

/// Grants each custody vault (`vaults`: name and address; issue 19) the platform roles
/// the asset workflows' writes need when a template sends from it, as the operator key
/// has them: `DEPLOYER_ROLE` on the AssetFactory (`createAsset`) and
/// `DEFAULT_ADMIN_ROLE` on the PriceResolver (`setStalenessBound`). Sent through
/// `provider` (whose signer must be the contracts' admin); a role already held is
/// skipped, so a second run sends nothing.
///
/// # Errors
/// [`BootstrapError::Missing`] without an AssetFactory or PriceResolver,
/// [`BootstrapError::Grant`] for a failed call, [`BootstrapError::GrantReverted`].
pub async fn grant_custody_roles(
    provider: &DynProvider,
    deployment: &PlatformDeployment,
    vaults: &[(String, Address)],
) -> Result<Vec<CustodyGrant>> {
    if vaults.is_empty() {
        return Ok(Vec::new());
    }
    let factory = deployment
        .address(names::ASSET_FACTORY)
        .ok_or(BootstrapError::Missing("AssetFactory"))?;
    let resolver = deployment
        .address(names::PRICE_RESOLVER)
        .ok_or(BootstrapError::Missing("PriceResolver"))?;
    let factory = AssetFactory::new(factory, provider);
    let resolver = PriceResolver::new(resolver, provider);
    let grant_error = |vault: &str, role: &'static str| {
        let vault = vault.to_owned();
        move |e: alloy::contract::Error| BootstrapError::Grant {
            vault,
            role,
            source: Box::new(e),
        }
    };
    let deployer_role = factory
        .DEPLOYER_ROLE()
        .call()
        .await
        .map_err(grant_error("*", FACTORY_DEPLOYER))?;
    let admin_role = B256::ZERO;
    let mut out = Vec::new();
    for (vault, who) in vaults {
        let who = *who;
        let mut granted = 0;
        if !factory
            .hasRole(deployer_role, who)
            .call()
            .await
            .map_err(grant_error(vault, FACTORY_DEPLOYER))?
        {
            let receipt = factory
                .grantRole(deployer_role, who)
                .send()
                .await
                .map_err(grant_error(vault, FACTORY_DEPLOYER))?
                .get_receipt()
                .await
                .map_err(|e| {
                    grant_error(vault, FACTORY_DEPLOYER)(
                        alloy::contract::Error::PendingTransactionError(e),
                    )
                })?;
            if !receipt.status() {
                return Err(BootstrapError::GrantReverted {
                    vault: vault.clone(),
                    role: FACTORY_DEPLOYER,
                });
            }
            granted += 1;
        }
        if !resolver
            .hasRole(admin_role, who)
            .call()
            .await
            .map_err(grant_error(vault, RESOLVER_ADMIN))?
        {
            let receipt = resolver
                .grantRole(admin_role, who)
                .send()
                .await
                .map_err(grant_error(vault, RESOLVER_ADMIN))?
                .get_receipt()
                .await
                .map_err(|e| {
                    grant_error(vault, RESOLVER_ADMIN)(
                        alloy::contract::Error::PendingTransactionError(e),
                    )
                })?;
            if !receipt.status() {
                return Err(BootstrapError::GrantReverted {
                    vault: vault.clone(),
                    role: RESOLVER_ADMIN,
                });
            }
            granted += 1;
        }
        out.push(CustodyGrant {
            vault: vault.clone(),
            address: who,
            granted,
        });
    }
    Ok(out)
}
