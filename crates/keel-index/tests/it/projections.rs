//! Mints, transfers, assets, observations and directory entries reach the projections.

use crate::common::{catch_up, config, env, fingerprint, reindex};
use alloy::primitives::{Address, B256};
use anvil_tests::confirm;
use anvil_tests::keel_abi::bindings::Directory;
use keel_index::read;
use std::time::Duration;

#[tokio::test]
async fn transfers_assets_observations_and_balances_are_projected() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("GOLD").await?;
    let a0 = env.chain.account(0)?;
    let a1 = env.chain.account(1)?;
    env.mint(asset.token, a0, 1_000).await?;
    env.transfer(asset.token, a1, 250).await?;

    let ingest = env.owner(config(64), "a").await?;
    assert_eq!(ingest.epoch(), 1);
    catch_up(&ingest).await?;
    let pool = env.db.pool();
    let c = env.chain_id;

    let assets = read::assets(pool, c).await?;
    assert_eq!(assets.len(), 1);
    assert_eq!(assets[0].token, asset.token);
    assert_eq!(assets[0].symbol, "GOLD");
    assert_eq!(assets[0].decimals, 18);

    let t = read::transfers(pool, c, Some(asset.token)).await?;
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(
        (t[0].from, t[0].to, t[0].value.as_str()),
        (Address::ZERO, a0, "1000")
    );
    assert_eq!((t[1].from, t[1].to, t[1].value.as_str()), (a0, a1, "250"));
    assert!(t[0].position.block_number < t[1].position.block_number);

    assert_eq!(read::balance(pool, c, asset.token, a0).await?, "750");
    assert_eq!(read::balance(pool, c, asset.token, a1).await?, "250");
    assert_eq!(
        read::balance(pool, c, asset.token, Address::ZERO).await?,
        "0"
    );
    assert_eq!(read::balances(pool, c, asset.token).await?.len(), 2);

    let obs = read::observations(pool, c, asset.feed).await?;
    assert_eq!(obs.len(), 1);
    assert_eq!(obs[0].answer, "200000000000");

    // Deployed paused, then unpaused; the bound installed by `mintable`.
    let (paused, at) = read::token_paused(pool, c, asset.token).await?.unwrap();
    assert!(!paused);
    let history: i64 =
        sqlx::query_scalar("SELECT count(*) FROM index_token_pause WHERE token = $1")
            .bind(asset.token.to_vec())
            .fetch_one(pool)
            .await?;
    assert_eq!(history, 2);
    assert!(at.block_number > assets[0].position.block_number);
    let (bound, _) = read::staleness_bound(pool, c, asset.feed).await?.unwrap();
    assert_eq!(bound.as_deref(), Some("3600"));
    assert!(read::staleness_bound(pool, c, a1).await?.is_none());

    // Idempotent: a second round with nothing new changes nothing.
    let before = fingerprint(&env.db, c, &env.deployed).await?;
    let out = ingest.round().await?;
    assert_eq!(out.blocks, 0);
    assert_eq!(before, fingerprint(&env.db, c, &env.deployed).await?);
    assert_eq!(before, reindex(&env).await?);
    Ok(())
}

#[tokio::test]
async fn directory_removal_is_stamped_and_reads_are_live_only() -> anyhow::Result<()> {
    let env = env().await?;
    let dir = Directory::new(env.deployed.directory, env.chain.provider().clone());
    let mut name = [0u8; 32];
    name[..4].copy_from_slice(b"TEST");
    let name = B256::from(name);
    let (v1, v2) = (env.chain.account(5)?, env.chain.account(6)?);
    confirm(&dir.set(name, v1)).await?;
    confirm(&dir.set(name, v2)).await?;
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let (pool, c, d) = (env.db.pool(), env.chain_id, env.deployed.directory);

    let live: Vec<_> = read::directory_entries(pool, c, d, false)
        .await?
        .into_iter()
        .filter(|e| e.name == name)
        .collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].value, v2);

    confirm(&dir.remove(name)).await?;
    let out = ingest.round().await?;
    let removed_at = out.tip.unwrap();
    assert!(
        !read::directory_entries(pool, c, d, false)
            .await?
            .iter()
            .any(|e| e.name == name)
    );
    let history: Vec<_> = read::directory_entries(pool, c, d, true)
        .await?
        .into_iter()
        .filter(|e| e.name == name)
        .collect();
    assert_eq!(history.len(), 2);
    assert_eq!(
        history[0].removed_at_block,
        Some(history[1].position.block_number)
    );
    assert_eq!(history[1].removed_at_block, Some(removed_at));
    Ok(())
}

#[tokio::test]
async fn wait_for_block_returns_once_the_block_is_indexed_or_times_out() -> anyhow::Result<()> {
    let env = env().await?;
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    env.chain.mine().await?;
    let target = env.chain.block_number().await?;
    let c = env.chain_id;

    let err = keel_index::wait_for_block(
        env.db.pool(),
        c,
        target,
        Duration::from_millis(200),
        Duration::from_millis(50),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, keel_index::IndexError::WaitTimeout { .. }),
        "{err}"
    );

    // The timed-out waiter's listener may still be on its connection: the LISTEN looked
    // for below must be the next waiter's.
    listeners_become(env.db.pool(), 0).await?;
    let pool = env.db.pool().clone();
    let waiter = tokio::spawn(async move {
        keel_index::wait_for_block(
            &pool,
            c,
            target,
            Duration::from_secs(10),
            Duration::from_secs(5),
        )
        .await
    });
    // The waiter is subscribed before the block is indexed, so only the NOTIFY (or the
    // 5 s poll) can wake it.
    listeners_become(env.db.pool(), 1).await?;
    let started = std::time::Instant::now();
    ingest.round().await?;
    let tip = waiter.await??;
    assert_eq!(tip.number, target);
    // Woken by NOTIFY, not by the 5 s poll.
    assert!(started.elapsed() < Duration::from_secs(3));
    Ok(())
}

/// Polls until exactly `n` sessions of this test's database are subscribed to the tip
/// channel (their last statement a `LISTEN` on it), for at most 30 s.
async fn listeners_become(pool: &sqlx::PgPool, n: i64) -> anyhow::Result<()> {
    let listen = format!(r#"LISTEN "{}""#, read::TIP_CHANNEL);
    keel_store::testing::until(
        &format!("{n} listener(s) on the tip channel"),
        Duration::from_secs(30),
        || async {
            let listening: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND query = $1",
            )
            .bind(&listen)
            .fetch_one(pool)
            .await?;
            anyhow::Ok(listening == n)
        },
    )
    .await;
    Ok(())
}
