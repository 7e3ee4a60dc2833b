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
    /// Ledger Index operator commands.
    Index {
        #[command(subcommand)]
        command: IndexCommand,
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
    /// Local development in one command (not a production role): a fresh database on
    /// the running PostgreSQL (`DATABASE_URL`, dropped on exit), an Anvil chain,
    /// migrations, `chain bootstrap`, a demo organization `dev` with an API key (all
    /// scopes) and template `std`, and the three roles as child processes whose log
    /// lines are prefixed `[api]`, `[runner]`, `[indexer]`. Prints the API URL, the
    /// key, the status page and the OpenAPI URL; stops everything on SIGINT/SIGTERM.
    Dev {
        /// The API's listen address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        api_address: String,
        /// The Anvil binary (default: `tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil`).
        #[arg(long, env = "KEEL_ANVIL")]
        anvil: Option<PathBuf>,
    },
    /// Operator commands on operations: through a running Platform API (`cancel`:
    /// through the database, any organization).
    Ops {
        #[command(subcommand)]
        command: OpsCommand,
    },
}

/// Where the Platform API is and the API key to call it with (`keel ops` commands
/// other than `cancel`).
#[derive(clap::Args, Debug)]
struct ApiArgs {
    /// The Platform API's base URL.
    #[arg(long, env = "KEEL_API_URL", default_value = "http://127.0.0.1:8080")]
    api_url: String,
    /// The API key (`keel_sk_...`). Prefer the environment variable: a command-line
    /// argument is visible to other users of the machine.
    #[arg(long, env = "KEEL_API_KEY", hide_env_values = true)]
    api_key: String,
    /// Seconds one HTTP request may take.
    #[arg(long, default_value_t = 30)]
    request_timeout_seconds: u64,
}

