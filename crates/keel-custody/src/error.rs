//! The error of the custody seam, classified by what the caller may do next.
//!
//! No variant carries a secret, a request body or a JWT; a provider's message is kept
//! only bounded ([`MAX_MESSAGE_LEN`]) and only from a refusal.

use std::time::Duration;

use crate::types::ExternalTxId;

/// Upper bound, in characters, on a provider message kept in an error.
pub const MAX_MESSAGE_LEN: usize = 200;

/// What the caller of a provider call may do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Nothing happened at the provider (or a read failed): try again later.
    Retryable,
    /// Trying again cannot help (bad configuration, refused request, unknown id).
    Permanent,
    /// A create may or may not have taken effect (its answer was lost): the next step is
    /// a lookup by `externalTxId`, never a blind second create.
    InDoubt,
    /// The provider already has a transaction with this `externalTxId`: look it up.
    Duplicate,
}

/// Where a transport failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportStage {
    /// Before the request was sent (connect refused, DNS): nothing reached the provider.
    Connect,
    /// After (or while) sending: a timeout, a reset, a truncated answer.
    Sent,
}

/// An error of the custody seam.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CustodyError {
    /// HTTP 429 that outlasted the adapter's own retries; `retry_after` is the provider's
    /// last `Retry-After`.
    #[error("provider rate limit reached (retry after {retry_after:?})")]
    RateLimited {
        /// The provider's `Retry-After`, when sent.
        retry_after: Option<Duration>,
    },
    /// A 5xx answer to a read or a cancel.
    #[error("provider unavailable (HTTP {http_status})")]
    Unavailable {
        /// The HTTP status (500..=599).
        http_status: u16,
    },
    /// The network failed on a read or a cancel.
    #[error("provider unreachable ({stage:?})")]
    Transport {
        /// Before or after the request was sent.
        stage: TransportStage,
    },
    /// A create whose answer was lost (5xx, timeout, reset after sending): it may exist.
    #[error("create of {external_tx_id} in doubt: {cause}")]
    InDoubt {
        /// The external id to look up.
        external_tx_id: ExternalTxId,
        /// What was lost, for operators (`HTTP 502`, `timeout`, `connection reset`).
        cause: String,
    },
    /// The provider refused a create because the external id exists already (HTTP 400).
    #[error("provider already has a transaction with externalTxId {external_tx_id}")]
    DuplicateExternalTxId {
        /// The external id to look up.
        external_tx_id: ExternalTxId,
    },
    /// No transaction with this id (HTTP 404).
    #[error("provider transaction not found")]
    NotFound,
    /// The provider refused Keel's credentials (HTTP 401/403): a configuration problem.
    #[error("provider refused the credentials (HTTP {http_status}, code {code:?})")]
    Unauthorized {
        /// 401 or 403.
        http_status: u16,
        /// The provider's error code (Fireblocks: -1 invalid signature, -4 wrong URL,
        /// -7 token not accepted, -10 expired, …).
        code: Option<i64>,
    },
    /// Any other 4xx: the request itself was refused.
    #[error("provider refused the request (HTTP {http_status}, code {code:?}): {message}")]
    Refused {
        /// The HTTP status.
        http_status: u16,
        /// The provider's error code.
        code: Option<i64>,
        /// The provider's message, at most [`MAX_MESSAGE_LEN`] characters.
        message: String,
    },
    /// An answer that does not have the documented shape.
    #[error("provider answer could not be read: {what}")]
    Decode {
        /// Which part.
        what: &'static str,
    },
    /// An input Keel itself would send is invalid (an id with bad characters).
    #[error("invalid {what}")]
    InvalidInput {
        /// Which input.
        what: &'static str,
    },
    /// The adapter's configuration is unusable (a key that does not parse, a bad URL).
    #[error("custody configuration: {what}")]
    Config {
        /// What is wrong (never the value).
        what: String,
    },
    /// A secret named in configuration could not be read (the name is shown, the value
    /// never).
    #[error("secret {source_name} unavailable")]
    SecretUnavailable {
        /// `env:NAME` or `file:PATH`.
        source_name: String,
    },
}

impl CustodyError {
    /// What the caller may do next.
    pub fn class(&self) -> ErrorClass {
        match self {
            CustodyError::RateLimited { .. }
            | CustodyError::Unavailable { .. }
            | CustodyError::Transport { .. } => ErrorClass::Retryable,
            CustodyError::InDoubt { .. } => ErrorClass::InDoubt,
            CustodyError::DuplicateExternalTxId { .. } => ErrorClass::Duplicate,
            CustodyError::NotFound
            | CustodyError::Unauthorized { .. }
            | CustodyError::Refused { .. }
            | CustodyError::Decode { .. }
            | CustodyError::InvalidInput { .. }
            | CustodyError::Config { .. }
            | CustodyError::SecretUnavailable { .. } => ErrorClass::Permanent,
        }
    }

    /// True when waiting and trying the same call again can help.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Retryable
    }

    /// A short, bounded code for metrics labels and logs.
    pub fn code(&self) -> &'static str {
        match self {
            CustodyError::RateLimited { .. } => "rate_limited",
            CustodyError::Unavailable { .. } => "unavailable",
            CustodyError::Transport { .. } => "transport",
            CustodyError::InDoubt { .. } => "in_doubt",
            CustodyError::DuplicateExternalTxId { .. } => "duplicate_external_tx_id",
            CustodyError::NotFound => "not_found",
            CustodyError::Unauthorized { .. } => "unauthorized",
            CustodyError::Refused { .. } => "refused",
            CustodyError::Decode { .. } => "decode",
            CustodyError::InvalidInput { .. } => "invalid_input",
            CustodyError::Config { .. } => "config",
            CustodyError::SecretUnavailable { .. } => "secret_unavailable",
        }
    }
}

/// The crate's result type.
pub type Result<T, E = CustodyError> = std::result::Result<T, E>;

/// Bounds a provider message to [`MAX_MESSAGE_LEN`] characters, without control chars.
pub(crate) fn bounded_message(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(MAX_MESSAGE_LEN)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_say_what_to_do_next() {
        let ext = ExternalTxId::new("keel.a.0").unwrap();
        let in_doubt = CustodyError::InDoubt {
            external_tx_id: ext.clone(),
            cause: "timeout".into(),
        };
        assert_eq!(in_doubt.class(), ErrorClass::InDoubt);
        assert!(!in_doubt.is_retryable());
        assert_eq!(
            CustodyError::DuplicateExternalTxId {
                external_tx_id: ext
            }
            .class(),
            ErrorClass::Duplicate
        );
        assert!(CustodyError::RateLimited { retry_after: None }.is_retryable());
        assert!(
            CustodyError::Transport {
                stage: TransportStage::Connect
            }
            .is_retryable()
        );
        assert_eq!(
            CustodyError::Unauthorized {
                http_status: 401,
                code: Some(-1)
            }
            .class(),
            ErrorClass::Permanent
        );
        assert_eq!(bounded_message(&"x\n".repeat(500)).len(), MAX_MESSAGE_LEN);
    }
}
