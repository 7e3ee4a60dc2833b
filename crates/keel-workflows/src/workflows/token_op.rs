//! The token operations `asset.mint`, `asset.transfer`, `asset.pause` and
//! `asset.unpause`: one write each, one at a time per asset, with an optional approval
//! wait before it.

use crate::env::WorkflowEnv;
use crate::workflows::contract::{
    APPROVAL_SIGNAL, ApprovalDecision, Failure, OpFailure, TokenAction, TokenOpInput, TokenOpOutput,
};
use crate::workflows::send::{Write, chain_of, send, step_ok, wait_indexed};
use alloy::sol_types::SolCall;
use keel_abi::bindings::AssetToken;
use keel_durable::{Deadline, SignalOutcome, Workflow, WorkflowContext, WorkflowFailure};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The body of every token operation: the chain, the optional approval wait, the
/// write, the read-after-write.
async fn run_token_op(
    p: &WorkflowEnv,
    ctx: &mut WorkflowContext,
    input: TokenOpInput,
) -> Result<TokenOpOutput, Failure> {
    let chain = chain_of(ctx, p, input.chain_id).await?;
    if let Some(ttl) = input.approval_ttl_seconds {
        ctx.set_progress(json!({ "phase": "approval" }));
        let decision = ctx
            .wait_signal::<ApprovalDecision>(
                APPROVAL_SIGNAL,
                Some(Deadline::After(Duration::from_secs(ttl))),
            )
            .await?;
        match decision {
            SignalOutcome::Received(d) if d.approved => {}
            SignalOutcome::Received(_) => {
                return Err(WorkflowFailure::Failed(OpFailure::new(
                    "APPROVAL_REJECTED",
                    false,
                    "the operation was rejected",
                )));
            }
            SignalOutcome::Expired => {
                return Err(WorkflowFailure::Failed(OpFailure::new(
                    "APPROVAL_EXPIRED",
                    false,
                    "no approval arrived before the deadline",
                )));
            }
        }
    }
    let (write, call) = match input.action {
        TokenAction::Mint { recipient, amount } => (
            "mint",
            AssetToken::mintCall {
                to: recipient,
                amount,
            }
            .abi_encode(),
        ),
        TokenAction::Transfer { recipient, amount } => (
            "transfer",
            AssetToken::transferCall {
                to: recipient,
                value: amount,
            }
            .abi_encode(),
        ),
        TokenAction::Pause => ("pause", AssetToken::pauseCall {}.abi_encode()),
        TokenAction::Unpause => ("unpause", AssetToken::unpauseCall {}.abi_encode()),
    };
    ctx.set_progress(json!({ "phase": write }));
    let landed = send(
        ctx,
        p,
        chain,
        Write {
            operation_id: input.operation_id,
            name: write,
            contract: input.token,
            funding_deadline: input.funding_deadline_seconds,
        },
        call,
    )
    .await?;
    ctx.set_progress(json!({ "phase": "index" }));
    let chain_id = chain.chain_id;
    let indexed_block = step_ok(
        ctx.step("wait indexed", || async move {
            wait_indexed(p, chain_id, landed.block).await
        })
        .await?,
    )?;
    ctx.set_progress(json!({ "phase": "done", "indexedBlock": indexed_block }));
    Ok(TokenOpOutput {
        tx_hash: landed.tx_hash,
        block: landed.block,
        indexed_block,
    })
}

macro_rules! token_workflow {
    ($(#[$doc:meta])* $ty:ident, $name:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $ty(pub Arc<WorkflowEnv>);

        impl Workflow for $ty {
            const NAME: &'static str = $name;
            type Input = TokenOpInput;
            type Output = TokenOpOutput;
            type Error = OpFailure;

            async fn run(
                &self,
                ctx: &mut WorkflowContext,
                input: TokenOpInput,
            ) -> Result<TokenOpOutput, Failure> {
                run_token_op(&self.0, ctx, input).await
            }
        }
    };
}

token_workflow!(
    /// `asset.mint`: optional approval wait, `AssetToken.mint`, read-after-write. Runs
    /// one at a time per asset (serialization key `asset:<id>`).
    AssetMint,
    "asset.mint"
);
token_workflow!(
    /// `asset.transfer`: `AssetToken.transfer` from the operator's holdings,
    /// read-after-write. One at a time per asset.
    AssetTransfer,
    "asset.transfer"
);
token_workflow!(
    /// `asset.pause`: `AssetToken.pause`, read-after-write. One at a time per asset.
    AssetPause,
    "asset.pause"
);
token_workflow!(
    /// `asset.unpause`: `AssetToken.unpause`, read-after-write. One at a time per asset.
    AssetUnpause,
    "asset.unpause"
);
