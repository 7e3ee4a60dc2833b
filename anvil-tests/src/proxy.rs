//! A fault-injecting JSON-RPC proxy for tests: it sits between the code under test and
//! Anvil and misbehaves the way production nodes and RPC providers do.
//!
//! [`RpcProxy::start`] serves HTTP JSON-RPC on a free port of 127.0.0.1 ([`RpcProxy::url`])
//! and forwards every request, single or batch, to an upstream endpoint (the Anvil node).
//! Tests add [`Rule`]s at runtime ([`RpcProxy::add_rule`], [`RpcProxy::remove_rule`],
//! [`RpcProxy::clear_rules`]); each rule matches one JSON-RPC method, optionally only
//! for the next N matching requests ([`Rule::times`]), and applies one [`Fault`]:
//!
//! | fault | what the caller sees | does the node get the request? |
//! |---|---|---|
//! | [`Fault::DropResponse`] | HTTP **504 Gateway Timeout** (plain-text body) | yes — the proxy answers only after the node did |
//! | [`Fault::Error`] | a JSON-RPC error object | no |
//! | [`Fault::NullResult`] | `"result": null` | no |
//! | [`Fault::Latency`] | the node's answer, later | yes, after the delay |
//! | [`Fault::HoldResponse`] | the node's answer, held back for a while after the node gave it | yes, at once |
//! | [`Fault::Result`] | `"result": <the given value>` | no |
//! | [`Fault::FailThenRecover`] | HTTP **503** for the first `n` matches, then the node's answer | not for the failed ones |
//! | [`Fault::GethReplacementRule`] | geth's `already known` / `replacement transaction underpriced` (-32000) | not when refused |
//! | [`Fault::RewriteError`] | the node's error answer replaced by another JSON-RPC error (e.g. its "nonce too low" as `-32603 internal error`) | yes |
//!
//! `DropResponse` answers 504 rather than holding the connection open so a test does not
//! depend on the client's timeout; it is still a transport failure for the caller (alloy
//! reports `HttpError { status: 504 }`), and because the proxy waits for the node's answer
//! before replying, "the node has it" holds as soon as the caller sees the failure. The
//! 503/504 bodies are deliberately not JSON-RPC: alloy reads a JSON-RPC error body on a
//! non-2xx status as a normal error answer.
//!
//! ## Rule order
//! Rules are consulted in the order they were added. [`Fault::Latency`], a
//! [`Fault::FailThenRecover`] past its failures, a [`Fault::RewriteError`] (the first one
//! consulted rewrites) and a [`Fault::GethReplacementRule`] that
//! lets a transaction through leave the request to later rules (so latency or a dropped
//! response can be combined with geth's replacement rule); the other faults decide the
//! answer. A rule with a limit ([`Rule::times`]) counts every request it is consulted
//! for, whether or not it ends up changing it.
//!
//! ## Batches
//! Each element of a batch is planned separately. Elements answered by a rule are
//! answered locally; the rest are forwarded upstream as one batch and the answers are
//! put back in request order (matched by `id`). HTTP-level faults apply to the whole
//! batch: if any element is failed by `FailThenRecover`, the batch gets 503 and nothing
//! is forwarded; if any element's response is dropped, the forwarded elements reach the
//! node and the batch gets 504.
//!
//! ## Geth's replacement rule
//! Anvil accepts any fee increase as a same-nonce replacement (FIELD-NOTES.md). With
//! [`Fault::GethReplacementRule`] on `eth_sendRawTransaction` the proxy decodes the raw
//! EIP-2718 transaction, recovers its sender, and remembers per (sender, nonce) the fees
//! of the last transaction the node accepted through it (legacy: the gas price is both
//! fees). A same-(sender, nonce) transaction is refused with
//! `{"code": -32000, "message": "replacement transaction underpriced"}` unless both its
//! max fee and its priority fee are strictly higher and at least
//! `previous × (100 + bump_percent) / 100` (integer division, as geth's `txpool/legacypool`
//! does). Bytes already accepted (same hash) get geth's `{"code": -32000, "message":
//! "already known"}` without being forwarded. The memory belongs to the rule: removing
//! it forgets; it is never pruned when transactions are mined (geth would answer
//! `nonce too low` for a mined nonce — the proxy forwards and lets Anvil say so, unless
//! the fees are too low, in which case it says underpriced). Two replacements racing
//! through the proxy are both checked against the same previous fees.

