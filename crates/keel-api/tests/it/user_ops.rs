//! ERC-4337 user operations (issue 20): the bundler JSON-RPC route and the REST routes,
//! over a real Anvil chain with Keel's platform and EntryPoint v0.8 (the durable flow
//! itself is tested in keel-aa: `crates/keel-aa/tests/durable.rs`).

use crate::common::{Env, assert_problem};
use alloy::primitives::Address;
use anvil_tests::{TestChain, deploy_keel};
use keel_aa::flow::{AaChain, AaEnv};
use keel_aa::service::AaService;
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_txq::{TxQueue, TxQueueConfig};
use keel_units::ChainId;
use serde_json::{Value, json};
use std::sync::Arc;

async fn served() -> (Env, TestChain, anvil_tests::Deployed) {
    let mut env = Env::new().await;
    let chain = TestChain::start().await.unwrap();
    let deployed = deploy_keel(&chain).await.unwrap();
    let pool = Arc::new(
        UpstreamPool::new(
            ChainId(chain.chain_id()),
            UpstreamConfig::new(vec![chain.endpoint().to_string()]),
        )
        .unwrap(),
    );
    let queue = Arc::new(
        TxQueue::new(
            env.db.pool().clone(),
            pool.clone(),
            TxQueueConfig::default(),
        )
        .unwrap(),
    );
    let aa = Arc::new(AaEnv {
        db: env.db.pool().clone(),
        later_chains: Default::default(),
        chains: [(
            chain.chain_id(),
            AaChain {
                pool,
                queue,
                directory: deployed.directory,
                bundler: chain.account(1).unwrap(),
                policy: None,
                organization_policies: Default::default(),
                beneficiary: None,
                sponsor: None,
                admission: Default::default(),
            },
        )]
        .into_iter()
        .collect(),
    });
    env.serve_user_operations(AaService::new(aa, env.engine.clone()));
    (env, chain, deployed)
}

/// An operation of a fresh account with no ETH, no paymaster and no code: the
/// EntryPoint refuses it (AA20 or AA21).
fn unfunded_op(sender: Address) -> Value {
    json!({
        "sender": sender,
        "nonce": "0x0",
        "callData": "0x",
        "callGasLimit": "0x10000",
        "verificationGasLimit": "0x10000",
        "preVerificationGas": "0x10000",
        "maxFeePerGas": "0x3b9aca00",
        "maxPriorityFeePerGas": "0x3b9aca00",
        "signature": "0x"
    })
}

async fn rpc(env: &Env, key: &str, chain: u64, method: &str, params: Value) -> Value {
    let a = env
        .post(
            key,
            &format!("/v1/chains/{chain}/bundler"),
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}),
        )
        .await;
    assert_eq!(a.status.as_u16(), 200, "{method}: {:?}", a.body);
    a.body
}

#[tokio::test]
async fn the_bundler_route_answers_json_rpc_with_erc_7769_codes() {
    let (env, chain, deployed) = served().await;
    let id = chain.chain_id();
    let r = rpc(&env, &env.key_a, id, "eth_chainId", json!([])).await;
    assert_eq!(r["result"], format!("{id:#x}"));
    let r = rpc(&env, &env.key_a, id, "eth_supportedEntryPoints", json!([])).await;
    assert_eq!(r["result"], json!([deployed.entry_point.to_checksum(None)]));
    // The configured reference is refused for submission: -32602, rebuild and re-sign.
    let r = rpc(
        &env,
        &env.key_a,
        id,
        "eth_sendUserOperation",
        json!([
            unfunded_op(Address::with_last_byte(9)),
            deployed.entry_point_reference
        ]),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // The EntryPoint refuses an unfunded account without code: -32500 with the reason.
    let r = rpc(
        &env,
        &env.key_a,
        id,
        "eth_sendUserOperation",
        json!([
            unfunded_op(Address::with_last_byte(9)),
            deployed.entry_point
        ]),
    )
    .await;
    assert_eq!(r["error"]["code"], -32500, "{r}");
    assert!(
        r["error"]["data"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("AA2"),
        "{r}"
    );
    let r = rpc(
        &env,
        &env.key_a,
        id,
        "eth_getUserOperationReceipt",
        json!([format!("0x{}", "11".repeat(32))]),
    )
    .await;
    assert_eq!(r["result"], Value::Null);
    // An unserved chain is 404; no key is 401.
    let a = env
        .post(
            &env.key_a,
            "/v1/chains/1/bundler",
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}),
        )
        .await;
    assert_problem(&a, 404, "NOT_FOUND", "unserved chain");
    let a = env
        .post(
            "nope",
            &format!("/v1/chains/{id}/bundler"),
            None,
            &json!({}),
        )
        .await;
    assert_problem(&a, 401, "UNAUTHENTICATED", "no key");
}

