//! The process's signing keys (issue 34 §3): one configuration type for every key
//! ([`SignerConfig`], an enum of kinds), built once at start ([`Signers::load`]) into
//! shared [`SignerHandle`]s that every part signing with a key receives.
//!
//! | key | configuration | used by |
//! |---|---|---|
//! | operator | `[operator.signer]`, or its shorthand `operator.keyEnv` | the transaction queue (runner), the ERC-4337 bundler's sender (runner; its address in the api role) |
//! | sponsor | `[aa.sponsorSigner]`, or its shorthand `aa.sponsorKeyEnv` | the paymaster sponsor's `pm_getPaymasterData` signatures (api role) |
//! | pool sender | `[chains.<name>.senders.<sender>]` | the chain's queue (runner): issuer of the assets assigned to it ([`pool_senders`]) |
//! | deployer | `keel chain bootstrap --key-env` | the bootstrap's deployments and role grants |
//!
//! A key that is configured but cannot be used (a variable holding no key, a keystore
//! that does not decrypt) is a startup error naming the configuration key and the
//! source, never the key. An environment variable that is unset (or empty) means "no
//! key": the runner then serves no chain (`CHAIN_UNAVAILABLE`), the api role's `pm_*`
//! methods answer that no paymaster is configured.
//!
//! Kinds: `env` (a hex key in an environment variable: development and tests, said so
//! in the log at start), `keystore` (an encrypted JSON keystore), `awsKms` (a key in
//! AWS KMS, [`aws_kms`]: the private key never enters Keel). Adding a kind is one
//! variant of [`SignerConfig`] and one arm of [`SignerConfig::build`] returning an
//! alloy signer wrapped in [`SignerHandle::new`]; nothing that uses a key changes.

pub mod aws_kms;

use crate::config::{Config, ConfigError, Role};
use keel_txq::{LocalSigner, SignerHandle};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

const TARGET: &str = "keel::signer";

/// The keys of a signer table, every kind's (for environment overrides such as
/// `KEEL__OPERATOR__SIGNER__PASSWORDENV`).
pub const SIGNER_KEYS: &[&str] = &[
    "kind",
    "var",
    "path",
    "passwordEnv",
    "keyId",
    "region",
    "endpoint",
];

/// Where a signing key is and how it is used: one of the signer kinds. The TOML form
/// is a table with `kind` and the kind's own keys, e.g.
/// `[operator.signer]` `kind = "keystore"`, `path = "/etc/keel/operator.json"`,
/// `passwordEnv = "KEEL_OPERATOR_KEYSTORE_PASSWORD"`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum SignerConfig {
    /// `kind = "env"`: a hex private key (`0x` optional) in the environment variable
    /// `var` (development and tests: the key is in the process's environment). Unset
    /// or empty: no key.
    Env {
        /// The environment variable's name.
        var: String,
    },
    /// `kind = "keystore"`: an encrypted JSON keystore (Web3 Secret Storage, as geth
    /// and foundry write it) at `path`, its password in the environment variable
    /// `passwordEnv`.
    Keystore {
        /// The keystore file.
        path: PathBuf,
        /// The environment variable holding the keystore's password.
        password_env: String,
    },
    /// `kind = "awsKms"`: an asymmetric `ECC_SECG_P256K1` key with `SIGN_VERIFY` usage in
    /// AWS KMS, signing with `ECDSA_SHA_256` over the transaction's digest (alloy's AWS
    /// signer: the signature normalised to low s, EIP-2, and its recovery id found). The
    /// private key never enters Keel. Credentials come from the AWS SDK's default chain
    /// (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, a profile, web
    /// identity, ECS or EC2 instance roles), never from Keel's configuration. The role
    /// needs `kms:GetPublicKey` and `kms:Sign` on the key.
    AwsKms {
        /// The key: a key id, a key ARN, an alias (`alias/keel-operator`) or an alias
        /// ARN. Prefer the key id or ARN: the address is read once at start, so an
        /// alias moved to another key later is not followed (see docs on rotation).
        key_id: String,
        /// The AWS region of the key (`us-east-1`).
        region: String,
        /// Another KMS endpoint (a VPC endpoint, or a local KMS counterpart in tests),
        /// an `http(s)://` URL; absent: the region's public endpoint.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
    },
}

