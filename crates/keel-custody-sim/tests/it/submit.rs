//! Submission, lookup, cancel and the provider-side faults.

use std::time::{Duration, Instant};

use alloy::primitives::U256;
use alloy::providers::Provider;
use anvil_tests::TestChain;
use keel_custody::{
    CancelOutcome, CustodyError, CustodyProvider, ErrorClass, ExternalTxId, StatusPhase, SubStatus,
    TxStatus,
};
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn a_contract_call_completes_with_a_receipt_on_chain() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();

    let call = call(store, 0x1234, "keel.op-1.mint.0");
    let created = provider.create_contract_call(&call).await.unwrap();
    assert_eq!(created.status, TxStatus::Submitted);
    let tx = wait_status(&provider, &created.id, TxStatus::Completed).await;
    assert_eq!(tx.sub_status, Some(SubStatus::Confirmed));
    assert_eq!(tx.external_tx_id.as_ref(), Some(&call.external_tx_id));
    assert_eq!(tx.source_address, Some(vault));
    assert_eq!(tx.destination_address, Some(store));
    let hash = tx.tx_hash.expect("a hash once completed");

    // On chain: the receipt succeeded, from the vault, to the contract, with the calldata
    // (suffix included) exactly as sent; the vault sent exactly one transaction.
    let receipt = chain
        .provider()
        .get_transaction_receipt(hash)
        .await
        .unwrap()
        .unwrap();
    assert!(receipt.status());
    assert_eq!(receipt.from, vault);
    assert_eq!(receipt.to, Some(store));
    let block = tx.block.expect("block info once completed");
    assert_eq!(Some(block.number), receipt.block_number);
    assert_eq!(Some(block.hash), receipt.block_hash);
    let onchain = chain
        .provider()
        .get_transaction_by_hash(hash)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        alloy::consensus::Transaction::input(&onchain),
        &call.calldata
    );
    let slot = chain
        .provider()
        .get_storage_at(store, U256::ZERO)
        .await
        .unwrap();
    assert_eq!(slot, U256::from(0x1234));
    assert_eq!(sent_count(&chain, vault).await, 1);

    // The lookup by external id finds the same transaction.
    let found = provider
        .get_by_external_id(&call.external_tx_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id, created.id);
    assert_eq!(found.tx_hash, Some(hash));
    // An external id never used: none.
    let unknown = ExternalTxId::new("keel.never.0").unwrap();
    assert!(
        provider
            .get_by_external_id(&unknown)
            .await
            .unwrap()
            .is_none()
    );

    // The provider manages the account's nonce: two more calls land as nonces 1 and 2.
    let a = provider
        .create_contract_call(&crate::harness::call(store, 1, "keel.op-2.mint.0"))
        .await
        .unwrap();
    let b = provider
        .create_contract_call(&crate::harness::call(store, 2, "keel.op-3.mint.0"))
        .await
        .unwrap();
    wait_status(&provider, &a.id, TxStatus::Completed).await;
    wait_status(&provider, &b.id, TxStatus::Completed).await;
    assert_eq!(sent_count(&chain, vault).await, 3);
}

#[tokio::test]
async fn a_lost_create_answer_is_in_doubt_and_the_lookup_finds_it_without_a_second_transaction() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();

    sim.admin("/admin/faults/transaction", json!({"loseResponse": true}))
        .await;
    let call = call(store, 7, "keel.op-lost.mint.0");
    let err = provider.create_contract_call(&call).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::InDoubt, "{err}");
    assert!(
        matches!(&err, CustodyError::InDoubt { external_tx_id, .. } if *external_tx_id == call.external_tx_id)
    );

    // The next step is the lookup, never a blind create: it finds the transaction.
    let found = provider
        .get_by_external_id(&call.external_tx_id)
        .await
        .unwrap()
        .expect("created");
    let done = wait_status(&provider, &found.id, TxStatus::Completed).await;
    assert!(done.tx_hash.is_some());

    // A second create with the same external id is refused as a duplicate → look it up.
    let again = provider.create_contract_call(&call).await.unwrap_err();
    assert_eq!(again.class(), ErrorClass::Duplicate, "{again}");
    let same = provider
        .get_by_external_id(&call.external_tx_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(same.id, found.id);

    assert_eq!(
        sent_count(&chain, vault).await,
        1,
        "exactly one transaction on chain"
    );
    let all = sim.admin_get("/admin/transactions").await;
    assert_eq!(
        all.as_array().unwrap().len(),
        1,
        "exactly one transaction at the provider"
    );
}

