//! Distributions (issue 36 §3–§4) end to end: the holders of a final snapshot paid
//! through the API, in batches, across runner kills, with a recipient the paying token
//! refuses; every amount checked on chain.

use crate::e2e::{Hooks, Stack, TemplateOpts, state, terminal};
use alloy::primitives::{Address, B256, Bytes, U256, keccak256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::Filter;
use alloy::sol_types::{SolError, SolEvent};
use anvil_tests::TestChain;
use anvil_tests::proxy::{RpcProxy, Rule};
use keel_abi::bindings::{AssetToken, BatchPay, BlockingToken};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Holder `i` of the test (a deterministic address nobody holds a key for).
fn holder(i: u64) -> Address {
    Address::from_word(keccak256(i.to_be_bytes()))
}

/// Every payment of distribution `id`, walked page by page.
async fn payments(stack: &Stack, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => format!("/v1/distributions/{id}/payments?limit=200"),
            Some(c) => format!("/v1/distributions/{id}/payments?limit=200&cursor={c}"),
        };
        let (status, page) = stack.get(&stack.key_a, &path).await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["data"].as_array().unwrap().iter().cloned());
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

fn u256(v: &Value) -> U256 {
    U256::from_str_radix(v.as_str().unwrap(), 10).unwrap()
}

/// The treasury (Anvil account 5, granted `minter` through the API) mints `holders`'
/// balances plus 5,000 units it keeps, and spreads them with `BatchPay` itself.
async fn seed_holders(
    stack: &Stack,
    asset: &str,
    token_address: Address,
    holders: &[(Address, U256)],
) {
    let treasury = stack.chain.account(5).unwrap();
    let batch_pay = stack.contracts["batchPay"];
    let op = stack
        .token_op(
            asset,
            "grant-role",
            "g-minter",
            json!({"role": "minter", "account": treasury.to_string()}),
        )
        .await;
    let view = stack.await_op(&op, Duration::from_secs(90), terminal).await;
    assert_eq!(state(&view), "completed", "{view}");
    let t5 = stack.chain.provider_for(5).unwrap();
    let asset_token = AssetToken::new(token_address, t5.clone());
    let spread: U256 = holders.iter().map(|h| h.1).sum();
    let treasury_keeps = U256::from(5_000_000_000u64);
    anvil_tests::confirm(&asset_token.mint(treasury, spread + treasury_keeps))
        .await
        .unwrap();
    anvil_tests::confirm(&asset_token.approve(batch_pay, spread))
        .await
        .unwrap();
    let seeder = BatchPay::new(batch_pay, t5.clone());
    for chunk in holders.chunks(250) {
        let to: Vec<Address> = chunk.iter().map(|h| h.0).collect();
        let amounts: Vec<U256> = chunk.iter().map(|h| h.1).collect();
        anvil_tests::confirm(&seeder.payToken(Default::default(), token_address, to, amounts))
            .await
            .unwrap();
    }
}

/// A snapshot of `asset` at the current block, final once 64 blocks are above it (the
/// anvil profile): the record block and the final snapshot.
async fn final_snapshot(stack: &Stack, asset: &str) -> (u64, Value) {
    let record = stack.chain.block_number().await.unwrap();
    stack
        .chain
        .provider()
        .anvil_mine(Some(70), None)
        .await
        .unwrap();
    let snapshot = stack
        .until(Duration::from_secs(60), "the snapshot is final", || async {
            let (status, s) = stack
                .post(
                    &stack.key_a,
                    &format!("/v1/assets/{asset}/snapshots"),
                    "snap",
                    json!({"atBlock": record}),
                )
                .await;
            assert!(status == 200 || status == 201, "{s}");
            (s["state"] == "final").then_some(s)
        })
        .await;
    (record, snapshot)
}

