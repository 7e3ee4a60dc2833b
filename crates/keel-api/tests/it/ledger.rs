//! The Ledger read routes (holders at a record date, transfers, supply) over an index
//! built by the real tip ingest from a real Anvil chain; every answer is checked
//! against the OpenAPI document (`Env::get`).

use crate::common::{Env, assert_problem};
use alloy::eips::BlockId;
use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::rpc::types::anvil::{ReorgOptions, TransactionData};
use anvil_tests::keel_abi::bindings::AssetToken;
use anvil_tests::{
    AssetWithFeed, TestChain, confirm, deploy_asset_with_feed, deploy_keel, set_staleness_bound,
    submit_observation,
};
use axum::http::StatusCode;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::{ScopeEntry, ScopeKind, TipConfig, TipIngest, scope};
use keel_units::ChainId;
use serde_json::{Value, json};
use std::sync::Arc;
use uuid::Uuid;

/// The API over a database whose index follows a chain with one mintable asset token,
/// recorded as organization A's asset `asset`.
struct Ledger {
    env: Env,
    chain: TestChain,
    asset: AssetWithFeed,
    id: Uuid,
    ingest: TipIngest,
}

impl Ledger {
    async fn start() -> Self {
        let env = Env::new().await;
        let chain = TestChain::start().await.unwrap();
        let deployed = deploy_keel(&chain).await.unwrap();
        let asset = deploy_asset_with_feed(&chain, &deployed, "LEDG")
            .await
            .unwrap();
        let p = chain.provider();
        confirm(&AssetToken::new(asset.token, p.clone()).unpause())
            .await
            .unwrap();
        set_staleness_bound(p, deployed.price_resolver, asset.feed, 3_600)
            .await
            .unwrap();
        submit_observation(p, asset.feed, 200_000_000_000)
            .await
            .unwrap();
        let pool = env.db.pool().clone();
        let chain_id = ChainId(chain.chain_id());
        scope::add_scope(
            &pool,
            chain_id,
            &ScopeEntry {
                address: asset.token,
                kind: ScopeKind::AssetToken,
                organization: None,
                from_block: 0,
            },
        )
        .await
        .unwrap();
        let node = Arc::new(
            UpstreamPool::new(
                chain_id,
                UpstreamConfig::new(vec![chain.endpoint().to_string()]),
            )
            .unwrap(),
        );
        let ingest = TipIngest::take_ownership(
            pool.clone(),
            node,
            TipConfig {
                start_block: Some(0),
                ..TipConfig::new(64)
            },
            "api-test",
        )
        .await
        .unwrap();
        // Organization A's asset, pointed at the deployed token (what `asset.create`
        // records once its deploy step lands).
        let body = json!({
            "name": "Ledger", "symbol": "LEDG", "decimals": 18,
            "templateId": crate::common::TEMPLATE, "initialPrice": "1"
        });
        let a = env
            .post(&env.key_a, "/v1/assets", Some("ledger-1"), &body)
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
        let id: Uuid = a.body["assetId"].as_str().unwrap().parse().unwrap();
        keel_workflows::store::asset_addresses_set(
            &pool,
            id,
            asset.token.as_slice(),
            asset.feed.as_slice(),
            chain.accounts()[0].as_slice(),
        )
        .await
        .unwrap();
        Self {
            env,
            chain,
            asset,
            id,
            ingest,
        }
    }

    async fn catch_up(&self) -> u64 {
        let mut reorgs = 0;
        for _ in 0..50 {
            let out = self.ingest.round().await.unwrap();
            reorgs += out.reorgs;
            if out.tip == Some(out.head) {
                return reorgs;
            }
        }
        panic!("ingest did not catch up")
    }

    fn token(&self) -> AssetToken::AssetTokenInstance<alloy::providers::DynProvider> {
        AssetToken::new(self.asset.token, self.chain.provider().clone())
    }

    async fn mint(&self, to: Address, amount: u64) {
        confirm(&self.token().mint(to, U256::from(amount)))
            .await
            .unwrap();
    }

