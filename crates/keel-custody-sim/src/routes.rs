//! The HTTP surface: the provider's `/v1` paths, the JWKS, and the admin API.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use alloy::primitives::{Address, Bytes, U256};
use axum::Json;
use axum::Router;
use axum::body::Bytes as Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::auth::Verifier;
use crate::engine::{Engine, NewTx, TxFault};
use crate::hooks::WebhookMode;

pub(crate) struct App {
    pub(crate) engine: Arc<Engine>,
    pub(crate) verifier: Verifier,
}

type Shared = State<Arc<App>>;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/transactions", post(create))
        .route("/v1/transactions/{id}", get(get_tx))
        .route(
            "/v1/transactions/external_tx_id/{external}",
            get(get_by_external),
        )
        .route("/v1/transactions/{id}/cancel", post(cancel))
        .route("/.well-known/jwks.json", get(jwks))
        .route("/admin/vaults/{id}", get(admin_vault))
        .route("/admin/transactions", get(admin_transactions))
        .route("/admin/transactions/{id}/approve", post(admin_approve))
        .route("/admin/transactions/{id}/reject", post(admin_reject))
        .route("/admin/faults/transaction", post(admin_tx_fault))
        .route("/admin/faults/http", post(admin_http_fault))
        .route("/admin/faults/webhooks", post(admin_webhook_fault))
        .route("/admin/faults/clear", post(admin_clear))
        .route("/admin/webhooks", post(admin_webhook_url))
        .route("/admin/webhooks/events", get(admin_events))
        .route("/admin/webhooks/resend", post(admin_resend))
        .route("/admin/webhook-keys/rotate", post(admin_rotate))
        .route("/admin/stats", get(admin_stats))
        .with_state(app)
}

fn error(status: StatusCode, code: i64, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"message": message.into(), "code": code})),
    )
        .into_response()
}

