//! The durable user-operation flow: acceptance ([`submit`]), the workflow
//! `aa.user-operation` ([`UserOperationWorkflow`]) and what both act through
//! ([`AaEnv`], one [`AaChain`] per served chain).
//!
//! A user operation is accepted once per (chain, hash): the workflow's idempotency key
//! is `aa:<chainId>:<hash>`, so a resend joins the existing instance and returns the
//! same hash, never a second inclusion. Its steps:
//!
//! 1. `resolve`: the [`Resolution`] acceptance recorded with the operation's row (the one
//!    [`submit`] hashed it over), else [`resolve_entry_point`]; journaled (a retryable
//!    [`crate::ResolveError`] retries the step; a replay reads the journaled
//!    [`Resolution`], so a directory change after acceptance does not change the address
//!    this operation uses). The operation must hash to its key against the resolved
//!    address.
//! 2. `record`: the `aa_user_operation` row (state `accepted`).
//! 3. `validate`: [`crate::validation::validate`] (ERC-7562: `handleOps([op], bundler)`
//!    traced on the resolved EntryPoint from the bundler's sender, or in unsafe mode the
//!    plain [`simulate_handle_ops`]; the entities' reputation). Chosen here over
//!    `EntryPointSimulations.simulateValidation` with a state override for now because
//!    `keel-abi` has no binding for that artifact (it ships in the npm package) and the
//!    upstream pool no `eth_call` with overrides yet, while `handleOps` runs the real
//!    EntryPoint's whole validation (account creation, signature, nonce, paymaster
//!    signature and deposit — AA31 before any submission) and names the failing
//!    operation with `FailedOp`; what it does not give is the validation result (windows,
//!    prefund) as data.
//! 4. `ready`: the sponsorship policy of the chain (when configured and the operation
//!    names an organization) with the day's spending from `aa_sponsorship_spend`, and
//!    the state `ready`, in one transaction.
//! 5. wait for the signal [`OUTCOME_SIGNAL`], which the bundler ([`crate::bundler`])
//!    records in the transaction that records the outcome (included **in a final
//!    block**, refused in a bundle simulation, nonce used elsewhere): reported exactly
//!    once. While the bundle's block can still be reorganized away the row shows
//!    `included` (receipt readable) but the workflow keeps waiting; a reorg puts the
//!    operation back in flight and it lands again.
//!
//! A refusal ends the row `failed` with the ERC-7769 code (step `end`) and fails the
//! instance with [`AaFailure`].

use crate::entry_point::{Resolution, ResolvedEntryPoint, resolve_entry_point};
use crate::policy::SponsorshipPolicy;
use crate::rejection::{EntryPointRejection, Erc7769Code};
use crate::store;
use crate::user_op::UserOperation;
use alloy::primitives::{Address, B256, Bytes, TxKind, U256};
use alloy::rpc::types::{BlockNumberOrTag, TransactionInput, TransactionRequest};
use alloy::sol_types::SolCall;
use keel_abi::erc4337::IEntryPointV08;
use keel_chain::{ChainError, NodeErrorKind, UpstreamPool};
use keel_durable::WorkflowFailure;
use keel_durable::{Engine, SignalOutcome, StartOptions, StepError, Workflow, WorkflowContext};
use keel_txq::TxQueue;
use keel_units::{ChainId, Wei};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use uuid::Uuid;

/// The workflow's name.
pub const WORKFLOW: &str = "aa.user-operation";
/// The signal carrying an operation's outcome ([`OutcomeSignal`]).
pub const OUTCOME_SIGNAL: &str = "aa.outcome";

