//! Integration tests of keel-cluster against a real PostgreSQL (one fresh database per
//! test, `DATABASE_URL` or the local default).

mod cron;
mod health;
mod ownership;
mod process;
mod singleton;
mod singleton_while;

use keel_cluster::{OwnerConfig, Role, ShardLease, ShardOwner, group_key};
use keel_store::testing::TestDatabase;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Test timings: refresh 400 ms, liveness 2 s (lock deadline 200 ms, handoff 800 ms).
pub fn config(shards: u32) -> OwnerConfig {
    let mut c = OwnerConfig::new(Role::Runner, shards, "test-host");
    c.refresh_interval = Duration::from_millis(400);
    c.liveness_window = Duration::from_secs(2);
    c
}

/// Connect options of the test database.
pub fn options(db: &TestDatabase) -> PgConnectOptions {
    PgConnectOptions::from_str(db.url()).unwrap()
}

/// Starts a runner replica with the test timings.
pub async fn start(db: &TestDatabase, shards: u32) -> ShardOwner {
    ShardOwner::start(options(db), config(shards))
        .await
        .unwrap()
}

/// [`keel_store::testing::until`] `check` holds, within `bound`; returns the time taken.
pub async fn eventually<F, Fut>(what: &str, bound: Duration, check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    keel_store::testing::until(what, bound, check).await;
    t0.elapsed()
}

/// True when the owners' published shards partition `0..shards` exactly.
pub fn partitioned(owners: &[&ShardOwner], shards: u32) -> bool {
    let mut union = BTreeSet::new();
    let mut total = 0;
    for o in owners {
        let s = o.snapshot().shards();
        total += s.len();
        union.extend(s);
    }
    total == shards as usize && union == (0..shards).collect()
}

/// [`partitioned`], and every owner has a share (all of them have joined).
pub fn converged(owners: &[&ShardOwner], shards: u32) -> bool {
    owners.iter().all(|o| !o.snapshot().is_empty()) && partitioned(owners, shards)
}

/// Number of shards of the runner group with exactly one advisory-lock holder, and
/// whether any shard has more than one (server's view).
pub async fn locked_shards(pool: &PgPool) -> (i64, bool) {
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT objid::int8, count(*) FROM pg_locks \
         WHERE locktype = 'advisory' AND classid = $1::int8::oid AND objsubid = 2 AND granted \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         GROUP BY objid",
    )
    .bind(i64::from(group_key(Role::Runner.shard_group())))
    .fetch_all(pool)
    .await
    .unwrap();
    let single = rows.iter().filter(|(_, n)| *n == 1).count() as i64;
    (single, rows.iter().any(|(_, n)| *n > 1))
}

/// Creates the interval log the test work writes to.
pub async fn create_interval_log(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE ownership_interval (
            id         BIGSERIAL   PRIMARY KEY,
            replica    UUID        NOT NULL,
            shard      INTEGER     NOT NULL,
            started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            ended_at   TIMESTAMPTZ
        )",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Work for a lease: records an interval from start until the lease's token fires.
pub async fn record_interval(pool: PgPool, replica: Uuid, lease: ShardLease) {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO ownership_interval (replica, shard) VALUES ($1, $2) RETURNING id",
    )
    .bind(replica)
    .bind(lease.shard() as i32)
    .fetch_one(&pool)
    .await
    .unwrap();
    lease.token().cancelled().await;
    sqlx::query("UPDATE ownership_interval SET ended_at = clock_timestamp() WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
}

/// Starts per-shard interval recording on `owner`.
pub fn record_all(owner: &ShardOwner, pool: &PgPool) -> tokio::task::JoinHandle<()> {
    let pool = pool.clone();
    let replica = owner.replica_id();
    owner.run_per_shard(move |lease| record_interval(pool.clone(), replica, lease))
}

/// Pairs of intervals of one shard, by different or same replicas, that overlap
/// (open intervals extend to infinity).
pub async fn overlaps(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM ownership_interval a JOIN ownership_interval b \
           ON a.shard = b.shard AND a.id < b.id \
          AND tstzrange(a.started_at, a.ended_at) && tstzrange(b.started_at, b.ended_at)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Open intervals of `replica`.
pub async fn open_intervals(pool: &PgPool, replica: Uuid) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM ownership_interval WHERE replica = $1 AND ended_at IS NULL",
    )
    .bind(replica)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Terminates a backend from the admin pool.
pub async fn terminate(pool: &PgPool, pid: i32) {
    let ok: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(ok, "backend {pid} not terminated");
}

/// Terminates `owner`'s current lock session, waiting (bounded) until it has a live one
/// (after a previous kill the owner notices only at its next refresh).
pub async fn kill_lock_session(pool: &PgPool, owner: &ShardOwner) {
    eventually(
        "a live lock session to kill",
        Duration::from_secs(10),
        || async {
            match owner.lock_backend_pid() {
                Some(pid) => sqlx::query_scalar::<_, bool>("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .fetch_one(pool)
                    .await
                    .unwrap(),
                None => false,
            }
        },
    )
    .await;
}
