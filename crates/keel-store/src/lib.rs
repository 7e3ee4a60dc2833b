//! # keel-store
//!
//! Keel's PostgreSQL data plane, at its lowest level:
//!
//! - [`StoreConfig`] and [`connect`]: a connection pool built from configuration;
//! - [`MIGRATOR`] and [`migrate`]: the SQL migrations in the workspace's `migrations/`
//!   folder, embedded into the binary at compile time (`keel migrate` and every test run
//!   them);
//! - [`StoreError`]: PostgreSQL failures classified as **transient** (worth a retry:
//!   connection loss, serialization failure, deadlock, lock timeout, administrator
//!   shutdown, too many connections) or **permanent**, with messages that never carry
//!   SQL text, bind parameters or column values;
//! - `testing` (feature `testing`): a fresh database per test with migrations applied,
//!   so tests run in parallel against a real server.
//!
//! Query functions of higher crates take `impl sqlx::PgExecutor` so a caller's
//! transaction can include them, and map their errors through [`StoreError::from`].
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
pub mod group_commit;
pub mod platform;
#[cfg(feature = "testing")]
pub mod testing;
mod text_column;

use std::time::Duration;

pub use error::{Result, StoreError, TransientKind};
pub use sqlx::{PgPool, Postgres, Transaction};
pub use text_column::UnknownStoredValue;

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;

/// The migrations in the workspace's `migrations/` folder (sqlx format,
/// `NNNN_name.sql`), embedded at compile time. Applied migrations are never edited;
/// schema changes are new, additive files.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Connection-pool settings (`[database]` in Keel's configuration).
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoreConfig {
    /// PostgreSQL URL, `postgres://user[:password]@host:port/database`. May carry a
    /// password: print it only through [`StoreConfig::redacted_url`].
    pub url: String,
    /// Upper bound of pooled connections (default 10).
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How long, in milliseconds, a caller waits for a free pooled connection before
    /// [`StoreError::Transient`] with [`TransientKind::PoolTimeout`] (default 5000).
    #[serde(default = "default_acquire_timeout_ms")]
    pub acquire_timeout_ms: u64,
}

fn default_max_connections() -> u32 {
    10
}
fn default_acquire_timeout_ms() -> u64 {
    5_000
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.redacted_url())
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .finish()
    }
}

impl StoreConfig {
    /// A configuration for `url` with default pool bounds.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: default_max_connections(),
            acquire_timeout_ms: default_acquire_timeout_ms(),
        }
    }

    /// The URL with any password replaced by `***`, safe for logs and `keel config print`.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Checks the settings without connecting.
    ///
    /// # Errors
    /// [`StoreError::Config`] naming the offending key (`database.url`,
    /// `database.maxConnections`, `database.acquireTimeoutMs`).
    pub fn validate(&self) -> Result<()> {
        let scheme_ok =
            self.url.starts_with("postgres://") || self.url.starts_with("postgresql://");
        if !scheme_ok || PgConnectOptions::from_str(&self.url).is_err() {
            return Err(StoreError::Config {
                key: "database.url",
                reason: "not a valid postgres:// URL",
            });
        }
        if self.max_connections == 0 {
            return Err(StoreError::Config {
                key: "database.maxConnections",
                reason: "must be at least 1",
            });
        }
        if self.acquire_timeout_ms == 0 {
            return Err(StoreError::Config {
                key: "database.acquireTimeoutMs",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }
}

/// Replaces the password of a `scheme://user:password@host/...` URL with `***`.
/// Strings that are not URLs with credentials are returned unchanged.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.find('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}://{}:***@{}",
            &url[..scheme_end],
            &userinfo[..colon],
            &rest[at + 1..]
        ),
        None => url.to_owned(),
    }
}

/// Opens a pool to the configured database (lazily: the first connection is made by
/// the first query, so a server that is still starting is not a startup failure) and
/// checks one connection.
///
/// # Errors
/// [`StoreError::Config`] for a malformed URL; a transient [`StoreError`] when the
/// server cannot be reached within `acquireTimeoutMs`.
pub async fn connect(config: &StoreConfig) -> Result<PgPool> {
    config.validate()?;
    let options = PgConnectOptions::from_str(&config.url).map_err(|_| StoreError::Config {
        key: "database.url",
        reason: "not a valid postgres:// URL",
    })?;
    let pool = PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(Duration::from_millis(config.acquire_timeout_ms))
        .connect_with(options)
        .await?;
    Ok(pool)
}

/// Applies every pending migration of [`MIGRATOR`] (idempotent; concurrent callers
/// serialize on sqlx's migration lock).
///
/// # Errors
/// [`StoreError::Migration`] when a migration fails or an applied migration's checksum
/// differs from the embedded file (an applied migration was edited).
pub async fn migrate(pool: &PgPool) -> Result<()> {
    MIGRATOR.run(pool).await.map_err(StoreError::from_migrate)
}

/// The embedded migrations of [`MIGRATOR`] not yet applied to `db`, in order, as
/// `(version, description)`; every one before the first migration ran (no
/// `_sqlx_migrations` table yet).
///
/// # Errors
/// [`StoreError`] when the database cannot be read.
pub async fn pending_migrations(pool: &PgPool) -> Result<Vec<(i64, String)>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    let applied: Vec<i64> = if exists {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?
    } else {
        Vec::new()
    };
    Ok(MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
        .map(|m| (m.version, m.description.to_string()))
        .collect())
}

/// [`migrate`], one migration at a time: `before(version, description)` is called
/// before each pending one is applied (a progress report), in order. Same result and
/// errors as [`migrate`].
///
/// # Errors
/// As [`migrate`], and [`StoreError`] when the applied migrations cannot be read.
pub async fn migrate_each(pool: &PgPool, mut before: impl FnMut(i64, &str)) -> Result<()> {
    for (version, description) in pending_migrations(pool).await? {
        before(version, &description);
        MIGRATOR
            .run_to(version, pool)
            .await
            .map_err(StoreError::from_migrate)?;
    }
    migrate(pool).await
}

/// Whether every embedded migration of [`MIGRATOR`] is applied to `db` with the same
/// version and checksum (readiness: a server must not serve a schema it was not built
/// for). `Ok(false)` when one is missing, failed or was applied with another checksum.
///
/// # Errors
/// [`StoreError`] when `_sqlx_migrations` cannot be read (including before the first
/// migration created it).
pub async fn migrations_applied(db: impl sqlx::PgExecutor<'_>) -> Result<bool> {
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success")
            .fetch_all(db)
            .await?;
    Ok(MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .all(|m| {
            applied.iter().any(|(version, checksum)| {
                *version == m.version && checksum.as_slice() == &*m.checksum
            })
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_password_only() {
        assert_eq!(
            redact_url("postgres://keel:s3cret@db:5432/keel"),
            "postgres://keel:***@db:5432/keel"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/keel"),
            "postgres://postgres@127.0.0.1:5432/keel"
        );
        let cfg = StoreConfig::new("postgres://u:hunter2@h/d");
        assert!(!format!("{cfg:?}").contains("hunter2"));
    }

    #[test]
    fn validation_names_the_key() {
        let err = StoreConfig::new("mysql:/nope").validate().unwrap_err();
        assert!(matches!(
            err,
            StoreError::Config {
                key: "database.url",
                ..
            }
        ));
        let mut cfg = StoreConfig::new("postgres://postgres@127.0.0.1/keel");
        cfg.max_connections = 0;
        assert!(matches!(
            cfg.validate(),
            Err(StoreError::Config {
                key: "database.maxConnections",
                ..
            })
        ));
    }
}
