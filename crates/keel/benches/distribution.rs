//! A distribution to N holders on Anvil (issue 36 §4): wall time, transactions and gas
//! of Keel's `distribution.pay` (the holders of a final snapshot paid through
//! `BatchPay`, batches sized from gas, each batch a durable queue request) against one
//! ERC-20 `transfer` per holder sent straight from an EOA (alloy, no database, no
//! durability: the floor of the per-holder way). Printed side by side in the same run.
//!
//! `cargo bench -p keel --bench distribution --profile dev` (needs PostgreSQL and Anvil
//! as for the tests; `source .keel/env` first). `KEEL_DISTRIBUTION_BENCH_HOLDERS`
//! holders (default 10,000). Not part of `scripts/test`.
//!
//! - **keel**: the api, runner and indexer as processes (as `scripts/demo` runs them);
//!   N holders of an asset seeded with `BatchPay` directly, a snapshot at that block
//!   made final (70 blocks mined), then `POST /v1/distributions` of a pro-rata payout
//!   in another ERC-20 (largest remainder); the clock runs from the request to the
//!   operation's completion. Transactions and gas: every confirmed write of the
//!   operation (the `approve` and the batches), from their receipts.
//! - **per holder**: the same amounts of a fresh token of the same contract sent as N
//!   `transfer` calls from dev account 7 through alloy's filling provider, 64 in flight
//!   at a time (each window's receipts awaited before the next).

#[allow(dead_code)]
#[path = "../tests/it/common/mod.rs"]
mod common;

