//! The Ledger read API (migration 0025): holders ranked by balance, record-date
//! snapshots, transfer pages and supply at a block, against the chain's own state.

use crate::common::{catch_up, config, env, fingerprint, reindex};
use crate::reorg::transfer_request;
use alloy::eips::BlockId;
use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::keel_abi::bindings::AssetToken;
use keel_index::read::{self, HolderBalance, HolderKey};
use keel_index::snapshot;
use keel_units::ChainId;
use std::collections::BTreeMap;

/// Every holder of `token` at `block` by walking pages of `size`.
async fn walk(
    pool: &sqlx::PgPool,
    chain: ChainId,
    token: Address,
    block: u64,
    size: u32,
) -> anyhow::Result<Vec<HolderBalance>> {
    let mut out = Vec::new();
    let mut after: Option<HolderKey> = None;
    loop {
        let page = read::holders_at(pool, chain, token, block, after, size).await?;
        let full = page.len() == size as usize;
        after = page.last().map(HolderBalance::key);
        out.extend(page);
        if !full {
            return Ok(out);
        }
    }
}

/// The chain's own answer: `balanceOf` of every account at `block`, nonzero ones,
/// ranked as the index ranks them.
async fn chain_holders(
    env: &crate::common::Env,
    token: Address,
    block: u64,
) -> anyhow::Result<Vec<HolderBalance>> {
    let t = AssetToken::new(token, env.chain.provider().clone());
    let mut out = Vec::new();
    for a in env.chain.accounts() {
        let b = t.balanceOf(a).block(BlockId::number(block)).call().await?;
        if b > U256::ZERO {
            out.push(HolderBalance {
                holder: a,
                balance: b,
            });
        }
    }
    out.sort_by(|x, y| y.balance.cmp(&x.balance).then(x.holder.cmp(&y.holder)));
    Ok(out)
}

async fn chain_supply(
    env: &crate::common::Env,
    token: Address,
    block: u64,
) -> anyhow::Result<U256> {
    let t = AssetToken::new(token, env.chain.provider().clone());
    Ok(t.totalSupply().block(BlockId::number(block)).call().await?)
}

/// A snapshot at an earlier block equals the chain's state at that block, before and
/// after a reorg of the blocks above it; a transfer of an orphaned block counts
/// nowhere, the replacement counts from its block on; supply agrees at every block.
#[tokio::test]
async fn a_snapshot_equals_the_chain_at_its_block_across_a_reorg() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("SNAP").await?;
    let acct = |i| env.chain.account(i);
    let (a0, a1, a2, a3, a4) = (acct(0)?, acct(1)?, acct(2)?, acct(3)?, acct(4)?);
    env.mint(asset.token, a0, 1_000).await?;
    env.transfer(asset.token, a1, 100).await?;
    env.transfer(asset.token, a2, 100).await?;
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let record = env.chain.block_number().await?;

    // Above the record date: a transfer to a3 and a mint to a1.
    env.transfer(asset.token, a3, 50).await?;
    env.mint(asset.token, a1, 7).await?;
    catch_up(&ingest).await?;
    let pool = env.db.pool();
    let before_reorg = walk(pool, env.chain_id, asset.token, record, 2).await?;
    assert_eq!(
        before_reorg,
        chain_holders(&env, asset.token, record).await?
    );
    let tip = env.chain.block_number().await?;
    assert_eq!(
        walk(pool, env.chain_id, asset.token, tip, 2).await?,
        chain_holders(&env, asset.token, tip).await?
    );

    // Replace the last two blocks: the a3 transfer and the mint are orphaned; a4
    // receives 70 instead, in the newest replacement block.
    let p = env.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: 2,
        tx_block_pairs: vec![(transfer_request(asset.token, a0, a4, 70, p), 1)],
    })
    .await?;
    assert!(catch_up(&ingest).await? >= 1, "no reorg detected");
    let tip = env.chain.block_number().await?;
    let now = walk(pool, env.chain_id, asset.token, tip, 2).await?;
    assert_eq!(now, chain_holders(&env, asset.token, tip).await?);
    assert!(
        !now.iter().any(|h| h.holder == a3),
        "orphaned transfer counted: {now:?}"
    );
    assert!(
        now.iter()
            .any(|h| h.holder == a4 && h.balance == U256::from(70))
    );
    for block in [record, tip - 1, tip] {
        assert_eq!(
            walk(pool, env.chain_id, asset.token, block, 3).await?,
            chain_holders(&env, asset.token, block).await?,
            "block {block}"
        );
        assert_eq!(
            keel_index::token_supply_at(pool, env.chain_id, asset.token, block).await?,
            chain_supply(&env, asset.token, block).await?,
            "supply at {block}"
        );
    }
    assert_eq!(
        walk(pool, env.chain_id, asset.token, record, 2).await?,
        before_reorg
    );
    assert_eq!(
        keel_index::token_supply_at(pool, env.chain_id, asset.token, tip).await?,
        keel_index::token_supply(pool, env.chain_id, asset.token).await?
    );
    // The kept balances equal a fresh re-index of the same chain.
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

