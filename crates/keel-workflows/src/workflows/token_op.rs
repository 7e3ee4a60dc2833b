//! The token operations `asset.mint`, `asset.transfer`, `asset.pause`, `asset.unpause`,
//! `asset.burn`, `asset.grant-role`, `asset.revoke-role`, `asset.set-compliance` and
//! the agent operations of regulated assets (issue 37 §3: `asset.freeze`,
//! `asset.unfreeze`, `asset.forced-transfer`, `asset.batch-mint`,
//! `asset.batch-transfer`): one write each, one at a time per asset, with an optional
//! approval wait before it. `asset.recover` is three writes (the registry entry copied,
//! the wallet recovered, the old entry removed), each sent exactly once.

use crate::env::{ChainContext, WorkflowEnv};
use crate::workflows::contract::{
    APPROVAL_SIGNAL, ApprovalDecision, Failure, Landed, OpFailure, RoleChangeOutput, TokenAction,
    TokenOpInput, TokenOpOutput, TokenRole,
};
use crate::workflows::send::{Write, chain_of, find_events, send, step_ok, wait_indexed};
use alloy::primitives::Address;
use alloy::sol_types::SolCall;
use keel_abi::bindings::{AssetToken, IdentityRegistry, RegulatedToken};
use keel_durable::{Deadline, SignalOutcome, Workflow, WorkflowContext, WorkflowFailure};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The calldata of `action`'s write on `AssetToken` `token` (or, for
/// [`TokenAction::SetCompliance`], on its system's `Compliance`).
fn calldata(action: &TokenAction, token: Address) -> Vec<u8> {
    match action {
        TokenAction::SetCompliance { rules } => keel_abi::bindings::Compliance::setRulesCall {
            token,
            rules: keel_abi::bindings::Compliance::Rules {
                eligibleOnly: rules.eligible_only,
                countryMode: rules.country_mode,
                maxHolders: rules.max_holders,
                maxBalance: rules.max_balance,
                lockupUntil: rules.lockup_until,
            },
            countries: rules.countries.clone(),
        }
        .abi_encode(),
        TokenAction::Mint { recipient, amount } => AssetToken::mintCall {
            to: *recipient,
            amount: *amount,
        }
        .abi_encode(),
        TokenAction::Transfer { recipient, amount } => AssetToken::transferCall {
            to: *recipient,
            value: *amount,
        }
        .abi_encode(),
        TokenAction::Pause => AssetToken::pauseCall {}.abi_encode(),
        TokenAction::Unpause => AssetToken::unpauseCall {}.abi_encode(),
        TokenAction::Burn { amount } => AssetToken::burnCall { value: *amount }.abi_encode(),
        TokenAction::ForcedBurn { from, amount } => AssetToken::forcedBurnCall {
            from: *from,
            amount: *amount,
        }
        .abi_encode(),
        TokenAction::GrantRole { role, account } => AssetToken::grantRoleCall {
            role: role.id(),
            account: *account,
        }
        .abi_encode(),
        TokenAction::RevokeRole { role, account } => AssetToken::revokeRoleCall {
            role: role.id(),
            account: *account,
        }
        .abi_encode(),
        TokenAction::SetAddressFrozen { account, frozen } => RegulatedToken::setAddressFrozenCall {
            account: *account,
            frozen: *frozen,
        }
        .abi_encode(),
        TokenAction::FreezePartial { account, amount } => RegulatedToken::freezePartialTokensCall {
            account: *account,
            amount: *amount,
        }
        .abi_encode(),
        TokenAction::UnfreezePartial { account, amount } => {
            RegulatedToken::unfreezePartialTokensCall {
                account: *account,
                amount: *amount,
            }
            .abi_encode()
        }
        TokenAction::ForcedTransfer {
            from,
            recipient,
            amount,
            enforce_compliance,
        } => RegulatedToken::forcedTransferCall {
            from: *from,
            to: *recipient,
            amount: *amount,
            enforceCompliance: *enforce_compliance,
        }
        .abi_encode(),
        TokenAction::Recover { lost, replacement } => RegulatedToken::recoveryAddressCall {
            lost: *lost,
            replacement: *replacement,
        }
        .abi_encode(),
        TokenAction::BatchMint { recipients } => RegulatedToken::batchMintCall {
            to: recipients.iter().map(|l| l.to).collect(),
            amounts: recipients.iter().map(|l| l.amount).collect(),
        }
        .abi_encode(),
        TokenAction::BatchTransfer { recipients } => RegulatedToken::batchTransferCall {
            to: recipients.iter().map(|l| l.to).collect(),
            amounts: recipients.iter().map(|l| l.amount).collect(),
        }
        .abi_encode(),
    }
}

