//! `keel chain bootstrap`: makes a configured chain ready for Keel through
//! [`keel_bootstrap`] (deployments, platform contract rows, index scope, custody role
//! grants), with stages on a terminal's stderr and one line per result on stdout.
//! `keel chain grant-roles`: the custody role grants alone, on a chain bootstrapped
//! earlier.

use alloy::primitives::Address;
use anyhow::{Context, bail};
use clap::Subcommand;
use keel::config::Config;
use keel_bootstrap::{BootstrapError, BootstrapPlan, ChainTarget, Stage};

#[derive(Subcommand, Debug)]
pub(super) enum ChainCommand {
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
        /// Sign the bootstrap with the configured operator key instead (`[operator.signer]`
        /// or `operator.keyEnv`, of any signer kind: a keystore, an AWS KMS key); then
        /// `--key-env` is not read. The operator is the deployer and holds every role.
        #[arg(long)]
        deployer_is_operator: bool,
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
    /// Grant every custody vault (`chains.<name>.custody.vaults`) and every pool sender
    /// (`chains.<name>.senders`) configured for the chain the platform roles its writes need
    /// (`DEPLOYER_ROLE` on the AssetFactory, `DEFAULT_ADMIN_ROLE` on the PriceResolver)
    /// on the platform an earlier `keel chain bootstrap` recorded; signed by the
    /// platform's admin (the bootstrap's deployer). A role already held is skipped: a
    /// second run sends nothing. Prints one `custody` line per vault and one `sender`
    /// line per pool sender.
    GrantRoles {
        /// The chain's name in the configuration (`[chains.<name>]`).
        #[arg(long)]
        chain: String,
        /// Name of the environment variable that holds the admin's private key (hex).
        #[arg(long, default_value = "KEEL_DEPLOYER_KEY")]
        key_env: String,
        /// Sign with the configured operator key instead (any signer kind).
        #[arg(long)]
        deployer_is_operator: bool,
    },
}

/// The deployer (the platform's admin) key, through the same signer configuration as
/// every key: the operator's (`--deployer-is-operator`) or a hex key in `key_env`.
async fn deployer_key(
    config: &Config,
    key_env: &str,
    deployer_is_operator: bool,
) -> anyhow::Result<keel_txq::SignerHandle> {
    if deployer_is_operator {
        let (signer, key) = config.operator.signer_config();
        signer
            .build(key)
            .await?
            .with_context(|| format!("no operator key is configured (`{key}`)"))
    } else {
        keel::signer::SignerConfig::Env {
            var: key_env.to_owned(),
        }
        .build("--key-env")
        .await?
        .with_context(|| format!("environment variable {key_env} is not set"))
    }
}

/// The configured chain `name` as a bootstrap target.
fn target(config: &Config, name: &str) -> anyhow::Result<ChainTarget> {
    let chain = config
        .chains
        .get(name)
        .with_context(|| format!("no chain named `{name}` in the configuration (chains.*)"))?;
    Ok(ChainTarget {
        name: name.to_owned(),
        chain_id: chain.chain_id,
        rpc_urls: chain.rpc_urls.clone(),
    })
}

/// The senders of chain `name` besides the platform's admin that need the platform
/// roles: its custody vaults (`chains.<name>.custody.vaults`, labelled `vault:<name>`)
/// and its signer pool's senders (`chains.<name>.senders`, labelled `sender:<name>`;
/// their keys are built to learn their addresses).
async fn role_holders(config: &Config, name: &str) -> anyhow::Result<Vec<(String, Address)>> {
    let Some(chain) = config.chains.get(name) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<(String, Address)> = chain
        .custody
        .iter()
        .flat_map(|c| c.vaults.iter())
        .map(|(vault, v)| (format!("vault:{vault}"), v.address))
        .collect();
    for (sender, signer) in &chain.senders {
        let key = format!("chains.{name}.senders.{sender}");
        let handle = signer
            .build(&key)
            .await?
            .with_context(|| format!("the key of `{key}` is not configured"))?;
        out.push((format!("sender:{sender}"), handle.address()));
    }
    Ok(out)
}

