//! `AssetToken`: pause gating of mint/transfer/burn, and mint gated by a fresh price
//! (a staleness bound in the `PriceResolver` plus a recent observation in the feed).

use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use anvil_tests::keel_abi::bindings::AssetToken::{self, AssetTokenErrors};
use anvil_tests::keel_abi::bindings::PriceResolver;
use anvil_tests::{
    TestChain, confirm, deploy_asset_with_feed, deploy_keel, expect_call_revert, expect_revert,
    set_staleness_bound, submit_observation,
};

const BOUND_SECS: u64 = 3_600;
/// One US dollar in the feeds' 8 decimals.
const USD: i128 = 100_000_000;

fn price_not_fresh(feed: Address) -> AssetTokenErrors {
    AssetTokenErrors::PriceNotFresh(AssetToken::PriceNotFresh { feed })
}

fn enforced_pause() -> AssetTokenErrors {
    AssetTokenErrors::EnforcedPause(AssetToken::EnforcedPause {})
}

#[tokio::test]
async fn mint_needs_unpaused_token_a_staleness_bound_and_a_fresh_observation() -> anyhow::Result<()>
{
    let chain = TestChain::start().await?;
    let deployed = deploy_keel(&chain).await?;
    let asset = deploy_asset_with_feed(&chain, &deployed, "GOLD").await?;
    let p = chain.provider();
    let token = AssetToken::new(asset.token, p.clone());
    let resolver = PriceResolver::new(deployed.price_resolver, p.clone());
    let holder = chain.account(1)?;
    let amount = U256::from(1_234_567_890_u64);

    assert_eq!(token.priceFeed().call().await?, asset.feed);
    assert_eq!(token.priceResolver().call().await?, deployed.price_resolver);

    // 1. A new token is paused: mint refused with EnforcedPause (checked before the price).
    assert!(token.paused().call().await?);
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.mint(holder, amount)).await?,
        enforced_pause()
    );

    // 2. Unpaused, but no staleness bound and no observation: PriceNotFresh(feed).
    confirm(&token.unpause()).await?;
    assert!(!token.paused().call().await?);
    assert!(!resolver.isFresh(asset.feed).call().await?);
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.mint(holder, amount)).await?,
        price_not_fresh(asset.feed)
    );

    // 3. An observation alone is not enough: still no bound.
    submit_observation(p, asset.feed, 2_000 * USD).await?;
    assert!(!resolver.isFresh(asset.feed).call().await?);
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.mint(holder, amount)).await?,
        price_not_fresh(asset.feed)
    );

    // 4. Bound installed + observation within it: mint accepted, exact supply change.
    set_staleness_bound(p, deployed.price_resolver, asset.feed, BOUND_SECS).await?;
    assert_eq!(
        resolver.stalenessBound(asset.feed).call().await?,
        U256::from(BOUND_SECS)
    );
    assert!(resolver.isFresh(asset.feed).call().await?);
    let (bal0, sup0) = (
        token.balanceOf(holder).call().await?,
        token.totalSupply().call().await?,
    );
    let receipt = confirm(&token.mint(holder, amount)).await?;
    assert!(receipt.status());
    assert_eq!(token.balanceOf(holder).call().await? - bal0, amount);
    assert_eq!(token.totalSupply().call().await? - sup0, amount);
    assert_eq!(token.balanceOf(holder).call().await?, amount);

    // 5. Time moves past the bound: the observation is stale, mint refused again.
    chain.increase_time(BOUND_SECS + 1).await?;
    assert!(!resolver.isFresh(asset.feed).call().await?);
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.mint(holder, amount)).await?,
        price_not_fresh(asset.feed)
    );
    // The same refusal through eth_call.
    assert_eq!(
        expect_call_revert::<AssetTokenErrors, _, _>(&token.mint(holder, amount)).await?,
        price_not_fresh(asset.feed)
    );
    assert_eq!(
        token.totalSupply().call().await?,
        amount,
        "refused mints changed nothing"
    );

    // 6. A new observation makes it fresh again.
    submit_observation(p, asset.feed, 2_001 * USD).await?;
    confirm(&token.mint(holder, amount)).await?;
    assert_eq!(token.totalSupply().call().await?, amount * U256::from(2));
    Ok(())
}

