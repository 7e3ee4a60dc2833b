//! Retention of the durable tables (keel-durable `Retention`, run daily by the runner's
//! cron) against a real PostgreSQL: only eligible rows go, in bounded batches, while
//! concurrent work on the same tables goes on; locked rows are skipped, reported as
//! remaining and deleted by a later pass.

use keel_durable::{Retention, RetentionConfig};
use keel_store::testing::TestDatabase;
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Inserts an instance in `status`, ended (if terminal) and created `age_days` ago, with
/// two journal rows and one signal; returns its id.
async fn instance(pool: &PgPool, status: &str, age_days: i32) -> Uuid {
    let id = Uuid::new_v4();
    let ended = matches!(status, "completed" | "cancelled" | "failed");
    sqlx::query(
        "INSERT INTO durable_instance (id, workflow, idempotency_key, input, status, output,
                                       error_code, created_at, updated_at, ended_at)
         VALUES ($1, 'test', $1::text, '{}', $2,
                 CASE WHEN $2 = 'completed' THEN '{}'::jsonb END,
                 CASE WHEN $2 = 'failed' THEN 'E' END,
                 now() - make_interval(days => $3), now() - make_interval(days => $3),
                 CASE WHEN $4 THEN now() - make_interval(days => $3) END)",
    )
    .bind(id)
    .bind(status)
    .bind(age_days)
    .bind(ended)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO durable_journal (instance_id, seq, kind, name, result)
         VALUES ($1, 0, 'step', 's', '{\"ok\": 1}'), ($1, 1, 'step', 's', '{\"ok\": 2}')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, consumed_seq)
         VALUES ($1, 'go', '{}', 'k', 1)",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// Inserts a command of `instance` in `state`, settled (if done/dead) `age_days` ago.
async fn command(pool: &PgPool, instance: Uuid, state: &str, age_days: i32) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO durable_command (instance_id, kind, state, max_attempts, attempt, outcome,
                                      available_at, created_at, completed_at)
         VALUES ($1, 'timer', $2, 5, 1, CASE WHEN $2 IN ('done', 'dead') THEN 'completed' END,
                 now() - make_interval(days => $3), now() - make_interval(days => $3),
                 CASE WHEN $2 IN ('done', 'dead') THEN now() - make_interval(days => $3) END)
         RETURNING id",
    )
    .bind(instance)
    .bind(state)
    .bind(age_days)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn count_for(pool: &PgPool, table: &str, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE instance_id = ANY($1)"
    )))
    .bind(ids)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn config(batch_size: u32, max_batches_per_pass: u32) -> RetentionConfig {
    RetentionConfig {
        batch_size,
        max_batches_per_pass,
        lock_timeout: Duration::from_millis(200),
        ..RetentionConfig::default()
    }
}

/// Work a live runner does on the same tables: start an instance, record, claim and
/// settle its command, journal a step, end the instance. Returns (cycles, slowest
/// statement).
async fn live_work(
    pool: PgPool,
    waiting: Vec<Uuid>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> (u64, Duration) {
    let mut cycles = 0u64;
    let mut slowest = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO durable_instance (id, workflow, idempotency_key, input)
             VALUES ($1, 'live', $1::text, '{}')",
        )
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
        let cmd: i64 = sqlx::query_scalar(
            "INSERT INTO durable_command (instance_id, kind, max_attempts)
             VALUES ($1, 'start', 5) RETURNING id",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(
            "UPDATE durable_command SET state = 'running', attempt = attempt + 1
              WHERE id = (SELECT id FROM durable_command WHERE id = $1 AND state = 'queued'
                           FOR UPDATE SKIP LOCKED)",
        )
        .bind(cmd)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO durable_journal (instance_id, seq, kind, name, result)
             VALUES ($1, 0, 'step', 'x', '{\"ok\": 0}')",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE durable_instance SET status = 'completed', output = '{}', ended_at = now(),
                    updated_at = now() WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE durable_command SET state = 'done', outcome = 'completed',
                    completed_at = now() WHERE id = $1",
        )
        .bind(cmd)
        .execute(&mut *tx)
        .await
        .unwrap();
        // Touch an old, live (waiting) instance too: its row is on retention's path.
        let w = waiting[(cycles as usize) % waiting.len()];
        sqlx::query("UPDATE durable_instance SET updated_at = now() WHERE id = $1")
            .bind(w)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        slowest = slowest.max(t.elapsed());
        cycles += 1;
        done.store(cycles, Ordering::Relaxed);
    }
    (cycles, slowest)
}

