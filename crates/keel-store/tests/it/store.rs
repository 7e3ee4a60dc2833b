//! keel-store against a real PostgreSQL: migrations, per-test databases, and the
//! transient/permanent classification of real server failures.

use keel_store::platform::{PlatformContract, platform_contract_list, platform_contract_upsert};
use keel_store::testing::TestDatabase;
use keel_store::{StoreError, TransientKind};
use sqlx::{Connection, Executor, PgConnection};

async fn db() -> TestDatabase {
    TestDatabase::create().await.expect("test database")
}

fn contract(name: &str, byte: u8) -> PlatformContract {
    PlatformContract {
        chain_id: 31337,
        name: name.to_owned(),
        address: vec![byte; 20],
        deploy_tx_hash: Some(vec![0xab; 32]),
        deployed_block: Some(7),
    }
}

#[tokio::test]
async fn migrations_apply_and_are_idempotent() {
    let db = db().await;
    // Created already migrated; a second run is a no-op, not an error.
    keel_store::migrate(db.pool()).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(applied as usize, keel_store::MIGRATOR.iter().count());
}

#[tokio::test]
async fn test_databases_are_isolated() {
    let a = db().await;
    let b = db().await;
    assert_ne!(a.name(), b.name());
    platform_contract_upsert(a.pool(), &contract("directory", 1))
        .await
        .unwrap();
    assert_eq!(
        platform_contract_list(a.pool(), 31337).await.unwrap().len(),
        1
    );
    assert!(
        platform_contract_list(b.pool(), 31337)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn dropped_test_database_is_removed() {
    let db = db().await;
    let name = db.name().to_owned();
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| keel_store::testing::DEFAULT_ADMIN_URL.to_owned());
    drop(db);
    let mut conn = PgConnection::connect(&admin_url).await.unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(!exists, "database should be dropped with its TestDatabase");
}

#[tokio::test]
async fn upsert_reports_changes_only() {
    let db = db().await;
    assert!(
        platform_contract_upsert(db.pool(), &contract("directory", 1))
            .await
            .unwrap()
    );
    assert!(
        !platform_contract_upsert(db.pool(), &contract("directory", 1))
            .await
            .unwrap()
    );
    assert!(
        platform_contract_upsert(db.pool(), &contract("directory", 2))
            .await
            .unwrap()
    );
    let rows = platform_contract_list(db.pool(), 31337).await.unwrap();
    assert_eq!(rows, vec![contract("directory", 2)]);
}

#[tokio::test]
async fn check_violation_is_permanent_and_value_free() {
    let db = db().await;
    let mut bad = contract("directory", 1);
    bad.address = b"secret-payload-value".repeat(2);
    let err = platform_contract_upsert(db.pool(), &bad).await.unwrap_err();
    assert!(!err.is_retryable());
    assert_eq!(err.sqlstate(), Some("23514"));
    let text = format!("{err} {err:?}");
    assert!(!text.contains("secret"), "{text}");
    assert!(!text.to_lowercase().contains("insert"), "{text}");
}

#[tokio::test]
async fn unique_violation_names_constraint_not_value() {
    let db = db().await;
    db.pool()
        .execute("CREATE TABLE t (k TEXT CONSTRAINT t_k_key UNIQUE)")
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES ($1)")
        .bind("customer-secret-42")
        .execute(db.pool())
        .await
        .unwrap();
    let err: StoreError = sqlx::query("INSERT INTO t VALUES ($1)")
        .bind("customer-secret-42")
        .execute(db.pool())
        .await
        .unwrap_err()
        .into();
    assert!(matches!(&err, StoreError::UniqueViolation { constraint } if constraint == "t_k_key"));
    let text = format!("{err} {err:?}");
    assert!(!text.contains("customer-secret-42"), "{text}");
    assert!(!text.contains("INSERT"), "{text}");
}

#[tokio::test]
async fn lock_timeout_is_retryable() {
    let db = db().await;
    db.pool()
        .execute("CREATE TABLE l (id INT PRIMARY KEY)")
        .await
        .unwrap();
    db.pool().execute("INSERT INTO l VALUES (1)").await.unwrap();
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM l WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut waiter = db.pool().begin().await.unwrap();
    waiter
        .execute("SET LOCAL lock_timeout = '50ms'")
        .await
        .unwrap();
    let err: StoreError = sqlx::query("SELECT id FROM l WHERE id = 1 FOR UPDATE")
        .execute(&mut *waiter)
        .await
        .unwrap_err()
        .into();
    assert!(
        matches!(
            err,
            StoreError::Transient {
                kind: TransientKind::LockTimeout,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.sqlstate(), Some("55P03"));
}

#[tokio::test]
async fn serialization_failure_is_retryable() {
    let db = db().await;
    db.pool()
        .execute("CREATE TABLE s (id INT PRIMARY KEY, v INT)")
        .await
        .unwrap();
    db.pool()
        .execute("INSERT INTO s VALUES (1, 0)")
        .await
        .unwrap();
    let mut a = db.pool().begin().await.unwrap();
    let mut b = db.pool().begin().await.unwrap();
    a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    b.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    // Both take their snapshot, then a updates and commits; b's update of the same row
    // must fail with 40001.
    a.execute("SELECT v FROM s").await.unwrap();
    b.execute("SELECT v FROM s").await.unwrap();
    a.execute("UPDATE s SET v = 1 WHERE id = 1").await.unwrap();
    a.commit().await.unwrap();
    let err: StoreError = b
        .execute("UPDATE s SET v = 2 WHERE id = 1")
        .await
        .unwrap_err()
        .into();
    assert!(
        matches!(
            err,
            StoreError::Transient {
                kind: TransientKind::SerializationFailure,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn deadlock_is_retryable() {
    let db = db().await;
    db.pool()
        .execute("CREATE TABLE d (id INT PRIMARY KEY)")
        .await
        .unwrap();
    db.pool()
        .execute("INSERT INTO d VALUES (1), (2)")
        .await
        .unwrap();
    let mut a = db.pool().begin().await.unwrap();
    let mut b = db.pool().begin().await.unwrap();
    a.execute("SELECT 1 FROM d WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    b.execute("SELECT 1 FROM d WHERE id = 2 FOR UPDATE")
        .await
        .unwrap();
    // Each now asks for the other's row; PostgreSQL's deadlock detector (deadlock_timeout,
    // default 1 s) aborts one of them with 40P01.
    let fa = a.execute("SELECT 1 FROM d WHERE id = 2 FOR UPDATE");
    let fb = b.execute("SELECT 1 FROM d WHERE id = 1 FOR UPDATE");
    let (ra, rb) = tokio::join!(fa, fb);
    let errors: Vec<StoreError> = [ra.err(), rb.err()]
        .into_iter()
        .flatten()
        .map(Into::into)
        .collect();
    assert_eq!(errors.len(), 1, "exactly one side is chosen as the victim");
    assert!(
        matches!(
            errors[0],
            StoreError::Transient {
                kind: TransientKind::Deadlock,
                ..
            }
        ),
        "{:?}",
        errors[0]
    );
}

#[tokio::test]
async fn terminated_session_is_retryable() {
    let db = db().await;
    let mut victim = PgConnection::connect(db.url()).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut victim)
        .await
        .unwrap();
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(terminated);
    let err: StoreError = sqlx::query("SELECT 1")
        .execute(&mut victim)
        .await
        .unwrap_err()
        .into();
    // The server reports 57P01 before closing, or the client only sees the closed
    // socket; both are transient.
    assert!(err.is_retryable(), "{err:?}");
    if let Some(state) = err.sqlstate() {
        assert_eq!(state, "57P01");
    }
}

#[tokio::test]
async fn too_many_connections_is_retryable() {
    let db = db().await;
    let role = format!("{}_limited", db.name());
    db.pool()
        .execute(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"
        )))
        .await
        .unwrap();
    let url = db
        .url()
        .replacen("postgres://postgres", &format!("postgres://{role}"), 1);
    let err: StoreError = PgConnection::connect(&url).await.unwrap_err().into();
    db.pool()
        .execute(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .await
        .unwrap();
    assert!(
        matches!(
            err,
            StoreError::Transient {
                kind: TransientKind::TooManyConnections,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn unreachable_server_is_retryable() {
    // Port 1 on loopback: nothing listens, the connect fails at once.
    let mut cfg = keel_store::StoreConfig::new("postgres://postgres@127.0.0.1:1/keel");
    cfg.acquire_timeout_ms = 2_000;
    let err = keel_store::connect(&cfg).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

#[test]
fn sqlstate_table() {
    for (code, kind) in [
        ("40001", TransientKind::SerializationFailure),
        ("40P01", TransientKind::Deadlock),
        ("55P03", TransientKind::LockTimeout),
        ("57P01", TransientKind::AdminShutdown),
        ("57P02", TransientKind::AdminShutdown),
        ("57P03", TransientKind::AdminShutdown),
        ("53300", TransientKind::TooManyConnections),
        ("08006", TransientKind::ConnectionLost),
    ] {
        let err = StoreError::from_sqlstate(code, None);
        assert!(
            matches!(err, StoreError::Transient { kind: k, .. } if k == kind),
            "{code}"
        );
    }
    for code in ["23502", "23503", "42601", "42P01", "22003"] {
        assert!(
            !StoreError::from_sqlstate(code, None).is_retryable(),
            "{code}"
        );
    }
}