#[tokio::test]
async fn staleness_bound_is_inclusive_to_the_second() -> anyhow::Result<()> {
    use alloy::providers::ext::AnvilApi;
    let chain = TestChain::start().await?;
    let deployed = deploy_keel(&chain).await?;
    let asset = deploy_asset_with_feed(&chain, &deployed, "SILVER").await?;
    let p = chain.provider();
    let resolver = PriceResolver::new(deployed.price_resolver, p.clone());
    set_staleness_bound(p, deployed.price_resolver, asset.feed, 100).await?;
    let receipt = submit_observation(p, asset.feed, 25 * USD).await?;
    let block = receipt
        .block_number
        .ok_or_else(|| anyhow::anyhow!("receipt without block"))?;
    let updated_at = p
        .get_block_by_number(block.into())
        .await?
        .ok_or_else(|| anyhow::anyhow!("no block {block}"))?
        .header
        .timestamp;

    // A block exactly `bound` seconds after the observation: still fresh (age == bound).
    p.anvil_set_next_block_timestamp(updated_at + 100).await?;
    chain.mine().await?;
    assert!(
        resolver
            .isFresh(asset.feed)
            .call()
            .block(alloy::eips::BlockId::latest())
            .await?
    );
    // One second later: stale.
    p.anvil_set_next_block_timestamp(updated_at + 101).await?;
    chain.mine().await?;
    assert!(
        !resolver
            .isFresh(asset.feed)
            .call()
            .block(alloy::eips::BlockId::latest())
            .await?
    );
    Ok(())
}

#[tokio::test]
async fn transfers_and_burns_are_refused_while_paused() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let deployed = deploy_keel(&chain).await?;
    let asset = deploy_asset_with_feed(&chain, &deployed, "OIL").await?;
    let p = chain.provider();
    let (holder, other) = (chain.account(1)?, chain.account(2)?);
    let token = AssetToken::new(asset.token, p.clone());
    let token_as_holder = AssetToken::new(asset.token, chain.provider_for(1)?);

    // Paused from deployment: even a zero-amount transfer is refused.
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.transfer(other, U256::ZERO)).await?,
        enforced_pause()
    );

    // Give the holder a balance.
    confirm(&token.unpause()).await?;
    set_staleness_bound(p, deployed.price_resolver, asset.feed, 3_600).await?;
    submit_observation(p, asset.feed, 80 * USD).await?;
    let amount = U256::from(1_000_u64);
    confirm(&token.mint(holder, amount)).await?;

    // Paused again: the holder's transfer and burn are refused, balances unchanged.
    confirm(&token.pause()).await?;
    let nonce = p.get_transaction_count(holder).await?;
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token_as_holder.transfer(other, U256::from(10)))
            .await?,
        enforced_pause()
    );
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token_as_holder.burn(U256::from(10))).await?,
        enforced_pause()
    );
    assert_eq!(
        p.get_transaction_count(holder).await?,
        nonce,
        "refused transactions were not mined"
    );
    assert_eq!(token.balanceOf(holder).call().await?, amount);
    assert_eq!(token.balanceOf(other).call().await?, U256::ZERO);

    // Unpaused: the same transfer goes through, so the pause was the only obstacle.
    confirm(&token.unpause()).await?;
    confirm(&token_as_holder.transfer(other, U256::from(10))).await?;
    assert_eq!(
        token.balanceOf(holder).call().await?,
        amount - U256::from(10)
    );
    assert_eq!(token.balanceOf(other).call().await?, U256::from(10));
    Ok(())
}

#[tokio::test]
async fn only_role_holders_mint_and_pause() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let deployed = deploy_keel(&chain).await?;
    let asset = deploy_asset_with_feed(&chain, &deployed, "WHEAT").await?;
    let stranger = chain.account(4)?;
    let token = AssetToken::new(asset.token, chain.provider().clone());
    let as_stranger = AssetToken::new(asset.token, chain.provider_for(4)?);
    let minter = token.MINTER_ROLE().call().await?;
    let pauser = token.PAUSER_ROLE().call().await?;
    assert_eq!(minter, alloy::primitives::keccak256("MINTER_ROLE"));
    assert_eq!(pauser, alloy::primitives::keccak256("PAUSER_ROLE"));

    // The role check comes before the pause check.
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&as_stranger.mint(stranger, U256::from(1))).await?,
        AssetTokenErrors::AccessControlUnauthorizedAccount(
            AssetToken::AccessControlUnauthorizedAccount {
                account: stranger,
                neededRole: minter,
            }
        )
    );
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&as_stranger.unpause()).await?,
        AssetTokenErrors::AccessControlUnauthorizedAccount(
            AssetToken::AccessControlUnauthorizedAccount {
                account: stranger,
                neededRole: pauser,
            }
        )
    );
    // Unpausing twice: ExpectedPause.
    confirm(&token.unpause()).await?;
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.unpause()).await?,
        AssetTokenErrors::ExpectedPause(AssetToken::ExpectedPause {})
    );
    Ok(())
}

