//! Shared setup: a chain with Keel deployed, a test database, an upstream pool.

use alloy::primitives::{Address, U256};
use anvil_tests::keel_abi::bindings::AssetToken;
use anvil_tests::{
    AssetWithFeed, Deployed, TestChain, confirm, deploy_asset_with_feed, deploy_keel,
    set_staleness_bound, submit_observation,
};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::read::{self, AssetRow, DirectoryEntryRow, ObservationRow, TransferRow};
use keel_index::{ScopeEntry, ScopeKind, TipConfig, TipIngest, scope};
use keel_store::testing::TestDatabase;
use keel_units::ChainId;
use std::sync::Arc;

pub(crate) struct Env {
    pub(crate) chain: TestChain,
    pub(crate) deployed: Deployed,
    pub(crate) db: TestDatabase,
    pub(crate) node: Arc<UpstreamPool>,
    pub(crate) chain_id: ChainId,
}

/// Starts Anvil, deploys Keel, creates a database whose scope holds the platform's
/// factories and directory from block 0.
pub(crate) async fn env() -> anyhow::Result<Env> {
    env_on(TestChain::start().await?).await
}

/// As [`env`], on a chain started by the caller (e.g. with `--slots-in-an-epoch`).
pub(crate) async fn env_on(chain: TestChain) -> anyhow::Result<Env> {
    let deployed = deploy_keel(&chain).await?;
    let db = TestDatabase::create().await?;
    let chain_id = ChainId(chain.chain_id());
    let node = Arc::new(UpstreamPool::new(
        chain_id,
        UpstreamConfig::new(vec![chain.endpoint().to_string()]),
    )?);
    add_platform_scope(&db, chain_id, &deployed).await?;
    Ok(Env {
        chain,
        deployed,
        db,
        node,
        chain_id,
    })
}

pub(crate) async fn add_platform_scope(
    db: &TestDatabase,
    chain: ChainId,
    deployed: &Deployed,
) -> anyhow::Result<()> {
    for (address, kind) in [
        (deployed.asset_factory, ScopeKind::AssetFactory),
        (deployed.price_feed_factory, ScopeKind::PriceFeedFactory),
        (deployed.directory, ScopeKind::Directory),
        (deployed.price_resolver, ScopeKind::PriceResolver),
    ] {
        scope::add_scope(
            db.pool(),
            chain,
            &ScopeEntry {
                address,
                kind,
                organization: None,
                from_block: 0,
            },
        )
        .await?;
    }
    Ok(())
}

pub(crate) fn config(finality: u64) -> TipConfig {
    TipConfig {
        start_block: Some(0),
        ..TipConfig::new(finality)
    }
}

impl Env {
    pub(crate) async fn owner(&self, config: TipConfig, id: &str) -> anyhow::Result<TipIngest> {
        Ok(
            TipIngest::take_ownership(self.db.pool().clone(), self.node.clone(), config, id)
                .await?,
        )
    }

    /// An asset token that can be minted: unpaused, bound installed, fresh observation.
    pub(crate) async fn mintable(&self, symbol: &str) -> anyhow::Result<AssetWithFeed> {
        let asset = deploy_asset_with_feed(&self.chain, &self.deployed, symbol).await?;
        let p = self.chain.provider();
        confirm(&AssetToken::new(asset.token, p.clone()).unpause()).await?;
        set_staleness_bound(p, self.deployed.price_resolver, asset.feed, 3_600).await?;
        submit_observation(p, asset.feed, 200_000_000_000).await?;
        Ok(asset)
    }

    pub(crate) async fn mint(
        &self,
        token: Address,
        to: Address,
        amount: u64,
    ) -> anyhow::Result<()> {
        let t = AssetToken::new(token, self.chain.provider().clone());
        confirm(&t.mint(to, U256::from(amount))).await?;
        Ok(())
    }

    /// Transfer from dev account 0.
    pub(crate) async fn transfer(
        &self,
        token: Address,
        to: Address,
        amount: u64,
    ) -> anyhow::Result<()> {
        let t = AssetToken::new(token, self.chain.provider().clone());
        confirm(&t.transfer(to, U256::from(amount))).await?;
        Ok(())
    }
}

