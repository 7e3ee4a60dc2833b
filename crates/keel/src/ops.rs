//! `keel ops`: operator views of operations through a running Keel's Platform API.
//!
//! Every command here talks HTTP to the api role (never to the database), with an API
//! key, so an operator is authenticated, scoped and attributed like any other caller:
//! `retry` needs the `operate` scope, `approve` / `reject` the `approve` scope, the
//! reads `read`. What an operator did shows in the operation's `attribution`.
//!
//! - [`ApiClient`]: `GET /v1/operations` (the API's filters, following `nextCursor`),
//!   `GET /v1/operations/{id}`, `POST /v1/operations/{id}/retry|approve|reject`.
//! - [`table`], [`describe`]: the text views of `keel ops list` and `keel ops show`.
//! - [`changes`]: what changed between two polls of one operation, as the lines
//!   `keel ops watch` prints (state, wait, each transaction submitted and confirmed,
//!   the indexed milestone, progress phase, error).
//! - [`WatchExit`]: the exit code of `keel ops watch` from the terminal state.

use chrono::{DateTime, SecondsFormat, Utc};
use keel_api::dto::{Operation, OperationList, OperationState, OperationWait, RecordedBy};
use std::fmt::Write as _;
use std::time::Duration;

/// Errors of the operator commands. Display names the API's machine-readable code
/// (`code`) when the API answered one; never the API key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The API answered an error document (`application/problem+json`).
    #[error("{code}: {detail} (HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable code (`NOT_FOUND`, `INSUFFICIENT_SCOPE`, `APPROVAL_SAME_KEY`, ...;
        /// `docs/error-codes.md`).
        code: String,
        /// The API's value-free description.
        detail: String,
        /// Whether the same request may succeed later (`503`, `INDEX_BEHIND`).
        retryable: bool,
    },
    /// The API answered an error status without a problem document.
    #[error("HTTP_{status}: the API answered without an error document")]
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// The API could not be reached or the answer not read.
    #[error("UNREACHABLE: the Platform API could not be reached: {0}")]
    Transport(String),
    /// The answer was not the JSON the command expects (another Keel version?).
    #[error("BAD_ANSWER: the API's answer is not the expected {what} document")]
    Decode {
        /// What was expected (`Operation`, `OperationList`).
        what: &'static str,
    },
    /// `--api-url` is not an http(s) URL.
    #[error("INVALID_API_URL: --api-url must be an http:// or https:// URL")]
    InvalidUrl,
}

impl OpsError {
    /// The machine-readable code this error prints (`NOT_FOUND`, `UNREACHABLE`, ...).
    pub fn code(&self) -> String {
        match self {
            OpsError::Api { code, .. } => code.clone(),
            OpsError::Status { status } => format!("HTTP_{status}"),
            OpsError::Transport(_) => "UNREACHABLE".to_owned(),
            OpsError::Decode { .. } => "BAD_ANSWER".to_owned(),
            OpsError::InvalidUrl => "INVALID_API_URL".to_owned(),
        }
    }

    /// Whether trying again later may succeed (transport errors, `503`, retryable
    /// problems).
    pub fn is_transient(&self) -> bool {
        match self {
            OpsError::Api { retryable, .. } => *retryable,
            OpsError::Status { status } => *status >= 500,
            OpsError::Transport(_) => true,
            OpsError::Decode { .. } | OpsError::InvalidUrl => false,
        }
    }
}

/// The filters of `GET /v1/operations` (each one given must hold). Values are passed
/// as given: the API validates them (`400 INVALID_QUERY`).
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// `state`: `queued`, `running`, `waiting`, `suspended`, `completed`, `failed`,
    /// `cancelled`.
    pub state: Option<String>,
    /// `kind`: `asset.create`, `asset.mint`, ...
    pub kind: Option<String>,
    /// `assetId`: an asset id.
    pub asset_id: Option<String>,
    /// `createdAfter`: RFC 3339 instant (exclusive).
    pub created_after: Option<String>,
    /// `createdBefore`: RFC 3339 instant (exclusive).
    pub created_before: Option<String>,
}

