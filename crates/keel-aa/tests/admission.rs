//! Issue 33 §1 and §3 against real Anvil (EntryPoint v0.8, 30,000,000 gas blocks) and
//! real PostgreSQL: bundles sized to the block gas limit, what `eth_sendUserOperation`
//! refuses (fee floors, `preVerificationGas`, operations that can never fit, one
//! operation per sender, the replacement rule) and the default sponsorship ceiling.

mod common;

use alloy::primitives::{Address, U256};
use alloy::providers::Provider;
use common::ETHER;
use common::flow::{Flow, failure, refused};
use keel_aa::UserOperation;
use keel_aa::admission::AdmissionConfig;
use keel_aa::bundler::BundlerConfig;
use keel_aa::store;
use keel_durable::RunStatus;
use keel_units::Wei;
use serde_json::json;
use std::time::Duration;

/// `n` sponsored operations of `call_gas` gas each (fresh accounts), accepted while the
/// runner is down; then the queue and the bundler start. Every operation lands once; the
/// number of bundles and the bundler sender's transactions on chain (bundles only, no
/// nonce-gap self-transfer) are returned.
async fn land_heavy_operations(n: usize, call_gas: u128) -> anyhow::Result<(i64, u64)> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let before = f.bundler_txs().await?;
    let mut ops = Vec::new();
    for _ in 0..n {
        let (owner, sender) = f.account().await?;
        let (op, hash) = f
            .op(&owner, sender, 0, |o| o.call_gas_limit = call_gas)
            .await?;
        // Accepted through eth_sendUserOperation: it fits alone.
        let r = f.send(&op).await;
        assert_eq!(r["result"], json!(hash), "{r}");
        ops.push(hash);
    }
    for hash in &ops {
        f.until_state(*hash, store::state::READY).await?;
    }
    f.start_queue_and_bundler()?;
    for hash in &ops {
        let id = f.row(*hash).await?.expect("row").instance_id;
        let s = f.settled(id).await?;
        assert_eq!(s.status, RunStatus::Completed, "{s:?}");
        assert_eq!(f.state(*hash).await?, store::state::INCLUDED);
    }
    let bundles = f.count("SELECT count(*) FROM aa_bundle").await?;
    assert_eq!(
        f.count("SELECT count(*) FROM aa_bundle WHERE state <> 'included'")
            .await?,
        0,
        "no bundle failed"
    );
    let txs = f.bundler_txs().await? - before;
    f.shutdown().await;
    Ok((bundles, txs))
}

/// Issue 33 §1: 2 × 15,000,000 and 4 × 8,000,000 gas operations on 30,000,000-gas
/// blocks. Before the fix both 15M operations went into one bundle over the block gas
/// limit, rebuilt forever with a nonce-gap self-transfer after each. Now each bundle
/// fits min(25M, 30M − 1M): the operations land, the bundle count is bounded, and the
/// bundler's sender sent exactly one transaction per bundle.
#[tokio::test]
async fn heavy_operations_are_bundled_within_the_block_gas_limit_and_land() -> anyhow::Result<()> {
    // (operations, callGasLimit, bundles: ~15.7M and ~8.7M gas per operation with the
    // 200k overhead → one and two per bundle).
    for (n, call_gas, bundles) in [(2usize, 15_000_000u128, 2i64), (4, 8_000_000, 2)] {
        let (made, txs) = land_heavy_operations(n, call_gas).await?;
        assert_eq!(made, bundles, "{n} x {call_gas}");
        assert_eq!(
            txs, bundles as u64,
            "{n} x {call_gas}: one transaction per bundle, no gap fill"
        );
    }
    Ok(())
}

