//! Webhooks v2: events signed as a detached JWS (RS512) in `Fireblocks-Webhook-Signature`,
//! the JWKS of every key still published, and the delivery faults (none, duplicated,
//! reordered, delayed; a resend of an old event).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// How events are delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WebhookMode {
    /// Each event once, in order.
    #[default]
    Normal,
    /// Recorded, never sent.
    None,
    /// Each event sent twice (same id, same body).
    Duplicate,
    /// Events swapped in pairs (the second of a pair first).
    Reorder,
    /// Each event sent after `delay_ms`.
    Delay,
}

struct SigningKey {
    kid: String,
    key: EncodingKey,
    jwk: Jwk,
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn signing_key(kid: String, private_pem: &[u8]) -> anyhow::Result<SigningKey> {
    let key = EncodingKey::from_rsa_pem(private_pem)?;
    let mut jwk = Jwk::from_encoding_key(&key, Algorithm::RS512)?;
    jwk.common.key_id = Some(kid.clone());
    jwk.common.public_key_use = Some(PublicKeyUse::Signature);
    jwk.common.key_algorithm = Some(KeyAlgorithm::RS512);
    Ok(SigningKey { kid, key, jwk })
}

fn generated_key(kid: String) -> anyhow::Result<SigningKey> {
    let pair = KeyPair::generate(KeySize::Rsa2048)
        .map_err(|_| anyhow::anyhow!("RSA key generation failed"))?;
    let der = pair
        .as_der()
        .map_err(|_| anyhow::anyhow!("RSA key encoding failed"))?;
    signing_key(kid, pem("PRIVATE KEY", der.as_ref()).as_bytes())
}

/// One event as sent: its id and the exact body bytes.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SentEvent {
    pub(crate) id: String,
    pub(crate) event_type: String,
    pub(crate) resource_id: String,
    pub(crate) status: String,
    #[serde(skip)]
    pub(crate) body: Vec<u8>,
}

struct HooksState {
    url: Option<String>,
    mode: WebhookMode,
    delay: Duration,
    keys: Vec<SigningKey>,
    history: Vec<SentEvent>,
    generation: u32,
}

/// The webhook sender.
#[derive(Clone)]
pub(crate) struct Hooks {
    state: Arc<Mutex<HooksState>>,
    queue: mpsc::UnboundedSender<SentEvent>,
}

impl Hooks {
    pub(crate) fn start(url: Option<String>, key_pem: Option<Vec<u8>>) -> anyhow::Result<Self> {
        let first = match key_pem {
            Some(pem) => signing_key("sim-1".into(), &pem)?,
            None => generated_key("sim-1".into())?,
        };
        let state = Arc::new(Mutex::new(HooksState {
            url,
            mode: WebhookMode::Normal,
            delay: Duration::ZERO,
            keys: vec![first],
            history: Vec::new(),
            generation: 1,
        }));
        let (queue, rx) = mpsc::unbounded_channel();
        let hooks = Self { state, queue };
        tokio::spawn(hooks.clone().dispatch(rx));
        Ok(hooks)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HooksState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_url(&self, url: Option<String>) {
        self.lock().url = url;
    }

    pub(crate) fn set_mode(&self, mode: WebhookMode, delay: Duration) {
        let mut state = self.lock();
        state.mode = mode;
        state.delay = delay;
    }

    /// Adds a new key and signs with it from now on; older keys stay in the JWKS.
    pub(crate) fn rotate(&self) -> anyhow::Result<String> {
        let generation = self.lock().generation + 1;
        let kid = format!("sim-{generation}");
        let key = generated_key(kid.clone())?;
        let mut state = self.lock();
        state.generation = generation;
        state.keys.push(key);
        Ok(kid)
    }

    pub(crate) fn jwks(&self) -> JwkSet {
        JwkSet {
            keys: self.lock().keys.iter().map(|k| k.jwk.clone()).collect(),
        }
    }

    pub(crate) fn history(&self) -> Vec<SentEvent> {
        self.lock().history.clone()
    }

    /// Records an event and queues it for delivery.
    pub(crate) fn emit(
        &self,
        event_type: &str,
        resource_id: &str,
        status: &str,
        data: serde_json::Value,
    ) {
        let id = uuid::Uuid::new_v4().to_string();
        let body = serde_json::json!({
            "id": id,
            "eventType": event_type,
            "eventVersion": 1,
            "resourceId": resource_id,
            "createdAt": crate::engine::now_ms(),
            "data": data,
        });
        let event = SentEvent {
            id,
            event_type: event_type.to_owned(),
            resource_id: resource_id.to_owned(),
            status: status.to_owned(),
            body: serde_json::to_vec(&body).unwrap_or_default(),
        };
        self.lock().history.push(event.clone());
        let _ = self.queue.send(event);
    }

    /// Sends an old event again, byte for byte (a provider's resend).
    pub(crate) async fn resend(&self, event_id: &str) -> bool {
        let event = self
            .lock()
            .history
            .iter()
            .find(|e| e.id == event_id)
            .cloned();
        match event {
            Some(event) => {
                self.deliver(&event).await;
                true
            }
            None => false,
        }
    }

    fn sign(&self, body: &[u8]) -> String {
        let state = self.lock();
        let Some(key) = state.keys.last() else {
            return String::new();
        };
        let header = serde_json::json!({"alg": "RS512", "kid": key.kid, "typ": "JOSE"});
        let protected = URL_SAFE_NO_PAD.encode(header.to_string());
        let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(body));
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &key.key, Algorithm::RS512)
            .unwrap_or_default();
        format!("{protected}..{signature}")
    }

    async fn deliver(&self, event: &SentEvent) {
        let Some(url) = self.lock().url.clone() else {
            return;
        };
        let client = reqwest::Client::new();
        for attempt in 0..3u32 {
            let signature = self.sign(&event.body);
            let sent = client
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Fireblocks-Webhook-Signature", signature)
                .timeout(Duration::from_secs(5))
                .body(event.body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => return,
                _ => tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt + 1))).await,
            }
        }
        tracing::warn!(event = %event.id, "webhook not delivered after 3 attempts");
    }

    async fn dispatch(self, mut rx: mpsc::UnboundedReceiver<SentEvent>) {
        let mut held: Option<SentEvent> = None;
        loop {
            let next = if held.is_some() {
                // A held event waits at most this long for a partner to swap with.
                match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        if let Some(h) = held.take() {
                            self.deliver(&h).await;
                        }
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            let Some(event) = next else { return };
            let (mode, delay) = {
                let s = self.lock();
                (s.mode, s.delay)
            };
            match mode {
                WebhookMode::Normal => self.deliver(&event).await,
                WebhookMode::None => {}
                WebhookMode::Duplicate => {
                    self.deliver(&event).await;
                    self.deliver(&event).await;
                }
                WebhookMode::Delay => {
                    tokio::time::sleep(delay).await;
                    self.deliver(&event).await;
                }
                WebhookMode::Reorder => match held.take() {
                    Some(first) => {
                        self.deliver(&event).await;
                        self.deliver(&first).await;
                    }
                    None => held = Some(event),
                },
            }
        }
    }
}
