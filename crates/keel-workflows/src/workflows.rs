//! The asset workflows: `asset.create` and the token operations `asset.mint`,
//! `asset.transfer`, `asset.pause`, `asset.unpause`.
//!
//! Every on-chain write is one transaction-queue request keyed
//! `op/<operation id>/<step>` and one journaled enqueue step; the workflow then waits
//! for the request's settlement verdict, which the verdict relay ([`crate::relay`])
//! delivers as the signal `tx.<step>`. Replaying a workflow after a crash therefore
//! never enqueues a second transaction for a step (the key is the same and the queue
//! is idempotent) and never broadcasts a landed write again.

use crate::platform::{ChainContext, Platform};
use alloy::primitives::{Address, B256, I256, U256};
use alloy::sol_types::{SolCall, SolEvent};
use keel_abi::bindings::{AssetFactory, AssetToken, PriceFeed, PriceFeedFactory, PriceResolver};
use keel_durable::{
    Deadline, SignalOutcome, StepError, Workflow, WorkflowContext, WorkflowFailure,
};
use keel_txq::{FailureCode, SettlementVerdict, TxRequest};
use keel_units::{ChainId, Wei};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Names of every workflow the Platform API can start. The runner registers exactly
/// these ([`register_all`]); a test keeps the two in step.
pub const WORKFLOWS: [&str; 5] = [
    AssetCreate::NAME,
    AssetMint::NAME,
    AssetTransfer::NAME,
    AssetPause::NAME,
    AssetUnpause::NAME,
];

/// The code of an enqueue step that found its operation cancelled (journaled as that
/// step's result; the workflow then ends `cancelled`).
pub const CANCELLED: &str = "CANCELLED";

/// The signal an approval decision is delivered as.
pub const APPROVAL_SIGNAL: &str = "approval";

/// Prefix of the signal a transaction's verdict is delivered as (`tx.<step>`).
pub const TX_SIGNAL_PREFIX: &str = "tx.";

/// The typed failure of an operation (the workflow's `Error`). `detail` is value-free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpFailure {
    /// Stable code: `EXECUTION_REVERTED`, `GAS_REQUIRED`, `FUNDING_DEADLINE_EXPIRED`,
    /// `NONCE_CONSUMED_EXTERNALLY`, `APPROVAL_EXPIRED`, `APPROVAL_REJECTED`,
    /// `CHAIN_NOT_CONFIGURED`, `REJECTED`, ...
    pub code: String,
    /// Whether retrying the operation can help.
    pub retryable: bool,
    /// A value-free description.
    pub detail: String,
    /// The step that failed, when a transaction did.
    pub step: Option<String>,
    /// The decoded revert reason (`Error(string)`) or custom error name, when the chain
    /// reported one. Contract texts, not caller input.
    pub reason: Option<String>,
}

impl OpFailure {
    fn new(code: &str, retryable: bool, detail: &str) -> Self {
        Self {
            code: code.to_owned(),
            retryable,
            detail: detail.to_owned(),
            step: None,
            reason: None,
        }
    }
}

type Failure = WorkflowFailure<OpFailure>;

/// A confirmed transaction of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Landed {
    /// The hash of the attempt that mined.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
}

/// Input of `asset.create` (built by the operations service from the request and the
/// asset's template).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateInput {
    /// The operation.
    pub operation_id: Uuid,
    /// The asset (its 16 bytes, left-padded, are the on-chain asset id).
    pub asset_id: Uuid,
    /// EIP-155 chain id (from the template).
    pub chain_id: u64,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// Decimals of the feed's answers (from the template).
    pub price_decimals: u8,
    /// The first observation: the initial price scaled by `price_decimals`, as a
    /// decimal integer string (an `int256` answer).
    pub price_answer: String,
    /// Staleness bound installed on the `PriceResolver`, seconds (from the template).
    pub staleness_bound_seconds: u64,
    /// Funding pause deadline, seconds, when the template enables the pause.
    pub funding_deadline_seconds: Option<u64>,
}

/// Output of `asset.create`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateOutput {
    /// The token contract.
    pub token: Address,
    /// The price feed contract.
    pub feed: Address,
    /// The index block that showed the asset (read-after-write).
    pub indexed_block: u64,
}

/// The token operation of a [`TokenOpInput`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum TokenAction {
    /// `AssetToken.mint(to, amount)`.
    Mint {
        /// Recipient.
        to: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.transfer(to, amount)` from the operator's (issuer's) holdings.
    Transfer {
        /// Recipient.
        to: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.pause()`.
    Pause,
    /// `AssetToken.unpause()`.
    Unpause,
}

