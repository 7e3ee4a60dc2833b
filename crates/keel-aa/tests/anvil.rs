//! keel-aa against a real Anvil with EntryPoint v0.8 at its canonical address.

mod common;

use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::providers::Provider;
use alloy::providers::ext::AnvilApi;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolInterface;
use anvil_tests::keel_abi::bindings::{AssetToken, Directory, SponsorPaymaster};
use anvil_tests::keel_abi::directory_key;
use anvil_tests::keel_abi::erc4337::{ENTRY_POINT_V08, IEntryPointV08};
use anvil_tests::keel_abi::platform::names;
use anvil_tests::proxy::{RpcProxy, Rule};
use anvil_tests::{TestChain, confirm, deploy_keel};
use common::{AaChain, ETHER, pool};
use keel_aa::user_op::eip7702_delegate_of;
use keel_aa::{
    AaCode, EIP7702_MARKER, EntryPointRejection, Erc7769Code, PackedUserOperation, ResolutionKind,
    ResolveError, resolve_address, resolve_entry_point, user_op_hash_v08, user_operation_receipt,
};

#[tokio::test]
async fn resolution_reference_resolves_direct_passes_through_and_faults_are_retryable()
-> anyhow::Result<()> {
    let chain = TestChain::start().await?;
    let d = deploy_keel(&chain).await?;
    let direct = pool(&chain, chain.endpoint().as_str());

    // The bootstrap records the EntryPoint itself: it passes through unchanged.
    let r = resolve_entry_point(&direct, d.directory).await?;
    assert_eq!(r.kind, ResolutionKind::Direct);
    assert_eq!(r.configured, ENTRY_POINT_V08);
    assert_eq!(r.resolved.address(), ENTRY_POINT_V08);

    // Record the EntryPointReference instead: it resolves to the EntryPoint.
    let dir = Directory::new(d.directory, chain.provider().clone());
    confirm(&dir.set(directory_key(names::ENTRY_POINT), d.entry_point_reference)).await?;
    let r = resolve_entry_point(&direct, d.directory).await?;
    assert_eq!(r.kind, ResolutionKind::Reference);
    assert_eq!(r.configured, d.entry_point_reference);
    assert_eq!(r.resolved.address(), ENTRY_POINT_V08);
    assert!(!r.accepts_for_submission(d.entry_point_reference));
    assert!(r.accepts_for_estimation(d.entry_point_reference));

    // An account without code is a configuration error, not a pass-through.
    let eoa = chain.account(5)?;
    let err = resolve_address(&direct, eoa).await.unwrap_err();
    assert!(matches!(err, ResolveError::NoCode { .. }), "{err}");
    assert!(!err.is_retryable());

    // Faults during the check: the entryPoint() probe fails at the transport level
    // (503), with a JSON-RPC internal error, or eth_getCode's answer is lost (504).
    let proxy = RpcProxy::start(chain.endpoint()).await?;
    let faulty = pool(&chain, proxy.url().as_str());
    let faults = [
        (Rule::fail_then_recover("eth_call", 1), "entryPoint() probe"),
        (
            Rule::error("eth_call", -32603, "internal error").times(1),
            "entryPoint() probe",
        ),
        (Rule::drop_response("eth_getCode").times(1), "eth_getCode"),
    ];
    for (rule, step) in faults {
        let id = proxy.add_rule(rule);
        let err = resolve_address(&faulty, d.entry_point_reference)
            .await
            .expect_err("a fault must not resolve (and never pass through)");
        assert!(err.is_retryable(), "{err}");
        match &err {
            ResolveError::Unavailable { step: s, .. } => assert_eq!(*s, step),
            other => panic!("expected Unavailable, got {other}"),
        }
        assert_eq!(err.code(), "entry_point_resolution_unavailable");
        assert_eq!(proxy.hits(id), 1);
        proxy.remove_rule(id);
        // The same request once the network recovers resolves to the EntryPoint.
        let r = resolve_address(&faulty, d.entry_point_reference).await?;
        assert_eq!(r.resolved.address(), ENTRY_POINT_V08);
        assert_eq!(r.kind, ResolutionKind::Reference);
    }
    Ok(())
}