/// A key that is configured but cannot be used. Messages name the configuration key
/// and the source (a variable's name, a file's path), never a key or a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignerLoadError {
    /// The environment variable is set but holds no hex private key.
    #[error("environment variable {var} (configured by `{key}`) does not hold a hex private key")]
    MalformedKey {
        /// The configuration key (or command-line option) naming the variable.
        key: String,
        /// The variable's name.
        var: String,
    },
    /// A key that must be there (a pool sender's, `chains.<name>.senders.<sender>`) is
    /// an `env` key whose variable is unset or empty.
    #[error(
        "environment variable {var} (configured by `{key}`) is not set: it must hold the sender's hex private key"
    )]
    Absent {
        /// The configuration key of the signer.
        key: String,
        /// The variable's name.
        var: String,
    },
    /// The keystore's password variable is not set.
    #[error(
        "environment variable {var} (configured by `{key}.passwordEnv`) is not set: it must hold the keystore's password"
    )]
    MissingPassword {
        /// The configuration key of the signer.
        key: String,
        /// The variable's name.
        var: String,
    },
    /// The keystore file is unreadable, not a keystore, or the password is wrong.
    #[error(
        "keystore {path} (configured by `{key}.path`) could not be decrypted: unreadable, not a keystore, or a wrong password"
    )]
    Keystore {
        /// The configuration key of the signer.
        key: String,
        /// The file's path.
        path: String,
    },
    /// The AWS KMS key's public key could not be read at start: `reason` is a closed
    /// code ([`keel_txq::SignerError::code`]: `UNAVAILABLE` for an unreachable or
    /// throttling KMS, `KEY_DISABLED`, `KEY_NOT_FOUND`, `ACCESS_DENIED`, `WRONG_KEY` for a
    /// key that is not `ECC_SECG_P256K1`).
    #[error("AWS KMS key {key_id} (configured by `{key}.keyId`) cannot be used: {reason}")]
    AwsKms {
        /// The configuration key of the signer.
        key: String,
        /// The configured key id (an identifier, not a secret).
        key_id: String,
        /// Why, as a closed code.
        reason: &'static str,
    },
}

impl SignerConfig {
    /// The kind's name as configured (`env`, `keystore`).
    pub fn kind(&self) -> &'static str {
        match self {
            SignerConfig::Env { .. } => "env",
            SignerConfig::Keystore { .. } => "keystore",
            SignerConfig::AwsKms { .. } => "awsKms",
        }
    }

    /// Checks the fields every kind needs.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `key.<field>`.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let invalid = |field: &str, reason: &str| ConfigError::Invalid {
            key: format!("{key}.{field}"),
            reason: reason.to_owned(),
        };
        match self {
            SignerConfig::Env { var } if var.is_empty() => {
                Err(invalid("var", "must name an environment variable"))
            }
            SignerConfig::Keystore { path, .. } if path.as_os_str().is_empty() => {
                Err(invalid("path", "must name a keystore file"))
            }
            SignerConfig::Keystore { password_env, .. } if password_env.is_empty() => {
                Err(invalid("passwordEnv", "must name an environment variable"))
            }
            SignerConfig::AwsKms { key_id, .. } if key_id.trim().is_empty() => Err(invalid(
                "keyId",
                "must name a KMS key (key id, key ARN or alias)",
            )),
            SignerConfig::AwsKms { region, .. } if region.trim().is_empty() => {
                Err(invalid("region", "must name an AWS region"))
            }
            SignerConfig::AwsKms {
                endpoint: Some(e), ..
            } if !(e.starts_with("http://") || e.starts_with("https://")) => {
                Err(invalid("endpoint", "must be an http:// or https:// URL"))
            }
            _ => Ok(()),
        }
    }

    /// Builds the key into a shared handle; `key` is the configuration key (or
    /// command-line option) that configured it, for error messages. `Ok(None)`: an
    /// `env` key whose variable is unset or empty.
    ///
    /// # Errors
    /// [`SignerLoadError`] when the key is configured but unusable.
    pub async fn build(&self, key: &str) -> Result<Option<SignerHandle>, SignerLoadError> {
        match self {
            SignerConfig::Env { var } => {
                let Some(raw) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) else {
                    return Ok(None);
                };
                let signer =
                    LocalSigner::from_hex(&raw).map_err(|_| SignerLoadError::MalformedKey {
                        key: key.to_owned(),
                        var: var.clone(),
                    })?;
                Ok(Some(SignerHandle::new(signer, "env")))
            }
            SignerConfig::Keystore { path, password_env } => {
                let password =
                    std::env::var(password_env).map_err(|_| SignerLoadError::MissingPassword {
                        key: key.to_owned(),
                        var: password_env.clone(),
                    })?;
                let file = path.clone();
                // scrypt takes a noticeable moment: off the async workers.
                let signer = tokio::task::spawn_blocking(move || {
                    LocalSigner::from_keystore(&file, &password)
                })
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| SignerLoadError::Keystore {
                    key: key.to_owned(),
                    path: path.display().to_string(),
                })?;
                Ok(Some(SignerHandle::new(signer, "keystore")))
            }
            SignerConfig::AwsKms {
                key_id,
                region,
                endpoint,
            } => {
                let signer = aws_kms::KmsSigner::connect(key_id, region, endpoint.as_deref())
                    .await
                    .map_err(|e| SignerLoadError::AwsKms {
                        key: key.to_owned(),
                        key_id: key_id.clone(),
                        reason: e.code(),
                    })?;
                Ok(Some(SignerHandle::new(signer, "awsKms")))
            }
        }
    }
}

