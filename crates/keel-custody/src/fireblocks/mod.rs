//! [`FireblocksProvider`]: the [`CustodyProvider`] that speaks the Fireblocks REST API.
//!
//! Pointing it at a real workspace is configuration only ([`FireblocksConfig`]): the
//! base URL (`https://api.fireblocks.io`, or a sandbox, or `keel-custody-sim`), the API
//! key and the API user's RSA private key named as secret sources, and a rate limit.
//!
//! Every request carries `X-API-Key` and a fresh RS256 JWT ([`auth`]) whose `bodyHash`
//! is computed over the very bytes sent. A 429 is retried after its `Retry-After`
//! (capped, bounded count; each retry is signed anew); every request first waits for
//! the account's governor rate limit.

pub mod auth;
pub mod status;
pub mod wire;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use crate::error::{CustodyError, TransportStage, bounded_message};
use crate::provider::{CancelOutcome, CustodyFuture, CustodyProvider};
use crate::secret::{Secret, SecretSource};
use crate::types::{
    ContractCall, Created, Ending, ExternalTxId, ProviderTransaction, ProviderTxId, StatusPhase,
    TxStatus,
};

use auth::RequestSigner;
use wire::{
    CancelResponse, CreateTransactionBody, CreateTransactionResponse, ErrorResponse,
    TransactionResponse,
};

/// The provider's name ([`CustodyProvider::name`]): `fireblocks`.
pub const NAME: &str = "fireblocks";

/// Configuration of one Fireblocks account (workspace API user). Holds secret
/// *sources*, never secret values, so it may be printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FireblocksConfig {
    /// The API origin, without a path: `https://api.fireblocks.io`.
    pub base_url: String,
    /// The API key (`env:NAME` or `file:PATH`).
    pub api_key: SecretSource,
    /// The API user's RSA private key, PEM (`env:NAME` or `file:PATH`).
    pub private_key: SecretSource,
    /// Sustained request rate of this account, requests per second.
    #[serde(default = "default_rps")]
    pub requests_per_second: u32,
    /// Burst above the sustained rate, requests.
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Timeout of one HTTP request, milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How many 429 answers one call waits out before giving up with
    /// [`CustodyError::RateLimited`].
    #[serde(default = "default_429_retries")]
    pub max_rate_limit_retries: u32,
    /// Cap on one `Retry-After` wait, milliseconds (a larger one is cut to this).
    #[serde(default = "default_max_retry_after_ms")]
    pub max_retry_after_ms: u64,
}

fn default_rps() -> u32 {
    20
}
fn default_burst() -> u32 {
    20
}
fn default_timeout_ms() -> u64 {
    10_000
}
fn default_429_retries() -> u32 {
    3
}
fn default_max_retry_after_ms() -> u64 {
    30_000
}

impl FireblocksConfig {
    /// A configuration with the defaults: 20 requests/s, burst 20, 10 s timeout,
    /// three 429 retries, `Retry-After` capped at 30 s.
    pub fn new(
        base_url: impl Into<String>,
        api_key: SecretSource,
        private_key: SecretSource,
    ) -> Self {
        Self {
            base_url: base_url.into(),
            api_key,
            private_key,
            requests_per_second: default_rps(),
            burst: default_burst(),
            request_timeout_ms: default_timeout_ms(),
            max_rate_limit_retries: default_429_retries(),
            max_retry_after_ms: default_max_retry_after_ms(),
        }
    }
}

/// The Fireblocks adapter. Cheap to clone (shared client, limiter and signer).
#[derive(Clone, Debug)]
pub struct FireblocksProvider {
    inner: Arc<Inner>,
}

