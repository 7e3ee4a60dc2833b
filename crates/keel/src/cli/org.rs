//! `keel org create`: organizations (tenants of the Platform API).

use super::connect_migrated;
use clap::Subcommand;
use keel::config::Config;

#[derive(Subcommand, Debug)]
pub(super) enum OrgCommand {
    /// Create an organization; prints its id.
    Create {
        /// Unique name, 1 to 255 characters.
        #[arg(long)]
        name: String,
    },
}

/// Runs an `keel org` command.
pub(super) async fn run(config: &Config, command: OrgCommand) -> anyhow::Result<()> {
    match command {
        OrgCommand::Create { name } => {
            let pool = connect_migrated(config).await?;
            let id = keel_workflows::tenancy::create_organization(&pool, &name).await?;
            println!("{id}");
            Ok(())
        }
    }
}
