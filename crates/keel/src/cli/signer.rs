//! `keel signer list`: the signing keys this configuration names, each built as a role
//! builds it (so a key that cannot be used fails here the same way), with its kind, its
//! address and its native balance on every configured chain.

use alloy::providers::{Provider, ProviderBuilder};
use clap::Subcommand;
use keel::config::Config;

#[derive(Subcommand, Debug)]
pub(super) enum SignerCommand {
    /// One line per key and chain, tab-separated: `key  kind  address  chain  chainId
    /// balanceWei  nextNonce` (`nextNonce`: the node's `pending` transaction count, the
    /// nonce the account's next transaction takes; both are `unreachable` when the
    /// chain's first RPC URL did not answer). Keys: `operator` (`[operator.signer]` or `operator.keyEnv`) and, with
    /// `aa.enabled`, `sponsor`. A key that is not configured prints `-` for kind and
    /// address. Exits non-zero when a configured key cannot be used (the reason names
    /// the configuration key, never key material).
    List,
}

/// Runs a `keel signer` command.
pub(super) async fn run(config: &Config, command: SignerCommand) -> anyhow::Result<()> {
    match command {
        SignerCommand::List => list(config).await,
    }
}

async fn list(config: &Config) -> anyhow::Result<()> {
    let mut keys = Vec::new();
    let (operator, key) = config.operator.signer_config();
    keys.push(("operator", operator.build(key).await?));
    if config.aa.enabled {
        keys.push(("sponsor", keel::aa::sponsor_key(&config.aa).await?));
    }
    let mut chains: Vec<_> = config.chains.iter().collect();
    chains.sort_by_key(|(name, _)| name.as_str());
    for (name, handle) in keys {
        let Some(handle) = handle else {
            println!("{name}\t-\t-\t-\t-\t-\t-");
            continue;
        };
        for (chain, c) in &chains {
            let unreachable = || "unreachable".to_owned();
            let (balance, nonce) = match c.rpc_urls.first().and_then(|u| u.parse().ok()) {
                Some(url) => {
                    let provider = ProviderBuilder::new().connect_http(url);
                    let balance = provider.get_balance(handle.address()).await;
                    let nonce = provider
                        .get_transaction_count(handle.address())
                        .pending()
                        .await;
                    (
                        balance.map_or_else(|_| unreachable(), |b| b.to_string()),
                        nonce.map_or_else(|_| unreachable(), |n| n.to_string()),
                    )
                }
                None => (unreachable(), unreachable()),
            };
            println!(
                "{name}\t{}\t{}\t{chain}\t{}\t{balance}\t{nonce}",
                handle.kind(),
                handle.address(),
                c.chain_id
            );
        }
    }
    Ok(())
}