/// Waits (at most 30 s) until the concurrent work has completed `n` cycles.
async fn until_cycles(done: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "the concurrent work is stuck");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn retention_deletes_only_eligible_rows_in_batches_while_work_goes_on() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let mut eligible = Vec::new();
    // 25 completed + 5 cancelled instances ended 40 days ago: eligible, each with one
    // settled command (eligible too), journal and signal rows.
    for i in 0..30 {
        let status = if i < 25 { "completed" } else { "cancelled" };
        let id = instance(pool, status, 40).await;
        command(pool, id, "done", 40).await;
        eligible.push(id);
    }
    let mut kept = Vec::new();
    // Failed 40 days ago (retryable: kept), but its settled command is eligible.
    for _ in 0..5 {
        let id = instance(pool, "failed", 40).await;
        command(pool, id, "done", 40).await;
        command(pool, id, "dead", 40).await;
        kept.push(id);
    }
    // Completed yesterday: too young, and so are its commands.
    for _ in 0..5 {
        let id = instance(pool, "completed", 1).await;
        command(pool, id, "done", 1).await;
        kept.push(id);
    }
    // Waiting for 40 days: not ended; one old settled command (eligible), one queued.
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let id = instance(pool, "waiting", 40).await;
        command(pool, id, "done", 40).await;
        command(pool, id, "queued", 40).await;
        waiting.push(id);
        kept.push(id);
    }
    // Completed 40 days ago but with an open command: kept until it settles.
    for _ in 0..3 {
        let id = instance(pool, "completed", 40).await;
        command(pool, id, "done", 40).await;
        command(pool, id, "queued", 40).await;
        kept.push(id);
    }
    // Eligible commands: 30 + 5 + 5 + 3 = 43, instances: 30.

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let worker = tokio::spawn(live_work(
        pool.clone(),
        waiting.clone(),
        stop.clone(),
        done.clone(),
    ));
    // The work is under way when retention starts, and the cycle under way when it ends
    // completes (so it is measured) before the work stops.
    until_cycles(&done, 1).await;
    let retention = Retention::new(pool.clone(), config(10, 1000)).unwrap();
    let report = retention.run_once(&CancellationToken::new()).await.unwrap();
    until_cycles(&done, done.load(Ordering::Relaxed) + 1).await;
    stop.store(true, Ordering::Relaxed);
    let (cycles, slowest) = worker.await.unwrap();
    println!("retention: {report:?}; concurrent work: {cycles} cycles, slowest {slowest:?}");

    assert_eq!(report.deleted_commands, 43);
    assert_eq!(report.deleted_instances, 30);
    assert_eq!(report.remaining_eligible_commands, 0);
    assert_eq!(report.remaining_eligible_instances, 0);
    assert_eq!(report.failures, 0);
    // Commands 10+10+10+10+3 (5 batches), instances 10+10+10+0 (4 batches).
    assert_eq!(report.batches, 9);
    assert!(cycles > 0, "concurrent work made no progress");
    assert!(
        slowest < Duration::from_secs(1),
        "concurrent work was blocked: {slowest:?}"
    );

    for table in ["durable_command", "durable_journal", "durable_signal"] {
        assert_eq!(count_for(pool, table, &eligible).await, 0, "{table}");
    }
    let gone: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_instance WHERE id = ANY($1)")
        .bind(&eligible)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(gone, 0);
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_instance WHERE id = ANY($1)")
        .bind(&kept)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(still, kept.len() as i64);
    // Kept instances keep their journal and signals, their dead, queued and young
    // settled commands: 5 dead + 5 young done + 5 queued + 3 queued + 3 done-but-
    // instance-kept… minus the old done commands deleted as commands.
    assert_eq!(count_for(pool, "durable_journal", &kept).await, 2 * 18);
    assert_eq!(count_for(pool, "durable_signal", &kept).await, 18);
    assert_eq!(
        count_for(pool, "durable_command", &kept).await,
        5 + 5 + 5 + 3
    );
    // Everything the live work wrote is intact.
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM durable_instance WHERE workflow = 'live' AND status = 'completed'"
        )
        .await,
        cycles as i64
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM durable_command c JOIN durable_instance i ON i.id = c.instance_id
              WHERE i.workflow = 'live' AND c.state = 'done'"
        )
        .await,
        cycles as i64
    );

    // A second pass finds nothing.
    let again = retention.run_once(&CancellationToken::new()).await.unwrap();
    assert_eq!(again.deleted(), 0);
    assert_eq!(again.batches, 2);
}

