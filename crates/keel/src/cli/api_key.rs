//! `keel api-key create|list|revoke|rotate`: an organization's API keys.

use super::connect_migrated;
use anyhow::Context;
use clap::Subcommand;
use keel::config::Config;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub(super) enum ApiKeyCommand {
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

/// Runs a `keel api-key` command.
pub(super) async fn run(config: &Config, command: ApiKeyCommand) -> anyhow::Result<()> {
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
