//! The signer seam, built on alloy's signer traits.
//!
//! - Any alloy transaction signer ([`alloy::network::TxSigner<Signature>`]: a local key,
//!   a keystore, alloy's AWS KMS signer, ...) is a queue signer: the blanket
//!   implementation of [`TxSigner`] turns its signature into the EIP-2718 envelope the
//!   queue stores. Nothing in the queue assumes signing is instant or local.
//! - [`LocalSigner`] is a local secp256k1 key that signs on tokio's blocking pool.
//! - [`SignerHandle`] is one key of the process, built once at start from the
//!   configuration and shared by the queue (the operator), the ERC-4337 bundler (its
//!   sender) and the paymaster sponsor (an alloy [`alloy::signers::Signer`]). It wraps
//!   any alloy [`FullSigner`]: adding a signer kind is one constructor that returns an
//!   alloy signer, not a change here.
//! - [`SignerError`] is what the queue sees of a failure: a remote signer reports a
//!   retryable failure (unreachable, throttled) as
//!   `alloy::signers::Error::Other(Box::new(SignerError::Unavailable))` and a refusal
//!   (key disabled, access denied) as [`SignerError::Refused`]; anything else is
//!   [`SignerError::Failed`]. A failed signature persists nothing: the request stays
//!   queued and the round is retried after the queue's backoff.

use alloy::consensus::{SignableTransaction, TxEnvelope, TypedTransaction};
use alloy::network::FullSigner;
use alloy::primitives::{Address, B256, ChainId, Signature};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

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
    /// A remote signer did not answer in time, was unreachable or throttled the
    /// request; retryable.
    #[error("signer unavailable")]
    Unavailable,
    /// A remote signer answered and refused: the key is disabled, gone, not usable for
    /// signing, or the credentials are not allowed to use it. An operator must act; the
    /// queue keeps the requests queued and asks again after its backoff.
    #[error("signer refused: {}", .0.code())]
    Refused(SignerRefusal),
}

/// Why a remote signer refused to sign ([`SignerError::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignerRefusal {
    /// The key is disabled (AWS KMS `DisabledException`).
    KeyDisabled,
    /// No such key (AWS KMS `NotFoundException`).
    KeyNotFound,
    /// The key is in a state that cannot sign, e.g. pending deletion (AWS KMS
    /// `KMSInvalidStateException`).
    KeyState,
    /// The credentials may not use the key, or are invalid or expired (AWS
    /// `AccessDeniedException`, `UnrecognizedClientException`,
    /// `InvalidSignatureException`, `ExpiredTokenException`).
    AccessDenied,
    /// The key cannot sign Ethereum transactions (wrong key spec or usage, or its
    /// signature does not recover to the configured address).
    WrongKey,
}

impl SignerRefusal {
    /// The refusal as a stable machine-readable code (`KEY_DISABLED`, ...), also the
    /// `reason` label of `keel_txq_sign_failures_total`.
    pub fn code(&self) -> &'static str {
        match self {
            SignerRefusal::KeyDisabled => "KEY_DISABLED",
            SignerRefusal::KeyNotFound => "KEY_NOT_FOUND",
            SignerRefusal::KeyState => "KEY_STATE",
            SignerRefusal::AccessDenied => "ACCESS_DENIED",
            SignerRefusal::WrongKey => "WRONG_KEY",
        }
    }
}

impl SignerError {
    /// True when a later attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SignerError::Unavailable)
    }

    /// A closed, stable word for the failure (`UNAVAILABLE`, `FAILED`,
    /// `KEY_UNAVAILABLE`, or the refusal's [`SignerRefusal::code`]): the `reason` label
    /// of `keel_txq_sign_failures_total` and what logs show.
    pub fn code(&self) -> &'static str {
        match self {
            SignerError::KeyUnavailable(_) => "KEY_UNAVAILABLE",
            SignerError::Failed => "FAILED",
            SignerError::Unavailable => "UNAVAILABLE",
            SignerError::Refused(r) => r.code(),
        }
    }

    /// The queue's view of an alloy signing error: a [`SignerError`] boxed in
    /// `alloy::signers::Error::Other` is itself (how a remote signer says
    /// [`SignerError::Unavailable`]); any other error is [`SignerError::Failed`] (its
    /// text is not kept: a signer's message may quote what it was given).
    pub fn from_alloy(e: alloy::signers::Error) -> Self {
        match e {
            alloy::signers::Error::Other(inner) => match inner.downcast::<SignerError>() {
                Ok(own) => *own,
                Err(_) => SignerError::Failed,
            },
            _ => SignerError::Failed,
        }
    }
}