/// What an operator does to one operation (`POST /v1/operations/{id}/<action>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `retry` (scope `operate`): a `failed` or `suspended` operation runs again.
    Retry,
    /// `approve` (scope `approve`): by another key than the one that started it.
    Approve,
    /// `reject` (scope `approve`): the operation then fails `APPROVAL_REJECTED`.
    Reject,
    /// `cancel` (scope `operate`): before any transaction the operation ends
    /// `cancelled`; an unsigned transaction is withdrawn; a signed one runs to its
    /// verdict.
    Cancel,
}

impl Action {
    /// The path segment (`retry`, `approve`, `reject`, `cancel`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Approve => "approve",
            Action::Reject => "reject",
            Action::Cancel => "cancel",
        }
    }
}

/// The largest page `GET /v1/operations` serves.
const MAX_PAGE: usize = 200;

/// A client of the Platform API's operation routes, with one API key.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: reqwest::Url,
    key: String,
}

impl ApiClient {
    /// A client of the API at `base_url` (`http://127.0.0.1:8080`) with the API key
    /// `key`; requests time out after `timeout`.
    ///
    /// # Errors
    /// [`OpsError::InvalidUrl`] unless `base_url` is an http(s) URL;
    /// [`OpsError::Transport`] when no HTTP client can be built.
    pub fn new(base_url: &str, key: &str, timeout: Duration) -> Result<Self, OpsError> {
        let mut base = reqwest::Url::parse(base_url).map_err(|_| OpsError::InvalidUrl)?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(OpsError::InvalidUrl);
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("keel-ops/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OpsError::Transport(e.without_url().to_string()))?;
        Ok(Self {
            http,
            base,
            key: key.to_owned(),
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, OpsError> {
        self.base.join(path).map_err(|_| OpsError::InvalidUrl)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<serde_json::Value, OpsError> {
        let resp = req
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(|e| OpsError::Transport(e.without_url().to_string()))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| OpsError::Transport(e.without_url().to_string()))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|_| OpsError::Decode { what: "JSON" });
        }
        match serde_json::from_slice::<keel_api::problem::Problem>(&body) {
            Ok(p) => Err(OpsError::Api {
                status: status.as_u16(),
                code: p.code,
                detail: p.detail,
                retryable: p.retryable,
            }),
            Err(_) => Err(OpsError::Status {
                status: status.as_u16(),
            }),
        }
    }

    /// One page of `GET /v1/operations` as the API's JSON (`OperationList`).
    ///
    /// # Errors
    /// The API's error ([`OpsError::Api`]), or [`OpsError::Transport`].
    pub async fn list_page(
        &self,
        filter: &ListFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<serde_json::Value, OpsError> {
        let mut query: Vec<(&str, String)> = vec![("limit", limit.clamp(1, MAX_PAGE).to_string())];
        let fields = [
            ("state", &filter.state),
            ("kind", &filter.kind),
            ("assetId", &filter.asset_id),
            ("createdAfter", &filter.created_after),
            ("createdBefore", &filter.created_before),
        ];
        for (name, value) in fields {
            if let Some(v) = value {
                query.push((name, v.clone()));
            }
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_owned()));
        }
        let mut url = self.url("v1/operations")?;
        url.query_pairs_mut().extend_pairs(query);
        self.send(self.http.get(url)).await
    }

    /// Up to `max` operations matching `filter` (oldest first), following
    /// `nextCursor` from `cursor`; also the cursor to continue from when more remain.
    ///
    /// # Errors
    /// As [`ApiClient::list_page`]; [`OpsError::Decode`] for a malformed page.
    pub async fn list(
        &self,
        filter: &ListFilter,
        mut cursor: Option<String>,
        max: usize,
    ) -> Result<(Vec<serde_json::Value>, Option<String>), OpsError> {
        let mut out = Vec::new();
        loop {
            let want = max.saturating_sub(out.len());
            if want == 0 {
                return Ok((out, cursor));
            }
            let page = self.list_page(filter, cursor.as_deref(), want).await?;
            let list: OperationList =
                serde_json::from_value(page.clone()).map_err(|_| OpsError::Decode {
                    what: "OperationList",
                })?;
            if let Some(items) = page.get("data").and_then(|d| d.as_array()) {
                out.extend(items.iter().take(want).cloned());
            }
            match list.next_cursor {
                Some(next) if list.has_more => cursor = Some(next),
                _ => return Ok((out, None)),
            }
        }
    }

    /// `GET /v1/operations/{id}` as the API's JSON.
    ///
    /// # Errors
    /// The API's error (`NOT_FOUND` for an unknown id or one of another organization),
    /// or [`OpsError::Transport`].
    pub async fn operation_json(&self, id: &str) -> Result<serde_json::Value, OpsError> {
        let url = self.url(&format!("v1/operations/{}", path_segment(id)))?;
        self.send(self.http.get(url)).await
    }

    /// Every entry of `GET /v1/operations/{id}/history`, oldest first (every page, 200
    /// entries a request), as the API's JSON objects.
    ///
    /// # Errors
    /// The API's error (`NOT_FOUND` for an unknown id or one of another organization),
    /// [`OpsError::Decode`] for a malformed page, or [`OpsError::Transport`].
    pub async fn history(&self, id: &str) -> Result<Vec<serde_json::Value>, OpsError> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = self.url(&format!("v1/operations/{}/history", path_segment(id)))?;
            url.query_pairs_mut()
                .append_pair("limit", &MAX_PAGE.to_string());
            if let Some(c) = &cursor {
                url.query_pairs_mut().append_pair("cursor", c);
            }
            let page = self.send(self.http.get(url)).await?;
            let list: keel_api::dto::OperationHistory = serde_json::from_value(page.clone())
                .map_err(|_| OpsError::Decode {
                    what: "OperationHistory",
                })?;
            if let Some(items) = page.get("data").and_then(|d| d.as_array()) {
                out.extend(items.iter().cloned());
            }
            match list.next_cursor {
                Some(next) if list.has_more => cursor = Some(next),
                _ => return Ok(out),
            }
        }
    }

    /// `POST /v1/operations/{id}/<action>` (body `{}`); the operation's JSON after it.
    ///
    /// # Errors
    /// The API's error (`OPERATION_NOT_RETRYABLE`, `APPROVAL_NOT_PENDING`,
    /// `APPROVAL_SAME_KEY`, `INSUFFICIENT_SCOPE`, ...), or [`OpsError::Transport`].
    pub async fn act(&self, id: &str, action: Action) -> Result<serde_json::Value, OpsError> {
        let url = self.url(&format!(
            "v1/operations/{}/{}",
            path_segment(id),
            action.as_str()
        ))?;
        self.send(self.http.post(url).json(&serde_json::json!({})))
            .await
    }
}

