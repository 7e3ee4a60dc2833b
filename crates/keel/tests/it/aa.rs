//! ERC-4337 through the binary: the three roles as processes (real PostgreSQL, real
//! Anvil with EntryPoint v0.8 deployed by `keel chain bootstrap --deploy-erc4337`), a
//! sponsored transfer of a Keel asset from a fresh smart account with no ETH through
//! the bundler's JSON-RPC route, a `kill -9` of the runner between acceptance and
//! inclusion, and the paymaster's deposit runway in `GET /v1/funding-requests`.

use crate::common::stack::{Procs, dev_key};

use alloy::primitives::{Address, B256, U256, aliases::U192};
use alloy::providers::Provider;
use alloy::rpc::types::Filter;
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::{SolCall, SolEvent};
use anvil_tests::TestChain;
use keel_abi::bindings::AssetToken;
use keel_abi::erc4337::{IEntryPointV08, ISimpleAccount, ISimpleAccountFactory};
use serde_json::{Value, json};
use std::time::Duration;

/// The full stack ([`Procs`]) with organization `acme`'s key, template `std`, and the
/// bootstrap's SimpleAccountFactory and SponsorPaymaster.
struct Stack {
    procs: Procs,
    key: String,
    factory: Address,
    paymaster: Address,
}

impl std::ops::Deref for Stack {
    type Target = Procs;
    fn deref(&self) -> &Procs {
        &self.procs
    }
}

impl std::ops::DerefMut for Stack {
    fn deref_mut(&mut self) -> &mut Procs {
        &mut self.procs
    }
}