/// 2,000 holders of an asset at a record date are paid a pro-rata dividend in another
/// ERC-20 (largest remainder) while the runner is killed 10 times between batches; two
/// holders the token blocks are refused and reported, the issuer's treasury is excluded.
/// On chain every other holder received exactly its share, once (one `Transfer` from
/// the payer each), the paid sum is the total less the refused shares, and the batches
/// are the `BatchPaid` events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distribution_pays_every_holder_exactly_once_across_runner_kills() {
    const HOLDERS: u64 = 2_000;
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await
        .unwrap();
    let mut stack = Stack::start(chain, TemplateOpts::default()).await;
    let (asset, token_address) = stack.create_active_asset("create-div", "DIVA").await;
    let batch_pay = stack.contracts["batchPay"];
    let payer = stack.chain.account(0).unwrap();
    let treasury = stack.chain.account(5).unwrap();

    let balances: Vec<U256> = (0..HOLDERS)
        .map(|i| U256::from((i % 97 + 1) * 1_000_000))
        .collect();
    let spread: U256 = balances.iter().copied().sum();
    let holders: Vec<(Address, U256)> = (0..HOLDERS)
        .map(|i| (holder(i), balances[i as usize]))
        .collect();
    seed_holders(&stack, &asset, token_address, &holders).await;

    // The dividend token: anyone mints; its owner (account 6) blocks two holders.
    let t6 = stack.chain.provider_for(6).unwrap();
    let dividend = BlockingToken::deploy(t6.clone(), "Dividend".into(), "DIV".into())
        .await
        .unwrap();
    let total = U256::from(10u64).pow(U256::from(24u64)) + U256::from(7u64);
    anvil_tests::confirm(&dividend.mint(payer, total))
        .await
        .unwrap();
    let blocked = [holder(17), holder(1_234)];
    for b in blocked {
        anvil_tests::confirm(&dividend.setBlocked(b, true))
            .await
            .unwrap();
    }

    let (record, snapshot) = final_snapshot(&stack, &asset).await;
    assert_eq!(snapshot["holderCount"], HOLDERS + 1, "{snapshot}");

    // An endpoint of acme, so the distribution's events are written.
    let _hooks = Hooks::register(&stack).await;
    let body = json!({
        "assetId": asset, "snapshotId": snapshot["id"], "payWith": "erc20",
        "payToken": dividend.address().to_string(), "basis": "proRata",
        "amountBaseUnits": total.to_string(), "rounding": "largestRemainder",
        "exclusions": [treasury.to_string()], "maxBatchSize": 50,
    });
    let (status, accepted) = stack
        .post(&stack.key_a, "/v1/distributions", "div-1", body.clone())
        .await;
    assert!(status == 202 || status == 200, "{accepted}");
    assert_eq!(accepted["kind"], "distribution.pay", "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();

    // Kill the runner each time a batch was paid, ten times.
    let mut kills = 0;
    let mut last_paid = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (status, d) = stack
            .get(&stack.key_a, &format!("/v1/distributions/{id}"))
            .await;
        assert_eq!(status, 200, "{d}");
        if terminal(&d["operation"]) {
            break;
        }
        let paid = d["progress"]["paid"]["holders"].as_u64().unwrap();
        if kills < 10 && paid > last_paid {
            stack.kill9("runner");
            stack.spawn("runner");
            kills += 1;
            last_paid = paid;
        }
        assert!(
            Instant::now() < deadline,
            "the distribution did not end: {d}\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(kills, 10, "ten kills during the distribution");
    // The same request again is the same distribution.
    let (status, again) = stack
        .post(&stack.key_a, "/v1/distributions", "div-1", body)
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], id.as_str());

    let (_, d) = stack
        .get(&stack.key_a, &format!("/v1/distributions/{id}"))
        .await;
    assert_eq!(state(&d["operation"]), "completed", "{d}");
    assert_eq!(d["holderCount"], HOLDERS + 1);
    assert_eq!(d["remainder"], "0", "largest remainder leaves nothing");
    assert_eq!(d["progress"]["refused"]["holders"], 2, "{d}");
    assert_eq!(d["progress"]["excluded"]["holders"], 1, "{d}");
    assert_eq!(d["progress"]["pending"]["holders"], 0, "{d}");
    let result = &d["operation"]["result"];
    assert_eq!(result["holdersPaid"], HOLDERS - 2, "{result}");

    // Every payment against the chain.
    let rows = payments(&stack, &id).await;
    assert_eq!(rows.len() as u64, HOLDERS + 1);
    let paid_sum: U256 = rows
        .iter()
        .filter(|r| r["state"] == "paid")
        .map(|r| u256(&r["amount"]))
        .sum();
    let refused_sum: U256 = rows
        .iter()
        .filter(|r| r["state"] == "refused")
        .map(|r| u256(&r["amount"]))
        .sum();
    assert_eq!(
        paid_sum + refused_sum,
        total,
        "the shares add up to the total"
    );
    assert_eq!(u256(&result["amountPaid"]), paid_sum);
    let eligible: U256 = spread;
    let div = BlockingToken::new(*dividend.address(), stack.chain.provider().clone());
    let balances_by_holder: HashMap<Address, U256> = (0..HOLDERS)
        .map(|i| (holder(i), balances[i as usize]))
        .collect();
    for r in &rows {
        let h: Address = r["holder"].as_str().unwrap().parse().unwrap();
        let on_chain = div.balanceOf(h).call().await.unwrap();
        match r["state"].as_str().unwrap() {
            "paid" => {
                let amount = u256(&r["amount"]);
                assert_eq!(on_chain, amount, "{h} holds exactly its share");
                let exact = total * balances_by_holder[&h] / eligible;
                assert!(amount == exact || amount == exact + U256::from(1u8), "{h}");
                assert!(r["txHash"].is_string() && r["block"].is_u64(), "{r}");
            }
            "refused" => {
                assert!(blocked.contains(&h), "{h} was refused");
                assert_eq!(on_chain, U256::ZERO);
            }
            "excluded" => {
                assert_eq!(h, treasury);
                assert_eq!(on_chain, U256::ZERO);
            }
            other => panic!("unexpected state {other}: {r}"),
        }
    }
    // Exactly one Transfer from the payer per paid holder, and the batches on chain.
    let transfers = stack
        .chain
        .provider()
        .get_logs(
            &Filter::new()
                .address(*dividend.address())
                .event_signature(BlockingToken::Transfer::SIGNATURE_HASH)
                .from_block(0),
        )
        .await
        .unwrap();
    let mut seen = HashSet::new();
    for l in &transfers {
        let t = BlockingToken::Transfer::decode_log_data(l.data()).unwrap();
        if t.from == payer {
            assert!(seen.insert(t.to), "{} paid twice", t.to);
        }
    }
    assert_eq!(seen.len() as u64, HOLDERS - 2);
    let batches = stack
        .chain
        .provider()
        .get_logs(
            &Filter::new()
                .address(batch_pay)
                .event_signature(BatchPay::BatchPaid::SIGNATURE_HASH)
                .from_block(record + 1),
        )
        .await
        .unwrap();
    assert_eq!(
        batches.len() as u64,
        d["progress"]["batchesPaid"].as_u64().unwrap()
    );
    assert_eq!(result["batches"], batches.len() as u64);
    // One `distribution.batch_settled` per batch and one `distribution.completed`.
    let events: Vec<(String,)> = sqlx::query_as(
        "SELECT event_type FROM webhook_event WHERE operation_id = $1::uuid \
         AND event_type LIKE 'distribution.%'",
    )
    .bind(&id)
    .fetch_all(stack.db.pool())
    .await
    .unwrap();
    let settled = events
        .iter()
        .filter(|e| e.0 == "distribution.batch_settled")
        .count();
    let completed = events
        .iter()
        .filter(|e| e.0 == "distribution.completed")
        .count();
    assert_eq!(settled, batches.len());
    assert_eq!(completed, 1);
}

