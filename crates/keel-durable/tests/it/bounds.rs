//! Input bounds at and just over each limit, refused before any write.

use crate::common::*;
use keel_durable::payload::BoundError;
use keel_durable::{DurableError, EngineConfig};
use serde_json::{Value, json};

fn nested(depth: usize) -> Value {
    let mut v = json!(0);
    for _ in 0..depth {
        v = json!([v]);
    }
    v
}

fn small() -> EngineConfig {
    EngineConfig {
        max_payload_bytes: 1_024,
        ..fast_config()
    }
}

async fn rows(pool: &sqlx::PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM durable_instance), (SELECT count(*) FROM durable_command),
                (SELECT count(*) FROM durable_signal)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn start_input_size_and_depth() {
    let db = database().await;
    let engine = engine(db.pool(), small());
    // "x" * 1022 encodes to exactly 1024 bytes.
    let at = "x".repeat(1_022);
    engine
        .start_json("raw.wf", "at", &serde_json::to_string(&at).unwrap(), opts())
        .await
        .unwrap();
    let over = "x".repeat(1_023);
    let err = engine
        .start_json(
            "raw.wf",
            "over",
            &serde_json::to_string(&over).unwrap(),
            opts(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooLarge { limit: 1_024, .. })
    ));
    assert!(err.to_string().contains("maxPayloadBytes"));
    // Typed path: the same bound on the compact encoding.
    let err = engine
        .start::<Typed>("typed-over", &over, opts())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooLarge { .. })
    ));
    // Depth 64 passes, 65 is refused (typed and text paths).
    let engine_big = keel_durable::Engine::new(db.pool().clone(), fast_config()).unwrap();
    engine_big
        .start_json("raw.wf", "d64", &nested(64).to_string(), opts())
        .await
        .unwrap();
    let err = engine_big
        .start_json("raw.wf", "d65", &nested(65).to_string(), opts())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooDeep { limit: 64, .. })
    ));
    assert_eq!(rows(db.pool()).await, (2, 2, 0), "refusals wrote nothing");
}

#[tokio::test]
async fn a_megabyte_of_nesting_is_refused_without_stack_overflow() {
    let db = database().await;
    let mut config = fast_config();
    config.max_payload_bytes = 4 << 20;
    let engine = keel_durable::Engine::new(db.pool().clone(), config).unwrap();
    let text = format!("{}{}", "[".repeat(512 * 1024), "]".repeat(512 * 1024));
    let err = engine
        .start_json("raw.wf", "deep", &text, opts())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooDeep { .. })
    ));
    let obj = format!("{}{}", "{\"a\":".repeat(200_000), "}".repeat(200_000));
    let err = engine
        .start_json("raw.wf", "deep2", &obj, opts())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooDeep { .. })
    ));
    assert_eq!(rows(db.pool()).await, (0, 0, 0));
}

#[tokio::test]
async fn names_and_keys() {
    let db = database().await;
    let engine = engine(db.pool(), small());
    let k255 = "k".repeat(255);
    let k256 = "k".repeat(256);
    let s = engine.start::<Fails>(&k255, &1, opts()).await.unwrap();
    let err = engine.start::<Fails>(&k256, &1, opts()).await.unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::BadName { limit: 255, .. })
    ));
    assert!(engine.start::<Fails>("", &1, opts()).await.is_err());
    let err = engine
        .start::<Fails>(
            "k2",
            &1,
            keel_durable::StartOptions {
                serialization_key: Some(k256.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::BadName { .. })
    ));
    // Signals: name and dedupe key bounds.
    engine
        .signal(s.instance_id, &k255, &k255, &1)
        .await
        .unwrap();
    assert!(matches!(
        engine.signal(s.instance_id, &k256, "d", &1).await,
        Err(DurableError::InvalidInput(BoundError::BadName { .. }))
    ));
    assert!(matches!(
        engine.signal(s.instance_id, "n", &k256, &1).await,
        Err(DurableError::InvalidInput(BoundError::BadName { .. }))
    ));
    assert_eq!(rows(db.pool()).await, (1, 2, 1));
}

#[tokio::test]
async fn signal_payload_size_and_depth() {
    let db = database().await;
    let engine = engine(db.pool(), small());
    let s = engine.start::<Fails>("s", &1, opts()).await.unwrap();
    engine
        .signal(s.instance_id, "n", "at", &"x".repeat(1_022))
        .await
        .unwrap();
    let err = engine
        .signal(s.instance_id, "n", "over", &"x".repeat(1_023))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooLarge { .. })
    ));
    engine
        .signal_json(s.instance_id, "n", "d64", &nested(64).to_string())
        .await
        .unwrap();
    let err = engine
        .signal_json(s.instance_id, "n", "d65", &nested(65).to_string())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::TooDeep { .. })
    ));
    let err = engine
        .signal_json(s.instance_id, "n", "bad", "{\"pin\": 12")
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        DurableError::InvalidInput(BoundError::NotJson { .. })
    ));
    assert!(!err.to_string().contains("pin"));
    assert_eq!(rows(db.pool()).await, (1, 3, 2));
}

#[test]
fn payload_bound_configuration_minimum() {
    let c = EngineConfig {
        max_payload_bytes: 1_023,
        ..EngineConfig::default()
    };
    assert!(matches!(c.validate(), Err(DurableError::Config { .. })));
}
