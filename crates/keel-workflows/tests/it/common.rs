//! Shared setup: a migrated database, two organizations (two keys in the first), a
//! template each, and the operations service over an engine without executors.

use alloy::primitives::Address;
use keel_durable::{Engine, EngineConfig};
use keel_store::testing::TestDatabase;
use keel_workflows::tenancy::{Template, create_api_key, create_organization, upsert_template};
use keel_workflows::{Caller, NewAsset, Ops};
use std::sync::Arc;
use uuid::Uuid;

pub(crate) const TEMPLATE: &str = "default";

pub(crate) struct Env {
    pub(crate) db: TestDatabase,
    pub(crate) ops: Ops,
    pub(crate) engine: Engine,
    /// Organization A, first key.
    pub(crate) caller: Caller,
    /// Organization A, second key.
    pub(crate) colleague: Caller,
    /// Organization B.
    pub(crate) stranger: Caller,
}

pub(crate) fn template(chain_id: u64) -> Template {
    Template {
        id: TEMPLATE.to_owned(),
        chain_id,
        price_decimals: 8,
        staleness_bound_seconds: 3600,
        mint_approval_threshold: Some("1000".to_owned()),
        approval_ttl_seconds: 600,
        funding_pause: false,
        funding_deadline_seconds: 3600,
        sender: None,
        forced_transfer_skips_compliance: false,
        batch_max_recipients: keel_workflows::tenancy::DEFAULT_BATCH_MAX_RECIPIENTS,
    }
}

impl Env {
    pub(crate) async fn new() -> Self {
        Self::on_chain(31337).await
    }

    /// The templates name chain `chain_id`.
    pub(crate) async fn on_chain(chain_id: u64) -> Self {
        let db = TestDatabase::create().await.unwrap();
        let pool = db.pool().clone();
        keel_store::migrate(&pool).await.unwrap();
        let org_a = create_organization(&pool, "org-a").await.unwrap();
        let org_b = create_organization(&pool, "org-b").await.unwrap();
        let a1 = create_api_key(&pool, org_a, "a1").await.unwrap();
        let a2 = create_api_key(&pool, org_a, "a2").await.unwrap();
        let b1 = create_api_key(&pool, org_b, "b1").await.unwrap();
        upsert_template(&pool, org_a, &template(chain_id))
            .await
            .unwrap();
        upsert_template(&pool, org_b, &template(chain_id))
            .await
            .unwrap();
        let engine = Engine::new(pool.clone(), EngineConfig::default()).unwrap();
        let ops = Ops::new(pool, engine.clone());
        let caller = |organization_id, api_key_id| Caller {
            organization_id,
            api_key_id,
        };
        Self {
            db,
            ops,
            engine,
            caller: caller(org_a, a1.id),
            colleague: caller(org_a, a2.id),
            stranger: caller(org_b, b1.id),
        }
    }

    pub(crate) fn pool(&self) -> &sqlx::PgPool {
        self.db.pool()
    }
}

pub(crate) fn new_asset(name: &str) -> NewAsset {
    NewAsset {
        name: name.to_owned(),
        symbol: "ALP".to_owned(),
        decimals: 6,
        template_id: TEMPLATE.to_owned(),
        initial_price: "1.25".to_owned(),
    }
}

/// A transaction-queue over `node` (an endpoint that need not answer for enqueues).
pub(crate) fn queue(env: &Env, chain_id: u64, node: &str) -> keel_txq::TxQueue {
    let pool = keel_chain::UpstreamPool::new(
        keel_units::ChainId(chain_id),
        keel_chain::UpstreamConfig::new(vec![node.to_owned()]),
    )
    .unwrap();
    keel_txq::TxQueue::new(
        env.pool().clone(),
        Arc::new(pool),
        keel_txq::TxQueueConfig::default(),
    )
    .unwrap()
}

/// A zero-value transfer from `sender`, keyed as write `write` of operation `op` (the
/// key shape the workflows use, so a cancel withdraws it).
pub(crate) fn op_request(sender: Address, op: Uuid, write: &str) -> keel_txq::TxRequest {
    keel_txq::TxRequest {
        sender,
        idempotency_key: format!("op/{op}/{write}"),
        to: Some(Address::repeat_byte(0x42)),
        value: keel_units::Wei::ZERO,
        data: alloy::primitives::Bytes::new(),
        gas_limit: Some(21_000),
        authorization_list: Vec::new(),
    }
}