/// The approval wait of an operation whose input names an approval deadline: an
/// approval goes on, a rejection fails `APPROVAL_REJECTED`, the deadline
/// `APPROVAL_EXPIRED`.
pub(crate) async fn await_approval(ctx: &mut WorkflowContext, ttl: u64) -> Result<(), Failure> {
    ctx.set_progress(json!({ "phase": "approval" }));
    let decision = ctx
        .wait_signal::<ApprovalDecision>(
            APPROVAL_SIGNAL,
            Some(Deadline::After(Duration::from_secs(ttl))),
        )
        .await?;
    match decision {
        SignalOutcome::Received(d) if d.approved => Ok(()),
        SignalOutcome::Received(_) => Err(WorkflowFailure::Failed(OpFailure::new(
            "APPROVAL_REJECTED",
            false,
            "the operation was rejected",
        ))),
        SignalOutcome::Expired => Err(WorkflowFailure::Failed(OpFailure::new(
            "APPROVAL_EXPIRED",
            false,
            "no approval arrived before the deadline",
        ))),
    }
}

/// The sender of a token operation's write: the custody vault when the template sends
/// through one (only it holds the asset's roles); otherwise the asset's issuer (the
/// pool sender that created it) while this runner holds its key, so the asset's
/// writes stay on one nonce stream; otherwise the operator key (an asset created
/// before the pool, or a pool sender retired since: the operator holds the token's
/// `DEFAULT_ADMIN_ROLE` from its creation). The choice feeds only the enqueue step,
/// which is journaled, so a replay never changes a queued request's sender.
fn token_op_sender(input: &TokenOpInput, chain: &ChainContext, operator: Address) -> Address {
    // The compliance rules are the system admin's (the operator's) to set.
    if matches!(input.action, TokenAction::SetCompliance { .. }) {
        return operator;
    }
    write_sender(input.sender, input.issuer, chain, operator)
}

/// The rule of [`token_op_sender`] for any write of an asset: its custody vault
/// (`sender`), else its `issuer` while this runner holds its key, else `operator`.
pub(crate) fn write_sender(
    sender: Option<Address>,
    issuer: Option<Address>,
    chain: &ChainContext,
    operator: Address,
) -> Address {
    match (sender, issuer) {
        (Some(vault), _) => vault,
        (None, Some(issuer)) if chain.queue.has_sender(issuer) => issuer,
        _ => operator,
    }
}

/// What every token operation does: the chain, the optional approval wait, the write
/// (named [`TokenAction::write`]). Returns the chain and the landed transaction.
async fn write_token_op<'a>(
    p: &'a WorkflowEnv,
    ctx: &mut WorkflowContext,
    input: &TokenOpInput,
) -> Result<(&'a ChainContext, Landed), Failure> {
    let chain = chain_of(ctx, p, input.chain_id).await?;
    if let Some(ttl) = input.approval_ttl_seconds {
        await_approval(ctx, ttl).await?;
    }
    let write = input.action.write();
    ctx.set_progress(json!({ "phase": write }));
    let landed = send(
        ctx,
        p,
        chain,
        Write {
            operation_id: input.operation_id,
            name: write,
            contract: input.target.unwrap_or(input.token),
            funding_deadline: input.funding_deadline_seconds,
            sender: token_op_sender(input, chain, p.operator),
            value: keel_units::Wei::ZERO,
        },
        calldata(&input.action, input.token),
    )
    .await?;
    Ok((chain, landed))
}

