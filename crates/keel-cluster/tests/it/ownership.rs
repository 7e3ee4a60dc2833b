use crate::*;
use keel_cluster::{ClusterError, check_shard_count, recorded_shard_count};

#[tokio::test]
async fn shard_count_mismatch_refuses_to_start() {
    let db = TestDatabase::create().await.unwrap();
    let first = start(&db, 16).await;
    let err = ShardOwner::start(options(&db), config(32))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClusterError::ShardCountMismatch {
                configured: 32,
                recorded: 16
            }
        ),
        "{err:?}"
    );
    assert!(err.is_fatal());
    let mut conn = db.pool().acquire().await.unwrap();
    assert_eq!(recorded_shard_count(&mut conn).await.unwrap(), Some(16));
    check_shard_count(&mut conn, 16).await.unwrap();
    assert!(check_shard_count(&mut conn, 8).await.is_err());
    // The refused process registered nothing.
    let replicas: i64 = sqlx::query_scalar("SELECT count(*) FROM cluster_replica")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(replicas, 1);
    first.shutdown().await;
}

#[tokio::test]
async fn three_replicas_converge_to_one_owner_per_shard() {
    let db = TestDatabase::create().await.unwrap();
    let shards = 32;
    let t0 = Instant::now();
    let a = start(&db, shards).await;
    let b = start(&db, shards).await;
    let c = start(&db, shards).await;
    eventually(
        "three replicas partition the shards",
        Duration::from_secs(15),
        || async {
            converged(&[&a, &b, &c], shards)
                && locked_shards(db.pool()).await == (shards as i64, false)
        },
    )
    .await;
    let converged = t0.elapsed();
    for o in [&a, &b, &c] {
        assert!(!o.snapshot().is_empty(), "every replica owns a share");
    }
    println!("convergence of 3 replicas over {shards} shards: {converged:?}");

    // A graceful stop hands its shards to the two survivors.
    let t1 = Instant::now();
    c.shutdown().await;
    eventually(
        "two survivors partition the shards",
        Duration::from_secs(15),
        || async {
            partitioned(&[&a, &b], shards)
                && locked_shards(db.pool()).await == (shards as i64, false)
        },
    )
    .await;
    println!("takeover after graceful shutdown: {:?}", t1.elapsed());
    a.shutdown().await;
    b.shutdown().await;
    let (locked, _) = locked_shards(db.pool()).await;
    assert_eq!(locked, 0);
}

#[tokio::test]
async fn terminated_lock_connection_stops_work_and_rejoins() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    create_interval_log(pool).await;
    let shards = 24;
    let owners = [
        start(&db, shards).await,
        start(&db, shards).await,
        start(&db, shards).await,
    ];
    let _work: Vec<_> = owners.iter().map(|o| record_all(o, pool)).collect();
    let refs: Vec<&ShardOwner> = owners.iter().collect();
    eventually("convergence", Duration::from_secs(60), || async {
        converged(&refs, shards)
    })
    .await;
    let a = &owners[0];
    let owned_before = a.snapshot().shards();
    let pid = a.lock_backend_pid().unwrap();
    eventually("a's work is running", Duration::from_secs(5), || async {
        open_intervals(pool, a.replica_id()).await == owned_before.len() as i64
    })
    .await;

    let t0 = Instant::now();
    terminate(pool, pid).await;
    let stopped = eventually(
        "a's work stops (tokens fire)",
        Duration::from_secs(5),
        || async { open_intervals(pool, a.replica_id()).await == 0 },
    )
    .await;
    println!("work stopped {stopped:?} after the lock backend was terminated");
    eventually(
        "a rejoins on a new connection",
        Duration::from_secs(15),
        || async { a.lock_backend_pid().is_some_and(|p| p != pid) && converged(&refs, shards) },
    )
    .await;
    println!("reconverged {:?} after the kill", t0.elapsed());
    // Same live set, same assignment.
    assert_eq!(a.snapshot().shards(), owned_before);
    assert_eq!(overlaps(pool).await, 0);
    for o in owners {
        o.shutdown().await;
    }
    assert_eq!(overlaps(pool).await, 0);
}

