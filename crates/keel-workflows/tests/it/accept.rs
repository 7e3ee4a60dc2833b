//! Acceptance through the service: idempotency by (organization, key, request).

use crate::common::{Env, new_asset};
use alloy::primitives::Address;
use keel_workflows::{OperationState, OpsError, TokenRequest};

/// Same key and same body: the same operation (not created again, nothing new
/// written); same key, other body: a conflict; another organization: its own key.
#[tokio::test]
async fn same_key_same_operation_other_body_conflicts() {
    let env = Env::new().await;
    let first = env
        .ops
        .create_asset(env.caller, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    assert!(first.created);
    assert_eq!(first.operation.kind, "asset.create");
    // No executor: the instance is pending, which reads `running`.
    assert_eq!(first.operation.state, OperationState::Running);

    let again = env
        .ops
        .create_asset(env.caller, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.operation.id, first.operation.id);
    assert_eq!(again.operation.asset_id, first.operation.asset_id);
    // The second key of the organization shares its key space.
    let colleague = env
        .ops
        .create_asset(env.colleague, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    assert_eq!(colleague.operation.id, first.operation.id);

    let other = env
        .ops
        .create_asset(env.caller, "k-1", &new_asset("Beta"))
        .await
        .unwrap_err();
    assert!(matches!(other, OpsError::IdempotencyConflict), "{other:?}");
    assert_eq!(other.code(), "IDEMPOTENCY_CONFLICT");
    assert!(!other.is_retryable());

    let theirs = env
        .ops
        .create_asset(env.stranger, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    assert!(theirs.created);
    assert_ne!(theirs.operation.id, first.operation.id);

    for table in ["operation", "asset", "durable_instance"] {
        let n: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(env.pool())
                .await
                .unwrap();
        assert_eq!(n, 2, "{table}");
    }
}

/// A token operation on an asset whose creation has not completed is refused
/// (`ASSET_NOT_READY`, nothing written); a bad field is refused before that.
#[tokio::test]
async fn token_operations_need_an_active_asset() {
    let env = Env::new().await;
    let created = env
        .ops
        .create_asset(env.caller, "k-1", &new_asset("Alpha"))
        .await
        .unwrap();
    let asset = created.operation.asset_id.unwrap();
    let mint = TokenRequest::Mint {
        recipient: Address::repeat_byte(7),
        amount: "1.5".into(),
    };
    let e = env
        .ops
        .token_operation(env.caller, "m-1", asset, &mint)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ASSET_NOT_READY");
    let zero = TokenRequest::Mint {
        recipient: Address::ZERO,
        amount: "1".into(),
    };
    let e = env
        .ops
        .token_operation(env.caller, "m-2", asset, &zero)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            OpsError::InvalidField {
                field: "recipient",
                ..
            }
        ),
        "{e:?}"
    );
    let e = env
        .ops
        .token_operation(env.stranger, "m-3", asset, &TokenRequest::Pause)
        .await
        .unwrap_err();
    assert!(matches!(e, OpsError::NotFound { what: "asset" }), "{e:?}");
    let ops: i64 = sqlx::query_scalar("SELECT count(*) FROM operation")
        .fetch_one(env.pool())
        .await
        .unwrap();
    assert_eq!(ops, 1);
}

/// Keys and fields are checked before anything is written.
#[tokio::test]
async fn malformed_requests_write_nothing() {
    let env = Env::new().await;
    for key in ["", "a\u{0}b", &"k".repeat(256)] {
        let e = env
            .ops
            .create_asset(env.caller, key, &new_asset("Alpha"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpsError::InvalidField {
                    field: "Idempotency-Key",
                    ..
                }
            ),
            "{e:?}"
        );
    }
    let mut bad = new_asset("Alpha");
    bad.symbol = "A-B".into();
    let e = env
        .ops
        .create_asset(env.caller, "k", &bad)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            OpsError::InvalidField {
                field: "symbol",
                ..
            }
        ),
        "{e:?}"
    );
    let mut bad = new_asset("Alpha");
    bad.initial_price = "1.123456789".into(); // the template's feed has 8 decimals
    let e = env
        .ops
        .create_asset(env.caller, "k", &bad)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "AMOUNT_PRECISION_LOSS");
    let mut bad = new_asset("Alpha");
    bad.template_id = "nope".into();
    let e = env
        .ops
        .create_asset(env.caller, "k", &bad)
        .await
        .unwrap_err();
    assert!(
        matches!(e, OpsError::NotFound { what: "template" }),
        "{e:?}"
    );
    let ops: i64 = sqlx::query_scalar("SELECT count(*) FROM operation")
        .fetch_one(env.pool())
        .await
        .unwrap();
    assert_eq!(ops, 0);
}
