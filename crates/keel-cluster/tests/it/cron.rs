use crate::*;
use keel_cluster::{CronCycle, CronJob, CronOutcome, Schedule, cron_status};
use std::time::UNIX_EPOCH;

fn tick_job(owner: &ShardOwner, pool: &PgPool) -> tokio::task::JoinHandle<()> {
    let job = CronJob::new("test/tick", Schedule::every(Duration::from_millis(250)));
    let replica = owner.replica_id();
    let log = pool.clone();
    owner
        .cron(pool.clone(), job, move |cycle: CronCycle| {
            let log = log.clone();
            async move {
                let at = cycle.scheduled_at.duration_since(UNIX_EPOCH).unwrap();
                sqlx::query(
                    "INSERT INTO cron_run (scheduled_at, replica) \
                     VALUES (timestamptz 'epoch' + $1 * interval '1 microsecond', $2)",
                )
                .bind(at.as_micros() as i64)
                .bind(replica)
                .execute(&log)
                .await
                .map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(30)).await;
                Ok::<(), String>(())
            }
        })
        .unwrap()
}

/// Across repeated ownership handoffs (lock sessions killed, the holder stopped and a
/// fresh replica started), every cycle key between the first and the last runs exactly
/// once: none twice, none skipped (missed cycles are caught up).
#[tokio::test]
async fn cron_cycles_run_exactly_once_across_handoffs() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    sqlx::query("CREATE TABLE cron_run (scheduled_at TIMESTAMPTZ NOT NULL, replica UUID NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    let shards = 16;
    let mut owners = vec![
        start(&db, shards).await,
        start(&db, shards).await,
        start(&db, shards).await,
    ];
    let mut jobs: Vec<_> = owners.iter().map(|o| tick_job(o, pool)).collect();
    let holder = || async {
        sqlx::query_scalar::<_, Uuid>(
            "SELECT replica_id FROM cron_cycle ORDER BY scheduled_at DESC LIMIT 1",
        )
        .fetch_optional(pool)
        .await
        .unwrap()
    };
    for round in 0..5 {
        let before: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_cycle")
            .fetch_one(pool)
            .await
            .unwrap();
        eventually("cycles run", Duration::from_secs(20), || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_cycle")
                .fetch_one(pool)
                .await
                .unwrap();
            n >= before + 3
        })
        .await;
        let h = holder().await.unwrap();
        let idx = owners.iter().position(|o| o.replica_id() == h).unwrap();
        if round == 2 {
            let o = owners.remove(idx);
            o.shutdown().await;
            let fresh = start(&db, shards).await;
            jobs.push(tick_job(&fresh, pool));
            owners.push(fresh);
        } else {
            kill_lock_session(pool, &owners[idx]).await;
        }
    }
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_cycle")
        .fetch_one(pool)
        .await
        .unwrap();
    eventually(
        "cycles run after the last handoff",
        Duration::from_secs(20),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_cycle")
                .fetch_one(pool)
                .await
                .unwrap();
            n >= before + 3
        },
    )
    .await;
    for o in owners {
        o.shutdown().await;
    }
    for j in jobs {
        j.abort();
    }

    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT scheduled_at FROM cron_run GROUP BY scheduled_at \
         HAVING count(*) > 1) t",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(twice, 0, "a cycle ran twice");
    let (runs, span_cycles, owners_seen): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), \
                (extract(epoch FROM max(scheduled_at) - min(scheduled_at)) * 4)::int8 + 1, \
                count(DISTINCT replica) \
         FROM cron_run",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    println!("cron: {runs} cycles over {span_cycles} slots, run by {owners_seen} replicas");
    assert_eq!(
        runs, span_cycles,
        "a cycle between the first and the last was skipped"
    );
    assert!(owners_seen >= 2, "ownership never moved");
    let unmatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cron_cycle c FULL JOIN cron_run r USING (scheduled_at) \
         WHERE c.name IS NULL OR r.replica IS NULL OR c.replica_id <> r.replica",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(unmatched, 0, "recorded cycles and runs differ");
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cron_cycle WHERE outcome = 'failed'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(failed, 0);
    let status = cron_status(pool, "test/tick").await.unwrap();
    assert_eq!(status.cycles, runs);
    assert!(status.last_success_at.is_some());
    assert!(matches!(
        status.last_outcome,
        Some(CronOutcome::Succeeded) | None
    ));
    assert!(status.last_duration.unwrap() >= Duration::from_millis(30));
}
