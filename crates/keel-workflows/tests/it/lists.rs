//! The operation list (`Ops::operations`, `store::operation_list`): every filter
//! combination is an index range scan without a sort, and a `state` filter examines a
//! bounded number of rows per call and says where to continue.

use crate::common::{Env, new_asset};
use keel_workflows::store::{self, OperationListFilter};
use keel_workflows::{OPERATION_SCAN_BUDGET, OperationFilter, OperationState};
use uuid::Uuid;

/// Inserts `n` operations of organization A on `asset` (kinds alternating, no workflow
/// instance: they read `running`), one statement.
async fn bulk_operations(env: &Env, asset: Uuid, n: i32) {
    sqlx::query(
        "INSERT INTO operation (id, organization_id, kind, asset_id, idempotency_key,
                                request_sha256, api_key_id, created_at)
         SELECT gen_random_uuid(), $1,
                (ARRAY['asset.mint', 'asset.transfer', 'asset.pause'])[1 + i % 3], $2,
                'bulk-' || i, decode(repeat('ab', 32), 'hex'), $3,
                now() - make_interval(secs => $4 - i)
           FROM generate_series(1, $4) AS i",
    )
    .bind(env.caller.organization_id)
    .bind(asset)
    .bind(env.caller.api_key_id)
    .bind(n)
    .execute(env.pool())
    .await
    .unwrap();
    sqlx::query("ANALYZE operation")
        .execute(env.pool())
        .await
        .unwrap();
}

/// With many operations of other assets and organizations, each filter combination's
/// plan reads one index in list order (no sequential scan, no sort).
#[tokio::test]
async fn every_filter_combination_is_an_index_range_scan() {
    let env = Env::new().await;
    let asset = env
        .ops
        .create_asset(env.caller, "a", &new_asset("Alpha"))
        .await
        .unwrap()
        .operation
        .asset_id;
    let other = env
        .ops
        .create_asset(env.caller, "b", &new_asset("Beta"))
        .await
        .unwrap()
        .operation
        .asset_id;
    bulk_operations(&env, other, 20_000).await;
    let org = env.caller.organization_id;
    let now = chrono::Utc::now();
    let filters = [
        (
            OperationListFilter::default(),
            "operation_organization_created",
        ),
        (
            OperationListFilter {
                kind: Some("asset.mint".into()),
                ..Default::default()
            },
            "operation_organization_kind_created",
        ),
        (
            OperationListFilter {
                asset_id: Some(asset),
                ..Default::default()
            },
            "operation_asset_created",
        ),
        (
            OperationListFilter {
                asset_id: Some(asset),
                kind: Some("asset.mint".into()),
                created_after: Some(now - chrono::Duration::hours(1)),
                created_before: Some(now),
            },
            "operation_asset_created",
        ),
        (
            OperationListFilter {
                kind: Some("asset.pause".into()),
                created_after: Some(now - chrono::Duration::hours(1)),
                ..Default::default()
            },
            "operation_organization_kind_created",
        ),
    ];
    for (f, index) in filters {
        for after in [
            None,
            Some((now - chrono::Duration::minutes(30), Uuid::nil())),
        ] {
            let plan = store::operation_list_plan(env.pool(), org, &f, after, 51)
                .await
                .unwrap()
                .join("\n");
            assert!(plan.contains(index), "{f:?} {after:?}: {plan}");
            for bad in ["Seq Scan", "Sort", "Bitmap"] {
                assert!(!plan.contains(bad), "{f:?} {after:?}: {plan}");
            }
        }
    }
}

/// A `state` filter that matches nothing examines at most [`OPERATION_SCAN_BUDGET`] rows
/// per call: the first call returns no operations and where to continue; the next one
/// reaches the end. One that matches every row fills its page from the first batch.
#[tokio::test]
async fn a_state_filter_examines_a_bounded_number_of_rows() {
    let env = Env::new().await;
    let asset = env
        .ops
        .create_asset(env.caller, "a", &new_asset("Alpha"))
        .await
        .unwrap()
        .operation
        .asset_id;
    bulk_operations(&env, asset, 1_100).await;
    let completed = OperationFilter {
        state: Some(OperationState::Completed),
        ..Default::default()
    };
    let first = env
        .ops
        .operations(env.caller, &completed, None, 50)
        .await
        .unwrap();
    assert!(first.operations.is_empty());
    let resume = first
        .resume_after
        .expect("the budget ran out: a resume point");
    let all = env
        .ops
        .operations(env.caller, &Default::default(), None, 200)
        .await
        .unwrap();
    assert_eq!(
        all.operations.len(),
        201,
        "limit + 1 rows without a state filter"
    );
    let examined = store::operation_list(
        env.pool(),
        env.caller.organization_id,
        &Default::default(),
        None,
        OPERATION_SCAN_BUDGET as i64,
    )
    .await
    .unwrap();
    let last = examined.last().unwrap();
    assert_eq!(
        resume,
        (last.created_at, last.id),
        "continues after the last row examined"
    );
    let second = env
        .ops
        .operations(env.caller, &completed, Some(resume), 50)
        .await
        .unwrap();
    assert!(second.operations.is_empty());
    assert_eq!(second.resume_after, None, "the end of the list");

    let running = OperationFilter {
        state: Some(OperationState::Running),
        kind: Some("asset.mint".into()),
        ..Default::default()
    };
    let page = env
        .ops
        .operations(env.caller, &running, None, 10)
        .await
        .unwrap();
    assert_eq!(page.operations.len(), 11);
    assert_eq!(page.resume_after, None);
    assert!(page.operations.iter().all(|o| o.kind == "asset.mint"
        && o.state == OperationState::Running
        && o.completed_at.is_none()));
    // Another organization sees none of them.
    let theirs = env
        .ops
        .operations(env.stranger, &Default::default(), None, 10)
        .await
        .unwrap();
    assert!(theirs.operations.is_empty());
}
