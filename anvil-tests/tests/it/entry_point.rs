//! ERC-4337 EntryPoint v0.8: canonical address, idempotent deployment, the
//! `EntryPointReference`, and `getUserOpHash` (EIP-712, chain-bound).

use alloy::eips::BlockId;
use alloy::primitives::{Address, B256, Bytes, U256, address, b256, keccak256};
use alloy::providers::Provider;
use alloy::sol_types::SolValue;
use anvil_tests::keel_abi::bindings::EntryPointReference;
use anvil_tests::keel_abi::erc4337::{
    CANONICAL_SALT, CREATE2_DEPLOYER, ENTRY_POINT_V08, IEntryPointV08, ISimpleAccountFactory,
    artifacts_dir, deploy_create2, deploy_v08,
};
use anvil_tests::{TestChain, deploy_keel, workspace_root};

/// EntryPoint v0.8's published address.
const CANONICAL_V08: Address = address!("0x4337084D9E255Ff0702461CF8895CE9E3b5Ff108");

fn artifact_field(name: &str, field: &str) -> anyhow::Result<Bytes> {
    let path = artifacts_dir(&workspace_root()).join(format!("{name}.json"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let hex = json[field]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("{} has no {field}", path.display()))?;
    Ok(hex.parse()?)
}

#[tokio::test]
async fn entry_point_lands_at_the_canonical_address_and_the_reference_points_at_it()
-> anyhow::Result<()> {
    // The constant, and the address computed from deployer + salt + artifact bytecode.
    assert_eq!(ENTRY_POINT_V08, CANONICAL_V08);
    assert_eq!(
        CREATE2_DEPLOYER,
        address!("0x4e59b44847b379578588920cA78FbF26c0B4956C")
    );
    assert_eq!(
        CANONICAL_SALT,
        b256!("0x0a59dbff790c23c976a548690c27297883cc66b4c67024f9117b0238995e35e9")
    );
    let init_code = artifact_field("EntryPoint", "bytecode")?;
    assert_eq!(
        CREATE2_DEPLOYER.create2_from_code(CANONICAL_SALT, &init_code),
        CANONICAL_V08
    );

    let chain = TestChain::start().await?;
    let p = chain.provider();
    assert!(
        !p.get_code_at(CREATE2_DEPLOYER).await?.is_empty(),
        "Anvil predeploys the CREATE2 deployer"
    );
    assert!(p.get_code_at(CANONICAL_V08).await?.is_empty());
    let d = deploy_keel(&chain).await?;
    assert_eq!(d.entry_point, CANONICAL_V08);
    let code = p.get_code_at(CANONICAL_V08).await?;
    assert_eq!(
        code.len(),
        artifact_field("EntryPoint", "deployedBytecode")?.len()
    );

    // Gas of the EntryPoint deployment: the first transaction of the chain.
    let receipts = p
        .get_block_receipts(BlockId::number(1))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no receipts for block 1"))?;
    assert_eq!(receipts.len(), 1);
    assert_eq!(receipts[0].to, Some(CREATE2_DEPLOYER));
    eprintln!(
        "EntryPoint v0.8 deployment used {} gas",
        receipts[0].gas_used
    );

    let reference = EntryPointReference::new(d.entry_point_reference, p.clone());
    assert_eq!(reference.entryPoint().call().await?, CANONICAL_V08);

    // The EntryPoint is alive: its SenderCreator has code; the factory answers.
    let ep = IEntryPointV08::new(CANONICAL_V08, p.clone());
    let sender_creator = ep.senderCreator().call().await?;
    assert!(!p.get_code_at(sender_creator).await?.is_empty());
    assert_eq!(
        ep.getNonce(chain.account(1)?, alloy::primitives::aliases::U192::ZERO)
            .call()
            .await?,
        U256::ZERO
    );
    let factory = ISimpleAccountFactory::new(d.simple_account_factory, p.clone());
    assert!(!p.get_code_at(d.simple_account_factory).await?.is_empty());
    let implementation = factory.accountImplementation().call().await?;
    assert!(!p.get_code_at(implementation).await?.is_empty());
    let account = factory
        .getAddress(chain.account(1)?, U256::ZERO)
        .call()
        .await?;
    assert_ne!(account, Address::ZERO);
    assert_ne!(
        account,
        factory
            .getAddress(chain.account(1)?, U256::from(1))
            .call()
            .await?
    );
    Ok(())
}

#[tokio::test]
async fn deploying_the_entry_point_twice_sends_nothing() -> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let p = chain.provider();
    let from = chain.account(0)?;
    let artifacts = artifacts_dir(&workspace_root());
    let first = deploy_v08(p, from, &artifacts).await?;
    assert_eq!(first.entry_point, CANONICAL_V08);
    let (nonce, block) = (
        p.get_transaction_count(from).await?,
        chain.block_number().await?,
    );
    assert_eq!(
        nonce, 2,
        "one transaction each for the EntryPoint and the factory"
    );

    let again = deploy_v08(p, from, &artifacts).await?;
    assert_eq!(again, first);
    let init_code = artifact_field("EntryPoint", "bytecode")?;
    let (address, deployed) = deploy_create2(p, from, CANONICAL_SALT, &init_code, "again").await?;
    assert_eq!((address, deployed), (CANONICAL_V08, false));
    assert_eq!(
        p.get_transaction_count(from).await?,
        nonce,
        "the second deployment sent nothing"
    );
    assert_eq!(chain.block_number().await?, block, "and mined nothing");
    Ok(())
}

