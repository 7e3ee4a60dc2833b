//! The simulator's keys: `ECC_SECG_P256K1` signing keys with KMS's key states and
//! aliases, kept in a JSON state file (written on every change, by rename) so a
//! restarted simulator holds the same keys, as KMS does.

use k256::ecdsa::signature::hazmat::PrehashSigner;
use k256::ecdsa::{Signature, SigningKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The DER prefix of a secp256k1 SubjectPublicKeyInfo (id-ecPublicKey, secp256k1,
/// uncompressed point of 65 bytes follows): RFC 5480 §2.
const SPKI_PREFIX: [u8; 23] = [
    0x30, 0x56, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
    0x81, 0x04, 0x00, 0x0a, 0x03, 0x42, 0x00,
];

/// A KMS error: its `__type`, message and HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KmsError {
    pub(crate) kind: &'static str,
    pub(crate) message: String,
    pub(crate) status: u16,
}

impl KmsError {
    pub(crate) fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            status: 400,
        }
    }
}

/// One key as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoredKey {
    /// The key id (a UUID).
    pub(crate) id: String,
    /// The private scalar, hex (the simulator's own secret; a real KMS never shows it).
    pub(crate) secret: String,
    /// `Enabled`, `Disabled` or `PendingDeletion`.
    pub(crate) state: String,
    pub(crate) description: String,
    /// Seconds since the epoch.
    pub(crate) created: i64,
}

/// Everything the simulator keeps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct State {
    pub(crate) keys: BTreeMap<String, StoredKey>,
    /// `alias/<name>` → key id.
    pub(crate) aliases: BTreeMap<String, String>,
}

/// The key store of one simulator: region, account and the state file.
#[derive(Debug)]
pub(crate) struct Keys {
    pub(crate) region: String,
    pub(crate) account: String,
    pub(crate) state: State,
    file: Option<PathBuf>,
    /// Signatures made, to alternate high-s and low-s answers (KMS does not normalise s).
    signed: u64,
}

impl Keys {
    /// The store, read from `file` when it exists.
    ///
    /// # Errors
    /// When the file exists but is not a state file.
    pub(crate) fn open(
        region: String,
        account: String,
        file: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let state = match &file {
            Some(path) if path.exists() => serde_json::from_slice(&std::fs::read(path)?)?,
            _ => State::default(),
        };
        Ok(Self {
            region,
            account,
            state,
            file,
            signed: 0,
        })
    }