/// Issue 33 §1: an operation that can never fit a bundle is refused at
/// `eth_sendUserOperation` naming the field (several values above the budget; the
/// budget itself accepted), and one that reaches the bundler anyway (accepted before
/// the budget shrank) ends `failed` with a typed reason instead of being bundled.
#[tokio::test]
async fn an_operation_that_can_never_fit_is_refused_at_send_and_ended_by_the_bundler()
-> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    // Budget: min(25M, 30M − 1M) = 25M including the 200k overhead.
    let (owner, sender) = f.account().await?;
    let (probe, _) = f.op(&owner, sender, 0, |_| {}).await?;
    let rest = keel_aa::admission::operation_gas(&probe) - probe.call_gas_limit as u64;
    let fits = u128::from(25_000_000 - 200_000 - rest);
    for call_gas in [fits + 1, 30_000_000, 1u128 << 100] {
        let (op, hash) = f
            .op(&owner, sender, 0, |o| o.call_gas_limit = call_gas)
            .await?;
        let r = f.send(&op).await;
        refused(&r, -32602, "callGasLimit", "GAS_LIMIT_EXCEEDS_BUNDLE_MAX");
        assert!(f.row(hash).await?.is_none(), "nothing recorded");
    }
    let (op, hash) = f.op(&owner, sender, 0, |o| o.call_gas_limit = fits).await?;
    let r = f.send(&op).await;
    assert_eq!(
        r["result"],
        json!(hash),
        "exactly the budget is accepted: {r}"
    );
    f.shutdown().await;

    // The bundler's side: a budget of 2,000,000 gas; an operation accepted without the
    // send-time check (flow::submit) that is over it ends failed, typed, unbundled.
    let f = Flow::start(AdmissionConfig {
        max_bundle_gas: 2_000_000,
        ..AdmissionConfig::default()
    })
    .await?;
    let (owner, sender) = f.account().await?;
    let (op, hash) = f
        .op(&owner, sender, 0, |o| o.call_gas_limit = 1_500_000)
        .await?;
    let s = f.submit(op).await?;
    f.until_state(hash, store::state::READY).await?;
    let bundler = f.bundler()?;
    assert_eq!(bundler.bundle_pass().await?, 1, "ended");
    let st = f.settled(s.instance_id).await?;
    assert_eq!(st.status, RunStatus::Failed);
    let fail = failure(&st);
    assert_eq!(
        (fail.code, fail.reason.as_str()),
        (-32602, "GAS_LIMIT_EXCEEDS_BUNDLE_MAX")
    );
    assert_eq!(f.count("SELECT count(*) FROM aa_bundle").await?, 0);
    assert_eq!(f.count("SELECT count(*) FROM txq_request").await?, 0);
    f.shutdown().await;
    Ok(())
}