/// Input of the token operations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOpInput {
    /// The operation.
    pub operation_id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The token contract.
    pub token: Address,
    /// What to do.
    pub action: TokenAction,
    /// When set, the operation waits for an approval this many seconds before it fails
    /// `APPROVAL_EXPIRED`.
    pub approval_ttl_seconds: Option<u64>,
    /// Funding pause deadline, seconds, when the template enables the pause.
    pub funding_deadline_seconds: Option<u64>,
}

/// Output of the token operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOpOutput {
    /// The transaction.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
    /// The index block that reflects it (read-after-write).
    pub indexed_block: u64,
}

/// An approval decision (the payload of the [`APPROVAL_SIGNAL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// Approved (true) or rejected (false).
    pub approved: bool,
    /// The deciding API key.
    pub api_key_id: Uuid,
}

/// The on-chain asset id of a Keel asset: its UUID's 16 bytes, left-padded to 32.
pub fn onchain_asset_id(asset_id: Uuid) -> B256 {
    B256::left_padding_from(asset_id.as_bytes())
}

/// The chain of an operation. A chain this runner does not serve (yet: unreachable or
/// not bootstrapped; the binary keeps retrying it) suspends the instance
/// (`CHAIN_NOT_CONFIGURED`) with recovery retries instead of failing it: another
/// runner, or this one once it serves the chain, resumes it.
async fn chain_of<'a>(
    ctx: &mut WorkflowContext,
    p: &'a Platform,
    chain_id: u64,
) -> Result<&'a ChainContext, Failure> {
    let served = p.chain(chain_id).is_some();
    step_ok(
        ctx.step("chain", || async move {
            if served {
                Ok(chain_id)
            } else {
                Err(StepError::<OpFailure>::transient("CHAIN_NOT_CONFIGURED"))
            }
        })
        .await?,
    )?;
    // Journaled as served by an earlier segment on a runner that served the chain,
    // replayed here on one that does not: fail retryably (a retry resumes the journal).
    p.chain(chain_id).ok_or_else(|| {
        WorkflowFailure::Failed(OpFailure::new(
            "CHAIN_NOT_CONFIGURED",
            true,
            "the asset's chain is not served by this runner",
        ))
    })
}

/// Enqueues one transaction for `step` and waits for its verdict (delivered by the
/// relay as the signal `tx.<step>`). Confirmed → [`Landed`]; anything else fails the
/// workflow with the verdict's code.
#[allow(clippy::too_many_arguments)] // one call site shape: context, platform, chain, the step's transaction
async fn send(
    ctx: &mut WorkflowContext,
    p: &Platform,
    chain: &ChainContext,
    operation_id: Uuid,
    step: &str,
    to: Address,
    call: Vec<u8>,
    funding_deadline: Option<u64>,
) -> Result<Landed, Failure> {
    let data = p.suffix.append_to(&call);
    let mut attempt: u32 = 1;
    loop {
        // Attempt 1 keeps the plain names; later attempts (after a retryable failure
        // and a retry of the operation) are new, separately keyed requests.
        let (link, key) = if attempt == 1 {
            (step.to_owned(), format!("op/{operation_id}/{step}"))
        } else {
            (
                format!("{step}#{attempt}"),
                format!("op/{operation_id}/{step}/{attempt}"),
            )
        };
        let signal = format!("{TX_SIGNAL_PREFIX}{link}");
        let request = TxRequest {
            sender: p.operator,
            idempotency_key: key,
            to: Some(to),
            value: Wei::ZERO,
            data: data.clone(),
            gas_limit: None,
        };
        let verdict = send_attempt(
            ctx,
            p,
            chain,
            operation_id,
            &link,
            &signal,
            request,
            funding_deadline,
        )
        .await?;
        match verdict {
            SettlementVerdict::Confirmed { block, hash, .. } => {
                return Ok(Landed {
                    tx_hash: hash,
                    block,
                });
            }
            SettlementVerdict::Reverted {
                reason,
                revert_data,
                ..
            } => {
                return Err(WorkflowFailure::Failed(OpFailure {
                    code: "EXECUTION_REVERTED".to_owned(),
                    retryable: false,
                    detail: "the transaction reverted on chain".to_owned(),
                    step: Some(step.to_owned()),
                    reason: reason
                        .or_else(|| revert_data.as_ref().and_then(|d| custom_error_name(d))),
                }));
            }
            SettlementVerdict::Failed {
                code,
                reason,
                revert_data,
                ..
            } => {
                let reason =
                    reason.or_else(|| revert_data.as_ref().and_then(|d| custom_error_name(d)));
                let retryable = matches!(
                    code,
                    FailureCode::GasRequired | FailureCode::FundingDeadlineExpired
                );
                // Not journaled on purpose: the retry count only grows, so every replay
                // takes the same path up to here, and the retried path after a retry.
                if retryable && crate::ops::operation_retries(&p.db, operation_id).await >= attempt
                {
                    attempt += 1;
                    continue;
                }
                return Err(WorkflowFailure::Failed(OpFailure {
                    detail: match &code {
                        FailureCode::GasRequired => {
                            "the operator account cannot pay for gas; fund it and retry the operation"
                        }
                        FailureCode::FundingDeadlineExpired => {
                            "the operator account was not funded in time; fund it and retry the operation"
                        }
                        FailureCode::ExecutionReverted => "the transaction would revert",
                        _ => "the transaction did not take effect",
                    }
                    .to_owned(),
                    code: code.to_string(),
                    retryable,
                    step: Some(step.to_owned()),
                    reason,
                }));
            }
            _ => {
                return Err(WorkflowFailure::Failed(OpFailure::new(
                    "VERDICT_UNKNOWN",
                    false,
                    "the settlement verdict has an unknown kind",
                )));
            }
        }
    }
}

