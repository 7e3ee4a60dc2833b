//! The errors of this crate (value-free: never a URL, secret or payload).

/// Errors of keel-webhooks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The database failed (classified by keel-store).
    #[error("database: {0}")]
    Store(#[from] keel_store::StoreError),
    /// An endpoint URL was refused; `reason` is one of a fixed set of phrases.
    #[error("invalid endpoint url: {reason}")]
    InvalidUrl {
        /// Why (fixed text: "must be an absolute https URL", "resolves to a refused address range", ...).
        reason: &'static str,
    },
    /// An event type is not in [`crate::EVENT_TYPES`] (nor `*`).
    #[error("unknown event type")]
    UnknownEventType,
    /// A field is out of bounds.
    #[error("invalid `{field}`: {reason}")]
    InvalidField {
        /// The field name.
        field: &'static str,
        /// Why (fixed text).
        reason: &'static str,
    },
    /// No such endpoint (of this organization).
    #[error("webhook endpoint not found")]
    NotFound,
    /// A setting is out of bounds.
    #[error("invalid webhook setting `{key}`: {reason}")]
    Config {
        /// The [`crate::WebhookConfig`] field.
        key: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("the HTTP client could not be built")]
    Client,
    /// A JSON value did not serialize.
    #[error("a webhook payload did not serialize")]
    Json,
}

impl From<sqlx::Error> for WebhookError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(keel_store::StoreError::from(e))
    }
}

/// This crate's result.
pub type Result<T, E = WebhookError> = std::result::Result<T, E>;
