//! Epoch fencing: a stale owner's write commits nothing.

use crate::common::{catch_up, config, env, fingerprint};
use keel_index::{IndexError, read};

#[tokio::test]
async fn a_stale_owner_commits_nothing_after_a_new_owner_took_over() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("FENCE").await?;
    let a0 = env.chain.account(0)?;

    let old = env.owner(config(64), "old").await?;
    catch_up(&old).await?;
    let tip_before = read::indexed_tip(env.db.pool(), env.chain_id).await?;

    let new = env.owner(config(64), "new").await?;
    assert_eq!(new.epoch(), old.epoch() + 1);

    // New blocks appear; the old owner (late writer) tries to ingest them.
    env.mint(asset.token, a0, 42).await?;
    let before = fingerprint(&env.db, env.chain_id, &env.deployed).await?;
    let err = old.round().await.unwrap_err();
    assert!(
        matches!(err, IndexError::Fenced { epoch, .. } if epoch == old.epoch()),
        "{err}"
    );
    assert!(err.is_fatal());
    assert_eq!(
        before,
        fingerprint(&env.db, env.chain_id, &env.deployed).await?
    );
    assert_eq!(
        tip_before,
        read::indexed_tip(env.db.pool(), env.chain_id).await?
    );

    // The new owner ingests them exactly once.
    catch_up(&new).await?;
    let t = read::transfers(env.db.pool(), env.chain_id, Some(asset.token)).await?;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].value, "42");
    let err = old.round().await.unwrap_err();
    assert!(matches!(err, IndexError::Fenced { .. }));
    Ok(())
}

#[tokio::test]
async fn an_owner_superseded_mid_round_commits_nothing() -> anyhow::Result<()> {
    use anvil_tests::proxy::{RpcProxy, Rule};
    use keel_chain::{UpstreamConfig, UpstreamPool};
    use std::sync::Arc;
    use std::time::Duration;

    let env = env().await?;
    let asset = env.mintable("MID").await?;
    env.mint(asset.token, env.chain.account(0)?, 7).await?;
    // The old owner's node answers getLogs slowly: it is mid-round when the new owner
    // takes over.
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    proxy.add_rule(Rule::latency("eth_getLogs", Duration::from_millis(800)));
    let slow = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let old = keel_index::TipIngest::take_ownership(env.db.pool().clone(), slow, config(64), "old")
        .await?;
    let late = tokio::spawn({
        let old = old.clone();
        async move { old.round().await }
    });
    // Mid-round: its (slow) getLogs has reached the node. Until then it could still
    // read the new epoch and fence itself before doing anything.
    keel_store::testing::until(
        "the old owner's round to ask for logs",
        Duration::from_secs(30),
        || async { proxy.count("eth_getLogs") > 0 },
    )
    .await;
    let new = env.owner(config(64), "new").await?;
    let err = late.await?.unwrap_err();
    assert!(matches!(err, IndexError::Fenced { .. }), "{err}");
    assert_eq!(read::indexed_tip(env.db.pool(), env.chain_id).await?, None);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM index_log")
        .fetch_one(env.db.pool())
        .await?;
    assert_eq!(rows, 0, "the superseded owner committed rows");

    catch_up(&new).await?;
    let t = read::transfers(env.db.pool(), env.chain_id, Some(asset.token)).await?;
    assert_eq!(t.len(), 1);
    Ok(())
}