use alloy::primitives::{Address, B256, U256, keccak256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use anvil_tests::TestChain;
use common::stack::Procs;
use keel_abi::bindings::{AssetToken, BatchPay, BlockingToken};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn holder(i: u64) -> Address {
    Address::from_word(keccak256((i + 1_000_000).to_be_bytes()))
}

fn terminal(v: &Value) -> bool {
    matches!(
        v["state"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// Gas used by the receipts of `hashes`.
async fn gas_of(chain: &TestChain, hashes: &[B256]) -> u64 {
    let mut gas = 0;
    for h in hashes {
        let r = chain
            .provider()
            .get_transaction_receipt(*h)
            .await
            .unwrap()
            .expect("mined");
        assert!(r.status(), "{h} succeeded");
        gas += r.gas_used;
    }
    gas
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: u64 = std::env::var("KEEL_DISTRIBUTION_BENCH_HOLDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let chain = TestChain::builder()
        .args(["--gas-limit", "60000000"])
        .start()
        .await
        .unwrap();
    let mut stack = Procs::new(chain, tempfile::tempdir().unwrap(), Vec::new()).await;
    stack.bootstrap();
    stack.cli(&["org", "create", "--name", "bench"]);
    let key = stack.cli(&["api-key", "create", "--org", "bench", "--label", "b"]);
    stack.cli(&[
        "template",
        "set",
        "--org",
        "bench",
        "--id",
        "std",
        "--chain",
        "local",
        "--staleness-bound-seconds",
        "86400",
    ]);
    let rows: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT name, address FROM platform_contract")
            .fetch_all(stack.db.pool())
            .await
            .unwrap();
    let contract = |name: &str| {
        rows.iter()
            .find(|r| r.0 == name)
            .map(|r| Address::from_slice(&r.1))
            .unwrap()
    };
    let batch_pay = contract("batchPay");
    stack.start_roles().await;

    // The asset and its N holders (seeded with BatchPay by dev account 5, a minter).
    let (status, created) = stack
        .post(
            &key,
            "/v1/assets",
            "bench-asset",
            json!({"name": "Bench Fund", "symbol": "BNCH", "decimals": 6,
                   "templateId": "std", "initialPrice": "100"}),
        )
        .await;
    assert!(status == 200 || status == 202, "{created}");
    let asset = created["assetId"].as_str().unwrap().to_owned();
    let view = stack
        .await_op(
            &key,
            created["id"].as_str().unwrap(),
            Duration::from_secs(120),
            terminal,
        )
        .await;
    assert_eq!(view["state"], "completed", "{view}");
    let token: Address = view["result"]["tokenAddress"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let treasury = stack.chain.account(5).unwrap();
    let (status, op) = stack
        .post(
            &key,
            &format!("/v1/assets/{asset}/grant-role"),
            "bench-minter",
            json!({"role": "minter", "account": treasury.to_string()}),
        )
        .await;
    assert!(status == 200 || status == 202, "{op}");
    let granted = stack
        .await_op(
            &key,
            op["id"].as_str().unwrap(),
            Duration::from_secs(60),
            terminal,
        )
        .await;
    assert_eq!(granted["state"], "completed", "{granted}");
    let balances: Vec<U256> = (0..n)
        .map(|i| U256::from((i % 89 + 1) * 1_000_000))
        .collect();
    let spread: U256 = balances.iter().copied().sum();
    let t5 = stack.chain.provider_for(5).unwrap();
    let asset_token = AssetToken::new(token, t5.clone());
    anvil_tests::confirm(&asset_token.mint(treasury, spread))
        .await
        .unwrap();
    anvil_tests::confirm(&asset_token.approve(batch_pay, spread))
        .await
        .unwrap();
    let seeder = BatchPay::new(batch_pay, t5.clone());
    let seed = Instant::now();
    for (c, chunk) in (0..n).collect::<Vec<_>>().chunks(500).enumerate() {
        let to: Vec<Address> = chunk.iter().map(|i| holder(*i)).collect();
        let amounts: Vec<U256> = chunk.iter().map(|i| balances[*i as usize]).collect();
        let mut id = [0u8; 32];
        id[..8].copy_from_slice(&(c as u64).to_be_bytes());
        anvil_tests::confirm(
            &seeder
                .payToken(id.into(), token, to, amounts)
                .gas(30_000_000),
        )
        .await
        .unwrap();
    }
    eprintln!(
        "seeded {n} holders in {:.1} s",
        seed.elapsed().as_secs_f64()
    );

    // The paying token: the payer (the operator, dev account 0) holds the total.
    let total = U256::from(10u64).pow(U256::from(24u64)) + U256::from(7u64);
    let t6 = stack.chain.provider_for(6).unwrap();
    let dividend = BlockingToken::deploy(t6.clone(), "Dividend".into(), "DIV".into())
        .await
        .unwrap();
    let payer = stack.chain.account(0).unwrap();
    anvil_tests::confirm(&dividend.mint(payer, total))
        .await
        .unwrap();

    let record = stack.chain.block_number().await.unwrap();
    stack
        .chain
        .provider()
        .anvil_mine(Some(70), None)
        .await
        .unwrap();
    let sealing = Instant::now();
    let snapshot = stack
        .until(
            Duration::from_secs(600),
            "the snapshot is final",
            || async {
                let (status, s) = stack
                    .post(
                        &key,
                        &format!("/v1/assets/{asset}/snapshots"),
                        "snap",
                        json!({"atBlock": record}),
                    )
                    .await;
                assert!(status == 200 || status == 201, "{s}");
                (s["state"] == "final").then_some(s)
            },
        )
        .await;
    assert_eq!(snapshot["holderCount"], n, "{snapshot}");
    eprintln!(
        "snapshot of {n} holders final {:.1} s after its block was (70 blocks mined)",
        sealing.elapsed().as_secs_f64()
    );

    // Keel: one distribution.
    let started = Instant::now();
    let (status, accepted) = stack
        .post(
            &key,
            "/v1/distributions",
            "bench-dist",
            json!({"assetId": asset, "snapshotId": snapshot["id"], "payWith": "erc20",
                   "payToken": dividend.address().to_string(), "basis": "proRata",
                   "amountBaseUnits": total.to_string(), "rounding": "largestRemainder"}),
        )
        .await;
    assert!(status == 200 || status == 202, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();
    let done = stack
        .await_op(&key, &id, Duration::from_secs(1_800), terminal)
        .await;
    let keel_wall = started.elapsed();
    assert_eq!(done["state"], "completed", "{done}");
    let (_, d) = stack.get(&key, &format!("/v1/distributions/{id}")).await;
    assert_eq!(d["progress"]["paid"]["holders"], n, "{d}");
    let hashes: Vec<B256> = done["milestones"]["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["txHash"].as_str().unwrap().parse().unwrap())
        .collect();
    let batches = d["progress"]["batchesPaid"].as_u64().unwrap();
    let keel_gas = gas_of(&stack.chain, &hashes).await;
    let div = BlockingToken::new(*dividend.address(), stack.chain.provider().clone());
    for i in [0, n / 2, n - 1] {
        assert!(div.balanceOf(holder(i)).call().await.unwrap() > U256::ZERO);
    }

    // One transfer per holder: the same shares of a fresh token, from dev account 7.
    let shares: Vec<U256> = {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                None => format!("/v1/distributions/{id}/payments?limit=200"),
                Some(c) => format!("/v1/distributions/{id}/payments?limit=200&cursor={c}"),
            };
            let (_, page) = stack.get(&key, &path).await;
            for r in page["data"].as_array().unwrap() {
                out.push(U256::from_str_radix(r["amount"].as_str().unwrap(), 10).unwrap());
            }
            match page["nextCursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break out,
            }
        }
    };
    let t7 = stack.chain.provider_for(7).unwrap();
    let plain = BlockingToken::deploy(t7.clone(), "Plain".into(), "PLN".into())
        .await
        .unwrap();
    let sender = stack.chain.account(7).unwrap();
    anvil_tests::confirm(&plain.mint(sender, total))
        .await
        .unwrap();
    // In windows of WINDOW sends, each window's receipts awaited before the next:
    // Anvil's automine stalls with thousands of transactions in its pool (measured:
    // 9,300 pending, no block mined for minutes).
    const WINDOW: usize = 64;
    let started = Instant::now();
    let mut plain_hashes = Vec::with_capacity(shares.len());
    for (w, window) in shares.chunks(WINDOW).enumerate() {
        let mut pending = Vec::with_capacity(window.len());
        for (k, share) in window.iter().enumerate() {
            let i = (w * WINDOW + k) as u64;
            pending.push(
                plain
                    .transfer(holder(i), *share)
                    .gas(100_000)
                    .send()
                    .await
                    .unwrap(),
            );
        }
        for p in pending {
            plain_hashes.push(*p.tx_hash());
            p.get_receipt().await.unwrap();
        }
    }
    let plain_wall = started.elapsed();
    let plain_gas = gas_of(&stack.chain, &plain_hashes).await;

    let keel_s = keel_wall.as_secs_f64();
    let plain_s = plain_wall.as_secs_f64();
    println!("distribution to {n} holders on Anvil (one run)");
    println!(
        "  keel distribution.pay   {keel_s:>8.1} s  {:>6} transactions ({batches} batches)  {keel_gas:>12} gas  {:>7.0} gas/holder  {:>7.0} holders/s",
        hashes.len(),
        keel_gas as f64 / n as f64,
        n as f64 / keel_s
    );
    println!(
        "  one transfer per holder {plain_s:>8.1} s  {:>6} transactions                {plain_gas:>12} gas  {:>7.0} gas/holder  {:>7.0} holders/s",
        plain_hashes.len(),
        plain_gas as f64 / n as f64,
        n as f64 / plain_s
    );
    println!(
        "  keel / per holder: wall {:.2}×, transactions {:.4}×, gas {:.2}×",
        keel_s / plain_s,
        hashes.len() as f64 / plain_hashes.len() as f64,
        keel_gas as f64 / plain_gas as f64
    );
}