/// Rounds until the indexed tip reaches the node's head.
pub(crate) async fn catch_up(ingest: &TipIngest) -> anyhow::Result<u64> {
    let mut reorgs = 0;
    for _ in 0..50 {
        let out = ingest.round().await?;
        reorgs += out.reorgs;
        if out.tip == Some(out.head) {
            return Ok(reorgs);
        }
    }
    anyhow::bail!("ingest did not catch up")
}

/// Every projected row of a chain, for comparing two indexes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub(crate) transfers: Vec<TransferRow>,
    pub(crate) assets: Vec<AssetRow>,
    pub(crate) observations: Vec<ObservationRow>,
    pub(crate) directory: Vec<DirectoryEntryRow>,
    pub(crate) logs: i64,
    /// (table, block hash, log index) of every pause and staleness-bound row.
    pub(crate) other: Vec<(String, Vec<u8>, i64)>,
    /// (token, holder, balance) of every kept balance that is not zero.
    pub(crate) balances: Vec<(Vec<u8>, Vec<u8>, String)>,
    /// (token, block, holder, delta) of the balance history (migration 0088), rows that
    /// net to zero left out (they sum as nothing).
    pub(crate) changes: Vec<(Vec<u8>, i64, Vec<u8>, String)>,
}

pub(crate) async fn fingerprint(
    db: &TestDatabase,
    chain: ChainId,
    deployed: &Deployed,
) -> anyhow::Result<Fingerprint> {
    let pool = db.pool();
    let assets = read::assets(pool, chain).await?;
    let mut observations = Vec::new();
    let feeds: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT DISTINCT feed FROM index_observation WHERE chain_id = $1 ORDER BY feed",
    )
    .bind(chain.get() as i64)
    .fetch_all(pool)
    .await?;
    for f in feeds {
        observations.extend(read::observations(pool, chain, Address::from_slice(&f)).await?);
    }
    let logs: i64 = sqlx::query_scalar("SELECT count(*) FROM index_log WHERE chain_id = $1")
        .bind(chain.get() as i64)
        .fetch_one(pool)
        .await?;
    let other: Vec<(String, Vec<u8>, i64)> = sqlx::query_as(
        "SELECT 'pause', block_hash, log_index FROM index_token_pause WHERE chain_id = $1
         UNION ALL
         SELECT 'bound', block_hash, log_index FROM index_staleness_bound WHERE chain_id = $1
         UNION ALL
         SELECT 'freeze', block_hash, log_index FROM index_freeze_event WHERE chain_id = $1
         ORDER BY 1, 2, 3",
    )
    .bind(chain.get() as i64)
    .fetch_all(pool)
    .await?;
    let balances = sqlx::query_as(
        "SELECT token, holder, balance::text FROM index_holder_balance
          WHERE chain_id = $1 AND balance <> 0 ORDER BY token, holder",
    )
    .bind(chain.get() as i64)
    .fetch_all(pool)
    .await?;
    let changes = sqlx::query_as(
        "SELECT token, block_number, holder, delta::text FROM index_holder_change
          WHERE chain_id = $1 AND delta <> 0 ORDER BY token, block_number, holder",
    )
    .bind(chain.get() as i64)
    .fetch_all(pool)
    .await?;
    Ok(Fingerprint {
        balances,
        changes,
        other,
        transfers: read::transfers(pool, chain, None).await?,
        assets,
        observations,
        directory: read::directory_entries(pool, chain, deployed.directory, true).await?,
        logs,
    })
}

/// A fresh database indexing the same chain from block 0: the reference a reorged
/// index must equal.
pub(crate) async fn reindex(env: &Env) -> anyhow::Result<Fingerprint> {
    let db = TestDatabase::create().await?;
    add_platform_scope(&db, env.chain_id, &env.deployed).await?;
    let ingest =
        TipIngest::take_ownership(db.pool().clone(), env.node.clone(), config(64), "reference")
            .await?;
    catch_up(&ingest).await?;
    fingerprint(&db, env.chain_id, &env.deployed).await
}
