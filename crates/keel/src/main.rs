//! The `keel` binary: `keel migrate`, `keel config print`, `keel run --role …`,
//! `keel chain bootstrap`.

use alloy::primitives::Address;
use alloy::providers::{Provider, ProviderBuilder};
use alloy::signers::local::PrivateKeySigner;
use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use keel::config::{Config, Role};
use keel::telemetry;
use keel_abi::platform::{PlatformDeployment, deploy_platform, read_back};
use keel_store::platform::{PlatformContract, platform_contract_upsert};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Keel: durable asset operations on EVM chains.
#[derive(Parser, Debug)]
#[command(name = "keel", version, about)]
struct Cli {
    /// Configuration file merged over the built-in defaults (config/default.toml).
    #[arg(long, global = true, env = "KEEL_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Apply pending database migrations (run before a release serves).
    Migrate,
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run one role of Keel until SIGTERM/SIGINT. `runner` and `indexer` own shards of
    /// their group (refusing to start when `durable.sharding.shards` differs from the
    /// recorded count); the runner also runs the daily retention job. On a signal the
    /// process reports not-ready, releases its shards within the grace, and exits.
    Run {
        /// The role of this process (no combined role exists).
        #[arg(long, env = "KEEL_ROLE", value_enum)]
        role: Option<Role>,
        /// Seconds in-flight work gets to finish after a shutdown signal.
        #[arg(long, default_value_t = 30)]
        termination_grace_seconds: u64,
    },
    /// Chain operator commands.
    Chain {
        #[command(subcommand)]
        command: ChainCommand,
    },
    /// Organization commands (tenants of the Platform API).
    Org {
        #[command(subcommand)]
        command: OrgCommand,
    },
    /// API key commands.
    ApiKey {
        #[command(subcommand)]
        command: ApiKeyCommand,
    },
    /// Asset template commands (the server-side settings assets are created from).
    Template {
        #[command(subcommand)]
        command: TemplateCommand,
    },
    /// Operator commands on operations (through the database; any organization).
    Ops {
        #[command(subcommand)]
        command: OpsCommand,
    },
}

#[derive(Subcommand, Debug)]
enum OpsCommand {
    /// Cancel an operation, with the semantics of `POST /v1/operations/{id}/cancel`:
    /// before any transaction it ends `cancelled`; an unsigned transaction is withdrawn;
    /// a signed one runs to its verdict (what landed is listed). Prints the operation's
    /// view as JSON; exits non-zero when the operation has ended or does not exist.
    Cancel {
        /// The operation id.
        id: sqlx::types::Uuid,
    },
    /// Print an operation's history (the decision log of its workflow, oldest first,
    /// with the actor of each entry and the state after it) as the JSON array
    /// `GET /v1/operations/{id}/history` pages through.
    History {
        /// The operation id.
        id: sqlx::types::Uuid,
    },
}

