//! `Directory`: the platform names resolve, only the admin writes, removal works.

use alloy::primitives::{Address, B256, address};
use anvil_tests::keel_abi::bindings::Directory::{self, DirectoryErrors};
use anvil_tests::keel_abi::platform::names;
use anvil_tests::keel_abi::{directory_key, directory_name};
use anvil_tests::{TestChain, confirm, deploy_keel, events, expect_revert};

const ALL_NAMES: [&str; 8] = [
    names::DIRECTORY,
    names::PRICE_RESOLVER,
    names::PRICE_FEED_FACTORY,
    names::ASSET_FACTORY,
    names::ENTRY_POINT_REFERENCE,
    names::BATCH_PAY,
    names::SYSTEM_FACTORY,
    names::ENTRY_POINT,
];

#[tokio::test]
async fn every_platform_name_resolves_to_its_deployed_address() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let d = deploy_keel(&chain).await?;
    let dir = Directory::new(d.directory, chain.provider().clone());
    let expected: [(&str, Address); 6] = [
        (names::DIRECTORY, d.directory),
        (names::PRICE_RESOLVER, d.price_resolver),
        (names::PRICE_FEED_FACTORY, d.price_feed_factory),
        (names::ASSET_FACTORY, d.asset_factory),
        (names::ENTRY_POINT_REFERENCE, d.entry_point_reference),
        (names::ENTRY_POINT, d.entry_point),
    ];
    for (name, address) in expected {
        assert_ne!(address, Address::ZERO, "{name}");
        assert_eq!(
            dir.get(directory_key(name)).call().await?,
            address,
            "{name}"
        );
    }
    // Solidity's bytes32("entryPoint") is the left-aligned ASCII.
    assert_eq!(
        dir.get(B256::right_padding_from(b"entryPoint"))
            .call()
            .await?,
        d.entry_point
    );
    let mut listed: Vec<String> = dir
        .names()
        .call()
        .await?
        .into_iter()
        .map(|k| directory_name(k).unwrap_or_default())
        .collect();
    listed.sort();
    let mut all: Vec<String> = ALL_NAMES.iter().map(|s| (*s).to_owned()).collect();
    all.sort();
    assert_eq!(listed, all);
    assert_eq!(
        dir.get(directory_key("noSuchName")).call().await?,
        Address::ZERO
    );
    Ok(())
}

#[tokio::test]
async fn only_the_admin_sets_and_removes_and_removal_clears_the_entry() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let d = deploy_keel(&chain).await?;
    let dir = Directory::new(d.directory, chain.provider().clone());
    let stranger = chain.account(1)?;
    let as_stranger = Directory::new(d.directory, chain.provider_for(1)?);
    let key = directory_key(names::ASSET_FACTORY);
    let admin_role = dir.DEFAULT_ADMIN_ROLE().call().await?;
    assert_eq!(admin_role, B256::ZERO);
    let unauthorized = DirectoryErrors::AccessControlUnauthorizedAccount(
        Directory::AccessControlUnauthorizedAccount {
            account: stranger,
            neededRole: admin_role,
        },
    );

    // Non-admin writes are refused and change nothing.
    let elsewhere = address!("0x00000000000000000000000000000000DeaDBeef");
    assert_eq!(
        expect_revert::<DirectoryErrors, _, _>(&as_stranger.set(key, elsewhere)).await?,
        unauthorized
    );
    assert_eq!(
        expect_revert::<DirectoryErrors, _, _>(
            &as_stranger.set(directory_key("brandNew"), elsewhere)
        )
        .await?,
        unauthorized
    );
    assert_eq!(
        expect_revert::<DirectoryErrors, _, _>(&as_stranger.remove(key)).await?,
        unauthorized
    );
    assert_eq!(dir.get(key).call().await?, d.asset_factory);

    // The admin's own input checks.
    assert_eq!(
        expect_revert::<DirectoryErrors, _, _>(&dir.set(B256::ZERO, elsewhere)).await?,
        DirectoryErrors::ZeroName(Directory::ZeroName {})
    );
    assert_eq!(
        expect_revert::<DirectoryErrors, _, _>(&dir.set(key, Address::ZERO)).await?,
        DirectoryErrors::ZeroAddress(Directory::ZeroAddress {})
    );

    // The admin sets: EntryChanged(previous, current).
    let receipt = confirm(&dir.set(directory_key("brandNew"), elsewhere)).await?;
    let changed = events::<Directory::EntryChanged>(&receipt, d.directory);
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].name, directory_key("brandNew"));
    assert_eq!(changed[0].previous, Address::ZERO);
    assert_eq!(changed[0].current, elsewhere);
    assert_eq!(dir.get(directory_key("brandNew")).call().await?, elsewhere);

    // The admin removes: EntryRemoved(name, previous), then get() is zero and the name
    // is no longer listed; removing again is UnknownName.
    let receipt = confirm(&dir.remove(key)).await?;
    let removed = events::<Directory::EntryRemoved>(&receipt, d.directory);
    assert_eq!(removed.len(), 1, "one EntryRemoved: {removed:?}");
    assert_eq!(removed[0].name, key);
    assert_eq!(removed[0].previous, d.asset_factory);
    assert_eq!(dir.get(key).call().await?, Address::ZERO);
    let listed = dir.names().call().await?;
    assert!(!listed.contains(&key));
    assert_eq!(
        listed.len(),
        ALL_NAMES.len(),
        "the platform names, brandNew removed"
    );
    assert_eq!(
        expect_revert::<DirectoryErrors, _, _>(&dir.remove(key)).await?,
        DirectoryErrors::UnknownName(Directory::UnknownName { name: key })
    );
    Ok(())
}