impl From<SignerError> for alloy::signers::Error {
    fn from(e: SignerError) -> Self {
        alloy::signers::Error::other(e)
    }
}

/// A boxed signing future.
pub type SignFuture<'a> =
    Pin<Box<dyn Future<Output = Result<TxEnvelope, SignerError>> + Send + 'a>>;

/// The queue's view of a signer: signs typed transactions for one sender address.
///
/// Every alloy [`alloy::network::TxSigner<Signature>`] that is `Send + Sync` is one
/// (blanket implementation); implement alloy's trait, not this one, for a new kind of
/// signer.
pub trait TxSigner: Send + Sync {
    /// The address whose transactions this signs.
    fn address(&self) -> Address;
    /// Signs a typed transaction — EIP-1559 (type 2), or EIP-7702 (type 4) for a
    /// request carrying authorizations — whose chain id the caller set (EIP-155 replay
    /// protection), and returns the EIP-2718 envelope.
    fn sign(&self, tx: TypedTransaction) -> SignFuture<'_>;
}

impl<T> TxSigner for T
where
    T: alloy::network::TxSigner<Signature> + Send + Sync + ?Sized,
{
    fn address(&self) -> Address {
        alloy::network::TxSigner::address(self)
    }

    fn sign(&self, mut tx: TypedTransaction) -> SignFuture<'_> {
        Box::pin(async move {
            let signature = alloy::network::TxSigner::sign_transaction(self, &mut tx)
                .await
                .map_err(SignerError::from_alloy)?;
            Ok(tx.into_envelope(signature))
        })
    }
}

/// A local secp256k1 key. `Debug` shows only the address.
///
/// Implements alloy's [`alloy::network::TxSigner`] and [`alloy::signers::Signer`]
/// (and so the queue's [`TxSigner`]); every signature is computed on tokio's blocking
/// pool, at most one per core at once across the process (a secp256k1 signature is
/// ~0.1–0.3 ms of CPU): the queue asks for a group's signatures concurrently, so they
/// spread over the cores instead of stalling the task that broadcasts.
#[derive(Clone)]
pub struct LocalSigner {
    inner: Arc<PrivateKeySigner>,
}

impl std::fmt::Debug for LocalSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSigner")
            .field("address", &self.address())
            .finish()
    }
}

impl LocalSigner {
    /// Wraps an alloy key.
    pub fn new(inner: PrivateKeySigner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The key's address.
    pub fn address(&self) -> Address {
        alloy::network::TxSignerSync::address(&*self.inner)
    }

    /// Reads a hex private key from the environment variable `var`.
    ///
    /// # Errors
    /// [`SignerError::KeyUnavailable`] when unset or not a key (the value is never shown).
    pub fn from_env(var: &str) -> Result<Self, SignerError> {
        let raw = std::env::var(var)
            .map_err(|_| SignerError::KeyUnavailable("environment variable not set"))?;
        Self::from_hex(&raw).map_err(|_| {
            SignerError::KeyUnavailable("environment variable does not hold a hex key")
        })
    }

    /// Parses a hex private key (`0x` optional; surrounding whitespace ignored).
    ///
    /// # Errors
    /// [`SignerError::KeyUnavailable`] when it is not a secp256k1 private key (the value
    /// is never shown).
    pub fn from_hex(raw: &str) -> Result<Self, SignerError> {
        let inner: PrivateKeySigner = raw
            .trim()
            .parse()
            .map_err(|_| SignerError::KeyUnavailable("not a hex secp256k1 private key"))?;
        Ok(Self::new(inner))
    }

    /// Decrypts an encrypted JSON keystore (Web3 Secret Storage, as written by geth
    /// and foundry).
    ///
    /// # Errors
    /// [`SignerError::KeyUnavailable`] when the file is unreadable or the password wrong.
    pub fn from_keystore(path: &Path, password: &str) -> Result<Self, SignerError> {
        let inner = PrivateKeySigner::decrypt_keystore(path, password)
            .map_err(|_| SignerError::KeyUnavailable("keystore could not be decrypted"))?;
        Ok(Self::new(inner))
    }

    /// Signs `hash` on the blocking pool (one signature per core at once).
    async fn sign_hash_pooled(&self, hash: B256) -> alloy::signers::Result<Signature> {
        let key = self.inner.clone();
        // At most one signature per core at once (process-wide): more threads only
        // take CPU time from the database and node sharing the machine.
        let _core = signing_cores()
            .acquire()
            .await
            .map_err(|_| SignerError::Failed)?;
        tokio::task::spawn_blocking(move || key.sign_hash_sync(&hash))
            .await
            .map_err(|_| SignerError::Failed)?
    }
}

#[async_trait::async_trait]
impl alloy::network::TxSigner<Signature> for LocalSigner {
    fn address(&self) -> Address {
        LocalSigner::address(self)
    }