    async fn transfer(&self, to: Address, amount: u64) {
        confirm(&self.token().transfer(to, U256::from(amount)))
            .await
            .unwrap();
    }

    fn account(&self, i: usize) -> Address {
        self.chain.account(i).unwrap()
    }

    /// The chain's own holders at `block` as (checksummed address, base units), ranked
    /// by balance descending, then address.
    async fn chain_holders(&self, block: u64) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for a in self.chain.accounts() {
            let b = self
                .token()
                .balanceOf(a)
                .block(BlockId::number(block))
                .call()
                .await
                .unwrap();
            if b > U256::ZERO {
                out.push((b, a));
            }
        }
        out.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
        out.into_iter()
            .map(|(b, a)| (a.to_checksum(None), b.to_string()))
            .collect()
    }

    /// Every holder by walking the pages of `limit` from `first` (a holders URI).
    async fn walk(&self, first: &str, limit: u32) -> (Vec<(String, String)>, Vec<Value>) {
        let mut holders = Vec::new();
        let mut pages = Vec::new();
        let sep = if first.contains('?') { '&' } else { '?' };
        let mut uri = format!("{first}{sep}limit={limit}");
        loop {
            let a = self.env.get(&self.env.key_a, &uri).await;
            assert_eq!(a.status, StatusCode::OK, "{uri}: {:?}", a.body);
            for h in a.body["data"].as_array().unwrap() {
                holders.push((
                    h["address"].as_str().unwrap().to_owned(),
                    h["balanceBaseUnits"].as_str().unwrap().to_owned(),
                ));
            }
            let next = a.body["nextCursor"].as_str().map(str::to_owned);
            assert_eq!(a.body["hasMore"].as_bool(), Some(next.is_some()));
            pages.push(a.body);
            match next {
                Some(c) => uri = format!("{first}{sep}limit={limit}&cursor={c}"),
                None => return (holders, pages),
            }
        }
    }
}

fn transfer_request(
    token: Address,
    from: Address,
    to: Address,
    amount: u64,
    provider: &alloy::providers::DynProvider,
) -> TransactionData {
    let req = AssetToken::new(token, provider.clone())
        .transfer(to, U256::from(amount))
        .into_transaction_request()
        .with_from(from)
        .with_gas_limit(200_000);
    TransactionData::JSON(req)
}