/// One served chain.
#[derive(Clone)]
pub struct AaChain {
    /// The chain's upstreams.
    pub pool: Arc<UpstreamPool>,
    /// The chain's transaction queue (the bundler's sender must be one of its signers).
    pub queue: Arc<TxQueue>,
    /// Keel's `Directory` on the chain (its `entryPoint` entry is resolved).
    pub directory: Address,
    /// The bundler's sender: sends `handleOps` through the queue and is its beneficiary.
    pub bundler: Address,
    /// The sponsorship policy applied to operations that name an organization without a
    /// policy of its own in [`AaChain::organization_policies`]; `None`: none (the
    /// paymaster's signature is the only gate).
    pub policy: Option<SponsorshipPolicy>,
    /// Sponsorship policies of single organizations (they replace [`AaChain::policy`]
    /// for that organization's operations).
    pub organization_policies: HashMap<Uuid, SponsorshipPolicy>,
    /// The `handleOps` beneficiary (receives the bundles' gas refunds); `None`: the
    /// bundler's sender.
    pub beneficiary: Option<Address>,
    /// Keel's SponsorPaymaster and its sponsor key (the ERC-7677 `pm_*` methods sign
    /// with it); `None`: those methods answer that no paymaster is configured.
    pub sponsor: Option<Sponsor>,
    /// What acceptance checks and the bundle gas budget ([`crate::admission`]).
    pub admission: crate::admission::AdmissionConfig,
}

impl AaChain {
    /// The policy that applies to an operation of `organization_id` (its own, else the
    /// chain's default); `None` without an organization or a policy.
    pub fn policy_for(&self, organization_id: Option<Uuid>) -> Option<&SponsorshipPolicy> {
        let org = organization_id?;
        self.organization_policies
            .get(&org)
            .or(self.policy.as_ref())
    }

    /// The `handleOps` beneficiary: [`AaChain::beneficiary`], else the bundler's sender.
    pub fn beneficiary(&self) -> Address {
        self.beneficiary.unwrap_or(self.bundler)
    }
}

/// Keel's paymaster on one chain as the ERC-7677 methods use it.
#[derive(Clone)]
pub struct Sponsor {
    /// The SponsorPaymaster (platform contract `sponsorPaymaster`).
    pub paymaster: Address,
    /// The sponsor key the paymaster verifies (`verifyingSigner`): the process's shared
    /// signer of that key, of any kind (local, keystore, remote).
    pub signer: keel_txq::SignerHandle,
    /// How long a signed sponsorship stays valid (`validUntil` = now + this), seconds.
    pub validity_secs: u64,
    /// `paymasterVerificationGasLimit` filled in when the operation has none, gas units.
    pub verification_gas_limit: u128,
    /// `paymasterPostOpGasLimit` filled in when the operation has none, gas units
    /// (the SponsorPaymaster has no `postOp`: 0 is enough).
    pub post_op_gas_limit: u128,
}

impl std::fmt::Debug for Sponsor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is never printed; its address is public.
        f.debug_struct("Sponsor")
            .field("paymaster", &self.paymaster)
            .field("signer", &self.signer.address())
            .field("validity_secs", &self.validity_secs)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for AaChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AaChain")
            .field("chain", &self.pool.chain())
            .field("directory", &self.directory)
            .field("bundler", &self.bundler)
            .finish_non_exhaustive()
    }
}

/// What the workflow, acceptance and the bundler act through.
#[derive(Debug, Clone)]
pub struct AaEnv {
    /// Keel's database.
    pub db: PgPool,
    /// The served chains, by chain id.
    pub chains: HashMap<u64, AaChain>,
    /// Chains served later, by chain id: a slot per configured chain, filled once by
    /// [`AaEnv::serve_later`] when the process starts serving it (e.g. when the chain
    /// first answers); an empty slot is not served.
    pub later_chains: HashMap<u64, std::sync::OnceLock<AaChain>>,
}

impl AaEnv {
    /// The served chain `chain_id`: from [`AaEnv::chains`], else its filled slot in
    /// [`AaEnv::later_chains`].
    pub fn chain(&self, chain_id: u64) -> Option<&AaChain> {
        self.chains.get(&chain_id).or_else(|| {
            self.later_chains
                .get(&chain_id)
                .and_then(std::sync::OnceLock::get)
        })
    }

    /// Starts serving `chain`, a chain of [`AaEnv::later_chains`]. Returns false when
    /// the chain has no slot or its slot was already filled (the first chain is kept).
    pub fn serve_later(&self, chain: AaChain) -> bool {
        let chain_id = chain.pool.chain().get();
        self.later_chains
            .get(&chain_id)
            .is_some_and(|slot| slot.set(chain).is_ok())
    }

