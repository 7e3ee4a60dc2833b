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
    /// chain's first RPC URL did not answer). Keys: `operator` (`[operator.signer]` or `operator.keyEnv`), with
    /// `aa.enabled` `sponsor`, and each chain's pool senders as `sender:<name>`
    /// (`[chains.<name>.senders.<name>]`, listed on their chain only). A key that is not configured prints `-` for kind and
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
    // (label, key, the chains it is listed on: None = every chain)
    let mut keys: Vec<(String, Option<keel_txq::SignerHandle>, Option<String>)> = Vec::new();
    let (operator, key) = config.operator.signer_config();
    keys.push(("operator".to_owned(), operator.build(key).await?, None));
    if config.aa.enabled {
        keys.push((
            "sponsor".to_owned(),
            keel::aa::sponsor_key(&config.aa).await?,
            None,
        ));
    }
    let pool = keel::signer::pool_senders(config).await?;
    let mut chains: Vec<_> = config.chains.iter().collect();
    chains.sort_by_key(|(name, _)| name.as_str());
    for (chain, c) in &chains {
        for sender in pool.get(&c.chain_id).into_iter().flatten() {
            keys.push((
                format!("sender:{}", sender.name),
                Some(sender.handle.clone()),
                Some((*chain).clone()),
            ));
        }
    }
    for (name, handle, only) in keys {
        let Some(handle) = handle else {
            println!("{name}\t-\t-\t-\t-\t-\t-");
            continue;
        };
        for (chain, c) in &chains {
            if only.as_ref().is_some_and(|o| o != *chain) {
                continue;
            }
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
