//! Fireblocks webhooks v2: the typed event and its verification.
//!
//! Each delivery carries `Fireblocks-Webhook-Signature: <protected>..<signature>`, a
//! compact JWS (RS512) with its payload detached: the payload is the **raw request
//! body**, re-inserted base64url-encoded for verification (never a re-serialization of
//! parsed JSON). The key is found by the header's `kid` in the provider's JWKS
//! (`/.well-known/jwks.json`), fetched once and cached; an unknown `kid` triggers a
//! refetch, at most one per [`WebhookVerifierConfig::min_refetch_interval`], so a flood of
//! forged `kid`s cannot turn into a flood of JWKS requests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::error::CustodyError;
use crate::fireblocks::wire::TransactionResponse;
use crate::types::ProviderTransaction;

/// The header carrying the detached JWS.
pub const SIGNATURE_HEADER: &str = "Fireblocks-Webhook-Signature";

/// The well-known path of the JWKS at a provider's key origin.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// A webhook event's type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WebhookEventType {
    /// `transaction.created`.
    TransactionCreated,
    /// `transaction.status.updated`.
    TransactionStatusUpdated,
    /// Any other type, kept verbatim (acknowledged, not acted on).
    Unknown(String),
}

impl WebhookEventType {
    fn parse(text: &str) -> Self {
        match text {
            "transaction.created" => Self::TransactionCreated,
            "transaction.status.updated" => Self::TransactionStatusUpdated,
            other => Self::Unknown(other.to_owned()),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEvent {
    id: String,
    event_type: String,
    #[serde(default)]
    event_version: Option<serde_json::Value>,
    #[serde(default)]
    resource_id: Option<String>,
    created_at: u64,
    #[serde(default)]
    data: serde_json::Value,
}

/// A verified webhook v2 event.
#[derive(Clone, Debug, PartialEq)]
pub struct WebhookEvent {
    /// The event's id: the dedupe key (a redelivery carries the same id).
    pub id: String,
    /// The type.
    pub event_type: WebhookEventType,
    /// The payload version (`1`), as sent (a number or a string).
    pub event_version: String,
    /// The resource the event is about (the provider transaction id).
    pub resource_id: Option<String>,
    /// When the provider created the event, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// The payload: for transaction events, the transaction as the REST API shows it.
    pub data: serde_json::Value,
}

impl WebhookEvent {
    /// The transaction in `data`, for `transaction.*` events.
    ///
    /// # Errors
    /// [`CustodyError::Decode`] when `data` is not a transaction.
    pub fn transaction(&self) -> Result<ProviderTransaction, CustodyError> {
        let wire: TransactionResponse =
            serde_json::from_value(self.data.clone()).map_err(|_| CustodyError::Decode {
                what: "webhook data",
            })?;
        wire.into_typed()
    }

    /// Parses a raw body (after verification).
    ///
    /// # Errors
    /// [`WebhookError::Event`] when the body is not a webhook v2 event.
    pub fn parse(raw_body: &[u8]) -> Result<Self, WebhookError> {
        let wire: WireEvent = serde_json::from_slice(raw_body).map_err(|_| WebhookError::Event)?;
        Ok(Self {
            id: wire.id,
            event_type: WebhookEventType::parse(&wire.event_type),
            event_version: match wire.event_version {
                Some(serde_json::Value::String(s)) => s,
                Some(other) => other.to_string(),
                None => String::new(),
            },
            resource_id: wire.resource_id,
            created_at_ms: wire.created_at,
            data: wire.data,
        })
    }
}

/// Why a delivery was refused. Every variant means: answer 401 (413 for
/// [`BodyTooLarge`](WebhookError::BodyTooLarge)) and record nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WebhookError {
    /// No signature header.
    #[error("webhook signature missing")]
    MissingSignature,
    /// Not `<protected>..<signature>` with a readable protected header.
    #[error("webhook signature malformed")]
    MalformedSignature,
    /// The header's `alg` is not RS512.
    #[error("webhook signature algorithm not accepted")]
    Algorithm,
    /// No key with the header's `kid`, even after a refetch (or a refetch was not due).
    #[error("webhook signing key unknown")]
    UnknownKey,
    /// The signature does not verify over the raw body.
    #[error("webhook signature invalid")]
    BadSignature,
    /// The body exceeds the configured bound.
    #[error("webhook body too large")]
    BodyTooLarge,
    /// The JWKS could not be fetched or read (and no cached key matched).
    #[error("webhook key set unavailable")]
    KeysUnavailable,
    /// Verified, but the body is not a webhook v2 event.
    #[error("webhook event unreadable")]
    Event,
}

impl WebhookError {
    /// A short, bounded code for metric labels.
    pub fn code(&self) -> &'static str {
        match self {
            WebhookError::MissingSignature => "missing_signature",
            WebhookError::MalformedSignature => "malformed_signature",
            WebhookError::Algorithm => "algorithm",
            WebhookError::UnknownKey => "unknown_key",
            WebhookError::BadSignature => "bad_signature",
            WebhookError::BodyTooLarge => "body_too_large",
            WebhookError::KeysUnavailable => "keys_unavailable",
            WebhookError::Event => "event",
        }
    }
}

/// Configuration of a [`WebhookVerifier`].
#[derive(Clone, Debug)]
pub struct WebhookVerifierConfig {
    /// The JWKS URL (Fireblocks: `https://keys.fireblocks.io/.well-known/jwks.json`;
    /// the simulator: `<base>/.well-known/jwks.json`).
    pub jwks_url: String,
    /// Minimum time between two JWKS fetches caused by unknown `kid`s.
    pub min_refetch_interval: Duration,
    /// Largest body accepted, bytes.
    pub max_body_bytes: usize,
    /// Timeout of a JWKS fetch.
    pub fetch_timeout: Duration,
}

impl WebhookVerifierConfig {
    /// Defaults: refetch at most every 30 s, bodies up to 256 KiB, 5 s fetch timeout.
    pub fn new(jwks_url: impl Into<String>) -> Self {
        Self {
            jwks_url: jwks_url.into(),
            min_refetch_interval: Duration::from_secs(30),
            max_body_bytes: 256 * 1024,
            fetch_timeout: Duration::from_secs(5),
        }
    }
}

struct KeyCache {
    keys: HashMap<String, DecodingKey>,
    fetched_at: Option<Instant>,
    fetches: u64,
}

/// Verifies webhook v2 deliveries against a cached JWKS.
pub struct WebhookVerifier {
    config: WebhookVerifierConfig,
    http: reqwest::Client,
    cache: Mutex<KeyCache>,
}

impl std::fmt::Debug for WebhookVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookVerifier")
            .field("jwks_url", &self.config.jwks_url)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct ProtectedHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

impl WebhookVerifier {
    /// A verifier with an empty cache (the first delivery fetches the JWKS).
    ///
    /// # Errors
    /// [`CustodyError::Config`] when the HTTP client cannot be built.
    pub fn new(config: WebhookVerifierConfig) -> Result<Self, CustodyError> {
        let http = reqwest::Client::builder()
            .timeout(config.fetch_timeout)
            .build()
            .map_err(|_| CustodyError::Config {
                what: "webhook JWKS client could not be built".into(),
            })?;
        Ok(Self {
            config,
            http,
            cache: Mutex::new(KeyCache {
                keys: HashMap::new(),
                fetched_at: None,
                fetches: 0,
            }),
        })
    }