    /// Signs the transaction's signing hash (EIP-155 replay protection comes from the
    /// chain id the caller set; a key with a chain id refuses another one, as alloy's).
    async fn sign_transaction(
        &self,
        tx: &mut dyn SignableTransaction<Signature>,
    ) -> alloy::signers::Result<Signature> {
        check_chain_id(alloy::signers::Signer::chain_id(&*self.inner), tx)?;
        let hash = tx.signature_hash();
        self.sign_hash_pooled(hash).await
    }
}

#[async_trait::async_trait]
impl alloy::signers::Signer<Signature> for LocalSigner {
    async fn sign_hash(&self, hash: &B256) -> alloy::signers::Result<Signature> {
        self.sign_hash_pooled(*hash).await
    }

    fn address(&self) -> Address {
        LocalSigner::address(self)
    }

    fn chain_id(&self) -> Option<ChainId> {
        alloy::signers::Signer::chain_id(&*self.inner)
    }

    fn set_chain_id(&mut self, chain_id: Option<ChainId>) {
        alloy::signers::Signer::set_chain_id(Arc::make_mut(&mut self.inner), chain_id);
    }
}

/// alloy's EIP-155 rule: a signer bound to a chain fills in a missing chain id and
/// refuses a transaction of another chain.
fn check_chain_id(
    signer: Option<ChainId>,
    tx: &mut dyn SignableTransaction<Signature>,
) -> alloy::signers::Result<()> {
    if let Some(chain_id) = signer
        && !tx.set_chain_id_checked(chain_id)
    {
        return Err(alloy::signers::Error::TransactionChainIdMismatch {
            signer: chain_id,
            tx: tx.chain_id().unwrap_or_default(),
        });
    }
    Ok(())
}

/// Permits for concurrent local signatures: the number of cores.
fn signing_cores() -> &'static tokio::sync::Semaphore {
    static CORES: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    CORES.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// One signing key of the process, shared: built once at start from the configuration
/// and handed to every part that signs with it — the transaction queue (as a
/// [`TxSigner`]), the ERC-4337 bundler (its address is the bundle sender) and the
/// paymaster sponsor (as an alloy [`alloy::signers::Signer`]). Cloning shares the key.
///
/// It wraps any alloy [`FullSigner`] (transaction and hash signing): a local key
/// ([`SignerHandle::local`]), a keystore, or a remote signer such as alloy's AWS KMS
/// signer ([`SignerHandle::new`]). `Debug` shows the kind and the address, never key
/// material.
#[derive(Clone)]
pub struct SignerHandle {
    inner: Arc<dyn FullSigner<Signature> + Send + Sync>,
    /// What kind of key this is, for logs (`local key`, `keystore`, ...).
    kind: &'static str,
    /// alloy's per-handle EIP-155 setting ([`alloy::signers::Signer::set_chain_id`]).
    chain_id: Option<ChainId>,
}

impl std::fmt::Debug for SignerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignerHandle")
            .field("kind", &self.kind)
            .field("address", &self.address())
            .finish()
    }
}

impl SignerHandle {
    /// Shares `signer`, an alloy signer of any kind; `kind` names it in logs (a fixed
    /// word such as `"awsKms"`, never a secret).
    pub fn new(
        signer: impl FullSigner<Signature> + Send + Sync + 'static,
        kind: &'static str,
    ) -> Self {
        Self {
            inner: Arc::new(signer),
            kind,
            chain_id: None,
        }
    }

    /// A local key ([`LocalSigner`]: signatures on the blocking pool).
    pub fn local(key: PrivateKeySigner) -> Self {
        Self::new(LocalSigner::new(key), "local")
    }

    /// The key's address.
    pub fn address(&self) -> Address {
        alloy::network::TxSigner::address(&*self.inner)
    }

    /// The kind of key, as given at construction (for logs).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The handle as the queue's signer.
    pub fn tx_signer(&self) -> Arc<dyn TxSigner> {
        Arc::new(self.clone())
    }
}

#[async_trait::async_trait]
impl alloy::network::TxSigner<Signature> for SignerHandle {
    fn address(&self) -> Address {
        SignerHandle::address(self)
    }