/// The read-after-write that ends every token operation: waits until the index has
/// committed the write's block; returns the indexed block.
async fn read_after_write(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    chain: &ChainContext,
    landed: Landed,
) -> Result<u64, Failure> {
    ctx.set_progress(json!({ "phase": "index" }));
    let chain_id = chain.chain_id;
    let indexed_block = step_ok(
        ctx.step("wait indexed", || async move {
            wait_indexed(p, chain_id, landed.block).await
        })
        .await?,
    )?;
    ctx.set_progress(json!({ "phase": "done", "indexedBlock": indexed_block }));
    Ok(indexed_block)
}

/// The body of mint, transfer, pause, unpause and burn.
async fn run_token_op(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    input: TokenOpInput,
) -> Result<TokenOpOutput, Failure> {
    let (chain, landed) = write_token_op(p, ctx, &input).await?;
    let indexed_block = read_after_write(p, ctx, chain, landed).await?;
    Ok(TokenOpOutput {
        tx_hash: landed.tx_hash,
        block: landed.block,
        indexed_block,
    })
}

/// The body of grant-role and revoke-role: the write, then whether it changed the role
/// (its `RoleGranted` / `RoleRevoked` event for that role and account, read from the
/// receipt in a journaled step), then the read-after-write.
async fn run_role_change(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    input: TokenOpInput,
) -> Result<RoleChangeOutput, Failure> {
    let (grant, role, account) = match input.action {
        TokenAction::GrantRole { role, account } => (true, role, account),
        TokenAction::RevokeRole { role, account } => (false, role, account),
        _ => {
            return Err(WorkflowFailure::Failed(OpFailure::new(
                "INPUT_MISMATCH",
                false,
                "the operation's input is not a role change",
            )));
        }
    };
    let (chain, landed) = write_token_op(p, ctx, &input).await?;
    let token = input.token;
    let changed = step_ok(
        ctx.step("role event", || async move {
            role_changed(chain, landed, token, grant, role, account).await
        })
        .await?,
    )?;
    let indexed_block = read_after_write(p, ctx, chain, landed).await?;
    Ok(RoleChangeOutput {
        tx_hash: landed.tx_hash,
        block: landed.block,
        indexed_block,
        role,
        account,
        changed,
    })
}

/// Whether the receipt of `landed` holds `RoleGranted` (`grant`) or `RoleRevoked` for
/// `role` and `account`, emitted by `token`.
async fn role_changed(
    chain: &ChainContext,
    landed: Landed,
    token: Address,
    grant: bool,
    role: TokenRole,
    account: Address,
) -> Result<bool, keel_durable::StepError<OpFailure>> {
    let id = role.id();
    Ok(if grant {
        find_events::<AssetToken::RoleGranted>(chain, landed, token)
            .await?
            .iter()
            .any(|e| e.role == id && e.account == account)
    } else {
        find_events::<AssetToken::RoleRevoked>(chain, landed, token)
            .await?
            .iter()
            .any(|e| e.role == id && e.account == account)
    })
}

/// The crash points of `asset.recover`, in the order they are passed (see
/// [`crate::workflows::org_system::crash_point`]).
pub const RECOVER_CRASH_POINTS: [&str; 3] = [
    "recover.investor-copied",
    "recover.recovered",
    "recover.investor-removed",
];