use alloy::consensus::transaction::SignerRecoverable;
use alloy::consensus::{Transaction, TxEnvelope};
use alloy::eips::eip2718::Decodable2718;
use alloy::primitives::{Address, B256};
use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use reqwest::Url;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Geth's JSON-RPC error code for transaction-pool refusals.
pub const GETH_TXPOOL_ERROR_CODE: i64 = -32000;
/// Geth's message for a same-nonce transaction that does not raise both fees enough.
pub const REPLACEMENT_UNDERPRICED: &str = "replacement transaction underpriced";
/// Geth's message for a transaction whose hash is already in the pool.
pub const ALREADY_KNOWN: &str = "already known";

/// What a [`Rule`] does to a matching request. See the module documentation for the
/// table of what the caller and the node see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Forward to the node, wait for its answer, then answer HTTP 504 Gateway Timeout
    /// with a plain-text body: the node got the request, the caller sees a transport
    /// failure.
    DropResponse,
    /// Answer this JSON-RPC error without forwarding.
    Error {
        /// JSON-RPC error code.
        code: i64,
        /// JSON-RPC error message.
        message: String,
    },
    /// Answer `"result": null` without forwarding (e.g. a receipt that is temporarily
    /// not available).
    NullResult,
    /// Wait this long, then let later rules apply and forward.
    Latency(Duration),
    /// Forward at once, then hold the node's answer this long before replying (a
    /// stale answer arriving late: the node answered for the state it had then). Later
    /// rules still apply. [`RpcProxy::hits`] counts a request once the node has
    /// answered it, so a test can wait for "the node answered, the caller has not seen
    /// it yet".
    HoldResponse(Duration),
    /// Answer `"result": <value>` without forwarding (e.g. an `eth_blockNumber` above
    /// the node's real head).
    Result(Value),
    /// Answer HTTP 503 Service Unavailable (plain-text body, not forwarded) to the first
    /// `n` matching requests, then let them through.
    FailThenRecover {
        /// How many matching requests fail.
        n: u64,
    },
    /// Geth's same-nonce replacement rule and `already known` check for
    /// `eth_sendRawTransaction` (see the module documentation). Geth's default bump is 10.
    GethReplacementRule {
        /// Minimum increase of both fees, in percent.
        bump_percent: u64,
    },
    /// Forward to the node; when it answers with a JSON-RPC error whose message
    /// contains `when` (lowercased comparison; empty: any error), answer this error
    /// instead. Successful answers pass unchanged. Counts a hit per rewritten answer.
    RewriteError {
        /// Lowercased substring of the node's error message to rewrite.
        when: String,
        /// JSON-RPC error code of the answer sent instead.
        code: i64,
        /// JSON-RPC error message of the answer sent instead.
        message: String,
    },
}

/// A [`Fault`] applied to requests of one JSON-RPC method, optionally only to the next
/// N of them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a Rule does nothing until added to a proxy"]
pub struct Rule {
    method: String,
    fault: Fault,
    limit: Option<u64>,
}

impl Rule {
    /// `fault` for every request of `method`.
    pub fn new(method: impl Into<String>, fault: Fault) -> Self {
        Self {
            method: method.into(),
            fault,
            limit: None,
        }
    }

