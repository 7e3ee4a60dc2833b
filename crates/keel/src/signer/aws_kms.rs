//! The AWS KMS signer kind (`kind = "awsKms"`): alloy's AWS signer
//! ([`alloy::signers::aws::AwsSigner`]) over the AWS SDK's KMS client, with its errors
//! classified for the queue.
//!
//! - The key is an asymmetric `ECC_SECG_P256K1` key with `SIGN_VERIFY` usage; Keel
//!   sends the transaction's 32-byte signing hash as `MessageType = DIGEST` with
//!   `SigningAlgorithm = ECDSA_SHA_256`, and alloy turns KMS's DER signature into an
//!   Ethereum one: `s` normalised to the lower half (EIP-2) and the recovery id found by
//!   trial recovery against the key's public key (read once, at start, with
//!   `GetPublicKey`). The private key never leaves KMS.
//! - Calls time out (connect 2 s, one attempt 5 s, a call with its retries 15 s) and
//!   are retried by the SDK's standard mode (3 attempts, exponential backoff with
//!   jitter, throttling included).
//! - A failure the SDK gives up on is classified ([`classify`]): unreachable, timed
//!   out, throttled (`ThrottlingException`, HTTP 400) or a KMS-side fault (HTTP 5xx,
//!   `KMSInternalException`, `DependencyTimeoutException`, `KeyUnavailableException`)
//!   is [`SignerError::Unavailable`]; a disabled, missing or pending-deletion key, or
//!   credentials KMS refuses, is [`SignerError::Refused`] with its
//!   [`SignerRefusal`]. The queue persists nothing for a signature it did not get: the
//!   request stays queued, the failure is counted
//!   (`keel_txq_sign_failures_total{reason}`) and the rounds back off and resume when
//!   KMS answers again.

use alloy::consensus::SignableTransaction;
use alloy::primitives::{Address, B256, ChainId, Signature};
use alloy::signers::aws::{AwsSigner, AwsSignerError};
use aws_sdk_kms::error::{ProvideErrorMetadata, SdkError};
use keel_txq::{SignerError, SignerRefusal};
use std::time::Duration;

/// Connect timeout of a KMS call.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of one attempt of a KMS call.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of a KMS call with its retries.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts per KMS call (the SDK's standard retry mode).
pub const MAX_ATTEMPTS: u32 = 3;

/// A key in AWS KMS as an alloy signer whose failures keep their class
/// ([`SignerError`] boxed in `alloy::signers::Error::Other`, what
/// [`SignerError::from_alloy`] reads). `Debug` shows the key id and the address.
#[derive(Clone)]
pub struct KmsSigner {
    inner: AwsSigner,
    key_id: String,
}

impl std::fmt::Debug for KmsSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KmsSigner")
            .field("key_id", &self.key_id)
            .field("address", &alloy::signers::Signer::address(&self.inner))
            .finish()
    }
}

impl KmsSigner {
    /// Connects to KMS in `region` (at `endpoint` when given, e.g. a VPC endpoint or a
    /// local counterpart) with the AWS SDK's default credential chain, and reads the
    /// public key of `key_id` (key id, key ARN, alias or alias ARN) once: the signer's
    /// address is derived from it.
    ///
    /// # Errors
    /// [`SignerError::Unavailable`] when KMS cannot be reached or throttles;
    /// [`SignerError::Refused`] when the key is disabled, missing or not usable, or the
    /// credentials are refused; [`SignerError::Refused`] with
    /// [`SignerRefusal::WrongKey`] when the key is not a secp256k1 key.
    pub async fn connect(
        key_id: &str,
        region: &str,
        endpoint: Option<&str>,
    ) -> Result<Self, SignerError> {
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .operation_timeout(CALL_TIMEOUT)
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region.to_owned()))
            .timeout_config(timeouts)
            .retry_config(
                aws_config::retry::RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS),
            );
        if let Some(endpoint) = endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        let client = aws_sdk_kms::Client::new(&config);
        let inner = AwsSigner::new(client, key_id.to_owned(), None)
            .await
            .map_err(|e| classify(&e))?;
        Ok(Self {
            inner,
            key_id: key_id.to_owned(),
        })
    }

    /// The key's Ethereum address (from its public key, read at start).
    pub fn address(&self) -> Address {
        alloy::signers::Signer::address(&self.inner)
    }

    /// The configured key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }
}

