//! Test harness for the queue's process-kill test (`tests/crash.rs`): a queue process the
//! test SIGKILLs at dangerous points and starts again. Not part of Keel's binary.
//!
//! Environment: `KEEL_TXQ_DB` (URL of a migrated database), `KEEL_TXQ_RPC` (the chain's
//! JSON-RPC URL), `KEEL_TXQ_CHAIN_ID`, `KEEL_TXQ_KEY` (hex key of the sender; a local
//! test key), `KEEL_TXQ_CONFIRMATIONS` (default 1), `KEEL_TXQ_FINALITY_DEPTH` (default
//! 0: the head is final, a local chain), `KEEL_TXQ_MODE`:
//! - `sign-only`: signs and persists every queued request, prints `signed`, then waits
//!   to be killed (the crash between persist and broadcast);
//! - `pass-once`: one sender pass (sign, broadcast what is `signed`; a request whose
//!   nonce another transaction took for good is re-signed and persisted, its new
//!   attempt left for the next pass), prints `passed`, then waits to be killed (the
//!   crash between persisting a re-signed attempt and its broadcast);
//! - `run`: runs queue passes until killed, printing `tick` after each.

use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_txq::{Finality, LocalSigner, TxQueue, TxQueueConfig};
use keel_units::ChainId;
use std::sync::Arc;

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let db = keel_store::connect(&keel_store::StoreConfig::new(var("KEEL_TXQ_DB")?))
        .await
        .map_err(|e| e.to_string())?;
    let chain_id: u64 = var("KEEL_TXQ_CHAIN_ID")?
        .parse()
        .map_err(|_| "bad chain id")?;
    let pool = UpstreamPool::new(
        ChainId(chain_id),
        UpstreamConfig::new(vec![var("KEEL_TXQ_RPC")?]),
    )
    .map_err(|e| e.to_string())?;
    let confirmations = std::env::var("KEEL_TXQ_CONFIRMATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let finality_depth = std::env::var("KEEL_TXQ_FINALITY_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let config = TxQueueConfig {
        confirmations,
        finality: Finality::Depth(finality_depth),
        ..TxQueueConfig::default()
    };
    let mut queue = TxQueue::new(db, Arc::new(pool), config).map_err(|e| e.to_string())?;
    let signer = LocalSigner::from_env("KEEL_TXQ_KEY").map_err(|e| e.to_string())?;
    let sender = signer.address();
    queue.add_signer(Arc::new(signer));
    match var("KEEL_TXQ_MODE")?.as_str() {
        "sign-only" => {
            let n = queue
                .sign_pending(sender)
                .await
                .map_err(|e| e.to_string())?;
            println!("signed {n}");
            std::future::pending::<()>().await;
        }
        "pass-once" => {
            let n = queue.sender_pass(sender).await.map_err(|e| e.to_string())?;
            println!("passed {n}");
            std::future::pending::<()>().await;
        }
        _ => loop {
            if let Err(e) = queue.tick().await {
                eprintln!("tick failed: {e}");
            }
            println!("tick");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        },
    }
    Ok(())
}