    /// Only the next `n` requests of the method (counted from when the rule is added)
    /// are considered; later ones pass the rule untouched.
    pub fn times(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    /// [`Fault::DropResponse`] on `method`.
    pub fn drop_response(method: impl Into<String>) -> Self {
        Self::new(method, Fault::DropResponse)
    }

    /// [`Fault::Error`] on `method`.
    pub fn error(method: impl Into<String>, code: i64, message: impl Into<String>) -> Self {
        Self::new(
            method,
            Fault::Error {
                code,
                message: message.into(),
            },
        )
    }

    /// [`Fault::NullResult`] on `method`.
    pub fn null_result(method: impl Into<String>) -> Self {
        Self::new(method, Fault::NullResult)
    }

    /// [`Fault::Latency`] on `method`.
    pub fn latency(method: impl Into<String>, delay: Duration) -> Self {
        Self::new(method, Fault::Latency(delay))
    }

    /// [`Fault::HoldResponse`] on `method`.
    pub fn hold_response(method: impl Into<String>, delay: Duration) -> Self {
        Self::new(method, Fault::HoldResponse(delay))
    }

    /// [`Fault::Result`] on `method`.
    pub fn result(method: impl Into<String>, value: Value) -> Self {
        Self::new(method, Fault::Result(value))
    }

    /// [`Fault::FailThenRecover`] on `method`.
    pub fn fail_then_recover(method: impl Into<String>, n: u64) -> Self {
        Self::new(method, Fault::FailThenRecover { n })
    }

    /// [`Fault::RewriteError`] on `method`: the node's error answers containing `when`
    /// become `{code, message}`.
    pub fn rewrite_error(
        method: impl Into<String>,
        when: impl Into<String>,
        code: i64,
        message: impl Into<String>,
    ) -> Self {
        Self::new(
            method,
            Fault::RewriteError {
                when: when.into().to_ascii_lowercase(),
                code,
                message: message.into(),
            },
        )
    }

    /// [`Fault::GethReplacementRule`] on `eth_sendRawTransaction`.
    pub fn geth_replacement(bump_percent: u64) -> Self {
        Self::new(
            "eth_sendRawTransaction",
            Fault::GethReplacementRule { bump_percent },
        )
    }

    /// The JSON-RPC method this rule matches.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The fault it applies.
    pub fn fault(&self) -> &Fault {
        &self.fault
    }
}

/// Identifies a rule added to an [`RpcProxy`], for [`RpcProxy::remove_rule`] and
/// [`RpcProxy::hits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(u64);

/// The fees a replacement is compared on. Legacy and EIP-2930 transactions have their
/// gas price as both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fees {
    /// Max fee per gas (legacy: gas price).
    pub max_fee: u128,
    /// Max priority fee per gas (legacy: gas price).
    pub priority_fee: u128,
}

impl Fees {
    /// The fees of `tx`.
    pub fn of(tx: &TxEnvelope) -> Self {
        Self {
            max_fee: tx.max_fee_per_gas(),
            priority_fee: tx.priority_fee_or_price(),
        }
    }

    /// Whether `self` may replace `old` under geth's rule with `bump_percent`: both fees
    /// strictly higher and each at least `old × (100 + bump_percent) / 100`.
    pub fn replaces(&self, old: &Fees, bump_percent: u64) -> bool {
        let threshold = |v: u128| v.saturating_mul(100 + u128::from(bump_percent)) / 100;
        self.max_fee > old.max_fee
            && self.priority_fee > old.priority_fee
            && self.max_fee >= threshold(old.max_fee)
            && self.priority_fee >= threshold(old.priority_fee)
    }
}

/// What geth's rule remembers: accepted hashes and the last accepted fees per
/// (sender, nonce).
#[derive(Debug, Default)]
struct ReplacementBook {
    known: HashSet<B256>,
    last: HashMap<(Address, u64), Fees>,
}

/// A transaction the geth rule let through, recorded once the node accepts it.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    rule: RuleId,
    hash: B256,
    key: (Address, u64),
    fees: Fees,
}

enum Verdict {
    Refuse(&'static str),
    Pass(Option<Candidate>),
}

impl ReplacementBook {
    fn check(&self, rule: RuleId, bump_percent: u64, params: Option<&Value>) -> Verdict {
        // Anything that is not a decodable, signed transaction is the node's business.
        let Some(tx) = raw_transaction(params) else {
            return Verdict::Pass(None);
        };
        let hash = *tx.tx_hash();
        if self.known.contains(&hash) {
            return Verdict::Refuse(ALREADY_KNOWN);
        }
        let Ok(sender) = tx.recover_signer() else {
            return Verdict::Pass(None);
        };
        let key = (sender, tx.nonce());
        let fees = Fees::of(&tx);
        if let Some(old) = self.last.get(&key)
            && !fees.replaces(old, bump_percent)
        {
            return Verdict::Refuse(REPLACEMENT_UNDERPRICED);
        }
        Verdict::Pass(Some(Candidate {
            rule,
            hash,
            key,
            fees,
        }))
    }

