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
        .asset_id
        .unwrap();
    let other = env
        .ops
        .create_asset(env.caller, "b", &new_asset("Beta"))
        .await
        .unwrap()
        .operation
        .asset_id
        .unwrap();
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
                kind: Some(keel_workflows::OperationKind::AssetMint),
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
                kind: Some(keel_workflows::OperationKind::AssetMint),
                created_after: Some(now - chrono::Duration::hours(1)),
                created_before: Some(now),
            },
            "operation_asset_created",
        ),
        (
            OperationListFilter {
                kind: Some(keel_workflows::OperationKind::AssetPause),
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
        .asset_id
        .unwrap();
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
        kind: Some(keel_workflows::OperationKind::AssetMint),
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

/// Migration 0023 gives an asset created before it the sender of its creation's first
/// transaction as its issuer; an asset without a transaction yet keeps none.
#[tokio::test]
async fn the_upgrade_backfills_the_issuer_of_existing_assets() {
    let db = keel_store::testing::TestDatabase::create_at(22)
        .await
        .unwrap();
    let pool = db.pool().clone();
    let org = keel_workflows::tenancy::create_organization(&pool, "o")
        .await
        .unwrap();
    let key = keel_workflows::tenancy::create_api_key(&pool, org, "k")
        .await
        .unwrap();
    // The template as the schema of 0022 holds it.
    sqlx::query(
        "INSERT INTO asset_template (organization_id, id, chain_id, price_decimals,
                                     staleness_bound_seconds)
         VALUES ($1, $2, 31337, 8, 3600)",
    )
    .bind(org)
    .bind(crate::common::TEMPLATE)
    .execute(&pool)
    .await
    .unwrap();
    // The current engine records actors (migration 0055): give the old schema those
    // columns for the setup, and take them away before the upgrade runs.
    for table in ["durable_command", "durable_signal"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} ADD COLUMN actor_kind TEXT NOT NULL DEFAULT 'NONE',
                ADD COLUMN actor_id TEXT, ADD COLUMN actor_reason TEXT,
                ADD COLUMN on_behalf_of TEXT,
                ADD COLUMN attribution_status TEXT NOT NULL DEFAULT 'ABSENT'"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    // ... and the version it pins instances to (migration 0058).
    for ddl in [
        "ALTER TABLE durable_instance ADD COLUMN version INTEGER DEFAULT 1",
        "CREATE TABLE durable_runner_version (runner_id UUID, workflow TEXT,
            min_version INTEGER, max_version INTEGER, seen_at TIMESTAMPTZ)",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    // ... the decision log it writes (migration 0056, as it is), the person a key is
    // issued to, which it reads for a command's actor (0057, as it is), and a
    // template's sender, which it reads with the template (0059, as it is).
    for migration in [
        include_str!("../../../../migrations/0056_durable_history.sql"),
        include_str!("../../../../migrations/0057_api_key_issued_to.sql"),
        // The trace context it records with instances and requests (0060, as it is:
        // `IF NOT EXISTS`, so the upgrade applies it again over it).
        include_str!("../../../../migrations/0060_trace_context.sql"),
        include_str!("../../../../migrations/0059_template_sender.sql"),
        // The wake tag and the deferred-instance predicate its settles and status
        // reads use (0068, idempotent: the upgrade applies it again).
        include_str!("../../../../migrations/0068_durable_wake_tag.sql"),
        // The EIP-7702 authorization list every request insert writes (0081, idempotent).
        include_str!("../../../../migrations/0081_txq_authorization_list.sql"),
        // The organization systems an asset creation reads (0091).
        include_str!("../../../../migrations/0091_organization_system.sql"),
        // The agent-operation rules read with every template (0094, idempotent).
        include_str!("../../../../migrations/0094_template_agent_rules.sql"),
    ] {
        sqlx::raw_sql(migration).execute(&pool).await.unwrap();
    }
    let engine =
        keel_durable::Engine::new(pool.clone(), keel_durable::EngineConfig::default()).unwrap();
    let ops = keel_workflows::Ops::new(pool.clone(), engine);
    let caller = keel_workflows::Caller {
        organization_id: org,
        api_key_id: key.id,
    };
    let sent = ops
        .create_asset(caller, "a", &new_asset("Sent"))
        .await
        .unwrap()
        .operation;
    let unsent = ops
        .create_asset(caller, "b", &new_asset("Unsent"))
        .await
        .unwrap()
        .operation;
    let node = keel_chain::UpstreamPool::new(
        keel_units::ChainId(31337),
        keel_chain::UpstreamConfig::new(vec!["http://127.0.0.1:9".to_owned()]),
    )
    .unwrap();
    let q = keel_txq::TxQueue::new(
        pool.clone(),
        std::sync::Arc::new(node),
        keel_txq::TxQueueConfig::default(),
    )
    .unwrap();
    let sender = alloy::primitives::Address::repeat_byte(0x5e);
    let request = q
        .enqueue(&crate::common::op_request(sender, sent.id, "create-feed"))
        .await
        .unwrap();
    let instance = store::operation_get(&pool, org, sent.id)
        .await
        .unwrap()
        .unwrap()
        .instance_id
        .unwrap();
    sqlx::query(
        "INSERT INTO operation_tx (operation_id, step, txq_request_id, instance_id, signal_name)
         VALUES ($1, 'create-feed', $2, $3, 'tx.create-feed')",
    )
    .bind(sent.id)
    .bind(request)
    .bind(instance)
    .execute(&pool)
    .await
    .unwrap();
    for table in ["durable_command", "durable_signal"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} DROP COLUMN actor_kind, DROP COLUMN actor_id,
                DROP COLUMN actor_reason, DROP COLUMN on_behalf_of,
                DROP COLUMN attribution_status"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    for ddl in [
        "ALTER TABLE durable_instance DROP COLUMN version",
        "DROP TABLE durable_runner_version",
        "DROP TABLE durable_history",
        "DROP FUNCTION durable_history_append_only()",
        "ALTER TABLE durable_instance DROP COLUMN history_seq, DROP COLUMN history_state,
            DROP COLUMN history_journal",
        "ALTER TABLE api_key DROP COLUMN issued_to",
        "ALTER TABLE durable_instance DROP COLUMN trace_context",
        "ALTER TABLE txq_request DROP COLUMN trace_context",
        "ALTER TABLE asset_template DROP COLUMN sender_vault, DROP COLUMN sender_address",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }

    keel_store::migrate(&pool).await.unwrap();

    let issuer = |asset| {
        let pool = pool.clone();
        async move {
            store::asset_get(&pool, org, asset)
                .await
                .unwrap()
                .unwrap()
                .issuer_address
        }
    };
    assert_eq!(issuer(sent.asset_id.unwrap()).await, Some(sender.to_vec()));
    assert_eq!(issuer(unsent.asset_id.unwrap()).await, None);
    let view = ops
        .asset(
            caller,
            sent.asset_id.unwrap(),
            None,
            std::time::Duration::ZERO,
        )
        .await
        .unwrap();
    assert_eq!(view.issuer_address, Some(sender));
    assert!(view.created_at <= view.updated_at);
}
