//! Fireblocks request authentication: `X-API-Key` plus `Authorization: Bearer <JWT>`,
//! the JWT signed RS256 with the API user's RSA key over the claims below.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::CustodyError;
use crate::secret::Secret;

/// A JWT's lifetime in seconds: Fireblocks requires `exp < iat + 30`.
pub const JWT_LIFETIME_SECS: u64 = 29;

/// The claims of a Fireblocks request JWT.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestClaims {
    /// The request's path and query, exactly as sent (`/v1/transactions?limit=1`).
    pub uri: String,
    /// Unique per request (a random UUID); the provider refuses a reused one.
    pub nonce: String,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Expiry, seconds since the Unix epoch (`iat + 29`).
    pub exp: u64,
    /// The API key.
    pub sub: String,
    /// Hex SHA-256 of the exact body bytes sent (of the empty string for no body).
    pub body_hash: String,
}

/// Hex SHA-256 of `body`: the `bodyHash` claim.
pub fn body_hash(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// Signs request JWTs for one API user. `Debug` shows nothing of the key.
pub struct RequestSigner {
    api_key: Secret,
    key: EncodingKey,
}

impl std::fmt::Debug for RequestSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestSigner([redacted])")
    }
}

impl RequestSigner {
    /// Builds a signer from the API key and the API user's RSA private key (PEM,
    /// PKCS#1 or PKCS#8).
    ///
    /// # Errors
    /// [`CustodyError::Config`] when the key does not parse (the key is not shown).
    pub fn new(api_key: Secret, private_key_pem: &Secret) -> Result<Self, CustodyError> {
        let key = EncodingKey::from_rsa_pem(private_key_pem.expose().as_bytes()).map_err(|_| {
            CustodyError::Config {
                what: "the Fireblocks API private key is not an RSA PEM key".into(),
            }
        })?;
        Ok(Self { api_key, key })
    }

    /// The API key, for the `X-API-Key` header.
    pub fn api_key(&self) -> &Secret {
        &self.api_key
    }

    /// Signs the JWT for one request at `now_secs` (seconds since the Unix epoch).
    ///
    /// # Errors
    /// [`CustodyError::Config`] when signing fails (a key RSA refuses).
    pub fn sign(&self, uri: &str, body: &[u8], now_secs: u64) -> Result<String, CustodyError> {
        let claims = RequestClaims {
            uri: uri.to_owned(),
            nonce: uuid::Uuid::new_v4().to_string(),
            iat: now_secs,
            exp: now_secs + JWT_LIFETIME_SECS,
            sub: self.api_key.expose().to_owned(),
            body_hash: body_hash(body),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key).map_err(|_| {
            CustodyError::Config {
                what: "signing the request JWT failed".into(),
            }
        })
    }
}