/// `id` as one path segment (percent-encoding anything but unreserved characters), so
/// an id argument cannot reach another route.
fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// An operation's JSON as the typed view.
///
/// # Errors
/// [`OpsError::Decode`] when it is not an `Operation` document.
pub fn parse_operation(v: &serde_json::Value) -> Result<Operation, OpsError> {
    serde_json::from_value(v.clone()).map_err(|_| OpsError::Decode { what: "Operation" })
}

/// The lowercase name of a state (`running`, `completed`, ...), as the API spells it.
pub fn state_name(s: OperationState) -> &'static str {
    match s {
        OperationState::Queued => "queued",
        OperationState::Running => "running",
        OperationState::Waiting => "waiting",
        OperationState::Suspended => "suspended",
        OperationState::Completed => "completed",
        OperationState::Failed => "failed",
        OperationState::Cancelled => "cancelled",
    }
}

/// Whether `s` is terminal (`completed`, `failed`, `cancelled`).
pub fn is_terminal(s: OperationState) -> bool {
    matches!(
        s,
        OperationState::Completed | OperationState::Failed | OperationState::Cancelled
    )
}

fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn wait_text(w: &OperationWait) -> String {
    let what = serde_json::to_value(w.waits_for)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut s = format!("for {what}");
    if let Some(step) = &w.step {
        let _ = write!(s, " (step {step})");
    }
    if let Some(until) = &w.until {
        let _ = write!(s, " until {}", time(until));
    }
    if let Some(e) = &w.last_broadcast_error {
        let _ = write!(s, "; last broadcast error {e}");
    }
    // A custody sender's transaction: the provider's id and status (issue 32 §5), so
    // that an operator can find it at the provider without `--json`.
    if let Some(c) = &w.custody {
        let _ = write!(
            s,
            "; {} tx {} status {}",
            c.provider,
            c.provider_tx_id.as_deref().unwrap_or("(not created yet)"),
            c.status.as_deref().unwrap_or("(not read yet)")
        );
        if let Some(sub) = &c.sub_status {
            let _ = write!(s, "/{sub}");
        }
    }
    s
}

