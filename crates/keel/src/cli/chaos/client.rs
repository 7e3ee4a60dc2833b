//! The chaos run's HTTP side: a Platform API client that spreads requests over the api
//! replicas and carries on through their deaths (same `Idempotency-Key` on every
//! retry), counting what it was answered; and the local webhook receiver the run's
//! endpoint delivers to.

use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What the client was answered, by class.
#[derive(Debug, Default, Clone)]
pub(super) struct Answers {
    /// Answers by HTTP status.
    pub(super) by_status: BTreeMap<u16, u64>,
    /// Requests that got no HTTP answer (connection refused or reset, timeout).
    pub(super) transport_errors: u64,
}

/// A Platform API client over every api replica.
#[derive(Clone)]
pub(super) struct Api {
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
    answers: Arc<Mutex<Answers>>,
    /// How long one call keeps retrying through transport errors, 5xx and 429.
    patience: Duration,
}

/// One answer: status and JSON body (`Value::Null` when the body is not JSON).
pub(super) type Answer = (u16, Value);

impl Api {
    /// A client over `bases` (`http://127.0.0.1:<port>`).
    pub(super) fn new(bases: Vec<String>, patience: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .context("building the HTTP client")?,
            bases: Arc::new(bases),
            next: Arc::default(),
            answers: Arc::default(),
            patience,
        })
    }

    /// The answers counted so far.
    pub(super) fn answers(&self) -> Answers {
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn count(&self, status: Option<u16>) {
        let mut a = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        match status {
            Some(s) => *a.by_status.entry(s).or_default() += 1,
            None => a.transport_errors += 1,
        }
    }

    fn base(&self) -> &str {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.bases
            .get(i % self.bases.len().max(1))
            .map_or("http://127.0.0.1:1", String::as_str)
    }

    /// One attempt of `method path` on the next replica; `None` on a transport error.
    async fn once(
        &self,
        method: reqwest::Method,
        key: &str,
        path: &str,
        idem: Option<&str>,
        body: Option<&Value>,
    ) -> Option<(u16, Option<u64>, Value)> {
        let url = format!("{}{path}", self.base());
        let mut req = self.http.request(method, url).bearer_auth(key);
        if let Some(idem) = idem {
            req = req.header("Idempotency-Key", idem);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let res = req.send().await.ok()?;
        let status = res.status().as_u16();
        let retry_after = res
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body = res.json::<Value>().await.unwrap_or(Value::Null);
        Some((status, retry_after, body))
    }

    /// `method path` until it is answered with neither a 5xx nor a 429 (those and
    /// transport errors are retried, on the next replica, with the same idempotency key),
    /// or until the client's patience runs out.
    ///
    /// # Errors
    /// When no such answer came within the patience (the last status is named).
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        key: &str,
        path: &str,
        idem: Option<&str>,
        body: Option<&Value>,
    ) -> anyhow::Result<Answer> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        let mut last = None;
        while started.elapsed() < self.patience {
            match self.once(method.clone(), key, path, idem, body).await {
                Some((status, retry_after, body)) => {
                    self.count(Some(status));
                    if status == 429 {
                        let wait = Duration::from_secs(retry_after.unwrap_or(1).clamp(1, 30));
                        tokio::time::sleep(wait).await;
                        last = Some(status);
                        continue;
                    }
                    if status < 500 {
                        return Ok((status, body));
                    }
                    last = Some(status);
                }
                None => {
                    self.count(None);
                    last = None;
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        match last {
            Some(s) => bail!(
                "{method} {path}: still answered {s} after {:?}",
                self.patience
            ),
            None => bail!(
                "{method} {path}: no api replica answered within {:?}",
                self.patience
            ),
        }
    }

    /// `GET path`.
    pub(super) async fn get(&self, key: &str, path: &str) -> anyhow::Result<Answer> {
        self.call(reqwest::Method::GET, key, path, None, None).await
    }

    /// `POST path` with `Idempotency-Key: idem`.
    pub(super) async fn post(
        &self,
        key: &str,
        path: &str,
        idem: &str,
        body: &Value,
    ) -> anyhow::Result<Answer> {
        self.call(reqwest::Method::POST, key, path, Some(idem), Some(body))
            .await
    }

    /// One `GET path` on the next replica, without retries: the status, or `None` on a
    /// transport error (the noisy integrator's loop).
    pub(super) async fn get_once(&self, key: &str, path: &str) -> Option<u16> {
        self.once(reqwest::Method::GET, key, path, None, None)
            .await
            .map(|(s, _, _)| s)
    }

    /// Every item of a cursor-paginated list (`{data, hasMore, nextCursor}`) at `path`
    /// (which carries its own query, without `cursor`).
    ///
    /// # Errors
    /// A non-200 answer, or a call that ran out of patience.
    pub(super) async fn all(&self, key: &str, path: &str) -> anyhow::Result<Vec<Value>> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        let sep = if path.contains('?') { '&' } else { '?' };
        loop {
            let url = match &cursor {
                Some(c) => format!("{path}{sep}cursor={c}"),
                None => path.to_owned(),
            };
            let (status, page) = self.get(key, &url).await?;
            if status != 200 {
                bail!("GET {path} answered {status}: {page}");
            }
            if let Some(rows) = page["data"].as_array() {
                out.extend(rows.iter().cloned());
            }
            match page["nextCursor"].as_str() {
                Some(c) if page["hasMore"] == true => cursor = Some(c.to_owned()),
                _ => return Ok(out),
            }
        }
    }
}

/// What the webhook receiver got.
#[derive(Debug, Default)]
pub(super) struct Received {
    /// Deliveries, counting redeliveries of one event.
    pub(super) deliveries: u64,
    /// Distinct `webhook-id`s.
    pub(super) ids: HashSet<String>,
    /// Per operation id, the states its `operation.state_changed` events carried.
    pub(super) states: HashMap<String, HashSet<String>>,
}

/// The local webhook receiver: answers every POST `204` and records it.
pub(super) struct Receiver {
    pub(super) url: String,
    pub(super) received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts the receiver on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub(super) async fn start() -> anyhow::Result<Self> {
        use axum::http::HeaderMap;
        let received: Arc<Mutex<Received>> = Arc::default();
        let rec = received.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let rec = rec.clone();
                async move {
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let mut r = rec.lock().unwrap_or_else(PoisonError::into_inner);
                    r.deliveries += 1;
                    r.ids.insert(id);
                    if event["type"] == "operation.state_changed"
                        && let (Some(op), Some(state)) = (
                            event["data"]["id"].as_str(),
                            event["data"]["state"].as_str(),
                        )
                    {
                        r.states
                            .entry(op.to_owned())
                            .or_default()
                            .insert(state.to_owned());
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the webhook receiver")?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            url,
            received,
            task,
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
