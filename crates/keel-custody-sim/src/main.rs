//! # keel-custody-sim
//!
//! A faithful local Fireblocks-compatible custody provider, run as a process by Keel's
//! tests and demo. It speaks the provider's REST paths and bodies, verifies every
//! request JWT as the provider does, signs and broadcasts for its vault accounts to a
//! real chain RPC, walks the provider's status sequence, sends signed webhooks v2, and
//! injects faults through an admin API. `keel-custody-sim --help` documents it all.
//! State is in memory: a restart of the simulator is a new provider.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod auth;
mod engine;
mod hooks;
mod routes;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use alloy::providers::{Provider, ProviderBuilder};
use alloy::signers::local::PrivateKeySigner;
use anyhow::{Context, bail};
use clap::Parser;
use jsonwebtoken::DecodingKey;

const AFTER_HELP: &str = r#"PROVIDER API (as Fireblocks; every request needs X-API-Key and Authorization: Bearer <JWT>)
  POST /v1/transactions                              create; CONTRACT_CALL from a VAULT_ACCOUNT to a
                                                     ONE_TIME_ADDRESS; answers {id, status}; a duplicate
                                                     externalTxId is HTTP 400 "... already exists"
  GET  /v1/transactions/{id}                         the transaction (404 code 1404 when unknown)
  GET  /v1/transactions/external_tx_id/{externalTxId}
  POST /v1/transactions/{id}/cancel                  {success: true|false}; only before signing
  GET  /.well-known/jwks.json                        the webhook signing keys (RS512), all kids still valid

  The JWT (RS256, the public key registered with --api-user) must carry uri (path and query as
  sent), nonce (never reused), iat, exp (< iat + 30 s, not expired), sub (the API key) and
  bodyHash (hex SHA-256 of the exact body bytes). Refusals are HTTP 401 with the provider's code:
  -1 signature, -2 no API key, -3 no JWT, -4 wrong uri, -5 malformed, -6 wrong sub,
  -7 not accepted (bodyHash, lifetime, nonce reused, unknown key), -10 expired, -12 future iat.

STATUS WALK
  SUBMITTED -> [PENDING_AUTHORIZATION] -> QUEUED -> PENDING_SIGNATURE -> BROADCASTING
  -> CONFIRMING (txHash) -> COMPLETED/CONFIRMED, or FAILED/SMART_CONTRACT_EXECUTION_FAILED on a
  reverted receipt. One key per vault account (--vault-key, else derived from --seed); the
  simulator holds each account's nonce. Each change is a webhook v2 event
  {id, eventType: transaction.created | transaction.status.updated, eventVersion: 1, resourceId,
  createdAt (ms), data: the transaction}, signed as a detached JWS (RS512, kid in the header) in
  Fireblocks-Webhook-Signature, retried 3 times on a non-2xx answer.

ADMIN API (no auth; bind to loopback)
  GET  /admin/vaults/{id}                 {id, address} of a vault account
  GET  /admin/transactions                every transaction, in creation order
  GET  /admin/stats                       {transactions, refusedAuth, createsReceived}
  POST /admin/transactions/{id}/approve   approve one that is PENDING_AUTHORIZATION
  POST /admin/transactions/{id}/reject    {subStatus?} reject it (REJECTED, default REJECTED_BY_USER)
  POST /admin/faults/transaction          {externalTxId?, behavior, subStatus?, loseResponse?, loseHash?}
        for that externalTxId, else for the next create. behavior:
          normal            the full walk
          silent_drop       accept, stay QUEUED forever, never broadcast (cancel still works)
          reject            PENDING_AUTHORIZATION then REJECTED with subStatus
          block             BLOCKED with subStatus (default BLOCKED_BY_POLICY)
          revert            broadcast with too little gas: reverted on chain, FAILED
          require_approval  PENDING_AUTHORIZATION until approve/reject
        loseResponse: true  the transaction is created but the create answers 502
        loseHash: true      reads by id never carry txHash (empty, even when COMPLETED);
                            the lookup by externalTxId does
  POST /admin/faults/http                 {kind, count?=1, retryAfterSecs?, status?, delayMs?}
          rate_limit        the next count /v1 requests answer 429 with Retry-After: retryAfterSecs
          server_error      the next count /v1 requests answer status (default 503), nothing done
          slow              the next count /v1 requests wait delayMs before being handled
  POST /admin/faults/webhooks             {mode, delayMs?}: normal | none | duplicate | reorder
                                          (swapped in pairs; a lone event waits 2 s for its partner) | delay
  POST /admin/faults/clear                every fault off, webhooks normal
  POST /admin/webhooks                    {url} where webhooks go (null: nowhere)
  GET  /admin/webhooks/events             every event emitted {id, eventType, resourceId, status}
  POST /admin/webhooks/resend             {eventId} send an old event again, byte for byte
  POST /admin/webhook-keys/rotate         a new signing key (new kid); older keys stay published