/// The name of a custom error of Keel's contracts (or of OpenZeppelin's, which they
/// inherit) from revert data, e.g. `ERC20InsufficientBalance`, `EnforcedPause`,
/// `PriceNotFresh`. The name only: the error's arguments are not copied.
pub fn custom_error_name(data: &[u8]) -> Option<String> {
    let selector: [u8; 4] = data.get(..4)?.try_into().ok()?;
    AssetToken::AssetTokenErrors::name_by_selector(selector)
        .or_else(|| AssetFactory::AssetFactoryErrors::name_by_selector(selector))
        .or_else(|| PriceResolver::PriceResolverErrors::name_by_selector(selector))
        .or_else(|| PriceFeed::PriceFeedErrors::name_by_selector(selector))
        .map(str::to_owned)
}

/// One attempt of a step's transaction: the journaled enqueue (and link for the relay),
/// then the wait for its verdict.
#[allow(clippy::too_many_arguments)] // the attempt's identity: operation, link, signal, request
async fn send_attempt(
    ctx: &mut WorkflowContext,
    p: &Platform,
    chain: &ChainContext,
    operation_id: Uuid,
    link: &str,
    signal: &str,
    request: TxRequest,
    funding_deadline: Option<u64>,
) -> Result<SettlementVerdict, Failure> {
    let instance_id = ctx.instance_id();
    let enqueued: Result<Uuid, OpFailure> = ctx
        .step(&format!("enqueue {link}"), || {
            let request = request.clone();
            async move {
                // The operation's row lock orders this enqueue with a cancel: once a
                // cancel was recorded no new write of the operation is queued, and a
                // cancel that comes after sees (and withdraws) the request linked here.
                let Some(mut guard) = crate::ops::write_guard(&p.db, operation_id)
                    .await
                    .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?
                else {
                    return Err(StepError::Failed(OpFailure::new(
                        CANCELLED,
                        false,
                        "the operation was cancelled before this transaction was queued",
                    )));
                };
                let id = chain
                    .queue
                    .enqueue_with(
                        &request,
                        &keel_txq::EnqueueOptions {
                            funding_pause: funding_deadline.map(Duration::from_secs),
                        },
                    )
                    .await
                    .map_err(|e| {
                        if e.is_retryable() {
                            StepError::transient("TXQ_UNAVAILABLE")
                        } else {
                            StepError::Failed(OpFailure::new(
                                "TX_REQUEST_REFUSED",
                                false,
                                "the transaction queue refused the request",
                            ))
                        }
                    })?;
                crate::ops::link_operation_tx(
                    &mut *guard,
                    operation_id,
                    link,
                    id,
                    instance_id,
                    signal,
                )
                .await
                .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?;
                guard
                    .commit()
                    .await
                    .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?;
                Ok(id)
            }
        })
        .await?;
    match enqueued {
        Ok(_) => {}
        // Cancelled before this write was queued: end `cancelled` (the writes of earlier
        // steps, if any, landed and show in the operation's milestones).
        Err(f) if f.code == CANCELLED => return Err(ctx.cancel_self().into()),
        Err(f) => return Err(WorkflowFailure::Failed(f)),
    }
    match ctx.wait_signal::<SettlementVerdict>(signal, None).await? {
        SignalOutcome::Received(v) => Ok(v),
        SignalOutcome::Expired => Err(WorkflowFailure::Failed(OpFailure::new(
            "VERDICT_MISSING",
            true,
            "no settlement verdict arrived",
        ))),
    }
}

