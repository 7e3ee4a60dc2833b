//! The store functions on their own: uniqueness, guarded updates, the write guard.

use crate::common::{Env, new_asset, op_request, queue};
use keel_workflows::store::{self, NewOperationRow, NewOperationTxRow};
use std::time::Duration;
use uuid::Uuid;

/// An asset of organization A to hang operations on.
async fn asset(env: &Env) -> Uuid {
    env.ops
        .create_asset(env.caller, "asset", &new_asset("Alpha"))
        .await
        .unwrap()
        .operation
        .asset_id
        .unwrap()
}

fn operation<'a>(env: &Env, asset_id: Uuid, key: &'a str, hash: &'a [u8]) -> NewOperationRow<'a> {
    NewOperationRow {
        id: Uuid::new_v4(),
        organization_id: env.caller.organization_id,
        kind: keel_workflows::OperationKind::AssetPause,
        asset_id: Some(asset_id),
        idempotency_key: key,
        request_sha256: hash,
        api_key_id: env.caller.api_key_id,
    }
}

/// One operation per (organization, idempotency key): a second insert writes nothing
/// and the key still names the first; another organization has its own keys.
#[tokio::test]
async fn operations_are_unique_by_organization_and_key() {
    let env = Env::new().await;
    let asset_id = asset(&env).await;
    let first = operation(&env, asset_id, "k", &[1; 32]);
    assert!(store::operation_insert(env.pool(), &first).await.unwrap());
    let again = operation(&env, asset_id, "k", &[2; 32]);
    assert!(!store::operation_insert(env.pool(), &again).await.unwrap());
    let held = store::operation_by_key(env.pool(), env.caller.organization_id, "k")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.id, first.id);
    assert_eq!(held.request_sha256, vec![1; 32]);
    assert_eq!(held.instance_id, None);
    assert_eq!(
        store::operation_get(env.pool(), env.stranger.organization_id, first.id)
            .await
            .unwrap(),
        None,
        "another organization does not see it"
    );
    // Organization B's key space is its own (its asset is A's here: the table checks
    // only that the asset exists).
    let mut other = operation(&env, asset_id, "k", &[3; 32]);
    other.organization_id = env.stranger.organization_id;
    other.api_key_id = env.stranger.api_key_id;
    assert!(store::operation_insert(env.pool(), &other).await.unwrap());
}

/// The instance is recorded once; the cancel instant is set once; retries only grow.
#[tokio::test]
async fn guarded_updates_keep_their_first_value() {
    let env = Env::new().await;
    let asset_id = asset(&env).await;
    let row = operation(&env, asset_id, "k", &[1; 32]);
    store::operation_insert(env.pool(), &row).await.unwrap();
    let (i1, i2) = (Uuid::new_v4(), Uuid::new_v4());
    assert!(
        store::operation_instance_set(env.pool(), row.id, i1)
            .await
            .unwrap()
    );
    assert!(
        !store::operation_instance_set(env.pool(), row.id, i2)
            .await
            .unwrap()
    );
    assert_eq!(
        store::operation_id_by_instance(env.pool(), i1)
            .await
            .unwrap(),
        Some(row.id)
    );
    assert_eq!(
        store::operation_id_by_instance(env.pool(), i2)
            .await
            .unwrap(),
        None
    );

    store::operation_cancel_request(env.pool(), row.id)
        .await
        .unwrap();
    let get = || store::operation_get(env.pool(), env.caller.organization_id, row.id);
    let first = get().await.unwrap().unwrap().cancel_requested_at.unwrap();
    store::operation_cancel_request(env.pool(), row.id)
        .await
        .unwrap();
    assert_eq!(
        get().await.unwrap().unwrap().cancel_requested_at,
        Some(first)
    );

    assert_eq!(
        store::operation_retries_get(env.pool(), row.id)
            .await
            .unwrap(),
        Some(0)
    );
    store::operation_retries_increment(env.pool(), row.id)
        .await
        .unwrap();
    store::operation_retries_increment(env.pool(), row.id)
        .await
        .unwrap();
    assert_eq!(
        store::operation_retries_get(env.pool(), row.id)
            .await
            .unwrap(),
        Some(2)
    );
    assert_eq!(
        store::operation_retries_get(env.pool(), Uuid::new_v4())
            .await
            .unwrap(),
        None
    );
    let caller = store::operation_caller(env.pool(), row.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(caller.organization_id, env.caller.organization_id);
    assert_eq!(caller.api_key_id, env.caller.api_key_id);
}

/// The write guard holds the row lock until it commits, and refuses once a cancel was
/// recorded; an operation without a row is never refused.
#[tokio::test]
async fn the_write_guard_refuses_after_a_cancel() {
    let env = Env::new().await;
    let asset_id = asset(&env).await;
    let row = operation(&env, asset_id, "k", &[1; 32]);
    store::operation_insert(env.pool(), &row).await.unwrap();

    let guard = store::operation_write_guard(env.pool(), row.id)
        .await
        .unwrap();
    let guard = guard.expect("no cancel yet: the guard is granted");
    // A cancel now waits for the guard's lock.
    let pool = env.pool().clone();
    let id = row.id;
    let cancel = tokio::spawn(async move { store::operation_cancel_request(&pool, id).await });
    wait_for_lock_waiter(env.pool()).await;
    assert!(!cancel.is_finished(), "the cancel waits for the guard");
    guard.commit().await.unwrap();
    cancel.await.unwrap().unwrap();

    assert!(
        store::operation_write_guard(env.pool(), row.id)
            .await
            .unwrap()
            .is_none(),
        "after a cancel nothing may be queued"
    );
    let unknown = store::operation_write_guard(env.pool(), Uuid::new_v4())
        .await
        .unwrap();
    assert!(
        unknown.is_some(),
        "a workflow without an operation row is not guarded"
    );
}

/// Probes `pg_stat_activity` until a backend of this database waits for a lock.
async fn wait_for_lock_waiter(db: &sqlx::PgPool) {
    keel_store::testing::until_sql(
        db,
        "a backend waiting for the lock",
        Duration::from_secs(30),
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                         WHERE datname = current_database() AND wait_event_type = 'Lock')",
    )
    .await;
}