    /// The ids of the chains served now (both forms), ascending.
    pub fn served_chain_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .chains
            .keys()
            .copied()
            .chain(
                self.later_chains
                    .iter()
                    .filter(|(_, slot)| slot.get().is_some())
                    .map(|(id, _)| *id),
            )
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// The workflow's input (stored with the instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserOperationInput {
    /// The chain.
    pub chain_id: u64,
    /// The v0.8 hash over the resolved EntryPoint (the idempotency key's hash).
    pub user_op_hash: B256,
    /// The operation as accepted (ERC-7769 form).
    pub user_operation: UserOperation,
    /// The organization whose sponsorship policy and budget apply, when known.
    pub organization_id: Option<Uuid>,
}

/// The outcome the bundler reports (the payload of [`OUTCOME_SIGNAL`]); also the
/// workflow's output for an included operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeSignal {
    /// `included` (sent once its block is final), `failed`, `nonce_used_elsewhere` or
    /// `replaced`.
    pub state: store::UserOpState,
    /// Included: whether the execution call succeeded.
    pub success: Option<bool>,
    /// Included: wei the paymaster (or account) paid, decimal.
    pub actual_gas_cost: Option<String>,
    /// Included: gas charged, decimal.
    pub actual_gas_used: Option<String>,
    /// Included: the bundle transaction.
    pub tx_hash: Option<B256>,
    /// Included: its block.
    pub block_number: Option<u64>,
    /// Ended otherwise: the ERC-7769 code.
    pub error_code: Option<i32>,
    /// Ended otherwise: the reason (`AA25 invalid account nonce`, ...).
    pub error_reason: Option<String>,
}

impl OutcomeSignal {
    /// The outcome of an operation that ended without inclusion: `state` (`failed`,
    /// `nonce_used_elsewhere`, `replaced`), its ERC-7769 `code` and `reason`; every
    /// inclusion field `None`.
    pub fn ended(state: store::UserOpState, code: i32, reason: &str) -> Self {
        Self {
            state,
            success: None,
            actual_gas_cost: None,
            actual_gas_used: None,
            tx_hash: None,
            block_number: None,
            error_code: Some(code),
            error_reason: Some(reason.to_owned()),
        }
    }
}

/// The typed failure of an `aa.user-operation` instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("user operation refused ({code}): {reason}")]
pub struct AaFailure {
    /// The ERC-7769 JSON-RPC code (-32500 ...).
    pub code: i32,
    /// `AAxx …` from the EntryPoint, a `SPONSOR_…` policy code, or a Keel code
    /// (`ENTRY_POINT_CHANGED`, `CHAIN_NOT_SERVED`, ...). Never payload values.
    pub reason: String,
    /// The state the operation ended in (`failed`, `nonce_used_elsewhere`, `replaced`).
    pub state: store::UserOpState,
}

impl AaFailure {
    fn failed(code: Erc7769Code, reason: impl Into<String>) -> Self {
        Self {
            code: code.code(),
            reason: reason.into(),
            state: store::state::FAILED,
        }
    }
}

/// The EntryPoint's refusal as a failure (`AAxx` reason, its ERC-7769 code).
pub(crate) fn rejection_failure(r: &EntryPointRejection) -> AaFailure {
    AaFailure::failed(r.erc7769(), short_reason(&r.reason))
}

fn short_reason(reason: &str) -> String {
    reason.chars().take(120).collect()
}

