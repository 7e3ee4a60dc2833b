//! Gas estimation (`eth_estimateUserOperationGas`) and Keel's paymaster over ERC-7677
//! (`pm_getPaymasterStubData`, `pm_getPaymasterData`).
//!
//! ## Estimation ([`estimate_user_operation_gas`])
//!
//! Without `EntryPointSimulations` (see [`crate::flow`] on why the durable flow
//! validates with a `handleOps` simulation instead), each limit comes from
//! `eth_estimateGas` of the piece of work the EntryPoint will run, plus a margin:
//!
//! | field | measured | then |
//! |---|---|---|
//! | `verificationGasLimit` | a deployed account: `validateUserOp(op, hash, 0)` called from the EntryPoint (with the stub signature an ECDSA account answers "invalid signature" without reverting); an account created by `factory`: `factory.call(factoryData)` from the EntryPoint's `SenderCreator`, plus [`VALIDATION_ALLOWANCE`] for the new account's validation | + 20 % |
//! | `callGasLimit` | a deployed account: its `callData` called from the EntryPoint; one to be created: each call of its `execute` / `executeBatch` from the account's address, plus [`CALL_OVERHEAD`] per call | + 20 % |
//! | `preVerificationGas` | [`crate::admission::estimated_pre_verification_gas`]: what admission requires ([`crate::admission::required_pre_verification_gas`]: the larger of 21000 (a bundle of one) + 16 gas per non-zero and 4 per zero byte of its ABI encoding + 18300 fixed + 4 per 32-byte word, and the EIP-7623 floor 21000 + 10 per calldata token) for the operation with the fields a client fills in afterwards at their worst, so the completed operation passes Keel's own check | — |
//! | `paymasterVerificationGasLimit`, `paymasterPostOpGasLimit` | Keel's paymaster (the operation names it): the configured values (or the operation's when higher); another paymaster: the operation's; **no paymaster**: a self-paid estimate, and the answer has no paymaster fields (ERC-7769; a client such as viem copies every field it gets) | — |
//!
//! Gas fields, fees and the signature may be absent in the request (zero, and a
//! well-formed 65-byte ECDSA signature by a throwaway key). A call that reverts answers `-32521` (execution reverted)
//! or, for the validation, `-32500` with the revert as `data.revert`.
//!
//! ## Paymaster
//!
//! `pm_getPaymasterStubData` answers Keel's paymaster, the configured gas limits and
//! [`crate::stub_paymaster_data`] (the final data's length, so estimation sees the same
//! calldata); `pm_getPaymasterData` checks the sponsorship policy of the caller's
//! organization (with the day's spending; a refusal is `-32501` with `data.reason` =
//! the rule's `SPONSOR_…` code) and signs ([`crate::sign_sponsorship`]) with the
//! sponsor key over the **resolved** EntryPoint, valid for the configured window.
//! Both accept the configured or the resolved EntryPoint and refuse a `chainId` that
//! is not the route's.

use crate::flow::{AaChain, AaEnv, chain_id_i64};
use crate::service::CallError;
use crate::{UserOperation, ValidityWindow, resolve_entry_point};
use alloy::primitives::{Address, B256, Bytes, TxKind, U256};
use alloy::rpc::types::{TransactionInput, TransactionRequest};
use alloy::sol_types::{SolCall, SolValue};
use keel_abi::erc4337::IEntryPointV08;
use keel_chain::{ChainError, NodeErrorKind, UpstreamPool};
use serde_json::{Value, json};
use uuid::Uuid;

/// Gas allowed for a freshly created account's `validateUserOp` on top of its
/// creation (an ECDSA account needs about 10k; the rest is margin for the EntryPoint's
/// accounting), gas units.
pub const VALIDATION_ALLOWANCE: u128 = 60_000;
/// Gas allowed per call of an account to be created, on top of the call itself (its
/// `execute` dispatch), gas units.
pub const CALL_OVERHEAD: u128 = 15_000;

/// What [`estimate_user_operation_gas`] answers, gas units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GasEstimate {
    /// `preVerificationGas`.
    pub pre_verification_gas: u128,
    /// `verificationGasLimit`.
    pub verification_gas_limit: u128,
    /// `callGasLimit`.
    pub call_gas_limit: u128,
    /// `paymasterVerificationGasLimit`.
    pub paymaster_verification_gas_limit: u128,
    /// `paymasterPostOpGasLimit`.
    pub paymaster_post_op_gas_limit: u128,
}

