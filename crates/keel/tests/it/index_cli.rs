//! `keel index reindex` end to end (issue 32 §2): a `keel run --role indexer` process
//! follows a chain whose reorg replaces blocks Keel recorded as final (Anvil with
//! `--slots-in-an-epoch 1`: `finalized` is head − 2), marks it degraded and holds it;
//! `keel index reindex --chain local --wait-seconds N` (a separate process, the indexer
//! still running) clears the marker, and the running indexer rebuilds the chain: the
//! index's raw logs equal the chain's logs of the scope, block for block.

use crate::common::{free_port, keel};

use alloy::primitives::B256;
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::Filter;
use alloy::rpc::types::anvil::ReorgOptions;
use anvil_tests::TestChain;
use keel_store::testing::TestDatabase;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn run(env: &[(String, String)], args: &[&str]) -> (bool, String, String) {
    let out = keel().args(args).envs(env.to_vec()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(env: &[(String, String)], args: &[&str]) -> String {
    let (success, stdout, stderr) = run(env, args);
    assert!(success, "keel {args:?}: {stderr}");
    stdout
}

async fn until(what: &str, log: &std::path::Path, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out: {what}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_index_reindex_repairs_a_degraded_chain_while_the_indexer_runs() {
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await
        .unwrap();
    let db = TestDatabase::create().await.unwrap();
    let key0 = format!(
        "0x{}",
        alloy::hex::encode(chain.signer(0).unwrap().to_bytes())
    );
    let env = crate::common::stack_env(
        db.url(),
        chain.chain_id(),
        chain.endpoint().as_str(),
        free_port(),
        &key0,
    );
    ok(&env, &["migrate"]);
    ok(
        &env,
        &["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"],
    );
    let p = chain.provider();
    p.anvil_mine(Some(30), None).await.unwrap();

    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("indexer.log");
    let mut indexer = keel()
        .args([
            "run",
            "--role",
            "indexer",
            "--termination-grace-seconds",
            "5",
        ])
        .envs(env.clone())
        .env("KEEL__CLUSTER__HOST", "indexer")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let pool = db.pool().clone();
    let tip = || async {
        sqlx::query_scalar::<_, Option<i64>>("SELECT max(tip_number) FROM index_chain")
            .fetch_one(&pool)
            .await
            .unwrap()
            .unwrap_or(-1)
    };
    let head = p.get_block_number().await.unwrap();
    until("caught up", &log, async || tip().await >= head as i64).await;

    // 25 blocks replaced: far below what Keel recorded as final (head − 2, read at
    // least every 8 blocks).
    p.anvil_reorg(ReorgOptions {
        depth: 25,
        tx_block_pairs: vec![],
    })
    .await
    .unwrap();
    let degraded = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT coalesce(bool_or(degraded_at IS NOT NULL), false) FROM index_chain",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    until("degraded", &log, async || degraded().await).await;

    let out = ok(
        &env,
        &[
            "index",
            "reindex",
            "--chain",
            "local",
            "--wait-seconds",
            "120",
        ],
    );
    assert!(out.contains("degraded marker cleared"), "{out}");
    assert!(out.contains("rebuilt"), "{out}");
    assert!(!degraded().await);
    // The unknown chain name is refused.
    let (success, _, stderr) = run(&env, &["index", "reindex", "--chain", "nope"]);
    assert!(!success && stderr.contains("no chain named"), "{stderr}");

    // The index's raw logs equal the chain's logs of the scope up to the indexed tip.
    p.anvil_mine(Some(1), None).await.unwrap();
    let head = p.get_block_number().await.unwrap();
    until("the tip follows again", &log, async || {
        tip().await >= head as i64
    })
    .await;
    let tip = tip().await;
    let scope: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT address FROM index_scope WHERE removed_at IS NULL")
            .fetch_all(&pool)
            .await
            .unwrap();
    let addresses: Vec<alloy::primitives::Address> = scope
        .iter()
        .map(|a| alloy::primitives::Address::from_slice(a))
        .collect();
    let mut on_chain: Vec<(Vec<u8>, i64)> = p
        .get_logs(
            &Filter::new()
                .address(addresses)
                .from_block(0)
                .to_block(u64::try_from(tip).unwrap()),
        )
        .await
        .unwrap()
        .iter()
        .map(|l| {
            (
                l.block_hash.unwrap_or(B256::ZERO).to_vec(),
                i64::try_from(l.log_index.unwrap()).unwrap(),
            )
        })
        .collect();
    let mut indexed: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT block_hash, log_index FROM index_log WHERE block_number <= $1")
            .bind(tip)
            .fetch_all(&pool)
            .await
            .unwrap();
    on_chain.sort();
    indexed.sort();
    assert!(!on_chain.is_empty());
    assert_eq!(indexed, on_chain, "the index equals the chain's logs");
    let _ = indexer.kill();
    let _ = indexer.wait();
}
