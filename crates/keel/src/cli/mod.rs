//! The `keel` command line: one module per subcommand, each with its arguments and what
//! it runs (anchor: rundler's `bin/rundler/src/cli/`). This module parses, loads the
//! configuration, starts logging, trace export and the runtime, and dispatches.
//!
//! | command | module |
//! |---|---|
//! | `keel migrate` | [`migrate`] |
//! | `keel config print` | [`config`] |
//! | `keel run --role …` | [`run`] |
//! | `keel chain bootstrap` | [`chain`] (the work is `keel-bootstrap`'s) |
//! | `keel index reindex` | [`index`] |
//! | `keel org create` | [`org`] |
//! | `keel api-key …` | [`api_key`] |
//! | `keel template set` | [`template`] |
//! | `keel dev` | [`dev`] |
//! | `keel chaos` | [`chaos`] (a multi-replica scale and fault run; not a production role) |
//! | `keel ops …` | [`ops`] (through the Platform API) |

use anyhow::Context;
use clap::{Parser, Subcommand};
use keel::config::{Config, Role};
use keel::telemetry;
use std::path::PathBuf;
use std::time::Duration;

mod api_key;
mod chain;
mod chaos;
mod config;
mod dev;
mod index;
mod migrate;
mod ops;
mod org;
mod run;
mod signer;
mod template;

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
        command: config::ConfigCommand,
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
        command: chain::ChainCommand,
    },
    /// Signing key commands: which keys this configuration names, their kind, address
    /// and balance per chain.
    Signer {
        #[command(subcommand)]
        command: signer::SignerCommand,
    },
    /// Ledger Index operator commands.
    Index {
        #[command(subcommand)]
        command: index::IndexCommand,
    },
    /// Organization commands (tenants of the Platform API).
    Org {
        #[command(subcommand)]
        command: org::OrgCommand,
    },
    /// API key commands.
    ApiKey {
        #[command(subcommand)]
        command: api_key::ApiKeyCommand,
    },
    /// Asset template commands (the server-side settings assets are created from).
    Template {
        #[command(subcommand)]
        command: template::TemplateCommand,
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
    /// A multi-replica scale and chaos run (not a production role): a fresh database on
    /// the running PostgreSQL (`DATABASE_URL`), an Anvil chain behind a fault-injecting
    /// RPC proxy, N api, M runner and K indexer processes, a workload through the API
    /// (asset creations, mints, transfers, approvals, webhooks to a local receiver, one
    /// noisy integrator), and a fault schedule (kill -9 of a random replica, PostgreSQL
    /// restarts, reorgs of depth 1-5, RPC faults). Prints the invariants it checks at the
    /// end, throughput, latencies and resource use; exits 1 when an invariant failed.
    Chaos(chaos::ChaosArgs),
    /// Operator commands on operations: through a running Platform API (`cancel`:
    /// through the database, any organization).
    Ops {
        #[command(subcommand)]
        command: ops::OpsCommand,
    },
}

/// Parses the command line and runs the command; the process exit code.
pub(crate) fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The API-backed operator commands need no configuration beyond their arguments,
    // and report the API's code themselves.
    let cli = match cli.command {
        Command::Ops { command } => return ops::run(command),
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
        command: config::ConfigCommand::Print,
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
        Command::Migrate => migrate::run(&config).await,
        Command::Run {
            role,
            termination_grace_seconds,
        } => run::run(config, role, Duration::from_secs(termination_grace_seconds)).await,
        Command::Chain { command } => chain::run(&config, command).await,
        Command::Signer { command } => signer::run(&config, command).await,
        // Printed by main() before the runtime starts.
        Command::Config { .. } => Ok(()),
        Command::Index { command } => index::run(&config, command).await,
        Command::Org { command } => org::run(&config, command).await,
        Command::ApiKey { command } => api_key::run(&config, command).await,
        Command::Template { command } => template::run(&config, command).await,
        // main() runs every operator command through the Platform API before any
        // configuration is loaded.
        Command::Ops { .. } => anyhow::bail!("operator commands run through the Platform API"),
        Command::Dev { api_address, anvil } => dev::run(&api_address, anvil).await,
        Command::Chaos(args) => chaos::run(args).await,
    }
}

/// Connects to the configured database and applies pending migrations.
pub(super) async fn connect_migrated(config: &Config) -> anyhow::Result<sqlx::PgPool> {
    let pool = keel_store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    keel_store::migrate(&pool)
        .await
        .context("applying migrations")?;
    Ok(pool)
}

/// The source tree when running from it (for the npm artifacts), else the current dir.
pub(super) fn workspace_root() -> PathBuf {
    let compiled = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if compiled.join("tools").is_dir() {
        compiled
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
    }
}
