//! Verdicts pushed in the settling transaction ([`keel_workflows::VerdictSink`]): a
//! request enqueued with its link in one transaction reaches its instance as the signal
//! `tx.<link>` exactly once, whatever the verdict; requests no operation made are left
//! alone; and a database upgraded with verdicts the old relay had not delivered gets
//! them delivered by the migration.

use crate::common::{Env, new_asset, op_request, queue};
use anvil_tests::TestChain;
use keel_txq::{EnqueueOptions, LocalSigner, SettlementVerdict, TxQueue};
use keel_workflows::VerdictSink;
use keel_workflows::store::{self, NewOperationTxRow};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The signals recorded for `instance` under the dedupe key `request` (name, payload).
async fn signals(pool: &sqlx::PgPool, instance: Uuid, request: Uuid) -> Vec<(String, Value)> {
    sqlx::query_as(
        "SELECT name, payload FROM durable_signal WHERE instance_id = $1 AND dedupe_key = $2",
    )
    .bind(instance)
    .bind(request.to_string())
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Enqueues `write` of operation `op` and links it in one transaction, as the workflows'
/// enqueue step does.
async fn enqueue_linked(
    env: &Env,
    q: &TxQueue,
    op: Uuid,
    instance: Uuid,
    write: &str,
    req: keel_txq::TxRequest,
) -> Uuid {
    let mut tx = env.pool().begin().await.unwrap();
    let id = q
        .enqueue_in(&mut tx, &req, &EnqueueOptions::default())
        .await
        .unwrap();
    store::operation_tx_insert(
        &mut *tx,
        &NewOperationTxRow {
            operation_id: op,
            link: write,
            txq_request_id: id,
            instance_id: instance,
            signal_name: &format!("tx.{write}"),
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    id
}

async fn settle(q: &TxQueue, request: Uuid) -> SettlementVerdict {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        q.tick().await.unwrap();
        if let Some(v) = q.status(request).await.unwrap().verdict {
            return v;
        }
        assert!(Instant::now() < deadline, "the request did not settle");
        q.confirm_pass().await.unwrap();
    }
}

/// A confirmed request and one whose gas estimation reverts (settled before it was
/// signed, in the round right after the enqueue) both reach their instance, once each,
/// carrying the stored verdict; a request without a link settles and signals nothing.
#[tokio::test]
async fn every_verdict_reaches_its_instance_once_in_the_settling_transaction() {
    let chain = TestChain::start().await.unwrap();
    let env = Env::on_chain(chain.chain_id()).await;
    let accepted = env
        .ops
        .create_asset(env.caller, "k", &new_asset("Alpha"))
        .await
        .unwrap();
    let op = accepted.operation.id;
    let row = store::operation_get(env.pool(), env.caller.organization_id, op)
        .await
        .unwrap()
        .unwrap();
    let instance = row.instance_id.unwrap();
    let mut q = queue(&env, chain.chain_id(), chain.endpoint().as_str());
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(0).unwrap().clone())));
    q.add_signer(Arc::new(LocalSigner::new(chain.signer(1).unwrap().clone())));
    q.set_settlement_sink(Arc::new(VerdictSink::new(env.engine.clone())));
    let sender = chain.account(0).unwrap();

    let landed = enqueue_linked(
        &env,
        &q,
        op,
        instance,
        "create-feed",
        op_request(sender, op, "create-feed"),
    )
    .await;
    // A value no account can pay: refused before signing (no nonce used), i.e. settled
    // in the first round after the enqueue.
    let mut broke = op_request(chain.account(1).unwrap(), op, "create-token");
    broke.value = keel_units::Wei::new(alloy::primitives::U256::MAX);
    let refused = enqueue_linked(&env, &q, op, instance, "create-token", broke).await;
    let unlinked = q
        .enqueue(&op_request(sender, Uuid::new_v4(), "other"))
        .await
        .unwrap();

    let confirmed = settle(&q, landed).await;
    assert!(
        matches!(confirmed, SettlementVerdict::Confirmed { .. }),
        "{confirmed:?}"
    );
    let failed = settle(&q, refused).await;
    assert!(
        matches!(failed, SettlementVerdict::Failed { .. }),
        "{failed:?}"
    );
    settle(&q, unlinked).await;

    for (request, name, verdict) in [
        (landed, "tx.create-feed", &confirmed),
        (refused, "tx.create-token", &failed),
    ] {
        let got = signals(env.pool(), instance, request).await;
        assert_eq!(got.len(), 1, "{name}: exactly one signal");
        assert_eq!(got[0].0, name);
        assert_eq!(got[0].1, serde_json::to_value(verdict).unwrap());
    }
    // Issue 32 §6: the verdict's signal is attributed to what records it now, the
    // queue's settlement (the polling relay is gone).
    let attribution = env.engine.attribution(instance).await.unwrap();
    for request in [landed, refused] {
        let signal = attribution.signal(&request.to_string()).unwrap();
        assert_eq!(signal.actor.reason(), Some("settlement"), "{signal:?}");
    }
    let stray: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_signal WHERE dedupe_key = $1")
            .bind(unlinked.to_string())
            .fetch_one(env.pool())
            .await
            .unwrap();
    assert_eq!(stray, 0, "a request no operation made signals nothing");
    // Signalling again under the request id is a duplicate: the sink's signal is the one.
    let again = env
        .engine
        .signal(instance, "tx.create-feed", &landed.to_string(), &confirmed)
        .await
        .unwrap();
    assert_eq!(again, keel_durable::SignalReceipt::Duplicate);
}