#[tokio::test]
async fn per_pass_cap_leaves_the_rest_for_the_next_pass() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let holder = instance(pool, "waiting", 40).await;
    for _ in 0..25 {
        command(pool, holder, "done", 40).await;
    }
    let retention = Retention::new(pool.clone(), config(10, 2)).unwrap();
    let first = retention.run_once(&CancellationToken::new()).await.unwrap();
    assert_eq!(first.deleted_commands, 20);
    assert_eq!(first.remaining_eligible_commands, 5);
    let second = retention.run_once(&CancellationToken::new()).await.unwrap();
    assert_eq!(second.deleted_commands, 5);
    assert_eq!(second.remaining_eligible_commands, 0);
    // A fired stop token runs no batch.
    let stopped = CancellationToken::new();
    stopped.cancel();
    let none = retention.run_once(&stopped).await.unwrap();
    assert_eq!(none.batches, 0);
}

#[tokio::test]
async fn locked_rows_are_skipped_reported_and_deleted_by_a_later_pass() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    // Five eligible instances; one of them will be locked.
    let mut ids = Vec::new();
    for _ in 0..5 {
        let id = instance(pool, "completed", 40).await;
        ids.push(id);
    }
    // Five eligible settled commands of a live instance; one of them will be locked.
    let live = instance(pool, "waiting", 40).await;
    let mut cmds = Vec::new();
    for _ in 0..5 {
        cmds.push(command(pool, live, "done", 40).await);
    }

    // Another transaction holds row locks (as live work would), open across the pass.
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM durable_instance WHERE id = $1 FOR UPDATE")
        .bind(ids[2])
        .execute(&mut *other)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM durable_command WHERE id = $1 FOR UPDATE")
        .bind(cmds[3])
        .execute(&mut *other)
        .await
        .unwrap();

    let retention = Retention::new(pool.clone(), config(2, 1000)).unwrap();
    let t = Instant::now();
    let first = retention.run_once(&CancellationToken::new()).await.unwrap();
    let took = t.elapsed();
    println!("retention with locked rows: {first:?} in {took:?}");
    assert!(took < Duration::from_secs(2), "the pass waited for a lock");
    assert_eq!(first.deleted_commands, 4);
    assert_eq!(first.deleted_instances, 4);
    assert_eq!(first.remaining_eligible_commands, 1);
    assert_eq!(first.remaining_eligible_instances, 1);
    assert_eq!(first.failures, 0);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_instance WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(left, 1);

    // The lock holder finishes; the next pass picks the rows up.
    other.rollback().await.unwrap();
    let second = retention.run_once(&CancellationToken::new()).await.unwrap();
    assert_eq!((second.deleted_commands, second.deleted_instances), (1, 1));
    assert_eq!(
        (
            second.remaining_eligible_commands,
            second.remaining_eligible_instances
        ),
        (0, 0)
    );
}

/// A lock on a *dependent* row (a command of an eligible instance) cannot be skipped by
/// the instance's `SKIP LOCKED`: the cascade would wait. The batch waits at most the
/// lock timeout, is rolled back and counted as a failure; the pass continues after it
/// (the next instance is deleted), and a later pass deletes the blocked one.
#[tokio::test]
async fn a_locked_dependent_row_fails_one_batch_and_the_pass_goes_on() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let blocked = instance(pool, "completed", 41).await;
    let dead = command(pool, blocked, "dead", 41).await;
    let next = instance(pool, "completed", 40).await;
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM durable_command WHERE id = $1 FOR UPDATE")
        .bind(dead)
        .execute(&mut *other)
        .await
        .unwrap();
    let retention = Retention::new(pool.clone(), config(1, 1000)).unwrap();
    let t = Instant::now();
    let first = retention.run_once(&CancellationToken::new()).await.unwrap();
    let took = t.elapsed();
    println!("retention with a locked dependent row: {first:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(first.failures, 1);
    assert_eq!(
        first.deleted_instances, 1,
        "the pass stopped at the failed batch"
    );
    assert_eq!(first.remaining_eligible_instances, 1);
    // Commands: one empty batch; instances: failed, deleted `next`, empty.
    assert_eq!(first.batches, 4);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM durable_instance")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(left, vec![blocked]);
    assert_ne!(left[0], next);
    other.rollback().await.unwrap();
    let second = retention.run_once(&CancellationToken::new()).await.unwrap();
    assert_eq!((second.deleted_instances, second.failures), (1, 0));
    assert_eq!(count_for(pool, "durable_command", &[blocked]).await, 0);
}