/// The HTTP faults, then the JWT check; `Err` is the answer to send instead.
async fn gate(app: &App, headers: &HeaderMap, uri: &Uri, body: &[u8]) -> Result<(), Response> {
    let (rate, server, slow) = {
        let mut state = app.engine.lock();
        let http = &mut state.http;
        let rate = take(&mut http.rate_limit);
        let server = take(&mut http.server_error);
        let slow = take(&mut http.slow);
        (rate, server, slow)
    };
    if let Some(ms) = slow {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(secs) = rate {
        let mut response = error(StatusCode::TOO_MANY_REQUESTS, 429, "Too many requests");
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert("Retry-After", v);
        }
        return Err(response);
    }
    if let Some(status) = server {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Err(error(status, 500, "Internal error"));
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    app.verifier
        .verify(
            header("x-api-key"),
            header("authorization"),
            path_and_query,
            body,
        )
        .map_err(|refusal| {
            app.engine.lock().refused_auth += 1;
            tracing::info!(code = refusal.code, "request refused: {}", refusal.message);
            error(StatusCode::UNAUTHORIZED, refusal.code, refusal.message)
        })
}

/// Takes one use of a counted fault, returning its parameter.
fn take<T: Copy>(slot: &mut Option<(u32, T)>) -> Option<T> {
    let (count, value) = (*slot)?;
    *slot = if count > 1 {
        Some((count - 1, value))
    } else {
        None
    };
    Some(value)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    operation: String,
    asset_id: String,
    source: Peer,
    destination: Peer,
    #[serde(default)]
    amount: Option<String>,
    #[serde(default)]
    extra_parameters: Option<Extra>,
    #[serde(default)]
    external_tx_id: Option<String>,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Peer {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    one_time_address: Option<OneTime>,
}

#[derive(Deserialize)]
struct OneTime {
    address: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Extra {
    #[serde(default)]
    contract_call_data: Option<String>,
}

/// Parses a decimal amount of an 18-decimal coin into wei, exactly.
fn parse_amount(text: &str) -> Option<U256> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || frac.len() > 18
        || !whole
            .bytes()
            .chain(frac.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let unit = U256::from(10u64).pow(U256::from(18u64));
    let whole = U256::from_str(whole).ok()?;
    let frac = if frac.is_empty() {
        U256::ZERO
    } else {
        U256::from_str(&format!("{frac:0<18}")).ok()?
    };
    whole.checked_mul(unit)?.checked_add(frac)
}

fn parse_create(body: &[u8]) -> Result<NewTx, String> {
    let body: CreateBody =
        serde_json::from_slice(body).map_err(|e| format!("Invalid request body: {e}"))?;
    if body.operation != "CONTRACT_CALL" {
        return Err(format!(
            "Operation {} is not supported by this simulator",
            body.operation
        ));
    }
    if body.source.kind != "VAULT_ACCOUNT" {
        return Err("source.type must be VAULT_ACCOUNT".into());
    }
    let vault_id = body
        .source
        .id
        .filter(|i| !i.is_empty())
        .ok_or("source.id is required")?;
    if body.destination.kind != "ONE_TIME_ADDRESS" {
        return Err("destination.type must be ONE_TIME_ADDRESS".into());
    }
    let to = body
        .destination
        .one_time_address
        .and_then(|o| Address::from_str(&o.address).ok())
        .ok_or("destination.oneTimeAddress.address is not an address")?;
    let amount = body.amount.unwrap_or_else(|| "0".into());
    let value = parse_amount(&amount).ok_or("amount is not a decimal amount")?;
    let data = body
        .extra_parameters
        .and_then(|e| e.contract_call_data)
        .ok_or("extraParameters.contractCallData is required for CONTRACT_CALL")?;
    let calldata = hex::decode(data.strip_prefix("0x").unwrap_or(&data))
        .map(Bytes::from)
        .map_err(|_| "extraParameters.contractCallData is not hex")?;
    if let Some(ext) = &body.external_tx_id
        && (ext.is_empty() || ext.len() > 255)
    {
        return Err("externalTxId must be 1..255 characters".into());
    }
    Ok(NewTx {
        external_tx_id: body.external_tx_id,
        vault_id,
        asset_id: body.asset_id,
        to,
        calldata,
        value,
        amount,
        note: body.note.unwrap_or_default(),
    })
}

/// Writes run to completion in their own task, as at a real provider: a client that
/// hangs up (a timeout) does not undo a create that is already being handled.
async fn create(State(app): Shared, headers: HeaderMap, uri: Uri, body: Body) -> Response {
    app.engine.lock().creates_received += 1;
    tokio::spawn(create_inner(app, headers, uri, body))
        .await
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, 500, "Internal error"))
}

async fn create_inner(app: Arc<App>, headers: HeaderMap, uri: Uri, body: Body) -> Response {
    if let Err(r) = gate(&app, &headers, &uri, &body).await {
        return r;
    }
    let new = match parse_create(&body) {
        Ok(new) => new,
        Err(message) => return error(StatusCode::BAD_REQUEST, 1001, message),
    };
    match app.engine.create(new) {
        Ok((_, true)) => (
            StatusCode::BAD_GATEWAY,
            "<html><body>502 Bad Gateway</body></html>",
        )
            .into_response(),
        Ok((id, false)) => Json(json!({"id": id, "status": "SUBMITTED"})).into_response(),
        Err(refusal) => error(StatusCode::BAD_REQUEST, 1001, refusal.0),
    }
}

async fn get_tx(
    State(app): Shared,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = gate(&app, &headers, &uri, b"").await {
        return r;
    }
    match app.engine.lock().txs.get(&id) {
        Some(tx) => {
            let mut json = tx.json();
            if tx.lose_hash {
                json["txHash"] = serde_json::Value::String(String::new());
            }
            Json(json).into_response()
        }
        None => error(StatusCode::NOT_FOUND, 1404, "Transaction not found"),
    }
}

async fn get_by_external(
    State(app): Shared,
    headers: HeaderMap,
    uri: Uri,
    Path(external): Path<String>,
) -> Response {
    if let Err(r) = gate(&app, &headers, &uri, b"").await {
        return r;
    }
    let state = app.engine.lock();
    match state
        .by_external
        .get(&external)
        .and_then(|id| state.txs.get(id))
    {
        Some(tx) => Json(tx.json()).into_response(),
        None => error(StatusCode::NOT_FOUND, 1404, "Transaction not found"),
    }
}

async fn cancel(
    State(app): Shared,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    tokio::spawn(cancel_inner(app, headers, uri, id, body))
        .await
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, 500, "Internal error"))
}

async fn cancel_inner(
    app: Arc<App>,
    headers: HeaderMap,
    uri: Uri,
    id: String,
    body: Body,
) -> Response {
    if let Err(r) = gate(&app, &headers, &uri, &body).await {
        return r;
    }
    match app.engine.cancel(&id) {
        Some(success) => Json(json!({"success": success})).into_response(),
        None => error(StatusCode::NOT_FOUND, 1404, "Transaction not found"),
    }
}