/// A replica cut off from the database (its lock session terminated and its role unable
/// to log in) stops its work; after the liveness window the survivors take its shards;
/// when it can connect again it rejoins. No shard's work ever overlaps.
#[tokio::test]
async fn cut_off_replica_is_taken_over_without_overlap() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    create_interval_log(pool).await;
    let role = format!("keel_cluster_test_{}", Uuid::new_v4().simple());
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
    let shards = 24;
    let a = ShardOwner::start(options(&db).username(&role), config(shards))
        .await
        .unwrap();
    let b = start(&db, shards).await;
    let c = start(&db, shards).await;
    let _work: Vec<_> = [&a, &b, &c].iter().map(|o| record_all(o, pool)).collect();
    eventually("convergence", Duration::from_secs(60), || async {
        converged(&[&a, &b, &c], shards)
    })
    .await;
    let a_shards = a.snapshot().shards();
    assert!(!a_shards.is_empty());

    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER ROLE {role} NOLOGIN")))
        .execute(pool)
        .await
        .unwrap();
    let t0 = Instant::now();
    terminate(pool, a.lock_backend_pid().unwrap()).await;
    let takeover = eventually(
        "survivors own every shard",
        Duration::from_secs(20),
        || async { partitioned(&[&b, &c], shards) },
    )
    .await;
    println!("takeover of a cut-off replica's shards: {takeover:?} (liveness window 2 s)");
    assert!(a.snapshot().is_empty());
    assert_eq!(open_intervals(pool, a.replica_id()).await, 0);
    // Every interval of a ended before any survivor's interval on the same shard began.
    assert_eq!(overlaps(pool).await, 0);

    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER ROLE {role} LOGIN")))
        .execute(pool)
        .await
        .unwrap();
    let back = eventually(
        "a rejoins and gets its share back",
        Duration::from_secs(20),
        || async { a.snapshot().shards() == a_shards && partitioned(&[&a, &b, &c], shards) },
    )
    .await;
    println!(
        "rejoin after reconnect: {back:?}; elapsed since cut {:?}",
        t0.elapsed()
    );
    assert_eq!(a.snapshot().shards(), a_shards);
    for o in [a, b, c] {
        o.shutdown().await;
    }
    assert_eq!(overlaps(pool).await, 0);
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
}

/// A lock operation that hangs (the heartbeat blocked on a row lock) overruns its
/// deadline: the replica releases everything, terminates its hung session from a new
/// connection and rejoins when it can.
#[tokio::test]
async fn hung_lock_operation_releases_everything_and_rejoins() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    create_interval_log(pool).await;
    let shards = 24;
    let a = start(&db, shards).await;
    let b = start(&db, shards).await;
    let c = start(&db, shards).await;
    let _work: Vec<_> = [&a, &b, &c].iter().map(|o| record_all(o, pool)).collect();
    eventually("convergence", Duration::from_secs(60), || async {
        converged(&[&a, &b, &c], shards)
    })
    .await;
    let a_shards = a.snapshot().shards();
    let hung_pid = a.lock_backend_pid().unwrap();

    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM cluster_replica WHERE id = $1 FOR UPDATE")
        .bind(a.replica_id())
        .execute(&mut *blocker)
        .await
        .unwrap();
    let released = eventually("a releases everything", Duration::from_secs(5), || async {
        a.snapshot().is_empty() && open_intervals(pool, a.replica_id()).await == 0
    })
    .await;
    println!("a released its shards {released:?} after its heartbeat started hanging");
    eventually(
        "the hung session is gone",
        Duration::from_secs(5),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                .bind(hung_pid)
                .fetch_one(pool)
                .await
                .unwrap();
            n == 0
        },
    )
    .await;
    eventually("survivors take over", Duration::from_secs(20), || async {
        partitioned(&[&b, &c], shards)
    })
    .await;
    blocker.rollback().await.unwrap();
    eventually("a rejoins", Duration::from_secs(20), || async {
        a.snapshot().shards() == a_shards && partitioned(&[&a, &b, &c], shards)
    })
    .await;
    assert_eq!(a.snapshot().shards(), a_shards);
    for o in [a, b, c] {
        o.shutdown().await;
    }
    assert_eq!(overlaps(pool).await, 0);
}

/// Adding a replica moves to it only its share: no shard moves between the existing two.
#[tokio::test]
async fn adding_a_replica_moves_only_its_share() {
    let db = TestDatabase::create().await.unwrap();
    let shards = 48;
    let a = start(&db, shards).await;
    let b = start(&db, shards).await;
    eventually("two replicas converge", Duration::from_secs(15), || async {
        converged(&[&a, &b], shards)
    })
    .await;
    let (a0, b0) = (a.snapshot().shards(), b.snapshot().shards());
    let c = start(&db, shards).await;
    eventually(
        "three replicas converge",
        Duration::from_secs(15),
        || async { !c.snapshot().is_empty() && partitioned(&[&a, &b, &c], shards) },
    )
    .await;
    let (a1, b1, c1) = (
        a.snapshot().shards(),
        b.snapshot().shards(),
        c.snapshot().shards(),
    );
    assert!(
        a1.is_subset(&a0) && b1.is_subset(&b0),
        "a shard moved between old replicas"
    );
    assert!(!c1.is_empty());
    assert_eq!(a0.len() + b0.len(), a1.len() + b1.len() + c1.len());
    for o in [a, b, c] {
        o.shutdown().await;
    }
}

/// Shard groups are separate lock namespaces: a runner and an indexer each own every
/// shard of their own group at once.
#[tokio::test]
async fn shard_groups_do_not_compete() {
    let db = TestDatabase::create().await.unwrap();
    let shards = 8;
    let runner = start(&db, shards).await;
    let mut indexer_config = config(shards);
    indexer_config.role = Role::Indexer;
    let indexer = ShardOwner::start(options(&db), indexer_config)
        .await
        .unwrap();
    eventually("both own everything", Duration::from_secs(15), || async {
        partitioned(&[&runner], shards) && partitioned(&[&indexer], shards)
    })
    .await;
    let groups: Vec<String> =
        sqlx::query_scalar("SELECT shard_group FROM cluster_replica ORDER BY shard_group")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(groups, ["indexer", "workflow"]);
    runner.shutdown().await;
    indexer.shutdown().await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM cluster_replica")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "graceful shutdown deregisters");
}