#[derive(Subcommand, Debug)]
enum OpsCommand {
    /// List operations through `GET /v1/operations` (oldest first; the API's filters),
    /// as a table, or one JSON object per line with `--json`.
    List {
        #[command(flatten)]
        api: ApiArgs,
        /// Only this state: queued, running, waiting, suspended, completed, failed,
        /// cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Only this kind (`asset.create`, `asset.mint`, ...).
        #[arg(long)]
        kind: Option<String>,
        /// Only operations of this asset id.
        #[arg(long)]
        asset: Option<String>,
        /// Only operations accepted after this RFC 3339 instant.
        #[arg(long)]
        created_after: Option<String>,
        /// Only operations accepted before this RFC 3339 instant.
        #[arg(long)]
        created_before: Option<String>,
        /// Only open operations unchanged (`updatedAt`) for `--stuck-after-seconds`.
        #[arg(long)]
        stuck: bool,
        /// What `--stuck` means, seconds without a change (default 900, the status
        /// page's no-mutation threshold).
        #[arg(long, default_value_t = 900)]
        stuck_after_seconds: u64,
        /// At most this many operations (following the API's pages).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Continue from this cursor (printed on stderr when more remain).
        #[arg(long)]
        cursor: Option<String>,
        /// One JSON object per line (the API's `Operation` shape).
        #[arg(long)]
        json: bool,
    },
    /// Show one operation (`GET /v1/operations/{id}`): state, wait, milestones with
    /// each transaction, progress, result or error, attribution.
    Show {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
        /// The API's JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Follow one operation live until it ends, printing each milestone as it happens.
    /// Exit code: 0 completed, 3 failed, 4 cancelled, 5 `--timeout-seconds` passed,
    /// 1 an error (the API's code is printed).
    Watch {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
        /// Milliseconds between polls.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
        interval_ms: u64,
        /// Give up after this many seconds (exit code 5); default: wait until it ends.
        #[arg(long)]
        timeout_seconds: Option<u64>,
    },
    /// Retry a failed or suspended operation (`POST /v1/operations/{id}/retry`, scope
    /// `operate`); prints the operation afterwards as JSON.
    Retry {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Approve an operation waiting for an approval (`POST .../approve`, scope
    /// `approve`, another key than the one that started it); prints it as JSON.
    Approve {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Reject an operation waiting for an approval (`POST .../reject`, scope
    /// `approve`): it fails `APPROVAL_REJECTED`; prints it as JSON.
    Reject {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Cancel an operation, with the semantics of `POST /v1/operations/{id}/cancel`:
    /// before any transaction it ends `cancelled`; an unsigned transaction is withdrawn;
    /// a signed one runs to its verdict (what landed is listed). Prints the operation's
    /// view as JSON; exits non-zero when the operation has ended or does not exist.
    Cancel {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Print an operation's history (the decision log of its workflow, oldest first,
    /// with the actor of each entry and the state after it) as the JSON array
    /// `GET /v1/operations/{id}/history` pages through.
    History {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
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
        /// Send the template's assets from this custody vault
        /// (`chains.<chain>.custody.vaults.<name>`) instead of the operator key; the
        /// vault becomes the assets' issuer.
        #[arg(long)]
        sender: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the effective configuration (defaults + file + environment), secrets redacted.
    Print,
}

#[derive(Subcommand, Debug)]
enum IndexCommand {
    /// Re-index a chain's Ledger Index (the way back from a degraded chain, no SQL):
    /// takes a new owner epoch (the running indexer's tip owner is fenced and starts
    /// over), deletes every row at and above the first block (balances follow and are
    /// recomputed), clears the degraded marker; the indexer role then rebuilds the
    /// chain while reads say `indexRebuilding`. Safe while the indexer runs.
    Reindex {
        /// The chain's name in the configuration (`[chains.<name>]`).
        #[arg(long)]
        chain: String,
        /// The first block to rebuild (default: the lowest `from_block` of the scope).
        #[arg(long)]
        from_block: Option<u64>,
        /// Wait until the rebuild is done (the chain has a tip again and every history
        /// range is completed), at most this many seconds; 0 returns at once.
        #[arg(long, default_value_t = 0)]
        wait_seconds: u64,
    },
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
    // The API-backed operator commands need no configuration beyond their arguments,
    // and report the API's code themselves.
    let cli = match cli.command {
        Command::Ops { command } => return api_ops(command),
        command => Cli { command, ..cli },
    };
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
    // `keel run` exports traces when configured (the resource names its role).
    let export = match &cli.command {
        Command::Run { role, .. } => match role.or(config.role) {
            Some(role) => {
                let identity = keel::traces::Identity {
                    deployment_id: config.deployment_id.clone(),
                    role: role.as_str(),
                    host: config.cluster.host.clone(),
                };
                match keel::traces::TraceExport::install(&config.telemetry, &identity) {
                    Ok(export) => export,
                    Err(e) => {
                        eprintln!("keel: {e}");
                        return std::process::ExitCode::from(2);
                    }
                }
            }
            None => None,
        },
        _ => None,
    };
    if let Err(e) = telemetry::init_logging_traced(
        &config.telemetry,
        &config.deployment_id,
        export.as_ref().map(keel::traces::TraceExport::tracer),
    ) {
        eprintln!("keel: {e}");
        return std::process::ExitCode::from(2);
    }
    if let Some(export) = &export {
        tracing::info!(target: "keel::telemetry", instance = export.instance_id(), "exporting traces over OTLP");
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
    let outcome = runtime.block_on(dispatch(cli.command, config));
    // Outside the runtime: the exporter's blocking client must not be dropped in it.
    drop(runtime);
    if let Some(export) = export {
        export.shutdown();
    }
    match outcome {
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
            // A bar on a terminal's stderr (hidden otherwise: stdout stays one line).
            let pending = keel_store::pending_migrations(&pool)
                .await
                .context("reading the applied migrations")?;
            let bar = indicatif::ProgressBar::new(pending.len() as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "migrating {bar:30} {pos}/{len} {msg} ({elapsed})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            let mut started = false;
            keel_store::migrate_each(&pool, |version, description| {
                if started {
                    bar.inc(1);
                }
                started = true;
                bar.set_message(format!("{version:04} {description}"));
            })
            .await
            .context("applying migrations")?;
            if started {
                bar.inc(1);
            }
            bar.finish_with_message(format!("{} applied", pending.len()));
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
        Command::Index {
            command:
                IndexCommand::Reindex {
                    chain,
                    from_block,
                    wait_seconds,
                },
        } => reindex_command(&config, &chain, from_block, wait_seconds).await,
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
                    sender,
                },
        } => {
            let chain_id = config
                .chains
                .get(&chain)
                .with_context(|| {
                    format!("no chain named `{chain}` in the configuration (chains.*)")
                })?
                .chain_id;
            let sender = sender
                .map(|vault| config.template_sender(&chain, &vault))
                .transpose()?;
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
                sender,
            };
            keel_workflows::tenancy::upsert_template(&pool, org, &template).await?;
            match &template.sender {
                Some(s) => println!(
                    "template {} set (chain {chain_id}, sender vault {} {})",
                    template.id, s.vault, s.address
                ),
                None => println!("template {} set (chain {chain_id})", template.id),
            }
            Ok(())
        }
        // main() runs every operator command through the Platform API before any
        // configuration is loaded.
        Command::Ops { .. } => bail!("operator commands run through the Platform API"),
        Command::Dev { api_address, anvil } => keel_dev(&api_address, anvil).await,
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

/// `keel index reindex`: starts the re-index, prints what it did, and optionally waits
/// for the rebuild.
async fn reindex_command(
    config: &Config,
    chain: &str,
    from_block: Option<u64>,
    wait_seconds: u64,
) -> anyhow::Result<()> {
    let chain_id = config
        .chains
        .get(chain)
        .with_context(|| format!("no chain named `{chain}` in the configuration (chains.*)"))?
        .chain_id;
    let chain_id = keel_units::ChainId(chain_id);
    let pool = connect_migrated(config).await?;
    let done = keel_index::reindex(&pool, chain_id, from_block, "cli")
        .await
        .context("starting the re-index")?;
    println!(
        "chain {chain} ({chain_id}): re-index from block {} started (epoch {}, {}, {} history ranges replanned); the indexer role rebuilds it",
        done.from_block,
        done.epoch,
        if done.was_degraded {
            "degraded marker cleared"
        } else {
            "was not degraded"
        },
        done.ranges_cut
    );
    if wait_seconds == 0 {
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_seconds);
    loop {
        let health = keel_index::read::chain_health(&pool, chain_id).await?;
        if !health.is_rebuilding() {
            let tip = health.tip.map(|t| t.number);
            println!("chain {chain} ({chain_id}): rebuilt, indexed tip {tip:?}");
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "chain {chain}: still rebuilding after {wait_seconds} s (is an indexer role running?)"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
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
    // ERC-4337 (issue 20): user operations, when `aa.enabled`.
    let user_operations = keel::aa::api_service(config, pool, engine.clone(), &supervisor)
        .await
        .context("account abstraction")?;
    let ops = keel_workflows::Ops::new(pool.clone(), engine).with_events(events);
    let webhooks = keel_webhooks::Webhooks::new(pool.clone(), config.webhooks.to_config());
    // Platform Status reads each chain's head itself (issue 32 §7), independently of the
    // index's tip owner.
    let mut state =
        keel_api::ApiState::new(ops, ready).with_chain_heads(keel::services::upstreams(config)?);
    if let Some(service) = user_operations {
        state = state.with_user_operations(service);
    }
    let state = state
        .with_webhooks(webhooks)
        .with_config(keel_api::ApiConfig {
            max_body_bytes: config.api.body_limit_bytes,
            status: config.api.status.to_query(),
            ..keel_api::ApiConfig::default()
        });
    let state = match keel::services::custody_webhooks(config)? {
        Some(custody) => state.with_custody_webhooks(custody),
        None => state,
    };
    let listener = tokio::net::TcpListener::bind(&config.api.listen_address)
        .await
        .with_context(|| format!("binding api.listenAddress {}", config.api.listen_address))?;
    tracing::info!(target: "keel::api", address = %config.api.listen_address, "platform API listening");
    // Each request's span continues the caller's W3C trace context.
    let app = keel_api::router(state).layer(axum::middleware::from_fn(keel::traces::http_layer));
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

/// A bar of `stages` on stderr: drawn on a terminal, hidden otherwise (indicatif).
fn stage_bar(stages: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(stages);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
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
    // Stages on a terminal's stderr (hidden otherwise); stdout keeps its lines.
    let bar = stage_bar(if deploy_erc4337 { 4 } else { 3 });

    let entry_point = entry_point.unwrap_or(keel_abi::erc4337::ENTRY_POINT_V08);
    if deploy_erc4337 {
        bar.set_message("deploying EntryPoint v0.8 and SimpleAccountFactory");
        let root = workspace_root();
        let dir = keel_abi::erc4337::artifacts_dir(&root);
        let d = keel_abi::erc4337::deploy_v08(&provider, admin, &dir).await?;
        bar.suspend(|| {
            println!("erc4337  EntryPoint v0.8        {}", d.entry_point);
            println!(
                "erc4337  SimpleAccountFactory   {}",
                d.simple_account_factory
            );
        });
        bar.inc(1);
    }
    if provider.get_code_at(entry_point).await?.is_empty() {
        bail!(
            "no code at the EntryPoint {entry_point}; pass --deploy-erc4337 on a dev chain or --entry-point"
        );
    }

    bar.set_message("deploying the platform contracts");
    let mut deployment: PlatformDeployment = deploy_platform(&provider, admin, entry_point).await?;
    bar.inc(1);
    bar.set_message("deploying the SponsorPaymaster and funding its deposit");
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
    bar.inc(1);
    bar.set_message("recording the contracts and the index scope");
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
        bar.suspend(|| println!("deployed {:<20} {}", c.name, c.address));
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
    bar.finish_and_clear();
    for check in read_back(&provider, &deployment).await? {
        println!("check    {:<20} {}", check.name, check.observed);
    }
    grant_custody_roles(chain_name, chain, &provider, &deployment).await?;
    println!(
        "bootstrap of chain `{chain_name}` (chainId {}) complete: {} contracts recorded",
        deployment.chain_id,
        deployment.contracts.len()
    );
    Ok(())
}

/// Grants each custody vault of `chains.<chain>.custody.vaults` (issue 19) the platform
/// roles the asset workflows' writes need when a template sends from it, as the
/// operator key has them: `DEPLOYER_ROLE` on the AssetFactory (`createAsset`) and
/// `DEFAULT_ADMIN_ROLE` on the PriceResolver (`setStalenessBound`). Sent by the
/// deployer (the contracts' admin); a role already held is skipped.
async fn grant_custody_roles(
    chain_name: &str,
    chain: &keel::config::ChainConfig,
    provider: &alloy::providers::DynProvider,
    deployment: &PlatformDeployment,
) -> anyhow::Result<()> {
    use keel_abi::bindings::{AssetFactory, PriceResolver};
    use keel_abi::platform::names;
    let Some(custody) = &chain.custody else {
        return Ok(());
    };
    let factory = deployment
        .address(names::ASSET_FACTORY)
        .context("the deployment has no AssetFactory")?;
    let resolver = deployment
        .address(names::PRICE_RESOLVER)
        .context("the deployment has no PriceResolver")?;
    let factory = AssetFactory::new(factory, provider);
    let resolver = PriceResolver::new(resolver, provider);
    let deployer_role = factory.DEPLOYER_ROLE().call().await?;
    let admin_role = alloy::primitives::B256::ZERO;
    for (vault, settings) in &custody.vaults {
        let who = settings.address;
        if !factory.hasRole(deployer_role, who).call().await? {
            let receipt = factory
                .grantRole(deployer_role, who)
                .send()
                .await?
                .get_receipt()
                .await?;
            anyhow::ensure!(
                receipt.status(),
                "granting DEPLOYER_ROLE to vault `{vault}` reverted"
            );
        }
        if !resolver.hasRole(admin_role, who).call().await? {
            let receipt = resolver
                .grantRole(admin_role, who)
                .send()
                .await?
                .get_receipt()
                .await?;
            anyhow::ensure!(
                receipt.status(),
                "granting the PriceResolver's DEFAULT_ADMIN_ROLE to vault `{vault}` reverted"
            );
        }
        println!(
            "custody  vault {vault:<14} {who} holds DEPLOYER_ROLE (AssetFactory) and DEFAULT_ADMIN_ROLE (PriceResolver) on chain `{chain_name}`"
        );
    }
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

/// Runs an API-backed `keel ops` command; errors print `keel: CODE: detail` on
/// stderr with a non-zero exit.
fn api_ops(command: OpsCommand) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keel: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(api_ops_run(command)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("keel: {e}");
            std::process::ExitCode::from(keel::ops::WatchExit::Error.code())
        }
    }
}

fn client(api: &ApiArgs) -> Result<keel::ops::ApiClient, keel::ops::OpsError> {
    keel::ops::ApiClient::new(
        &api.api_url,
        &api.api_key,
        Duration::from_secs(api.request_timeout_seconds.max(1)),
    )
}

fn print_json(v: &serde_json::Value, pretty: bool) {
    let text = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    };
    println!("{}", text.unwrap_or_default());
}

/// The exit code of a finished command (0 unless `watch` says otherwise).
async fn api_ops_run(command: OpsCommand) -> Result<u8, keel::ops::OpsError> {
    use keel::ops::{Action, ListFilter, parse_operation};
    match command {
        OpsCommand::List {
            api,
            state,
            kind,
            asset,
            created_after,
            created_before,
            stuck,
            stuck_after_seconds,
            limit,
            cursor,
            json,
        } => {
            let client = client(&api)?;
            let filter = ListFilter {
                state,
                kind,
                asset_id: asset,
                created_after,
                created_before,
            };
            // `--stuck` filters here, so it walks the pages with a larger budget.
            let budget = if stuck {
                limit.saturating_mul(20)
            } else {
                limit
            };
            let (items, next) = client.list(&filter, cursor, budget.max(1)).await?;
            let now = chrono::Utc::now();
            let threshold = Duration::from_secs(stuck_after_seconds);
            let mut shown = Vec::new();
            for item in items {
                let op = parse_operation(&item)?;
                if stuck && !keel::ops::is_stuck(&op, now, threshold) {
                    continue;
                }
                if shown.len() < limit {
                    shown.push((item, op));
                }
            }
            if json {
                for (item, _) in &shown {
                    print_json(item, false);
                }
            } else {
                let ops: Vec<_> = shown.into_iter().map(|(_, op)| op).collect();
                print!("{}", keel::ops::table(&ops));
            }
            if let Some(c) = next {
                eprintln!("more operations follow: pass --cursor {c}");
            }
            Ok(0)
        }
        OpsCommand::Show { api, id, json } => {
            let v = client(&api)?.operation_json(&id).await?;
            if json {
                print_json(&v, true);
            } else {
                print!("{}", keel::ops::describe(&parse_operation(&v)?));
            }
            Ok(0)
        }
        OpsCommand::Retry { api, id } => act(&api, &id, Action::Retry).await,
        OpsCommand::Approve { api, id } => act(&api, &id, Action::Approve).await,
        OpsCommand::Reject { api, id } => act(&api, &id, Action::Reject).await,
        OpsCommand::Watch {
            api,
            id,
            interval_ms,
            timeout_seconds,
        } => {
            watch(
                &client(&api)?,
                &id,
                Duration::from_millis(interval_ms),
                timeout_seconds.map(Duration::from_secs),
            )
            .await
        }
        OpsCommand::Cancel { api, id } => act(&api, &id, Action::Cancel).await,
        OpsCommand::History { api, id } => {
            let entries = client(&api)?.history(&id).await?;
            print_json(&serde_json::Value::Array(entries), true);
            Ok(0)
        }
    }
}

async fn act(
    api: &ApiArgs,
    id: &str,
    action: keel::ops::Action,
) -> Result<u8, keel::ops::OpsError> {
    let v = client(api)?.act(id, action).await?;
    print_json(&v, true);
    Ok(0)
}

/// `keel ops watch`: polls the operation every `interval` and prints each change
/// ([`keel::ops::changes`]) until it ends. On a terminal stdout, a spinner (indicatif)
/// shows the current state, phase and elapsed time below the printed milestones;
/// otherwise plain lines only. Transient API errors are retried with backoff (up to
/// 10 s apart); any other error ends the watch with exit code 1.
async fn watch(
    client: &keel::ops::ApiClient,
    id: &str,
    interval: Duration,
    timeout: Option<Duration>,
) -> Result<u8, keel::ops::OpsError> {
    use keel::ops::{WatchExit, changes, parse_operation, state_name};
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let spinner = if tty {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        Some(pb)
    } else {
        None
    };
    let emit = |line: &str| match &spinner {
        Some(pb) => pb.println(line),
        None => println!("{line}"),
    };
    let started = tokio::time::Instant::now();
    let mut last: Option<keel_api::dto::Operation> = None;
    let mut backoff = interval;
    loop {
        match client.operation_json(id).await {
            Ok(v) => {
                backoff = interval;
                let op = parse_operation(&v)?;
                for line in changes(last.as_ref(), &op) {
                    emit(&line);
                }
                if let Some(pb) = &spinner {
                    let phase = op
                        .progress
                        .as_ref()
                        .and_then(|p| p.get("phase"))
                        .and_then(|p| p.as_str())
                        .map(|p| format!(" · {p}"))
                        .unwrap_or_default();
                    pb.set_message(format!("{} {}{phase}", op.kind, state_name(op.state)));
                }
                if let Some(exit) = WatchExit::of(op.state) {
                    if let Some(pb) = &spinner {
                        pb.finish_and_clear();
                    }
                    if let Some(e) = &op.error {
                        eprintln!("keel: operation {}: {}: {}", op.id, e.code, e.detail);
                    }
                    return Ok(exit.code());
                }
                last = Some(op);
            }
            Err(e) if e.is_transient() => {
                emit(&format!("(the API answered {}; retrying)", e.code()));
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                if let Some(pb) = &spinner {
                    pb.finish_and_clear();
                }
                return Err(e);
            }
        }
        if let Some(limit) = timeout
            && started.elapsed() >= limit
        {
            if let Some(pb) = &spinner {
                pb.finish_and_clear();
            }
            eprintln!(
                "keel: operation {id} has not ended after {} s",
                limit.as_secs()
            );
            return Ok(WatchExit::TimedOut.code());
        }
        tokio::time::sleep(backoff).await;
    }
}

/// Runs `keel <args>` with `env` to completion; its stdout (trimmed).
async fn keel_child(env: &[(String, String)], args: &[&str]) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let out = tokio::process::Command::new(exe)
        .args(args)
        .envs(env.iter().cloned())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running keel {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "keel {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Starts `keel run --role <role>` with `env`, its output lines printed on stderr with
/// the prefix `[<role>]`.
fn spawn_role(
    env: &[(String, String)],
    role: &'static str,
) -> anyhow::Result<tokio::process::Child> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let mut child = tokio::process::Command::new(exe)
        .args(["run", "--role", role, "--termination-grace-seconds", "5"])
        .envs(env.iter().cloned())
        .env("KEEL__CLUSTER__HOST", format!("dev-{role}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the {role} role"))?;
    let outputs: [Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>; 2] = [
        child.stdout.take().map(|o| Box::new(o) as _),
        child.stderr.take().map(|o| Box::new(o) as _),
    ];
    for out in outputs.into_iter().flatten() {
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[{role}] {line}");
            }
        });
    }
    Ok(child)
}

/// `keel dev`: see [`Command::Dev`].
async fn keel_dev(api_address: &str, anvil: Option<PathBuf>) -> anyhow::Result<()> {
    let db = keel_store::testing::TestDatabase::create().await.context(
        "creating a fresh database (is PostgreSQL running? DATABASE_URL names its admin connection, default postgres://postgres@127.0.0.1:5432/postgres)",
    )?;
    eprintln!("keel dev: database {} created and migrated", db.name());
    let anvil_path = anvil.unwrap_or_else(|| {
        workspace_root().join("tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil")
    });
    // Anvil's persisted older states go to a directory removed when `keel dev` ends
    // (its default, ~/.foundry/anvil/tmp, is never cleaned when the node is killed).
    let states = tempfile::Builder::new()
        .prefix("keel-dev-anvil-states-")
        .tempdir()
        .context("a directory for Anvil's persisted states")?;
    let node = alloy::node_bindings::Anvil::at(&anvil_path)
        .args([
            "--cache-path".to_owned(),
            states.path().display().to_string(),
        ])
        .try_spawn()
        .with_context(|| {
            format!(
                "starting Anvil at {} (run scripts/setup)",
                anvil_path.display()
            )
        })?;
    let key = node
        .keys()
        .first()
        .map(|k| format!("0x{}", alloy::hex::encode(k.to_bytes())))
        .context("Anvil has no dev account")?;
    let chain_id = node.chain_id();
    let rpc = node.endpoint();
    eprintln!("keel dev: Anvil chain {chain_id} at {rpc}");
    let env: Vec<(String, String)> = vec![
        ("KEEL__DATABASE__URL".into(), db.url().to_owned()),
        ("KEEL__CHAINS__LOCAL__CHAINID".into(), chain_id.to_string()),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS".into(),
            format!("[\"{rpc}\"]"),
        ),
        ("KEEL__API__LISTENADDRESS".into(), api_address.to_owned()),
        ("KEEL__TELEMETRY__METRICSADDRESS".into(), String::new()),
        ("KEEL__TELEMETRY__LOGFORMAT".into(), "human".into()),
        ("KEEL__DEPLOYMENTID".into(), "dev".into()),
        ("KEEL_OPERATOR_KEY".into(), key.clone()),
        ("KEEL_DEPLOYER_KEY".into(), key),
    ];
    keel_child(
        &env,
        &["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"],
    )
    .await?;
    keel_child(&env, &["org", "create", "--name", "dev"]).await?;
    let api_key = keel_child(
        &env,
        &["api-key", "create", "--org", "dev", "--label", "dev"],
    )
    .await?;
    keel_child(
        &env,
        &[
            "template", "set", "--org", "dev", "--id", "std", "--chain", "local",
        ],
    )
    .await?;
    let shutdown = keel::shutdown::on_signal();
    let mut children = Vec::new();
    for role in ["indexer", "runner", "api"] {
        children.push((role, spawn_role(&env, role)?));
    }
    let api = format!("http://{api_address}");
    let http = reqwest::Client::new();
    let ready = async {
        loop {
            if let Ok(r) = http.get(format!("{api}/readyz")).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let outcome = tokio::select! {
        () = ready => Ok(()),
        () = shutdown.cancelled() => Err(anyhow::anyhow!("stopped before the API was ready")),
        () = tokio::time::sleep(Duration::from_secs(120)) => Err(anyhow::anyhow!("the API did not become ready within 120 s")),
    };
    if outcome.is_ok() {
        println!("keel dev is ready (not for production)");
        println!("  API            {api}");
        println!("  API key        {api_key}");
        println!("  status page    {api}/status");
        println!("  OpenAPI        {api}/openapi.json");
        println!("  chain          {rpc} (chainId {chain_id}, chain `local`, template `std`)");
        println!("  database       {} (dropped on exit)", db.name());
        println!("  try            KEEL_API_KEY={api_key} keel ops list --api-url {api}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
    // Until a signal, or until a role exits.
    let failure = if outcome.is_ok() {
        let exited = futures_any_exit(&mut children);
        tokio::select! {
            () = shutdown.cancelled() => None,
            role = exited => Some(role),
        }
    } else {
        None
    };
    for (_, child) in &children {
        if let Some(pid) = child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
    }
    for (role, child) in &mut children {
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            eprintln!("keel dev: the {role} role did not stop within 10 s; killing it");
            let _ = child.kill().await;
        }
    }
    drop(node);
    drop(db);
    outcome?;
    if let Some(role) = failure {
        bail!("the {role} role exited");
    }
    eprintln!("keel dev: stopped; database dropped");
    Ok(())
}

/// Resolves with the role of the first child that exits.
async fn futures_any_exit(children: &mut [(&'static str, tokio::process::Child)]) -> &'static str {
    loop {
        for (role, child) in children.iter_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                return role;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