#[tokio::test]
async fn rest_submission_refuses_with_typed_codes_and_reads_by_hash() {
    let (env, chain, deployed) = served().await;
    let id = chain.chain_id();
    let body =
        |ep: Address, op: Value| json!({"chainId": id, "entryPoint": ep, "userOperation": op});
    let a = env
        .post(
            &env.key_a,
            "/v1/user-operations",
            None,
            &body(
                deployed.entry_point_reference,
                unfunded_op(Address::with_last_byte(9)),
            ),
        )
        .await;
    assert_problem(&a, 422, "ENTRY_POINT_NOT_RESOLVED", "reference");
    let a = env
        .post(
            &env.key_a,
            "/v1/user-operations",
            None,
            &body(
                deployed.entry_point,
                unfunded_op(Address::with_last_byte(9)),
            ),
        )
        .await;
    assert_problem(&a, 422, "USER_OPERATION_REJECTED", "unfunded");
    assert!(
        a.body["detail"].as_str().unwrap().contains("-32500"),
        "{:?}",
        a.body
    );
    let a = env
        .post(
            &env.key_a,
            "/v1/user-operations",
            None,
            &body(deployed.entry_point, json!({"sender": "0x12"})),
        )
        .await;
    assert_problem(&a, 422, "INVALID_FIELD", "malformed operation");
    // The detail names the field at fault, never its value (issue 33 §5).
    let detail = a.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("userOperation.sender"), "{detail}");
    assert!(!detail.contains("0x12"), "{detail}");
    let a = env
        .post(
            &env.key_a,
            "/v1/user-operations",
            None,
            &json!({"chainId": id}),
        )
        .await;
    assert_problem(&a, 400, "INVALID_FIELD", "missing members");
    let a = env
        .post(
            &env.key_a,
            "/v1/user-operations",
            None,
            &body(
                deployed.entry_point,
                unfunded_op(Address::with_last_byte(9)),
            )
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("chainId".into(), json!(1));
                Value::Object(o)
            })
            .unwrap(),
        )
        .await;
    assert_problem(&a, 422, "CHAIN_NOT_CONFIGURED", "unserved chain");
    let a = env
        .get(
            &env.key_a,
            &format!("/v1/user-operations/0x{}", "22".repeat(32)),
        )
        .await;
    assert_problem(&a, 404, "NOT_FOUND", "unknown hash");
    let a = env.get(&env.key_a, "/v1/user-operations/nothex").await;
    assert_problem(&a, 404, "NOT_FOUND", "malformed hash");
}

#[tokio::test]
async fn without_the_service_the_user_operation_routes_are_not_found() {
    let env = Env::new().await;
    let a = env
        .post(
            &env.key_a,
            "/v1/chains/31337/bundler",
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}),
        )
        .await;
    assert_problem(&a, 404, "NOT_FOUND", "bundler");
    let a = env
        .get(
            &env.key_a,
            &format!("/v1/user-operations/0x{}", "22".repeat(32)),
        )
        .await;
    assert_problem(&a, 404, "NOT_FOUND", "get");
}