/// A per-unit payout in native ether (floor): every holder gets exactly
/// `balance · amount / 10^6` wei; a holder that is a contract refusing ether (the
/// Directory) is refused and reported while the rest of its batch is paid; the payer's
/// ether went down by the paid sum plus gas only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_unit_ether_distribution_pays_exact_wei_and_isolates_a_refusing_recipient() {
    let chain = TestChain::builder()
        .args(["--slots-in-an-epoch", "1"])
        .start()
        .await
        .unwrap();
    let stack = Stack::start(chain, TemplateOpts::default()).await;
    let (asset, token_address) = stack.create_active_asset("create-eth", "ETHD").await;
    let directory = stack.contracts["directory"];
    let mut holders: Vec<(Address, U256)> = (0..40u64)
        .map(|i| (holder(10_000 + i), U256::from(i * 1_234_567 + 1)))
        .collect();
    holders.push((directory, U256::from(3_000_000u64)));
    seed_holders(&stack, &asset, token_address, &holders).await;
    let (_, snapshot) = final_snapshot(&stack, &asset).await;
    let treasury = stack.chain.account(5).unwrap();
    let per_unit = U256::from(10u64).pow(U256::from(15u64)) + U256::from(3u64);
    let (status, accepted) = stack
        .post(
            &stack.key_a,
            "/v1/distributions",
            "eth-1",
            json!({
                "assetId": asset, "snapshotId": snapshot["id"], "payWith": "native",
                "basis": "perUnit", "amountBaseUnits": per_unit.to_string(),
                "exclusions": [treasury.to_string()], "maxBatchSize": 16,
            }),
        )
        .await;
    assert!(status == 202 || status == 200, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();
    let view = stack
        .await_op(&id, Duration::from_secs(180), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    let rows = payments(&stack, &id).await;
    assert_eq!(rows.len(), holders.len() + 1);
    let by_holder: HashMap<Address, U256> = holders.iter().copied().collect();
    let unit = U256::from(1_000_000u64);
    for r in &rows {
        let h: Address = r["holder"].as_str().unwrap().parse().unwrap();
        match r["state"].as_str().unwrap() {
            "paid" => {
                let expected = by_holder[&h] * per_unit / unit;
                assert_eq!(u256(&r["amount"]), expected, "{h}");
                let wei = stack.chain.provider().get_balance(h).await.unwrap();
                assert_eq!(wei, expected, "{h} holds exactly its wei");
            }
            "refused" => {
                assert_eq!(h, directory, "{r}");
                assert_eq!(r["reason"], "TransferRefused", "{r}");
            }
            "excluded" => assert_eq!(h, treasury),
            other => panic!("unexpected state {other}: {r}"),
        }
    }
    let (_, d) = stack
        .get(&stack.key_a, &format!("/v1/distributions/{id}"))
        .await;
    assert_eq!(d["progress"]["paid"]["holders"], 40, "{d}");
    assert_eq!(d["progress"]["refused"]["holders"], 1, "{d}");
    assert_eq!(d["remainder"], "0", "{d}");
    assert_eq!(d["payWith"], "native");
    // Three batches of at most 16 (41 payable, one refused out of its batch).
    assert_eq!(d["progress"]["batchesPaid"], 3, "{d}");
    // A completed distribution can be neither paused nor resumed.
    for action in ["pause", "resume"] {
        let (status, body) = stack
            .post(
                &stack.key_a,
                &format!("/v1/distributions/{id}/{action}"),
                "-",
                json!({}),
            )
            .await;
        assert_eq!(status, 409, "{action}: {body}");
        assert_eq!(body["code"], "OPERATION_ENDED", "{body}");
    }

    // A second payout of the same snapshot, paused as soon as it is accepted and then
    // cancelled while it holds: it pays nothing more after the hold, and the payments
    // say who was paid.
    let (status, accepted) = stack
        .post(
            &stack.key_a,
            "/v1/distributions",
            "eth-2",
            json!({
                "assetId": asset, "snapshotId": snapshot["id"], "payWith": "native",
                "basis": "perUnit", "amountBaseUnits": "7",
                "exclusions": [treasury.to_string(), directory.to_string()], "maxBatchSize": 8,
            }),
        )
        .await;
    assert!(status == 202 || status == 200, "{accepted}");
    let second = accepted["id"].as_str().unwrap().to_owned();
    let (status, paused) = stack
        .post(
            &stack.key_a,
            &format!("/v1/distributions/{second}/pause"),
            "-",
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    assert!(paused["pausedAt"].is_string(), "{paused}");
    let held = stack
        .await_op(&second, Duration::from_secs(120), |v| {
            v["wait"]["for"] == "resume" || terminal(v)
        })
        .await;
    assert_eq!(held["wait"]["for"], "resume", "{held}");
    assert_eq!(held["progress"]["phase"], "paused", "{held}");
    // Pausing again changes nothing.
    let (status, again) = stack
        .post(
            &stack.key_a,
            &format!("/v1/distributions/{second}/pause"),
            "-",
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["pausedAt"], paused["pausedAt"], "{again}");
    let (_, at_hold) = stack
        .get(&stack.key_a, &format!("/v1/distributions/{second}"))
        .await;
    let paid_at_hold = at_hold["progress"]["paid"]["holders"].as_u64().unwrap();
    let (status, cancelled) = stack
        .post(
            &stack.key_a,
            &format!("/v1/operations/{second}/cancel"),
            "-",
            json!({}),
        )
        .await;
    assert!(status == 200 || status == 202, "{cancelled}");
    let ended = stack
        .await_op(&second, Duration::from_secs(60), terminal)
        .await;
    assert_eq!(state(&ended), "cancelled", "{ended}");
    let (_, d2) = stack
        .get(&stack.key_a, &format!("/v1/distributions/{second}"))
        .await;
    assert_eq!(
        d2["progress"]["paid"]["holders"], paid_at_hold,
        "nothing paid after the hold: {d2}"
    );
    let tallied: u64 = ["paid", "pending", "zero"]
        .iter()
        .map(|s| d2["progress"][s]["holders"].as_u64().unwrap())
        .sum();
    assert_eq!(tallied, 40, "{d2}");
    let first: HashMap<Address, U256> = rows
        .iter()
        .filter(|r| r["state"] == "paid")
        .map(|r| {
            (
                r["holder"].as_str().unwrap().parse().unwrap(),
                u256(&r["amount"]),
            )
        })
        .collect();
    for r in payments(&stack, &second).await {
        let h: Address = r["holder"].as_str().unwrap().parse().unwrap();
        let wei = stack.chain.provider().get_balance(h).await.unwrap();
        match r["state"].as_str().unwrap() {
            "paid" => assert_eq!(wei, first[&h] + u256(&r["amount"]), "{h}"),
            "pending" => assert_eq!(wei, first[&h], "{h} was not paid by the cancelled payout"),
            "excluded" | "zero" => {}
            other => panic!("unexpected state {other}: {r}"),
        }
    }
}

/// Issue 36 §4, faults: a distribution through an RPC that loses the replies of its
/// first three `eth_sendRawTransaction` calls (the node got the transactions); a reorg
/// that takes a settled batch's block out while the distribution is paused (the queue
/// watches writes 12 blocks deep and broadcasts the same signed bytes again, so the
/// batch lands once, in another block, and the payments show that block); and a
/// recipient the paying token refuses only after its batch was signed and broadcast
/// (blocked by a higher-tip transaction mined in the same block): that batch reverts on
/// chain, is checked again and sent without it. On chain every paid holder received
/// its share exactly once and the refused holder nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distribution_pays_exactly_once_through_lost_send_replies_a_reorg_and_an_on_chain_refusal()
 {
    const HOLDERS: u64 = 60;
    let chain = TestChain::start().await.unwrap();
    let proxy = RpcProxy::start(chain.endpoint()).await.unwrap();
    let ws = format!("ws://{}", chain.endpoint().authority());
    let extra: Vec<(String, String)> = [
        (
            "KEEL__CHAINS__LOCAL__RPCURLS",
            format!("[\"{}\"]", proxy.url()),
        ),
        ("KEEL__CHAINS__LOCAL__WSURL", ws),
        ("KEEL__CHAINS__LOCAL__FINALITYDEPTH", "12".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let stack = Stack::start_with(chain, TemplateOpts::default(), extra).await;
    let (asset, token_address) = stack.create_active_asset("create-flt", "FLTD").await;
    let holders: Vec<(Address, U256)> = (0..HOLDERS)
        .map(|i| (holder(50_000 + i), U256::from((i % 13 + 1) * 1_000_000)))
        .collect();
    seed_holders(&stack, &asset, token_address, &holders).await;
    let payer = stack.chain.account(0).unwrap();
    let treasury = stack.chain.account(5).unwrap();
    let t6 = stack.chain.provider_for(6).unwrap();
    let dividend = BlockingToken::deploy(t6.clone(), "Coupon".into(), "CPN".into())
        .await
        .unwrap();
    let total = U256::from(10u64).pow(U256::from(21u64)) + U256::from(11u64);
    anvil_tests::confirm(&dividend.mint(payer, total))
        .await
        .unwrap();
    let (_, snapshot) = final_snapshot(&stack, &asset).await;

    let lost = proxy.add_rule(Rule::drop_response("eth_sendRawTransaction").times(3));
    let (status, accepted) = stack
        .post(
            &stack.key_a,
            "/v1/distributions",
            "flt-1",
            json!({
                "assetId": asset, "snapshotId": snapshot["id"], "payWith": "erc20",
                "payToken": dividend.address().to_string(), "basis": "proRata",
                "amountBaseUnits": total.to_string(), "exclusions": [treasury.to_string()],
                "maxBatchSize": 10,
            }),
        )
        .await;
    assert!(status == 202 || status == 200, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();
    let p = stack.chain.provider();

    // 1. Once batch 1 is paid, pause and reorg its block out (the head blocks down to it
    //    replaced by empty ones).
    let batch_one = stack
        .until(Duration::from_secs(180), "batch 1 is paid", || async {
            let rows = payments(&stack, &id).await;
            rows.into_iter()
                .find(|r| r["batch"] == 1 && r["state"] == "paid")
        })
        .await;
    let (status, _) = stack
        .post(
            &stack.key_a,
            &format!("/v1/distributions/{id}/pause"),
            "-",
            json!({}),
        )
        .await;
    assert_eq!(status, 200);
    let held = stack
        .await_op(&id, Duration::from_secs(120), |v| {
            v["wait"]["for"] == "resume" || terminal(v)
        })
        .await;
    assert_eq!(held["wait"]["for"], "resume", "{held}");
    // The status page lists it as paused, with its progress.
    let (status, platform) = stack.get(&stack.key_a, "/v1/status").await;
    assert_eq!(status, 200, "{platform}");
    let listed = platform["distributions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("not on the status page: {platform}"));
    assert_eq!(listed["state"], "paused", "{listed}");
    assert_eq!(listed["holders"], HOLDERS + 1, "{listed}");
    assert!(listed["paid"].as_u64().unwrap() >= 20, "{listed}");
    assert!(listed["batchesPaid"].as_u64().unwrap() >= 2, "{listed}");
    let tx: B256 = batch_one["txHash"].as_str().unwrap().parse().unwrap();
    let old_block = batch_one["block"].as_u64().unwrap();
    let head = p.get_block_number().await.unwrap();
    let depth = head - old_block + 1;
    assert!(
        depth <= 8,
        "batch 1's block is {depth} deep: too deep for the test's reorg"
    );
    p.raw_request::<_, ()>("anvil_reorg".into(), (depth, Vec::<(Bytes, u64)>::new()))
        .await
        .unwrap();
    let moved = stack
        .until(
            Duration::from_secs(120),
            "batch 1 is mined again",
            || async {
                p.get_transaction_receipt(tx)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|r| r.block_number)
                    .filter(|b| *b != old_block)
            },
        )
        .await;
    assert!(moved > old_block, "re-included above the replaced blocks");
    stack
        .until(
            Duration::from_secs(60),
            "the payments show batch 1's new block",
            || async {
                let rows = payments(&stack, &id).await;
                rows.iter()
                    .filter(|r| r["batch"] == 1)
                    .all(|r| r["block"] == moved)
                    .then_some(())
            },
        )
        .await;

    // 2. Stop mining, resume, and block one recipient of the next batch once its
    //    transaction is in the node's pool: the blocking transaction (tip 100 gwei) is
    //    mined first in the same block, so the batch reverts on chain.
    p.raw_request::<_, ()>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let (status, resumed) = stack
        .post(
            &stack.key_a,
            &format!("/v1/distributions/{id}/resume"),
            "-",
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{resumed}");
    assert!(resumed["pausedAt"].is_null(), "{resumed}");
    let (link, in_pool) = stack
        .until(
            Duration::from_secs(120),
            "the next batch is broadcast",
            || async {
                let (_, v) = stack
                    .get(&stack.key_a, &format!("/v1/operations/{id}"))
                    .await;
                let confirmed: Vec<&str> = v["milestones"]["confirmed"]
                    .as_array()?
                    .iter()
                    .filter_map(|m| m["step"].as_str())
                    .collect();
                v["milestones"]["submitted"]
                    .as_array()?
                    .iter()
                    .find_map(|m| {
                        let step = m["step"].as_str()?;
                        (step.starts_with("batch-")
                            && !confirmed.contains(&step)
                            && m["broadcast"] == true)
                            .then(|| (step.to_owned(), m["txHash"].as_str().unwrap().to_owned()))
                    })
            },
        )
        .await;
    let batch: u64 = link.trim_start_matches("batch-").parse().unwrap();
    let victim: Address = payments(&stack, &id)
        .await
        .into_iter()
        .find(|r| r["batch"] == batch && r["state"] == "pending")
        .map(|r| r["holder"].as_str().unwrap().parse().unwrap())
        .unwrap();
    let owner = BlockingToken::new(*dividend.address(), t6.clone());
    let block_call = owner
        .setBlocked(victim, true)
        .max_priority_fee_per_gas(100_000_000_000)
        .max_fee_per_gas(1_000_000_000_000);
    let pending_block = block_call.send().await.unwrap();
    let blocking = *pending_block.tx_hash();
    p.raw_request::<_, Value>("evm_mine".into(), ())
        .await
        .unwrap();
    p.raw_request::<_, ()>("evm_setAutomine".into(), (true,))
        .await
        .unwrap();
    let in_pool: B256 = in_pool.parse().unwrap();
    let reverted = p.get_transaction_receipt(in_pool).await.unwrap().unwrap();
    let blocked = p.get_transaction_receipt(blocking).await.unwrap().unwrap();
    assert_eq!(reverted.block_number, blocked.block_number, "one block");
    assert!(
        blocked.transaction_index < reverted.transaction_index,
        "the block first"
    );
    assert!(!reverted.status(), "batch {batch} reverted on chain");

    let view = stack
        .await_op(&id, Duration::from_secs(240), terminal)
        .await;
    assert_eq!(state(&view), "completed", "{view}");
    assert_eq!(proxy.hits(lost), 3, "three send replies were lost");
    let (_, platform) = stack.get(&stack.key_a, "/v1/status").await;
    assert!(
        !platform["distributions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["id"] == id.as_str()),
        "a completed distribution leaves the status page: {platform}"
    );
    let steps: Vec<&str> = view["milestones"]["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["step"].as_str())
        .collect();
    assert!(
        steps.contains(&format!("batch-{batch}.2").as_str()),
        "{view}"
    );

    // Against the chain: each paid holder got its share once, in the block its payment
    // row names; the refused one nothing.
    let rows = payments(&stack, &id).await;
    let div = BlockingToken::new(*dividend.address(), p.clone());
    let mut paid_sum = U256::ZERO;
    let mut refused = Vec::new();
    for r in &rows {
        let h: Address = r["holder"].as_str().unwrap().parse().unwrap();
        let on_chain = div.balanceOf(h).call().await.unwrap();
        match r["state"].as_str().unwrap() {
            "paid" => {
                assert_eq!(on_chain, u256(&r["amount"]), "{h} holds exactly its share");
                paid_sum += on_chain;
                let hash: B256 = r["txHash"].as_str().unwrap().parse().unwrap();
                let receipt = p.get_transaction_receipt(hash).await.unwrap().unwrap();
                assert!(receipt.status(), "{r}");
                assert_eq!(
                    Some(r["block"].as_u64().unwrap()),
                    receipt.block_number,
                    "{r}"
                );
            }
            "refused" => {
                assert_eq!(on_chain, U256::ZERO);
                refused.push(h);
                // BlockingToken's `Blocked(address)`, an error Keel has no ABI for.
                let selector = alloy::hex::encode(BlockingToken::Blocked::SELECTOR);
                assert_eq!(r["reason"], format!("custom error 0x{selector}"), "{r}");
            }
            "excluded" => assert_eq!(h, treasury),
            other => panic!("unexpected state {other}: {r}"),
        }
    }
    assert_eq!(
        refused,
        vec![victim],
        "only the blocked recipient is refused"
    );
    let (_, d) = stack
        .get(&stack.key_a, &format!("/v1/distributions/{id}"))
        .await;
    let refused_amount = u256(&d["progress"]["refused"]["amount"]);
    let remainder = u256(&d["remainder"]);
    assert_eq!(paid_sum + refused_amount + remainder, total, "{d}");
    let transfers = p
        .get_logs(
            &Filter::new()
                .address(*dividend.address())
                .event_signature(BlockingToken::Transfer::SIGNATURE_HASH)
                .from_block(0),
        )
        .await
        .unwrap();
    let mut seen = HashSet::new();
    for l in &transfers {
        let t = BlockingToken::Transfer::decode_log_data(l.data()).unwrap();
        if t.from == payer {
            assert!(seen.insert(t.to), "{} paid twice", t.to);
        }
    }
    assert_eq!(
        seen.len() as u64,
        HOLDERS - 1,
        "one transfer per paid holder"
    );
}

/// Issue 36 §2: a snapshot turns final once its block is final, with nobody reading it
/// (the indexer's sealing loop): its row is sealed in the database (probed there, not
/// through the API, which would seal it itself), and then reads answer it final with
/// its holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_seals_once_its_block_is_final_without_a_reader() {
    let chain = TestChain::start().await.unwrap();
    let stack = Stack::start(chain, TemplateOpts::default()).await;
    let (asset, token_address) = stack.create_active_asset("create-seal", "SEAL").await;
    let holders: Vec<(Address, U256)> = (0..3u64)
        .map(|i| (holder(90_000 + i), U256::from(1_000_000 * (i + 1))))
        .collect();
    seed_holders(&stack, &asset, token_address, &holders).await;
    let record = stack.chain.block_number().await.unwrap();
    let (status, s) = stack
        .post(
            &stack.key_a,
            &format!("/v1/assets/{asset}/snapshots"),
            "snap",
            json!({"atBlock": record}),
        )
        .await;
    assert_eq!(status, 201, "{s}");
    assert_eq!(s["state"], "pending", "{s}");
    let id = s["id"].as_str().unwrap().to_owned();
    stack
        .chain
        .provider()
        .anvil_mine(Some(70), None)
        .await
        .unwrap();
    stack
        .until(
            Duration::from_secs(60),
            "the sealing loop seals it",
            || async {
                let state: String =
                    sqlx::query_scalar("SELECT state FROM index_snapshot WHERE id = $1::uuid")
                        .bind(&id)
                        .fetch_one(stack.db.pool())
                        .await
                        .unwrap();
                (state == "final").then_some(())
            },
        )
        .await;
    let (status, s) = stack
        .get(&stack.key_a, &format!("/v1/assets/{asset}/snapshots/{id}"))
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"], "final", "{s}");
    assert_eq!(s["holderCount"], 4, "three holders and the treasury: {s}");
}