/// `handleOps(ops, beneficiary)` simulated with `eth_call` from `from` at the latest
/// block on the resolved EntryPoint, with the operations' EIP-7702 `authorizations`
/// applied (`authorizationList`, see [`crate::eip7702`]): `Ok(None)` when it would succeed,
/// `Ok(Some(rejection))` when it reverts (a revert that is not `FailedOp` is reported
/// as op 0 without an `AAxx` code).
///
/// # Errors
/// The chain access error when the node gave no verdict (retryable or not, see
/// [`ChainError::is_retryable`]).
pub async fn simulate_handle_ops(
    pool: &UpstreamPool,
    ep: &ResolvedEntryPoint,
    ops: &[crate::PackedUserOperation],
    from: Address,
    authorizations: Option<Vec<alloy::eips::eip7702::SignedAuthorization>>,
) -> Result<Option<EntryPointRejection>, ChainError> {
    let data = handle_ops_calldata(ops, from);
    let tx = TransactionRequest {
        from: Some(from),
        to: Some(TxKind::Call(ep.address())),
        input: TransactionInput::new(data),
        authorization_list: authorizations,
        ..Default::default()
    };
    match pool.call(&tx, BlockNumberOrTag::Latest).await {
        Ok(_) => Ok(None),
        Err(ChainError::Node { error, .. }) if error.kind == NodeErrorKind::ExecutionReverted => {
            let data = error.revert.map(|r| r.data).unwrap_or_default();
            Ok(Some(EntryPointRejection::decode(&data).unwrap_or(
                EntryPointRejection {
                    op_index: 0,
                    aa: None,
                    reason: "handleOps simulation reverted".to_owned(),
                    inner: None,
                },
            )))
        }
        Err(e) => Err(e),
    }
}

/// The calldata of `handleOps(ops, beneficiary)`.
pub fn handle_ops_calldata(ops: &[crate::PackedUserOperation], beneficiary: Address) -> Bytes {
    IEntryPointV08::handleOpsCall {
        ops: ops.iter().map(crate::PackedUserOperation::to_sol).collect(),
        beneficiary,
    }
    .abi_encode()
    .into()
}

/// The idempotency key of an operation's workflow: `aa:<chainId>:<hash>`.
pub fn workflow_key(chain_id: u64, hash: B256) -> String {
    format!("aa:{chain_id}:{hash}")
}

/// An accepted operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// Its v0.8 hash (`eth_sendUserOperation`'s result).
    pub user_op_hash: B256,
    /// Its workflow instance (the REST operation id).
    pub instance_id: Uuid,
    /// False when the same operation had been accepted before (a resend).
    pub created: bool,
}

/// Why an operation was not accepted. Messages are value-free.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// This runner does not serve the chain.
    #[error("chain {0} is not served")]
    ChainNotServed(u64),
    /// The EntryPoint could not be resolved now (network); retry.
    #[error("the EntryPoint could not be resolved now")]
    Unavailable(#[source] crate::ResolveError),
    /// The chain's EntryPoint is misconfigured.
    #[error("the chain's EntryPoint is misconfigured")]
    Misconfigured(#[source] crate::ResolveError),
    /// The named EntryPoint is the configured reference, not the resolved address: the
    /// operation must be rebuilt and re-signed against the resolved EntryPoint.
    #[error(
        "the EntryPoint named is the configured reference; rebuild and re-sign the operation against the resolved EntryPoint"
    )]
    ReferenceAddress,
    /// The named EntryPoint is not this chain's.
    #[error("the EntryPoint named is not supported on this chain")]
    UnsupportedEntryPoint,
    /// The operation's fields do not pack (over-wide gas or fee values).
    #[error("the user operation is malformed")]
    Malformed(#[source] crate::UserOpError),
    /// The durable engine or database refused.
    #[error("the user operation could not be recorded")]
    Engine(#[source] keel_durable::DurableError),
    /// The database refused.
    #[error("the user operation could not be recorded")]
    Store(#[source] keel_store::StoreError),
    /// The operation or its resolution could not be encoded as JSON for its row (`what`
    /// names which; never its value).
    #[error("the {what} could not be encoded for its row")]
    Encode {
        /// `user operation` or `resolution`.
        what: &'static str,
    },
}

impl SubmitError {
    /// The ERC-7769 code of the refusal (`None`: not the client's fault, JSON-RPC
    /// internal error / HTTP 503).
    pub fn erc7769(&self) -> Option<Erc7769Code> {
        match self {
            Self::ReferenceAddress
            | Self::UnsupportedEntryPoint
            | Self::Malformed(_)
            | Self::ChainNotServed(_) => Some(Erc7769Code::InvalidParams),
            _ => None,
        }
    }

    /// True when the same submission may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_) | Self::Engine(_) | Self::Store(_)
        )
    }
}

