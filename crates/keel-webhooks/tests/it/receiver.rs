//! A real HTTP receiver in the test process: an axum server whose paths behave
//! differently, plus a raw TCP server that closes the connection on a first request.
//!
//! | path | behaviour (per `webhook-id`) |
//! |---|---|
//! | `/ok/..` | 200 |
//! | `/flaky/..` | 500 twice, then 200 |
//! | `/slow/..` | first request: answers after 3 s (beyond the client's timeout), then 200 |
//! | `/gone/..` | 410 |
//! | `/fail/..` | 500 always |
//! | `/hang/..` | the very first request: never answers (reports it on `hung`); then 200 |
//! | `/switch/..` | 503 while [`Receiver::set_down`] is on, else 200 |
//! | raw server | first request: the connection is closed without an answer, then 200 |

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One entry of the receiver's log, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A request arrived.
    Request(Request),
    /// The receiver answered 2xx for this (behaviour, webhook-id).
    Ack { behaviour: String, id: String },
}

/// A received request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) behaviour: String,
    pub(crate) id: String,
    pub(crate) timestamp: String,
    pub(crate) signature: String,
    pub(crate) body: String,
    /// When it arrived.
    pub(crate) at: std::time::Instant,
}

#[derive(Default)]
struct Inner {
    hung_once: bool,
    down: bool,
    log: Vec<Entry>,
    seen: HashMap<(String, String), u32>,
}

#[derive(Clone)]
pub(crate) struct Receiver {
    inner: Arc<Mutex<Inner>>,
    pub(crate) addr: SocketAddr,
    pub(crate) raw_addr: SocketAddr,
    /// Notified when a `/hang` request arrived.
    pub(crate) hung: Arc<Notify>,
}

impl Receiver {
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Self {
            inner: Arc::default(),
            addr: listener.local_addr().unwrap(),
            raw_addr: raw.local_addr().unwrap(),
            hung: Arc::new(Notify::new()),
        };
        let app = Router::new()
            .route("/{behaviour}/{tail}", axum::routing::post(hook))
            .with_state(r.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        tokio::spawn(raw_server(raw, r.clone()));
        r
    }

    /// `http://127.0.0.1:<port>/<behaviour>/<tail>`.
    pub(crate) fn url(&self, behaviour: &str, tail: &str) -> String {
        format!("http://{}/{behaviour}/{tail}", self.addr)
    }

    /// The raw (connection-closing) server's URL.
    pub(crate) fn raw_url(&self) -> String {
        format!("http://{}/close/x", self.raw_addr)
    }

    pub(crate) fn log(&self) -> Vec<Entry> {
        self.inner.lock().unwrap().log.clone()
    }

    pub(crate) fn requests(&self, behaviour: &str) -> Vec<Request> {
        self.log()
            .into_iter()
            .filter_map(|e| match e {
                Entry::Request(r) if r.behaviour == behaviour => Some(r),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn acks(&self, behaviour: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter_map(|e| match e {
                Entry::Ack { behaviour: b, id } if b == behaviour => Some(id),
                _ => None,
            })
            .collect()
    }

    /// Records a request; returns how many requests of this (behaviour, id) came before
    /// and whether `/switch` was down when it arrived (read with the record, so a test
    /// that saw the request in the log changes only later requests).
    fn arrive(&self, req: Request) -> (u32, bool) {
        let mut g = self.inner.lock().unwrap();
        let key = (req.behaviour.clone(), req.id.clone());
        let n = *g.seen.get(&key).unwrap_or(&0);
        g.seen.insert(key, n + 1);
        g.log.push(Entry::Request(req));
        (n, g.down)
    }

    /// Whether `/switch` answers 503 (true) or 200.
    pub(crate) fn set_down(&self, down: bool) {
        self.inner.lock().unwrap().down = down;
    }

    /// True for the first `/hang` request only.
    fn hang_first(&self) -> bool {
        let mut g = self.inner.lock().unwrap();
        !std::mem::replace(&mut g.hung_once, true)
    }

    fn ack(&self, behaviour: &str, id: &str) {
        self.inner.lock().unwrap().log.push(Entry::Ack {
            behaviour: behaviour.to_owned(),
            id: id.to_owned(),
        });
    }
}

fn header(h: &HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

async fn hook(
    State(r): State<Receiver>,
    Path((behaviour, _tail)): Path<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let id = header(&headers, "webhook-id");
    let (before, down) = r.arrive(Request {
        behaviour: behaviour.clone(),
        id: id.clone(),
        timestamp: header(&headers, "webhook-timestamp"),
        signature: header(&headers, "webhook-signature"),
        body,
        at: std::time::Instant::now(),
    });
    let status = match behaviour.as_str() {
        "ok" => StatusCode::OK,
        "flaky" if before < 2 => StatusCode::INTERNAL_SERVER_ERROR,
        "flaky" => StatusCode::OK,
        "slow" if before == 0 => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            // The client gave up long ago: not an acknowledgement.
            return StatusCode::OK;
        }
        "slow" => StatusCode::OK,
        "gone" => StatusCode::GONE,
        "hang" if before == 0 && r.hang_first() => {
            r.hung.notify_one();
            std::future::pending::<()>().await;
            StatusCode::OK
        }
        "hang" => StatusCode::OK,
        "switch" if down => StatusCode::SERVICE_UNAVAILABLE,
        "switch" => StatusCode::OK,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_success() {
        r.ack(&behaviour, &id);
    }
    status
}

/// A minimal HTTP/1.1 server: the first request of each `webhook-id` gets its
/// connection closed without an answer; later ones get 200.
async fn raw_server(listener: TcpListener, r: Receiver) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let r = r.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                let Ok(n) = sock.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break p + 4;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
            let mut headers = HashMap::new();
            for line in head.lines().skip(1) {
                if let Some((k, v)) = line.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                }
            }
            let len: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                let Ok(n) = sock.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
            let id = headers.get("webhook-id").cloned().unwrap_or_default();
            let (before, _) = r.arrive(Request {
                behaviour: "close".into(),
                id: id.clone(),
                timestamp: headers
                    .get("webhook-timestamp")
                    .cloned()
                    .unwrap_or_default(),
                signature: headers
                    .get("webhook-signature")
                    .cloned()
                    .unwrap_or_default(),
                body,
                at: std::time::Instant::now(),
            });
            if before == 0 {
                drop(sock);
                return;
            }
            r.ack("close", &id);
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
        });
    }
}

/// Verifies `(secret, request)` pairs with the independent Python verifier
/// (`tests/verify_signatures.py`): the reference `standardwebhooks` package from PyPI,
/// installed into a venv under the target directory on first use, or — when it cannot
/// be installed (no network) — the script's from-spec standard-library verifier.
/// Returns which implementation ran and one verdict per pair.
pub(crate) fn verify_independently(pairs: &[(String, Request)]) -> (String, Vec<bool>) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("standardwebhooks-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        if made {
            let _ = Command::new(venv.join("bin/pip"))
                .args(["install", "-q", "standardwebhooks"])
                .status();
        }
    }
    let python = if python.exists() {
        python
    } else {
        "python3".into()
    };
    let items: Vec<serde_json::Value> = pairs
        .iter()
        .map(|(secret, r)| {
            serde_json::json!({
                "secret": secret, "id": r.id, "timestamp": r.timestamp,
                "signature": r.signature, "body": r.body,
            })
        })
        .collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/verify_signatures.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&items).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the verifier failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ok = v["ok"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    (v["impl"].as_str().unwrap().to_owned(), ok)
}
