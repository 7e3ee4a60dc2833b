//! Scheduled-job records and health (`job_health`), and bounded catch-up after downtime.

use crate::*;
use keel_cluster::{
    CronCycle, CronJob, JobHealth, Schedule, cron_pass, cron_status, db_now, job_health,
    register_job, report_job_health,
};
use std::time::SystemTime;
use tokio_util::sync::CancellationToken;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

async fn insert_cycle(
    pool: &PgPool,
    name: &str,
    scheduled_ago_s: i64,
    started_ago_s: i64,
    outcome: Option<&str>,
    items: Option<i64>,
) {
    sqlx::query(
        "INSERT INTO cron_cycle (name, scheduled_at, replica_id, started_at, finished_at, outcome, items)
         VALUES ($1, now() - make_interval(secs => $2), $3, now() - make_interval(secs => $4),
                 CASE WHEN $5::text IS NOT NULL THEN now() - make_interval(secs => $4) END, $5, $6)",
    )
    .bind(name)
    .bind(scheduled_ago_s as f64)
    .bind(Uuid::new_v4())
    .bind(started_ago_s as f64)
    .bind(outcome)
    .bind(items)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn job_health_tells_found_nothing_overdue_and_stopped_reporting_apart() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let name = "test/health";
    let now = db_now(pool).await.unwrap();
    assert_eq!(
        job_health(pool, name, now).await.unwrap(),
        JobHealth::Unknown
    );

    let job = CronJob::new(name, Schedule::every(HOUR));
    register_job(pool, &job).await.unwrap();
    assert_eq!(
        job_health(pool, name, now).await.unwrap(),
        JobHealth::Pending
    );
    // Registered, and nobody started a cycle within two periods.
    let never = job_health(pool, name, now + 3 * HOUR).await.unwrap();
    assert!(
        matches!(never, JobHealth::Overdue { last_started_at: None, overdue_by } if overdue_by >= HOUR - Duration::from_secs(5)),
        "{never:?}"
    );

    // One real cycle through the owner's pass: it ran and found nothing (0 items).
    let token = CancellationToken::new();
    let replica = Uuid::new_v4();
    let pass = cron_pass(pool, replica, &job, &token, &|_c: CronCycle| async {
        Ok::<u64, String>(0)
    })
    .await
    .unwrap();
    assert_eq!((pass.ran, pass.remaining), (1, 0));
    assert!(pass.wait > Duration::ZERO && pass.wait <= HOUR);
    let status = cron_status(pool, name).await.unwrap();
    assert_eq!(status.last_items, Some(0));
    assert_eq!(status.cycles, 1);
    assert!(status.last_success_at.is_some() && status.last_duration.is_some());
    let now = db_now(pool).await.unwrap();
    assert!(matches!(
        job_health(pool, name, now).await.unwrap(),
        JobHealth::FoundNothing { .. }
    ));
    // The same record judged 3 h later: no cycle started within 2 × period.
    let late = job_health(pool, name, now + 3 * HOUR).await.unwrap();
    assert!(
        matches!(
            late,
            JobHealth::Overdue {
                last_started_at: Some(_),
                ..
            }
        ),
        "{late:?}"
    );
    assert!(late.is_alarming());

    // A newer cycle that started and never finished: running within a period, then
    // "stopped reporting" (its owner was lost mid-run or it hangs) — not "overdue".
    insert_cycle(pool, name, -3600, -60, None, None).await;
    let now = db_now(pool).await.unwrap();
    assert!(matches!(
        job_health(pool, name, now + 2 * Duration::from_secs(60))
            .await
            .unwrap(),
        JobHealth::Running { .. }
    ));
    let silent = job_health(pool, name, now + 2 * HOUR).await.unwrap();
    assert!(
        matches!(silent, JobHealth::StoppedReporting { .. }),
        "{silent:?}"
    );
    let silent = job_health(pool, name, now + 10 * HOUR).await.unwrap();
    assert_eq!(silent.as_str(), "stopped_reporting");

    // It finishes as failed; then a later cycle does real work.
    sqlx::query(
        "UPDATE cron_cycle SET finished_at = started_at + interval '1 second', outcome = 'failed'
          WHERE name = $1 AND finished_at IS NULL",
    )
    .bind(name)
    .execute(pool)
    .await
    .unwrap();
    let failed = job_health(pool, name, now + Duration::from_secs(120))
        .await
        .unwrap();
    assert!(
        matches!(
            failed,
            JobHealth::Failed {
                last_success_at: Some(_),
                ..
            }
        ),
        "{failed:?}"
    );
    insert_cycle(pool, name, -7200, -120, Some("succeeded"), Some(7)).await;
    assert!(matches!(
        job_health(pool, name, now + Duration::from_secs(180))
            .await
            .unwrap(),
        JobHealth::Succeeded { items: Some(7), .. }
    ));

    // The exported view: fixed job names, one state each.
    let report = report_job_health(pool, &["test/health", "test/absent"])
        .await
        .unwrap();
    assert_eq!(report[1], ("test/absent", JobHealth::Unknown));
    assert!(JobHealth::STATES.contains(&report[0].1.as_str()));
}

