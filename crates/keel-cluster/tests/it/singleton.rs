use crate::*;
use keel_cluster::shard_of;

/// A singleton keeps running on exactly one replica through repeated kills of its
/// owner's lock session and a graceful stop of its owner; its "I am running" intervals
/// never overlap.
#[tokio::test]
async fn singleton_intervals_never_overlap_during_repeated_kills() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    create_interval_log(pool).await;
    let shards = 16;
    let name = "tip-ingest/1";
    let mut owners = vec![
        start(&db, shards).await,
        start(&db, shards).await,
        start(&db, shards).await,
    ];
    let mut supervisors = Vec::new();
    let run = |o: &ShardOwner| {
        let pool = pool.clone();
        let replica = o.replica_id();
        o.singleton(name, move |lease| {
            record_interval(pool.clone(), replica, lease)
        })
    };
    for o in &owners {
        supervisors.push(run(o));
    }
    let running = || async {
        sqlx::query_scalar::<_, Uuid>(
            "SELECT replica FROM ownership_interval WHERE ended_at IS NULL",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    };
    let mut runs = 0;
    let shard = shard_of(name.as_bytes(), shards);
    for round in 0..6 {
        // The running holder owns the singleton's shard — unless the shard is being
        // handed over at this moment (a restarted replica took its rendezvous shard
        // back: the holder's snapshot already lost it and its interval closes as the
        // lease is cancelled). Then wait for that interval to end and look again; the
        // next holder's interval is one more run.
        let (holder, idx) = loop {
            eventually(
                "the singleton runs somewhere",
                Duration::from_secs(20),
                || async { running().await.len() == 1 },
            )
            .await;
            runs += 1;
            let holder = running().await[0];
            let idx = owners
                .iter()
                .position(|o| o.replica_id() == holder)
                .unwrap();
            if owners[idx].snapshot().contains(shard) {
                break (holder, idx);
            }
            eventually(
                "a holder that released the shard stops",
                Duration::from_secs(5),
                || async { !running().await.contains(&holder) },
            )
            .await;
        };
        let t0 = Instant::now();
        if round == 3 {
            // Graceful stop of the holder and a fresh replica: the singleton moves.
            let o = owners.remove(idx);
            o.shutdown().await;
            let fresh = start(&db, shards).await;
            supervisors.push(run(&fresh));
            owners.push(fresh);
        } else {
            kill_lock_session(pool, &owners[idx]).await;
        }
        eventually("the holder stops", Duration::from_secs(5), || async {
            !running().await.contains(&holder)
        })
        .await;
        println!(
            "round {round}: singleton stopped on its holder after {:?}",
            t0.elapsed()
        );
    }
    eventually(
        "the singleton runs again",
        Duration::from_secs(20),
        || async { running().await.len() == 1 },
    )
    .await;
    runs += 1;
    let intervals: i64 = sqlx::query_scalar("SELECT count(*) FROM ownership_interval")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(intervals, runs);
    assert_eq!(overlaps(pool).await, 0);
    for o in owners {
        o.shutdown().await;
    }
    assert_eq!(overlaps(pool).await, 0);
}