struct Inner {
    base: reqwest::Url,
    http: reqwest::Client,
    signer: RequestSigner,
    limiter: DefaultDirectRateLimiter,
    max_rate_limit_retries: u32,
    max_retry_after: Duration,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FireblocksProvider")
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

/// A raw answer: status, `Retry-After`, body bytes.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

/// Why a request got no answer.
enum Failure {
    /// Never left (connect failure) or left and was lost.
    Transport(TransportStage, &'static str),
    /// 429s outlasted the retries.
    RateLimited(Option<Duration>),
    /// Building the request failed (signing).
    Local(CustodyError),
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Parses `Retry-After` as delta-seconds (an HTTP-date is treated as absent).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

impl FireblocksProvider {
    /// Reads the secrets and builds the adapter.
    ///
    /// # Errors
    /// [`CustodyError::SecretUnavailable`] for an unreadable secret,
    /// [`CustodyError::Config`] for a base URL with a path, a key that is not RSA PEM,
    /// or a zero rate.
    pub fn new(config: &FireblocksConfig) -> Result<Self, CustodyError> {
        let api_key = config.api_key.read()?;
        let private_key = config.private_key.read()?;
        Self::with_secrets(config, api_key, &private_key)
    }

    /// Builds the adapter from secrets obtained by the caller.
    ///
    /// # Errors
    /// As [`FireblocksProvider::new`], without the secret reading.
    pub fn with_secrets(
        config: &FireblocksConfig,
        api_key: Secret,
        private_key_pem: &Secret,
    ) -> Result<Self, CustodyError> {
        let base = reqwest::Url::parse(&config.base_url).map_err(|_| CustodyError::Config {
            what: "custody base_url is not a URL".into(),
        })?;
        if base.path() != "/" || base.query().is_some() {
            return Err(CustodyError::Config {
                what: "custody base_url must be an origin without a path".into(),
            });
        }
        let rps =
            NonZeroU32::new(config.requests_per_second).ok_or_else(|| CustodyError::Config {
                what: "custody requests_per_second must be at least 1".into(),
            })?;
        let burst = NonZeroU32::new(config.burst.max(1)).unwrap_or(rps);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.request_timeout_ms))
            .build()
            .map_err(|_| CustodyError::Config {
                what: "custody HTTP client could not be built".into(),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                base,
                http,
                signer: RequestSigner::new(api_key, private_key_pem)?,
                limiter: RateLimiter::direct(Quota::per_second(rps).allow_burst(burst)),
                max_rate_limit_retries: config.max_rate_limit_retries,
                max_retry_after: Duration::from_millis(config.max_retry_after_ms),
            }),
        })
    }

    /// Sends one request (`path_and_query` starts with `/v1/`), waiting for the rate
    /// limit and out 429s; each attempt is signed anew over the same body bytes.
    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, Failure> {
        let inner = &self.inner;
        let url = inner.base.join(path_and_query).map_err(|_| {
            Failure::Local(CustodyError::InvalidInput {
                what: "request path",
            })
        })?;
        let body_bytes = body.unwrap_or_default();
        let mut rate_limited = 0u32;
        loop {
            inner.limiter.until_ready().await;
            let jwt = inner
                .signer
                .sign(path_and_query, &body_bytes, now_secs())
                .map_err(Failure::Local)?;
            let mut request = inner
                .http
                .request(method.clone(), url.clone())
                .header("X-API-Key", inner.signer.api_key().expose())
                .bearer_auth(jwt);
            if method == Method::POST {
                request = request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body_bytes.clone());
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) if e.is_connect() => {
                    return Err(Failure::Transport(
                        TransportStage::Connect,
                        "connect failed",
                    ));
                }
                Err(e) if e.is_timeout() => {
                    return Err(Failure::Transport(TransportStage::Sent, "timeout"));
                }
                Err(_) => return Err(Failure::Transport(TransportStage::Sent, "connection lost")),
            };
            let status = response.status();
            if status == StatusCode::TOO_MANY_REQUESTS {
                let wait = retry_after(response.headers());
                metrics::counter!("keel_custody_rate_limited_total", "provider" => "fireblocks")
                    .increment(1);
                if rate_limited >= inner.max_rate_limit_retries {
                    return Err(Failure::RateLimited(wait));
                }
                rate_limited += 1;
                // Honouring the provider's instruction, not a synchronization sleep.
                let wait = wait
                    .unwrap_or(Duration::from_secs(1))
                    .min(inner.max_retry_after);
                tracing::debug!(target: "custody::fireblocks", wait_ms = wait.as_millis() as u64, "429, waiting Retry-After");
                tokio::time::sleep(wait).await;
                continue;
            }
            let body = match response.bytes().await {
                Ok(bytes) => bytes.to_vec(),
                Err(e) if e.is_timeout() => {
                    return Err(Failure::Transport(TransportStage::Sent, "timeout"));
                }
                Err(_) => return Err(Failure::Transport(TransportStage::Sent, "answer truncated")),
            };
            return Ok(Answer { status, body });
        }
    }

    fn read_failure(failure: Failure) -> CustodyError {
        match failure {
            Failure::Transport(stage, _) => CustodyError::Transport { stage },
            Failure::RateLimited(retry_after) => CustodyError::RateLimited { retry_after },
            Failure::Local(e) => e,
        }
    }

    fn error_answer(answer: &Answer) -> CustodyError {
        let parsed: ErrorResponse = serde_json::from_slice(&answer.body).unwrap_or_default();
        let http_status = answer.status.as_u16();
        match answer.status {
            StatusCode::NOT_FOUND => CustodyError::NotFound,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => CustodyError::Unauthorized {
                http_status,
                code: parsed.code,
            },
            s if s.is_server_error() => CustodyError::Unavailable { http_status },
            _ => CustodyError::Refused {
                http_status,
                code: parsed.code,
                message: bounded_message(parsed.message.as_deref().unwrap_or("")),
            },
        }
    }

    /// True when a 400 says the external id exists already.
    fn is_duplicate_external_id(answer: &Answer) -> bool {
        if answer.status != StatusCode::BAD_REQUEST {
            return false;
        }
        let parsed: ErrorResponse = serde_json::from_slice(&answer.body).unwrap_or_default();
        let message = parsed.message.unwrap_or_default().to_ascii_lowercase();
        message.contains("externaltxid")
            && (message.contains("already") || message.contains("exist"))
    }

    fn observe(op: &'static str, result: &Result<impl Sized, CustodyError>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        metrics::counter!("keel_custody_requests_total", "provider" => "fireblocks", "op" => op, "outcome" => outcome)
            .increment(1);
    }

    async fn create(&self, call: &ContractCall) -> Result<Created, CustodyError> {
        let body =
            serde_json::to_vec(&CreateTransactionBody::contract_call(call)).map_err(|_| {
                CustodyError::InvalidInput {
                    what: "contract call",
                }
            })?;
        let in_doubt = |cause: &str| CustodyError::InDoubt {
            external_tx_id: call.external_tx_id.clone(),
            cause: cause.to_owned(),
        };
        let answer = match self
            .send(Method::POST, "/v1/transactions", Some(body))
            .await
        {
            Ok(answer) => answer,
            Err(Failure::Transport(TransportStage::Connect, _)) => {
                return Err(CustodyError::Transport {
                    stage: TransportStage::Connect,
                });
            }
            Err(Failure::Transport(TransportStage::Sent, cause)) => return Err(in_doubt(cause)),
            Err(Failure::RateLimited(retry_after)) => {
                return Err(CustodyError::RateLimited { retry_after });
            }
            Err(Failure::Local(e)) => return Err(e),
        };
        if answer.status.is_success() {
            let created: CreateTransactionResponse =
                serde_json::from_slice(&answer.body).map_err(|_| in_doubt("unreadable answer"))?;
            let id = ProviderTxId::new(created.id).map_err(|_| in_doubt("unreadable id"))?;
            return Ok(Created {
                id,
                status: created.status,
            });
        }
        if answer.status.is_server_error() {
            return Err(in_doubt(&format!("HTTP {}", answer.status.as_u16())));
        }
        if Self::is_duplicate_external_id(&answer) {
            return Err(CustodyError::DuplicateExternalTxId {
                external_tx_id: call.external_tx_id.clone(),
            });
        }
        Err(Self::error_answer(&answer))
    }

    async fn read_transaction(&self, path: &str) -> Result<ProviderTransaction, CustodyError> {
        let answer = self
            .send(Method::GET, path, None)
            .await
            .map_err(Self::read_failure)?;
        if !answer.status.is_success() {
            return Err(Self::error_answer(&answer));
        }
        let wire: TransactionResponse =
            serde_json::from_slice(&answer.body).map_err(|_| CustodyError::Decode {
                what: "transaction",
            })?;
        wire.into_typed()
    }

    async fn cancel_inner(&self, id: &ProviderTxId) -> Result<CancelOutcome, CustodyError> {
        let path = format!("/v1/transactions/{}/cancel", id.as_str());
        let answer = self
            .send(Method::POST, &path, Some(b"{}".to_vec()))
            .await
            .map_err(Self::read_failure)?;
        if answer.status.is_success() {
            let parsed: CancelResponse =
                serde_json::from_slice(&answer.body).map_err(|_| CustodyError::Decode {
                    what: "cancel answer",
                })?;
            return Ok(if parsed.success {
                CancelOutcome::Accepted
            } else {
                CancelOutcome::Declined
            });
        }
        if answer.status == StatusCode::BAD_REQUEST {
            return Ok(CancelOutcome::Declined);
        }
        Err(Self::error_answer(&answer))
    }
}