/// What the queue sees of an AWS signer failure (see the module docs). The text of
/// KMS's message is not kept.
pub fn classify(e: &AwsSignerError) -> SignerError {
    match e {
        AwsSignerError::Sign(e) => sdk(e),
        AwsSignerError::GetPublicKey(e) => sdk(e),
        // A public key that is not a secp256k1 point, or a signature that does not
        // recover to it: not a key for Ethereum (or an alias moved to another key).
        AwsSignerError::K256(_)
        | AwsSignerError::Spki(_)
        | AwsSignerError::Hex(_)
        | AwsSignerError::PublicKeyNotFound
        | AwsSignerError::SignatureRecoveryFailed => SignerError::Refused(SignerRefusal::WrongKey),
        _ => SignerError::Failed,
    }
}

fn sdk<E: ProvideErrorMetadata>(e: &SdkError<E>) -> SignerError {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            SignerError::Unavailable
        }
        SdkError::ServiceError(s) => by_code(s.err().code(), e),
        _ => SignerError::Failed,
    }
}

/// A KMS error code's class; an unknown code is [`SignerError::Unavailable`] when KMS
/// answered 5xx, else [`SignerError::Failed`].
fn by_code<E>(code: Option<&str>, e: &SdkError<E>) -> SignerError {
    match code.unwrap_or_default() {
        "ThrottlingException"
        | "KMSInternalException"
        | "DependencyTimeoutException"
        | "KeyUnavailableException"
        | "ServiceUnavailableException"
        | "InternalFailure" => SignerError::Unavailable,
        "DisabledException" => SignerError::Refused(SignerRefusal::KeyDisabled),
        "NotFoundException" => SignerError::Refused(SignerRefusal::KeyNotFound),
        "KMSInvalidStateException" => SignerError::Refused(SignerRefusal::KeyState),
        "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "IncompleteSignatureException"
        | "MissingAuthenticationTokenException"
        | "ExpiredTokenException"
        | "InvalidGrantTokenException" => SignerError::Refused(SignerRefusal::AccessDenied),
        "InvalidKeyUsageException" | "UnsupportedOperationException" => {
            SignerError::Refused(SignerRefusal::WrongKey)
        }
        _ if server_side(e) => SignerError::Unavailable,
        _ => SignerError::Failed,
    }
}

fn server_side<E>(e: &SdkError<E>) -> bool {
    match e {
        SdkError::ServiceError(_) => e
            .raw_response()
            .is_some_and(|r| r.status().is_server_error()),
        _ => false,
    }
}

/// An alloy signing error with an AWS failure replaced by its class. alloy's
/// transaction signing wraps the hash signer's error once more
/// (`Other(Other(AwsSignerError))`), so nested alloy errors are unwrapped first.
fn reclassify(e: alloy::signers::Error) -> alloy::signers::Error {
    match e {
        alloy::signers::Error::Other(inner) => match inner.downcast::<AwsSignerError>() {
            Ok(aws) => classify(&aws).into(),
            Err(other) => match other.downcast::<alloy::signers::Error>() {
                Ok(nested) => reclassify(*nested),
                Err(other) => alloy::signers::Error::Other(other),
            },
        },
        other => other,
    }
}

#[async_trait::async_trait]
impl alloy::network::TxSigner<Signature> for KmsSigner {
    fn address(&self) -> Address {
        KmsSigner::address(self)
    }

    /// Signs the transaction's signing hash in KMS (EIP-155 replay protection comes from
    /// the chain id the caller set).
    async fn sign_transaction(
        &self,
        tx: &mut dyn SignableTransaction<Signature>,
    ) -> alloy::signers::Result<Signature> {
        alloy::network::TxSigner::sign_transaction(&self.inner, tx)
            .await
            .map_err(reclassify)
    }
}

#[async_trait::async_trait]
impl alloy::signers::Signer<Signature> for KmsSigner {
    async fn sign_hash(&self, hash: &B256) -> alloy::signers::Result<Signature> {
        alloy::signers::Signer::sign_hash(&self.inner, hash)
            .await
            .map_err(reclassify)
    }

    fn address(&self) -> Address {
        KmsSigner::address(self)
    }

    fn chain_id(&self) -> Option<ChainId> {
        alloy::signers::Signer::chain_id(&self.inner)
    }

    fn set_chain_id(&mut self, chain_id: Option<ChainId>) {
        alloy::signers::Signer::set_chain_id(&mut self.inner, chain_id);
    }
}
