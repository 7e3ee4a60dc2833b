//! Test harness for the user-operation kill test (`tests/crash.rs`): a runner process
//! (durable executor with `aa.user-operation`, the bundler and, unless told otherwise, the
//! transaction queue) that the test SIGKILLs and starts again. Not part of Keel's binary.
//!
//! Environment: `KEEL_AA_DB` (URL of a migrated database), `KEEL_AA_RPC`,
//! `KEEL_AA_CHAIN_ID`, `KEEL_AA_DIRECTORY` (Keel's Directory), `KEEL_AA_KEY` (hex key of
//! the bundler's sender; a local test key), `KEEL_AA_CONFIRMATIONS` (default 1),
//! `KEEL_AA_FINALITY_DEPTH` (blocks below the head that are final, default 0: Anvil's
//! head),
//! `KEEL_AA_MODE`: `no-queue` (executor and bundler only: bundles are enqueued, never
//! sent) or `full`. Prints `ready` once running.

use keel_aa::bundler::{Bundler, BundlerConfig};
use keel_aa::flow::{self, AaChain, AaEnv};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_durable::{Engine, EngineConfig, ExecutorConfig};
use keel_txq::{Finality, LocalSigner, TxQueue, TxQueueConfig};
use keel_units::ChainId;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), String> {
    let db = keel_store::connect(&keel_store::StoreConfig::new(var("KEEL_AA_DB")?))
        .await
        .map_err(|e| e.to_string())?;
    let chain_id: u64 = var("KEEL_AA_CHAIN_ID")?
        .parse()
        .map_err(|_| "bad chain id")?;
    let directory = var("KEEL_AA_DIRECTORY")?
        .parse()
        .map_err(|_| "bad directory")?;
    let pool = Arc::new(
        UpstreamPool::new(
            ChainId(chain_id),
            UpstreamConfig::new(vec![var("KEEL_AA_RPC")?]),
        )
        .map_err(|e| e.to_string())?,
    );
    let confirmations = std::env::var("KEEL_AA_CONFIRMATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let finality_depth = std::env::var("KEEL_AA_FINALITY_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut queue = TxQueue::new(
        db.clone(),
        pool.clone(),
        TxQueueConfig {
            confirmations,
            poll_interval: Duration::from_millis(50),
            finality: Finality::Depth(finality_depth),
            ..TxQueueConfig::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let signer = LocalSigner::from_env("KEEL_AA_KEY").map_err(|e| e.to_string())?;
    let bundler = signer.address();
    queue.add_signer(Arc::new(signer));
    let queue = Arc::new(queue);
    let env = Arc::new(AaEnv {
        db: db.clone(),
        later_chains: Default::default(),
        chains: [(
            chain_id,
            AaChain {
                pool,
                queue: queue.clone(),
                directory,
                bundler,
                policy: None,
                organization_policies: Default::default(),
                beneficiary: None,
                sponsor: None,
                admission: Default::default(),
            },
        )]
        .into_iter()
        .collect(),
    });
    let engine = flow::register(
        Engine::new(db, EngineConfig::default()).map_err(|e| e.to_string())?,
        env.clone(),
    );
    let _executor = engine
        .spawn_executor(ExecutorConfig {
            poll_interval: Duration::from_millis(50),
            ..ExecutorConfig::default()
        })
        .map_err(|e| e.to_string())?;
    let cancel = CancellationToken::new();
    if var("KEEL_AA_MODE")? == "full" {
        let q = queue.clone();
        let c = cancel.clone();
        tokio::spawn(async move { q.run(c).await });
    }
    let service =
        Bundler::new(env, engine, chain_id, BundlerConfig::default()).map_err(|e| e.to_string())?;
    tokio::spawn(keel_service::run(
        service,
        keel_service::ServiceConfig::new(Duration::from_millis(50)),
        cancel,
    ));
    println!("ready");
    std::future::pending::<()>().await;
    Ok(())
}