    fn accept(&mut self, c: &Candidate) {
        self.known.insert(c.hash);
        self.last.insert(c.key, c.fees);
    }
}

/// The transaction in `params[0]` of `eth_sendRawTransaction`, if it decodes.
fn raw_transaction(params: Option<&Value>) -> Option<TxEnvelope> {
    let hex = params?.get(0)?.as_str()?;
    let bytes = alloy::primitives::hex::decode(hex).ok()?;
    TxEnvelope::decode_2718(&mut bytes.as_slice()).ok()
}

struct RuleEntry {
    id: RuleId,
    rule: Rule,
    /// Requests the rule was consulted for (what [`Rule::times`] limits).
    consulted: u64,
    /// Requests it changed.
    hits: u64,
    book: ReplacementBook,
}

impl RuleEntry {
    fn active_for(&self, method: &str) -> bool {
        self.rule.method == method && self.rule.limit.is_none_or(|n| self.consulted < n)
    }
}

#[derive(Default)]
struct ProxyState {
    next_id: u64,
    rules: Vec<RuleEntry>,
    counts: HashMap<String, u64>,
}

/// What happens to one request element.
enum Plan {
    /// Answered by the proxy with this JSON-RPC response; not forwarded.
    Answer(Value),
    /// HTTP 503 for the whole HTTP request; nothing forwarded.
    Unavailable,
    /// Forwarded after `delay`; with `drop`, the caller gets HTTP 504 afterwards; the
    /// answer is held `hold` after the node gave it (rules `holders` count a hit then).
    Forward {
        delay: Duration,
        drop: bool,
        candidates: Vec<Candidate>,
        hold: Duration,
        holders: Vec<RuleId>,
        rewrite: Option<Rewrite>,
    },
}

/// A [`Fault::RewriteError`] to apply to the node's answer.
#[derive(Debug, Clone)]
struct Rewrite {
    rule: RuleId,
    when: String,
    code: i64,
    message: String,
}

impl Rewrite {
    /// Rewrites `answer` when it is a matching error; returns whether it did.
    fn apply(&self, answer: &mut Value) -> bool {
        let Some(message) = answer
            .get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
        else {
            return false;
        };
        if !message.to_ascii_lowercase().contains(&self.when) {
            return false;
        }
        let id = answer.get("id").cloned().unwrap_or(Value::Null);
        *answer = error_response(&id, self.code, &self.message);
        true
    }
}

impl ProxyState {
    fn plan(&mut self, request: &Value) -> Plan {
        let Some(method) = request.get("method").and_then(Value::as_str) else {
            return Plan::Forward {
                delay: Duration::ZERO,
                drop: false,
                candidates: Vec::new(),
                hold: Duration::ZERO,
                holders: Vec::new(),
                rewrite: None,
            };
        };
        *self.counts.entry(method.to_owned()).or_default() += 1;
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let mut delay = Duration::ZERO;
        let mut hold = Duration::ZERO;
        let mut holders = Vec::new();
        let mut candidates = Vec::new();
        let mut rewrite: Option<Rewrite> = None;
        for entry in self.rules.iter_mut().filter(|e| e.active_for(method)) {
            entry.consulted += 1;
            match &entry.rule.fault {
                Fault::DropResponse => {
                    entry.hits += 1;
                    return Plan::Forward {
                        delay,
                        drop: true,
                        candidates,
                        hold,
                        holders,
                        rewrite,
                    };
                }
                Fault::Error { code, message } => {
                    entry.hits += 1;
                    return Plan::Answer(error_response(&id, *code, message));
                }
                Fault::NullResult => {
                    entry.hits += 1;
                    return Plan::Answer(json!({"jsonrpc": "2.0", "id": id, "result": null}));
                }
                Fault::Latency(d) => {
                    entry.hits += 1;
                    delay += *d;
                }
                Fault::HoldResponse(d) => {
                    hold += *d;
                    holders.push(entry.id);
                }
                Fault::Result(value) => {
                    entry.hits += 1;
                    return Plan::Answer(json!({"jsonrpc": "2.0", "id": id, "result": value}));
                }
                Fault::RewriteError {
                    when,
                    code,
                    message,
                } => {
                    // Counted as a hit once an answer is actually rewritten.
                    rewrite.get_or_insert_with(|| Rewrite {
                        rule: entry.id,
                        when: when.clone(),
                        code: *code,
                        message: message.clone(),
                    });
                }
                Fault::FailThenRecover { n } => {
                    if entry.hits < *n {
                        entry.hits += 1;
                        return Plan::Unavailable;
                    }
                }
                Fault::GethReplacementRule { bump_percent } => {
                    match entry
                        .book
                        .check(entry.id, *bump_percent, request.get("params"))
                    {
                        Verdict::Refuse(message) => {
                            entry.hits += 1;
                            return Plan::Answer(error_response(
                                &id,
                                GETH_TXPOOL_ERROR_CODE,
                                message,
                            ));
                        }
                        Verdict::Pass(candidate) => candidates.extend(candidate),
                    }
                }
            }
        }
        Plan::Forward {
            delay,
            drop: false,
            candidates,
            hold,
            holders,
            rewrite,
        }
    }