/// Why an estimate could not be made (value-free).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstimateError {
    /// The account's validation (or creation) reverted.
    #[error("the account's validation reverted")]
    ValidationReverted(Bytes),
    /// The operation's call reverted.
    #[error("the operation's call reverted")]
    CallReverted(Bytes),
    /// An account to be created whose `callData` is not `execute` / `executeBatch`
    /// cannot be measured before it exists.
    #[error("the call of an account to be created is not execute or executeBatch")]
    CallNotUnderstood,
    /// The operation does not pack.
    #[error("malformed user operation")]
    Malformed(#[from] crate::UserOpError),
    /// The chain did not answer; retry.
    #[error("chain access")]
    Chain(#[source] ChainError),
}

fn reverted(e: ChainError) -> Result<Bytes, EstimateError> {
    match e {
        ChainError::Node { error, .. } if error.kind == NodeErrorKind::ExecutionReverted => {
            Ok(error.revert.map(|r| r.data).unwrap_or_default())
        }
        other => Err(EstimateError::Chain(other)),
    }
}

/// `eth_estimateGas` of a call from `from` to `to`, with the operation's EIP-7702
/// authorization applied when it has one (the estimate then includes the
/// authorization's intrinsic cost: an overestimate, never an underestimate).
async fn measure(
    pool: &UpstreamPool,
    op: &UserOperation,
    from: Address,
    to: Address,
    value: U256,
    data: Bytes,
) -> Result<Result<u128, Bytes>, EstimateError> {
    let tx = TransactionRequest {
        from: Some(from),
        to: Some(TxKind::Call(to)),
        value: Some(value),
        input: TransactionInput::new(data),
        authorization_list: crate::eip7702::authorization_list([op]),
        ..Default::default()
    };
    match pool.estimate_gas(&tx).await {
        Ok(g) => Ok(Ok(u128::from(g))),
        Err(e) => reverted(e).map(Err),
    }
}

fn margin(g: u128) -> u128 {
    g.saturating_mul(120) / 100
}

/// The `preVerificationGas` Keel requires of `op` (a bundle of one, with the EIP-7623
/// floor): [`crate::admission::required_pre_verification_gas`].
pub fn pre_verification_gas(op: &crate::PackedUserOperation) -> u128 {
    crate::admission::required_pre_verification_gas(op)
}

/// The calldata of the account's `validateUserOp(op, hash, 0)` (ERC-4337 `IAccount`,
/// v0.7+ packed operation).
fn validate_user_op_calldata(op: &crate::PackedUserOperation, hash: B256) -> Bytes {
    let selector = alloy::primitives::keccak256(
        "validateUserOp((address,uint256,bytes,bytes,bytes32,uint256,bytes32,bytes,bytes),bytes32,uint256)",
    );
    let mut data = selector[..4].to_vec();
    data.extend((op.to_sol(), hash, U256::ZERO).abi_encode_params());
    data.into()
}

/// The gas limits of `op` on the resolved EntryPoint `ep` (see the module docs);
/// `sponsor`: Keel's paymaster, whose configured limits apply when the operation names
/// it or no paymaster.
///
/// # Errors
/// [`EstimateError`].
pub async fn estimate_user_operation_gas(
    pool: &UpstreamPool,
    ep: &crate::ResolvedEntryPoint,
    op: &UserOperation,
    sponsor: Option<&crate::flow::Sponsor>,
) -> Result<GasEstimate, EstimateError> {
    let mut op = op.clone();
    let (pm_verification, pm_post_op) = match (op.paymaster, sponsor) {
        (None, _) => (0, 0),
        (Some(p), Some(s)) if p == s.paymaster => (
            op.paymaster_verification_gas_limit
                .max(s.verification_gas_limit),
            op.paymaster_post_op_gas_limit.max(s.post_op_gas_limit),
        ),
        _ => (
            op.paymaster_verification_gas_limit,
            op.paymaster_post_op_gas_limit,
        ),
    };
    if let (Some(p), Some(s)) = (op.paymaster, sponsor)
        && p == s.paymaster
    {
        op.paymaster_verification_gas_limit = pm_verification;
        op.paymaster_post_op_gas_limit = pm_post_op;
        if op.paymaster_data.is_empty() {
            op.paymaster_data = crate::stub_paymaster_data(ValidityWindow {
                valid_until: 0,
                valid_after: 0,
            })
            .unwrap_or_default();
        }
    }
    if op.signature.is_empty() {
        op.signature = stub_signature();
    }
    let packed = op.pack()?;
    let creates = op.factory.filter(|f| *f != crate::EIP7702_MARKER).is_some();
    let verification = if let (true, Some(factory)) = (creates, op.factory) {
        let sender_creator = sender_creator(pool, ep).await?;
        let created = measure(
            pool,
            &op,
            sender_creator,
            factory,
            U256::ZERO,
            op.factory_data.clone(),
        )
        .await?
        .map_err(EstimateError::ValidationReverted)?;
        created + VALIDATION_ALLOWANCE
    } else {
        let hash = op.hash_v08(ep).unwrap_or(B256::ZERO);
        let data = validate_user_op_calldata(&packed, hash);
        measure(pool, &op, ep.address(), op.sender, U256::ZERO, data)
            .await?
            .map_err(EstimateError::ValidationReverted)?
    };
    let call = if creates {
        let calls = crate::policy::decode_account_calls(&op.call_data)
            .ok_or(EstimateError::CallNotUnderstood)?;
        let mut total = 0u128;
        for c in calls {
            let g = measure(pool, &op, op.sender, c.target, c.value.get(), c.data)
                .await?
                .map_err(EstimateError::CallReverted)?;
            total = total.saturating_add(g).saturating_add(CALL_OVERHEAD);
        }
        total
    } else {
        measure(
            pool,
            &op,
            ep.address(),
            op.sender,
            U256::ZERO,
            op.call_data.clone(),
        )
        .await?
        .map_err(EstimateError::CallReverted)?
    };
    Ok(GasEstimate {
        pre_verification_gas: crate::admission::estimated_pre_verification_gas(&op)?,
        verification_gas_limit: margin(verification),
        call_gas_limit: margin(call),
        paymaster_verification_gas_limit: pm_verification,
        paymaster_post_op_gas_limit: pm_post_op,
    })
}

/// The signature estimation uses when the request has none: a well-formed ECDSA
/// signature (low `s`, of a fixed hash by a fixed, public throwaway key), so an ECDSA
/// account recovers *some* address and answers "invalid signature" instead of
/// reverting on a malformed one (OpenZeppelin's `ECDSA.recover` reverts on those).
fn stub_signature() -> Bytes {
    use alloy::signers::SignerSync;
    let key = B256::repeat_byte(0x11);
    alloy::signers::local::PrivateKeySigner::from_bytes(&key)
        .ok()
        .and_then(|k| k.sign_hash_sync(&B256::repeat_byte(0x22)).ok())
        .map(|sig| Bytes::from(sig.as_bytes().to_vec()))
        .unwrap_or_default()
}

async fn sender_creator(
    pool: &UpstreamPool,
    ep: &crate::ResolvedEntryPoint,
) -> Result<Address, EstimateError> {
    let tx = TransactionRequest {
        to: Some(TxKind::Call(ep.address())),
        input: TransactionInput::new(IEntryPointV08::senderCreatorCall {}.abi_encode().into()),
        ..Default::default()
    };
    let out = pool
        .call(&tx, alloy::rpc::types::BlockNumberOrTag::Latest)
        .await
        .map_err(EstimateError::Chain)?;
    IEntryPointV08::senderCreatorCall::abi_decode_returns(&out)
        .map_err(|_| EstimateError::ValidationReverted(out))
}

// ---- JSON-RPC ----

/// The request's operation, with absent gas fields, fees and signature filled in
/// (estimation and paymaster requests come before the operation is complete).
fn lenient_op(v: Option<&Value>) -> Result<UserOperation, CallError> {
    let Some(Value::Object(map)) = v else {
        return Err(CallError::malformed(&crate::MalformedField {
            field: "userOperation".to_owned(),
            problem: "is not a JSON object",
        }));
    };
    let mut map = map.clone();
    for key in [
        "callGasLimit",
        "verificationGasLimit",
        "preVerificationGas",
        "maxFeePerGas",
        "maxPriorityFeePerGas",
    ] {
        map.entry(key).or_insert_with(|| json!("0x0"));
    }
    map.entry("signature").or_insert_with(|| json!("0x"));
    if map.get("paymaster").is_some_and(|p| !p.is_null()) {
        map.entry("paymasterVerificationGasLimit")
            .or_insert_with(|| json!("0x0"));
        map.entry("paymasterPostOpGasLimit")
            .or_insert_with(|| json!("0x0"));
        map.entry("paymasterData").or_insert_with(|| json!("0x"));
    }
    crate::parse_user_operation(&Value::Object(map)).map_err(|e| CallError::malformed(&e))
}

fn entry_point_param(params: &Value, index: usize) -> Result<Address, CallError> {
    params
        .get(index)
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| CallError::invalid_params("expected [userOperation, entryPoint, ...]"))
}

