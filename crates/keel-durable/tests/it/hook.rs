//! The transition hook runs inside the transactions that write an instance's status: it
//! sees the new status on its connection, and a failing hook rolls the change back.

use crate::common::*;
use keel_durable::{
    Engine, HookFuture, RunStatus, Transition, TransitionHook, TransitionHookError,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Logs each transition as `<status>/<status read on the hook's connection>` into
/// `event_log`, or fails while `fail` is set.
struct Log {
    engine: std::sync::OnceLock<Engine>,
    fail: AtomicBool,
}

impl TransitionHook for Log {
    fn record<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        transitions: &'c [Transition],
    ) -> HookFuture<'c> {
        Box::pin(async move {
            if self.fail.load(Ordering::SeqCst) {
                return Err(TransitionHookError::Other("refused by the test".into()));
            }
            for t in transitions {
                let seen = match self.engine.get() {
                    Some(e) => {
                        e.status_in(&mut *conn, t.instance_id)
                            .await
                            .map_err(|e| TransitionHookError::Other(Box::new(e)))?
                            .status
                    }
                    None => t.status,
                };
                sqlx::query("INSERT INTO event_log (tag, what) VALUES ($1, $2)")
                    .bind(t.instance_id.to_string())
                    .bind(format!(
                        "{}/{}/{}",
                        t.workflow,
                        t.status.as_str(),
                        seen.as_str()
                    ))
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        })
    }
}

async fn log_of(pool: &sqlx::PgPool, id: uuid::Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT what FROM event_log WHERE tag = $1 ORDER BY id")
        .bind(id.to_string())
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_hook_sees_every_status_the_engine_writes_in_its_transaction() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let hook = Arc::new(Log {
        engine: std::sync::OnceLock::new(),
        fail: AtomicBool::new(false),
    });
    let _ = hook.engine.set(engine.clone());
    assert!(engine.set_transition_hook(hook.clone()));
    assert!(
        !engine.set_transition_hook(hook.clone()),
        "one hook per engine"
    );
    let ex = spawn(&engine);
    let s = engine
        .start::<Waiter>("a", &waiter("go", None, None), opts())
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Waiting).await;
    assert_eq!(
        log_of(db.pool(), s.instance_id).await,
        ["test.waiter/waiting/waiting"]
    );

    // While the hook fails, the settle that would complete the instance rolls back.
    hook.fail.store(true, Ordering::SeqCst);
    engine
        .signal(s.instance_id, "go", "1", &json!(1))
        .await
        .unwrap();
    until_db(
        db.pool(),
        "a second claim (the first settle rolled back)",
        "SELECT EXISTS (SELECT 1 FROM durable_command WHERE kind = 'signal' AND attempt >= 2)",
    )
    .await;
    assert_ne!(
        engine.status(s.instance_id).await.unwrap().status,
        RunStatus::Completed
    );
    hook.fail.store(false, Ordering::SeqCst);
    until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(
        log_of(db.pool(), s.instance_id).await,
        [
            "test.waiter/waiting/waiting",
            "test.waiter/completed/completed"
        ]
    );

    // A cancel of an instance no segment runs writes `cancelled` through the hook.
    let c = engine
        .start::<Waiter>("b", &waiter("go", None, None), opts())
        .await
        .unwrap();
    until_status(&engine, c.instance_id, RunStatus::Waiting).await;
    engine.cancel(c.instance_id).await.unwrap();
    assert_eq!(
        log_of(db.pool(), c.instance_id).await,
        [
            "test.waiter/waiting/waiting",
            "test.waiter/cancelled/cancelled"
        ]
    );
    ex.shutdown().await;
}
