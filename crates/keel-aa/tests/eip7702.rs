//! Issue 33 §5, EIP-7702 accounts, against real Anvil (its default hardfork applies
//! EIP-7702) and real PostgreSQL: an externally owned account delegated to the
//! EntryPoint v0.8 `Simple7702Account` by an authorization its operation carries
//! (`eip7702Auth`) lands its first sponsored operation in a type-4 bundle transaction,
//! and its later operations without one; each broken authorization is refused at
//! `eth_sendUserOperation` with its field named (or by the EntryPoint when the chain
//! would skip it).

mod common;

use alloy::consensus::Transaction as _;
use alloy::eips::eip7702::Authorization;
use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::providers::Provider;
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use anvil_tests::keel_abi::erc4337::{Artifact, CANONICAL_SALT, artifacts_dir, deploy_create2};
use common::ETHER;
use common::flow::{Flow, refused};
use keel_aa::admission::AdmissionConfig;
use keel_aa::{EIP7702_MARKER, Eip7702Auth, UserOperation, store};
use keel_durable::RunStatus;
use serde_json::{Value, json};

/// The EIP-7702 delegation designator prefix of a delegated account's code.
const DELEGATION_PREFIX: [u8; 3] = [0xef, 0x01, 0x00];

/// Deploys the npm artifacts' `Simple7702Account` (no constructor) through the CREATE2
/// deployer; its address.
async fn deploy_simple_7702_account(f: &Flow) -> anyhow::Result<Address> {
    let artifact = Artifact::load(
        &artifacts_dir(&anvil_tests::workspace_root()).join("Simple7702Account.json"),
    )?;
    let (address, _) = deploy_create2(
        f.aa.provider(),
        f.aa.chain.account(0)?,
        CANONICAL_SALT,
        &artifact.bytecode,
        "deploy Simple7702Account",
    )
    .await?;
    Ok(address)
}

/// An authorization of `delegate` at `nonce` on `chain_id`, signed by `key`.
fn authorization(
    key: &PrivateKeySigner,
    chain_id: u64,
    delegate: Address,
    nonce: u64,
) -> Eip7702Auth {
    let auth = Authorization {
        chain_id: U256::from(chain_id),
        address: delegate,
        nonce,
    };
    let sig = key.sign_hash_sync(&auth.signature_hash()).expect("signs");
    Eip7702Auth {
        chain_id: auth.chain_id,
        address: delegate,
        nonce: U256::from(nonce),
        y_parity: U256::from(u8::from(sig.v())),
        r: sig.r(),
        s: sig.s(),
    }
}

/// A sponsored transfer of 1 base unit from the EOA `key` at EntryPoint nonce `nonce`,
/// with `edit` applied before sponsoring and signing (the account checks that the
/// operation hash is signed by its own address).
async fn eoa_op(
    f: &Flow,
    key: &PrivateKeySigner,
    nonce: u64,
    edit: impl FnOnce(&mut UserOperation),
) -> anyhow::Result<(UserOperation, B256)> {
    let mut op = f.aa.transfer_op(
        key.address(),
        key.address(),
        nonce,
        false,
        Address::with_last_byte(0x77),
        U256::from(1u64),
    );
    // The bundle of one, the calldata and the authorization's 25,000 gas.
    op.pre_verification_gas = U256::from(150_000u64);
    edit(&mut op);
    let (packed, hash) =
        f.aa.sponsor_and_sign(op.clone(), &f.aa.sponsor, key)
            .await?;
    let mut signed = packed.unpack()?;
    signed.eip7702_auth = op.eip7702_auth;
    Ok((signed, hash))
}

/// Waits for `hash`'s workflow to end; asserts it completed and the row is `included`.
async fn lands(f: &Flow, hash: B256) -> anyhow::Result<()> {
    let id = f.row(hash).await?.expect("row").instance_id;
    let s = f.settled(id).await?;
    assert_eq!(s.status, RunStatus::Completed, "{s:?}");
    assert_eq!(f.state(hash).await?, store::state::INCLUDED);
    Ok(())
}

/// The transaction that carried `hash` (`eth_getUserOperationReceipt`).
async fn bundle_tx_of(f: &Flow, hash: B256) -> anyhow::Result<alloy::rpc::types::Transaction> {
    let r = f.rpc("eth_getUserOperationReceipt", json!([hash])).await;
    let tx: B256 = serde_json::from_value(r["result"]["receipt"]["transactionHash"].clone())
        .map_err(|e| anyhow::anyhow!("no receipt: {r}: {e}"))?;
    f.aa.provider()
        .get_transaction_by_hash(tx)
        .await?
        .ok_or_else(|| anyhow::anyhow!("bundle transaction unknown"))
}