/// The resolved EntryPoint when `named` is the configured or the resolved one.
async fn resolved_for_estimation(
    chain: &AaChain,
    named: Address,
) -> Result<crate::ResolvedEntryPoint, CallError> {
    let r = resolve_entry_point(&chain.pool, chain.directory)
        .await
        .map_err(|_| CallError::internal())?;
    if !r.accepts_for_estimation(named) {
        return Err(CallError::invalid_params(
            "unsupported EntryPoint (see eth_supportedEntryPoints)",
        ));
    }
    Ok(r.resolved)
}

fn chain_id_param(params: &Value, chain_id: u64) -> Result<(), CallError> {
    let given = params.get(2).and_then(Value::as_str).and_then(|s| {
        s.strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
    });
    if given == Some(chain_id) {
        Ok(())
    } else {
        Err(CallError::invalid_params(
            "expected [userOperation, entryPoint, chainId, context] with this route's chainId (hex)",
        ))
    }
}

fn hex(n: u128) -> String {
    format!("{n:#x}")
}

fn sponsor_of(chain: &AaChain) -> Result<&crate::flow::Sponsor, CallError> {
    chain.sponsor.as_ref().ok_or(CallError {
        code: crate::Erc7769Code::RejectedByPaymaster.code(),
        message: "no paymaster is configured on this chain".into(),
        data: Some(json!({"reason": "SPONSOR_NOT_CONFIGURED"})),
    })
}

