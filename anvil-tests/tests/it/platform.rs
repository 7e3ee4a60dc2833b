//! `keel_abi::platform::{deploy_platform, read_back}` (what `scripts/demo` prints).

use alloy::primitives::address;
use anvil_tests::keel_abi::bindings::Directory;
use anvil_tests::keel_abi::platform::{deploy_platform, names, read_back};
use anvil_tests::keel_abi::{AbiError, directory_key, erc4337::ENTRY_POINT_V08};
use anvil_tests::{TestChain, confirm, deploy_keel};

#[tokio::test]
async fn read_back_succeeds_after_deploy_platform() -> anyhow::Result<()> {
    let chain = TestChain::builder().chain_id(4_242).start().await?;
    let d = deploy_keel(&chain).await?;
    assert_eq!(d.platform.chain_id, 4_242);
    assert_eq!(d.platform.admin, chain.account(0)?);
    let checks = read_back(chain.provider(), &d.platform).await?;
    let order: Vec<&str> = checks.iter().map(|c| c.name).collect();
    assert_eq!(
        order,
        [
            names::DIRECTORY,
            names::PRICE_RESOLVER,
            names::PRICE_FEED_FACTORY,
            names::ASSET_FACTORY,
            names::ENTRY_POINT_REFERENCE,
            names::BATCH_PAY,
            names::SYSTEM_FACTORY,
            names::ENTRY_POINT,
        ]
    );
    for c in &checks {
        assert_eq!(Some(c.address), d.platform.address(c.name));
        assert!(
            c.observed
                .starts_with(&format!("Directory.get({}) ok", c.name)),
            "{c:?}"
        );
    }
    assert!(
        checks[4].observed.contains(&ENTRY_POINT_V08.to_string()),
        "{:?}",
        checks[4]
    );
    Ok(())
}

#[tokio::test]
async fn read_back_detects_a_tampered_directory() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let admin = chain.account(0)?;
    let d = deploy_keel(&chain).await?;
    // A second platform on the same chain, sharing the EntryPoint, reads back fine too.
    let second = deploy_platform(chain.provider(), admin, d.entry_point).await?;
    assert_ne!(second.address(names::DIRECTORY), Some(d.directory));
    read_back(chain.provider(), &second).await?;

    // Point the Directory's assetFactory entry elsewhere: read_back names the mismatch.
    let dir = Directory::new(d.directory, chain.provider().clone());
    confirm(&dir.set(
        directory_key(names::ASSET_FACTORY),
        address!("0x000000000000000000000000000000000000bEEF"),
    ))
    .await?;
    let err = read_back(chain.provider(), &d.platform).await.unwrap_err();
    assert!(matches!(err, AbiError::Mismatch(_)), "{err:?}");
    Ok(())
}