/// Accepts `op` naming EntryPoint `entry_point` on `chain_id`: resolves the chain's
/// EntryPoint, refuses the configured reference (and any other address) for
/// submission, hashes the operation over the resolved address and starts (or joins) its
/// workflow keyed `aa:<chainId>:<hash>`; the `aa_user_operation` row exists when this
/// returns.
///
/// # Errors
/// [`SubmitError`].
pub async fn submit(
    env: &AaEnv,
    engine: &Engine,
    chain_id: u64,
    entry_point: Address,
    op: UserOperation,
    organization_id: Option<Uuid>,
) -> Result<Submitted, SubmitError> {
    let chain = env
        .chain(chain_id)
        .ok_or(SubmitError::ChainNotServed(chain_id))?;
    let resolution = resolve_entry_point(&chain.pool, chain.directory)
        .await
        .map_err(|e| {
            if e.is_retryable() {
                SubmitError::Unavailable(e)
            } else {
                SubmitError::Misconfigured(e)
            }
        })?;
    submit_resolved(
        env,
        engine,
        chain_id,
        entry_point,
        op,
        organization_id,
        &resolution,
    )
    .await
}

/// [`submit`] with the chain's EntryPoint already resolved (by the caller, just before:
/// [`crate::service::AaService::send`] resolves once for its pre-check and the
/// acceptance). The workflow's `resolve` step still resolves and journals on its own.
///
/// # Errors
/// [`SubmitError`].
pub(crate) async fn submit_resolved(
    env: &AaEnv,
    engine: &Engine,
    chain_id: u64,
    entry_point: Address,
    op: UserOperation,
    organization_id: Option<Uuid>,
    resolution: &Resolution,
) -> Result<Submitted, SubmitError> {
    if !resolution.accepts_for_submission(entry_point) {
        return Err(if entry_point == resolution.configured {
            SubmitError::ReferenceAddress
        } else {
            SubmitError::UnsupportedEntryPoint
        });
    }
    let hash = op
        .hash_v08(&resolution.resolved)
        .map_err(SubmitError::Malformed)?;
    op.pack().map_err(SubmitError::Malformed)?;
    let input = UserOperationInput {
        chain_id,
        user_op_hash: hash,
        user_operation: op,
        organization_id,
    };
    let started = engine
        .start::<UserOperationWorkflow>(
            &workflow_key(chain_id, hash),
            &input,
            StartOptions::default(),
        )
        .await
        .map_err(SubmitError::Engine)?;
    insert_row(&env.db, &input, resolution, started.instance_id).await?;
    Ok(Submitted {
        user_op_hash: hash,
        instance_id: started.instance_id,
        created: started.created,
    })
}

async fn insert_row(
    db: &PgPool,
    input: &UserOperationInput,
    resolution: &Resolution,
    instance_id: Uuid,
) -> Result<bool, SubmitError> {
    let op_json = serde_json::to_value(&input.user_operation).map_err(|_| SubmitError::Encode {
        what: "user operation",
    })?;
    let res_json =
        serde_json::to_value(resolution).map_err(|_| SubmitError::Encode { what: "resolution" })?;
    let chain_id = ChainId(input.chain_id)
        .to_db()
        .map_err(|_| SubmitError::ChainNotServed(input.chain_id))?;
    store::user_operation_insert(
        db,
        &store::NewUserOperation {
            chain_id,
            user_op_hash: input.user_op_hash.as_slice(),
            organization_id: input.organization_id,
            sender: input.user_operation.sender.as_slice(),
            nonce: &input.user_operation.nonce.to_string(),
            user_operation: &op_json,
            resolution: &res_json,
            instance_id,
        },
    )
    .await
    .map_err(SubmitError::Store)
}

/// The wake tag of `sender`'s operations on `chain_id` that wait for an earlier
/// operation of the sender (`aa-sender:<chainId>:<sender>`): the bundler wakes it when
/// one of the sender's operations is included or ends.
pub fn sender_wake_tag(chain_id: u64, sender: Address) -> String {
    format!("aa-sender:{chain_id}:{sender:#x}")
}

/// Whether a validation refusal is what an operation gets while the sender's operation
/// at the nonce just below it (same key) has not landed yet: `AA25` (invalid account
/// nonce) or `AA20` (account not deployed: the earlier operation creates it).
pub fn waits_for_predecessor(reason: &str) -> bool {
    reason.starts_with("AA25") || reason.starts_with("AA20")
}