/// The progress snapshot's `phase`, when it has one.
fn phase(op: &Operation) -> Option<&str> {
    op.progress.as_ref()?.get("phase")?.as_str()
}

/// Is an open operation whose `updatedAt` is older than `threshold` at `now` (what
/// `keel ops list --stuck` keeps).
pub fn is_stuck(op: &Operation, now: DateTime<Utc>, threshold: Duration) -> bool {
    let age = now.signed_duration_since(op.updated_at);
    !is_terminal(op.state) && age.to_std().is_ok_and(|a| a >= threshold)
}

/// The `keel ops list` table: one line per operation (id, kind, state, asset, created,
/// updated, and the wait or error).
pub fn table(ops: &[Operation]) -> String {
    let mut rows: Vec<[String; 7]> = vec![[
        "ID".into(),
        "KIND".into(),
        "STATE".into(),
        "ASSET".into(),
        "CREATED".into(),
        "UPDATED".into(),
        "DETAIL".into(),
    ]];
    for op in ops {
        let detail = if let Some(w) = &op.wait {
            format!("waiting {}", wait_text(w))
        } else if let Some(e) = &op.error {
            e.code.clone()
        } else if let Some(b) = op.queued_behind {
            format!("behind {b}")
        } else {
            phase(op).map(str::to_owned).unwrap_or_default()
        };
        rows.push([
            op.id.to_string(),
            op.kind.clone(),
            state_name(op.state).to_owned(),
            op.asset_id
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
            time(&op.created_at),
            time(&op.updated_at),
            detail,
        ]);
    }
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, (c, w)) in r.iter().zip(widths.iter()).enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn by_text(b: &RecordedBy) -> String {
    let kind = serde_json::to_value(b.actor.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut s = kind;
    if let Some(id) = &b.actor.id {
        let _ = write!(s, " {id}");
    }
    if let Some(r) = &b.actor.reason {
        let _ = write!(s, " ({r})");
    }
    let _ = write!(s, " at {}", time(&b.at));
    s
}

/// The `keel ops show` text: state, wait, milestones (each transaction with hash,
/// nonce, block and times), progress, result or error, and attribution.
pub fn describe(op: &Operation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "operation  {}", op.id);
    let _ = writeln!(s, "kind       {}", op.kind);
    let _ = writeln!(
        s,
        "asset      {}",
        op.asset_id
            .map_or_else(|| "-".to_owned(), |a| a.to_string())
    );
    let _ = writeln!(s, "state      {}", state_name(op.state));
    if let Some(w) = &op.wait {
        let _ = writeln!(s, "wait       {}", wait_text(w));
    }
    if let Some(b) = op.queued_behind {
        let _ = writeln!(s, "behind     {b}");
    }
    if let Some(t) = &op.cancel_requested_at {
        let _ = writeln!(s, "cancel     requested at {}", time(t));
    }
    let _ = writeln!(s, "created    {}", time(&op.created_at));
    let _ = writeln!(s, "updated    {}", time(&op.updated_at));
    if let Some(t) = &op.completed_at {
        let _ = writeln!(s, "ended      {}", time(t));
    }
    if let Some(p) = phase(op) {
        let _ = writeln!(s, "phase      {p}");
    }
    let _ = writeln!(s, "milestones");
    let _ = writeln!(s, "  accepted   {}", time(&op.milestones.accepted));
    for tx in &op.milestones.submitted {
        let _ = writeln!(
            s,
            "  submitted  {} tx {} nonce {} {}",
            tx.step,
            tx.tx_hash.as_deref().unwrap_or("-"),
            tx.nonce.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            match &tx.broadcast_at {
                Some(t) => format!("broadcast {}", time(t)),
                None => "not broadcast".to_owned(),
            }
        );
    }
    for tx in &op.milestones.confirmed {
        let _ = writeln!(
            s,
            "  confirmed  {} tx {} block {}{}",
            tx.step,
            tx.tx_hash.as_deref().unwrap_or("-"),
            tx.block.map_or_else(|| "-".to_owned(), |b| b.to_string()),
            tx.confirmed_at
                .as_ref()
                .map(|t| format!(" at {}", time(t)))
                .unwrap_or_default()
        );
    }
    if let Some(ix) = &op.milestones.indexed {
        let _ = writeln!(
            s,
            "  indexed    block {}{}",
            ix.block,
            ix.at
                .as_ref()
                .map(|t| format!(" at {}", time(t)))
                .unwrap_or_default()
        );
    }
    if let Some(e) = &op.error {
        let _ = writeln!(
            s,
            "error      {} (retryable: {}) {}{}",
            e.code,
            e.retryable,
            e.detail,
            e.reason
                .as_ref()
                .map(|r| format!("; revert reason: {r}"))
                .unwrap_or_default()
        );
    }
    if let Some(r) = &op.result
        && let Ok(v) = serde_json::to_string(r)
    {
        let _ = writeln!(s, "result     {v}");
    }
    if let Some(a) = &op.attribution {
        let _ = writeln!(s, "attribution");
        if let Some(b) = &a.started_by {
            let _ = writeln!(s, "  started by   {}", by_text(b));
        }
        if let Some(d) = &a.approval {
            let _ = writeln!(s, "  {:<12} {}", d.decision, by_text(&d.by));
        }
        for b in &a.retried_by {
            let _ = writeln!(s, "  retried by   {}", by_text(b));
        }
        if let Some(b) = &a.cancelled_by {
            let _ = writeln!(s, "  cancelled by {}", by_text(b));
        }
    }
    s
}