    fn held(&mut self, rule: RuleId) {
        self.hit(rule);
    }

    fn hit(&mut self, rule: RuleId) {
        if let Some(entry) = self.rules.iter_mut().find(|e| e.id == rule) {
            entry.hits += 1;
        }
    }

    fn accept(&mut self, candidate: &Candidate) {
        if let Some(entry) = self.rules.iter_mut().find(|e| e.id == candidate.rule) {
            entry.book.accept(candidate);
        }
    }
}

fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

struct Shared {
    upstream: Url,
    client: reqwest::Client,
    state: Mutex<ProxyState>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, ProxyState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fault-injecting JSON-RPC proxy (see the module documentation). Serves until
/// dropped.
pub struct RpcProxy {
    url: Url,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl fmt::Debug for RpcProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcProxy")
            .field("url", &self.url)
            .field("upstream", &self.shared.upstream)
            .finish_non_exhaustive()
    }
}

impl Drop for RpcProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl RpcProxy {
    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `upstream` (e.g.
    /// [`crate::TestChain::endpoint`]), with no rules. Must be called inside a tokio
    /// runtime; the server runs on a spawned task until the proxy is dropped.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream: &Url) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy's port")?;
        let addr = listener.local_addr().context("the proxy's address")?;
        let url = Url::parse(&format!("http://{addr}/")).context("the proxy's URL")?;
        let shared = Arc::new(Shared {
            upstream: upstream.clone(),
            client: reqwest::Client::new(),
            state: Mutex::new(ProxyState::default()),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            // Serving only ends with an I/O error on the listener; the proxy is a test
            // fixture, so the tests calling through it will then fail on their own.
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            url,
            shared,
            server,
        })
    }

    /// The proxy's endpoint (`http://127.0.0.1:<port>/`), to give to the code under test.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The endpoint requests are forwarded to.
    pub fn upstream(&self) -> &Url {
        &self.shared.upstream
    }

    /// Adds `rule` after the existing ones (see "Rule order").
    pub fn add_rule(&self, rule: Rule) -> RuleId {
        let mut state = self.shared.state();
        let id = RuleId(state.next_id);
        state.next_id += 1;
        state.rules.push(RuleEntry {
            id,
            rule,
            consulted: 0,
            hits: 0,
            book: ReplacementBook::default(),
        });
        id
    }

    /// Removes a rule (and what a geth replacement rule remembered). Returns whether it
    /// was there.
    pub fn remove_rule(&self, id: RuleId) -> bool {
        let mut state = self.shared.state();
        let before = state.rules.len();
        state.rules.retain(|e| e.id != id);
        state.rules.len() != before
    }