/// A record-date snapshot equals the chain's balances at that block, page after page
/// (ties included), before and after a reorg above it; a transfer of an orphaned block
/// counts nowhere; supply agrees; a block above the indexed tip is refused, a cursor of
/// another block too; the finalized flag follows the chain's finalized block.
#[tokio::test]
async fn holders_at_a_record_date_are_exact_across_a_reorg() {
    let l = Ledger::start().await;
    let id = l.id;
    let (a0, a1, a2, a3, a4) = (
        l.account(0),
        l.account(1),
        l.account(2),
        l.account(3),
        l.account(4),
    );
    l.mint(a0, 1_000).await;
    l.mint(a1, 300).await;
    l.mint(a2, 300).await; // a tie with a1
    l.transfer(a3, 300).await; // a three-way tie
    l.transfer(a4, 5).await;
    l.catch_up().await;
    let record = l.chain.block_number().await.unwrap();
    let at_record = l.chain_holders(record).await;
    assert_eq!(at_record.len(), 5);

    // Above the record date: a transfer to a5 that a reorg will orphan, replaced by
    // one to a6.
    let (a5, a6) = (l.account(5), l.account(6));
    l.transfer(a5, 50).await;
    l.catch_up().await;
    let p = l.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: 1,
        tx_block_pairs: vec![(transfer_request(l.asset.token, a0, a6, 60, p), 0)],
    })
    .await
    .unwrap();
    assert!(l.catch_up().await >= 1, "no reorg detected");
    let tip = l.chain.block_number().await.unwrap();

    for limit in [1, 2, 200] {
        let (got, pages) = l
            .walk(&format!("/v1/assets/{id}/holders?atBlock={record}"), limit)
            .await;
        assert_eq!(got, at_record, "pages of {limit}");
        for page in &pages {
            assert_eq!(page["block"].as_u64(), Some(record));
            assert_eq!(page["finalized"], false);
            assert_eq!(page["indexDegraded"], false);
            assert_eq!(page["assetId"], id.to_string());
        }
    }
    let (now, pages) = l.walk(&format!("/v1/assets/{id}/holders"), 2).await;
    assert_eq!(now, l.chain_holders(tip).await);
    assert!(
        now.iter()
            .any(|(a, b)| *a == a6.to_checksum(None) && b == "60")
    );
    assert!(
        !now.iter().any(|(a, _)| *a == a5.to_checksum(None)),
        "orphaned transfer counted"
    );
    assert!(pages.iter().all(|p| p["block"].as_u64() == Some(tip)));
    // The formatted amount follows the asset's 18 decimals.
    assert_eq!(pages[0]["data"][0]["balance"], "0.000000000000000635");

    // Supply at both blocks, as the chain says.
    for block in [record, tip] {
        let s = l
            .env
            .get(
                &l.env.key_a,
                &format!("/v1/assets/{id}/supply?atBlock={block}"),
            )
            .await;
        assert_eq!(s.status, StatusCode::OK, "{:?}", s.body);
        let want = l
            .token()
            .totalSupply()
            .block(BlockId::number(block))
            .call()
            .await
            .unwrap();
        assert_eq!(s.body["supplyBaseUnits"], want.to_string());
        assert_eq!(s.body["block"].as_u64(), Some(block));
    }

    // Above the indexed tip: refused. A cursor of another block: refused.
    let above = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/holders?atBlock={}", tip + 1),
        )
        .await;
    assert_problem(&above, 409, "BLOCK_NOT_INDEXED", "holders above the tip");
    let above = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/supply?atBlock={}", tip + 1),
        )
        .await;
    assert_problem(&above, 409, "BLOCK_NOT_INDEXED", "supply above the tip");
    let first = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/holders?atBlock={record}&limit=1"),
        )
        .await;
    let cursor = first.body["nextCursor"].as_str().unwrap();
    let mixed = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/holders?atBlock={tip}&limit=1&cursor={cursor}"),
        )
        .await;
    assert_problem(&mixed, 400, "INVALID_CURSOR", "cursor of another block");
    let bad = l
        .env
        .get(&l.env.key_a, &format!("/v1/assets/{id}/holders?limit=0"))
        .await;
    assert_problem(&bad, 400, "INVALID_QUERY", "limit 0");

    // 70 blocks later the record date is at or below the finalized block (Anvil:
    // head − 64); the tip is not.
    p.anvil_mine(Some(70), None).await.unwrap();
    l.catch_up().await;
    let final_page = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/holders?atBlock={record}"),
        )
        .await;
    assert_eq!(final_page.body["finalized"], true, "{:?}", final_page.body);
    let tip_page = l
        .env
        .get(&l.env.key_a, &format!("/v1/assets/{id}/holders"))
        .await;
    assert_eq!(tip_page.body["finalized"], false, "{:?}", tip_page.body);
    let s = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/supply?atBlock={record}"),
        )
        .await;
    assert_eq!(s.body["finalized"], true);
}