/// One sender of a chain's signer pool (`[chains.<name>.senders.<sender>]`).
#[derive(Debug, Clone)]
pub struct PoolSender {
    /// Its name in the configuration.
    pub name: String,
    /// Its key.
    pub handle: SignerHandle,
}

/// The keys of one process, built once at start ([`Signers::load`]) and shared.
#[derive(Debug, Clone, Default)]
pub struct Signers {
    /// The operator key: the queue's sender and the bundler's (`None`: not configured).
    pub operator: Option<SignerHandle>,
    /// Per chain (EIP-155 id), the pool senders beyond the operator, in name order
    /// (runner only; empty elsewhere).
    pub pool: std::collections::BTreeMap<u64, Vec<PoolSender>>,
    /// The paymaster sponsor key (api role with `aa.enabled`; `None` otherwise or when
    /// not configured).
    pub sponsor: Option<SignerHandle>,
}

impl Signers {
    /// Builds the keys `role` uses: the runner the operator key, the api role (with
    /// `aa.enabled`) the operator key (the bundler's address) and the sponsor key, the
    /// indexer none. Logs each key's kind and address.
    ///
    /// # Errors
    /// [`SignerLoadError`] when a configured key is unusable (the process must not
    /// start).
    pub async fn load(config: &Config, role: Role) -> Result<Self, SignerLoadError> {
        let (operator, sponsor) = match role {
            Role::Runner => (true, false),
            Role::Api => (config.aa.enabled, config.aa.enabled),
            Role::Indexer => (false, false),
        };
        let mut signers = Signers::default();
        if operator {
            let (signer, key) = config.operator.signer_config();
            signers.operator = signer.build(key).await?;
            log_key("operator", key, signers.operator.as_ref());
        }
        if role == Role::Runner {
            signers.pool = pool_senders(config).await?;
        }
        if sponsor {
            signers.sponsor = crate::aa::sponsor_key(&config.aa).await?;
            log_key("sponsor", "aa.sponsorSigner", signers.sponsor.as_ref());
        }
        Ok(signers)
    }
}

/// Builds every chain's pool senders (`chains.<name>.senders`), logging each one's kind
/// and address.
///
/// # Errors
/// [`SignerLoadError`] when a configured sender's key is unusable or absent (a pool
/// sender has no "not configured" state: its assets would wait for it).
pub async fn pool_senders(
    config: &Config,
) -> Result<std::collections::BTreeMap<u64, Vec<PoolSender>>, SignerLoadError> {
    let mut out = std::collections::BTreeMap::new();
    for (chain, c) in &config.chains {
        let mut senders = Vec::with_capacity(c.senders.len());
        for (name, signer) in &c.senders {
            let key = format!("chains.{chain}.senders.{name}");
            let Some(handle) = signer.build(&key).await? else {
                let var = match signer {
                    SignerConfig::Env { var } => var.clone(),
                    _ => String::new(),
                };
                return Err(SignerLoadError::Absent { key, var });
            };
            log_key("pool sender", &key, Some(&handle));
            senders.push(PoolSender {
                name: name.clone(),
                handle,
            });
        }
        if !senders.is_empty() {
            out.insert(c.chain_id, senders);
        }
    }
    Ok(out)
}

fn log_key(name: &'static str, key: &str, handle: Option<&SignerHandle>) {
    match handle {
        Some(h) if h.kind() == "env" => {
            tracing::warn!(target: TARGET, key = name, kind = h.kind(), address = %h.address(), "signing key loaded from an environment variable: for development and tests only; use a keystore or AWS KMS in production");
        }
        Some(h) => {
            tracing::info!(target: TARGET, key = name, kind = h.kind(), address = %h.address(), "signing key loaded");
        }
        None => {
            tracing::info!(target: TARGET, key = name, configuration = key, "no signing key configured");
        }
    }
}