/// Pages of 2 walk every holder exactly once, in (balance desc, address asc) order,
/// through ties and at a snapshot block whose ranking differs from the current one.
#[tokio::test]
async fn holder_pages_walk_every_holder_once_through_ties() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("TIES").await?;
    let accounts = env.chain.accounts();
    let amounts = [5_u64, 9, 5, 3, 5, 3, 1, 9];
    for (a, n) in accounts.iter().skip(1).zip(amounts) {
        env.mint(asset.token, *a, n).await?;
    }
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let record = env.chain.block_number().await?;
    // After the record date the ranking changes: account 0 gets a top balance.
    env.mint(asset.token, accounts[0], 20).await?;
    env.mint(asset.token, accounts[7], 4).await?;
    catch_up(&ingest).await?;
    let tip = env.chain.block_number().await?;
    let pool = env.db.pool();

    let mut expected: BTreeMap<Address, u64> = BTreeMap::new();
    for (a, n) in accounts.iter().skip(1).zip(amounts) {
        expected.insert(*a, n);
    }
    for (block, extra) in [(record, vec![]), (tip, vec![(0, 20), (7, 4)])] {
        let mut want = expected.clone();
        for (i, n) in extra {
            *want.entry(accounts[i]).or_default() += n;
        }
        let mut want: Vec<HolderBalance> = want
            .into_iter()
            .map(|(holder, n)| HolderBalance {
                holder,
                balance: U256::from(n),
            })
            .collect();
        want.sort_by(|x, y| y.balance.cmp(&x.balance).then(x.holder.cmp(&y.holder)));
        for size in [1, 2, 3, 50] {
            let got = walk(pool, env.chain_id, asset.token, block, size).await?;
            assert_eq!(got, want, "block {block}, pages of {size}");
        }
    }
    Ok(())
}

/// Transfer pages walk every transfer once, newest first, with block times; a
/// holder's pages hold exactly its transfers.
#[tokio::test]
async fn transfer_pages_walk_every_transfer_once_newest_first() -> anyhow::Result<()> {
    let env = env().await?;
    let asset = env.mintable("XFER").await?;
    let (a0, a1, a2) = (
        env.chain.account(0)?,
        env.chain.account(1)?,
        env.chain.account(2)?,
    );
    env.mint(asset.token, a0, 100).await?;
    for n in 1..=4 {
        env.transfer(asset.token, a1, n).await?;
    }
    env.transfer(asset.token, a2, 9).await?;
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let pool = env.db.pool();
    let all = read::transfers(pool, env.chain_id, Some(asset.token)).await?;
    assert_eq!(all.len(), 6);

    for holder in [None, Some(a1), Some(a2)] {
        let mut got = Vec::new();
        let mut before = None;
        loop {
            let page =
                read::transfer_page(pool, env.chain_id, asset.token, holder, before, 2).await?;
            before = page
                .last()
                .map(|t| (t.position.block_number, t.position.log_index));
            let full = page.len() == 2;
            got.extend(page);
            if !full {
                break;
            }
        }
        let mut want: Vec<_> = all
            .iter()
            .filter(|t| holder.is_none_or(|h| t.from == h || t.to == h))
            .cloned()
            .collect();
        want.reverse();
        assert_eq!(
            got.iter()
                .map(|t| (t.position, t.from, t.to, t.value.to_string()))
                .collect::<Vec<_>>(),
            want.iter()
                .map(|t| (t.position, t.from, t.to, t.value.clone()))
                .collect::<Vec<_>>(),
            "holder {holder:?}"
        );
        for t in &got {
            let block = env
                .chain
                .provider()
                .get_block_by_number(t.position.block_number.into())
                .await?
                .ok_or_else(|| anyhow::anyhow!("no block"))?;
            assert_eq!(
                t.block_time.map(|d| d.timestamp() as u64),
                Some(block.header.timestamp),
            );
        }
    }
    Ok(())
}

/// The tip ingest records the node's finalized block (Anvil: head − 64).
#[tokio::test]
async fn the_finalized_block_is_recorded_with_the_tip() -> anyhow::Result<()> {
    let env = env().await?;
    let p = env.chain.provider();
    p.anvil_mine(Some(70), None).await?;
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let finalized = p
        .get_block_by_number(alloy::eips::BlockNumberOrTag::Finalized)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no finalized block"))?
        .header
        .number;
    assert!(finalized > 0);
    assert_eq!(
        read::finalized_block(env.db.pool(), env.chain_id).await?,
        Some(finalized)
    );
    Ok(())
}

/// Every holder of snapshot `s` by walking pages of `size`.
async fn walk_snapshot(
    pool: &sqlx::PgPool,
    s: &snapshot::Snapshot,
    size: u32,
) -> anyhow::Result<Vec<HolderBalance>> {
    let mut out = Vec::new();
    let mut after: Option<HolderKey> = None;
    loop {
        let page = snapshot::holders(pool, s, after, size).await?;
        let full = page.len() == size as usize;
        after = page.last().map(HolderBalance::key);
        out.extend(page);
        if !full {
            return Ok(out);
        }
    }
}

