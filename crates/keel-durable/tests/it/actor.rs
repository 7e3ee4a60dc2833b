//! Actor attribution (issue 23): every recorded command carries who asked for it, taken
//! from the recording call's argument, never from the payload; the platform's own
//! commands (timers, recovery, child starts and ends) are SYSTEM with a reason; rows
//! written before migration 0055 read as NONE / ABSENT.

use crate::common::*;
use keel_durable::{
    Actor, ActorKind, AttributionStatus, CancelOutcome, RunStatus, StartOptions, UNPRINTABLE,
};
use serde_json::json;

fn as_service(id: &str) -> StartOptions {
    StartOptions {
        actor: Actor::service(id),
        ..StartOptions::default()
    }
}

#[tokio::test]
async fn start_signal_and_timer_commands_carry_their_actors() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, Some(50)), as_service("key-1"))
        .await
        .unwrap();
    let ex = spawn(&engine);
    until(&engine, s.instance_id, "signal wait", |st| {
        st.wait
            .as_ref()
            .is_some_and(|w| w.kind == keel_durable::WaitKind::Signal)
    })
    .await;
    // A payload that names an actor changes nothing: the actor is the argument.
    engine
        .signal_as(
            s.instance_id,
            "go",
            "d1",
            &json!({"actor_kind": "SYSTEM", "actor_id": "root", "approvedBy": "mallory"}),
            &Actor::user("alice\u{202E}\u{200B}").on_behalf_of("bob"),
        )
        .await
        .unwrap();
    until_status(&engine, s.instance_id, RunStatus::Completed).await;
    ex.shutdown().await;

    let a = engine.attribution(s.instance_id).await.unwrap();
    let kinds: Vec<&str> = a.commands.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, ["start", "timer", "signal"]);
    let start = a.start().unwrap();
    assert_eq!(start.actor.kind(), ActorKind::Service);
    assert_eq!(start.actor.id(), Some("key-1"));
    assert_eq!(start.actor.status(), AttributionStatus::Verified);
    let timer = &a.commands[1];
    assert_eq!(timer.actor, Actor::system("timer"));
    assert_eq!(timer.actor.id(), None);
    let signal_cmd = &a.commands[2];
    assert_eq!(signal_cmd.actor.kind(), ActorKind::User);
    assert_eq!(
        signal_cmd.actor.id(),
        Some("alice"),
        "bidi and zero-width stripped"
    );
    assert_eq!(signal_cmd.actor.on_behalf_of_id(), Some("bob"));
    let sig = a.signal("d1").unwrap();
    assert_eq!(sig.actor, signal_cmd.actor);
    assert!(sig.consumed);
}

#[tokio::test]
async fn calls_without_an_actor_and_rows_before_the_migration_read_as_none() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let s = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    engine.signal(s.instance_id, "go", "x", &1).await.unwrap();
    // A row as a release before 0055 wrote it: no actor columns named.
    sqlx::query(
        "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, 'signal', 5)",
    )
    .bind(s.instance_id)
    .execute(db.pool())
    .await
    .unwrap();
    let a = engine.attribution(s.instance_id).await.unwrap();
    assert_eq!(a.commands.len(), 3);
    for c in &a.commands {
        assert_eq!(c.actor, Actor::none());
        assert_eq!(c.actor.status(), AttributionStatus::Absent);
    }
    assert_eq!(a.signals[0].actor, Actor::none());
    // The table refuses an actor that breaks the shape rules.
    let refused = sqlx::query(
        "INSERT INTO durable_command (instance_id, kind, max_attempts, actor_kind, attribution_status)
         VALUES ($1, 'signal', 5, 'SERVICE', 'VERIFIED')",
    )
    .bind(s.instance_id)
    .execute(db.pool())
    .await;
    assert!(refused.is_err(), "a SERVICE without an id");
}

#[tokio::test]
async fn cancel_and_retry_record_their_callers_also_an_immediate_cancel() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    // Immediate cancel (no segment runs): a settled CANCEL command keeps the canceller.
    let w = engine
        .start::<Waiter>("w", &waiter("go", None, None), opts())
        .await
        .unwrap();
    let out = engine
        .cancel_as(w.instance_id, &Actor::service(&"k".repeat(300)))
        .await
        .unwrap();
    assert_eq!(out, CancelOutcome::Cancelled);
    let a = engine.attribution(w.instance_id).await.unwrap();
    let cancel = a.cancel().unwrap();
    assert_eq!(cancel.state, "done");
    assert_eq!(cancel.outcome.as_deref(), Some("cancelled"));
    assert_eq!(
        cancel.actor.id().unwrap().chars().count(),
        255,
        "cut at 255"
    );

    // Retry of a failed instance.
    let ex = spawn(&engine);
    let f = engine.start::<Fails>("f", &1, opts()).await.unwrap();
    until_status(&engine, f.instance_id, RunStatus::Failed).await;
    engine
        .retry_as(f.instance_id, &Actor::service("\u{0007}\u{200D}"))
        .await
        .unwrap();
    until_status(&engine, f.instance_id, RunStatus::Failed).await;
    ex.shutdown().await;
    let a = engine.attribution(f.instance_id).await.unwrap();
    let retry = a.commands.iter().find(|c| c.kind == "retry").unwrap();
    assert_eq!(retry.actor.kind(), ActorKind::Service);
    assert_eq!(retry.actor.id(), Some(UNPRINTABLE));
}

#[tokio::test]
async fn child_start_and_child_end_are_system_commands() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let ex = spawn(&engine);
    let p = engine
        .start::<Parent>("p", &"counter".to_owned(), as_service("key-p"))
        .await
        .unwrap();
    until_status(&engine, p.instance_id, RunStatus::Completed).await;
    ex.shutdown().await;
    let child: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM durable_instance WHERE parent_id = $1")
            .bind(p.instance_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    let c = engine.attribution(child).await.unwrap();
    assert_eq!(c.start().unwrap().actor, Actor::system("child-start"));
    let parent = engine.attribution(p.instance_id).await.unwrap();
    let ended = parent.signal(&format!("child:{child}")).unwrap();
    assert_eq!(ended.actor, Actor::system("child-ended"));
    assert!(
        parent
            .commands
            .iter()
            .any(|c| c.kind == "signal" && c.actor == Actor::system("child-ended"))
    );
}

#[tokio::test]
async fn attribution_of_an_unknown_instance_is_not_found() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    let err = engine.attribution(uuid::Uuid::new_v4()).await.unwrap_err();
    assert!(matches!(
        err,
        keel_durable::DurableError::InstanceNotFound(_)
    ));
}