/// Reads a log of `E` emitted by `emitter` in the receipt of `landed`.
async fn read_event<E: SolEvent>(
    chain: &ChainContext,
    landed: Landed,
    emitter: Address,
) -> Result<E, StepError<OpFailure>> {
    let receipts = chain
        .node
        .receipts(&[landed.tx_hash])
        .await
        .map_err(|_| StepError::transient("RPC_UNAVAILABLE"))?;
    let Some(Some(receipt)) = receipts.into_iter().next() else {
        return Err(StepError::transient("RECEIPT_UNAVAILABLE"));
    };
    receipt
        .inner
        .logs()
        .iter()
        .filter(|l| l.address() == emitter)
        .find_map(|l| E::decode_log_data(l.data()).ok())
        .ok_or_else(|| {
            StepError::Failed(OpFailure::new(
                "EVENT_MISSING",
                false,
                "the confirmed transaction did not emit the expected event",
            ))
        })
}

/// Waits (bounded by `index_wait`) until the index has committed `block`; returns the
/// indexed tip.
async fn wait_indexed(
    p: &Platform,
    chain: ChainId,
    block: u64,
) -> Result<u64, StepError<OpFailure>> {
    keel_index::wait_for_block(
        &p.db,
        chain,
        block,
        p.index_wait,
        Duration::from_millis(200),
    )
    .await
    .map(|tip| tip.number)
    .map_err(|_| StepError::transient("INDEX_BEHIND"))
}

fn step_ok<T>(r: Result<T, OpFailure>) -> Result<T, Failure> {
    r.map_err(WorkflowFailure::Failed)
}

/// `asset.create`: deploys an asset's token and price feed and makes it mintable.
///
/// Order (fail-closed; every write is its own queue request and journaled step):
/// 1. `create-feed` — `PriceFeedFactory.createFeed` (the token's constructor needs the
///    feed's address, so the feed comes first; its address is read from `FeedCreated`);
/// 2. `deploy-token` — `AssetFactory.createAsset` (CREATE2, salt from the asset id; the
///    token starts **paused**; its address is read from `AssetCreated`);
/// 3. `submit-observation` — the first `PriceFeed.submit`;
/// 4. `set-bound` — `PriceResolver.setStalenessBound`, the last feed-phase write: until
///    it lands `isFresh` is false, so no mint can succeed;
/// 5. `unpause` — `AssetToken.unpause`;
/// 6. read-after-write: wait until the index has committed the unpause block and shows
///    the asset.
///
/// A failure before step 5 leaves the token paused and unmintable; the operation's
/// milestones show the hashes that landed. A retry resumes at the first step without a
/// journaled result.
#[derive(Debug, Clone)]
pub struct AssetCreate(pub Arc<Platform>);