    async fn sign_transaction(
        &self,
        tx: &mut dyn SignableTransaction<Signature>,
    ) -> alloy::signers::Result<Signature> {
        check_chain_id(self.chain_id, tx)?;
        alloy::network::TxSigner::sign_transaction(&*self.inner, tx).await
    }
}

#[async_trait::async_trait]
impl alloy::signers::Signer<Signature> for SignerHandle {
    async fn sign_hash(&self, hash: &B256) -> alloy::signers::Result<Signature> {
        alloy::signers::Signer::sign_hash(&*self.inner, hash).await
    }

    fn address(&self) -> Address {
        SignerHandle::address(self)
    }

    fn chain_id(&self) -> Option<ChainId> {
        self.chain_id
    }

    fn set_chain_id(&mut self, chain_id: Option<ChainId>) {
        self.chain_id = chain_id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::consensus::TxEip1559;
    use alloy::network::TxSignerSync;
    use alloy::primitives::{Bytes, TxKind, U256};

    fn transfer(chain_id: u64) -> TypedTransaction {
        TxEip1559 {
            chain_id,
            nonce: 7,
            gas_limit: 21_000,
            max_fee_per_gas: 2_000_000_000,
            max_priority_fee_per_gas: 1_000_000_000,
            to: TxKind::Call(Address::repeat_byte(0x42)),
            value: U256::from(1),
            access_list: Default::default(),
            input: Bytes::new(),
        }
        .into()
    }

    #[tokio::test]
    async fn a_handle_signs_as_the_key_itself_does() {
        let key = PrivateKeySigner::random();
        let handle = SignerHandle::local(key.clone());
        assert_eq!(handle.address(), key.address());
        let envelope = TxSigner::sign(&handle, transfer(31_337)).await.unwrap();
        let mut expected = transfer(31_337);
        let sig = key.sign_transaction_sync(&mut expected).unwrap();
        assert_eq!(envelope, expected.into_envelope(sig));
        let hash = B256::repeat_byte(7);
        let by_handle = alloy::signers::Signer::sign_hash(&handle, &hash)
            .await
            .unwrap();
        assert_eq!(by_handle, key.sign_hash_sync(&hash).unwrap());
        // A clone shares the key.
        assert_eq!(handle.clone().address(), key.address());
        assert!(!format!("{handle:?}").contains(&alloy::hex::encode(key.to_bytes())));
    }

    #[tokio::test]
    async fn a_handle_bound_to_a_chain_refuses_another() {
        let mut handle = SignerHandle::local(PrivateKeySigner::random());
        alloy::signers::Signer::set_chain_id(&mut handle, Some(1));
        let e = TxSigner::sign(&handle, transfer(31_337)).await.unwrap_err();
        assert!(matches!(e, SignerError::Failed), "{e:?}");
        assert!(TxSigner::sign(&handle, transfer(1)).await.is_ok());
    }

    /// A remote signer that is unreachable, as a KMS signer reports it.
    struct Unreachable(Address);

    #[async_trait::async_trait]
    impl alloy::network::TxSigner<Signature> for Unreachable {
        fn address(&self) -> Address {
            self.0
        }
        async fn sign_transaction(
            &self,
            _tx: &mut dyn SignableTransaction<Signature>,
        ) -> alloy::signers::Result<Signature> {
            Err(SignerError::Unavailable.into())
        }
    }

    #[async_trait::async_trait]
    impl alloy::signers::Signer<Signature> for Unreachable {
        async fn sign_hash(&self, _hash: &B256) -> alloy::signers::Result<Signature> {
            Err(alloy::signers::Error::message("throttled"))
        }
        fn address(&self) -> Address {
            self.0
        }
        fn chain_id(&self) -> Option<ChainId> {
            None
        }
        fn set_chain_id(&mut self, _chain_id: Option<ChainId>) {}
    }

    #[tokio::test]
    async fn a_remote_signers_errors_keep_their_class() {
        let handle = SignerHandle::new(Unreachable(Address::repeat_byte(1)), "remote");
        assert_eq!(handle.kind(), "remote");
        let e = handle.tx_signer().sign(transfer(1)).await.unwrap_err();
        assert!(e.is_retryable(), "{e:?}");
        let e = SignerError::from_alloy(
            alloy::signers::Signer::sign_hash(&handle, &B256::ZERO)
                .await
                .unwrap_err(),
        );
        assert!(!e.is_retryable(), "{e:?}");
    }
}