/// Nothing waits forever: an operation whose `maxFeePerGas` the base fee overtakes after
/// acceptance waits `ready` (never bundled: the operator would pay the difference), and
/// once it has been ready longer than `ready_ttl` it ends `failed` `MEMPOOL_EXPIRED`,
/// its workflow told, nothing sent.
#[tokio::test]
async fn an_operation_priced_out_by_the_base_fee_waits_then_expires() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let (owner, sender) = f.account().await?;
    let (op, hash) = f.op(&owner, sender, 0, |_| {}).await?;
    let max_fee = op.max_fee_per_gas.get();
    let s = f.submit(op).await?;
    f.until_state(hash, store::state::READY).await?;

    // The base fee rises to ten times the operation's maxFeePerGas.
    let high = max_fee * U256::from(10u8);
    f.aa.provider()
        .raw_request::<_, ()>("anvil_setNextBlockBaseFeePerGas".into(), (high,))
        .await?;
    f.aa.chain.mine().await?;
    assert!(U256::from(f.base_fee().await?) > max_fee);

    // It waits: the default (1 hour) bundler bundles nothing and ends nothing.
    assert_eq!(f.bundler()?.bundle_pass().await?, 0);
    assert_eq!(f.state(hash).await?, store::state::READY);

    // Ready for more than a second on the database clock: a bundler with a 1 s
    // time-to-live ends it.
    let expiring = f.bundler_with(BundlerConfig {
        ready_ttl: Duration::from_secs(1),
        ..BundlerConfig::default()
    })?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while f
        .count(
            "SELECT count(*) FROM aa_user_operation \
             WHERE state = 'ready' AND updated_at < now() - interval '1 second'",
        )
        .await?
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "never older than 1 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(expiring.bundle_pass().await?, 1);
    let st = f.settled(s.instance_id).await?;
    assert_eq!(st.status, RunStatus::Failed, "{st:?}");
    let fail = failure(&st);
    assert_eq!(
        (fail.code, fail.reason.as_str()),
        (-32602, "MEMPOOL_EXPIRED")
    );
    assert_eq!(f.state(hash).await?, store::state::FAILED);
    assert_eq!(f.count("SELECT count(*) FROM aa_bundle").await?, 0);
    assert_eq!(f.count("SELECT count(*) FROM txq_request").await?, 0);
    // Ended once: a later pass finds nothing.
    assert_eq!(expiring.bundle_pass().await?, 0);
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §3: `preVerificationGas` (0, below the computed requirement by one, the
/// requirement), `maxFeePerGas` against the latest base fee (one wei below, equal) and
/// `maxPriorityFeePerGas` above `maxFeePerGas` (by one wei, by a lot): each refusal
/// -32602 naming the field, nothing recorded; the boundary values accepted.
#[tokio::test]
async fn fee_floors_and_pre_verification_gas_are_enforced_at_send() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let mut accounts = Vec::new();
    for _ in 0..3 {
        accounts.push(f.account().await?);
    }
    let (owner, sender) = &accounts[0];
    // The requirement of this operation (it depends on its bytes, signatures included:
    // each case is compared with the requirement of the signed operation sent).
    let (probe, _) = f.op(owner, *sender, 0, |_| {}).await?;
    let need = keel_aa::admission::required_pre_verification_gas(&probe.pack()?);
    let mut below = Vec::new();
    for pvg in [0u128, 1, 21_000] {
        below.push(
            f.op(owner, *sender, 0, |o| {
                o.pre_verification_gas = U256::from(pvg)
            })
            .await?,
        );
    }
    // Just below its own requirement (found in a few steps: the value's and the
    // signatures' bytes move the requirement by a few dozen gas).
    let mut pvg = need - 1;
    for _ in 0..16 {
        let (op, hash) = f
            .op(owner, *sender, 0, |o| {
                o.pre_verification_gas = U256::from(pvg)
            })
            .await?;
        let required = keel_aa::admission::required_pre_verification_gas(&op.pack()?);
        if pvg < required {
            assert!(required - pvg <= 240, "{required} {pvg}");
            below.push((op, hash));
            break;
        }
        pvg = required - 1;
    }
    assert_eq!(
        below.len(),
        4,
        "found an operation just below its requirement"
    );
    for (op, hash) in below {
        let pvg = u128::try_from(op.pre_verification_gas)?;
        assert!(pvg < keel_aa::admission::required_pre_verification_gas(&op.pack()?));
        refused(
            &f.send(&op).await,
            -32602,
            "preVerificationGas",
            "PRE_VERIFICATION_GAS_TOO_LOW",
        );
        assert!(f.row(hash).await?.is_none());
    }
    // Just above (a few signature bytes may differ from the probe's: 12 gas each).
    let pvg = need + 240;
    let (op, hash) = f
        .op(owner, *sender, 0, |o| {
            o.pre_verification_gas = U256::from(pvg)
        })
        .await?;
    assert!(keel_aa::admission::required_pre_verification_gas(&op.pack()?) <= pvg);
    let r = f.send(&op).await;
    assert_eq!(r["result"], json!(hash), "the requirement is accepted: {r}");

    let base = f.base_fee().await?;
    assert!(base > 1, "Anvil has a base fee");
    let (owner, sender) = &accounts[1];
    for max_fee in [0u128, base / 2, base - 1] {
        let (op, hash) = f
            .op(owner, *sender, 0, |o| {
                o.max_fee_per_gas = Wei::new(U256::from(max_fee));
                o.max_priority_fee_per_gas = Wei::ZERO;
            })
            .await?;
        refused(
            &f.send(&op).await,
            -32602,
            "maxFeePerGas",
            "MAX_FEE_BELOW_BASE_FEE",
        );
        assert!(f.row(hash).await?.is_none());
    }
    let (owner2, sender2) = &accounts[2];
    for (max_fee, prio) in [
        (base, base + 1),
        (base * 2, base * 2 + 1),
        (base, u128::from(u64::MAX)),
    ] {
        let (op, hash) = f
            .op(owner2, *sender2, 0, |o| {
                o.max_fee_per_gas = Wei::new(U256::from(max_fee));
                o.max_priority_fee_per_gas = Wei::new(U256::from(prio));
            })
            .await?;
        refused(
            &f.send(&op).await,
            -32602,
            "maxPriorityFeePerGas",
            "PRIORITY_FEE_ABOVE_MAX_FEE",
        );
        assert!(f.row(hash).await?.is_none());
    }
    // The base fee itself (no block mined since it was read), priority equal to it.
    let (owner, sender) = &accounts[1];
    let (op, hash) = f
        .op(owner, *sender, 0, |o| {
            o.max_fee_per_gas = Wei::new(U256::from(base));
            o.max_priority_fee_per_gas = Wei::new(U256::from(base));
        })
        .await?;
    assert_eq!(f.base_fee().await?, base);
    assert_eq!(
        f.send(&op).await["result"],
        json!(hash),
        "maxFeePerGas = base fee is accepted"
    );
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §3: estimation answers a `preVerificationGas` that passes Keel's own check:
/// stub → estimate → paymaster data → sign → send is accepted, and lands.
#[tokio::test]
async fn the_estimated_pre_verification_gas_passes_the_check() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    f.start_queue_and_bundler()?;
    let (owner, sender) = f.account().await?;
    let mut op = f.aa.transfer_op(
        owner.address(),
        sender,
        0,
        true,
        Address::with_last_byte(0x76),
        U256::from(1u64),
    );
    let chain = format!("{:#x}", f.chain_id());
    let ep = f.aa.ep().address();
    let stub = f
        .rpc("pm_getPaymasterStubData", json!([op, ep, chain, {}]))
        .await;
    let stub = &stub["result"];
    op.paymaster = Some(stub["paymaster"].as_str().unwrap().parse()?);
    op.paymaster_data = stub["paymasterData"].as_str().unwrap().parse()?;
    op.paymaster_verification_gas_limit = u128::from_str_radix(
        stub["paymasterVerificationGasLimit"]
            .as_str()
            .unwrap()
            .trim_start_matches("0x"),
        16,
    )?;
    op.pre_verification_gas = U256::ZERO;
    let est = f.rpc("eth_estimateUserOperationGas", json!([op, ep])).await;
    let hex = |k: &str| {
        u128::from_str_radix(
            est["result"][k].as_str().unwrap().trim_start_matches("0x"),
            16,
        )
        .unwrap()
    };
    op.pre_verification_gas = U256::from(hex("preVerificationGas"));
    op.verification_gas_limit = hex("verificationGasLimit");
    op.call_gas_limit = hex("callGasLimit");
    let data = f
        .rpc("pm_getPaymasterData", json!([op, ep, chain, {}]))
        .await;
    op.paymaster_data = data["result"]["paymasterData"].as_str().unwrap().parse()?;
    let hash = op.hash_v08(f.aa.ep())?;
    op.signature = alloy::signers::SignerSync::sign_hash_sync(&owner, &hash)?
        .as_bytes()
        .to_vec()
        .into();
    let r = f.send(&op).await;
    assert_eq!(r["result"], json!(hash), "{r}");
    let id = f.row(hash).await?.expect("row").instance_id;
    assert_eq!(f.settled(id).await?.status, RunStatus::Completed);
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §3: with no sponsorship policy, `pm_getPaymasterData` signs up to the
/// default ceiling (5,000,000 gas) and refuses above it (-32501
/// `SPONSOR_GAS_CEILING_EXCEEDED`, the field named), including 2^100.
#[tokio::test]
async fn paymaster_data_is_refused_over_the_default_sponsorship_ceiling() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let (owner, sender) = f.account().await?;
    let chain = format!("{:#x}", f.chain_id());
    let ep = f.aa.ep().address();
    let base = f.aa.transfer_op(
        owner.address(),
        sender,
        0,
        true,
        Address::with_last_byte(1),
        U256::from(1u64),
    );
    // Gas without verificationGasLimit: call + pvg + Keel's paymaster limit (100k).
    let others = base.call_gas_limit + 60_000 + 100_000;
    for (verification, ok) in [
        (5_000_000 - others, true),
        (5_000_000 - others + 1, false),
        (10_000_000, false),
        (1u128 << 100, false),
    ] {
        let mut op = base.clone();
        op.verification_gas_limit = verification;
        let r = f
            .rpc("pm_getPaymasterData", json!([op, ep, chain, {}]))
            .await;
        if ok {
            assert!(r["result"]["paymasterData"].is_string(), "{r}");
        } else {
            assert_eq!(r["error"]["code"], -32501, "{r}");
            assert_eq!(r["error"]["data"]["reason"], "SPONSOR_GAS_CEILING_EXCEEDED");
            assert_eq!(r["error"]["data"]["field"], "verificationGasLimit");
        }
    }
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §3: a sender's next operation is never bundled while its earlier one is in
/// an unsettled bundle (before the fix it was bundled as soon as it validated — here
/// after the earlier bundle mined, before its verdict was handled). Both land,
/// one bundle each, no failed bundle, no transaction of the bundler's sender but them.
#[tokio::test]
async fn a_sender_s_next_operation_waits_while_its_earlier_one_is_in_flight() -> anyhow::Result<()>
{
    let f = Flow::start(AdmissionConfig::default()).await?;
    let before = f.bundler_txs().await?;
    let (owner, sender) = f.account().await?;
    let (a, a_hash) = f.op(&owner, sender, 0, |_| {}).await?;
    let (b, b_hash) = f.op(&owner, sender, 1, |_| {}).await?;
    let a_id = f.submit(a).await?.instance_id;
    f.until_state(a_hash, store::state::READY).await?;
    let bundler = f.bundler()?;
    assert_eq!(bundler.bundle_pass().await?, 1);
    assert_eq!(f.state(a_hash).await?, store::state::BUNDLED);
    // The queue mines A's bundle; its verdict is not handled (no settle pass yet).
    f.start_queue();
    let bundle = store::bundles_submitted(f.db.pool(), f.chain_id() as i64).await?;
    assert_eq!(bundle.len(), 1);
    let verdict = tokio::time::timeout(
        Duration::from_secs(120),
        f.queue()
            .await_verdict(bundle[0].txq_request_id, Duration::from_millis(50)),
    )
    .await??;
    assert_eq!(verdict.kind(), "confirmed");
    assert_eq!(
        f.state(a_hash).await?,
        store::state::BUNDLED,
        "in flight for Keel"
    );
    // B: accepted (nonce 1 is next on chain: A's bundle mined) and validated, but not
    // bundled while A is.
    assert_eq!(f.send(&b).await["result"], json!(b_hash));
    let b_id = f.row(b_hash).await?.expect("row").instance_id;
    f.until_state(b_hash, store::state::READY).await?;
    for _ in 0..3 {
        assert_eq!(bundler.bundle_pass().await?, 0, "B waits behind A");
    }
    assert_eq!(f.state(b_hash).await?, store::state::READY);
    // A settles; then B goes out.
    tokio::spawn(keel_service::run(
        f.bundler()?,
        keel_service::ServiceConfig::new(Duration::from_millis(100)),
        f.cancel.clone(),
    ));
    assert_eq!(f.settled(a_id).await?.status, RunStatus::Completed);
    assert_eq!(f.settled(b_id).await?.status, RunStatus::Completed);
    assert_eq!(f.count("SELECT count(*) FROM aa_bundle").await?, 2);
    assert_eq!(
        f.count("SELECT count(*) FROM aa_bundle WHERE state <> 'included'")
            .await?,
        0
    );
    assert_eq!(
        f.bundler_txs().await? - before,
        2,
        "no reverted handleOps, no gap fill"
    );
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §5, back to back: a sender's operations at nonces 0 (creating the account),
/// 1 and 2 of one key, sent one after the other before any lands, are all accepted —
/// the later ones cannot validate against the latest block yet (AA20, then AA25), so
/// their workflows wait for the one below (suspended `PREDECESSOR_PENDING`, woken when
/// it settles) — and land in order, one bundle each. UREP-010: an unstaked sender has at
/// most `same_sender_mempool_count` open operations (-32505 naming `sender`); a nonce
/// with no open operation below it is still refused by the EntryPoint (AA25).
#[tokio::test]
async fn back_to_back_operations_of_one_sender_are_accepted_and_land_in_order() -> anyhow::Result<()>
{
    let f = Flow::start(AdmissionConfig {
        same_sender_mempool_count: 3,
        ..AdmissionConfig::default()
    })
    .await?;
    let (owner, sender) = f.account().await?;
    let mut hashes = Vec::new();
    for nonce in 0..3u64 {
        let (op, hash) = f.op(&owner, sender, nonce, |_| {}).await?;
        let r = f.send(&op).await;
        assert_eq!(r["result"], json!(hash), "nonce {nonce}: {r}");
        hashes.push(hash);
    }
    // A fourth open operation of this unstaked sender: over the limit.
    let (fourth, fourth_hash) = f.op(&owner, sender, 3, |_| {}).await?;
    refused(
        &f.send(&fourth).await,
        -32505,
        "sender",
        "SENDER_OPERATION_PENDING",
    );
    assert!(f.row(fourth_hash).await?.is_none());
    // Another sender's operation at a nonce with nothing open below it: the EntryPoint
    // refuses it (no waiting without a predecessor).
    let (owner2, sender2) = f.account().await?;
    let (gap, gap_hash) = f.op(&owner2, sender2, 1, |_| {}).await?;
    let r = f.send(&gap).await;
    assert_eq!(r["error"]["code"], -32500, "{r}");
    assert!(f.row(gap_hash).await?.is_none());
    // The later ones wait (suspended, woken by the bundler), then land in nonce order.
    f.until_state(hashes[0], store::state::READY).await?;
    f.start_queue_and_bundler()?;
    let mut blocks = Vec::new();
    for hash in &hashes {
        let id = f.row(*hash).await?.expect("row").instance_id;
        let st = f.settled(id).await?;
        assert_eq!(st.status, RunStatus::Completed, "{st:?}");
        let row = f.row(*hash).await?.expect("row");
        assert_eq!(row.state, store::state::INCLUDED);
        blocks.push(row.block_number.expect("block"));
    }
    assert!(
        blocks.windows(2).all(|w| w[0] < w[1]),
        "in order: {blocks:?}"
    );
    assert_eq!(f.count("SELECT count(*) FROM aa_bundle").await?, 3);
    assert_eq!(
        f.count("SELECT count(*) FROM aa_bundle WHERE state <> 'included'")
            .await?,
        0,
        "no failed bundle"
    );
    assert_eq!(
        f.aa.token_balance(Address::with_last_byte(0x77)).await?,
        U256::from(3u64)
    );
    f.shutdown().await;
    Ok(())
}

/// ERC-7562 EREP-010 (found by the conformance suite): the paymaster's EntryPoint deposit
/// (1 ETH here) must cover the maximum cost of all its pending operations and the new
/// one. Two operations of ~0.36 ETH each are accepted, a third is refused -32508 naming
/// `paymaster`, nothing recorded; a replacement is counted instead of the operation it
/// replaces, not beside it.
#[tokio::test]
async fn a_paymaster_s_deposit_must_cover_all_its_pending_operations() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let gwei = 1_000_000_000u128;
    let priced = |max: u128| {
        move |o: &mut UserOperation| {
            o.max_fee_per_gas = Wei::new(U256::from(max));
            o.max_priority_fee_per_gas = Wei::new(U256::from(gwei));
        }
    };
    let mut sent = Vec::new();
    for _ in 0..2 {
        let (owner, sender) = f.account().await?;
        let (op, hash) = f.op(&owner, sender, 0, priced(400 * gwei)).await?;
        let cost = keel_aa::admission::max_cost(&op);
        assert!(
            cost > U256::from(ETHER / 3) && cost < U256::from(ETHER / 2),
            "{cost}"
        );
        assert_eq!(f.send(&op).await["result"], json!(hash));
        sent.push((owner, sender));
    }
    let (owner, sender) = f.account().await?;
    let (third, third_hash) = f.op(&owner, sender, 0, priced(400 * gwei)).await?;
    refused(
        &f.send(&third).await,
        -32508,
        "paymaster",
        "PAYMASTER_DEPOSIT_TOO_LOW",
    );
    assert!(f.row(third_hash).await?.is_none());
    // A replacement of the first (+10 % on both fees) fits: the first no longer counts.
    let (owner0, sender0) = &sent[0];
    let (replacement, replacement_hash) = f
        .op(owner0, *sender0, 0, |o| {
            o.max_fee_per_gas = Wei::new(U256::from(440 * gwei));
            o.max_priority_fee_per_gas = Wei::new(U256::from(gwei * 11 / 10));
        })
        .await?;
    assert_eq!(
        f.send(&replacement).await["result"],
        json!(replacement_hash)
    );
    refused(
        &f.send(&third).await,
        -32508,
        "paymaster",
        "PAYMASTER_DEPOSIT_TOO_LOW",
    );
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §3: the ERC-7562 replacement rule. Same sender and nonce, not yet bundled:
/// equal fees, +5 % on both, +10 % on one only are refused (-32602 naming the fee);
/// +10 % on both replaces it: the earlier operation ends `replaced` and its workflow is
/// told once; the replacement lands, the earlier never does.
#[tokio::test]
async fn a_replacement_needs_ten_percent_more_on_both_fees() -> anyhow::Result<()> {
    let f = Flow::start(AdmissionConfig::default()).await?;
    let (owner, sender) = f.account().await?;
    let gwei = 1_000_000_000u128;
    let fees = |max: u128, prio: u128| {
        move |o: &mut UserOperation| {
            o.max_fee_per_gas = Wei::new(U256::from(max));
            o.max_priority_fee_per_gas = Wei::new(U256::from(prio));
        }
    };
    let (first, first_hash) = f.op(&owner, sender, 0, fees(10 * gwei, gwei)).await?;
    assert_eq!(f.send(&first).await["result"], json!(first_hash));
    f.until_state(first_hash, store::state::READY).await?;
    for (max, prio, field) in [
        (10 * gwei, gwei, "maxFeePerGas"),
        (10 * gwei + gwei / 2, gwei + gwei / 20, "maxFeePerGas"),
        (11 * gwei - 1, gwei * 11 / 10, "maxFeePerGas"),
        (11 * gwei, gwei * 11 / 10 - 1, "maxPriorityFeePerGas"),
        (20 * gwei, gwei, "maxPriorityFeePerGas"),
    ] {
        // Another call gas limit: a different operation (equal fees would otherwise be
        // the same operation, a resend).
        let (op, hash) = f
            .op(&owner, sender, 0, |o| {
                fees(max, prio)(o);
                o.call_gas_limit += 1;
            })
            .await?;
        refused(&f.send(&op).await, -32602, field, "REPLACEMENT_UNDERPRICED");
        assert!(f.row(hash).await?.is_none());
    }
    assert_eq!(f.state(first_hash).await?, store::state::READY);
    // The next nonce of the same sender meanwhile (back to back): accepted, it waits for
    // the operation at nonce 0, whichever that turns out to be.
    let (later, later_hash) = f.op(&owner, sender, 1, fees(10 * gwei, gwei)).await?;
    assert_eq!(f.send(&later).await["result"], json!(later_hash));

    let (second, second_hash) = f
        .op(&owner, sender, 0, fees(11 * gwei, gwei * 11 / 10))
        .await?;
    assert_eq!(f.send(&second).await["result"], json!(second_hash));
    assert_eq!(f.state(first_hash).await?, store::state::REPLACED);
    let first_id = f.row(first_hash).await?.expect("row").instance_id;
    let st = f.settled(first_id).await?;
    assert_eq!(st.status, RunStatus::Failed);
    let fail = failure(&st);
    assert_eq!(
        (fail.state.as_str(), fail.reason.as_str()),
        ("replaced", "REPLACED")
    );
    // Sent again, the replaced operation is the known one: same hash, still replaced.
    assert_eq!(f.send(&first).await["result"], json!(first_hash));
    assert_eq!(f.state(first_hash).await?, store::state::REPLACED);

    f.start_queue_and_bundler()?;
    let second_id = f.row(second_hash).await?.expect("row").instance_id;
    assert_eq!(f.settled(second_id).await?.status, RunStatus::Completed);
    assert_eq!(f.state(first_hash).await?, store::state::REPLACED);
    let later_id = f.row(later_hash).await?.expect("row").instance_id;
    assert_eq!(f.settled(later_id).await?.status, RunStatus::Completed);
    let signals: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_signal WHERE instance_id = $1")
            .bind(first_id)
            .fetch_one(f.db.pool())
            .await?;
    assert_eq!(signals, 1, "the replaced workflow was told once");
    f.shutdown().await;
    Ok(())
}

/// Issue 33 §1: a bundle the queue refuses for the block gas limit (here the block gas
/// limit drops to 10,000,000 after the bundler packed two 8M operations into one
/// ~17.6M bundle) takes no nonce, and its set is split, never rebuilt unchanged: each
/// operation lands in a bundle of its own; the bundler's sender sent exactly those two
/// transactions (no gap fill).
#[tokio::test]
async fn a_bundle_refused_for_the_block_gas_limit_is_split_and_takes_no_nonce() -> anyhow::Result<()>
{
    let f = Flow::start(AdmissionConfig::default()).await?;
    let before = f.bundler_txs().await?;
    let mut ops = Vec::new();
    for _ in 0..2 {
        let (owner, sender) = f.account().await?;
        let (op, hash) = f
            .op(&owner, sender, 0, |o| o.call_gas_limit = 8_000_000)
            .await?;
        ops.push((f.submit(op).await?.instance_id, hash));
    }
    for (_, hash) in &ops {
        f.until_state(*hash, store::state::READY).await?;
    }
    let bundler = f.bundler()?;
    assert_eq!(bundler.bundle_pass().await?, 2, "one bundle of both");
    f.aa.provider()
        .raw_request::<_, bool>("evm_setBlockGasLimit".into(), (U256::from(10_000_000u64),))
        .await?;
    f.aa.chain.mine().await?;
    f.start_queue();
    let mut done = 0;
    for _ in 0..600 {
        bundler.settle_pass().await?;
        bundler.bundle_pass().await?;
        done = 0;
        for (id, _) in &ops {
            if f.engine
                .await_terminal(*id, Duration::from_millis(100))
                .await?
                .is_some()
            {
                done += 1;
            }
        }
        if done == ops.len() {
            break;
        }
    }
    assert_eq!(done, ops.len(), "both ended");
    for (id, hash) in &ops {
        assert_eq!(f.settled(*id).await?.status, RunStatus::Completed);
        assert_eq!(f.state(*hash).await?, store::state::INCLUDED);
    }
    let verdicts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, cardinality(user_op_hashes)::bigint FROM aa_bundle ORDER BY created_at",
    )
    .fetch_all(f.db.pool())
    .await?;
    assert_eq!(
        verdicts,
        vec![
            ("failed".to_owned(), 2),
            ("included".to_owned(), 1),
            ("included".to_owned(), 1)
        ],
        "the refused set was split"
    );
    let refused: String =
        sqlx::query_scalar("SELECT verdict->>'code' FROM txq_request ORDER BY created_at LIMIT 1")
            .fetch_one(f.db.pool())
            .await?;
    assert_eq!(refused, "EXCEEDS_BLOCK_GAS_LIMIT");
    assert_eq!(
        f.bundler_txs().await? - before,
        2,
        "the refused bundle took no nonce"
    );
    f.shutdown().await;
    Ok(())
}