/// The body of `asset.recover`: the approval wait, then
/// 1. step `read investor`: the lost wallet's entry in the system's registry (journaled:
///    a replay sends what the first run read);
/// 2. when it is registered, write `copy-investor`: `IdentityRegistry.setInvestor` of
///    the replacement with the same attributes (before the recovery, so the token's
///    compliance check accepts the replacement as the lost wallet was accepted);
/// 3. write `recover`: `RegulatedToken.recoveryAddress(lost, replacement)`;
/// 4. when it was registered, write `remove-investor`: `IdentityRegistry.removeInvestor`
///    of the lost wallet;
/// 5. the read-after-write of the last write.
///
/// Each write is a queue request keyed by (operation, write name), so a runner killed
/// anywhere resumes the journal and no write is sent twice. Registry writes are sent by
/// the operator (the registry's agent), the recovery by the asset's sender.
async fn run_recovery(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    input: TokenOpInput,
) -> Result<TokenOpOutput, Failure> {
    let TokenAction::Recover { lost, replacement } = input.action else {
        return Err(WorkflowFailure::Failed(OpFailure::new(
            "INPUT_MISMATCH",
            false,
            "the operation's input is not a wallet recovery",
        )));
    };
    let Some(registry) = input.registry else {
        return Err(WorkflowFailure::Failed(OpFailure::new(
            "ASSET_NOT_REGULATED",
            false,
            "the asset has no organization system registry",
        )));
    };
    let chain = chain_of(ctx, p, input.chain_id).await?;
    if let Some(ttl) = input.approval_ttl_seconds {
        await_approval(ctx, ttl).await?;
    }
    ctx.set_progress(json!({ "phase": "read investor" }));
    let entry = step_ok(
        ctx.step("read investor", || async move {
            investor_of(chain, registry, lost).await
        })
        .await?,
    )?;
    let registry_write = |name: &'static str| Write {
        operation_id: input.operation_id,
        name,
        contract: registry,
        funding_deadline: input.funding_deadline_seconds,
        sender: p.operator,
        value: keel_units::Wei::ZERO,
    };
    if let Some(e) = &entry {
        ctx.set_progress(json!({ "phase": "copy-investor" }));
        let call = IdentityRegistry::setInvestorCall {
            investor: replacement,
            eligible: e.eligible,
            country: e.country,
            expiry: e.expiry,
        }
        .abi_encode();
        send(ctx, p, chain, registry_write("copy-investor"), call).await?;
        crate::workflows::org_system::crash_point(RECOVER_CRASH_POINTS[0]);
    }
    ctx.set_progress(json!({ "phase": "recover" }));
    let mut landed = send(
        ctx,
        p,
        chain,
        Write {
            operation_id: input.operation_id,
            name: input.action.write(),
            contract: input.token,
            funding_deadline: input.funding_deadline_seconds,
            sender: token_op_sender(&input, chain, p.operator),
            value: keel_units::Wei::ZERO,
        },
        calldata(&input.action, input.token),
    )
    .await?;
    crate::workflows::org_system::crash_point(RECOVER_CRASH_POINTS[1]);
    if entry.is_some() {
        ctx.set_progress(json!({ "phase": "remove-investor" }));
        let call = IdentityRegistry::removeInvestorCall { investor: lost }.abi_encode();
        landed = send(ctx, p, chain, registry_write("remove-investor"), call).await?;
        crate::workflows::org_system::crash_point(RECOVER_CRASH_POINTS[2]);
    }
    let indexed_block = read_after_write(p, ctx, chain, landed).await?;
    Ok(TokenOpOutput {
        tx_hash: landed.tx_hash,
        block: landed.block,
        indexed_block,
    })
}

/// A registered investor's attributes, as `IdentityRegistry.investorOf` answers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InvestorEntry {
    eligible: bool,
    country: u16,
    expiry: u64,
}

/// `registry.investorOf(investor)` at the latest block: `None` when not registered.
async fn investor_of(
    chain: &ChainContext,
    registry: Address,
    investor: Address,
) -> Result<Option<InvestorEntry>, keel_durable::StepError<OpFailure>> {
    let tx = alloy::rpc::types::TransactionRequest::default()
        .to(registry)
        .input(
            IdentityRegistry::investorOfCall { investor }
                .abi_encode()
                .into(),
        );
    let out = chain
        .node
        .call(&tx, alloy::eips::BlockNumberOrTag::Latest)
        .await
        .map_err(|_| {
            crate::workflows::send::chain_read_unavailable("RPC_UNAVAILABLE", chain.chain_id)
        })?;
    let i = IdentityRegistry::investorOfCall::abi_decode_returns(&out).map_err(|_| {
        keel_durable::StepError::Failed(OpFailure::new(
            "REGISTRY_UNREADABLE",
            false,
            "the organization system's registry did not answer investorOf",
        ))
    })?;
    Ok(i.registered.then_some(InvestorEntry {
        eligible: i.eligible,
        country: i.country,
        expiry: i.expiry,
    }))
}

