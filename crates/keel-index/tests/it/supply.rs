//! `token_supply`: mints minus burns of the indexed transfers, equal to the chain's
//! `totalSupply` once the index has caught up.

use crate::common::{catch_up, config, env};
use alloy::primitives::U256;
use anvil_tests::confirm;
use anvil_tests::keel_abi::bindings::AssetToken;

#[tokio::test]
async fn token_supply_is_mints_minus_burns() -> anyhow::Result<()> {
    let env = env().await?;
    let gold = env.mintable("GOLD").await?;
    let silver = env.mintable("SILV").await?;
    let a0 = env.chain.account(0)?;
    let a1 = env.chain.account(1)?;
    env.mint(gold.token, a0, 1_000).await?;
    env.mint(gold.token, a1, 40).await?;
    env.transfer(gold.token, a1, 250).await?;
    let token = AssetToken::new(gold.token, env.chain.provider().clone());
    confirm(&token.burn(U256::from(100))).await?;
    env.mint(silver.token, a0, 7).await?;

    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let pool = env.db.pool();
    let c = env.chain_id;

    let supply = keel_index::token_supply(pool, c, gold.token).await?;
    assert_eq!(supply, U256::from(940));
    assert_eq!(supply, token.totalSupply().call().await?);
    assert_eq!(
        keel_index::token_supply(pool, c, silver.token).await?,
        U256::from(7)
    );
    // No indexed transfer: zero (also on a chain the index does not know).
    assert_eq!(
        keel_index::token_supply(pool, c, gold.feed).await?,
        U256::ZERO
    );
    assert_eq!(
        keel_index::token_supply(pool, keel_units::ChainId(c.get() + 1), gold.token).await?,
        U256::ZERO
    );
    Ok(())
}
