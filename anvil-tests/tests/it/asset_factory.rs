//! `AssetFactory`: one CREATE2 deployment per asset id, at the predicted address.

use alloy::primitives::{Address, B256, keccak256};
use alloy::providers::Provider;
use alloy::rpc::types::Filter;
use alloy::sol_types::{SolEvent, SolValue};
use anvil_tests::keel_abi::bindings::AssetFactory::{self, AssetFactoryErrors};
use anvil_tests::keel_abi::bindings::AssetToken;
use anvil_tests::{
    AssetSpec, TestChain, create_asset, create_feed, deploy_keel, expect_call_revert, expect_revert,
};

/// The CREATE2 address computed independently of the contract: salt
/// `keccak256(abi.encode(assetId))`, init code = AssetToken creation code ‖
/// `abi.encode(assetId, name, symbol, decimals, tokenAdmin, priceResolver, priceFeed)`.
fn local_create2_address(factory: Address, resolver: Address, spec: &AssetSpec) -> Address {
    let salt = keccak256(spec.asset_id.abi_encode());
    let args = (
        spec.asset_id,
        spec.name.clone(),
        spec.symbol.clone(),
        // uint8 is ABI-encoded as one 32-byte word, like a uint256 of the same value
        // (u8 has no SolValue impl: it would clash with `bytes`).
        alloy::primitives::U256::from(spec.decimals),
        spec.token_admin,
        resolver,
        spec.price_feed,
    )
        .abi_encode_params();
    let mut init = AssetToken::BYTECODE.to_vec();
    init.extend_from_slice(&args);
    factory.create2_from_code(salt, init)
}

#[tokio::test]
async fn second_create_asset_for_the_same_id_is_refused() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let d = deploy_keel(&chain).await?;
    let p = chain.provider();
    let admin = chain.account(0)?;
    let factory = AssetFactory::new(d.asset_factory, p.clone());
    let feed = create_feed(p, d.price_feed_factory, 8, "XAU / USD", admin, admin).await?;
    let spec = AssetSpec {
        asset_id: B256::right_padding_from(b"keel:asset:xau"),
        name: "Keel Gold".into(),
        symbol: "KXAU".into(),
        decimals: 6,
        token_admin: admin,
        price_feed: feed,
    };

    // The address is known in advance, by the contract and independently.
    let predicted = spec.predict(&factory).await?;
    assert_eq!(
        predicted,
        local_create2_address(d.asset_factory, d.price_resolver, &spec)
    );
    assert!(p.get_code_at(predicted).await?.is_empty());

    let (first, receipt) = create_asset(p, d.asset_factory, &spec).await?;
    assert_eq!(first, predicted, "deployed where predictAddress said");
    assert!(!p.get_code_at(first).await?.is_empty());
    assert_eq!(factory.tokenOf(spec.asset_id).call().await?, first);
    let first_block = receipt
        .block_number
        .ok_or_else(|| anyhow::anyhow!("no block"))?;

    // The token is wired as asked.
    let token = AssetToken::new(first, p.clone());
    assert_eq!(token.assetId().call().await?, spec.asset_id);
    assert_eq!(token.decimals().call().await?, 6);
    assert_eq!(token.symbol().call().await?, "KXAU");
    assert_eq!(token.priceFeed().call().await?, feed);
    assert_eq!(token.priceResolver().call().await?, d.price_resolver);

    // Same id again (same arguments, then different ones): AssetAlreadyDeployed(id, first).
    let expected = AssetFactoryErrors::AssetAlreadyDeployed(AssetFactory::AssetAlreadyDeployed {
        assetId: spec.asset_id,
        token: first,
    });
    let nonce = p.get_transaction_count(admin).await?;
    assert_eq!(
        expect_revert::<AssetFactoryErrors, _, _>(&spec.create_call(&factory)).await?,
        expected
    );
    let renamed = AssetSpec {
        name: "Other".into(),
        symbol: "OTH".into(),
        decimals: 18,
        ..spec.clone()
    };
    assert_ne!(
        renamed.predict(&factory).await?,
        first,
        "other arguments, other CREATE2 address"
    );
    let err = expect_revert::<AssetFactoryErrors, _, _>(&renamed.create_call(&factory)).await?;
    match &err {
        AssetFactoryErrors::AssetAlreadyDeployed(e) => {
            assert_eq!(e.assetId, spec.asset_id);
            assert_eq!(e.token, first);
        }
        other => panic!("expected AssetAlreadyDeployed, got {other:?}"),
    }
    assert_eq!(
        expect_call_revert::<AssetFactoryErrors, _, _>(&spec.create_call(&factory)).await?,
        expected
    );
    assert_eq!(
        p.get_transaction_count(admin).await?,
        nonce,
        "the refused creations were not mined"
    );

    // State after the refusals: still the first token, one id, one AssetCreated event.
    assert_eq!(factory.tokenOf(spec.asset_id).call().await?, first);
    assert_eq!(factory.assetIds().call().await?, vec![spec.asset_id]);
    let created = Filter::new()
        .address(d.asset_factory)
        .event_signature(AssetFactory::AssetCreated::SIGNATURE_HASH)
        .topic1(spec.asset_id)
        .from_block(0)
        .to_block(chain.block_number().await?);
    let logs = p.get_logs(&created).await?;
    assert_eq!(
        logs.len(),
        1,
        "exactly one AssetCreated for the id: {logs:?}"
    );
    let event = logs[0].log_decode::<AssetFactory::AssetCreated>()?;
    assert_eq!(event.inner.data.token, first);
    assert_eq!(event.inner.data.symbol, "KXAU");
    assert_eq!(event.inner.data.decimals, 6);
    assert_eq!(logs[0].block_number, Some(first_block));

    // Another id deploys fine, at its own address.
    let silver = AssetSpec {
        asset_id: B256::right_padding_from(b"keel:asset:xag"),
        ..spec.clone()
    };
    let (second, _) = create_asset(p, d.asset_factory, &silver).await?;
    assert_ne!(second, first);
    assert_eq!(
        second,
        local_create2_address(d.asset_factory, d.price_resolver, &silver)
    );
    assert_eq!(
        factory.assetIds().call().await?,
        vec![spec.asset_id, silver.asset_id]
    );
    Ok(())
}

#[tokio::test]
async fn create_asset_needs_the_deployer_role() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let d = deploy_keel(&chain).await?;
    let stranger = chain.account(3)?;
    let feed = create_feed(
        chain.provider(),
        d.price_feed_factory,
        8,
        "X / USD",
        stranger,
        stranger,
    )
    .await?;
    let as_stranger = AssetFactory::new(d.asset_factory, chain.provider_for(3)?);
    let spec = AssetSpec {
        asset_id: B256::repeat_byte(7),
        name: "X".into(),
        symbol: "X".into(),
        decimals: 18,
        token_admin: stranger,
        price_feed: feed,
    };
    let role = as_stranger.DEPLOYER_ROLE().call().await?;
    assert_eq!(role, keccak256("DEPLOYER_ROLE"));
    assert_eq!(
        expect_revert::<AssetFactoryErrors, _, _>(&spec.create_call(&as_stranger)).await?,
        AssetFactoryErrors::AccessControlUnauthorizedAccount(
            AssetFactory::AccessControlUnauthorizedAccount {
                account: stranger,
                neededRole: role,
            }
        )
    );
    assert_eq!(
        as_stranger.tokenOf(spec.asset_id).call().await?,
        Address::ZERO
    );
    Ok(())
}
