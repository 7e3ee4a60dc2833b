//! What the runner-side workflows need to act on chains: per chain an upstream pool,
//! the transaction queue (for enqueue) and Keel's platform contract addresses.

use alloy::primitives::Address;
use keel_chain::{AttributionSuffix, UpstreamPool};
use keel_txq::TxQueue;
use keel_units::ChainId;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
        })
    }
}

/// One chain as the workflows see it.
#[derive(Debug, Clone)]
pub struct ChainContext {
    /// The chain.
    pub chain_id: ChainId,
    /// Its RPC upstreams (receipts and logs are read through it).
    pub node: Arc<UpstreamPool>,
    /// Its transaction queue; workflows only enqueue and read, the runner's queue loop
    /// signs, broadcasts and confirms.
    pub queue: Arc<TxQueue>,
    /// Keel's platform contracts on it.
    pub contracts: PlatformAddresses,
}

/// Everything the workflows share.
#[derive(Debug, Clone)]
pub struct Platform {
    /// The database (asset rows, operation links, the index).
    pub db: PgPool,
    /// The operator account: the sender of every transaction and the admin of every
    /// token and feed Keel deploys. Its signer is registered with each chain's queue.
    pub operator: Address,
    /// The ERC-8021 attribution suffix appended to every calldata.
    pub suffix: AttributionSuffix,
    /// The configured chains, by EIP-155 chain id.
    pub chains: HashMap<u64, ChainContext>,
    /// Configured chains that were not served when the platform was built (unreachable
    /// or not bootstrapped yet), by chain id: each is set once, by
    /// [`Platform::serve_later`], when the process starts serving it.
    pub later_chains: HashMap<u64, OnceLock<ChainContext>>,
    /// How long one read-after-write wait on the index lasts before the step retries.
    pub index_wait: Duration,
}

impl Platform {
    /// The chain `chain_id`, if served: one of [`Platform::chains`], or one of
    /// [`Platform::later_chains`] once set.
    pub fn chain(&self, chain_id: u64) -> Option<&ChainContext> {
        self.chains
            .get(&chain_id)
            .or_else(|| self.later_chains.get(&chain_id).and_then(OnceLock::get))
    }

    /// Starts serving `chain`, a chain of [`Platform::later_chains`]. Returns false when
    /// it has no slot there or was already set (the first context stays).
    pub fn serve_later(&self, chain: ChainContext) -> bool {
        self.later_chains
            .get(&chain.chain_id.get())
            .is_some_and(|slot| slot.set(chain).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(db: &PgPool, chain_id: u64) -> ChainContext {
        let node = Arc::new(
            UpstreamPool::new(
                ChainId(chain_id),
                keel_chain::UpstreamConfig::new(vec!["http://127.0.0.1:1".to_owned()]),
            )
            .unwrap(),
        );
        let queue =
            TxQueue::new(db.clone(), node.clone(), keel_txq::TxQueueConfig::default()).unwrap();
        ChainContext {
            chain_id: ChainId(chain_id),
            node,
            queue: Arc::new(queue),
            contracts: PlatformAddresses {
                asset_factory: Address::ZERO,
                price_feed_factory: Address::ZERO,
                price_resolver: Address::ZERO,
            },
        }
    }

    /// A chain with a later slot is not served until `serve_later` fills it, once; a
    /// chain without a slot cannot be added.
    #[tokio::test]
    async fn a_later_chain_is_served_once_set() {
        let db = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1:5432/unused")
            .unwrap();
        let platform = Platform {
            db: db.clone(),
            operator: Address::ZERO,
            suffix: AttributionSuffix::new(&["keel"]).unwrap(),
            chains: HashMap::new(),
            later_chains: [(7, OnceLock::new())].into_iter().collect(),
            index_wait: Duration::from_secs(1),
        };
        assert!(platform.chain(7).is_none());
        assert!(platform.serve_later(context(&db, 7)));
        assert_eq!(platform.chain(7).map(|c| c.chain_id), Some(ChainId(7)));
        assert!(!platform.serve_later(context(&db, 7)), "set once");
        assert!(!platform.serve_later(context(&db, 8)), "no slot");
        assert!(platform.chain(8).is_none());
    }
}
