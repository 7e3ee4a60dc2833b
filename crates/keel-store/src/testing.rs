//! Per-test databases (feature `testing`).
//!
//! [`TestDatabase::create`] makes a database with a unique name on the server named by
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`), applies
//! [`crate::MIGRATOR`], and drops the database (`WITH (FORCE)`) when the value is
//! dropped, so tests run in parallel without seeing each other's rows.
//!
//! [`until`] is the one "poll until a condition holds, within a bound" of the tests of
//! every crate (they all have this module as a dev-dependency), and [`until_sql`] its
//! form for a boolean query.

use crate::{PgPool, Result, StoreConfig, StoreError};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

// Database names below are generated (`keel_test_` + a UUID's hex), never caller input,
// so the dynamic SQL is safe.
use std::str::FromStr;

/// The admin URL used when `DATABASE_URL` is not set.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A fresh, migrated database that is dropped with this value.
pub struct TestDatabase {
    name: String,
    admin: PgConnectOptions,
    url: String,
    pool: PgPool,
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .finish()
    }
}

impl TestDatabase {
    /// Creates `keel_test_<uuid>` and applies the migrations.
    ///
    /// # Errors
    /// Any [`StoreError`] from connecting, creating or migrating.
    pub async fn create() -> Result<Self> {
        let db = Self::create_empty().await?;
        crate::migrate(&db.pool).await?;
        Ok(db)
    }

    /// Creates `keel_test_<uuid>` with the migrations up to and including `version`
    /// only (an older schema, for upgrade tests; the rest applies with
    /// [`crate::migrate`]).
    ///
    /// # Errors
    /// As [`TestDatabase::create`].
    pub async fn create_at(version: i64) -> Result<Self> {
        let db = Self::create_empty().await?;
        crate::MIGRATOR
            .run_to(version, &db.pool)
            .await
            .map_err(StoreError::from_migrate)?;
        Ok(db)
    }

    /// Creates `keel_test_<uuid>` without applying any migration.
    async fn create_empty() -> Result<Self> {
        let admin_url =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned());
        let admin = PgConnectOptions::from_str(&admin_url).map_err(|_| StoreError::Config {
            key: "DATABASE_URL",
            reason: "not a valid postgres:// URL",
        })?;
        let name = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin.connect().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        let options = admin.clone().database(&name);
        let url = options.to_url_lossy().to_string();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await?;
        Ok(Self {
            name,
            admin,
            url,
            pool,
        })
    }

    /// A pool on the test database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database's URL (for a second pool, or a child process under test).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A [`StoreConfig`] for this database.
    pub fn config(&self) -> StoreConfig {
        StoreConfig::new(self.url.clone())
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = std::mem::take(&mut self.name);
        // Drop runs outside any async context guarantee: use a private runtime on a
        // helper thread and wait for it, so the database is gone when drop returns.
        // `WITH (FORCE)` ends the pool's own sessions (they belong to the test's runtime).
        let handle = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut conn) = admin.connect().await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = handle.join();
    }
}

/// How often [`until`] looks again: short, since a probe is cheap and tests wait on it.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// What a probe of [`until`] answers: whether the awaited condition holds, and the
/// value that goes with it.
///
/// - `bool`: holds when `true` (value `()`);
/// - `Option<T>`: holds when `Some(value)`;
/// - `ControlFlow<T, S>`: holds at `Break(value)`; `Continue(seen)` says what the probe
///   saw instead, and the last such answer is in the failure message;
/// - `Result<P, E>` of one of these: `Err` is no answer, it fails the test at once
///   (panics with the error), so a probe can use `?`-style fallible reads.
pub trait Probe {
    /// The value [`until`] returns once the condition holds.
    type Value;

    /// `Ok(value)` when the condition holds; else `Err` with what was seen instead, when
    /// the probe says (`ControlFlow::Continue`).
    ///
    /// # Panics
    /// For `Result`, on `Err`.
    fn holds(self) -> std::result::Result<Self::Value, Option<String>>;
}

impl Probe for bool {
    type Value = ();

    fn holds(self) -> std::result::Result<(), Option<String>> {
        self.then_some(()).ok_or(None)
    }
}

impl<T> Probe for Option<T> {
    type Value = T;

    fn holds(self) -> std::result::Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, S: std::fmt::Debug> Probe for std::ops::ControlFlow<T, S> {
    type Value = T;

    fn holds(self) -> std::result::Result<T, Option<String>> {
        match self {
            Self::Break(value) => Ok(value),
            Self::Continue(seen) => Err(Some(format!("{seen:?}"))),
        }
    }
}

impl<P: Probe, E: std::fmt::Debug> Probe for std::result::Result<P, E> {
    type Value = P::Value;

    fn holds(self) -> std::result::Result<P::Value, Option<String>> {
        match self {
            Ok(p) => p.holds(),
            Err(e) => panic!("the probe failed: {e:?}"),
        }
    }
}

/// Calls `probe` every [`POLL`] until its answer holds ([`Probe`]) and returns the
/// answer's value — the wait of a test for a condition it cannot be told about, in
/// place of a fixed sleep. The first look is immediate.
///
/// `what` names the condition for the failure message; `within` bounds the wait (the
/// probe's own time included).
///
/// # Panics
/// When `within` has passed and the condition still does not hold ("timed out after
/// {within} waiting for {what}", with the probe's last `ControlFlow::Continue` answer
/// when it gives one), or when a `Result` probe answers `Err`.
///
/// ```no_run
/// # async fn f(pool: &keel_store::PgPool) {
/// use keel_store::testing::until;
/// use std::time::Duration;
/// let n: i64 = until("a row", Duration::from_secs(30), || async {
///     let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(pool).await?;
///     Ok::<_, sqlx::Error>((n > 0).then_some(n))
/// })
/// .await;
/// # }
/// ```
pub async fn until<F, Fut>(
    what: &str,
    within: std::time::Duration,
    mut probe: F,
) -> <Fut::Output as Probe>::Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future,
    Fut::Output: Probe,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let seen = match probe().await.holds() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            match seen {
                Some(seen) => {
                    panic!("timed out after {within:?} waiting for {what}; last seen: {seen}")
                }
                None => panic!("timed out after {within:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`until`] `sql` (a query of one boolean column, one row) answers true on `pool`.
///
/// # Panics
/// As [`until`]; also when the query fails.
pub async fn until_sql(pool: &PgPool, what: &str, within: std::time::Duration, sql: &'static str) {
    until(what, within, || async {
        sqlx::query_scalar::<_, bool>(sql).fetch_one(pool).await
    })
    .await;
}