impl Workflow for AssetCreate {
    const NAME: &'static str = "asset.create";
    type Input = AssetCreateInput;
    type Output = AssetCreateOutput;
    type Error = OpFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: AssetCreateInput,
    ) -> Result<AssetCreateOutput, Failure> {
        let p = &*self.0;
        let chain = chain_of(ctx, p, input.chain_id).await?;
        let c = chain.contracts;
        let op = input.operation_id;
        let funding = input.funding_deadline_seconds;
        let answer = I256::from_dec_str(&input.price_answer).map_err(|_| {
            WorkflowFailure::Failed(OpFailure::new(
                "INVALID_INPUT",
                false,
                "price answer is not an int256",
            ))
        })?;

        ctx.set_progress(json!({ "phase": "create-feed" }));
        let call = PriceFeedFactory::createFeedCall {
            decimals: input.price_decimals,
            description: format!("{} / price", input.symbol),
            admin: p.operator,
            updater: p.operator,
        }
        .abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            op,
            "create-feed",
            c.price_feed_factory,
            call,
            funding,
        )
        .await?;
        let feed = step_ok(
            ctx.step("read feed address", || async move {
                read_event::<PriceFeedFactory::FeedCreated>(chain, landed, c.price_feed_factory)
                    .await
                    .map(|e| e.feed)
            })
            .await?,
        )?;

        ctx.set_progress(json!({ "phase": "deploy-token", "feed": feed }));
        let call = AssetFactory::createAssetCall {
            assetId: onchain_asset_id(input.asset_id),
            name: input.name.clone(),
            symbol: input.symbol.clone(),
            decimals: input.decimals,
            tokenAdmin: p.operator,
            priceFeed: feed,
        }
        .abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            op,
            "deploy-token",
            c.asset_factory,
            call,
            funding,
        )
        .await?;
        let token = step_ok(
            ctx.step("record token address", || async move {
                let token =
                    read_event::<AssetFactory::AssetCreated>(chain, landed, c.asset_factory)
                        .await?
                        .token;
                crate::ops::record_asset_addresses(&p.db, input.asset_id, token, feed)
                    .await
                    .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?;
                Ok(token)
            })
            .await?,
        )?;

        ctx.set_progress(json!({ "phase": "submit-observation", "feed": feed, "token": token }));
        let call = PriceFeed::submitCall { answer }.abi_encode();
        send(ctx, p, chain, op, "submit-observation", feed, call, funding).await?;

        ctx.set_progress(json!({ "phase": "set-bound", "feed": feed, "token": token }));
        let call = PriceResolver::setStalenessBoundCall {
            feed,
            boundSeconds: U256::from(input.staleness_bound_seconds),
        }
        .abi_encode();
        send(
            ctx,
            p,
            chain,
            op,
            "set-bound",
            c.price_resolver,
            call,
            funding,
        )
        .await?;

        ctx.set_progress(json!({ "phase": "unpause", "feed": feed, "token": token }));
        let call = AssetToken::unpauseCall {}.abi_encode();
        let landed = send(ctx, p, chain, op, "unpause", token, call, funding).await?;

        ctx.set_progress(json!({ "phase": "index", "feed": feed, "token": token }));
        let chain_id = chain.chain_id;
        let indexed_block = step_ok(
            ctx.step("wait indexed", || async move {
                let tip = wait_indexed(p, chain_id, landed.block).await?;
                let shown = keel_index::read::assets(&p.db, chain_id)
                    .await
                    .map_err(|_| StepError::transient("INDEX_UNAVAILABLE"))?
                    .iter()
                    .any(|a| a.token == token);
                if shown {
                    Ok(tip)
                } else {
                    Err(StepError::transient("INDEX_BEHIND"))
                }
            })
            .await?,
        )?;
        ctx.set_progress(
            json!({ "phase": "done", "feed": feed, "token": token, "indexedBlock": indexed_block }),
        );
        Ok(AssetCreateOutput {
            token,
            feed,
            indexed_block,
        })
    }
}

async fn run_token_op(
    p: &Platform,
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
    let (step, call) = match input.action {
        TokenAction::Mint { to, amount } => {
            ("mint", AssetToken::mintCall { to, amount }.abi_encode())
        }
        TokenAction::Transfer { to, amount } => (
            "transfer",
            AssetToken::transferCall { to, value: amount }.abi_encode(),
        ),
        TokenAction::Pause => ("pause", AssetToken::pauseCall {}.abi_encode()),
        TokenAction::Unpause => ("unpause", AssetToken::unpauseCall {}.abi_encode()),
    };
    ctx.set_progress(json!({ "phase": step }));
    let landed = send(
        ctx,
        p,
        chain,
        input.operation_id,
        step,
        input.token,
        call,
        input.funding_deadline_seconds,
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
        pub struct $ty(pub Arc<Platform>);

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

/// Registers every workflow of [`WORKFLOWS`] with `engine`.
pub fn register_all(engine: keel_durable::Engine, platform: Arc<Platform>) -> keel_durable::Engine {
    engine
        .register(AssetCreate(platform.clone()))
        .register(AssetMint(platform.clone()))
        .register(AssetTransfer(platform.clone()))
        .register(AssetPause(platform.clone()))
        .register(AssetUnpause(platform))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_ids_are_left_padded_uuids() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let b = onchain_asset_id(id);
        assert!(b[..16].iter().all(|x| *x == 0));
        assert_eq!(&b[16..], id.as_bytes());
    }

    #[test]
    fn workflow_names_are_distinct() {
        let mut names = WORKFLOWS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), WORKFLOWS.len());
    }
}