/// A small deterministic generator (xorshift64*), so failures reproduce from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, max: usize) -> Bytes {
        let len = (self.next() as usize) % (max + 1);
        (0..len)
            .map(|_| self.next() as u8)
            .collect::<Vec<_>>()
            .into()
    }
    fn word(&mut self) -> B256 {
        let mut w = [0u8; 32];
        for chunk in w.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_be_bytes());
        }
        B256::from(w)
    }
    fn address(&mut self) -> Address {
        Address::from_slice(&self.word()[12..])
    }
}

#[tokio::test]
async fn v08_hash_equals_entry_point_get_user_op_hash_for_random_operations() -> anyhow::Result<()>
{
    const CASES: usize = 200;
    let chain = TestChain::start().await?;
    let d = deploy_keel(&chain).await?;
    let resolution =
        resolve_entry_point(&pool(&chain, chain.endpoint().as_str()), d.directory).await?;
    let ep = resolution.resolved;
    let contract = IEntryPointV08::new(ep.address(), chain.provider().clone());
    let mut rng = Rng(0x4337_0008_2026_1201);
    for case in 0..CASES {
        let init_code = match case % 4 {
            0 => Bytes::new(),
            _ => {
                let mut code = rng.address().to_vec();
                code.extend_from_slice(&rng.bytes(100));
                code.into()
            }
        };
        let paymaster_and_data = match case % 3 {
            0 => Bytes::new(),
            _ => {
                let mut data = rng.address().to_vec();
                data.extend_from_slice(rng.word().as_slice());
                data.extend_from_slice(&rng.bytes(120));
                data.into()
            }
        };
        let op = PackedUserOperation {
            sender: rng.address(),
            nonce: U256::from_be_bytes(rng.word().0),
            init_code,
            call_data: rng.bytes(300),
            account_gas_limits: rng.word(),
            pre_verification_gas: U256::from_be_bytes(rng.word().0),
            gas_fees: rng.word(),
            paymaster_and_data,
            signature: rng.bytes(70),
        };
        let local = user_op_hash_v08(&op, &ep, None)?;
        let onchain = contract.getUserOpHash(op.to_sol()).call().await?;
        assert_eq!(local, onchain, "case {case}: {op:?}");
        // The unpacked form hashes the same (pack ∘ unpack = id).
        assert_eq!(op.unpack()?.hash_v08(&ep)?, onchain, "case {case} unpacked");
    }

    // EIP-7702: the sender's code designates a delegate; initCode is the marker (with
    // and without trailing data). The EntryPoint reads the delegate from the code.
    for (case, tail) in [Bytes::new(), Bytes::from_static(&[0xde, 0xad, 0xbe, 0xef])]
        .into_iter()
        .enumerate()
    {
        let sender = rng.address();
        let delegate = rng.address();
        let mut designator = vec![0xef, 0x01, 0x00];
        designator.extend_from_slice(delegate.as_slice());
        chain
            .provider()
            .anvil_set_code(sender, designator.into())
            .await?;
        let code = chain.provider().get_code_at(sender).await?;
        assert_eq!(eip7702_delegate_of(&code), Some(delegate));
        let mut init_code = EIP7702_MARKER.to_vec();
        init_code.extend_from_slice(&tail);
        let op = PackedUserOperation {
            sender,
            nonce: U256::from(case),
            init_code: init_code.into(),
            call_data: rng.bytes(40),
            account_gas_limits: rng.word(),
            pre_verification_gas: U256::from(50_000u64),
            gas_fees: rng.word(),
            paymaster_and_data: Bytes::new(),
            signature: Bytes::new(),
        };
        let onchain = contract.getUserOpHash(op.to_sol()).call().await?;
        assert_eq!(
            user_op_hash_v08(&op, &ep, Some(delegate))?,
            onchain,
            "7702 case {case}"
        );
        assert_ne!(
            user_op_hash_v08(&op, &ep, Some(sender))?,
            onchain,
            "the delegate, not the sender, is hashed"
        );
    }
    Ok(())
}