#[tokio::test]
async fn a_5xx_on_create_is_in_doubt_and_a_lookup_that_finds_nothing_makes_a_create_safe() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();

    // The provider fails before doing anything; the adapter cannot know that: in doubt.
    sim.admin(
        "/admin/faults/http",
        json!({"kind": "server_error", "status": 503}),
    )
    .await;
    let call = call(store, 9, "keel.op-5xx.mint.0");
    let err = provider.create_contract_call(&call).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::InDoubt, "{err}");
    assert!(
        provider
            .get_by_external_id(&call.external_tx_id)
            .await
            .unwrap()
            .is_none()
    );
    let created = provider.create_contract_call(&call).await.unwrap();
    wait_status(&provider, &created.id, TxStatus::Completed).await;
    assert_eq!(sent_count(&chain, vault).await, 1);

    // A 5xx on a read is retryable, not in doubt.
    sim.admin(
        "/admin/faults/http",
        json!({"kind": "server_error", "status": 500}),
    )
    .await;
    let err = provider.get(&created.id).await.unwrap_err();
    assert!(matches!(
        err,
        CustodyError::Unavailable { http_status: 500 }
    ));
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_silent_drop_stays_pre_broadcast_and_cancel_then_resubmission_works() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();

    sim.admin(
        "/admin/faults/transaction",
        json!({"behavior": "silent_drop"}),
    )
    .await;
    let first = ExternalTxId::derive("op-drop.mint", 0).unwrap();
    let mut dropped_call = call(store, 11, first.as_str());
    let dropped = provider.create_contract_call(&dropped_call).await.unwrap();
    wait_status(&provider, &dropped.id, TxStatus::Queued).await;

    // A later call from the same vault completes while the dropped one is still queued
    // with no hash: the provider accepted it and will never broadcast it.
    let later = provider
        .create_contract_call(&call(store, 12, "keel.op-later.mint.0"))
        .await
        .unwrap();
    wait_status(&provider, &later.id, TxStatus::Completed).await;
    let still = provider.get(&dropped.id).await.unwrap();
    assert_eq!(still.status, TxStatus::Queued);
    assert_eq!(still.status.phase(), StatusPhase::PreBroadcast);
    assert_eq!(still.tx_hash, None);
    assert_eq!(sent_count(&chain, vault).await, 1);

    // Recovery: cancel, confirm the cancel, resubmit with the next deterministic id.
    assert_eq!(
        provider.cancel(&dropped.id).await.unwrap(),
        CancelOutcome::Accepted
    );
    let cancelled = wait_status(&provider, &dropped.id, TxStatus::Cancelled).await;
    assert_eq!(cancelled.sub_status, Some(SubStatus::CancelledByUser));
    assert!(cancelled.rejection().is_some());
    assert_eq!(
        provider.cancel(&dropped.id).await.unwrap(),
        CancelOutcome::Declined
    );
    dropped_call.external_tx_id = ExternalTxId::derive("op-drop.mint", 1).unwrap();
    let resubmitted = provider.create_contract_call(&dropped_call).await.unwrap();
    wait_status(&provider, &resubmitted.id, TxStatus::Completed).await;
    assert_eq!(
        sent_count(&chain, vault).await,
        2,
        "the dropped intent never reached the chain"
    );
    assert_eq!(
        chain
            .provider()
            .get_storage_at(store, U256::ZERO)
            .await
            .unwrap(),
        U256::from(11)
    );

    // A broadcast transaction cannot be cancelled.
    assert_eq!(
        provider.cancel(&resubmitted.id).await.unwrap(),
        CancelOutcome::Declined
    );
}

#[tokio::test]
async fn rejections_blocks_and_unknown_sub_statuses_are_typed() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();

    let cases = [
        (
            "reject",
            "AUTHORIZER_NOT_FOUND",
            TxStatus::Rejected,
            SubStatus::AuthorizerNotFound,
        ),
        (
            "block",
            "BLOCKED_BY_POLICY",
            TxStatus::Blocked,
            SubStatus::BlockedByPolicy,
        ),
        (
            "block",
            "SCREENED_BY_NEW_RULE",
            TxStatus::Blocked,
            SubStatus::Unknown("SCREENED_BY_NEW_RULE".into()),
        ),
    ];
    for (i, (behavior, sub, status, typed)) in cases.into_iter().enumerate() {
        let external = format!("keel.op-rej-{i}.mint.0");
        sim.admin(
            "/admin/faults/transaction",
            json!({"externalTxId": external, "behavior": behavior, "subStatus": sub}),
        )
        .await;
        let created = provider
            .create_contract_call(&call(store, 1, &external))
            .await
            .unwrap();
        let tx = wait_for(&provider, &created.id, |t| t.status.is_terminal()).await;
        assert_eq!(tx.status, status);
        let reason = tx.rejection().expect("a rejection");
        assert_eq!(reason.sub_status, Some(typed));
        assert_eq!(reason.tx_hash, None);
    }
    assert_eq!(
        sent_count(&chain, vault).await,
        0,
        "nothing rejected reached the chain"
    );
}