    /// How many times the JWKS was fetched (for tests and the refetch bound).
    pub async fn fetch_count(&self) -> u64 {
        self.cache.lock().await.fetches
    }

    async fn fetch(&self, cache: &mut KeyCache) -> Result<(), WebhookError> {
        cache.fetched_at = Some(Instant::now());
        cache.fetches += 1;
        let response = self
            .http
            .get(&self.config.jwks_url)
            .send()
            .await
            .map_err(|_| WebhookError::KeysUnavailable)?;
        if !response.status().is_success() {
            return Err(WebhookError::KeysUnavailable);
        }
        let set: JwkSet = response
            .json()
            .await
            .map_err(|_| WebhookError::KeysUnavailable)?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                continue;
            };
            if let Ok(key) = DecodingKey::from_jwk(jwk) {
                keys.insert(kid, key);
            }
        }
        cache.keys = keys;
        Ok(())
    }

    /// Verifies one delivery and parses its event.
    ///
    /// `signature` is the `Fireblocks-Webhook-Signature` header (`None` when absent);
    /// `raw_body` the exact bytes received.
    ///
    /// # Errors
    /// A [`WebhookError`]: the delivery must be refused and nothing recorded.
    pub async fn verify(
        &self,
        signature: Option<&str>,
        raw_body: &[u8],
    ) -> Result<WebhookEvent, WebhookError> {
        let result = self.verify_inner(signature, raw_body).await;
        let label = match &result {
            Ok(_) => "verified",
            Err(e) => e.code(),
        };
        metrics::counter!("keel_custody_webhook_verifications_total", "provider" => "fireblocks", "result" => label)
            .increment(1);
        result
    }

    async fn verify_inner(
        &self,
        signature: Option<&str>,
        raw_body: &[u8],
    ) -> Result<WebhookEvent, WebhookError> {
        if raw_body.len() > self.config.max_body_bytes {
            return Err(WebhookError::BodyTooLarge);
        }
        let signature = signature.ok_or(WebhookError::MissingSignature)?.trim();
        let mut parts = signature.split('.');
        let (Some(protected), Some(""), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(WebhookError::MalformedSignature);
        };
        let header_bytes = URL_SAFE_NO_PAD
            .decode(protected)
            .map_err(|_| WebhookError::MalformedSignature)?;
        let header: ProtectedHeader =
            serde_json::from_slice(&header_bytes).map_err(|_| WebhookError::MalformedSignature)?;
        if header.alg != "RS512" {
            return Err(WebhookError::Algorithm);
        }
        let kid = header.kid.ok_or(WebhookError::UnknownKey)?;
        let signing_input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(raw_body));

        let mut cache = self.cache.lock().await;
        if !cache.keys.contains_key(&kid) {
            let due = cache
                .fetched_at
                .is_none_or(|at| at.elapsed() >= self.config.min_refetch_interval);
            if due {
                let fetched = self.fetch(&mut cache).await;
                if fetched.is_err() && cache.keys.is_empty() {
                    return Err(WebhookError::KeysUnavailable);
                }
            }
        }
        let key = cache.keys.get(&kid).ok_or(WebhookError::UnknownKey)?;
        let ok = jsonwebtoken::crypto::verify(sig, signing_input.as_bytes(), key, Algorithm::RS512)
            .map_err(|_| WebhookError::BadSignature)?;
        drop(cache);
        if !ok {
            return Err(WebhookError::BadSignature);
        }
        WebhookEvent::parse(raw_body)
    }
}
