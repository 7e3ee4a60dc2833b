//! # keel-kms-sim
//!
//! A faithful local AWS KMS counterpart, run as a process by Keel's tests: the KMS
//! JSON 1.1 protocol (`POST /`, `X-Amz-Target: TrentService.<Operation>`,
//! `application/x-amz-json-1.1`, errors as `{"__type", "message"}` with the
//! `x-amzn-ErrorType` header), every request authenticated by SigV4 against the
//! configured credentials, `ECC_SECG_P256K1` keys that sign as KMS does (DER, `s` not
//! normalised), key states and aliases, a state file so a restart keeps the keys, and
//! fault knobs on an unauthenticated admin path. `keel-kms-sim --help` documents it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod keys;
mod sigv4;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use clap::Parser;
use keys::{Keys, KmsError};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

const AFTER_HELP: &str = r#"KMS API (POST /, Content-Type application/x-amz-json-1.1, SigV4 for service "kms")
  TrentService.CreateKey      {KeySpec: ECC_SECG_P256K1, KeyUsage: SIGN_VERIFY, Description?} -> {KeyMetadata}
  TrentService.DescribeKey    {KeyId} -> {KeyMetadata}
  TrentService.GetPublicKey   {KeyId} -> {KeyId (ARN), PublicKey (base64 DER SPKI), KeySpec, KeyUsage, SigningAlgorithms}
  TrentService.Sign           {KeyId, Message (base64), MessageType: RAW|DIGEST, SigningAlgorithm: ECDSA_SHA_256}
                              -> {KeyId, Signature (base64 DER), SigningAlgorithm}; every other signature has
                              the high s (KMS does not normalise)
  TrentService.DisableKey / EnableKey   {KeyId} -> {}
  TrentService.CreateAlias / UpdateAlias {AliasName: alias/..., TargetKeyId} -> {}
  KeyId: key id, key ARN, alias name or alias ARN. Errors are HTTP 400 (500 for KMSInternalException)
  with {"__type", "message"}: NotFoundException, DisabledException, KMSInvalidStateException,
  InvalidKeyUsageException, ValidationException, ThrottlingException, AlreadyExistsException,
  UnknownOperationException; SigV4 refusals: MissingAuthenticationTokenException,
  IncompleteSignatureException, UnrecognizedClientException, InvalidSignatureException (also when
  X-Amz-Date is more than 5 minutes off).

ADMIN API (no auth; bind to loopback)
  POST /_sim/faults      {throttle?: n, internalError?: n, delayMs?: ms, delayCount?: n}: the next n
                         KMS requests answer 400 ThrottlingException / 500 KMSInternalException (nothing
                         done), the next delayCount requests wait delayMs first
  POST /_sim/faults/clear  every fault off
  GET  /_sim/stats       {requests, signs, publicKeys, throttled, internalErrors, refusedAuth, refused}
"#;

/// A faithful local AWS KMS counterpart (see --help).
#[derive(Debug, Parser)]
#[command(name = "keel-kms-sim", version, after_help = AFTER_HELP)]
struct Cli {
    /// Address to listen on (port 0: any free port); the chosen address is printed as
    /// `keel-kms-sim listening on http://<addr>`.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The state file (keys and aliases); kept across restarts. Absent: memory only.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Accepted credentials `ACCESS_KEY_ID:SECRET_ACCESS_KEY` (repeatable).
    #[arg(
        long = "credential",
        default_value = "keel-sim-access-key:keel-sim-secret-key"
    )]
    credentials: Vec<String>,
    /// The region requests must be signed for.
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// The account id in ARNs.
    #[arg(long, default_value = "111122223333")]
    account: String,
    /// At start, make sure an `ECC_SECG_P256K1` key exists behind this alias
    /// (`alias/<name>`, repeatable): created when the alias is absent, kept when the
    /// state file already has it. Each is printed before the listening line as
    /// `key <alias> <keyId>`.
    #[arg(long = "create-key", value_name = "ALIAS")]
    create_keys: Vec<String>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Faults {
    throttle: u64,
    internal_error: u64,
    delay_ms: u64,
    delay_count: u64,
}

#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Stats {
    requests: u64,
    signs: u64,
    public_keys: u64,
    throttled: u64,
    internal_errors: u64,
    refused_auth: u64,
    refused: u64,
}