/// Whether `earlier` is the nonce just below `nonce` in the same key (ERC-4337
/// two-dimensional nonce: `key << 64 | sequence`; sequence 0 has none).
pub fn is_predecessor_nonce(earlier: U256, nonce: U256) -> bool {
    let sequence = nonce & U256::from(u64::MAX);
    !sequence.is_zero() && earlier + U256::from(1u8) == nonce
}

/// Whether `op`'s sender has an open operation (`accepted`, `ready`, `bundled`) at the
/// nonce just below `op`'s, in the same key.
///
/// # Errors
/// [`keel_store::StoreError`].
pub async fn predecessor_open(
    db: &PgPool,
    chain_id: u64,
    op: &UserOperation,
) -> Result<bool, keel_store::StoreError> {
    let open =
        store::user_operations_open_of_sender(db, chain_id_i64(chain_id), op.sender.as_slice())
            .await?;
    Ok(open.iter().any(|r| {
        r.nonce
            .parse::<U256>()
            .is_ok_and(|n| is_predecessor_nonce(n, op.nonce))
    }))
}

/// `chain_id` as the stored `BIGINT` for a store key ([`ChainId::to_db`], the one
/// u64→i64 rule). A chain id above `i64::MAX` cannot be stored (no row has it; an
/// insert refuses it): as a key it saturates, so it matches no row.
pub(crate) fn chain_id_i64(chain_id: u64) -> i64 {
    ChainId(chain_id).to_db().unwrap_or(i64::MAX)
}

/// The workflow `aa.user-operation` (see the module docs).
#[derive(Debug, Clone)]
pub struct UserOperationWorkflow(pub Arc<AaEnv>);

type Failure = WorkflowFailure<AaFailure>;

fn transient<T>(code: &'static str) -> Result<T, StepError<AaFailure>> {
    Err(StepError::Transient { code })
}