/// `forcedBurn` burns a holder's tokens without its allowance, only for `BURNER_ROLE`
/// holders (nobody at deployment, not even the admin), only while unpaused, and never
/// more than the holder's balance; granting and revoking the role takes effect at once.
#[tokio::test]
async fn forced_burn_needs_the_burner_role_and_the_holders_balance() -> anyhow::Result<()> {
    use anvil_tests::events;
    let chain = TestChain::start().await?;
    let deployed = deploy_keel(&chain).await?;
    let asset = deploy_asset_with_feed(&chain, &deployed, "BOND").await?;
    let p = chain.provider();
    let admin = chain.account(0)?;
    let holder = chain.account(1)?;
    let token = AssetToken::new(asset.token, p.clone());
    let burner = token.BURNER_ROLE().call().await?;
    assert_eq!(burner, alloy::primitives::keccak256("BURNER_ROLE"));
    assert!(
        !token.hasRole(burner, admin).call().await?,
        "the admin does not get BURNER_ROLE at deployment"
    );
    assert!(
        token
            .hasRole(token.MINTER_ROLE().call().await?, admin)
            .call()
            .await?
    );
    assert!(
        token
            .hasRole(token.PAUSER_ROLE().call().await?, admin)
            .call()
            .await?
    );

    confirm(&token.unpause()).await?;
    set_staleness_bound(p, deployed.price_resolver, asset.feed, 3_600).await?;
    submit_observation(p, asset.feed, 100 * USD).await?;
    confirm(&token.mint(holder, U256::from(1_000))).await?;

    // Without the role: refused, before any balance check.
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.forcedBurn(holder, U256::from(10))).await?,
        AssetTokenErrors::AccessControlUnauthorizedAccount(
            AssetToken::AccessControlUnauthorizedAccount {
                account: admin,
                neededRole: burner,
            }
        )
    );

    // With it: the holder's balance and the supply drop by exactly the amount.
    confirm(&token.grantRole(burner, admin)).await?;
    let receipt = confirm(&token.forcedBurn(holder, U256::from(10))).await?;
    assert_eq!(token.balanceOf(holder).call().await?, U256::from(990));
    assert_eq!(token.totalSupply().call().await?, U256::from(990));
    let forced = events::<AssetToken::ForcedBurn>(&receipt, asset.token);
    assert_eq!(forced.len(), 1);
    assert_eq!(
        (forced[0].burner, forced[0].from, forced[0].amount),
        (admin, holder, U256::from(10))
    );
    let transfers = events::<AssetToken::Transfer>(&receipt, asset.token);
    assert_eq!(
        (transfers[0].from, transfers[0].to, transfers[0].value),
        (holder, Address::ZERO, U256::from(10))
    );

    // Above the balance: ERC20InsufficientBalance; while paused: EnforcedPause.
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.forcedBurn(holder, U256::from(991))).await?,
        AssetTokenErrors::ERC20InsufficientBalance(AssetToken::ERC20InsufficientBalance {
            sender: holder,
            balance: U256::from(990),
            needed: U256::from(991),
        })
    );
    confirm(&token.pause()).await?;
    assert_eq!(
        expect_revert::<AssetTokenErrors, _, _>(&token.forcedBurn(holder, U256::from(1))).await?,
        enforced_pause()
    );
    confirm(&token.unpause()).await?;

    // Revoked: refused again.
    confirm(&token.revokeRole(burner, admin)).await?;
    assert!(!token.hasRole(burner, admin).call().await?);
    assert!(matches!(
        expect_revert::<AssetTokenErrors, _, _>(&token.forcedBurn(holder, U256::from(1))).await?,
        AssetTokenErrors::AccessControlUnauthorizedAccount(_)
    ));
    assert_eq!(token.balanceOf(holder).call().await?, U256::from(990));
    Ok(())
}