#[tokio::test]
async fn sponsored_operations_from_fresh_accounts_in_one_bundle() -> anyhow::Result<()> {
    let aa = AaChain::start().await?;
    let ep = *aa.ep();
    let pm = SponsorPaymaster::new(aa.paymaster, aa.provider().clone());
    assert_eq!(pm.entryPoint().call().await?, ep.address());
    let dir = Directory::new(aa.deployed.directory, aa.provider().clone());
    assert_eq!(
        dir.get(directory_key(names::SPONSOR_PAYMASTER))
            .call()
            .await?,
        aa.paymaster,
        "the paymaster is recorded in the Directory"
    );
    let deposit_before = pm.getDeposit().call().await?;
    assert_eq!(deposit_before, U256::from(ETHER));

    // Three fresh accounts with tokens and no ETH: two transfer, one transfers more
    // than it holds (its call reverts, the operation is still included and paid).
    let owners: Vec<PrivateKeySigner> = (0..3).map(|_| PrivateKeySigner::random()).collect();
    let recipient = Address::with_last_byte(0x77);
    let mut senders = Vec::new();
    let mut ops = Vec::new();
    let mut hashes = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let sender = aa.account_of(owner.address()).await?;
        assert!(aa.provider().get_code_at(sender).await?.is_empty());
        aa.mint(sender, U256::from(1_000u64) * U256::from(ETHER))
            .await?;
        assert_eq!(aa.provider().get_balance(sender).await?, U256::ZERO);
        let amount = if i == 1 { 5_000u64 } else { 100 + i as u64 };
        let op = aa.transfer_op(
            owner.address(),
            sender,
            0,
            true,
            recipient,
            U256::from(amount) * U256::from(ETHER),
        );
        let (packed, hash) = aa.sponsor_and_sign(op, &aa.sponsor, owner).await?;
        let onchain = IEntryPointV08::new(ep.address(), aa.provider().clone())
            .getUserOpHash(packed.to_sol())
            .call()
            .await?;
        assert_eq!(hash, onchain);
        senders.push(sender);
        ops.push(packed);
        hashes.push(hash);
    }
    let receipt = aa.handle_ops(&ops).await?;

    let mut total_cost = U256::ZERO;
    for (i, hash) in hashes.iter().enumerate() {
        let r =
            user_operation_receipt(&receipt, &ep, *hash).expect("the bundle holds the operation");
        assert_eq!(r.sender, senders[i]);
        assert_eq!(r.paymaster, aa.paymaster);
        assert_eq!(r.nonce, U256::ZERO);
        assert!(r.account_deployed, "created through initCode");
        assert!(r.actual_gas_cost.get() > U256::ZERO);
        assert!(r.actual_gas_used > U256::ZERO);
        total_cost += r.actual_gas_cost.get();
        // Only this operation's logs: every Transfer in them is from this sender.
        let transfers: Vec<_> = r
            .logs
            .iter()
            .filter_map(|l| l.log_decode::<AssetToken::Transfer>().ok())
            .map(|l| l.inner.data)
            .collect();
        if i == 1 {
            assert!(!r.success);
            assert!(transfers.is_empty(), "a reverted call leaves no Transfer");
            let data = r.revert_reason.clone().expect("revert reason recorded");
            let decoded = AssetToken::AssetTokenErrors::abi_decode(&data)?;
            assert!(
                matches!(
                    decoded,
                    AssetToken::AssetTokenErrors::ERC20InsufficientBalance(_)
                ),
                "{decoded:?}"
            );
            assert!(r.revert_reason_text().is_some());
        } else {
            assert!(r.success, "operation {i}");
            assert_eq!(r.revert_reason, None);
            assert_eq!(transfers.len(), 1, "operation {i}: {:?}", r.logs);
            assert_eq!(transfers[0].from, senders[i]);
            assert_eq!(transfers[0].to, recipient);
        }
        // The account exists now and still holds no ETH: the paymaster paid.
        assert!(!aa.provider().get_code_at(senders[i]).await?.is_empty());
        assert_eq!(aa.provider().get_balance(senders[i]).await?, U256::ZERO);
    }
    // On chain: the recipient got 100 + 102 tokens, the reverting sender kept its 1,000,
    // and the paymaster's deposit paid exactly the three actual gas costs.
    assert_eq!(
        aa.token_balance(recipient).await?,
        U256::from(202u64) * U256::from(ETHER)
    );
    assert_eq!(
        aa.token_balance(senders[1]).await?,
        U256::from(1_000u64) * U256::from(ETHER)
    );
    assert_eq!(pm.getDeposit().call().await?, deposit_before - total_cost);
    // An operation that is not in the bundle has no receipt there.
    assert!(user_operation_receipt(&receipt, &ep, B256::repeat_byte(1)).is_none());
    Ok(())
}

