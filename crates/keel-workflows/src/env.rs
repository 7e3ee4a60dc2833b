//! What the runner-side workflows act through ([`WorkflowEnv`]): the database, the
//! operator account, the attribution suffix and, per served chain, a [`ChainContext`]
//! (upstream pool, transaction queue, platform contract addresses).

use crate::platform::PlatformAddresses;
use alloy::primitives::Address;
use keel_chain::{AttributionSuffix, UpstreamPool};
use keel_txq::TxQueue;
use keel_units::ChainId;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A chain's signer pool (issue 35 §2): the senders whose keys this runner holds for
/// the chain, the operator first, then `chains.<name>.senders` in name order. Each
/// has its own nonce stream in the queue.
///
/// Assignment: independent work (a new asset without a custody vault) takes the next
/// sender round-robin ([`SenderPool::next`], journaled by the workflow that asks, so a
/// replay keeps the choice); an asset's later operations are sent by the sender that
/// created it (its issuer, which holds the asset's roles), so one asset's writes keep
/// their order on one nonce stream.
#[derive(Debug, Clone)]
pub struct SenderPool {
    senders: Arc<[Address]>,
    next: Arc<AtomicUsize>,
}

impl SenderPool {
    /// A pool of `senders` (duplicates removed, first occurrence kept).
    pub fn new(senders: Vec<Address>) -> Self {
        let mut seen = std::collections::HashSet::new();
        let senders: Vec<Address> = senders.into_iter().filter(|a| seen.insert(*a)).collect();
        Self {
            senders: senders.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The pool's senders, the operator first.
    pub fn senders(&self) -> &[Address] {
        &self.senders
    }

    /// The next sender round-robin (`None` for an empty pool).
    pub fn next(&self) -> Option<Address> {
        if self.senders.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        Some(self.senders[i])
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
    /// Its signer pool (the operator alone unless `chains.<name>.senders` adds more).
    pub senders: SenderPool,
}

/// Everything the workflows share.
#[derive(Debug, Clone)]
pub struct WorkflowEnv {
    /// The database (asset rows, operation links, the index).
    pub db: PgPool,
    /// The operator account: the sender of every transaction and the admin of every
    /// token and feed Keel deploys. Its signer is registered with each chain's queue.
    pub operator: Address,
    /// The ERC-8021 attribution suffix appended to every calldata.
    pub suffix: AttributionSuffix,
    /// The configured chains, by EIP-155 chain id.
    pub chains: HashMap<ChainId, ChainContext>,
    /// Configured chains that were not served when the environment was built (unreachable
    /// or not bootstrapped yet), by chain id: each is set once, by
    /// [`WorkflowEnv::serve_later`], when the process starts serving it.
    pub later_chains: HashMap<ChainId, OnceLock<ChainContext>>,
    /// How long one read-after-write wait on the index lasts before the step retries.
    pub index_wait: Duration,
}

impl WorkflowEnv {
    /// The chain `chain_id`, if served: one of [`WorkflowEnv::chains`], or one of
    /// [`WorkflowEnv::later_chains`] once set.
    pub fn chain(&self, chain_id: ChainId) -> Option<&ChainContext> {
        self.chains
            .get(&chain_id)
            .or_else(|| self.later_chains.get(&chain_id).and_then(OnceLock::get))
    }

    /// Whether `chain_id` is configured on this runner (served or not yet).
    pub fn is_configured(&self, chain_id: ChainId) -> bool {
        self.chains.contains_key(&chain_id) || self.later_chains.contains_key(&chain_id)
    }

    /// Starts serving `chain`, a chain of [`WorkflowEnv::later_chains`]. Returns false when
    /// it has no slot there or was already set (the first context stays).
    pub fn serve_later(&self, chain: ChainContext) -> bool {
        self.later_chains
            .get(&chain.chain_id)
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
                batch_pay: None,
                system_factory: None,
            },
            senders: SenderPool::new(vec![Address::ZERO]),
        }
    }

    /// Round-robin over the pool, duplicates removed; an empty pool has no sender.
    #[test]
    fn the_pool_hands_out_its_senders_in_turn() {
        let (a, b, c) = (
            Address::repeat_byte(1),
            Address::repeat_byte(2),
            Address::repeat_byte(3),
        );
        let pool = SenderPool::new(vec![a, b, a, c]);
        assert_eq!(pool.senders(), &[a, b, c]);
        let picks: Vec<_> = (0..7).filter_map(|_| pool.next()).collect();
        assert_eq!(picks, vec![a, b, c, a, b, c, a]);
        let shared = pool.clone();
        assert_eq!(shared.next(), Some(b), "clones share the turn");
        assert_eq!(SenderPool::new(Vec::new()).next(), None);
    }

    /// A chain with a later slot is not served until `serve_later` fills it, once; a
    /// chain without a slot cannot be added.
    #[tokio::test]
    async fn a_later_chain_is_served_once_set() {
        let db = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1:5432/unused")
            .unwrap();
        let env = WorkflowEnv {
            db: db.clone(),
            operator: Address::ZERO,
            suffix: AttributionSuffix::new(&["keel"]).unwrap(),
            chains: HashMap::new(),
            later_chains: [(ChainId(7), OnceLock::new())].into_iter().collect(),
            index_wait: Duration::from_secs(1),
        };
        assert!(env.chain(ChainId(7)).is_none());
        assert!(env.serve_later(context(&db, 7)));
        assert_eq!(env.chain(ChainId(7)).map(|c| c.chain_id), Some(ChainId(7)));
        assert!(!env.serve_later(context(&db, 7)), "set once");
        assert!(!env.serve_later(context(&db, 8)), "no slot");
        assert!(env.chain(ChainId(8)).is_none());
    }
}