/// `eth_estimateUserOperationGas`.
pub(crate) async fn estimate_rpc(chain: &AaChain, params: &Value) -> Result<Value, CallError> {
    let op = lenient_op(params.get(0))?;
    let ep = resolved_for_estimation(chain, entry_point_param(params, 1)?).await?;
    match estimate_user_operation_gas(&chain.pool, &ep, &op, chain.sponsor.as_ref()).await {
        Ok(g) => {
            let mut answer = json!({
                "preVerificationGas": hex(g.pre_verification_gas),
                "verificationGasLimit": hex(g.verification_gas_limit),
                "callGasLimit": hex(g.call_gas_limit),
            });
            // ERC-7769: the paymaster limits only for an operation that names a
            // paymaster (a client copies every field it gets, and a self-paid
            // operation with them does not parse).
            if op.paymaster.is_some() {
                answer["paymasterVerificationGasLimit"] =
                    json!(hex(g.paymaster_verification_gas_limit));
                answer["paymasterPostOpGasLimit"] = json!(hex(g.paymaster_post_op_gas_limit));
            }
            Ok(answer)
        }
        Err(EstimateError::ValidationReverted(data)) => Err(CallError {
            code: crate::Erc7769Code::RejectedByEntryPoint.code(),
            message: with_reason("the account's validation reverted", &data).into(),
            data: Some(json!({"revert": data})),
        }),
        Err(EstimateError::CallReverted(data)) => Err(CallError {
            code: crate::Erc7769Code::ExecutionReverted.code(),
            message: with_reason("the user operation's call reverted", &data).into(),
            data: Some(json!({"revert": data})),
        }),
        Err(EstimateError::CallNotUnderstood) => Err(CallError::invalid_params(
            "the callData of an account to be created must be execute or executeBatch to be estimated",
        )),
        Err(EstimateError::Malformed(e)) => Err(CallError {
            code: -32602,
            message: format!("malformed user operation: {e}").into(),
            data: None,
        }),
        Err(EstimateError::Chain(_)) => Err(CallError::internal()),
    }
}