/// Throughput of one pass over a larger backlog (printed; asserted only loosely).
#[tokio::test]
async fn retention_throughput() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    // 5,000 ended instances (40 days), each with 2 commands, 3 journal rows, 1 signal.
    sqlx::query(
        "WITH i AS (
            INSERT INTO durable_instance (id, workflow, idempotency_key, input, status, output,
                                          created_at, updated_at, ended_at)
            SELECT gen_random_uuid(), 'bulk', g::text, '{}', 'completed', '{}',
                   now() - interval '40 days', now() - interval '40 days',
                   now() - interval '40 days' + g * interval '1 ms'
              FROM generate_series(1, 5000) g
            RETURNING id),
         c AS (
            INSERT INTO durable_command (instance_id, kind, state, max_attempts, outcome, completed_at)
            SELECT id, k, 'done', 5, 'completed', now() - interval '40 days'
              FROM i, unnest(ARRAY['timer', 'signal']) k),
         j AS (
            INSERT INTO durable_journal (instance_id, seq, kind, name, result)
            SELECT id, s, 'step', 's', '{\"ok\": 1}' FROM i, generate_series(0, 2) s)
         INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, consumed_seq)
         SELECT id, 'go', '{}', 'k', 1 FROM i",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(pool).await.unwrap();
    let retention = Retention::new(pool.clone(), config(1000, 1000)).unwrap();
    let report = retention.run_once(&CancellationToken::new()).await.unwrap();
    let rows = report.deleted_commands + report.deleted_instances;
    println!(
        "retention throughput: {} commands + {} instances (with 15000 journal, 5000 signal rows) \
         in {:?} over {} batches: {:.0} rows/s",
        report.deleted_commands,
        report.deleted_instances,
        report.duration,
        report.batches,
        rows as f64 / report.duration.as_secs_f64()
    );
    assert_eq!(report.deleted_commands, 10_000);
    assert_eq!(report.deleted_instances, 5_000);
    assert_eq!(report.failures, 0);
}

/// The runner's daily cycle: the durable pass, crashed replicas' registry rows, and old
/// cron cycle records (each job's latest kept), reported as one count of work items.
#[tokio::test]
async fn the_retention_cycle_covers_durable_and_cluster_tables() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let id = instance(pool, "completed", 40).await;
    command(pool, id, "done", 40).await;
    sqlx::query(
        "INSERT INTO cluster_replica (id, shard_group, role, host, heartbeat_at)
         VALUES ($1, 'workflow', 'runner', 'gone', now() - interval '2 hours')",
    )
    .bind(Uuid::new_v4())
    .execute(pool)
    .await
    .unwrap();
    for days in [35, 40, 45] {
        sqlx::query(
            "INSERT INTO cron_cycle (name, scheduled_at, replica_id, started_at, finished_at, outcome)
             VALUES ('retention/daily', now() - make_interval(days => $1), $2,
                     now() - make_interval(days => $1), now() - make_interval(days => $1), 'succeeded')",
        )
        .bind(days)
        .bind(Uuid::new_v4())
        .execute(pool)
        .await
        .unwrap();
    }
    let retention = Retention::new(pool.clone(), config(100, 10)).unwrap();
    let done = keel::roles::retention_cycle(
        &retention,
        pool,
        Duration::from_secs(500),
        Duration::from_secs(5),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            done.durable.deleted_commands,
            done.durable.deleted_instances,
            done.stale_replicas,
            done.cron_cycles
        ),
        (1, 1, 1, 2)
    );
    assert_eq!(done.deleted(), 5);
    let again = keel::roles::retention_cycle(
        &retention,
        pool,
        Duration::from_secs(500),
        Duration::from_secs(5),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(again.deleted(), 0, "the second cycle found nothing");
}

/// START and CANCEL commands say who started and who cancelled an instance
/// (`Engine::attribution`): retention keeps them while their instance lives and they go
/// with it.
#[tokio::test]
async fn start_and_cancel_commands_stay_while_their_instance_lives() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let live = instance(pool, "waiting", 40).await;
    let ended = instance(pool, "completed", 40).await;
    for id in [live, ended] {
        for kind in ["start", "cancel", "timer"] {
            sqlx::query(
                "INSERT INTO durable_command (instance_id, kind, state, max_attempts, attempt,
                                              outcome, available_at, created_at, completed_at)
                 VALUES ($1, $2, 'done', 5, 1, 'completed', now() - interval '40 days',
                         now() - interval '40 days', now() - interval '40 days')",
            )
            .bind(id)
            .bind(kind)
            .execute(pool)
            .await
            .unwrap();
        }
    }
    let retention = Retention::new(pool.clone(), config(100, 10)).unwrap();
    let report = retention.run_once(&CancellationToken::new()).await.unwrap();
    // The two timer commands go; the ended instance goes with its START and CANCEL.
    assert_eq!(report.deleted_commands, 2);
    assert_eq!(report.deleted_instances, 1);
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind::text FROM durable_command WHERE instance_id = $1 ORDER BY kind::text",
    )
    .bind(live)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(kinds, ["cancel", "start"]);
    let ended_left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_command WHERE instance_id = $1")
            .bind(ended)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(ended_left, 0);
}
