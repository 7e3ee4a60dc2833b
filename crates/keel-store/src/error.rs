//! Classification of PostgreSQL failures.

/// Why a transient failure happened; all of them are worth a retry with backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransientKind {
    /// The connection broke or could not be made (I/O, TLS, protocol, closed pool).
    ConnectionLost,
    /// No pooled connection became free within the acquire timeout.
    PoolTimeout,
    /// SQLSTATE 40001 `serialization_failure`.
    SerializationFailure,
    /// SQLSTATE 40P01 `deadlock_detected`.
    Deadlock,
    /// SQLSTATE 55P03 `lock_not_available` (lock_timeout or NOWAIT).
    LockTimeout,
    /// SQLSTATE 57P01 `admin_shutdown`, 57P02 `crash_shutdown`, 57P03 `cannot_connect_now`.
    AdminShutdown,
    /// SQLSTATE 53300 `too_many_connections`.
    TooManyConnections,
}

impl TransientKind {
    /// Stable snake_case label (safe as a metric label: a closed set).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectionLost => "connection_lost",
            Self::PoolTimeout => "pool_timeout",
            Self::SerializationFailure => "serialization_failure",
            Self::Deadlock => "deadlock",
            Self::LockTimeout => "lock_timeout",
            Self::AdminShutdown => "admin_shutdown",
            Self::TooManyConnections => "too_many_connections",
        }
    }
}

/// Errors of the store. Messages are value-free: they carry a SQLSTATE and a class,
/// and the constraint name for integrity violations (schema, not data), never SQL
/// text, bind parameters, column values or the server's own message (which can
/// quote a value, as in `Key (name)=(...) already exists`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A failure a retry can fix.
    #[error("transient database failure ({})", kind.as_str())]
    Transient {
        /// What happened.
        kind: TransientKind,
        /// The SQLSTATE when the server reported one.
        sqlstate: Option<String>,
    },
    /// A unique constraint rejected the write (SQLSTATE 23505).
    #[error("unique constraint violated ({constraint})")]
    UniqueViolation {
        /// The constraint's name, or `unknown`.
        constraint: String,
    },
    /// Any other server-side failure that a retry will not fix (constraint, syntax,
    /// permission, data exception...).
    #[error("database error (sqlstate {sqlstate})")]
    Permanent {
        /// The five-character SQLSTATE.
        sqlstate: String,
    },
    /// A query expected a row and found none.
    #[error("row not found")]
    NotFound,
    /// A row could not be decoded into its Rust type (schema and code disagree).
    #[error("row decoding failed")]
    Decode,
    /// Applying migrations failed (see the log for which version).
    #[error("migration failed: {0}")]
    Migration(&'static str),
    /// The store's configuration is invalid.
    #[error("invalid configuration `{key}`: {reason}")]
    Config {
        /// The configuration key, e.g. `database.url`.
        key: &'static str,
        /// Why it is invalid (never the value itself).
        reason: &'static str,
    },
}

/// `Result` with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// True when retrying the same operation later can succeed (a
    /// [`StoreError::Transient`] failure). Every Keel error type names its retry
    /// predicate `is_retryable`.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    /// The SQLSTATE of a server-reported failure, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Self::Transient { sqlstate, .. } => sqlstate.as_deref(),
            Self::UniqueViolation { .. } => Some("23505"),
            Self::Permanent { sqlstate } => Some(sqlstate),
            _ => None,
        }
    }

    /// Classifies a SQLSTATE reported by the server.
    pub fn from_sqlstate(code: &str, constraint: Option<&str>) -> Self {
        let transient = |kind| Self::Transient {
            kind,
            sqlstate: Some(code.to_owned()),
        };
        match code {
            "40001" => transient(TransientKind::SerializationFailure),
            "40P01" => transient(TransientKind::Deadlock),
            "55P03" => transient(TransientKind::LockTimeout),
            "57P01" | "57P02" | "57P03" => transient(TransientKind::AdminShutdown),
            "53300" => transient(TransientKind::TooManyConnections),
            // Class 08: connection exception.
            c if c.starts_with("08") => transient(TransientKind::ConnectionLost),
            "23505" => Self::UniqueViolation {
                constraint: constraint.unwrap_or("unknown").to_owned(),
            },
            other => Self::Permanent {
                sqlstate: other.to_owned(),
            },
        }
    }

    pub(crate) fn from_migrate(err: sqlx::migrate::MigrateError) -> Self {
        use sqlx::migrate::MigrateError as M;
        tracing::error!(target: "keel::store", error = %err, "migration failed");
        match err {
            M::Execute(e) | M::ExecuteMigration(e, _) => match Self::from(e) {
                t @ Self::Transient { .. } => t,
                _ => Self::Migration("a migration statement failed"),
            },
            M::VersionMismatch(_) => {
                Self::Migration("an applied migration differs from its file (was it edited?)")
            }
            M::VersionMissing(_) => {
                Self::Migration("the database has a migration this build does not know")
            }
            M::Dirty(_) => Self::Migration("a previous migration was left partially applied"),
            _ => Self::Migration("migrations could not be applied"),
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match err {
            E::Database(db) => match db.code() {
                Some(code) => Self::from_sqlstate(&code, db.constraint()),
                None => Self::Permanent {
                    sqlstate: "XX000".to_owned(),
                },
            },
            E::RowNotFound => Self::NotFound,
            E::PoolTimedOut => Self::Transient {
                kind: TransientKind::PoolTimeout,
                sqlstate: None,
            },
            E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolClosed | E::WorkerCrashed => {
                Self::Transient {
                    kind: TransientKind::ConnectionLost,
                    sqlstate: None,
                }
            }
            E::ColumnDecode { .. }
            | E::Decode(_)
            | E::ColumnNotFound(_)
            | E::TypeNotFound { .. } => Self::Decode,
            E::Migrate(m) => Self::from_migrate(*m),
            _ => Self::Permanent {
                sqlstate: "XX000".to_owned(),
            },
        }
    }
}
