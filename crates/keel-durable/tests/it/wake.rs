//! Issue 32 §4: work suspended on something that comes back resumes when it does, not
//! at its recovery backoff (`Engine::wake_suspended`).

use std::time::Duration;

use crate::common::*;
use keel_durable::{Backoff, RunStatus};

/// An instance suspended by `StepError::Unavailable` carries its wake tag; with a
/// recovery backoff of an hour (what 1 s doubling to 300 s reaches after a long
/// outage, and more) only the wake can resume it: `wake_suspended` of its tag records a
/// RETRY due now (`SYSTEM` / the caller's reason) in place of the recovery RETRY, and
/// the instance completes. A wake of another tag, or of an instance that is not
/// suspended, does nothing.
#[tokio::test]
async fn a_suspended_instance_is_resumed_by_the_wake_of_its_tag_not_by_its_backoff() {
    let db = database().await;
    let pool = db.pool();
    let mut config = fast_config();
    config.recovery_backoff = Backoff {
        base: Duration::from_secs(3600),
        cap: Duration::from_secs(3600),
    };
    let engine = engine(pool, config);
    let ex = spawn(&engine);
    let s = engine
        .start::<NeedsChain>("b", &"b".to_owned(), opts())
        .await
        .unwrap();
    let suspended = until_status(&engine, s.instance_id, RunStatus::Suspended).await;
    let error = suspended.error.expect("the suspension's error");
    assert_eq!(error.code, "CHAIN_UNAVAILABLE");
    assert!(error.retryable);
    let tries = effect(pool, "b-tries").await;
    assert_eq!(tries, 3, "the step's transient attempts of one segment");

    // Another chain comes back: nothing to wake.
    assert_eq!(
        engine
            .wake_suspended("chain:a", "chain-served")
            .await
            .unwrap(),
        0
    );
    // The chain comes back.
    set_flag(pool, "up-b", "yes").await;
    assert_eq!(
        engine
            .wake_suspended("chain:b", "chain-served")
            .await
            .unwrap(),
        1
    );
    let done = until_status(&engine, s.instance_id, RunStatus::Completed).await;
    assert_eq!(done.output, Some(serde_json::json!(tries + 1)));
    assert_eq!(
        effect(pool, "b-tries").await,
        tries + 1,
        "one segment after the wake"
    );
    // The RETRY that resumed it is the wake's; the recovery RETRY it replaced never ran.
    let attribution = engine.attribution(s.instance_id).await.unwrap();
    let retries: Vec<_> = attribution
        .commands
        .iter()
        .filter(|c| c.kind == "retry")
        .map(|c| {
            (
                c.actor.reason().map(str::to_owned),
                c.state.clone(),
                c.outcome.clone(),
            )
        })
        .collect();
    assert_eq!(
        retries,
        [
            (
                Some("recovery".to_owned()),
                "done".to_owned(),
                Some("superseded".to_owned())
            ),
            (
                Some("chain-served".to_owned()),
                "done".to_owned(),
                Some("completed".to_owned())
            ),
        ]
    );
    // Not suspended any more: a second wake does nothing.
    assert_eq!(
        engine
            .wake_suspended("chain:b", "chain-served")
            .await
            .unwrap(),
        0
    );
    ex.shutdown().await;
}