#[tokio::test]
async fn an_eip7702_account_lands_its_first_operation_in_a_type_4_bundle_then_more_without()
-> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    f.start_queue_and_bundler()?;
    let delegate = deploy_simple_7702_account(&f).await?;
    let chain_id = f.chain_id();

    for marker in [false, true] {
        // A fresh EOA with tokens and no ETH: the operation is sponsored.
        let key = PrivateKeySigner::random();
        let eoa = key.address();
        f.aa.mint(eoa, U256::from(10u64) * U256::from(ETHER))
            .await?;
        assert!(f.aa.provider().get_code_at(eoa).await?.is_empty());

        let auth = authorization(&key, if marker { 0 } else { chain_id }, delegate, 0);
        let (op, hash) = eoa_op(&f, &key, 0, |o| {
            o.eip7702_auth = Some(auth);
            if marker {
                // The v0.8 initCode marker: the hash commits to the delegate.
                o.factory = Some(EIP7702_MARKER);
            }
        })
        .await?;
        let r = f.send(&op).await;
        assert_eq!(r["result"], json!(hash), "{r}");
        lands(&f, hash).await?;

        // The bundle was a SetCode transaction carrying the account's authorization,
        // and the account is now delegated to Simple7702Account.
        let tx = bundle_tx_of(&f, hash).await?;
        assert_eq!(tx.inner.tx_type(), alloy::consensus::TxType::Eip7702);
        let list = tx
            .inner
            .authorization_list()
            .expect("an authorization list");
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].recover_authority()?, eoa);
        let mut code = DELEGATION_PREFIX.to_vec();
        code.extend_from_slice(delegate.as_slice());
        assert_eq!(f.aa.provider().get_code_at(eoa).await?, Bytes::from(code));
        assert_eq!(
            f.aa.token_balance(eoa).await?,
            U256::from(10u64) * U256::from(ETHER) - U256::from(1u64)
        );

        // The next operation needs no authorization: an EIP-1559 bundle.
        let (op, hash) = eoa_op(&f, &key, 1, |_| {}).await?;
        let r = f.send(&op).await;
        assert_eq!(r["result"], json!(hash), "{r}");
        lands(&f, hash).await?;
        let tx = bundle_tx_of(&f, hash).await?;
        assert_eq!(tx.inner.tx_type(), alloy::consensus::TxType::Eip1559);
        assert_eq!(
            f.aa.token_balance(eoa).await?,
            U256::from(10u64) * U256::from(ETHER) - U256::from(2u64)
        );
    }
    f.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn each_broken_authorization_is_refused_at_send() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let delegate = deploy_simple_7702_account(&f).await?;
    let chain_id = f.chain_id();
    let key = PrivateKeySigner::random();
    f.aa.mint(key.address(), U256::from(10u64) * U256::from(ETHER))
        .await?;
    let send_with = |auth: Eip7702Auth| {
        let f = &f;
        let key = key.clone();
        async move {
            let (op, _) = eoa_op(f, &key, 0, |o| o.eip7702_auth = Some(auth)).await?;
            anyhow::Ok(f.send(&op).await)
        }
    };

    // Signed by another key than the sender's: the authority must be the sender.
    let other = PrivateKeySigner::random();
    let r = send_with(authorization(&other, chain_id, delegate, 0)).await?;
    refused(&r, -32602, "eip7702Auth", "EIP7702_AUTH_NOT_SENDER");
    assert!(message(&r).contains("sender"), "{r}");

    // For another chain.
    let r = send_with(authorization(&key, chain_id + 1, delegate, 0)).await?;
    refused(&r, -32602, "eip7702Auth.chainId", "EIP7702_AUTH_CHAIN_ID");
    assert!(message(&r).to_lowercase().contains("chainid"), "{r}");

    // Out of range: yParity 27 (a pre-EIP-155 `v`), a high `s` (EIP-2).
    let good = authorization(&key, chain_id, delegate, 0);
    let high_s = Eip7702Auth {
        s: U256::from_str_radix(
            "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141",
            16,
        )? - good.s,
        y_parity: U256::from(1u8) - good.y_parity,
        ..good.clone()
    };
    for bad in [
        Eip7702Auth {
            y_parity: U256::from(27u8),
            ..good.clone()
        },
        high_s,
    ] {
        let r = send_with(bad).await?;
        refused(&r, -32602, "eip7702Auth", "EIP7702_AUTH_MALFORMED");
    }

    // A nonce that is not the account's: the chain would skip the authorization, the
    // sender would have no code, and the EntryPoint refuses the operation.
    let r = send_with(authorization(&key, chain_id, delegate, 2)).await?;
    assert_eq!(r["error"]["code"], -32500, "{r}");
    assert!(message(&r).contains("AA20"), "{r}");

    // Nothing was recorded, nothing delegated.
    assert_eq!(f.count("SELECT count(*) FROM aa_user_operation").await?, 0);
    assert!(f.aa.provider().get_code_at(key.address()).await?.is_empty());

    // The same operation with its good authorization is accepted.
    let r = send_with(good).await?;
    assert!(r["result"].is_string(), "{r}");
    f.shutdown().await;
    Ok(())
}

fn message(r: &Value) -> String {
    r["error"]["message"].as_str().unwrap_or("").to_owned()
}