#[derive(Subcommand, Debug)]
enum OrgCommand {
    /// Create an organization; prints its id.
    Create {
        /// Unique name, 1 to 255 characters.
        #[arg(long)]
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum ApiKeyCommand {
    /// Create an API key for an organization. The token is printed once on stdout and
    /// stored only as its SHA-256.
    Create {
        /// The organization's name.
        #[arg(long)]
        org: String,
        /// A label for the key (who or what uses it).
        #[arg(long)]
        label: String,
        /// A scope the key holds: read, operate, approve or admin (repeatable; default:
        /// all four).
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        /// The named person the key is issued to (its commands are recorded as actor
        /// USER with this id): 1 to 255 printable characters.
        #[arg(long = "issued-to", value_name = "PERSON")]
        issued_to: Option<String>,
    },
    /// List an organization's API keys (revoked ones included), oldest first, as JSON
    /// lines in the shape of `GET /v1/api-keys` items. Secrets are never shown.
    List {
        /// The organization's name.
        #[arg(long)]
        org: String,
    },
    /// Revoke an API key of an organization: both its secrets stop at once. Prints the
    /// key as JSON.
    Revoke {
        /// The organization's name.
        #[arg(long)]
        org: String,
        /// The key's id.
        id: sqlx::types::Uuid,
    },
    /// Rotate an API key of an organization: prints the new token once on stdout (the
    /// key's id, label and scopes stay). The old secret stops at once unless
    /// `--expires-in-seconds` gives it an overlap (at most 604800).
    Rotate {
        /// The organization's name.
        #[arg(long)]
        org: String,
        /// The key's id.
        id: sqlx::types::Uuid,
        /// How long the old secret keeps working, seconds (default 0: it stops at once).
        #[arg(long, default_value_t = 0)]
        expires_in_seconds: u64,
    },
}

#[derive(Subcommand, Debug)]
enum TemplateCommand {
    /// Create or replace an asset template of an organization.
    Set {
        /// The organization's name.
        #[arg(long)]
        org: String,
        /// Template id, `^[a-z0-9][a-z0-9._-]{0,63}$`.
        #[arg(long)]
        id: String,
        /// The chain's name in the configuration (`[chains.<name>]`).
        #[arg(long)]
        chain: String,
        /// Decimals of the price feed's answers.
        #[arg(long, default_value_t = 8)]
        price_decimals: u8,
        /// Staleness bound installed on the PriceResolver, seconds.
        #[arg(long, default_value_t = 86_400)]
        staleness_bound_seconds: u64,
        /// Mints and burns above this amount (token units) wait for an approval; when
        /// set, every role change (grant-role, revoke-role) waits for one too.
        #[arg(long)]
        mint_approval_threshold: Option<String>,
        /// Seconds an approval may take before the operation fails APPROVAL_EXPIRED.
        #[arg(long, default_value_t = 86_400)]
        approval_ttl_seconds: u64,
        /// Pause operations on insufficient gas funds instead of failing GAS_REQUIRED.
        #[arg(long)]
        funding_pause: bool,
        /// Seconds a funding pause may last.
        #[arg(long, default_value_t = 3_600)]
        funding_deadline_seconds: u64,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the effective configuration (defaults + file + environment), secrets redacted.
    Print,
}

#[derive(Subcommand, Debug)]
enum ChainCommand {
    /// Deploy Keel's platform contracts to a configured chain, register them in its
    /// Directory, record them in the database, and read each back.
    Bootstrap {
        /// The chain's name in the configuration (`[chains.<name>]`).
        #[arg(long)]
        chain: String,
        /// Name of the environment variable that holds the deployer's private key (hex).
        /// The key is never printed, logged or stored.
        #[arg(long, default_value = "KEEL_DEPLOYER_KEY")]
        key_env: String,
        /// Also deploy the ERC-4337 EntryPoint v0.8 and SimpleAccountFactory at their
        /// canonical addresses from the npm artifacts (local/dev chains), when absent.
        #[arg(long)]
        deploy_erc4337: bool,
        /// The EntryPoint the EntryPointReference records (default: canonical v0.8).
        #[arg(long)]
        entry_point: Option<Address>,
        /// The address of the sponsor key whose signatures Keel's SponsorPaymaster
        /// honours (default: the deployer's address).
        #[arg(long)]
        sponsor_signer: Option<Address>,
        /// EntryPoint deposit funded for the SponsorPaymaster, in ether (decimal).
        #[arg(long, default_value = "1")]
        paymaster_deposit_ether: String,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("keel: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Command::Config {
        command: ConfigCommand::Print,
    } = cli.command
    {
        print!("{}", config.redacted_toml());
        return std::process::ExitCode::SUCCESS;
    }
    if let Err(e) = telemetry::init_logging(&config.telemetry, &config.deployment_id) {
        eprintln!("keel: {e}");
        return std::process::ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keel: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(target: "keel", error = format!("{e:#}"), "command failed");
            eprintln!("keel: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            let pool = keel_store::connect(&config.database)
                .await
                .context("connecting to the database")?;
            keel_store::migrate(&pool)
                .await
                .context("applying migrations")?;
            let count = keel_store::MIGRATOR.iter().count();
            tracing::info!(target: "keel::migrate", migrations = count, "database is up to date");
            println!("migrations applied: {count} known, database up to date");
            Ok(())
        }
        Command::Run {
            role,
            termination_grace_seconds,
        } => run_role(config, role, Duration::from_secs(termination_grace_seconds)).await,
        Command::Chain {
            command:
                ChainCommand::Bootstrap {
                    chain,
                    key_env,
                    deploy_erc4337,
                    entry_point,
                    sponsor_signer,
                    paymaster_deposit_ether,
                },
        } => {
            let deposit = keel_units::Wei::from_ether_str(
                &paymaster_deposit_ether,
                keel_units::Rounding::Exact,
            )
            .context("--paymaster-deposit-ether is not a decimal amount of ether")?;
            bootstrap(
                config,
                &chain,
                &key_env,
                deploy_erc4337,
                entry_point,
                Sponsorship {
                    signer: sponsor_signer,
                    deposit,
                },
            )
            .await
        }
        Command::Config { .. } => Ok(()),
        Command::Org {
            command: OrgCommand::Create { name },
        } => {
            let pool = connect_migrated(&config).await?;
            let id = keel_workflows::tenancy::create_organization(&pool, &name).await?;
            println!("{id}");
            Ok(())
        }
        Command::ApiKey { command } => api_key_command(&config, command).await,
        Command::Template {
            command:
                TemplateCommand::Set {
                    org,
                    id,
                    chain,
                    price_decimals,
                    staleness_bound_seconds,
                    mint_approval_threshold,
                    approval_ttl_seconds,
                    funding_pause,
                    funding_deadline_seconds,
                },
        } => {
            let chain_id = config
                .chains
                .get(&chain)
                .with_context(|| {
                    format!("no chain named `{chain}` in the configuration (chains.*)")
                })?
                .chain_id;
            let pool = connect_migrated(&config).await?;
            let org = keel_workflows::tenancy::organization_by_name(&pool, &org).await?;
            let template = keel_workflows::tenancy::Template {
                id,
                chain_id,
                price_decimals,
                staleness_bound_seconds,
                mint_approval_threshold,
                approval_ttl_seconds,
                funding_pause,
                funding_deadline_seconds,
            };
            keel_workflows::tenancy::upsert_template(&pool, org, &template).await?;
            println!("template {} set (chain {chain_id})", template.id);
            Ok(())
        }
        Command::Ops { command } => ops_command(&config, command).await,
    }
}

async fn api_key_command(config: &Config, command: ApiKeyCommand) -> anyhow::Result<()> {
    use keel_workflows::tenancy;
    let pool = connect_migrated(config).await?;
    match command {
        ApiKeyCommand::Create {
            org,
            label,
            scopes,
            issued_to,
        } => {
            let org = tenancy::organization_by_name(&pool, &org).await?;
            let scopes = if scopes.is_empty() {
                keel_workflows::Scopes::all()
            } else {
                keel_workflows::Scopes::from_names(&scopes).with_context(|| {
                    "--scope must be one of read, operate, approve, admin".to_owned()
                })?
            };
            let key =
                tenancy::create_api_key_issued(&pool, org, &label, scopes, issued_to.as_deref())
                    .await?;
            eprintln!(
                "api key {} created with scopes {}; the token below is shown once",
                key.id,
                scopes.names().join(",")
            );
            println!("{}", key.token);
        }
        ApiKeyCommand::List { org } => {
            let org = tenancy::organization_by_name(&pool, &org).await?;
            let mut after = None;
            loop {
                let page = tenancy::api_keys(&pool, org, after, 200).await?;
                for k in &page {
                    let view = keel_api::dto::ApiKey::from(k.clone());
                    println!("{}", serde_json::to_string(&view)?);
                }
                match page.last() {
                    Some(last) if page.len() == 200 => after = Some((last.created_at, last.id)),
                    _ => break,
                }
            }
        }
        ApiKeyCommand::Revoke { org, id } => {
            let org = tenancy::organization_by_name(&pool, &org).await?;
            let key = tenancy::revoke_api_key(&pool, org, id)
                .await
                .with_context(|| format!("api key {id}"))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&keel_api::dto::ApiKey::from(key))?
            );
        }
        ApiKeyCommand::Rotate {
            org,
            id,
            expires_in_seconds,
        } => {
            let org = tenancy::organization_by_name(&pool, &org).await?;
            let rotated =
                tenancy::rotate_api_key(&pool, org, id, Duration::from_secs(expires_in_seconds))
                    .await
                    .with_context(|| format!("api key {id}"))?;
            match rotated.key.previous_secret_expires_at {
                Some(until) => eprintln!(
                    "api key {id} rotated; the old secret works until {until}; the new token below is shown once"
                ),
                None => eprintln!(
                    "api key {id} rotated; the old secret stopped; the new token below is shown once"
                ),
            }
            println!("{}", rotated.token);
        }
    }
    Ok(())
}

async fn ops_command(config: &Config, command: OpsCommand) -> anyhow::Result<()> {
    let pool = connect_migrated(config).await?;
    let engine = keel_durable::Engine::new(pool.clone(), keel::services::engine_config(config))
        .context("workflow engine configuration")?;
    let ops = keel_workflows::Ops::new(pool, engine);
    match command {
        OpsCommand::Cancel { id } => {
            let caller = ops
                .operator_caller(id)
                .await
                .with_context(|| format!("operation {id}"))?;
            let view = ops
                .cancel_by(caller, id, &keel_durable::Actor::system("operator-cli"))
                .await
                .map_err(|e| anyhow::anyhow!("{} ({})", e.detail(), e.code()))?;
            // The operation as the API serves it (`keel_api::dto` owns the JSON shape).
            let view = keel_api::dto::Operation::from(view);
            println!("{}", serde_json::to_string_pretty(&view)?);
            Ok(())
        }
        OpsCommand::History { id } => {
            let caller = ops
                .operator_caller(id)
                .await
                .with_context(|| format!("operation {id}"))?;
            let mut entries = Vec::new();
            let mut after = 0;
            loop {
                let page = ops
                    .operation_history(caller, id, after, 200)
                    .await
                    .map_err(|e| anyhow::anyhow!("{} ({})", e.detail(), e.code()))?;
                let Some(last) = page.last().map(|e| e.seq) else {
                    break;
                };
                entries.extend(
                    page.into_iter()
                        .map(keel_api::dto::OperationHistoryEntry::from),
                );
                after = last;
            }
            println!("{}", serde_json::to_string_pretty(&entries)?);
            Ok(())
        }
    }
}

async fn connect_migrated(config: &Config) -> anyhow::Result<sqlx::PgPool> {
    let pool = keel_store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    keel_store::migrate(&pool)
        .await
        .context("applying migrations")?;
    Ok(pool)
}

async fn run_role(config: Config, role: Option<Role>, grace: Duration) -> anyhow::Result<()> {
    let Some(role) = role.or(config.role) else {
        bail!(
            "no role: pass --role api|runner|indexer, set KEEL_ROLE, or `role` in the configuration"
        );
    };
    let span = tracing::info_span!("keel", role = role.as_str());
    let _entered = span.enter();
    let endpoint =
        telemetry::init_metrics(&config.telemetry, &config.deployment_id, role.as_str()).await?;
    let metrics_addr = endpoint
        .as_ref()
        .and_then(telemetry::MetricsEndpoint::local_addr);
    let pool = keel_store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    let shutdown = keel::shutdown::on_signal();
    let runtime = keel::roles::RoleRuntime::start(role, &config, &pool).await?;
    let supervisor = runtime.supervisor().clone();
    let ready = Arc::new(AtomicBool::new(false));
    // The telemetry endpoint outlives the drain (readiness reports "not ready" while
    // draining); it stops with the process.
    let endpoint_stop = tokio_util::sync::CancellationToken::new();
    if let Some(endpoint) = endpoint {
        let readiness = telemetry::Readiness {
            role: role.as_str(),
            ready: ready.clone(),
            chains: runtime.chain_set().cloned(),
            index_db: matches!(role, Role::Indexer).then(|| pool.clone()),
        };
        let served = telemetry::serve_endpoint(endpoint, readiness, endpoint_stop.clone());
        let watcher = supervisor.clone();
        tokio::spawn(async move {
            let outcome = served.await;
            let reason = match outcome {
                Ok(Ok(())) => "stopped serving".to_owned(),
                Ok(Err(e)) => format!("failed: {e}"),
                Err(_) => "panicked".to_owned(),
            };
            watcher.fail("telemetry-endpoint", &reason);
        });
    }
    let api = if role == Role::Api {
        Some(
            start_api(
                &config,
                &pool,
                ready.clone(),
                shutdown.clone(),
                supervisor.clone(),
            )
            .await?,
        )
    } else {
        None
    };
    ready.store(true, Ordering::SeqCst);
    metrics::gauge!("keel_ready").set(1.0);
    tracing::info!(
        target: "keel",
        metrics = metrics_addr.map(|a| a.to_string()).unwrap_or_else(|| "disabled".into()),
        chains = ?runtime.chains(),
        "{} role ready",
        role.as_str()
    );
    // Runs until a signal, or until a critical task ended for good.
    let failure = tokio::select! {
        () = shutdown.cancelled() => None,
        reason = runtime.failed() => Some(reason),
    };
    // Readiness first, so load balancers and probes stop routing before work stops.
    ready.store(false, Ordering::SeqCst);
    metrics::gauge!("keel_ready").set(0.0);
    shutdown.cancel();
    tracing::info!(target: "keel", grace_seconds = grace.as_secs(), "draining");
    let started = std::time::Instant::now();
    if let Some(server) = api {
        // The server stops accepting at the signal and finishes in-flight requests.
        if tokio::time::timeout(grace, server).await.is_err() {
            tracing::warn!(target: "keel", "in-flight requests did not finish within the grace");
        }
    }
    runtime.stop(grace.saturating_sub(started.elapsed())).await;
    let left = grace.saturating_sub(started.elapsed());
    tokio::time::timeout(left, pool.close()).await.ok();
    endpoint_stop.cancel();
    if let Some(reason) = failure {
        tracing::error!(target: "keel", reason = reason.as_str(), "stopped after a critical task failed");
        bail!("{reason}");
    }
    tracing::info!(target: "keel", "stopped");
    Ok(())
}

/// Binds the Platform API and serves it until `shutdown` fires (graceful: in-flight
/// requests finish). A server that ends before `shutdown` fails the process through
/// `supervisor` (task `api-server`).
async fn start_api(
    config: &Config,
    pool: &sqlx::PgPool,
    ready: Arc<AtomicBool>,
    shutdown: tokio_util::sync::CancellationToken,
    supervisor: keel::supervise::Supervisor,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let engine = keel_durable::Engine::new(pool.clone(), keel::services::engine_config(config))
        .context("durable engine")?;
    // `operation.accepted` webhook events are written with each accepted operation.
    let events = keel_workflows::OperationEvents::new(
        engine.clone(),
        keel_api::webhooks::operation_renderer(),
    );
    let ops = keel_workflows::Ops::new(pool.clone(), engine).with_events(events);
    let webhooks = keel_webhooks::Webhooks::new(pool.clone(), config.webhooks.to_config());
    let state = keel_api::ApiState::new(ops, ready)
        .with_webhooks(webhooks)
        .with_config(keel_api::ApiConfig {
            max_body_bytes: config.api.body_limit_bytes,
            status: config.api.status.to_query(),
            ..keel_api::ApiConfig::default()
        });
    let listener = tokio::net::TcpListener::bind(&config.api.listen_address)
        .await
        .with_context(|| format!("binding api.listenAddress {}", config.api.listen_address))?;
    tracing::info!(target: "keel::api", address = %config.api.listen_address, "platform API listening");
    let app = keel_api::router(state);
    let stop = shutdown.clone();
    let served = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    Ok(tokio::spawn(async move {
        let outcome = served.await;
        if shutdown.is_cancelled() {
            if let Ok(Err(e)) = outcome {
                tracing::error!(target: "keel::api", error = %e, "platform API server failed while draining");
            }
            return;
        }
        let reason = match outcome {
            Ok(Ok(())) => "stopped serving".to_owned(),
            Ok(Err(e)) => format!("failed: {e}"),
            Err(_) => "panicked".to_owned(),
        };
        supervisor.fail("api-server", &reason);
    }))
}

/// The SponsorPaymaster settings of `keel chain bootstrap`.
struct Sponsorship {
    /// The sponsor key's address (default: the deployer).
    signer: Option<Address>,
    /// The EntryPoint deposit to fund.
    deposit: keel_units::Wei,
}

async fn bootstrap(
    config: Config,
    chain_name: &str,
    key_env: &str,
    deploy_erc4337: bool,
    entry_point: Option<Address>,
    sponsorship: Sponsorship,
) -> anyhow::Result<()> {
    let chain = config.chains.get(chain_name).with_context(|| {
        format!("no chain named `{chain_name}` in the configuration (chains.*)")
    })?;
    let key = std::env::var(key_env)
        .with_context(|| format!("environment variable {key_env} is not set"))?;
    let signer: PrivateKeySigner = key
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{key_env} does not hold a valid hex private key"))?;
    drop(key);
    let admin = signer.address();
    let url = chain.rpc_urls.first().context("chain has no RPC URL")?;
    let provider = ProviderBuilder::new()
        .wallet(signer)
        .connect(url)
        .await
        .context("connecting to the chain's first RPC upstream")?
        .erased();
    let reported = provider.get_chain_id().await.context("eth_chainId")?;
    if reported != chain.chain_id {
        bail!(
            "chain `{chain_name}` is configured with chainId {} but its RPC reports {reported}",
            chain.chain_id
        );
    }
    let pool = keel_store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    keel_store::migrate(&pool)
        .await
        .context("applying migrations")?;

    let entry_point = entry_point.unwrap_or(keel_abi::erc4337::ENTRY_POINT_V08);
    if deploy_erc4337 {
        let root = workspace_root();
        let dir = keel_abi::erc4337::artifacts_dir(&root);
        let d = keel_abi::erc4337::deploy_v08(&provider, admin, &dir).await?;
        println!("erc4337  EntryPoint v0.8        {}", d.entry_point);
        println!(
            "erc4337  SimpleAccountFactory   {}",
            d.simple_account_factory
        );
    }
    if provider.get_code_at(entry_point).await?.is_empty() {
        bail!(
            "no code at the EntryPoint {entry_point}; pass --deploy-erc4337 on a dev chain or --entry-point"
        );
    }

    let mut deployment: PlatformDeployment = deploy_platform(&provider, admin, entry_point).await?;
    // The paymaster is bound to the *resolved* EntryPoint, read through keel-aa's
    // resolution boundary from the Directory just written (the only EntryPoint lookup).
    let directory = deployment
        .address(keel_abi::platform::names::DIRECTORY)
        .context("the deployment has no Directory")?;
    let upstreams = keel_chain::UpstreamPool::new(
        keel_units::ChainId(chain.chain_id),
        keel_chain::UpstreamConfig::new(chain.rpc_urls.clone()),
    )
    .with_context(|| format!("configuration key `chains.{chain_name}.rpcUrls`"))?;
    let resolution = keel_aa::resolve_entry_point(&upstreams, directory)
        .await
        .context("resolving the EntryPoint recorded in the Directory")?;
    let paymaster = keel_abi::platform::deploy_sponsor_paymaster(
        &provider,
        directory,
        resolution.resolved.address(),
        sponsorship.signer.unwrap_or(admin),
        sponsorship.deposit.get(),
    )
    .await?;
    deployment.contracts.push(paymaster);
    for c in &deployment.contracts {
        platform_contract_upsert(
            &pool,
            &PlatformContract {
                chain_id: i64::try_from(deployment.chain_id).context("chain id exceeds i64")?,
                name: c.name.to_owned(),
                address: c.address.to_vec(),
                deploy_tx_hash: c.tx_hash.map(|h| h.to_vec()),
                deployed_block: c.block.and_then(|b| i64::try_from(b).ok()),
            },
        )
        .await?;
        println!("deployed {:<20} {}", c.name, c.address);
    }
    let chain_id = keel_units::ChainId(deployment.chain_id);
    for c in &deployment.contracts {
        use keel_abi::platform::names;
        let kind = match c.name {
            names::DIRECTORY => keel_index::ScopeKind::Directory,
            names::PRICE_RESOLVER => keel_index::ScopeKind::PriceResolver,
            names::PRICE_FEED_FACTORY => keel_index::ScopeKind::PriceFeedFactory,
            names::ASSET_FACTORY => keel_index::ScopeKind::AssetFactory,
            _ => continue,
        };
        keel_index::scope::add_scope(
            &pool,
            chain_id,
            &keel_index::ScopeEntry {
                address: c.address,
                kind,
                organization: None,
                from_block: c.block.unwrap_or(0),
            },
        )
        .await
        .with_context(|| format!("adding {} to the index scope", c.name))?;
    }
    for check in read_back(&provider, &deployment).await? {
        println!("check    {:<20} {}", check.name, check.observed);
    }
    println!(
        "bootstrap of chain `{chain_name}` (chainId {}) complete: {} contracts recorded",
        deployment.chain_id,
        deployment.contracts.len()
    );
    Ok(())
}

/// The source tree when running from it (for the npm artifacts), else the current dir.
fn workspace_root() -> PathBuf {
    let compiled = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if compiled.join("tools").is_dir() {
        compiled
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
    }
}
