//! The signer seam: Keel signs through [`TxSigner`]; local keys now, custody providers
//! later. Nothing in the queue assumes signing is instant or local.

use alloy::consensus::{TxEnvelope, TypedTransaction};
use alloy::network::TxSignerSync;
use alloy::primitives::Address;
use alloy::signers::local::PrivateKeySigner;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

/// Signing failures. Never carry key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignerError {
    /// The key could not be loaded (names the source, never the key).
    #[error("signing key unavailable: {0}")]
    KeyUnavailable(&'static str),
    /// The signer refused or failed to sign.
    #[error("signing failed")]
    Failed,
    /// A remote signer did not answer in time; retryable.
    #[error("signer unavailable")]
    Unavailable,
}

impl SignerError {
    /// True when a later attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SignerError::Unavailable)
    }
}

/// A boxed signing future.
pub type SignFuture<'a> =
    Pin<Box<dyn Future<Output = Result<TxEnvelope, SignerError>> + Send + 'a>>;

/// Signs typed transactions for one sender address.
pub trait TxSigner: Send + Sync {
    /// The address whose transactions this signs.
    fn address(&self) -> Address;
    /// Signs a typed transaction — EIP-1559 (type 2), or EIP-7702 (type 4) for a
    /// request carrying authorizations — whose chain id the caller set (EIP-155 replay
    /// protection), and returns the EIP-2718 envelope.
    fn sign(&self, tx: TypedTransaction) -> SignFuture<'_>;
}

/// A local secp256k1 key. `Debug` shows only the address.
pub struct LocalSigner {
    inner: PrivateKeySigner,
}

impl std::fmt::Debug for LocalSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSigner")
            .field("address", &self.inner.address())
            .finish()
    }
}

impl LocalSigner {
    /// Wraps an alloy key.
    pub fn new(inner: PrivateKeySigner) -> Self {
        Self { inner }
    }

    /// Reads a hex private key from the environment variable `var`.
    ///
    /// # Errors
    /// [`SignerError::KeyUnavailable`] when unset or not a key (the value is never shown).
    pub fn from_env(var: &str) -> Result<Self, SignerError> {
        let raw = std::env::var(var)
            .map_err(|_| SignerError::KeyUnavailable("environment variable not set"))?;
        let inner: PrivateKeySigner = raw.trim().parse().map_err(|_| {
            SignerError::KeyUnavailable("environment variable does not hold a hex key")
        })?;
        Ok(Self { inner })
    }

    /// Decrypts an encrypted JSON keystore (Web3 Secret Storage, as written by geth
    /// and foundry).
    ///
    /// # Errors
    /// [`SignerError::KeyUnavailable`] when the file is unreadable or the password wrong.
    pub fn from_keystore(path: &Path, password: &str) -> Result<Self, SignerError> {
        let inner = PrivateKeySigner::decrypt_keystore(path, password)
            .map_err(|_| SignerError::KeyUnavailable("keystore could not be decrypted"))?;
        Ok(Self { inner })
    }
}

impl TxSigner for LocalSigner {
    fn address(&self) -> Address {
        self.inner.address()
    }

    /// Signs on tokio's blocking pool (a secp256k1 signature is ~0.1–0.3 ms of CPU):
    /// the queue asks for a group's signatures concurrently, so they spread over the
    /// cores instead of stalling the task that broadcasts, at most one per core at once
    /// across the process.
    fn sign(&self, mut tx: TypedTransaction) -> SignFuture<'_> {
        let inner = self.inner.clone();
        Box::pin(async move {
            // At most one signature per core at once (process-wide): more threads only
            // take CPU time from the database and node sharing the machine.
            let _core = signing_cores()
                .acquire()
                .await
                .map_err(|_| SignerError::Failed)?;
            tokio::task::spawn_blocking(move || {
                let sig = inner
                    .sign_transaction_sync(&mut tx)
                    .map_err(|_| SignerError::Failed)?;
                Ok(tx.into_envelope(sig))
            })
            .await
            .map_err(|_| SignerError::Failed)?
        })
    }
}

/// Permits for concurrent local signatures: the number of cores.
fn signing_cores() -> &'static tokio::sync::Semaphore {
    static CORES: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    CORES.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}