fn print_grant(grant: &keel_bootstrap::CustodyGrant, chain: &str) {
    let (what, name) = grant
        .vault
        .split_once(':')
        .unwrap_or(("vault", grant.vault.as_str()));
    let line = if what == "sender" {
        "sender "
    } else {
        "custody"
    };
    println!(
        "{line}  {what} {name:<14} {} holds DEPLOYER_ROLE (AssetFactory) and DEFAULT_ADMIN_ROLE (PriceResolver) on chain `{chain}` ({} granted now)",
        grant.address, grant.granted
    );
}

/// Runs a `keel chain` command.
pub(super) async fn run(config: &Config, command: ChainCommand) -> anyhow::Result<()> {
    match command {
        ChainCommand::Bootstrap {
            chain,
            key_env,
            deployer_is_operator,
            deploy_erc4337,
            entry_point,
            sponsor_signer,
            paymaster_deposit_ether,
        } => {
            let deposit = keel_units::Wei::from_ether_str(
                &paymaster_deposit_ether,
                keel_units::Rounding::Exact,
            )
            .context("--paymaster-deposit-ether is not a decimal amount of ether")?;
            let target = target(config, &chain)?;
            let deployer = deployer_key(config, &key_env, deployer_is_operator).await?;
            let plan = BootstrapPlan {
                erc4337_artifacts: deploy_erc4337
                    .then(|| keel_abi::erc4337::artifacts_dir(&super::workspace_root())),
                entry_point,
                sponsor_signer,
                paymaster_deposit: deposit,
                custody_vaults: role_holders(config, &chain).await?,
            };
            let pool = super::connect_migrated(config).await?;
            bootstrap(&pool, &target, deployer, &plan).await
        }
        ChainCommand::GrantRoles {
            chain,
            key_env,
            deployer_is_operator,
        } => {
            let target = target(config, &chain)?;
            let vaults = role_holders(config, &chain).await?;
            if vaults.is_empty() {
                bail!(
                    "chain `{chain}` has no custody vaults (chains.{chain}.custody.vaults) and no pool senders (chains.{chain}.senders) configured"
                );
            }
            let admin = deployer_key(config, &key_env, deployer_is_operator).await?;
            let pool = super::connect_migrated(config).await?;
            let grants = keel_bootstrap::grant_roles(&pool, &target, admin, &vaults).await?;
            for grant in &grants {
                print_grant(grant, &chain);
            }
            Ok(())
        }
    }
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

/// Bootstraps `target` and prints what was deployed, recorded, read back and granted.
async fn bootstrap(
    pool: &sqlx::PgPool,
    target: &ChainTarget,
    deployer: keel_txq::SignerHandle,
    plan: &BootstrapPlan,
) -> anyhow::Result<()> {
    // Stages on a terminal's stderr (hidden otherwise); stdout keeps its lines.
    let bar = stage_bar(Stage::count(plan));
    let mut started = false;
    let outcome = keel_bootstrap::bootstrap(pool, target, deployer, plan, |stage| {
        if started {
            bar.inc(1);
        }
        started = true;
        bar.set_message(stage.message());
    })
    .await;
    bar.finish_and_clear();
    let done = match outcome {
        Ok(done) => done,
        Err(BootstrapError::NoEntryPoint(entry_point)) => bail!(
            "no code at the EntryPoint {entry_point}; pass --deploy-erc4337 on a dev chain or --entry-point"
        ),
        Err(e) => return Err(e.into()),
    };
    if let Some(d) = &done.erc4337 {
        println!("erc4337  EntryPoint v0.8        {}", d.entry_point);
        println!(
            "erc4337  SimpleAccountFactory   {}",
            d.simple_account_factory
        );
    }
    for c in &done.deployment.contracts {
        println!("deployed {:<20} {}", c.name, c.address);
    }
    for check in &done.checks {
        println!("check    {:<20} {}", check.name, check.observed);
    }
    for grant in &done.custody {
        print_grant(grant, &target.name);
    }
    println!(
        "bootstrap of chain `{}` (chainId {}) complete: {} contracts recorded",
        target.name,
        done.deployment.chain_id,
        done.deployment.contracts.len()
    );
    Ok(())
}