struct Sim {
    keys: Mutex<Keys>,
    credentials: HashMap<String, String>,
    faults: Mutex<Faults>,
    stats: Mutex<Stats>,
}

type Shared = Arc<Sim>;

fn error(e: &KmsError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = (
        status,
        [("content-type", "application/x-amz-json-1.1")],
        json!({"__type": e.kind, "message": e.message}).to_string(),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(e.kind) {
        response.headers_mut().insert("x-amzn-errortype", v);
    }
    response
}

fn ok(body: Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/x-amz-json-1.1")],
        body.to_string(),
    )
        .into_response()
}

fn param<'a>(body: &'a Value, name: &str) -> Result<&'a str, KmsError> {
    body.get(name).and_then(Value::as_str).ok_or_else(|| {
        KmsError::new(
            "ValidationException",
            format!("1 validation error detected: Value null at '{name}' failed to satisfy constraint: Member must not be null"),
        )
    })
}

fn metadata(keys: &Keys, id: &str) -> Value {
    let Some(key) = keys.state.keys.get(id) else {
        return Value::Null;
    };
    json!({
        "AWSAccountId": keys.account,
        "KeyId": key.id,
        "Arn": keys.arn(&key.id),
        "CreationDate": key.created,
        "Enabled": key.state == "Enabled",
        "Description": key.description,
        "KeyUsage": "SIGN_VERIFY",
        "KeyState": key.state,
        "Origin": "AWS_KMS",
        "KeyManager": "CUSTOMER",
        "CustomerMasterKeySpec": "ECC_SECG_P256K1",
        "KeySpec": "ECC_SECG_P256K1",
        "SigningAlgorithms": ["ECDSA_SHA_256"],
        "MultiRegion": false
    })
}