On start the first line on stdout is: keel-custody-sim listening on http://<addr>"#;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "keel-custody-sim", version, about = "A faithful local Fireblocks-compatible custody provider", after_help = AFTER_HELP)]
struct Cli {
    /// Address to listen on (port 0: any free port, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The chain's JSON-RPC URL (signed transactions are broadcast there).
    #[arg(long)]
    rpc_url: String,
    /// An API user: API_KEY=PATH of its RSA public key (PEM). Repeatable.
    #[arg(long = "api-user", value_name = "API_KEY=PEM_PATH", required = true)]
    api_users: Vec<String>,
    /// Seed the vault keys derive from: keccak256("keel-custody-sim/vault/<seed>/<id>").
    #[arg(long, default_value = "keel-custody-sim")]
    seed: String,
    /// A configured vault key: ID=HEX_PRIVATE_KEY (overrides the seed for that id). Repeatable.
    #[arg(long = "vault-key", value_name = "ID=HEX")]
    vault_keys: Vec<String>,
    /// Asset ids accepted (the chain's native coin at the provider). Repeatable.
    #[arg(long = "asset-id", default_value = "ETH")]
    assets: Vec<String>,
    /// Where webhooks are sent (also settable through the admin API).
    #[arg(long)]
    webhook_url: Option<String>,
    /// The webhook signing key (RSA PEM); generated (2048 bit) when absent.
    #[arg(long)]
    webhook_key: Option<PathBuf>,
    /// Confirmations counted before COMPLETED.
    #[arg(long, default_value_t = 1)]
    confirmations: u64,
    /// Pause between two status steps, milliseconds.
    #[arg(long, default_value_t = 50)]
    step_delay_ms: u64,
    /// Receipt polling interval, milliseconds.
    #[arg(long, default_value_t = 100)]
    poll_interval_ms: u64,
    /// Gas limit used when the estimate reverts (the transaction is then broadcast and fails on chain).
    #[arg(long, default_value_t = 500_000)]
    fallback_gas_limit: u64,
}

fn split_pair(text: &str) -> anyhow::Result<(&str, &str)> {
    text.split_once('=')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .with_context(|| "expected NAME=VALUE".to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();

    let mut users = HashMap::new();
    for spec in &cli.api_users {
        let (key, path) = split_pair(spec).context("--api-user")?;
        let pem = std::fs::read(path).with_context(|| format!("reading {path}"))?;
        let decoding = DecodingKey::from_rsa_pem(&pem)
            .with_context(|| format!("{path} is not an RSA public key"))?;
        users.insert(key.to_owned(), decoding);
    }
    let mut vault_keys = HashMap::new();
    for spec in &cli.vault_keys {
        let (id, hex_key) = split_pair(spec).context("--vault-key")?;
        let signer =
            PrivateKeySigner::from_str(hex_key).context("--vault-key: not a private key")?;
        vault_keys.insert(id.to_owned(), signer);
    }
    if cli.confirmations == 0 {
        bail!("--confirmations must be at least 1");
    }
    let url = reqwest::Url::parse(&cli.rpc_url).context("--rpc-url")?;
    let chain = ProviderBuilder::new().connect_http(url).erased();
    let chain_id = chain
        .get_chain_id()
        .await
        .context("reading the chain id from --rpc-url")?;
    let key_pem = match &cli.webhook_key {
        Some(path) => Some(std::fs::read(path).context("--webhook-key")?),
        None => None,
    };
    let hooks = hooks::Hooks::start(cli.webhook_url.clone(), key_pem)?;
    let engine = Arc::new(engine::Engine::new(
        engine::EngineConfig {
            seed: cli.seed.clone(),
            vault_keys,
            assets: cli.assets.clone(),
            confirmations: cli.confirmations,
            step_delay: Duration::from_millis(cli.step_delay_ms),
            poll_interval: Duration::from_millis(cli.poll_interval_ms),
            fallback_gas_limit: cli.fallback_gas_limit,
        },
        chain,
        chain_id,
        hooks,
    ));
    let app = Arc::new(routes::App {
        engine,
        verifier: auth::Verifier::new(users),
    });
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .context("--listen")?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "keel-custody-sim listening on http://{addr}")?;
        out.flush()?;
    }
    tracing::info!(%addr, chain_id, "serving");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(listener, routes::router(app))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