/// The lines `keel ops watch` prints for what changed from `before` (None: the first
/// poll, everything so far) to `now`, in milestone order: state, wait, each newly
/// submitted and confirmed transaction, the indexed milestone, the progress phase,
/// the error.
pub fn changes(before: Option<&Operation>, now: &Operation) -> Vec<String> {
    let mut out = Vec::new();
    if before.is_none() {
        out.push(format!(
            "{}  accepted   {} {}",
            time(&now.milestones.accepted),
            now.kind,
            now.id
        ));
    }
    let state_changed = before.is_none_or(|b| b.state != now.state);
    let wait_changed = before.is_none_or(|b| b.wait != now.wait);
    if state_changed && !is_terminal(now.state) {
        out.push(format!(
            "{}  state      {}",
            time(&now.updated_at),
            state_name(now.state)
        ));
    }
    if wait_changed && let Some(w) = &now.wait {
        out.push(format!(
            "{}  waiting    {}",
            time(&now.updated_at),
            wait_text(w)
        ));
    }
    let seen_phase = before.and_then(phase);
    if let Some(p) = phase(now)
        && seen_phase != Some(p)
    {
        out.push(format!("{}  phase      {p}", time(&now.updated_at)));
    }
    let had = |list: fn(&Operation) -> &Vec<keel_api::dto::TxMilestone>,
               tx: &keel_api::dto::TxMilestone| {
        before.is_some_and(|b| {
            list(b).iter().any(|t| {
                t.step == tx.step && t.tx_hash == tx.tx_hash && t.broadcast == tx.broadcast
            })
        })
    };
    for tx in &now.milestones.submitted {
        if !had(|o| &o.milestones.submitted, tx) {
            out.push(format!(
                "{}  submitted  {} tx {} nonce {}{}",
                time(tx.broadcast_at.as_ref().unwrap_or(&now.updated_at)),
                tx.step,
                tx.tx_hash.as_deref().unwrap_or("-"),
                tx.nonce.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                if tx.broadcast {
                    ""
                } else {
                    " (signed, not broadcast)"
                }
            ));
        }
    }
    for tx in &now.milestones.confirmed {
        if !had(|o| &o.milestones.confirmed, tx) {
            out.push(format!(
                "{}  confirmed  {} tx {} block {}",
                time(tx.confirmed_at.as_ref().unwrap_or(&now.updated_at)),
                tx.step,
                tx.tx_hash.as_deref().unwrap_or("-"),
                tx.block.map_or_else(|| "-".to_owned(), |b| b.to_string())
            ));
        }
    }
    if let Some(ix) = &now.milestones.indexed
        && before.is_none_or(|b| b.milestones.indexed.is_none())
    {
        out.push(format!(
            "{}  indexed    block {}",
            time(ix.at.as_ref().unwrap_or(&now.updated_at)),
            ix.block
        ));
    }
    if let Some(e) = &now.error
        && before.is_none_or(|b| b.error.as_ref().map(|x| &x.code) != Some(&e.code))
    {
        out.push(format!(
            "{}  error      {} {}",
            time(&now.updated_at),
            e.code,
            e.detail
        ));
    }
    if state_changed && is_terminal(now.state) {
        out.push(format!(
            "{}  {}",
            time(now.completed_at.as_ref().unwrap_or(&now.updated_at)),
            state_name(now.state)
        ));
    }
    out
}

