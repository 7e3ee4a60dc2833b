//! Crash test with a real process kill: an executor child process
//! (`keel-durable-crash-worker`) is SIGKILLed at each dangerous point and started again.

use crate::common::*;
use keel_durable::{Engine, RunStatus, WaitKind};
use uuid::Uuid;

async fn until_wait(engine: &Engine, ids: &[Uuid], kind: WaitKind) {
    for id in ids {
        until(engine, *id, "wait", |s| {
            s.status == RunStatus::Waiting && s.wait.as_ref().is_some_and(|w| w.kind == kind)
        })
        .await;
    }
}

#[tokio::test]
async fn sigkill_at_each_dangerous_point_loses_no_step_and_repeats_only_the_interrupted_one() {
    let db = database().await;
    let pool = db.pool();
    // The test only starts, signals and reads; the worker processes execute.
    let engine = Engine::new(pool.clone(), fast_config()).unwrap();
    set_flag(pool, "hold-s1-a", "hold").await;
    set_flag(pool, "hold-after-s1-a", "hold").await;
    let mut ids = Vec::new();
    for tag in ["a", "b0", "b1", "b2", "b3", "b4", "b5"] {
        let input: String = tag.to_owned();
        let started = engine
            .start_json(
                "test.crash",
                tag,
                &serde_json::to_string(&input).unwrap(),
                opts(),
            )
            .await
            .unwrap();
        ids.push(started.instance_id);
    }
    let a = ids[0];
    let mut kills = 0;

    // 1. Inside step s1, its effect done, its result not committed.
    let w = Worker::start(db.url());
    until_flag(pool, "at-hold-s1-a").await;
    assert_eq!(effect(pool, "a-s1").await, 1);
    assert_eq!(journal_len(pool, a).await, 1);
    w.kill();
    kills += 1;
    set_flag(pool, "hold-s1-a", "release").await;

    // 2. After s1's result committed, before the next step.
    let w = Worker::start(db.url());
    until_flag(pool, "at-hold-after-s1-a").await;
    assert_eq!(journal_len(pool, a).await, 2);
    w.kill();
    kills += 1;
    set_flag(pool, "hold-after-s1-a", "release").await;

    // 3. While waiting on a durable timer; the deadline passes while no executor runs.
    // The deadline is read from the same status snapshot that shows the timer wait (a
    // second read could already see the timer fired on a loaded machine).
    let w = Worker::start(db.url());
    let started = std::time::Instant::now();
    let deadline = loop {
        let s = engine.status(a).await.unwrap();
        if let Some(d) = s
            .wait
            .as_ref()
            .filter(|w| s.status == RunStatus::Waiting && w.kind == WaitKind::Timer)
            .and_then(|w| w.deadline)
        {
            break d;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "instance a never waited on its timer: {s:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    w.kill();
    kills += 1;
    loop {
        let passed: bool = sqlx::query_scalar("SELECT now() > $1")
            .bind(deadline)
            .fetch_one(pool)
            .await
            .unwrap();
        if passed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // 4. While waiting on a signal.
    let w = Worker::start(db.url());
    until_wait(&engine, &ids, WaitKind::Signal).await;
    w.kill();
    kills += 1;
    for id in &ids {
        engine.signal(*id, "go", "go", &true).await.unwrap();
    }

    // Restart: everything completes.
    let w = Worker::start(db.url());
    for id in &ids {
        until_status(&engine, *id, RunStatus::Completed).await;
    }
    w.kill();

    assert_eq!(effect(pool, "a-s0").await, 1);
    assert_eq!(
        effect(pool, "a-s1").await,
        2,
        "the interrupted step ran again, once"
    );
    assert_eq!(effect(pool, "a-s2").await, 1);
    let mut extra = 0;
    for tag in ["b0", "b1", "b2", "b3", "b4", "b5"] {
        for step in ["s0", "s1", "s2"] {
            let n = effect(pool, &format!("{tag}-{step}")).await;
            // An unheld step can be interrupted by more than one kill (it re-runs after
            // kill k and kill k+1 lands inside it again): at most once more per kill.
            assert!((1..=1 + kills).contains(&n), "{tag}-{step} ran {n} times");
            extra += n - 1;
        }
    }
    // Each kill interrupts at most one step per concurrent segment (4).
    assert!(
        extra <= kills * 4,
        "{extra} repeated steps for {kills} kills"
    );
    for id in &ids {
        let journal: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM durable_journal WHERE instance_id = $1 AND kind = 'step' ORDER BY seq",
        )
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(journal, ["s0", "s1", "s2"]);
    }
    let report = engine.await_idle(TIMEOUT).await.unwrap();
    assert!(report.dead.is_empty());
}
