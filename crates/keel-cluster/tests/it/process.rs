use crate::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn spawn_replica(db: &TestDatabase, shards: u32) -> (Child, Uuid) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel-cluster-replica"))
        .args([db.url(), &shards.to_string(), "400", "2000"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let id = Uuid::parse_str(first.strip_prefix("replica ").unwrap()).unwrap();
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, id)
}

/// Shards with running work (open interval) per replica, and whether any shard has two.
async fn running_by(pool: &PgPool) -> (Vec<(Uuid, i64)>, bool) {
    let per: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT replica, count(*) FROM ownership_interval WHERE ended_at IS NULL \
         GROUP BY replica ORDER BY replica",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let doubled: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM ownership_interval WHERE ended_at IS NULL \
         GROUP BY shard HAVING count(*) > 1)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (per, doubled)
}

async fn all_running(pool: &PgPool, shards: u32, replicas: &[Uuid]) -> bool {
    let (per, doubled) = running_by(pool).await;
    assert!(!doubled, "a shard has two running owners");
    let total: i64 = per.iter().map(|(_, n)| n).sum();
    total == i64::from(shards)
        && per.len() == replicas.len()
        && per.iter().all(|(r, _)| replicas.contains(r))
        && locked_shards(pool).await == (i64::from(shards), false)
}

/// Three replica processes; SIGKILL one; its shards are owned and running again on the
/// survivors within a few seconds; no shard ever has two running owners.
#[tokio::test]
async fn kill_9_of_a_replica_process_is_taken_over() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    create_interval_log(pool).await;
    let shards = 32;
    let t0 = Instant::now();
    let (mut victim, victim_id) = spawn_replica(&db, shards).await;
    let (_b, b_id) = spawn_replica(&db, shards).await;
    let (_c, c_id) = spawn_replica(&db, shards).await;
    let all = [victim_id, b_id, c_id];
    eventually(
        "three processes run every shard once",
        Duration::from_secs(30),
        || all_running(pool, shards, &all),
    )
    .await;
    println!(
        "process convergence (3 replicas, {shards} shards): {:?}",
        t0.elapsed()
    );

    let killed = Instant::now();
    victim.start_kill().unwrap();
    victim.wait().await.unwrap();
    // The process is dead: its work ended no later than now.
    sqlx::query(
        "UPDATE ownership_interval SET ended_at = clock_timestamp() \
         WHERE replica = $1 AND ended_at IS NULL",
    )
    .bind(victim_id)
    .execute(pool)
    .await
    .unwrap();
    let unlocked = eventually(
        "the dead session's locks are free",
        Duration::from_secs(5),
        || async { locked_shards(pool).await.0 < i64::from(shards) },
    )
    .await;
    let survivors = [b_id, c_id];
    let takeover = eventually("survivors run every shard", Duration::from_secs(30), || {
        all_running(pool, shards, &survivors)
    })
    .await;
    let relocked = eventually(
        "every shard locked again",
        Duration::from_secs(5),
        || async { locked_shards(pool).await == (i64::from(shards), false) },
    )
    .await;
    println!(
        "kill -9 takeover: locks freed after {unlocked:?}; every shard running again after \
         {takeover:?} (liveness 2 s, refresh 400 ms, handoff 800 ms); locked {relocked:?} later"
    );
    assert!(killed.elapsed() < Duration::from_secs(10));
    assert_eq!(overlaps(pool).await, 0);
}
