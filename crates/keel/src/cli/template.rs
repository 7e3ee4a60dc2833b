//! `keel template set`: the asset templates an organization's assets are created from.

use super::connect_migrated;
use anyhow::Context;
use clap::Subcommand;
use keel::config::Config;

#[derive(Subcommand, Debug)]
pub(super) enum TemplateCommand {
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
        /// Forced transfers (`asset.forced-transfer`) of the template's assets skip the
        /// compliance check of the receiver (default: they are checked like any transfer).
        #[arg(long)]
        forced_transfer_skips_compliance: bool,
        /// The most recipients of one `asset.batch-mint` or `asset.batch-transfer`
        /// (1..=500).
        #[arg(long, default_value_t = keel_workflows::tenancy::DEFAULT_BATCH_MAX_RECIPIENTS)]
        batch_max_recipients: u16,
    },
}

/// Runs a `keel template` command.
pub(super) async fn run(config: &Config, command: TemplateCommand) -> anyhow::Result<()> {
    match command {
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
            forced_transfer_skips_compliance,
            batch_max_recipients,
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
            let pool = connect_migrated(config).await?;
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
                forced_transfer_skips_compliance,
                batch_max_recipients,
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
    }
}