impl Workflow for UserOperationWorkflow {
    const NAME: &'static str = WORKFLOW;
    type Input = UserOperationInput;
    type Output = OutcomeSignal;
    type Error = AaFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: UserOperationInput,
    ) -> Result<OutcomeSignal, Failure> {
        let env = &self.0;
        let chain_id = input.chain_id;
        let Some(chain) = env.chain(chain_id) else {
            // Not served by this runner: retried (another runner, or this one later).
            ctx.step("chain", || async { transient::<()>("CHAIN_NOT_SERVED") })
                .await?
                .map_err(WorkflowFailure::Failed)?;
            return Err(WorkflowFailure::Failed(AaFailure::failed(
                Erc7769Code::InvalidParams,
                "CHAIN_NOT_SERVED",
            )));
        };

        // 1. resolve, journaled.
        let resolution: Result<Resolution, AaFailure> = ctx
            .step("resolve", || async {
                // The resolution acceptance recorded with the row (the one the operation
                // was hashed over, moments ago); the chain only when there is none.
                if let Ok(Some(row)) = store::user_operation_get(
                    &env.db,
                    chain_id_i64(chain_id),
                    input.user_op_hash.as_slice(),
                )
                .await
                    && let Ok(recorded) = serde_json::from_value::<Resolution>(row.resolution)
                {
                    return Ok(recorded);
                }
                resolve_entry_point(&chain.pool, chain.directory)
                    .await
                    .map_err(|e| {
                        if e.is_retryable() {
                            StepError::Transient {
                                code: "ENTRY_POINT_UNAVAILABLE",
                            }
                        } else {
                            StepError::Failed(AaFailure::failed(
                                Erc7769Code::RejectedByEntryPoint,
                                e.code(),
                            ))
                        }
                    })
            })
            .await?;
        let resolution = resolution.map_err(WorkflowFailure::Failed)?;
        let ep = resolution.resolved;
        let same_hash = input
            .user_operation
            .hash_v08(&ep)
            .is_ok_and(|h| h == input.user_op_hash);
        let Ok(packed) = input.user_operation.pack() else {
            return Err(WorkflowFailure::Failed(AaFailure::failed(
                Erc7769Code::InvalidParams,
                "MALFORMED",
            )));
        };

        // 2. record.
        let instance_id = ctx.instance_id();
        ctx.step("record", || async {
            insert_row(&env.db, &input, &resolution, instance_id)
                .await
                .or_else(|e| match e {
                    // Not the database's fault: retrying cannot help.
                    SubmitError::Encode { .. } | SubmitError::ChainNotServed(_) => {
                        Err(StepError::Failed(AaFailure::failed(
                            Erc7769Code::InvalidParams,
                            "UNRECORDABLE",
                        )))
                    }
                    _ => transient("DATABASE_UNAVAILABLE"),
                })
        })
        .await?
        .map_err(WorkflowFailure::Failed)?;
        if !same_hash {
            return end(
                ctx,
                env,
                &input,
                AaFailure::failed(Erc7769Code::InvalidParams, "ENTRY_POINT_CHANGED"),
            )
            .await;
        }

        // 3. validate on the real EntryPoint.
        let validated: Result<(), AaFailure> = ctx
            .step("validate", || async {
                match crate::validation::validate(
                    &env.db,
                    chain,
                    &ep,
                    &input.user_operation,
                    &packed,
                    crate::validation::Admission::Admit,
                )
                .await
                {
                    Ok(None) => Ok(()),
                    Ok(Some(r)) if waits_for_predecessor(&r.reason) => {
                        // Back to back: the sender's operation at the nonce below (same
                        // key) has not landed yet; validated again once it settles.
                        match predecessor_open(&env.db, chain_id, &input.user_operation).await {
                            Ok(true) => Err(StepError::Unavailable {
                                code: "PREDECESSOR_PENDING",
                                wake: sender_wake_tag(chain_id, input.user_operation.sender),
                            }),
                            Ok(false) => {
                                Err(StepError::Failed(AaFailure::failed(r.code, r.reason)))
                            }
                            Err(_) => transient("DATABASE_UNAVAILABLE"),
                        }
                    }
                    Ok(Some(r)) => Err(StepError::Failed(AaFailure::failed(r.code, r.reason))),
                    Err(crate::validation::ValidationError::Store(_)) => {
                        transient("DATABASE_UNAVAILABLE")
                    }
                    Err(_) => transient("RPC_UNAVAILABLE"),
                }
            })
            .await?;
        if let Err(f) = validated {
            return end(ctx, env, &input, f).await;
        }

        // 4. sponsorship policy and `ready`, in one transaction.
        let today = ctx.now().await?.date_naive();
        let ready: Result<(), AaFailure> = ctx
            .step("ready", || async {
                make_ready(env, chain, &input, today).await
            })
            .await?;
        if let Err(f) = ready {
            return end(ctx, env, &input, f).await;
        }

        // 5. the bundler reports the outcome once.
        match ctx
            .wait_signal::<OutcomeSignal>(OUTCOME_SIGNAL, None)
            .await?
        {
            SignalOutcome::Received(o) if o.state == store::state::INCLUDED => Ok(o),
            SignalOutcome::Received(o) => Err(WorkflowFailure::Failed(AaFailure {
                code: o
                    .error_code
                    .unwrap_or(Erc7769Code::RejectedByEntryPoint.code()),
                reason: o.error_reason.unwrap_or_default(),
                state: o.state,
            })),
            SignalOutcome::Expired => Err(WorkflowFailure::Failed(AaFailure::failed(
                Erc7769Code::RejectedByEntryPoint,
                "OUTCOME_MISSING",
            ))),
        }
    }
}