/// A link is written once per (operation, link); the owner lookup is scoped to the
/// organization.
#[tokio::test]
async fn links_are_idempotent_and_scoped_to_their_organization() {
    let env = Env::new().await;
    let accepted = env
        .ops
        .create_asset(env.caller, "asset", &new_asset("Alpha"))
        .await
        .unwrap();
    let op = accepted.operation.id;
    let q = queue(&env, 31337, "http://127.0.0.1:1");
    let sender = alloy::primitives::Address::repeat_byte(9);
    let r1 = q
        .enqueue(&op_request(sender, op, "create-feed"))
        .await
        .unwrap();
    let r2 = q.enqueue(&op_request(sender, op, "other")).await.unwrap();
    let instance = Uuid::new_v4();
    let link = |id| NewOperationTxRow {
        operation_id: op,
        link: "create-feed",
        txq_request_id: id,
        instance_id: instance,
        signal_name: "tx.create-feed",
    };
    store::operation_tx_insert(env.pool(), &link(r1))
        .await
        .unwrap();
    store::operation_tx_insert(env.pool(), &link(r2))
        .await
        .unwrap();
    let links = store::operation_tx_links(env.pool(), op).await.unwrap();
    assert_eq!(links.len(), 1, "the first link stays");
    assert_eq!(links[0].link, "create-feed");
    assert_eq!(links[0].txq_request_id, r1);

    let mine = store::operation_tx_owned(env.pool(), env.caller.organization_id, &[r1, r2])
        .await
        .unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0].txq_request_id, mine[0].operation_id), (r1, op));
    assert_eq!(mine[0].link, "create-feed");
    let theirs = store::operation_tx_owned(env.pool(), env.stranger.organization_id, &[r1])
        .await
        .unwrap();
    assert!(theirs.is_empty());
}

/// Tenancy rows: an API key authenticates its caller until revoked; a template reads
/// back as written.
#[tokio::test]
async fn keys_and_templates_read_back() {
    let env = Env::new().await;
    let key = keel_workflows::tenancy::create_api_key(env.pool(), env.caller.organization_id, "x")
        .await
        .unwrap();
    let caller = env.ops.authenticate(&key.token).await.unwrap();
    assert_eq!(caller.api_key_id, key.id);
    assert_eq!(caller.organization_id, env.caller.organization_id);
    sqlx::query("UPDATE api_key SET revoked_at = now() WHERE id = $1")
        .bind(key.id)
        .execute(env.pool())
        .await
        .unwrap();
    assert_eq!(
        env.ops.authenticate(&key.token).await.unwrap_err().code(),
        "UNAUTHENTICATED"
    );
    let t = keel_workflows::tenancy::template(
        env.pool(),
        env.caller.organization_id,
        crate::common::TEMPLATE,
    )
    .await
    .unwrap();
    assert_eq!(t, crate::common::template(31337));
}