async fn operation(sim: &Sim, op: &str, body: &Value) -> Result<Value, KmsError> {
    let mut keys = sim.keys.lock().await;
    match op {
        "CreateKey" => {
            let spec = body
                .get("KeySpec")
                .or_else(|| body.get("CustomerMasterKeySpec"))
                .and_then(Value::as_str)
                .unwrap_or("SYMMETRIC_DEFAULT");
            let usage = body
                .get("KeyUsage")
                .and_then(Value::as_str)
                .unwrap_or("ENCRYPT_DECRYPT");
            let description = body
                .get("Description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let id = keys.create(spec, usage, description)?;
            Ok(json!({"KeyMetadata": metadata(&keys, &id)}))
        }
        "DescribeKey" => {
            let id = keys.resolve(param(body, "KeyId")?)?;
            Ok(json!({"KeyMetadata": metadata(&keys, &id)}))
        }
        "GetPublicKey" => {
            let (id, der) = keys.public_key(param(body, "KeyId")?)?;
            sim.stats.lock().await.public_keys += 1;
            Ok(json!({
                "KeyId": keys.arn(&id),
                "PublicKey": B64.encode(der),
                "CustomerMasterKeySpec": "ECC_SECG_P256K1",
                "KeySpec": "ECC_SECG_P256K1",
                "KeyUsage": "SIGN_VERIFY",
                "SigningAlgorithms": ["ECDSA_SHA_256"]
            }))
        }
        "Sign" => {
            let key_id = param(body, "KeyId")?;
            let message = B64
                .decode(param(body, "Message")?)
                .map_err(|_| KmsError::new("ValidationException", "Message is not valid base64"))?;
            let message_type = body
                .get("MessageType")
                .and_then(Value::as_str)
                .unwrap_or("RAW");
            let algorithm = param(body, "SigningAlgorithm")?;
            let (id, der) = keys.sign(key_id, &message, message_type, algorithm)?;
            sim.stats.lock().await.signs += 1;
            Ok(json!({
                "KeyId": keys.arn(&id),
                "Signature": B64.encode(der),
                "SigningAlgorithm": algorithm
            }))
        }
        "DisableKey" | "EnableKey" => {
            keys.set_enabled(param(body, "KeyId")?, op == "EnableKey")?;
            Ok(json!({}))
        }
        "CreateAlias" | "UpdateAlias" => {
            keys.alias(
                param(body, "AliasName")?,
                param(body, "TargetKeyId")?,
                op == "CreateAlias",
            )?;
            Ok(json!({}))
        }
        other => Err(KmsError::new(
            "UnknownOperationException",
            format!("operation {other} is not offered by this simulator"),
        )),
    }
}

async fn kms(
    State(sim): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    sim.stats.lock().await.requests += 1;
    let now = chrono::Utc::now().timestamp();
    if let Err(r) = sigv4::verify(
        &sim.credentials,
        &sim.keys.lock().await.region.clone(),
        "kms",
        now,
        &method,
        uri.path(),
        uri.query().unwrap_or_default(),
        &headers,
        &body,
    ) {
        sim.stats.lock().await.refused_auth += 1;
        return error(&KmsError::new(r.kind, r.message));
    }
    // Faults come after authentication, as a throttled request is a signed one.
    let delay = {
        let mut f = sim.faults.lock().await;
        if f.throttle > 0 {
            f.throttle -= 1;
            drop(f);
            sim.stats.lock().await.throttled += 1;
            return error(&KmsError::new("ThrottlingException", "Rate exceeded"));
        }
        if f.internal_error > 0 {
            f.internal_error -= 1;
            drop(f);
            sim.stats.lock().await.internal_errors += 1;
            return error(&KmsError {
                kind: "KMSInternalException",
                message: "An internal error occurred".into(),
                status: 500,
            });
        }
        if f.delay_count > 0 {
            f.delay_count -= 1;
            f.delay_ms
        } else {
            0
        }
    };
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let Some(op) = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix("TrentService."))
        .map(str::to_owned)
    else {
        return error(&KmsError::new(
            "UnknownOperationException",
            "X-Amz-Target must be TrentService.<Operation>",
        ));
    };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return error(&KmsError::new(
                "SerializationException",
                "the body is not a JSON object",
            ));
        }
    };
    match operation(&sim, &op, &parsed).await {
        Ok(v) => ok(v),
        Err(e) => {
            sim.stats.lock().await.refused += 1;
            error(&e)
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FaultRequest {
    throttle: Option<u64>,
    internal_error: Option<u64>,
    delay_ms: Option<u64>,
    delay_count: Option<u64>,
}

async fn set_faults(State(sim): State<Shared>, Json(req): Json<FaultRequest>) -> StatusCode {
    let mut f = sim.faults.lock().await;
    if let Some(n) = req.throttle {
        f.throttle = n;
    }
    if let Some(n) = req.internal_error {
        f.internal_error = n;
    }
    if let Some(ms) = req.delay_ms {
        f.delay_ms = ms;
    }
    if let Some(n) = req.delay_count {
        f.delay_count = n;
    }
    StatusCode::NO_CONTENT
}

async fn clear_faults(State(sim): State<Shared>) -> StatusCode {
    *sim.faults.lock().await = Faults::default();
    StatusCode::NO_CONTENT
}

async fn stats(State(sim): State<Shared>) -> Json<Stats> {
    Json(*sim.stats.lock().await)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut credentials = HashMap::new();
    for c in &cli.credentials {
        let (id, secret) = c
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("--credential must be ACCESS_KEY_ID:SECRET"))?;
        credentials.insert(id.to_owned(), secret.to_owned());
    }
    let mut keys = Keys::open(cli.region, cli.account, cli.state)?;
    let mut out = std::io::stdout();
    for alias in &cli.create_keys {
        let id = match keys.resolve(alias) {
            Ok(id) => id,
            Err(_) => {
                let id = keys
                    .create(
                        "ECC_SECG_P256K1",
                        "SIGN_VERIFY",
                        format!("created at start for {alias}"),
                    )
                    .map_err(|e| anyhow::anyhow!("--create-key {alias}: {}", e.message))?;
                keys.alias(alias, &id, true)
                    .map_err(|e| anyhow::anyhow!("--create-key {alias}: {}", e.message))?;
                id
            }
        };
        writeln!(out, "key {alias} {id}")?;
    }
    let sim = Arc::new(Sim {
        keys: Mutex::new(keys),
        credentials,
        faults: Mutex::new(Faults::default()),
        stats: Mutex::new(Stats::default()),
    });
    let app = Router::new()
        .route("/", post(kms))
        .route("/_sim/faults", post(set_faults))
        .route("/_sim/faults/clear", post(clear_faults))
        .route("/_sim/stats", get(stats))
        .with_state(sim);
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    let addr = listener.local_addr()?;
    writeln!(out, "keel-kms-sim listening on http://{addr}")?;
    out.flush()?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
