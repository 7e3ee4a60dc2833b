//! Verification of request JWTs, the way the provider does it: the signature with the
//! API user's registered public key (RS256), `sub` = the `X-API-Key`, `uri` = the
//! request's path and query, `bodyHash` = hex SHA-256 of the body bytes received, a
//! lifetime under 30 s, not issued in the future, not expired, and a nonce never seen
//! before. A refusal is HTTP 401 with the provider's error code.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Seconds a request may be issued ahead of the provider's clock.
const MAX_FUTURE_SKEW_SECS: u64 = 5;

/// A refusal: the provider's error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: i64,
    pub(crate) message: &'static str,
}

const fn refuse(code: i64, message: &'static str) -> Refusal {
    Refusal { code, message }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Claims {
    uri: String,
    nonce: String,
    iat: u64,
    exp: u64,
    sub: String,
    body_hash: String,
}

/// The registered API users and the nonces seen.
pub(crate) struct Verifier {
    users: HashMap<String, DecodingKey>,
    nonces: Mutex<HashMap<String, u64>>,
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Verifier {
    pub(crate) fn new(users: HashMap<String, DecodingKey>) -> Self {
        Self {
            users,
            nonces: Mutex::new(HashMap::new()),
        }
    }

    /// Verifies one request.
    pub(crate) fn verify(
        &self,
        api_key: Option<&str>,
        authorization: Option<&str>,
        path_and_query: &str,
        body: &[u8],
    ) -> Result<(), Refusal> {
        let api_key = api_key.ok_or(refuse(-2, "Missing API key"))?;
        let key = self
            .users
            .get(api_key)
            .ok_or(refuse(-7, "Unauthorized: Token was not accepted"))?;
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(refuse(-3, "Missing JWT"))?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.set_required_spec_claims(&["exp", "iat", "sub"]);
        let claims = jsonwebtoken::decode::<Claims>(token, key, &validation)
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature => refuse(-1, "Invalid signature"),
                ErrorKind::ExpiredSignature => refuse(-10, "The request has expired"),
                _ => refuse(-5, "Unauthorized: Invalid token format"),
            })?
            .claims;
        if claims.sub != api_key {
            return Err(refuse(-6, "Wrong user in the JWT"));
        }
        if claims.uri != path_and_query {
            return Err(refuse(-4, "Wrong URL in the JWT"));
        }
        let hash = hex::encode(Sha256::digest(body));
        if claims.body_hash != hash {
            return Err(refuse(
                -7,
                "Unauthorized: Token was not accepted (bodyHash)",
            ));
        }
        let now = now_secs();
        if claims.exp <= claims.iat || claims.exp >= claims.iat + 30 {
            return Err(refuse(
                -7,
                "Unauthorized: Token was not accepted (lifetime)",
            ));
        }
        if claims.iat > now + MAX_FUTURE_SKEW_SECS {
            return Err(refuse(-12, "The request is issued in the future"));
        }
        let mut nonces = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        nonces.retain(|_, exp| *exp + MAX_FUTURE_SKEW_SECS >= now);
        if nonces.contains_key(&claims.nonce) {
            return Err(refuse(
                -7,
                "Unauthorized: Token was not accepted (nonce reused)",
            ));
        }
        nonces.insert(claims.nonce, claims.exp);
        Ok(())
    }
}