async fn make_ready(
    env: &AaEnv,
    chain: &AaChain,
    input: &UserOperationInput,
    today: chrono::NaiveDate,
) -> Result<(), StepError<AaFailure>> {
    fn db_err<E>(_: E) -> StepError<AaFailure> {
        StepError::Transient {
            code: "DATABASE_UNAVAILABLE",
        }
    }
    let chain_id = chain_id_i64(input.chain_id);
    let mut tx = env.db.begin().await.map_err(|_| StepError::Transient {
        code: "DATABASE_UNAVAILABLE",
    })?;
    let mut sponsored = None;
    if let (Some(policy), Some(org)) = (
        chain.policy_for(input.organization_id),
        input.organization_id,
    ) {
        // The day's row is locked by the upsert below; read it first under that lock
        // by adding zero, so two operations of one organization are not both granted
        // against the same spent amount.
        let spent = store::sponsorship_spend_add(&mut *tx, org, chain_id, today, "0")
            .await
            .map_err(db_err)?;
        let spent = spent
            .parse::<alloy::primitives::U256>()
            .map(Wei::new)
            .unwrap_or(Wei::ZERO);
        let granted = policy
            .evaluate(&input.user_operation, spent)
            .map_err(|refusal| {
                StepError::Failed(AaFailure::failed(
                    Erc7769Code::RejectedByPaymaster,
                    refusal.code(),
                ))
            })?;
        let granted = granted.get().to_string();
        store::sponsorship_spend_add(&mut *tx, org, chain_id, today, &granted)
            .await
            .map_err(db_err)?;
        sponsored = Some(granted);
    }
    if !store::user_operation_set_ready(
        &mut *tx,
        chain_id,
        input.user_op_hash.as_slice(),
        sponsored.as_deref(),
    )
    .await
    .map_err(db_err)?
    {
        // No longer `accepted` (replaced meanwhile, issue 33 §3): nothing is granted; its
        // outcome was signalled by whoever ended it.
        tx.rollback().await.map_err(db_err)?;
        return Ok(());
    }
    tx.commit().await.map_err(db_err)?;
    Ok(())
}

/// Ends the row `failed` with `f` (journaled step `end`) and fails the instance.
async fn end(
    ctx: &mut WorkflowContext,
    env: &AaEnv,
    input: &UserOperationInput,
    f: AaFailure,
) -> Result<OutcomeSignal, Failure> {
    let (code, reason) = (f.code, f.reason.clone());
    ctx.step("end", || async {
        store::user_operation_end(
            &env.db,
            chain_id_i64(input.chain_id),
            input.user_op_hash.as_slice(),
            store::state::FAILED,
            code,
            &reason,
        )
        .await
        .map(|_| ())
        .or_else(|_| transient("DATABASE_UNAVAILABLE"))
    })
    .await?
    .map_err(WorkflowFailure::Failed)?;
    Err(WorkflowFailure::Failed(f))
}

/// Registers the workflow with `engine`.
pub fn register(engine: Engine, env: Arc<AaEnv>) -> Engine {
    engine.register(UserOperationWorkflow(env))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_chain::UpstreamConfig;
    use keel_units::ChainId;

    fn chain(db: &PgPool, id: u64) -> AaChain {
        let pool = Arc::new(
            UpstreamPool::new(
                ChainId(id),
                UpstreamConfig::new(vec!["http://127.0.0.1:1".to_owned()]),
            )
            .unwrap(),
        );
        let queue = TxQueue::new(db.clone(), pool.clone(), Default::default()).unwrap();
        AaChain {
            pool,
            queue: Arc::new(queue),
            directory: Address::ZERO,
            bundler: Address::repeat_byte(1),
            policy: None,
            organization_policies: HashMap::new(),
            beneficiary: None,
            sponsor: None,
            admission: Default::default(),
        }
    }

    /// A chain with a later slot is not served until `serve_later` fills it, once; a
    /// chain without a slot is never served that way.
    #[tokio::test]
    async fn later_chain_is_served_once_filled() {
        let db = PgPool::connect_lazy("postgres://postgres@127.0.0.1:5432/postgres").unwrap();
        let env = AaEnv {
            db: db.clone(),
            chains: HashMap::new(),
            later_chains: [(7, std::sync::OnceLock::new())].into_iter().collect(),
        };
        assert!(env.chain(7).is_none());
        assert!(env.served_chain_ids().is_empty());
        assert!(env.serve_later(chain(&db, 7)));
        assert!(env.chain(7).is_some());
        assert_eq!(env.served_chain_ids(), vec![7]);
        assert!(!env.serve_later(chain(&db, 7)), "set once");
        assert!(!env.serve_later(chain(&db, 8)), "no slot");
        assert!(env.chain(8).is_none());
    }
}