/// A database that ran the polling relay: a settled verdict it had not delivered yet
/// (`delivered_at` NULL) becomes the instance's signal (with its SIGNAL command) when
/// migration 0022 runs; a delivered one and one of an ended instance do not.
#[tokio::test]
async fn the_upgrade_delivers_what_the_relay_had_not() {
    let db = keel_store::testing::TestDatabase::create_at(21)
        .await
        .unwrap();
    let pool = db.pool().clone();
    let org = keel_workflows::tenancy::create_organization(&pool, "o")
        .await
        .unwrap();
    let key = keel_workflows::tenancy::create_api_key(&pool, org, "k")
        .await
        .unwrap();
    // The template as the schema of 0021 holds it (today's upsert also stamps
    // `updated_at`, a column of 0023).
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
    // issued to, which it reads for a command's actor (0057, as it is), the custody
    // attempts a withdrawal locks (0040, as it is), and a template's sender, which it
    // reads with the template (0059, as it is).
    for migration in [
        include_str!("../../../../migrations/0040_txq_custody.sql"),
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
    let ops = keel_workflows::Ops::new(pool.clone(), engine.clone());
    let caller = keel_workflows::Caller {
        organization_id: org,
        api_key_id: key.id,
    };
    let mut instances = Vec::new();
    for name in ["Pending", "Delivered", "Ended"] {
        let a = ops
            .create_asset(caller, name, &new_asset(name))
            .await
            .unwrap();
        let row = store::operation_get(&pool, org, a.operation.id)
            .await
            .unwrap()
            .unwrap();
        instances.push((a.operation.id, row.instance_id.unwrap()));
    }
    // Requests settled without a sink (as before this release), then linked.
    let chain = keel_units::ChainId(31337);
    let node = keel_chain::UpstreamPool::new(
        chain,
        keel_chain::UpstreamConfig::new(vec!["http://127.0.0.1:9".to_owned()]),
    )
    .unwrap();
    let q = TxQueue::new(
        pool.clone(),
        Arc::new(node),
        keel_txq::TxQueueConfig::default(),
    )
    .unwrap();
    let mut requests = Vec::new();
    for (op, instance) in &instances {
        let sender = alloy::primitives::Address::repeat_byte(0x11);
        let id = q
            .enqueue(&op_request(sender, *op, "create-feed"))
            .await
            .unwrap();
        keel_txq::withdraw_by_key_prefix(&pool, chain, &format!("op/{op}/"), None)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO operation_tx (operation_id, step, txq_request_id, instance_id, signal_name)
             VALUES ($1, 'create-feed', $2, $3, 'tx.create-feed')",
        )
        .bind(op)
        .bind(id)
        .bind(instance)
        .execute(&pool)
        .await
        .unwrap();
        requests.push(id);
    }
    sqlx::query("UPDATE operation_tx SET delivered_at = now() WHERE txq_request_id = $1")
        .bind(requests[1])
        .execute(&pool)
        .await
        .unwrap();
    engine.cancel(instances[2].1).await.unwrap();

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
        "ALTER TABLE asset_template DROP COLUMN sender_vault, DROP COLUMN sender_address",
        "DROP TABLE txq_custody_attempt",
        "ALTER TABLE durable_instance DROP COLUMN trace_context",
        "ALTER TABLE txq_request DROP COLUMN trace_context",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    keel_store::migrate(&pool).await.unwrap();

    let pending = signals(&pool, instances[0].1, requests[0]).await;
    assert_eq!(pending.len(), 1, "the undelivered verdict is delivered");
    assert_eq!(pending[0].0, "tx.create-feed");
    let verdict: SettlementVerdict = serde_json::from_value(pending[0].1.clone()).unwrap();
    assert!(
        matches!(verdict, SettlementVerdict::Failed { ref code, .. } if *code == keel_txq::FailureCode::Withdrawn),
        "{verdict:?}"
    );
    let commands: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM durable_command WHERE instance_id = $1 AND kind = 'signal' AND state = 'queued'",
    )
    .bind(instances[0].1)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(commands, 1, "a SIGNAL command wakes the instance");
    assert!(
        signals(&pool, instances[1].1, requests[1]).await.is_empty(),
        "delivered before"
    );
    assert!(
        signals(&pool, instances[2].1, requests[2]).await.is_empty(),
        "instance ended"
    );
    // The engine accounts for the signal: a duplicate under the same key is refused.
    let again = engine
        .signal(
            instances[0].1,
            "tx.create-feed",
            &requests[0].to_string(),
            &verdict,
        )
        .await
        .unwrap();
    assert_eq!(again, keel_durable::SignalReceipt::Duplicate);
}