    fn save(&self) -> Result<(), KmsError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let internal = |_| KmsError {
            kind: "KMSInternalException",
            message: "state could not be written".into(),
            status: 500,
        };
        let tmp = path.with_extension("tmp");
        let body = serde_json::to_vec_pretty(&self.state).map_err(|_| KmsError {
            kind: "KMSInternalException",
            message: "state could not be encoded".into(),
            status: 500,
        })?;
        std::fs::write(&tmp, body).map_err(internal)?;
        std::fs::rename(&tmp, path).map_err(internal)
    }

    /// The ARN of key `id`.
    pub(crate) fn arn(&self, id: &str) -> String {
        format!("arn:aws:kms:{}:{}:key/{id}", self.region, self.account)
    }

    /// Resolves a `KeyId` parameter (key id, key ARN, alias name, alias ARN) to a key id.
    ///
    /// # Errors
    /// `NotFoundException` when it names nothing.
    pub(crate) fn resolve(&self, key_id: &str) -> Result<String, KmsError> {
        let not_found = || {
            KmsError::new(
                "NotFoundException",
                format!("Key '{key_id}' does not exist"),
            )
        };
        let arn_prefix = format!("arn:aws:kms:{}:{}:", self.region, self.account);
        let name = key_id.strip_prefix(&arn_prefix).unwrap_or(key_id);
        let id = if let Some(id) = name.strip_prefix("key/") {
            id.to_owned()
        } else if name.starts_with("alias/") {
            self.state
                .aliases
                .get(name)
                .cloned()
                .ok_or_else(not_found)?
        } else {
            name.to_owned()
        };
        if self.state.keys.contains_key(&id) {
            Ok(id)
        } else {
            Err(not_found())
        }
    }

    fn key(&self, key_id: &str) -> Result<&StoredKey, KmsError> {
        let id = self.resolve(key_id)?;
        self.state
            .keys
            .get(&id)
            .ok_or_else(|| KmsError::new("NotFoundException", "key vanished"))
    }

    /// A key that may be used: enabled.
    ///
    /// # Errors
    /// `NotFoundException`, `DisabledException`, `KMSInvalidStateException`.
    fn usable(&self, key_id: &str) -> Result<&StoredKey, KmsError> {
        let key = self.key(key_id)?;
        match key.state.as_str() {
            "Enabled" => Ok(key),
            "Disabled" => Err(KmsError::new(
                "DisabledException",
                format!("{} is disabled.", self.arn(&key.id)),
            )),
            other => Err(KmsError::new(
                "KMSInvalidStateException",
                format!("{} is pending deletion ({other}).", self.arn(&key.id)),
            )),
        }
    }

    /// Creates a key; returns its id.
    ///
    /// # Errors
    /// `ValidationException` for a key spec or usage the simulator does not offer.
    pub(crate) fn create(
        &mut self,
        key_spec: &str,
        key_usage: &str,
        description: String,
    ) -> Result<String, KmsError> {
        if key_spec != "ECC_SECG_P256K1" || key_usage != "SIGN_VERIFY" {
            return Err(KmsError::new(
                "ValidationException",
                "this simulator offers KeySpec ECC_SECG_P256K1 with KeyUsage SIGN_VERIFY only",
            ));
        }
        let signing = SigningKey::random(&mut k256::elliptic_curve::rand_core::OsRng);
        let id = uuid::Uuid::new_v4().to_string();
        self.state.keys.insert(
            id.clone(),
            StoredKey {
                id: id.clone(),
                secret: hex::encode(signing.to_bytes()),
                state: "Enabled".into(),
                description,
                created: chrono::Utc::now().timestamp(),
            },
        );
        self.save()?;
        Ok(id)
    }

    /// Sets a key's state to `Enabled` or `Disabled`.
    ///
    /// # Errors
    /// `NotFoundException`; `KMSInvalidStateException` for a key pending deletion.
    pub(crate) fn set_enabled(&mut self, key_id: &str, enabled: bool) -> Result<(), KmsError> {
        let id = self.resolve(key_id)?;
        let arn = self.arn(&id);
        let key = self
            .state
            .keys
            .get_mut(&id)
            .ok_or_else(|| KmsError::new("NotFoundException", "key vanished"))?;
        if key.state == "PendingDeletion" {
            return Err(KmsError::new(
                "KMSInvalidStateException",
                format!("{arn} is pending deletion."),
            ));
        }
        key.state = if enabled { "Enabled" } else { "Disabled" }.into();
        self.save()
    }

    /// Points `alias` (`alias/<name>`) at a key, creating or moving it.
    ///
    /// # Errors
    /// `ValidationException` for a name without `alias/` or a reserved `alias/aws/`;
    /// `AlreadyExistsException` when creating an alias that exists;
    /// `NotFoundException` for an unknown target (or alias, when updating).
    pub(crate) fn alias(
        &mut self,
        alias: &str,
        target: &str,
        create: bool,
    ) -> Result<(), KmsError> {
        if !alias.starts_with("alias/") || alias.starts_with("alias/aws/") {
            return Err(KmsError::new(
                "ValidationException",
                "AliasName must begin with 'alias/' and not 'alias/aws/'",
            ));
        }
        let id = self.resolve(target)?;
        match (create, self.state.aliases.contains_key(alias)) {
            (true, true) => {
                return Err(KmsError::new(
                    "AlreadyExistsException",
                    format!("An alias with the name {alias} already exists"),
                ));
            }
            (false, false) => {
                return Err(KmsError::new(
                    "NotFoundException",
                    format!("Alias {alias} is not found."),
                ));
            }
            _ => {}
        }
        self.state.aliases.insert(alias.to_owned(), id);
        self.save()
    }

    fn signing_key(key: &StoredKey) -> Result<SigningKey, KmsError> {
        let internal = || KmsError {
            kind: "KMSInternalException",
            message: "stored key unreadable".into(),
            status: 500,
        };
        let bytes = hex::decode(&key.secret).map_err(|_| internal())?;
        SigningKey::from_slice(&bytes).map_err(|_| internal())
    }

    /// The DER SubjectPublicKeyInfo of a usable key, and its id.
    ///
    /// # Errors
    /// As [`Keys::usable`].
    pub(crate) fn public_key(&self, key_id: &str) -> Result<(String, Vec<u8>), KmsError> {
        let key = self.usable(key_id)?;
        let point = Self::signing_key(key)?
            .verifying_key()
            .to_encoded_point(false);
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(point.as_bytes());
        Ok((key.id.clone(), der))
    }

    /// Signs `message` with a usable key as KMS's `Sign` does for `ECDSA_SHA_256`:
    /// `DIGEST` signs the 32 given bytes, `RAW` their SHA-256. The answer is DER; every
    /// other signature carries the high `s` (n − s), which KMS also returns (it does not
    /// normalise to low s: EIP-2 is the caller's business).
    ///
    /// # Errors
    /// As [`Keys::usable`]; `ValidationException` for another algorithm, message type,
    /// an empty message or a digest that is not 32 bytes.
    pub(crate) fn sign(
        &mut self,
        key_id: &str,
        message: &[u8],
        message_type: &str,
        algorithm: &str,
    ) -> Result<(String, Vec<u8>), KmsError> {
        let key = self.usable(key_id)?;
        if algorithm != "ECDSA_SHA_256" {
            return Err(KmsError::new(
                "InvalidKeyUsageException",
                format!("Signing algorithm {algorithm} is not valid for this key"),
            ));
        }
        let digest: [u8; 32] = match message_type {
            "DIGEST" => message.try_into().map_err(|_| {
                KmsError::new(
                    "ValidationException",
                    "Digest is invalid length for algorithm ECDSA_SHA_256.",
                )
            })?,
            "RAW" if !message.is_empty() && message.len() <= 4096 => Sha256::digest(message).into(),
            "RAW" => {
                return Err(KmsError::new(
                    "ValidationException",
                    "Message must be 1 to 4096 bytes",
                ));
            }
            other => {
                return Err(KmsError::new(
                    "ValidationException",
                    format!("MessageType {other} is not RAW or DIGEST"),
                ));
            }
        };
        let signing = Self::signing_key(key)?;
        let id = key.id.clone();
        let sig: Signature = signing.sign_prehash(&digest).map_err(|_| KmsError {
            kind: "KMSInternalException",
            message: "signing failed".into(),
            status: 500,
        })?;
        self.signed += 1;
        let sig = if self.signed.is_multiple_of(2) {
            let (r, s) = sig.split_scalars();
            let high = -*s;
            Signature::from_scalars(r.to_bytes(), high.to_bytes()).unwrap_or(sig)
        } else {
            sig
        };
        Ok((id, sig.to_der().as_bytes().to_vec()))
    }
}
