//! Secrets named in configuration: `env:NAME` (an environment variable) or
//! `file:PATH` (a file, trailing whitespace trimmed). The configuration holds only the
//! name; the value lives in a [`Secret`], whose `Debug` and `Display` print
//! `[redacted]`, and is never part of an error, a log line or the database.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::CustodyError;

/// Where a secret is read from. Serialized as `env:NAME` or `file:PATH`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SecretSource {
    /// An environment variable.
    Env(String),
    /// A file.
    File(std::path::PathBuf),
}

impl TryFrom<String> for SecretSource {
    type Error = CustodyError;
    fn try_from(text: String) -> Result<Self, CustodyError> {
        if let Some(name) = text.strip_prefix("env:").filter(|n| !n.is_empty()) {
            Ok(SecretSource::Env(name.to_owned()))
        } else if let Some(path) = text.strip_prefix("file:").filter(|p| !p.is_empty()) {
            Ok(SecretSource::File(path.into()))
        } else {
            Err(CustodyError::Config {
                what: "a secret source must be env:NAME or file:PATH".into(),
            })
        }
    }
}

impl From<SecretSource> for String {
    fn from(source: SecretSource) -> String {
        source.to_string()
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(name) => write!(f, "env:{name}"),
            SecretSource::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

impl SecretSource {
    /// Reads the secret.
    ///
    /// # Errors
    /// [`CustodyError::SecretUnavailable`] (naming the source, never the value) when
    /// the variable is unset or empty, or the file cannot be read or is empty.
    pub fn read(&self) -> Result<Secret, CustodyError> {
        let unavailable = || CustodyError::SecretUnavailable {
            source_name: self.to_string(),
        };
        let value = match self {
            SecretSource::Env(name) => std::env::var(name).map_err(|_| unavailable())?,
            SecretSource::File(path) => std::fs::read_to_string(path).map_err(|_| unavailable())?,
        };
        let value = value.trim_end().to_owned();
        if value.is_empty() {
            return Err(unavailable());
        }
        Ok(Secret(value))
    }
}

/// A secret value. `Debug`/`Display` never show it.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value (tests, or a value obtained elsewhere).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send or use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_values_never_show() {
        let env: SecretSource = serde_json::from_str("\"env:KEEL_TEST_SECRET_X\"").unwrap();
        assert_eq!(env, SecretSource::Env("KEEL_TEST_SECRET_X".into()));
        let file: SecretSource = serde_json::from_str("\"file:/run/key.pem\"").unwrap();
        assert_eq!(file.to_string(), "file:/run/key.pem");
        assert!(serde_json::from_str::<SecretSource>("\"hunter2\"").is_err());

        let dir = std::env::temp_dir().join(format!("keel-custody-secret-{}", std::process::id()));
        std::fs::write(&dir, "s3cr3t-value\n").unwrap();
        let secret = SecretSource::File(dir.clone()).read().unwrap();
        assert_eq!(secret.expose(), "s3cr3t-value");
        assert!(!format!("{secret:?} {secret}").contains("s3cr3t"));
        std::fs::remove_file(&dir).unwrap();

        let missing = SecretSource::Env("KEEL_TEST_SECRET_SURELY_UNSET".into())
            .read()
            .unwrap_err();
        assert_eq!(
            missing.to_string(),
            "secret env:KEEL_TEST_SECRET_SURELY_UNSET unavailable"
        );
    }
}