/// A snapshot object is pending — computed from the index, equal to the chain at its
/// block — until its block is final; then it is sealed once: its pages, holder count,
/// total and content hash (SHA-256 of its canonical CSV) equal the chain's holders at
/// the block, and later transfers, a reorg above it and sealing again change nothing.
/// A snapshot of a block already final is sealed when it is created; creating one
/// twice answers the same snapshot.
#[tokio::test]
async fn a_snapshot_object_is_sealed_once_its_block_is_final_and_never_changes()
-> anyhow::Result<()> {
    use sha2::{Digest, Sha256};
    use snapshot::{SealBlocker, SnapshotState};
    let env = env().await?;
    let asset = env.mintable("SOBJ").await?;
    let acct = |i| env.chain.account(i);
    let (a0, a1, a2, a3, a4) = (acct(0)?, acct(1)?, acct(2)?, acct(3)?, acct(4)?);
    env.mint(asset.token, a0, 1_000).await?;
    env.transfer(asset.token, a1, 100).await?;
    env.transfer(asset.token, a2, 250).await?;
    env.transfer(asset.token, a3, 250).await?;
    // Balances of different lengths (360 and 40): ranked as numbers, not as text.
    env.transfer(asset.token, a4, 40).await?;
    let ingest = env.owner(config(64), "a").await?;
    catch_up(&ingest).await?;
    let record = env.chain.block_number().await?;
    env.transfer(asset.token, a4, 10).await?;
    env.mint(asset.token, a1, 5).await?;
    catch_up(&ingest).await?;
    let pool = env.db.pool();
    let (chain, token) = (env.chain_id, asset.token);
    let expected = chain_holders(&env, token, record).await?;

    let (s, created) = snapshot::create(pool, chain, token, record).await?;
    assert!(created);
    assert_eq!(
        (s.state, s.sealed, s.block),
        (SnapshotState::Pending, None, record)
    );
    assert_eq!(
        snapshot::seal_blocker(pool, &s).await?,
        Some(SealBlocker::NotFinal)
    );
    assert_eq!(walk_snapshot(pool, &s, 2).await?, expected);
    let (again, created) = snapshot::create(pool, chain, token, record).await?;
    assert!(!created);
    assert_eq!(again.id, s.id);

    // The record date becomes final (Anvil: finalized = head − 64).
    env.chain.provider().anvil_mine(Some(70), None).await?;
    catch_up(&ingest).await?;
    let sealed = snapshot::seal(pool, s.id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("snapshot gone"))?;
    assert_eq!(sealed.state, SnapshotState::Final);
    let meta = sealed
        .sealed
        .ok_or_else(|| anyhow::anyhow!("final without its seal"))?;
    assert_eq!(meta.holder_count, expected.len() as u64);
    assert_eq!(meta.total, chain_supply(&env, token, record).await?);
    assert_eq!(walk_snapshot(pool, &sealed, 2).await?, expected);
    let mut by_address = expected.clone();
    by_address.sort_by_key(|h| h.holder);
    let mut csv = snapshot::CSV_HEADER.to_owned();
    for h in &by_address {
        csv.push_str(&format!("{},{}\n", h.holder.to_checksum(None), h.balance));
    }
    let digest: [u8; 32] = Sha256::digest(csv.as_bytes()).into();
    assert_eq!(meta.content_hash.0, digest);
    let mut rows = Vec::new();
    let mut after = None;
    loop {
        let page = snapshot::rows_by_holder(pool, s.id, after, 2).await?;
        after = page.last().map(|h| h.holder);
        let done = page.len() < 2;
        rows.extend(page);
        if done {
            break;
        }
    }
    assert_eq!(rows, by_address);

    // Later writes and a reorg above it change nothing; sealing again is a no-op.
    env.transfer(asset.token, a2, 1).await?;
    catch_up(&ingest).await?;
    let p = env.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: 1,
        tx_block_pairs: vec![(transfer_request(token, a0, a3, 3, p), 0)],
    })
    .await?;
    assert!(catch_up(&ingest).await? >= 1, "no reorg detected");
    assert_eq!(snapshot::seal(pool, s.id).await?, Some(sealed.clone()));
    assert_eq!(walk_snapshot(pool, &sealed, 3).await?, expected);

    // A block already final is sealed at creation; the list is newest first.
    let (later, created) = snapshot::create(pool, chain, token, record + 1).await?;
    assert!(created);
    assert_eq!(later.state, SnapshotState::Final);
    assert_eq!(
        walk_snapshot(pool, &later, 50).await?,
        chain_holders(&env, token, record + 1).await?
    );
    let listed: Vec<_> = snapshot::list(pool, chain, token, None, 10)
        .await?
        .into_iter()
        .map(|x| x.id)
        .collect();
    assert_eq!(listed, vec![later.id, s.id]);
    // The balance history equals a fresh index of the same chain.
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}