async fn jwks(State(app): Shared) -> Response {
    Json(app.engine.hooks.jwks()).into_response()
}

async fn admin_vault(State(app): Shared, Path(id): Path<String>) -> Response {
    match app.engine.vault_address(&id) {
        Some(address) => {
            Json(json!({"id": id, "address": address.to_checksum(None)})).into_response()
        }
        None => error(StatusCode::NOT_FOUND, 1004, "Vault account was not found"),
    }
}

async fn admin_transactions(State(app): Shared) -> Response {
    let state = app.engine.lock();
    let list: Vec<_> = state
        .order
        .iter()
        .filter_map(|id| state.txs.get(id))
        .map(|t| t.json())
        .collect();
    Json(list).into_response()
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Decision {
    #[serde(default)]
    sub_status: Option<String>,
}

async fn admin_approve(State(app): Shared, Path(id): Path<String>) -> Response {
    decide(&app, &id, true, None)
}

async fn admin_reject(State(app): Shared, Path(id): Path<String>, body: Body) -> Response {
    let decision: Decision = serde_json::from_slice(&body).unwrap_or_default();
    decide(&app, &id, false, decision.sub_status)
}

fn decide(app: &App, id: &str, approve: bool, sub: Option<String>) -> Response {
    if app.engine.decide(id, approve, sub) {
        Json(json!({"success": true})).into_response()
    } else {
        error(
            StatusCode::CONFLICT,
            0,
            "Transaction is not pending authorization",
        )
    }
}

async fn admin_tx_fault(State(app): Shared, Json(fault): Json<TxFault>) -> Response {
    let mut state = app.engine.lock();
    match fault.external_tx_id.clone() {
        Some(ext) => {
            state.keyed_faults.insert(ext, fault);
        }
        None => state.next_faults.push_back(fault),
    }
    Json(json!({"success": true})).into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpFault {
    kind: String,
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    retry_after_secs: u64,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    delay_ms: u64,
}

fn one() -> u32 {
    1
}

async fn admin_http_fault(State(app): Shared, Json(fault): Json<HttpFault>) -> Response {
    let mut state = app.engine.lock();
    match fault.kind.as_str() {
        "rate_limit" => state.http.rate_limit = Some((fault.count, fault.retry_after_secs)),
        "server_error" => {
            state.http.server_error = Some((fault.count, fault.status.unwrap_or(503)))
        }
        "slow" => state.http.slow = Some((fault.count, fault.delay_ms)),
        other => return error(StatusCode::BAD_REQUEST, 0, format!("unknown kind {other}")),
    }
    Json(json!({"success": true})).into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WebhookFault {
    mode: WebhookMode,
    #[serde(default)]
    delay_ms: u64,
}

async fn admin_webhook_fault(State(app): Shared, Json(fault): Json<WebhookFault>) -> Response {
    app.engine
        .hooks
        .set_mode(fault.mode, Duration::from_millis(fault.delay_ms));
    Json(json!({"success": true})).into_response()
}

async fn admin_clear(State(app): Shared) -> Response {
    {
        let mut state = app.engine.lock();
        state.next_faults.clear();
        state.keyed_faults.clear();
        state.http = Default::default();
    }
    app.engine
        .hooks
        .set_mode(WebhookMode::Normal, Duration::ZERO);
    Json(json!({"success": true})).into_response()
}

#[derive(Deserialize)]
struct WebhookUrl {
    url: Option<String>,
}

async fn admin_webhook_url(State(app): Shared, Json(body): Json<WebhookUrl>) -> Response {
    app.engine.hooks.set_url(body.url);
    Json(json!({"success": true})).into_response()
}

async fn admin_events(State(app): Shared) -> Response {
    Json(app.engine.hooks.history()).into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Resend {
    event_id: String,
}

async fn admin_resend(State(app): Shared, Json(body): Json<Resend>) -> Response {
    if app.engine.hooks.resend(&body.event_id).await {
        Json(json!({"success": true})).into_response()
    } else {
        error(StatusCode::NOT_FOUND, 0, "event not found")
    }
}

async fn admin_rotate(State(app): Shared) -> Response {
    match app.engine.hooks.rotate() {
        Ok(kid) => Json(json!({"kid": kid})).into_response(),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            0,
            "key generation failed",
        ),
    }
}

async fn admin_stats(State(app): Shared) -> Response {
    let state = app.engine.lock();
    Json(json!({
        "transactions": state.order.len(),
        "refusedAuth": state.refused_auth,
        "createsReceived": state.creates_received,
    }))
    .into_response()
}