/// `what`, followed by the decoded revert reason of `data` when it has one (as
/// `eth_sendUserOperation`'s refusals carry it; control characters dropped, at most 200
/// characters: [`crate::rejection::revert_reason_text`]).
fn with_reason(what: &str, data: &[u8]) -> String {
    match crate::rejection::revert_reason_text(data) {
        Some(reason) => format!("{what}: {reason}"),
        None => what.to_owned(),
    }
}

/// `pm_getPaymasterStubData` (ERC-7677).
pub(crate) async fn paymaster_stub_rpc(
    chain: &AaChain,
    chain_id: u64,
    params: &Value,
) -> Result<Value, CallError> {
    lenient_op(params.get(0))?;
    chain_id_param(params, chain_id)?;
    resolved_for_estimation(chain, entry_point_param(params, 1)?).await?;
    let sponsor = sponsor_of(chain)?;
    let stub = crate::stub_paymaster_data(ValidityWindow {
        valid_until: 0,
        valid_after: 0,
    })
    .map_err(|_| CallError::internal())?;
    Ok(json!({
        "paymaster": sponsor.paymaster.to_checksum(None),
        "paymasterData": stub,
        "paymasterVerificationGasLimit": hex(sponsor.verification_gas_limit),
        "paymasterPostOpGasLimit": hex(sponsor.post_op_gas_limit),
        "sponsor": {"name": "Keel"},
        "isFinal": false,
    }))
}

/// `pm_getPaymasterData` (ERC-7677): the policy, then the sponsor key's signature.
pub(crate) async fn paymaster_data_rpc(
    env: &AaEnv,
    chain: &AaChain,
    chain_id: u64,
    organization_id: Option<Uuid>,
    params: &Value,
) -> Result<Value, CallError> {
    let mut op = lenient_op(params.get(0))?;
    chain_id_param(params, chain_id)?;
    let ep = resolved_for_estimation(chain, entry_point_param(params, 1)?).await?;
    let sponsor = sponsor_of(chain)?;
    match op.paymaster {
        None => {
            op.paymaster_verification_gas_limit = sponsor.verification_gas_limit;
            op.paymaster_post_op_gas_limit = sponsor.post_op_gas_limit;
        }
        Some(p) if p == sponsor.paymaster => {}
        Some(_) => {
            return Err(CallError::invalid_params(
                "the user operation names another paymaster",
            ));
        }
    }
    let policy = chain
        .policy_for(organization_id)
        .filter(|_| organization_id.is_some());
    if policy.is_none()
        && crate::policy::total_gas(&op) > u128::from(chain.admission.sponsorship_max_gas)
    {
        // No policy applies: the default ceiling (`aa.sponsorshipMaxGasPerOperation`)
        // still bounds what Keel's paymaster signs.
        return Err(CallError {
            code: crate::Erc7769Code::RejectedByPaymaster.code(),
            message: "sponsorship refused: the user operation's gas exceeds the default sponsorship ceiling".into(),
            data: Some(json!({
                "reason": "SPONSOR_GAS_CEILING_EXCEEDED",
                "field": crate::admission::largest_gas_field(&op),
            })),
        });
    }
    if let (Some(policy), Some(org)) = (policy, organization_id) {
        let today = chrono::Utc::now().date_naive();
        let spent =
            crate::store::sponsorship_spend_get(&env.db, org, chain_id_i64(chain_id), today)
                .await
                .map_err(|_| CallError::internal())?;
        let spent = spent
            .parse::<U256>()
            .map(keel_units::Wei::new)
            .unwrap_or(keel_units::Wei::ZERO);
        if let Err(refusal) = policy.evaluate(&op, spent) {
            return Err(CallError {
                code: crate::Erc7769Code::RejectedByPaymaster.code(),
                message: "sponsorship refused by the policy".into(),
                data: Some(json!({"reason": refusal.code()})),
            });
        }
    }
    let now = u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
    let window = ValidityWindow {
        valid_until: now.saturating_add(sponsor.validity_secs),
        valid_after: 0,
    };
    crate::sign_sponsorship(&sponsor.signer, &mut op, &ep, sponsor.paymaster, window)
        .await
        .map_err(|e| match e {
            crate::SponsorError::WrongPaymaster => {
                CallError::invalid_params("the user operation names another paymaster")
            }
            _ => CallError::invalid_params("malformed user operation"),
        })?;
    Ok(json!({
        "paymaster": sponsor.paymaster.to_checksum(None),
        "paymasterData": op.paymaster_data,
    }))
}