/// An owner that comes back after missing many cycles runs at most
/// `max_catch_up_per_pass` of them per pass (oldest first), reports the remaining gap,
/// and works it off over the next passes without running any cycle twice.
#[tokio::test]
async fn catch_up_after_downtime_is_bounded_per_pass() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let name = "test/catch-up";
    // The last recorded cycle is 50 days behind the latest due one.
    sqlx::query(
        "INSERT INTO cron_cycle (name, scheduled_at, replica_id, finished_at, outcome)
         VALUES ($1, to_timestamp((floor(extract(epoch FROM now()) / 86400) - 50) * 86400),
                 $2, clock_timestamp(), 'succeeded')",
    )
    .bind(name)
    .bind(Uuid::new_v4())
    .execute(pool)
    .await
    .unwrap();
    let job = CronJob::new(name, Schedule::every(DAY)); // 24 per pass
    let replica = Uuid::new_v4();
    let token = CancellationToken::new();
    let runs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<SystemTime>::new()));
    let work = {
        let runs = runs.clone();
        move |c: CronCycle| {
            runs.lock().unwrap().push(c.scheduled_at);
            async { Ok::<(), String>(()) }
        }
    };
    let mut passes = Vec::new();
    loop {
        let pass = cron_pass(pool, replica, &job, &token, &work).await.unwrap();
        passes.push((pass.ran, pass.remaining));
        if pass.remaining == 0 {
            assert!(pass.wait > Duration::ZERO);
            break;
        }
        assert_eq!(pass.wait, Duration::ZERO);
        assert!(passes.len() < 10);
    }
    println!("catch-up passes (ran, remaining): {passes:?}");
    assert_eq!(passes, vec![(24, 26), (24, 2), (2, 0)]);
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 50);
    assert!(
        runs.windows(2)
            .all(|w| w[1].duration_since(w[0]).unwrap() == DAY)
    );
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_cycle WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(recorded, 51);
    // Nothing is due now: a further pass runs nothing.
    let idle = cron_pass(pool, replica, &job, &token, &work).await.unwrap();
    assert_eq!((idle.ran, idle.remaining), (0, 0));
}

/// The same through a real owner: it catches up a 30-cycle gap, 8 per pass.
#[tokio::test]
async fn an_owner_catches_up_a_gap_in_bounded_passes() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let name = "test/owner-catch-up";
    sqlx::query(
        "INSERT INTO cron_cycle (name, scheduled_at, replica_id, finished_at, outcome)
         VALUES ($1, to_timestamp((floor(extract(epoch FROM now()) / 86400) - 30) * 86400),
                 $2, clock_timestamp(), 'succeeded')",
    )
    .bind(name)
    .bind(Uuid::new_v4())
    .execute(pool)
    .await
    .unwrap();
    let owner = start(&db, 4).await;
    let mut job = CronJob::new(name, Schedule::every(DAY));
    job.max_catch_up_per_pass = 8;
    let handle = owner
        .cron(pool.clone(), job, |_c: CronCycle| async {
            Ok::<u64, String>(0)
        })
        .unwrap();
    eventually("the gap is caught up", Duration::from_secs(20), || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM cron_cycle WHERE name = $1 AND outcome = 'succeeded'",
        )
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap();
        n == 31
    })
    .await;
    let now = db_now(pool).await.unwrap();
    assert!(matches!(
        job_health(pool, name, now).await.unwrap(),
        JobHealth::FoundNothing { .. }
    ));
    owner.shutdown().await;
    handle.abort();
}

/// Retention of the registry: rows of crashed replicas (heartbeat older than the bound)
/// are deleted; live replicas and recently silent ones are kept.
#[tokio::test]
async fn stale_replica_rows_are_pruned_and_live_ones_kept() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    let owner = start(&db, 4).await;
    for age_s in [3600.0, 600.0, 5.0] {
        sqlx::query(
            "INSERT INTO cluster_replica (id, shard_group, role, host, started_at, heartbeat_at)
             VALUES ($1, 'workflow', 'runner', 'crashed', now() - make_interval(secs => $2),
                     now() - make_interval(secs => $2))",
        )
        .bind(Uuid::new_v4())
        .bind(age_s)
        .execute(pool)
        .await
        .unwrap();
    }
    let window = config(4).liveness_window; // 2 s
    // 100 windows = 200 s: the 3600 s and 600 s rows go, the 5 s one stays.
    let pruned = keel_cluster::prune_stale_replicas(pool, window * 100, window)
        .await
        .unwrap();
    assert_eq!(pruned, 2);
    // A bound below the liveness window is raised to it: live replicas never go.
    let pruned = keel_cluster::prune_stale_replicas(pool, Duration::ZERO, window)
        .await
        .unwrap();
    assert_eq!(pruned, 1, "only the 5 s-silent row is beyond the window");
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM cluster_replica")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(left, vec![owner.replica_id()]);
    owner.shutdown().await;
}

/// Retention of cycle records: old cycles go in batches, each job's latest stays (its
/// next pass continues from it).
#[tokio::test]
async fn old_cron_cycles_are_pruned_keeping_each_jobs_latest() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool();
    for day in 1..=40 {
        insert_cycle(
            pool,
            "test/a",
            day * 86_400,
            day * 86_400,
            Some("succeeded"),
            Some(1),
        )
        .await;
    }
    // A job whose only (and latest) cycle is old.
    insert_cycle(
        pool,
        "test/b",
        90 * 86_400,
        90 * 86_400,
        Some("succeeded"),
        None,
    )
    .await;
    let deleted = keel_cluster::prune_cron_cycles(pool, 30 * DAY, 4, 1000)
        .await
        .unwrap();
    // test/a: days 30..=40 are older than 30 days by the time of the call.
    assert_eq!(deleted, 11);
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, count(*) FROM cron_cycle GROUP BY name ORDER BY name")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        left,
        vec![("test/a".to_owned(), 29), ("test/b".to_owned(), 1)]
    );
    // A bounded call deletes at most batch × max_batches rows.
    let capped = keel_cluster::prune_cron_cycles(pool, DAY, 4, 2)
        .await
        .unwrap();
    assert_eq!(capped, 8);
}
