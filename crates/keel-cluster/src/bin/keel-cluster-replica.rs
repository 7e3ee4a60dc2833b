//! `keel-cluster-replica`: a harness that runs one runner replica of the shard-ownership
//! loop in its own process, for the real-process tests and for demonstrations.
//!
//! ```text
//! keel-cluster-replica <database-url> <shards> <refresh-ms> <liveness-ms>
//! ```
//!
//! Prints `replica <uuid>` once registered, then `owned <n>` whenever its owned set
//! changes. For every owned shard it records an interval in the table
//! `ownership_interval (replica uuid, shard int, started_at, ended_at)`, which the caller
//! must have created: started when the shard becomes owned, ended when its token fires.
//! Stops gracefully on SIGINT/SIGTERM.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use keel_cluster::{OwnerConfig, Role, ShardLease, ShardOwner};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, shards, refresh_ms, liveness_ms] = args.as_slice() else {
        return Err(
            "usage: keel-cluster-replica <database-url> <shards> <refresh-ms> <liveness-ms>".into(),
        );
    };
    let options = PgConnectOptions::from_str(url)?;
    let mut config = OwnerConfig::new(Role::Runner, shards.parse()?, "replica-harness");
    config.refresh_interval = Duration::from_millis(refresh_ms.parse()?);
    config.liveness_window = Duration::from_millis(liveness_ms.parse()?);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await?;
    let owner = ShardOwner::start(options, config).await?;
    let replica = owner.replica_id();
    println!("replica {replica}");

    let work_pool = pool.clone();
    let _work = owner.run_per_shard(move |lease| record(work_pool.clone(), replica, lease));
    let mut owned = owner.owned();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            changed = owned.changed() => {
                if changed.is_err() {
                    break;
                }
                let n = owned.borrow_and_update().len();
                println!("owned {n}");
            }
        }
    }
    owner.shutdown().await;
    Ok(())
}

async fn record(pool: PgPool, replica: Uuid, lease: ShardLease) {
    let Ok(shard) = i32::try_from(lease.shard()) else {
        return;
    };
    let id: Result<i64, _> = sqlx::query_scalar(
        "INSERT INTO ownership_interval (replica, shard) VALUES ($1, $2) RETURNING id",
    )
    .bind(replica)
    .bind(shard)
    .fetch_one(&pool)
    .await;
    lease.token().cancelled().await;
    if let Ok(id) = id {
        let _ =
            sqlx::query("UPDATE ownership_interval SET ended_at = clock_timestamp() WHERE id = $1")
                .bind(id)
                .execute(&pool)
                .await;
    }
}
