//! keel-bootstrap against a real Anvil and a real PostgreSQL: a full bootstrap records
//! every contract and the index scope, funds the paymaster, grants custody vaults their
//! roles (idempotently), and refuses a wrong chain or a missing EntryPoint before
//! deploying anything.

use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use anvil_tests::TestChain;
use keel_abi::bindings::{AssetFactory, PriceResolver};
use keel_abi::platform::names;
use keel_bootstrap::{BootstrapError, BootstrapPlan, ChainTarget, Stage};
use keel_store::testing::TestDatabase;
use keel_txq::SignerHandle;
use keel_units::{ChainId, Wei};

fn target(chain: &TestChain) -> ChainTarget {
    ChainTarget {
        name: "local".to_owned(),
        chain_id: chain.chain_id(),
        rpc_urls: vec![chain.endpoint().to_string()],
    }
}

fn plan(erc4337: bool, vaults: Vec<(String, Address)>) -> BootstrapPlan {
    BootstrapPlan {
        erc4337_artifacts: erc4337
            .then(|| keel_abi::erc4337::artifacts_dir(&anvil_tests::workspace_root())),
        entry_point: None,
        sponsor_signer: None,
        paymaster_deposit: Wei::from_ether_str("1", keel_units::Rounding::Exact).unwrap(),
        custody_vaults: vaults,
    }
}

#[tokio::test]
async fn a_bootstrap_records_every_contract_and_its_scope_and_grants_custody_roles() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let deployer = SignerHandle::local(chain.signer(0).unwrap().clone());
    let vault = chain.account(5).unwrap();
    let mut stages = Vec::new();
    let done = keel_bootstrap::bootstrap(
        db.pool(),
        &target(&chain),
        deployer.clone(),
        &plan(true, vec![("treasury".to_owned(), vault)]),
        |s| stages.push(s),
    )
    .await
    .unwrap();
    assert_eq!(
        stages,
        [
            Stage::Erc4337,
            Stage::Platform,
            Stage::Paymaster,
            Stage::Record
        ]
    );
    let erc4337 = done.erc4337.unwrap();
    assert_eq!(erc4337.entry_point, keel_abi::erc4337::ENTRY_POINT_V08);
    assert_eq!(done.deployment.admin, deployer.address());
    let recorded_names: Vec<&str> = done.deployment.contracts.iter().map(|c| c.name).collect();
    for name in [
        names::DIRECTORY,
        names::PRICE_RESOLVER,
        names::PRICE_FEED_FACTORY,
        names::ASSET_FACTORY,
        names::ENTRY_POINT_REFERENCE,
        names::BATCH_PAY,
        names::SYSTEM_FACTORY,
        names::ENTRY_POINT,
        names::SPONSOR_PAYMASTER,
    ] {
        assert!(recorded_names.contains(&name), "{name} not deployed");
    }
    // Every contract is recorded as deployed, through keel-store.
    let id = i64::try_from(chain.chain_id()).unwrap();
    let rows = keel_store::platform::platform_contract_list(db.pool(), id)
        .await
        .unwrap();
    assert_eq!(rows.len(), done.deployment.contracts.len());
    for c in &done.deployment.contracts {
        let row = rows.iter().find(|r| r.name == c.name).unwrap();
        assert_eq!(row.address, c.address.to_vec(), "{}", c.name);
    }
    // The four indexed contracts are in the chain's index scope, through keel-index.
    let scope = keel_index::scope::live_scope(db.pool(), ChainId(chain.chain_id()))
        .await
        .unwrap();
    assert_eq!(scope.len(), 4, "{scope:?}");
    for entry in &scope {
        let c = done
            .deployment
            .contracts
            .iter()
            .find(|c| c.address == entry.address)
            .unwrap();
        assert_eq!(Some(entry.kind), keel_bootstrap::scope_kind(c.name));
    }
    // Every contract was read back.
    assert_eq!(done.checks.len(), done.deployment.contracts.len());
    // The paymaster's EntryPoint deposit holds the funded ether.
    let paymaster = done.deployment.address(names::SPONSOR_PAYMASTER).unwrap();
    let deposit = keel_abi::bindings::SponsorPaymaster::new(paymaster, chain.provider())
        .getDeposit()
        .call()
        .await
        .unwrap();
    assert_eq!(deposit, U256::from(10u64).pow(U256::from(18u64)));
    // The vault holds both roles.
    assert_eq!(done.custody.len(), 1);
    assert_eq!(done.custody[0].address, vault);
    assert_eq!(done.custody[0].granted, 2);
    let factory = AssetFactory::new(
        done.deployment.address(names::ASSET_FACTORY).unwrap(),
        chain.provider(),
    );
    let role = factory.DEPLOYER_ROLE().call().await.unwrap();
    assert!(factory.hasRole(role, vault).call().await.unwrap());
    let resolver = PriceResolver::new(
        done.deployment.address(names::PRICE_RESOLVER).unwrap(),
        chain.provider(),
    );
    assert!(resolver.hasRole(B256::ZERO, vault).call().await.unwrap());
    // Granting again sends nothing.
    let provider = keel_bootstrap::connect(&target(&chain), deployer.clone())
        .await
        .unwrap();
    let nonce = provider
        .get_transaction_count(deployer.address())
        .await
        .unwrap();
    let again = keel_bootstrap::grant_custody_roles(
        &provider,
        &done.deployment,
        &[("treasury".to_owned(), vault)],
    )
    .await
    .unwrap();
    assert_eq!(again[0].granted, 0);
    assert_eq!(
        provider
            .get_transaction_count(deployer.address())
            .await
            .unwrap(),
        nonce
    );
}

