//! Keel's platform contracts on a chain, as the workflows call them (recorded by
//! `keel chain bootstrap` in `platform_contract`). "Platform" names only these
//! contracts here; the integrators' HTTP API is the Platform API (`keel-api`).

use alloy::primitives::Address;
use sqlx::PgPool;

/// The platform contracts the workflows call on one chain (recorded by
/// `keel chain bootstrap` in `platform_contract`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlatformAddresses {
    /// `AssetFactory` (deploys asset tokens with CREATE2).
    pub asset_factory: Address,
    /// `PriceFeedFactory` (deploys price feeds).
    pub price_feed_factory: Address,
    /// `PriceResolver` (staleness bounds, consulted on mint).
    pub price_resolver: Address,
    /// `BatchPay` (distributions' batches); `None` on a chain bootstrapped before it
    /// existed (a distribution there fails `BATCH_PAY_MISSING` until the chain is
    /// bootstrapped again).
    pub batch_pay: Option<Address>,
    /// `SystemFactory` (organization systems, issue 37); `None` on a chain bootstrapped
    /// before it existed (a system deployment there fails `SYSTEM_FACTORY_MISSING`).
    pub system_factory: Option<Address>,
}

/// Why [`PlatformAddresses::load`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlatformError {
    /// A contract is not recorded for the chain: the chain was not bootstrapped.
    #[error(
        "platform contract `{name}` is not recorded for chain {chain_id}; run `keel chain bootstrap`"
    )]
    Missing {
        /// The contract's name in `platform_contract`.
        name: &'static str,
        /// The chain.
        chain_id: u64,
    },
    /// The database failed.
    #[error("database: {0}")]
    Store(#[from] keel_store::StoreError),
}

impl PlatformAddresses {
    /// Loads the addresses of `chain_id` from `platform_contract`.
    ///
    /// # Errors
    /// [`PlatformError::Missing`] when the chain was not bootstrapped;
    /// [`PlatformError::Store`].
    pub async fn load(db: &PgPool, chain_id: u64) -> Result<Self, PlatformError> {
        let id = i64::try_from(chain_id).map_err(|_| PlatformError::Missing {
            name: "assetFactory",
            chain_id,
        })?;
        let rows = keel_store::platform::platform_contract_list(db, id).await?;
        let find = |name: &'static str| {
            rows.iter()
                .find(|r| r.name == name)
                .and_then(|r| Address::try_from(r.address.as_slice()).ok())
                .ok_or(PlatformError::Missing { name, chain_id })
        };
        Ok(Self {
            asset_factory: find(keel_abi::platform::names::ASSET_FACTORY)?,
            price_feed_factory: find(keel_abi::platform::names::PRICE_FEED_FACTORY)?,
            price_resolver: find(keel_abi::platform::names::PRICE_RESOLVER)?,
            batch_pay: find(keel_abi::platform::names::BATCH_PAY).ok(),
            system_factory: find(keel_abi::platform::names::SYSTEM_FACTORY).ok(),
        })
    }
}