/// Transfer pages walk every transfer once, newest first, with block time, hash and
/// log index; a holder's pages hold exactly its transfers; other organizations'
/// assets are not found.
#[tokio::test]
async fn transfer_pages_and_tenancy() {
    let l = Ledger::start().await;
    let id = l.id;
    let (a0, a1, a2) = (l.account(0), l.account(1), l.account(2));
    l.mint(a0, 100).await;
    for n in 1..=3 {
        l.transfer(a1, n).await;
    }
    l.transfer(a2, 7).await;
    l.catch_up().await;

    let walk = |holder: Option<Address>| {
        let l = &l;
        async move {
            let base = match holder {
                None => format!("/v1/assets/{id}/transfers"),
                Some(h) => format!("/v1/assets/{id}/holders/{h}/transfers"),
            };
            let mut out: Vec<Value> = Vec::new();
            let mut uri = format!("{base}?limit=2");
            loop {
                let a = l.env.get(&l.env.key_a, &uri).await;
                assert_eq!(a.status, StatusCode::OK, "{uri}: {:?}", a.body);
                out.extend(a.body["data"].as_array().unwrap().iter().cloned());
                match a.body["nextCursor"].as_str() {
                    Some(c) => uri = format!("{base}?limit=2&cursor={c}"),
                    None => return out,
                }
            }
        }
    };
    let all = walk(None).await;
    assert_eq!(all.len(), 5, "{all:?}");
    let keys: Vec<(u64, u64)> = all
        .iter()
        .map(|t| {
            (
                t["blockNumber"].as_u64().unwrap(),
                t["logIndex"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(keys, sorted, "newest first, each once");
    let mint = &all[4];
    assert_eq!(mint["from"], Address::ZERO.to_checksum(None));
    assert_eq!(mint["to"], a0.to_checksum(None));
    assert_eq!(mint["amountBaseUnits"], "100");
    for t in &all {
        let block = l
            .chain
            .provider()
            .get_block_by_number(t["blockNumber"].as_u64().unwrap().into())
            .await
            .unwrap()
            .unwrap();
        let time = chrono::DateTime::from_timestamp(block.header.timestamp as i64, 0).unwrap();
        assert_eq!(
            t["blockTime"],
            time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        );
        assert_eq!(t["blockHash"], block.header.hash.to_string());
    }
    let of_a1 = walk(Some(a1)).await;
    assert_eq!(of_a1.len(), 3);
    assert!(of_a1.iter().all(|t| t["to"] == a1.to_checksum(None)));
    // Lowercase path addresses are accepted; a bad one is refused.
    let lower = format!("{a2:#x}");
    assert_eq!(walk(Some(lower.parse().unwrap())).await.len(), 1);
    let bad = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/holders/0x12/transfers"),
        )
        .await;
    assert_problem(&bad, 422, "INVALID_ADDRESS", "bad holder");
    let bad = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/transfers?cursor=nope"),
        )
        .await;
    assert_problem(&bad, 400, "INVALID_CURSOR", "bad cursor");

    // Organization B sees none of organization A's ledger.
    for uri in [
        format!("/v1/assets/{id}/holders"),
        format!("/v1/assets/{id}/holders?atBlock=1"),
        format!("/v1/assets/{id}/transfers"),
        format!("/v1/assets/{id}/holders/{a1}/transfers"),
        format!("/v1/assets/{id}/supply"),
    ] {
        let a = l.env.get(&l.env.key_b, &uri).await;
        assert_problem(&a, 404, "NOT_FOUND", &uri);
    }
    // An asset whose token does not exist yet.
    let (pending, _) = l.env.create_asset(&l.env.key_a, "ledger-pending").await;
    let a = l
        .env
        .get(&l.env.key_a, &format!("/v1/assets/{pending}/holders"))
        .await;
    assert_problem(&a, 409, "ASSET_NOT_READY", "pending asset");
}

/// `GET /v1/assets/{id}/balances/{address}?atBlock=N` (issue 32 §9): for every block
/// of the chain and every account (holders, a sender that emptied itself, one that
/// never held), the balance equals the token's `balanceOf` at block N, also after a
/// reorg above a block that orphans a transfer; `block` says which block it reflects;
/// above the indexed tip it is `409 BLOCK_NOT_INDEXED`; without `atBlock` it is the
/// tip's. (Before, `atBlock` was ignored and the latest balance answered `200`.)
#[tokio::test]
async fn balance_at_a_block_equals_balance_of_at_that_block() {
    let l = Ledger::start().await;
    let id = l.id;
    let accounts: Vec<Address> = (0..7).map(|i| l.account(i)).collect();
    let start = l.chain.block_number().await.unwrap();
    l.mint(accounts[0], 1_000).await;
    l.mint(accounts[1], 300).await;
    l.transfer(accounts[2], 250).await;
    l.transfer(accounts[3], 750).await; // account 0 is empty now
    l.mint(accounts[0], 7).await;
    l.catch_up().await;
    // A transfer that a reorg orphans, replaced by another.
    l.transfer(accounts[4], 5).await;
    l.catch_up().await;
    let p = l.chain.provider();
    p.anvil_reorg(ReorgOptions {
        depth: 1,
        tx_block_pairs: vec![(
            transfer_request(l.asset.token, accounts[0], accounts[5], 6, p),
            0,
        )],
    })
    .await
    .unwrap();
    assert!(l.catch_up().await >= 1, "no reorg detected");
    let tip = l.chain.block_number().await.unwrap();

    let mut compared = 0;
    for block in start..=tip {
        for a in &accounts {
            let want = l
                .token()
                .balanceOf(*a)
                .block(BlockId::number(block))
                .call()
                .await
                .unwrap();
            let got = l
                .env
                .get(
                    &l.env.key_a,
                    &format!("/v1/assets/{id}/balances/{a}?atBlock={block}"),
                )
                .await;
            assert_eq!(got.status, StatusCode::OK, "{block} {a}: {:?}", got.body);
            assert_eq!(
                got.body["balanceBaseUnits"],
                want.to_string(),
                "balance of {a} at block {block}"
            );
            assert_eq!(got.body["block"].as_u64(), Some(block));
            assert_eq!(got.body["indexedBlock"].as_u64(), Some(tip));
            compared += 1;
        }
    }
    assert!(compared >= 7 * 6, "only {compared} comparisons");
    // The orphaned transfer counts nowhere, its replacement does.
    let orphan = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/balances/{}?atBlock={tip}", accounts[4]),
        )
        .await;
    assert_eq!(orphan.body["balanceBaseUnits"], "0");
    // Without atBlock: the tip's balance, `block` = the tip.
    let now = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/balances/{}", accounts[5]),
        )
        .await;
    assert_eq!(now.body["balanceBaseUnits"], "6");
    assert_eq!(now.body["block"].as_u64(), Some(tip));
    assert_eq!(now.body["finalized"], false);
    // Above the indexed tip: refused, never the latest balance.
    let above = l
        .env
        .get(
            &l.env.key_a,
            &format!(
                "/v1/assets/{id}/balances/{}?atBlock={}",
                accounts[1],
                tip + 1
            ),
        )
        .await;
    assert_problem(&above, 409, "BLOCK_NOT_INDEXED", "balance above the tip");
    // 70 blocks later (Anvil's finalized block is head − 64) an old block is final.
    p.anvil_mine(Some(70), None).await.unwrap();
    l.catch_up().await;
    let old = l
        .env
        .get(
            &l.env.key_a,
            &format!("/v1/assets/{id}/balances/{}?atBlock={tip}", accounts[1]),
        )
        .await;
    assert_eq!(old.body["finalized"], true, "{:?}", old.body);
    assert_eq!(old.body["balanceBaseUnits"], "300");
}