#[tokio::test]
async fn a_wrong_chain_or_a_missing_entry_point_deploys_and_records_nothing() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let deployer = SignerHandle::local(chain.signer(0).unwrap().clone());
    let provider = chain.provider();
    let nonce = provider
        .get_transaction_count(deployer.address())
        .await
        .unwrap();

    let mut wrong = target(&chain);
    wrong.chain_id = chain.chain_id() + 1;
    let e = keel_bootstrap::bootstrap(
        db.pool(),
        &wrong,
        deployer.clone(),
        &plan(true, Vec::new()),
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, BootstrapError::ChainIdMismatch { configured, reported, .. }
            if configured == chain.chain_id() + 1 && reported == chain.chain_id()),
        "{e}"
    );

    // A fresh chain without ERC-4337: the EntryPoint has no code.
    let mut stages = Vec::new();
    let e = keel_bootstrap::bootstrap(
        db.pool(),
        &target(&chain),
        deployer.clone(),
        &plan(false, Vec::new()),
        |s| stages.push(s),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, BootstrapError::NoEntryPoint(a) if a == keel_abi::erc4337::ENTRY_POINT_V08),
        "{e}"
    );
    assert!(stages.is_empty(), "{stages:?}");
    assert_eq!(
        provider
            .get_transaction_count(deployer.address())
            .await
            .unwrap(),
        nonce,
        "nothing was sent"
    );
    for id in [chain.chain_id(), chain.chain_id() + 1] {
        let rows =
            keel_store::platform::platform_contract_list(db.pool(), i64::try_from(id).unwrap())
                .await
                .unwrap();
        assert!(rows.is_empty(), "chain {id}: {rows:?}");
    }
}

/// `keel chain grant-roles` (issue 35 §4): a chain bootstrapped before its custody
/// vault was configured gets the vault's roles afterwards, from the recorded platform;
/// a second run sends nothing; a signer that is not the platform's admin grants
/// nothing; a chain with no recorded platform is refused before any call.
#[tokio::test]
async fn grant_roles_gives_a_later_vault_its_roles_on_the_recorded_platform() {
    let chain = TestChain::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let deployer = SignerHandle::local(chain.signer(0).unwrap().clone());
    let vault = chain.account(5).unwrap();
    let vaults = vec![("treasury".to_owned(), vault)];

    let err = keel_bootstrap::grant_roles(db.pool(), &target(&chain), deployer.clone(), &vaults)
        .await
        .unwrap_err();
    assert!(
        matches!(err, BootstrapError::NotBootstrapped { ref chain } if chain == "local"),
        "{err:?}"
    );

    let done = keel_bootstrap::bootstrap(
        db.pool(),
        &target(&chain),
        deployer.clone(),
        &plan(true, Vec::new()),
        |_| {},
    )
    .await
    .unwrap();
    assert!(done.custody.is_empty());
    let factory = AssetFactory::new(
        done.deployment.address(names::ASSET_FACTORY).unwrap(),
        chain.provider(),
    );
    let resolver = PriceResolver::new(
        done.deployment.address(names::PRICE_RESOLVER).unwrap(),
        chain.provider(),
    );
    let role = factory.DEPLOYER_ROLE().call().await.unwrap();
    assert!(!factory.hasRole(role, vault).call().await.unwrap());

    // Not the admin: refused, nothing granted.
    let stranger = SignerHandle::local(chain.signer(1).unwrap().clone());
    let err = keel_bootstrap::grant_roles(db.pool(), &target(&chain), stranger, &vaults)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BootstrapError::Grant { .. } | BootstrapError::GrantReverted { .. }
        ),
        "{err:?}"
    );
    assert!(!factory.hasRole(role, vault).call().await.unwrap());

    // The admin: both roles, from the recorded rows.
    let grants = keel_bootstrap::grant_roles(db.pool(), &target(&chain), deployer.clone(), &vaults)
        .await
        .unwrap();
    assert_eq!(grants.len(), 1);
    assert_eq!((grants[0].address, grants[0].granted), (vault, 2));
    assert!(factory.hasRole(role, vault).call().await.unwrap());
    assert!(resolver.hasRole(B256::ZERO, vault).call().await.unwrap());

    // Again: nothing sent.
    let nonce = chain
        .provider()
        .get_transaction_count(deployer.address())
        .await
        .unwrap();
    let again = keel_bootstrap::grant_roles(db.pool(), &target(&chain), deployer.clone(), &vaults)
        .await
        .unwrap();
    assert_eq!(again[0].granted, 0);
    assert_eq!(
        chain
            .provider()
            .get_transaction_count(deployer.address())
            .await
            .unwrap(),
        nonce
    );
}