/// The exit code of `keel ops watch`: the operation's terminal state, or why the
/// watch ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchExit {
    /// `completed`: 0.
    Completed,
    /// The command failed (an API error code, the API unreachable): 1.
    Error,
    /// `failed`: 3.
    Failed,
    /// `cancelled`: 4.
    Cancelled,
    /// `--timeout-seconds` passed before a terminal state: 5.
    TimedOut,
}

impl WatchExit {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            WatchExit::Completed => 0,
            WatchExit::Error => 1,
            WatchExit::Failed => 3,
            WatchExit::Cancelled => 4,
            WatchExit::TimedOut => 5,
        }
    }

    /// The exit of a terminal state (None while the operation has not ended).
    pub fn of(state: OperationState) -> Option<Self> {
        match state {
            OperationState::Completed => Some(WatchExit::Completed),
            OperationState::Failed => Some(WatchExit::Failed),
            OperationState::Cancelled => Some(WatchExit::Cancelled),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(state: &str) -> Operation {
        serde_json::from_value(serde_json::json!({
            "id": "6f1c2a52-5b5e-4d43-9d1e-0c2f5d1e3a10",
            "kind": "asset.mint",
            "assetId": "2b0f9c1e-7d3a-4f6e-9a51-0c8d4e2f1a33",
            "state": state,
            "queuedBehind": null,
            "wait": null,
            "cancelRequestedAt": null,
            "milestones": {"accepted": "2026-12-01T10:00:00Z", "submitted": [], "confirmed": [], "indexed": null},
            "progress": null,
            "result": null,
            "error": null,
            "createdAt": "2026-12-01T10:00:00Z",
            "updatedAt": "2026-12-01T10:00:00Z",
            "completedAt": null
        }))
        .unwrap()
    }

    /// `keel ops show` and `keel ops list` print a custody wait's provider transaction
    /// id and status (issue 32 §5; before, only `--json` had them).
    #[test]
    fn a_custody_wait_prints_the_provider_transaction_and_status() {
        let mut waiting = op("waiting");
        waiting.wait = Some(
            serde_json::from_value(serde_json::json!({
                "for": "custody_approval", "until": null, "step": "mint",
                "lastBroadcastError": null,
                "custody": {"provider": "fireblocks", "providerTxId": "fb-tx-1",
                            "status": "PENDING_AUTHORIZATION", "subStatus": null}
            }))
            .unwrap(),
        );
        let shown = describe(&waiting);
        assert!(
            shown.contains("fireblocks tx fb-tx-1 status PENDING_AUTHORIZATION"),
            "{shown}"
        );
        let listed = table(std::slice::from_ref(&waiting));
        assert!(listed.contains("fb-tx-1"), "{listed}");
        assert!(listed.contains("PENDING_AUTHORIZATION"), "{listed}");
    }

    #[test]
    fn changes_list_each_milestone_once_in_order() {
        let first = op("running");
        let lines = changes(None, &first);
        assert!(lines[0].contains("accepted   asset.mint"), "{lines:?}");
        assert!(lines[1].ends_with("state      running"), "{lines:?}");
        assert!(changes(Some(&first), &first).is_empty(), "nothing changed");

        let mut tx: serde_json::Value = serde_json::json!({"step": "mint", "txHash": format!("0x{}", "ab".repeat(32)),
            "nonce": 7, "broadcast": true, "broadcastAt": "2026-12-01T10:00:01Z", "block": null, "confirmedAt": null});
        let mut second = first.clone();
        second.milestones.submitted = vec![serde_json::from_value(tx.clone()).unwrap()];
        let lines = changes(Some(&first), &second);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("submitted  mint tx 0xabab"), "{lines:?}");
        assert!(lines[0].contains("nonce 7"), "{lines:?}");

        tx["block"] = 12.into();
        tx["confirmedAt"] = "2026-12-01T10:00:02Z".into();
        let mut third = second.clone();
        third.state = OperationState::Completed;
        third.milestones.confirmed = vec![serde_json::from_value(tx).unwrap()];
        third.milestones.indexed =
            serde_json::from_value(serde_json::json!({"block": 12, "at": "2026-12-01T10:00:03Z"}))
                .unwrap();
        let lines = changes(Some(&second), &third);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("confirmed  mint"), "{lines:?}");
        assert!(lines[0].contains("block 12"), "{lines:?}");
        assert!(lines[1].contains("indexed    block 12"), "{lines:?}");
        assert!(lines[2].ends_with("completed"), "{lines:?}");
    }

    #[test]
    fn watch_exit_codes_follow_the_terminal_state() {
        assert_eq!(
            WatchExit::of(OperationState::Completed).map(WatchExit::code),
            Some(0)
        );
        assert_eq!(
            WatchExit::of(OperationState::Failed).map(WatchExit::code),
            Some(3)
        );
        assert_eq!(
            WatchExit::of(OperationState::Cancelled).map(WatchExit::code),
            Some(4)
        );
        assert_eq!(WatchExit::of(OperationState::Waiting), None);
    }

    #[test]
    fn stuck_means_open_and_unchanged_for_the_threshold() {
        let now = DateTime::parse_from_rfc3339("2026-12-01T10:20:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert!(is_stuck(&op("waiting"), now, Duration::from_secs(900)));
        assert!(!is_stuck(&op("waiting"), now, Duration::from_secs(1500)));
        assert!(!is_stuck(&op("failed"), now, Duration::from_secs(900)));
    }

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(path_segment("abc-1"), "abc-1");
        assert_eq!(path_segment("../v1/status"), "%2E%2E%2Fv1%2Fstatus");
        assert!(ApiClient::new("ftp://x", "k", Duration::from_secs(1)).is_err());
        let c = ApiClient::new("http://127.0.0.1:9/base", "k", Duration::from_secs(1)).unwrap();
        assert_eq!(
            c.url("v1/operations").unwrap().as_str(),
            "http://127.0.0.1:9/base/v1/operations"
        );
    }

    #[test]
    fn the_table_has_a_header_and_one_line_per_operation() {
        let t = table(&[op("running"), op("failed")]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ID"));
        assert!(lines[2].contains("failed"));
    }
}