/// Snapshot objects over the API: created pending (its pages equal the chain at its
/// block, its export refused with `SNAPSHOT_NOT_FINAL`), the same block answers the
/// same snapshot (`200`), sealed once its block is final: holder count, total, pages
/// and the CSV export equal what the chain held, the export's SHA-256 is the content
/// hash (and its `Repr-Digest`); another organization sees nothing of it.
#[tokio::test]
async fn snapshots_are_sealed_once_final_and_export_what_the_chain_held() {
    use sha2::{Digest, Sha256};
    let l = Ledger::start().await;
    l.mint(l.account(1), 500).await;
    l.mint(l.account(2), 300).await;
    l.mint(l.account(3), 300).await;
    l.catch_up().await;
    let record = l.chain.provider().get_block_number().await.unwrap();
    l.mint(l.account(4), 9).await;
    l.catch_up().await;
    let env = &l.env;
    let base = format!("/v1/assets/{}/snapshots", l.id);

    let a = env
        .post(&env.key_a, &base, None, &json!({"atBlock": record}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.body);
    assert_eq!(a.body["state"], "pending");
    assert_eq!(a.body["pendingReason"], "notFinal");
    assert_eq!(a.body["contentHash"], Value::Null);
    let sid = a.body["id"].as_str().unwrap().to_owned();
    let again = env
        .post(&env.key_a, &base, None, &json!({"atBlock": record}))
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["id"], a.body["id"]);
    let export = format!("{base}/{sid}/export");
    assert_problem(
        &env.get(&env.key_a, &export).await,
        409,
        "SNAPSHOT_NOT_FINAL",
        "export while pending",
    );
    let expected = l.chain_holders(record).await;
    let (pending, _) = l.walk(&format!("{base}/{sid}/holders"), 2).await;
    assert_eq!(pending, expected);

    // Final: the chain's finalized block passes the record date (Anvil: head − 64).
    l.chain.provider().anvil_mine(Some(70), None).await.unwrap();
    l.catch_up().await;
    let s = env.get(&env.key_a, &format!("{base}/{sid}")).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.body["state"], "final", "{:?}", s.body);
    assert_eq!(s.body["pendingReason"], Value::Null);
    assert_eq!(s.body["holderCount"], expected.len() as u64);
    let supply = l
        .token()
        .totalSupply()
        .block(BlockId::number(record))
        .call()
        .await
        .unwrap();
    assert_eq!(s.body["totalBaseUnits"], supply.to_string());
    let (sealed, pages) = l.walk(&format!("{base}/{sid}/holders"), 1).await;
    assert_eq!(sealed, expected);
    assert!(pages.iter().all(|p| p["snapshot"]["state"] == "final"));

    let csv = env.get(&env.key_a, &export).await;
    assert_eq!(csv.status, StatusCode::OK);
    assert!(
        csv.header("content-type")
            .unwrap_or_default()
            .starts_with("text/csv")
    );
    let digest = Sha256::digest(&csv.raw);
    assert_eq!(
        s.body["contentHash"],
        format!("0x{}", alloy::hex::encode(digest))
    );
    use base64::Engine as _;
    assert_eq!(
        csv.header("repr-digest"),
        Some(
            format!(
                "sha-256=:{}:",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
            .as_str()
        )
    );
    let text = String::from_utf8(csv.raw.clone()).unwrap();
    let mut by_address: Vec<(Address, String)> = expected
        .iter()
        .map(|(a, b)| (a.parse().unwrap(), b.clone()))
        .collect();
    by_address.sort_by_key(|(a, _)| *a);
    let mut want = "holder,balance\n".to_owned();
    for (a, b) in &by_address {
        want.push_str(&format!("{},{b}\n", a.to_checksum(None)));
    }
    assert_eq!(text, want);

    let list = env.get(&env.key_a, &base).await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.body["data"][0]["id"], sid.as_str());
    // Organization B sees neither the asset's snapshots nor this one.
    for uri in [format!("{base}/{sid}"), export.clone(), base.clone()] {
        assert_problem(&env.get(&env.key_b, &uri).await, 404, "NOT_FOUND", &uri);
    }
    // A snapshot id of no snapshot, and a malformed one.
    assert_problem(
        &env.get(&env.key_a, &format!("{base}/{}", Uuid::new_v4()))
            .await,
        404,
        "NOT_FOUND",
        "unknown snapshot",
    );
    assert_problem(
        &env.get(&env.key_a, &format!("{base}/nope")).await,
        404,
        "NOT_FOUND",
        "unknown snapshot",
    );
    let bad = env
        .post(&env.key_a, &base, None, &json!({"atBlock": "ten"}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{:?}", bad.body);
}