    /// Removes every rule; from now on everything is forwarded untouched.
    pub fn clear_rules(&self) {
        self.shared.state().rules.clear();
    }

    /// How many requests rule `id` changed (answered, failed, dropped, delayed, refused);
    /// 0 for a removed or unknown rule.
    pub fn hits(&self, id: RuleId) -> u64 {
        self.shared
            .state()
            .rules
            .iter()
            .find(|e| e.id == id)
            .map_or(0, |e| e.hits)
    }

    /// How many requests of `method` the proxy received (batch elements count one
    /// each), whatever the rules did with them.
    pub fn count(&self, method: &str) -> u64 {
        self.shared.state().counts.get(method).copied().unwrap_or(0)
    }

    /// Sets every per-method counter back to 0.
    pub fn reset_counts(&self) {
        self.shared.state().counts.clear();
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

async fn handle(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Ok(parsed) = serde_json::from_slice::<Value>(&body) else {
        let parse_error = error_response(&Value::Null, -32700, "parse error");
        return axum::Json(parse_error).into_response();
    };
    let (items, batch) = match parsed {
        Value::Array(items) => (items, true),
        other => (vec![other], false),
    };
    if items.is_empty() {
        let invalid = error_response(&Value::Null, -32600, "empty batch");
        return axum::Json(invalid).into_response();
    }

    let plans: Vec<Plan> = {
        let mut state = shared.state();
        items.iter().map(|item| state.plan(item)).collect()
    };
    if plans.iter().any(|p| matches!(p, Plan::Unavailable)) {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "fault-injecting proxy: FailThenRecover",
        );
    }
    let delay = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Forward { delay, .. } => Some(*delay),
            _ => None,
        })
        .max()
        .unwrap_or_default();
    let dropped = plans
        .iter()
        .any(|p| matches!(p, Plan::Forward { drop: true, .. }));
    let hold = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Forward { hold, .. } => Some(*hold),
            _ => None,
        })
        .max()
        .unwrap_or_default();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let forwarded: Vec<&Value> = items
        .iter()
        .zip(&plans)
        .filter(|(_, p)| matches!(p, Plan::Forward { .. }))
        .map(|(item, _)| item)
        .collect();
    let upstream_answer = if forwarded.is_empty() {
        None
    } else {
        let payload = match forwarded.as_slice() {
            [one] if !batch => (*one).clone(),
            many => Value::Array(many.iter().map(|v| (*v).clone()).collect()),
        };
        match forward(&shared, &payload).await {
            Ok(answer) => Some(answer),
            Err(status) => {
                return plain(status, "fault-injecting proxy: upstream unreachable");
            }
        }
    };

    // Answers of the forwarded elements, by id.
    let mut by_id: HashMap<String, Value> = HashMap::new();
    let mut single_answer = None;
    match upstream_answer {
        Some(Value::Array(answers)) => {
            for answer in answers {
                let key = answer.get("id").map(Value::to_string).unwrap_or_default();
                by_id.insert(key, answer);
            }
        }
        Some(other) if batch => {
            // The node refused the batch as a whole: pass its answer on unchanged.
            return axum::Json(other).into_response();
        }
        Some(other) => single_answer = Some(other),
        None => {}
    }

    {
        let mut state = shared.state();
        for (item, plan) in items.iter().zip(&plans) {
            let Plan::Forward {
                candidates,
                holders,
                rewrite,
                ..
            } = plan
            else {
                continue;
            };
            for rule in holders {
                state.held(*rule);
            }
            let answer = match single_answer.as_mut() {
                Some(a) => Some(a),
                None => by_id.get_mut(&item.get("id").map(Value::to_string).unwrap_or_default()),
            };
            let Some(answer) = answer else {
                continue;
            };
            let accepted = answer.get("result").is_some_and(|r| !r.is_null());
            if accepted {
                for c in candidates {
                    state.accept(c);
                }
            }
            if let Some(rewrite) = rewrite
                && rewrite.apply(answer)
            {
                state.hit(rewrite.rule);
            }
        }
    }

    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    if dropped {
        return plain(
            StatusCode::GATEWAY_TIMEOUT,
            "fault-injecting proxy: response dropped",
        );
    }
    if !batch {
        return match (plans.into_iter().next(), single_answer) {
            (Some(Plan::Answer(answer)), _) | (_, Some(answer)) => {
                axum::Json(answer).into_response()
            }
            // A forwarded notification: the node answered nothing.
            _ => StatusCode::NO_CONTENT.into_response(),
        };
    }
    let mut out = Vec::with_capacity(items.len());
    for (item, plan) in items.iter().zip(plans) {
        match plan {
            Plan::Answer(answer) => out.push(answer),
            Plan::Forward { .. } => {
                let Some(id) = item.get("id") else {
                    continue; // notification: no answer
                };
                match by_id.remove(&id.to_string()) {
                    Some(answer) => out.push(answer),
                    None => out.push(error_response(
                        id,
                        -32603,
                        "fault-injecting proxy: no answer from upstream for this id",
                    )),
                }
            }
            Plan::Unavailable => {}
        }
    }
    axum::Json(Value::Array(out)).into_response()
}