#[tokio::test]
async fn a_bad_sponsor_signature_is_refused_aa34_signature_error() -> anyhow::Result<()> {
    let aa = AaChain::start().await?;
    let owner = PrivateKeySigner::random();
    let sender = aa.account_of(owner.address()).await?;
    aa.mint(sender, U256::from(10u64) * U256::from(ETHER))
        .await?;
    let op = aa.transfer_op(
        owner.address(),
        sender,
        0,
        true,
        Address::with_last_byte(0x78),
        U256::from(ETHER),
    );
    // Signed by a key that is not the paymaster's sponsor key.
    let impostor = PrivateKeySigner::random();
    let (packed, _) = aa.sponsor_and_sign(op.clone(), &impostor, &owner).await?;
    let data = aa
        .handle_ops_revert(&[packed])
        .await?
        .expect("handleOps reverts");
    let rejection = EntryPointRejection::decode(&data).expect("FailedOp");
    assert_eq!(rejection.op_index, 0);
    assert_eq!(rejection.aa, Some(AaCode(34)), "{}", rejection.reason);
    assert_eq!(rejection.erc7769(), Erc7769Code::InvalidSignature);
    assert_eq!(rejection.erc7769().code(), -32507);

    // A wrong account signature is AA24, also -32507.
    let (mut packed, _) = aa.sponsor_and_sign(op.clone(), &aa.sponsor, &owner).await?;
    packed.signature = alloy::signers::SignerSync::sign_hash_sync(&impostor, &B256::ZERO)?
        .as_bytes()
        .to_vec()
        .into();
    let data = aa.handle_ops_revert(&[packed]).await?.expect("reverts");
    let rejection = EntryPointRejection::decode(&data).expect("FailedOp");
    assert_eq!(rejection.aa, Some(AaCode(24)), "{}", rejection.reason);
    assert_eq!(rejection.erc7769().code(), -32507);

    // Correctly signed, the same operation goes through; nothing was spent before.
    let (packed, hash) = aa.sponsor_and_sign(op, &aa.sponsor, &owner).await?;
    let receipt = aa.handle_ops(&[packed]).await?;
    let r = user_operation_receipt(&receipt, aa.ep(), hash).expect("included");
    assert!(r.success);
    assert_eq!(
        aa.token_balance(Address::with_last_byte(0x78)).await?,
        U256::from(ETHER)
    );
    Ok(())
}

#[tokio::test]
async fn an_unfunded_paymaster_is_refused_aa31_paymaster_balance() -> anyhow::Result<()> {
    let mut aa = AaChain::start().await?;
    // A second SponsorPaymaster with no deposit, same sponsor key.
    let empty = anvil_tests::keel_abi::platform::deploy_sponsor_paymaster(
        aa.provider(),
        aa.deployed.directory,
        aa.ep().address(),
        aa.sponsor.address(),
        U256::ZERO,
    )
    .await?;
    aa.paymaster = empty.address;
    let owner = PrivateKeySigner::random();
    let sender = aa.account_of(owner.address()).await?;
    let op = aa.transfer_op(
        owner.address(),
        sender,
        0,
        true,
        Address::with_last_byte(0x79),
        U256::ZERO,
    );
    let (packed, _) = aa.sponsor_and_sign(op, &aa.sponsor, &owner).await?;
    let data = aa.handle_ops_revert(&[packed]).await?.expect("reverts");
    let rejection = EntryPointRejection::decode(&data).expect("FailedOp");
    assert_eq!(rejection.aa, Some(AaCode(31)), "{}", rejection.reason);
    assert_eq!(rejection.erc7769(), Erc7769Code::PaymasterBalance);
    assert_eq!(rejection.erc7769().code(), -32508);
    Ok(())
}