macro_rules! token_workflow {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $output:ty, $body:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $ty(pub Arc<WorkflowEnv>);

        impl Workflow for $ty {
            const NAME: &'static str = $name;
            type Input = TokenOpInput;
            type Output = $output;
            type Error = OpFailure;

            async fn run(
                &self,
                ctx: &mut WorkflowContext,
                input: TokenOpInput,
            ) -> Result<$output, Failure> {
                $body(&self.0, ctx, input).await
            }
        }
    };
}

token_workflow!(
    /// `asset.mint`: optional approval wait, `AssetToken.mint`, read-after-write. Runs
    /// one at a time per asset (serialization key `asset:<id>`).
    AssetMint,
    "asset.mint",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.transfer`: `AssetToken.transfer` from the operator's holdings,
    /// read-after-write. One at a time per asset.
    AssetTransfer,
    "asset.transfer",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.pause`: `AssetToken.pause`, read-after-write. One at a time per asset.
    AssetPause,
    "asset.pause",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.unpause`: `AssetToken.unpause`, read-after-write. One at a time per asset.
    AssetUnpause,
    "asset.unpause",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.burn`: optional approval wait, then `AssetToken.burn` of the operator's
    /// own holdings ([`TokenAction::Burn`], write `burn`) or `AssetToken.forcedBurn` of
    /// a holder's ([`TokenAction::ForcedBurn`], write `forced-burn`; the operator needs
    /// `BURNER_ROLE`), read-after-write. One at a time per asset.
    AssetBurn,
    "asset.burn",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.set-compliance`: optional approval wait, `Compliance.setRules` of the
    /// asset's organization system (sent by the operator, the system's admin),
    /// read-after-write. One at a time per asset.
    AssetSetCompliance,
    "asset.set-compliance",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.grant-role`: optional approval wait, `AssetToken.grantRole` (write
    /// `grant-role`), whether the role changed, read-after-write. One at a time per
    /// asset.
    AssetGrantRole,
    "asset.grant-role",
    RoleChangeOutput,
    run_role_change
);
token_workflow!(
    /// `asset.revoke-role`: optional approval wait, `AssetToken.revokeRole` (write
    /// `revoke-role`), whether the role changed, read-after-write. One at a time per
    /// asset.
    AssetRevokeRole,
    "asset.revoke-role",
    RoleChangeOutput,
    run_role_change
);
token_workflow!(
    /// `asset.freeze` (issue 37 §3): optional approval wait, then
    /// `RegulatedToken.setAddressFrozen(account, true)` (write `freeze-address`) or, with
    /// an amount, `freezePartialTokens` (write `freeze-partial`), read-after-write.
    AssetFreeze,
    "asset.freeze",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.unfreeze`: optional approval wait, then `setAddressFrozen(account, false)`
    /// (write `unfreeze-address`) or, with an amount, `unfreezePartialTokens` (write
    /// `unfreeze-partial`), read-after-write.
    AssetUnfreeze,
    "asset.unfreeze",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.forced-transfer`: optional approval wait, `RegulatedToken.forcedTransfer`
    /// (compliance enforced unless the template skips it), read-after-write.
    AssetForcedTransfer,
    "asset.forced-transfer",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.recover`: a lost wallet's balance, frozen state and registry entry moved
    /// to a new wallet (see `run_recovery`).
    AssetRecover,
    "asset.recover",
    TokenOpOutput,
    run_recovery
);
token_workflow!(
    /// `asset.batch-mint`: optional approval wait, `RegulatedToken.batchMint` (one
    /// transaction, all or nothing), read-after-write.
    AssetBatchMint,
    "asset.batch-mint",
    TokenOpOutput,
    run_token_op
);
token_workflow!(
    /// `asset.batch-transfer`: optional approval wait, `RegulatedToken.batchTransfer` from
    /// the issuer's holdings (one transaction, all or nothing), read-after-write.
    AssetBatchTransfer,
    "asset.batch-transfer",
    TokenOpOutput,
    run_token_op
);