impl Stack {
    async fn start() -> Stack {
        let chain = TestChain::builder().start().await.unwrap();
        let key0 = dev_key(&chain, 0);
        let specific: Vec<(String, String)> = vec![
            ("KEEL__AA__BUNDLERPOLLMS".into(), "100".into()),
            // Issue 33 §2: an operation is reported once its block is final; Anvil's
            // head is final here (its `finalized` tag lags 64 blocks behind a head that
            // moves only when transactions arrive).
            ("KEEL__CHAINS__LOCAL__FINALITYDEPTH".into(), "0".into()),
            // The bootstrap funds the paymaster's deposit with 1 ETH: below 2 ETH the
            // runway check (every second) opens a funding request.
            (
                "KEEL__AA__RUNWAYMINIMUMWEI".into(),
                "2000000000000000000".into(),
            ),
            ("KEEL__AA__RUNWAYINTERVALSECS".into(), "1".into()),
            // The bootstrap's sponsor signer is the deployer.
            ("KEEL_SPONSOR_KEY".into(), key0),
        ];
        let mut stack = Stack {
            procs: Procs::new(chain, tempfile::tempdir().unwrap(), specific).await,
            key: String::new(),
            factory: Address::ZERO,
            paymaster: Address::ZERO,
        };
        let out = stack.bootstrap();
        stack.factory = out
            .lines()
            .find_map(|l| l.strip_prefix("erc4337  SimpleAccountFactory"))
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("no SimpleAccountFactory in the bootstrap output: {out}"));
        stack.cli(&["org", "create", "--name", "acme"]);
        stack.key = stack.cli(&["api-key", "create", "--org", "acme", "--label", "a"]);
        stack.cli(&[
            "template",
            "set",
            "--org",
            "acme",
            "--id",
            "std",
            "--chain",
            "local",
            "--staleness-bound-seconds",
            "86400",
        ]);
        let pm: Vec<u8> = sqlx::query_scalar(
            "SELECT address FROM platform_contract WHERE name = 'sponsorPaymaster'",
        )
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
        stack.paymaster = Address::from_slice(&pm);
        stack.start_roles().await;
        stack
    }

    /// `GET path` with acme's key (checked against the OpenAPI document).
    async fn get(&self, path: &str) -> (u16, Value) {
        self.procs.get(&self.key, path).await
    }

    /// `POST path` with acme's key (checked against the OpenAPI document).
    async fn post(&self, path: &str, idem: &str, body: Value) -> (u16, Value) {
        self.procs.post(&self.key, path, idem, body).await
    }

    /// One JSON-RPC call of the bundler route; the whole response.
    async fn rpc(&self, method: &str, params: Value) -> Value {
        let chain = self.chain.chain_id();
        let r = self
            .http
            .post(format!("{}/v1/chains/{chain}/bundler", self.api))
            .bearer_auth(&self.key)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.json().await.unwrap()
    }

    async fn await_op(&self, id: &str) -> Value {
        self.until(Duration::from_secs(120), "operation end", || async {
            let (_, v) = self.get(&format!("/v1/operations/{id}")).await;
            matches!(v["state"].as_str(), Some("completed" | "failed")).then_some(v)
        })
        .await
    }

    /// The EntryPoint (the bootstrap deploys v0.8 at its canonical address).
    fn entry_point(&self) -> Address {
        keel_abi::erc4337::ENTRY_POINT_V08
    }

    async fn user_op_events(&self, hash: B256) -> usize {
        let filter = Filter::new()
            .address(self.entry_point())
            .event_signature(IEntryPointV08::UserOperationEvent::SIGNATURE_HASH)
            .topic1(hash)
            .from_block(0);
        self.chain.provider().get_logs(&filter).await.unwrap().len()
    }

    async fn ep_nonce(&self, sender: Address) -> U256 {
        IEntryPointV08::new(self.entry_point(), self.chain.provider().clone())
            .getNonce(sender, U192::ZERO)
            .call()
            .await
            .unwrap()
    }

    /// A sponsored, signed transfer of `amount` base units of `token` from `owner`'s
    /// SimpleAccount `sender` (created by the operation when `nonce` is 0), the way a
    /// wallet builds it against the bundler route: paymaster stub, gas estimate,
    /// paymaster data, then the owner's signature over the hash.
    async fn sponsored_transfer(
        &self,
        owner: &PrivateKeySigner,
        sender: Address,
        nonce: u64,
        token: Address,
        to: Address,
        amount: U256,
    ) -> (Value, B256) {
        let chain_hex = format!("{:#x}", self.chain.chain_id());
        let ep = self.entry_point();
        let transfer = AssetToken::transferCall { to, value: amount }.abi_encode();
        let call_data = ISimpleAccount::executeCall {
            dest: token,
            value: U256::ZERO,
            func: transfer.into(),
        }
        .abi_encode();
        let mut op = json!({
            "sender": sender,
            "nonce": format!("{nonce:#x}"),
            "callData": alloy::hex::encode_prefixed(call_data),
            "maxFeePerGas": "0x2540be400",
            "maxPriorityFeePerGas": "0x3b9aca00",
        });
        if nonce == 0 {
            let factory_data = ISimpleAccountFactory::createAccountCall {
                owner: owner.address(),
                salt: U256::ZERO,
            }
            .abi_encode();
            op["factory"] = json!(self.factory);
            op["factoryData"] = json!(alloy::hex::encode_prefixed(factory_data));
        }
        let stub = self
            .rpc("pm_getPaymasterStubData", json!([op, ep, chain_hex, {}]))
            .await;
        for k in [
            "paymaster",
            "paymasterData",
            "paymasterVerificationGasLimit",
            "paymasterPostOpGasLimit",
        ] {
            assert!(!stub["result"][k].is_null(), "{stub}");
            op[k] = stub["result"][k].clone();
        }
        let est = self
            .rpc("eth_estimateUserOperationGas", json!([op, ep]))
            .await;
        for k in ["preVerificationGas", "verificationGasLimit", "callGasLimit"] {
            assert!(est["result"][k].is_string(), "{est}");
            op[k] = est["result"][k].clone();
        }
        let data = self
            .rpc("pm_getPaymasterData", json!([op, ep, chain_hex, {}]))
            .await;
        assert_eq!(
            data["result"]["paymaster"],
            self.paymaster.to_checksum(None),
            "{data}"
        );
        op["paymasterData"] = data["result"]["paymasterData"].clone();
        op["signature"] = json!("0x");
        let parsed: keel_aa::UserOperation = serde_json::from_value(op.clone()).unwrap();
        let pool = keel_chain::UpstreamPool::new(
            keel_units::ChainId(self.chain.chain_id()),
            keel_chain::UpstreamConfig::new(vec![self.chain.endpoint().to_string()]),
        )
        .unwrap();
        let directory: Vec<u8> =
            sqlx::query_scalar("SELECT address FROM platform_contract WHERE name = 'directory'")
                .fetch_one(self.db.pool())
                .await
                .unwrap();
        let resolution = keel_aa::resolve_entry_point(&pool, Address::from_slice(&directory))
            .await
            .unwrap();
        assert_eq!(resolution.resolved.address(), ep);
        let hash = parsed.hash_v08(&resolution.resolved).unwrap();
        op["signature"] = json!(alloy::hex::encode_prefixed(
            owner.sign_hash_sync(&hash).unwrap().as_bytes()
        ));
        (op, hash)
    }

    /// Waits for `eth_getUserOperationReceipt` to answer a receipt.
    async fn receipt(&self, hash: B256) -> Value {
        self.until(
            Duration::from_secs(120),
            "the user operation receipt",
            || async {
                let r = self.rpc("eth_getUserOperationReceipt", json!([hash])).await;
                (!r["result"].is_null()).then(|| r["result"].clone())
            },
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sponsored_transfer_from_a_fresh_smart_account_lands_once_even_across_a_runner_kill() {
    let mut stack = Stack::start().await;
    let provider = stack.chain.provider().clone();
    // A Keel asset, minted through the API to a counterfactual SimpleAccount.
    let (status, body) = stack
        .post(
            "/v1/assets",
            "aa-asset",
            json!({"name": "Sponsored Fund", "symbol": "SPON", "decimals": 6,
                   "templateId": "std", "initialPrice": "100"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let view = stack.await_op(body["id"].as_str().unwrap()).await;
    assert_eq!(view["state"], "completed", "{view}");
    let token: Address = view["result"]["tokenAddress"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let asset = body["assetId"].as_str().unwrap().to_owned();
    let owner = PrivateKeySigner::random();
    let sender = ISimpleAccountFactory::new(stack.factory, provider.clone())
        .getAddress(owner.address(), U256::ZERO)
        .call()
        .await
        .unwrap();
    let (status, body) = stack
        .post(
            &format!("/v1/assets/{asset}/mint"),
            "aa-mint",
            json!({"recipient": sender.to_string(), "amount": "100"}),
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {body}");
    let view = stack.await_op(body["id"].as_str().unwrap()).await;
    assert_eq!(view["state"], "completed", "{view}");
    let token_of = AssetToken::new(token, provider.clone());
    assert_eq!(
        token_of.balanceOf(sender).call().await.unwrap(),
        U256::from(100_000_000u64)
    );
    assert_eq!(provider.get_balance(sender).await.unwrap(), U256::ZERO);
    assert!(provider.get_code_at(sender).await.unwrap().is_empty());

    // 1. Sponsored transfer of 25 tokens, created through initCode, over JSON-RPC.
    let alice = Address::with_last_byte(0xa1);
    let (op, hash) = stack
        .sponsored_transfer(&owner, sender, 0, token, alice, U256::from(25_000_000u64))
        .await;
    let sent = stack
        .rpc("eth_sendUserOperation", json!([op, stack.entry_point()]))
        .await;
    assert_eq!(sent["result"], json!(hash), "{sent}");
    let receipt = stack.receipt(hash).await;
    assert_eq!(receipt["success"], true, "{receipt}");
    assert_eq!(
        receipt["paymaster"],
        stack.paymaster.to_checksum(None),
        "{receipt}"
    );
    assert_eq!(receipt["sender"], sender.to_checksum(None));
    // Only this operation's logs: the token's Transfer of 25 tokens.
    let transfers: Vec<&Value> = receipt["logs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["topics"][0] == json!(AssetToken::Transfer::SIGNATURE_HASH))
        .collect();
    assert_eq!(transfers.len(), 1, "{receipt}");
    assert_eq!(stack.user_op_events(hash).await, 1);
    assert_eq!(stack.ep_nonce(sender).await, U256::from(1));
    assert_eq!(
        token_of.balanceOf(alice).call().await.unwrap(),
        U256::from(25_000_000u64)
    );
    assert_eq!(
        token_of.balanceOf(sender).call().await.unwrap(),
        U256::from(75_000_000u64)
    );
    assert_eq!(provider.get_balance(sender).await.unwrap(), U256::ZERO);
    let (status, rest) = stack.get(&format!("/v1/user-operations/{hash}")).await;
    assert_eq!(status, 200, "{rest}");
    assert_eq!(rest["state"], "included", "{rest}");
    // A resend answers the same hash and lands nothing more.
    let again = stack
        .rpc("eth_sendUserOperation", json!([op, stack.entry_point()]))
        .await;
    assert_eq!(again["result"], json!(hash), "{again}");

    // 2. kill -9 of the runner between acceptance and inclusion: the chain stops
    // mining, the bundle is enqueued and broadcast, the runner dies; a new runner
    // finishes it once the chain mines again.
    provider
        .raw_request::<_, Value>("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let bob = Address::with_last_byte(0xb0);
    let (op, hash2) = stack
        .sponsored_transfer(&owner, sender, 1, token, bob, U256::from(5_000_000u64))
        .await;
    let sent = stack
        .rpc("eth_sendUserOperation", json!([op, stack.entry_point()]))
        .await;
    assert_eq!(sent["result"], json!(hash2), "{sent}");
    stack
        .until(
            Duration::from_secs(60),
            "the bundle in the mempool",
            || async {
                let (_, v) = stack.get(&format!("/v1/user-operations/{hash2}")).await;
                let pool: Value = provider
                    .raw_request("txpool_status".into(), ())
                    .await
                    .ok()?;
                let pending = pool["pending"]
                    .as_str()
                    .and_then(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).ok())
                    .or_else(|| pool["pending"].as_u64())
                    .unwrap_or(0);
                (v["state"] == "bundled" && pending > 0).then_some(())
            },
        )
        .await;
    stack.kill9("runner");
    stack.spawn("runner");
    provider
        .raw_request::<_, Value>("evm_setAutomine".into(), (true,))
        .await
        .unwrap();
    provider
        .raw_request::<_, Value>("evm_mine".into(), ())
        .await
        .unwrap();
    let receipt = stack.receipt(hash2).await;
    assert_eq!(receipt["success"], true, "{receipt}");
    assert_eq!(
        stack.user_op_events(hash2).await,
        1,
        "exactly one inclusion"
    );
    assert_eq!(stack.ep_nonce(sender).await, U256::from(2));
    assert_eq!(
        token_of.balanceOf(bob).call().await.unwrap(),
        U256::from(5_000_000u64)
    );
    let bundles: i64 = sqlx::query_scalar("SELECT count(*) FROM aa_bundle")
        .fetch_one(stack.db.pool())
        .await
        .unwrap();
    assert_eq!(bundles, 2, "one bundle per operation, none repeated");
    assert_eq!(provider.get_balance(sender).await.unwrap(), U256::ZERO);

    // 3. The paymaster's deposit (1 ETH less the two operations) is below the runway
    // minimum (2 ETH): a funding request naming the EntryPoint deposit.
    let list = stack
        .until(
            Duration::from_secs(60),
            "the deposit funding request",
            || async {
                let (status, v) = stack.get("/v1/funding-requests").await;
                assert_eq!(status, 200, "{v}");
                (!v["entryPointDeposits"].as_array()?.is_empty()).then_some(v)
            },
        )
        .await;
    let d = &list["entryPointDeposits"][0];
    assert_eq!(
        d["entryPoint"],
        stack.entry_point().to_checksum(None),
        "{d}"
    );
    assert_eq!(d["paymaster"], stack.paymaster.to_checksum(None), "{d}");
    assert_eq!(d["minimumWei"], "2000000000000000000", "{d}");
    let deposit: U256 = IEntryPointV08::new(stack.entry_point(), provider.clone())
        .balanceOf(stack.paymaster)
        .call()
        .await
        .unwrap();
    assert!(
        deposit < U256::from(1_000_000_000_000_000_000u128),
        "the operations were paid from the deposit"
    );
}