impl CustodyProvider for FireblocksProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn status_phase(&self, status: &TxStatus) -> StatusPhase {
        status::phase(status)
    }

    fn status_rank(&self, status: &TxStatus) -> u8 {
        status::rank(status)
    }

    fn status_ending(&self, status: &TxStatus) -> Option<Ending> {
        status::ending(status)
    }

    fn in_doubt_window(&self) -> Duration {
        Duration::from_secs(auth::JWT_LIFETIME_SECS)
    }

    fn create_contract_call<'a>(&'a self, call: &'a ContractCall) -> CustodyFuture<'a, Created> {
        Box::pin(async move {
            let result = self.create(call).await;
            Self::observe("create", &result);
            result
        })
    }

    fn get<'a>(&'a self, id: &'a ProviderTxId) -> CustodyFuture<'a, ProviderTransaction> {
        Box::pin(async move {
            let result = self
                .read_transaction(&format!("/v1/transactions/{}", id.as_str()))
                .await;
            Self::observe("get", &result);
            result
        })
    }

    fn get_by_external_id<'a>(
        &'a self,
        external_tx_id: &'a ExternalTxId,
    ) -> CustodyFuture<'a, Option<ProviderTransaction>> {
        Box::pin(async move {
            let path = format!(
                "/v1/transactions/external_tx_id/{}",
                external_tx_id.as_str()
            );
            let result = match self.read_transaction(&path).await {
                Ok(tx) => Ok(Some(tx)),
                Err(CustodyError::NotFound) => Ok(None),
                Err(e) => Err(e),
            };
            Self::observe("get_by_external_id", &result);
            result
        })
    }

    fn cancel<'a>(&'a self, id: &'a ProviderTxId) -> CustodyFuture<'a, CancelOutcome> {
        Box::pin(async move {
            let result = self.cancel_inner(id).await;
            Self::observe("cancel", &result);
            result
        })
    }
}