/// Posts `payload` upstream and returns its JSON answer (`Null` for an empty body), or
/// the status to answer the caller with when the node cannot be reached or answers
/// garbage.
async fn forward(shared: &Shared, payload: &Value) -> Result<Value, StatusCode> {
    let response = shared
        .client
        .post(shared.upstream.clone())
        .json(payload)
        .send()
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let body = response
        .bytes()
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body).map_err(|_| StatusCode::BAD_GATEWAY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::consensus::{SignableTransaction, TxEip1559, TxLegacy};
    use alloy::primitives::{TxKind, U256};
    use alloy::signers::SignerSync;
    use alloy::signers::local::PrivateKeySigner;

    fn fees(max_fee: u128, priority_fee: u128) -> Fees {
        Fees {
            max_fee,
            priority_fee,
        }
    }

    #[test]
    fn replacement_needs_both_fees_raised_by_the_bump() {
        let old = fees(1_000, 100);
        assert!(fees(1_100, 110).replaces(&old, 10));
        assert!(!fees(1_050, 105).replaces(&old, 10), "+5% on both");
        assert!(!fees(1_200, 105).replaces(&old, 10), "+20% fee, +5% tip");
        assert!(!fees(1_050, 200).replaces(&old, 10), "+5% fee, +100% tip");
        assert!(!fees(1_100, 109).replaces(&old, 10));
        assert!(fees(2_000, 200).replaces(&old, 10));
        // Integer division like geth: 15 × 110 / 100 = 16 (not 16.5), but the new fee
        // must still be strictly higher.
        assert!(fees(16, 16).replaces(&fees(15, 15), 10));
        assert!(
            !fees(1, 1).replaces(&fees(1, 1), 0),
            "equal fees never replace"
        );
        assert!(fees(2, 2).replaces(&fees(1, 1), 0));
    }

    fn signed_1559(signer: &PrivateKeySigner, nonce: u64, max_fee: u128, tip: u128) -> Value {
        let tx = TxEip1559 {
            chain_id: 31337,
            nonce,
            gas_limit: 21_000,
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
            to: TxKind::Call(Address::ZERO),
            value: U256::from(1),
            ..Default::default()
        };
        let sig = signer.sign_hash_sync(&tx.signature_hash()).unwrap();
        raw_params(TxEnvelope::from(tx.into_signed(sig)))
    }

    fn signed_legacy(signer: &PrivateKeySigner, nonce: u64, gas_price: u128) -> Value {
        let tx = TxLegacy {
            chain_id: Some(31337),
            nonce,
            gas_price,
            gas_limit: 21_000,
            to: TxKind::Call(Address::ZERO),
            value: U256::from(1),
            ..Default::default()
        };
        let sig = signer.sign_hash_sync(&tx.signature_hash()).unwrap();
        raw_params(TxEnvelope::from(tx.into_signed(sig)))
    }

    fn raw_params(tx: TxEnvelope) -> Value {
        use alloy::eips::eip2718::Encodable2718;
        json!([alloy::primitives::hex::encode_prefixed(tx.encoded_2718())])
    }

    fn check(book: &mut ReplacementBook, params: &Value) -> Result<(), &'static str> {
        match book.check(RuleId(0), 10, Some(params)) {
            Verdict::Refuse(m) => Err(m),
            Verdict::Pass(Some(c)) => {
                book.accept(&c);
                Ok(())
            }
            Verdict::Pass(None) => panic!("not decoded"),
        }
    }

    #[test]
    fn book_tracks_last_accepted_fees_per_sender_and_nonce() {
        let a = PrivateKeySigner::random();
        let b = PrivateKeySigner::random();
        let mut book = ReplacementBook::default();
        let first = signed_1559(&a, 0, 1_000, 100);
        assert_eq!(check(&mut book, &first), Ok(()));
        assert_eq!(check(&mut book, &first), Err(ALREADY_KNOWN));
        assert_eq!(
            check(&mut book, &signed_1559(&a, 0, 1_050, 105)),
            Err(REPLACEMENT_UNDERPRICED)
        );
        // Another nonce or another sender is not a replacement.
        assert_eq!(check(&mut book, &signed_1559(&a, 1, 1, 1)), Ok(()));
        assert_eq!(check(&mut book, &signed_1559(&b, 0, 1, 1)), Ok(()));
        assert_eq!(check(&mut book, &signed_1559(&a, 0, 1_100, 110)), Ok(()));
        // Compared with the last accepted (1_100/110), not the first.
        assert_eq!(
            check(&mut book, &signed_1559(&a, 0, 1_150, 115)),
            Err(REPLACEMENT_UNDERPRICED)
        );
        assert_eq!(check(&mut book, &signed_1559(&a, 0, 1_210, 121)), Ok(()));
    }

    #[test]
    fn legacy_gas_price_counts_as_both_fees() {
        let a = PrivateKeySigner::random();
        let mut book = ReplacementBook::default();
        assert_eq!(check(&mut book, &signed_legacy(&a, 0, 1_000)), Ok(()));
        assert_eq!(
            check(&mut book, &signed_legacy(&a, 0, 1_099)),
            Err(REPLACEMENT_UNDERPRICED)
        );
        // A 1559 replacement of a legacy tx: its tip is compared with the gas price.
        assert_eq!(
            check(&mut book, &signed_1559(&a, 0, 5_000, 1_050)),
            Err(REPLACEMENT_UNDERPRICED)
        );
        assert_eq!(check(&mut book, &signed_legacy(&a, 0, 1_100)), Ok(()));
    }

    #[test]
    fn undecodable_params_pass_to_the_node() {
        let book = ReplacementBook::default();
        for params in [json!([]), json!(["0x1234"]), json!([42]), json!(["zz"])] {
            assert!(matches!(
                book.check(RuleId(0), 10, Some(&params)),
                Verdict::Pass(None)
            ));
        }
        assert!(matches!(
            book.check(RuleId(0), 10, None),
            Verdict::Pass(None)
        ));
    }

    #[test]
    fn limited_rules_apply_to_the_next_n_matches_only() {
        let mut state = ProxyState::default();
        state.rules.push(RuleEntry {
            id: RuleId(0),
            rule: Rule::null_result("eth_getTransactionReceipt").times(2),
            consulted: 0,
            hits: 0,
            book: ReplacementBook::default(),
        });
        let req = json!({"jsonrpc": "2.0", "id": 7, "method": "eth_getTransactionReceipt"});
        let other = json!({"jsonrpc": "2.0", "id": 8, "method": "eth_blockNumber"});
        assert!(matches!(state.plan(&other), Plan::Forward { .. }));
        for _ in 0..2 {
            match state.plan(&req) {
                Plan::Answer(a) => {
                    assert_eq!(a, json!({"jsonrpc": "2.0", "id": 7, "result": null}))
                }
                _ => panic!("expected a null answer"),
            }
        }
        assert!(matches!(state.plan(&req), Plan::Forward { .. }));
        assert_eq!(state.counts["eth_getTransactionReceipt"], 3);
        assert_eq!(state.counts["eth_blockNumber"], 1);
    }
}