/// The v0.8 `getUserOpHash` computed in Rust: EIP-712 with domain
/// `("ERC4337", "1", chainId, entryPoint)` over the op without its signature, dynamic
/// fields hashed (`UserOperationLib.PACKED_USEROP_TYPEHASH`); no EIP-7702 override when
/// `initCode` does not start with the 0x7702 marker.
fn expected_user_op_hash(
    op: &IEntryPointV08::PackedUserOperation,
    entry_point: Address,
    chain_id: u64,
) -> B256 {
    let type_hash = keccak256(
        "PackedUserOperation(address sender,uint256 nonce,bytes initCode,bytes callData,\
         bytes32 accountGasLimits,uint256 preVerificationGas,bytes32 gasFees,bytes paymasterAndData)",
    );
    let struct_hash = keccak256(
        (
            type_hash,
            op.sender,
            op.nonce,
            keccak256(&op.initCode),
            keccak256(&op.callData),
            op.accountGasLimits,
            op.preVerificationGas,
            op.gasFees,
            keccak256(&op.paymasterAndData),
        )
            .abi_encode(),
    );
    let domain_type = keccak256(
        "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)",
    );
    let domain_separator = keccak256(
        (
            domain_type,
            keccak256("ERC4337"),
            keccak256("1"),
            U256::from(chain_id),
            entry_point,
        )
            .abi_encode(),
    );
    let mut digest = Vec::with_capacity(66);
    digest.extend_from_slice(&[0x19, 0x01]);
    digest.extend_from_slice(domain_separator.as_slice());
    digest.extend_from_slice(struct_hash.as_slice());
    keccak256(digest)
}

fn pack(high: u128, low: u128) -> B256 {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&high.to_be_bytes());
    out[16..].copy_from_slice(&low.to_be_bytes());
    B256::from(out)
}

#[tokio::test]
async fn get_user_op_hash_is_eip712_over_the_op_and_the_chain() -> anyhow::Result<()> {
    let (a, b) = tokio::join!(
        TestChain::start(),
        TestChain::builder().chain_id(8_453_001).start()
    );
    let (a, b) = (a?, b?);
    let artifacts = artifacts_dir(&workspace_root());
    let (da, db) = tokio::join!(
        deploy_v08(a.provider(), a.account(0)?, &artifacts),
        deploy_v08(b.provider(), b.account(0)?, &artifacts)
    );
    assert_eq!(da?.entry_point, CANONICAL_V08);
    assert_eq!(
        db?.entry_point, CANONICAL_V08,
        "same address on every chain"
    );
    let ep_a = IEntryPointV08::new(CANONICAL_V08, a.provider().clone());
    let ep_b = IEntryPointV08::new(CANONICAL_V08, b.provider().clone());

    let op = IEntryPointV08::PackedUserOperation {
        sender: a.account(1)?,
        nonce: U256::ZERO,
        initCode: Bytes::new(),
        callData: Bytes::from_static(&[0xb6, 0x1d, 0x27, 0xf6, 0x01, 0x02]),
        accountGasLimits: pack(150_000, 300_000),
        preVerificationGas: U256::from(50_000),
        gasFees: pack(1_000_000_000, 20_000_000_000),
        paymasterAndData: Bytes::new(),
        signature: Bytes::from_static(&[0xaa; 65]),
    };
    let h0 = ep_a.getUserOpHash(op.clone()).call().await?;
    assert_ne!(h0, B256::ZERO);
    assert_eq!(h0, expected_user_op_hash(&op, CANONICAL_V08, 31_337));

    // A different nonce: a different hash.
    let next = IEntryPointV08::PackedUserOperation {
        nonce: U256::from(1),
        ..op.clone()
    };
    let h1 = ep_a.getUserOpHash(next.clone()).call().await?;
    assert_ne!(h1, h0);
    assert_eq!(h1, expected_user_op_hash(&next, CANONICAL_V08, 31_337));

    // The signature is not covered (it signs the hash).
    let resigned = IEntryPointV08::PackedUserOperation {
        signature: Bytes::from_static(&[0xbb; 65]),
        ..op.clone()
    };
    assert_eq!(ep_a.getUserOpHash(resigned).call().await?, h0);

    // Same op, same EntryPoint address, another chain id: another hash.
    let hb = ep_b.getUserOpHash(op.clone()).call().await?;
    assert_ne!(hb, h0);
    assert_eq!(hb, expected_user_op_hash(&op, CANONICAL_V08, 8_453_001));
    Ok(())
}