#[tokio::test]
async fn an_approval_at_the_provider_is_waited_for_then_approved_or_rejected() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();

    for (external, approve) in [("keel.op-ap1.mint.0", true), ("keel.op-ap2.mint.0", false)] {
        sim.admin(
            "/admin/faults/transaction",
            json!({"externalTxId": external, "behavior": "require_approval"}),
        )
        .await;
        let created = provider
            .create_contract_call(&call(store, 5, external))
            .await
            .unwrap();
        let pending = wait_status(&provider, &created.id, TxStatus::PendingAuthorization).await;
        assert_eq!(pending.status.phase(), StatusPhase::AwaitingApproval);
        let verb = if approve { "approve" } else { "reject" };
        sim.admin(
            &format!("/admin/transactions/{}/{verb}", created.id),
            json!({}),
        )
        .await;
        let tx = wait_for(&provider, &created.id, |t| t.status.is_terminal()).await;
        if approve {
            assert_eq!(tx.status, TxStatus::Completed);
        } else {
            assert_eq!(tx.status, TxStatus::Rejected);
            assert_eq!(tx.sub_status, Some(SubStatus::RejectedByUser));
        }
    }
    assert_eq!(
        sent_count(&chain, vault).await,
        1,
        "only the approved call reached the chain"
    );
}

#[tokio::test]
async fn a_revert_after_broadcast_is_failed_with_its_hash() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let reverter = deploy_reverter(&chain).await;
    let provider = sim.provider();

    // A forced revert (too little gas) and a natural one (the contract reverts).
    sim.admin(
        "/admin/faults/transaction",
        json!({"externalTxId": "keel.op-rv1.mint.0", "behavior": "revert"}),
    )
    .await;
    for (to, external) in [
        (store, "keel.op-rv1.mint.0"),
        (reverter, "keel.op-rv2.mint.0"),
    ] {
        let created = provider
            .create_contract_call(&call(to, 3, external))
            .await
            .unwrap();
        let tx = wait_for(&provider, &created.id, |t| t.status.is_terminal()).await;
        assert_eq!(tx.status, TxStatus::Failed);
        assert_eq!(tx.sub_status, Some(SubStatus::SmartContractExecutionFailed));
        let reason = tx.rejection().unwrap();
        let hash = reason.tx_hash.expect("broadcast before failing");
        let receipt = chain
            .provider()
            .get_transaction_receipt(hash)
            .await
            .unwrap()
            .unwrap();
        assert!(!receipt.status(), "reverted on chain");
    }
    assert_eq!(sent_count(&chain, vault).await, 2);
    assert_eq!(
        chain
            .provider()
            .get_storage_at(store, U256::ZERO)
            .await
            .unwrap(),
        U256::ZERO
    );
}

#[tokio::test]
async fn rate_limits_429_retry_after_is_honoured_and_the_account_limit_paces_requests() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let provider = sim.provider();
    let created = provider
        .create_contract_call(&call(store, 1, "keel.op-rl.mint.0"))
        .await
        .unwrap();

    // Two 429s with Retry-After: 1 → the read succeeds after at least 2 s.
    sim.admin(
        "/admin/faults/http",
        json!({"kind": "rate_limit", "count": 2, "retryAfterSecs": 1}),
    )
    .await;
    let start = Instant::now();
    provider.get(&created.id).await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );

    // With no retries left the error carries the provider's Retry-After.
    let mut config = sim.config();
    config.max_rate_limit_retries = 0;
    let impatient = sim.provider_with(&config);
    sim.admin(
        "/admin/faults/http",
        json!({"kind": "rate_limit", "retryAfterSecs": 7}),
    )
    .await;
    let err = impatient.get(&created.id).await.unwrap_err();
    assert!(
        matches!(err, CustodyError::RateLimited { retry_after: Some(d) } if d == Duration::from_secs(7)),
        "{err}"
    );
    assert!(err.is_retryable());

    // The account's governor limit: 2 requests/s, burst 1 → 5 reads take at least 2 s.
    let mut config = sim.config();
    config.requests_per_second = 2;
    config.burst = 1;
    let paced = sim.provider_with(&config);
    let start = Instant::now();
    for _ in 0..5 {
        paced.get(&created.id).await.unwrap();
    }
    assert!(
        start.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_create_that_times_out_is_in_doubt_and_lands_later_exactly_once() {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let vault = sim.funded_vault(&chain, VAULT).await;
    let store = deploy_store(&chain).await;
    let mut config = sim.config();
    config.request_timeout_ms = 300;
    let provider = sim.provider_with(&config);

    // The provider handles the create after the client gave up waiting (its JWT is
    // still valid then): the answer is lost, the transaction exists.
    sim.admin(
        "/admin/faults/http",
        json!({"kind": "slow", "delayMs": 1500}),
    )
    .await;
    let call = call(store, 21, "keel.op-slow.mint.0");
    let err = provider.create_contract_call(&call).await.unwrap_err();
    assert!(
        matches!(&err, CustodyError::InDoubt { cause, .. } if cause == "timeout"),
        "{err}"
    );

    // Until the create's JWT has expired, "not found" is not yet proof of absence:
    // poll the lookup until the transaction shows up.
    let start = Instant::now();
    let found = loop {
        if let Some(tx) = provider
            .get_by_external_id(&call.external_tx_id)
            .await
            .unwrap()
        {
            break tx;
        }
        assert!(
            start.elapsed() < STATUS_DEADLINE,
            "the delayed create never landed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    wait_status(&provider, &found.id, TxStatus::Completed).await;
    assert_eq!(sent_count(&chain, vault).await, 1);
}
