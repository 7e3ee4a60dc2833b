//! ERC-7562 validation of user operations (issue 33 §4): a traced `handleOps`
//! simulation checked against the opcode, call, `CREATE2`, storage and staking rules per
//! entity ([`rules`]), and the entities' reputation ([`reputation`]).
//!
//! [`validate`] is what the workflow's `validate` step, `eth_sendUserOperation`'s
//! pre-check and nothing else call. Per chain, [`ValidationSettings::mode`] chooses:
//!
//! - [`ValidationMode::Tracing`] (default): `debug_traceCall` of `handleOps([op],
//!   bundler)` with Keel's JavaScript tracer ([`tracer`]); a broken rule refuses the
//!   operation with -32502 (opcode, call, storage or context rule), or -32505 when a
//!   factory or paymaster whose stake is below the minimum breaks a rule a sufficient
//!   stake would allow; the reason names the rule (`OP-011 account TIMESTAMP`), the
//!   [`Breach`] carries the client-facing message.
//!   Otherwise the EntryPoint's own verdict applies as with a plain simulation.
//! - [`ValidationMode::Unsafe`]: the plain `eth_call` of `handleOps` (for nodes without
//!   `debug_traceCall`, like rundler's `--unsafe`): no ERC-7562 rule is checked, so an
//!   account, paymaster or factory can make operations that pass validation here and
//!   fail in the bundle (at the bundler's cost). Logged at WARN when configured.
//!
//! In both modes a banned entity, and a throttled one with enough open operations, is
//! refused with -32504 ([`reputation`]); an admitted operation counts in its paymaster's
//! and factory's `opsSeen`, an included one in their `opsIncluded`.
//!
//! Stake: an entity is staked when `EntryPoint.getDepositInfo` shows a stake of at least
//! [`ValidationSettings::min_stake_wei`] and an unstake delay of at least
//! [`ValidationSettings::min_unstake_delay_secs`] (ERC-7562 SREP-010). Keel's own
//! SponsorPaymaster (the chain Directory's `sponsorPaymaster` entry) counts as staked for
//! the storage rules: it reads its sponsor signer from its own storage (STO-031), which
//! only Keel can change.
//!
//! Settings are per chain, in a process-wide table ([`configure`]); a chain without an
//! entry uses [`ValidationSettings::default`].

pub mod debug;
pub mod reputation;
pub mod rules;
pub mod tracer;

use crate::entry_point::ResolvedEntryPoint;
use crate::flow::AaChain;
use crate::rejection::{AaCode, EntryPointRejection, Erc7769Code};
use crate::store;
use crate::user_op::{PackedUserOperation, UserOperation};
use alloy::primitives::{Address, TxKind, U256};
use alloy::rpc::types::{BlockNumberOrTag, TransactionInput, TransactionRequest};
use alloy::sol_types::SolCall;
use keel_abi::bindings::Directory;
use keel_chain::{ChainError, UpstreamPool};
use keel_store::StoreError;
use reputation::{ReputationParams, Status};
use rules::{RuleContext, Violation};
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, PgPool};
use std::collections::{HashMap, HashSet};
use std::sync::{OnceLock, RwLock};

alloy::sol! {
    /// The stake query of the EntryPoint v0.8 (`IStakeManager`, ERC-4337).
    interface IStakeQueryV08 {
        /// An account's deposit and stake.
        struct DepositInfo {
            uint256 deposit;
            bool staked;
            uint112 stake;
            uint32 unstakeDelaySec;
            uint48 withdrawTime;
        }
        /// The deposit and stake of `account`.
        function getDepositInfo(address account) external view returns (DepositInfo memory info);
    }
}

/// How operations are validated on a chain (`aa.validation` in Keel's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationMode {
    /// Traced simulation with the ERC-7562 rules (needs `debug_traceCall` with
    /// JavaScript tracers on the chain's node).
    #[default]
    Tracing,
    /// Plain `eth_call` of `handleOps`: no ERC-7562 rule (see the module docs).
    Unsafe,
}

impl ValidationMode {
    /// `tracing` or `unsafe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tracing => "tracing",
            Self::Unsafe => "unsafe",
        }
    }
}

/// Validation settings of one chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidationSettings {
    /// Tracing (default) or unsafe.
    pub mode: ValidationMode,
    /// `MIN_STAKE_VALUE`, wei (default 1 ether; ERC-7562 suggests about $1000 worth of
    /// the native token).
    pub min_stake_wei: U256,
    /// `MIN_UNSTAKE_DELAY`, seconds (default 86 400).
    pub min_unstake_delay_secs: u32,
    /// The reputation constants.
    pub reputation: ReputationParams,
    /// Whether the `debug_bundler_*` methods answer ([`debug`]; default false).
    pub debug_methods: bool,
}

impl Default for ValidationSettings {
    fn default() -> Self {
        Self {
            mode: ValidationMode::Tracing,
            min_stake_wei: U256::from(1_000_000_000_000_000_000u128),
            min_unstake_delay_secs: 86_400,
            reputation: ReputationParams::default(),
            debug_methods: false,
        }
    }
}

fn table() -> &'static RwLock<HashMap<u64, ValidationSettings>> {
    static TABLE: OnceLock<RwLock<HashMap<u64, ValidationSettings>>> = OnceLock::new();
    TABLE.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Sets the validation settings of `chain_id` for this process (logged at WARN in
/// unsafe mode).
pub fn configure(chain_id: u64, settings: ValidationSettings) {
    if settings.mode == ValidationMode::Unsafe {
        tracing::warn!(
            target: "keel::aa::validation",
            chain_id,
            "aa.validation = \"unsafe\": user operations are validated without the ERC-7562 rules (no tracing)"
        );
    }
    let mut t = table()
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    t.insert(chain_id, settings);
}

/// The validation settings of `chain_id` ([`configure`], else the default).
pub fn settings(chain_id: u64) -> ValidationSettings {
    let t = table()
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    t.get(&chain_id).copied().unwrap_or_default()
}

/// Why validation gave no verdict.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The chain did not answer (or refused the trace).
    #[error("the chain gave no validation verdict")]
    Chain(#[from] ChainError),
    /// The database failed.
    #[error("the reputation store failed")]
    Store(#[from] StoreError),
}

/// A refusal: the ERC-7769 code and a value-free reason (`OP-011 account TIMESTAMP`,
/// `AA25 invalid account nonce`, `GREP-010 paymaster banned`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The ERC-7769 code.
    pub code: Erc7769Code,
    /// The reason (at most 120 characters).
    pub reason: String,
    /// The account's, factory's or paymaster's own revert data
    /// (`FailedOpWithRevert.inner`), when the EntryPoint passed it on.
    pub revert: Option<alloy::primitives::Bytes>,
    /// Set when Keel's rules refused (an ERC-7562 rule or the reputation), not the
    /// EntryPoint.
    pub breach: Option<Breach>,
}

/// A refusal by Keel's ERC-7562 rules or reputation (not by the EntryPoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    /// The ERC-7562 rule (`OP-011`, `STO-033`, `GREP-010`, ...).
    pub rule: &'static str,
    /// The entity accountable.
    pub entity: rules::Entity,
    /// The client-facing message (`account uses banned opcode: TIMESTAMP (OP-011)`,
    /// [`Violation::message`]).
    pub message: String,
}

impl Refusal {
    fn new(code: Erc7769Code, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into().chars().take(120).collect(),
            revert: None,
            breach: None,
        }
    }

    fn from_rejection(r: &EntryPointRejection) -> Self {
        Self {
            revert: r.inner.clone(),
            ..Self::new(r.erc7769(), r.reason.clone())
        }
    }

    fn from_violation(v: &Violation) -> Self {
        Self {
            breach: Some(Breach {
                rule: v.rule,
                entity: v.entity,
                message: v.message(),
            }),
            ..Self::new(v.code(), v.reason())
        }
    }

    fn reputation(rule: &'static str, entity: rules::Entity, status: &str) -> Self {
        Self {
            breach: Some(Breach {
                rule,
                entity,
                message: format!("{} is {status} ({rule})", entity.as_str()),
            }),
            ..Self::new(
                Erc7769Code::ThrottledOrBanned,
                format!("{rule} {} {status}", entity.as_str()),
            )
        }
    }
}

/// Whether a passed validation admits the operation (counts in `opsSeen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The workflow's `validate` step: counts.
    Admit,
    /// A pre-check (`eth_sendUserOperation`): does not count.
    Check,
}

/// The entities of `op` with a reputation (its factory and paymaster).
pub fn reputation_entities(op: &UserOperation) -> Vec<(rules::Entity, Address)> {
    let mut out = Vec::new();
    if let Some(f) = op.factory {
        out.push((rules::Entity::Factory, f));
    }
    if let Some(p) = op.paymaster {
        out.push((rules::Entity::Paymaster, p));
    }
    out
}

fn hex_lower(a: Address) -> String {
    format!("{a:#x}")
}

/// Validates `op` (packed as `packed`) for `chain` on `ep` (see the module docs).
/// `Ok(None)`: valid.
///
/// # Errors
/// [`ValidationError`] when no verdict could be had (retry).
pub async fn validate(
    db: &PgPool,
    chain: &AaChain,
    ep: &ResolvedEntryPoint,
    op: &UserOperation,
    packed: &PackedUserOperation,
    admission: Admission,
) -> Result<Option<Refusal>, ValidationError> {
    let chain_id = chain.pool.chain().get();
    let settings = settings(chain_id);
    let db_chain = crate::flow::chain_id_i64(chain_id);
    // Reputation first (ERC-7562 local rules: no simulation for a banned entity).
    for (entity, address) in reputation_entities(op) {
        let row = store::reputation_get(db, db_chain, address.as_slice()).await?;
        match settings.reputation.status(row) {
            Status::Ok => {}
            Status::Banned => {
                return Ok(Some(Refusal::reputation("GREP-010", entity, "banned")));
            }
            Status::Throttled => {
                let open =
                    store::user_operations_open_with_entity(db, db_chain, &hex_lower(address))
                        .await?;
                if open >= settings.reputation.throttled_mempool_count {
                    return Ok(Some(Refusal::reputation("GREP-020", entity, "throttled")));
                }
            }
        }
    }
    let refusal = match settings.mode {
        ValidationMode::Unsafe => crate::flow::simulate_handle_ops(
            &chain.pool,
            ep,
            std::slice::from_ref(packed),
            chain.bundler,
            crate::eip7702::authorization_list([op]),
        )
        .await?
        .map(|r| Refusal::from_rejection(&r)),
        ValidationMode::Tracing => {
            traced(
                &chain.pool,
                ep,
                op,
                packed,
                chain.bundler,
                chain.directory,
                &settings,
            )
            .await?
        }
    };
    if refusal.is_none() && admission == Admission::Admit {
        let addrs: Vec<Vec<u8>> = reputation_entities(op)
            .into_iter()
            .map(|(_, a)| a.to_vec())
            .collect();
        if !addrs.is_empty() {
            store::reputation_add(db, db_chain, &addrs, 1, 0).await?;
        }
    }
    Ok(refusal)
}

/// The violations of the traced validation of `op`, and the EntryPoint's verdict.
///
/// # Errors
/// The chain error when the trace or a stake read failed.
pub async fn trace_violations(
    pool: &UpstreamPool,
    ep: &ResolvedEntryPoint,
    op: &UserOperation,
    packed: &PackedUserOperation,
    from: Address,
    directory: Address,
    settings: &ValidationSettings,
) -> Result<(Vec<Violation>, Option<EntryPointRejection>), ChainError> {
    let data = crate::flow::handle_ops_calldata(std::slice::from_ref(packed), from);
    let epa = ep.address();
    let (trace, factory_stake, account_stake, paymaster_stake) = tokio::try_join!(
        tracer::trace_call(
            pool,
            epa,
            from,
            data,
            crate::eip7702::authorization_list([op])
        ),
        staked(pool, epa, op.factory, settings),
        staked(pool, epa, Some(op.sender), settings),
        paymaster_staked(pool, epa, op.paymaster, directory, settings),
    )?;
    let ctx = RuleContext {
        entry_point: epa,
        sender: op.sender,
        factory: op.factory,
        paymaster: op.paymaster,
        factory_staked: factory_stake == Stake::Staked,
        account_staked: account_stake == Stake::Staked,
        paymaster_staked: paymaster_stake == Stake::Staked,
        factory_stake_too_low: factory_stake == Stake::TooLow,
        paymaster_stake_too_low: paymaster_stake == Stake::TooLow,
    };
    let violations = rules::check(&trace, &ctx);
    let rejection = (!trace.error.is_empty()).then(|| {
        EntryPointRejection::decode(&trace.output).unwrap_or(EntryPointRejection {
            op_index: 0,
            aa: None,
            reason: "handleOps simulation reverted".to_owned(),
            inner: None,
        })
    });
    Ok((violations, rejection))
}

async fn traced(
    pool: &UpstreamPool,
    ep: &ResolvedEntryPoint,
    op: &UserOperation,
    packed: &PackedUserOperation,
    from: Address,
    directory: Address,
    settings: &ValidationSettings,
) -> Result<Option<Refusal>, ChainError> {
    let (violations, rejection) =
        trace_violations(pool, ep, op, packed, from, directory, settings).await?;
    if let Some(v) = violations.first() {
        tracing::debug!(
            target: "keel::aa::validation",
            rule = v.rule,
            entity = v.entity.as_str(),
            "user operation breaks an ERC-7562 rule"
        );
        return Ok(Some(Refusal::from_violation(v)));
    }
    Ok(rejection.map(|r| Refusal::from_rejection(&r)))
}

/// An entity's stake at the EntryPoint against the configured minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stake {
    /// No stake (or no entity).
    None,
    /// A stake whose amount or unstake delay is below the minimum (or being withdrawn).
    TooLow,
    /// Staked (ERC-7562 SREP-010).
    Staked,
}

async fn staked(
    pool: &UpstreamPool,
    entry_point: Address,
    entity: Option<Address>,
    settings: &ValidationSettings,
) -> Result<Stake, ChainError> {
    let Some(account) = entity else {
        return Ok(Stake::None);
    };
    let call = IStakeQueryV08::getDepositInfoCall { account };
    let tx = TransactionRequest {
        to: Some(TxKind::Call(entry_point)),
        input: TransactionInput::new(call.abi_encode().into()),
        ..Default::default()
    };
    let out = pool.call(&tx, BlockNumberOrTag::Latest).await?;
    let Ok(info) = IStakeQueryV08::getDepositInfoCall::abi_decode_returns(&out) else {
        return Ok(Stake::None);
    };
    Ok(
        if info.staked
            && U256::from(info.stake) >= settings.min_stake_wei
            && info.unstakeDelaySec >= settings.min_unstake_delay_secs
        {
            Stake::Staked
        } else if info.stake > 0 {
            Stake::TooLow
        } else {
            Stake::None
        },
    )
}

async fn paymaster_staked(
    pool: &UpstreamPool,
    entry_point: Address,
    paymaster: Option<Address>,
    directory: Address,
    settings: &ValidationSettings,
) -> Result<Stake, ChainError> {
    let Some(pm) = paymaster else {
        return Ok(Stake::None);
    };
    let stake = staked(pool, entry_point, Some(pm), settings).await?;
    if stake == Stake::Staked || keel_sponsor_paymaster(pool, directory).await? == Some(pm) {
        return Ok(Stake::Staked);
    }
    Ok(stake)
}

/// The chain Directory's `sponsorPaymaster` entry (`None` when unset or unreadable).
async fn keel_sponsor_paymaster(
    pool: &UpstreamPool,
    directory: Address,
) -> Result<Option<Address>, ChainError> {
    let call = Directory::getCall {
        name: keel_abi::directory_key(keel_abi::platform::names::SPONSOR_PAYMASTER),
    };
    let tx = TransactionRequest {
        to: Some(TxKind::Call(directory)),
        input: TransactionInput::new(call.abi_encode().into()),
        ..Default::default()
    };
    match pool.call(&tx, BlockNumberOrTag::Latest).await {
        Ok(out) => Ok(Directory::getCall::abi_decode_returns(&out)
            .ok()
            .filter(|a| !a.is_zero())),
        Err(ChainError::Node { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `op` may not join a bundle holding `chosen` (ERC-7562 STO-040): its sender
/// is a factory or paymaster of a chosen operation, or its factory or paymaster is the
/// sender of one.
pub fn entity_conflict<'a>(
    chosen: impl IntoIterator<Item = &'a UserOperation>,
    op: &UserOperation,
) -> bool {
    let mut senders = HashSet::new();
    let mut entities = HashSet::new();
    for c in chosen {
        senders.insert(c.sender);
        entities.extend(c.factory);
        entities.extend(c.paymaster);
    }
    entities.contains(&op.sender)
        || op.factory.is_some_and(|f| senders.contains(&f))
        || op.paymaster.is_some_and(|p| senders.contains(&p))
}

/// Counts an included operation in its entities' `opsIncluded`.
///
/// # Errors
/// [`StoreError`].
pub async fn record_included<'e>(
    db: impl PgExecutor<'e>,
    chain_id: i64,
    op: &UserOperation,
) -> Result<(), StoreError> {
    let addrs: Vec<Vec<u8>> = reputation_entities(op)
        .into_iter()
        .map(|(_, a)| a.to_vec())
        .collect();
    if addrs.is_empty() {
        return Ok(());
    }
    store::reputation_add(db, chain_id, &addrs, 0, 1).await
}

/// Penalises the entity accountable for `op` failing in a bundle simulation after its
/// validation (ERC-7562 GREP-040, EREP-015/020; what issue 33 calls EREP-050/060,
/// not ERC-7562's rules of that name, see [`rules`]): its
/// `opsSeen` becomes the ban penalty and its `opsIncluded` 0. Accountable: the
/// paymaster for `AA33` (reverted), `AA34` (signature) and `AA36` (over its gas limit);
/// the factory for `AA13`–`AA15` and, for an operation that creates its account, for
/// `AA23`, `AA24` and `AA26`. Failures another party can cause between validation and
/// bundling are not penalised: validity windows (`AA22`, `AA32`), nonces (`AA25`),
/// balances and deposits (`AA21`, `AA31`), an account created meanwhile (`AA10`).
/// Keel's own SponsorPaymaster (the chain's [`crate::flow::Sponsor`] or the Directory's
/// `sponsorPaymaster`) is never penalised (a sponsor key rotation would otherwise ban
/// it); when the Directory cannot be read nothing is penalised.
///
/// # Errors
/// [`StoreError`].
pub async fn penalise_bundle_failure<'e>(
    db: impl PgExecutor<'e>,
    chain: &AaChain,
    op: &UserOperation,
    aa: Option<AaCode>,
) -> Result<(), StoreError> {
    let accountable = match aa.map(|c| c.0) {
        Some(33 | 34 | 36) => op.paymaster,
        Some(13..=15) => op.factory,
        Some(23 | 24 | 26) => op.factory,
        _ => None,
    };
    let Some(address) = accountable else {
        return Ok(());
    };
    if chain
        .sponsor
        .as_ref()
        .is_some_and(|s| s.paymaster == address)
    {
        return Ok(());
    }
    match keel_sponsor_paymaster(&chain.pool, chain.directory).await {
        Ok(Some(keel)) if keel == address => return Ok(()),
        Ok(_) => {}
        Err(_) => return Ok(()),
    }
    let chain_id = chain.pool.chain().get();
    let penalty = settings(chain_id).reputation.ban_ops_seen_penalty;
    tracing::info!(
        target: "keel::aa::validation",
        chain_id,
        "an entity's operation failed in a bundle after validation: entity banned"
    );
    store::reputation_set(
        db,
        crate::flow::chain_id_i64(chain_id),
        address.as_slice(),
        penalty,
        0,
    )
    .await
}

/// Whether the chain's node traces with Keel's tracer (startup probe of
/// [`ValidationMode::Tracing`]).
///
/// # Errors
/// [`ProbeError`].
pub async fn probe(pool: &UpstreamPool) -> Result<(), ProbeError> {
    match tracer::probe(pool).await {
        Ok(()) => Ok(()),
        Err(ChainError::Node { .. }) => Err(ProbeError::NoTracing),
        Err(e) => Err(ProbeError::Chain(e)),
    }
}

/// Why the tracing probe failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The node refused `debug_traceCall` with a JavaScript tracer.
    #[error(
        "the chain's node does not support debug_traceCall with a JavaScript tracer, which ERC-7562 validation needs; use a node that does, or set aa.validation = \"unsafe\" (no ERC-7562 rules, see docs/aa.md)"
    )]
    NoTracing,
    /// The node did not answer.
    #[error("the chain's node did not answer the tracing probe")]
    Chain(#[source] ChainError),
}

/// Whether `account` counts as staked on `entry_point` by the chain's settings
/// (ERC-7562 `MIN_STAKE_VALUE` and `MIN_UNSTAKE_DELAY`: `aa.minStakeWei`,
/// `aa.minUnstakeDelaySecs`), read with `getDepositInfo`.
///
/// # Errors
/// The chain error when the read failed.
pub async fn is_staked(
    pool: &UpstreamPool,
    entry_point: Address,
    account: Address,
) -> Result<bool, ChainError> {
    let settings = settings(pool.chain().get());
    Ok(matches!(
        staked(pool, entry_point, Some(account), &settings).await?,
        Stake::Staked
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(sender: u8, factory: Option<u8>, paymaster: Option<u8>) -> UserOperation {
        let mut o: UserOperation = serde_json::from_value(serde_json::json!({
            "sender": Address::repeat_byte(sender),
            "nonce": "0x0",
            "callData": "0x",
            "callGasLimit": "0x0",
            "verificationGasLimit": "0x0",
            "preVerificationGas": "0x0",
            "maxFeePerGas": "0x0",
            "maxPriorityFeePerGas": "0x0",
            "signature": "0x"
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        o.factory = factory.map(Address::repeat_byte);
        o.paymaster = paymaster.map(Address::repeat_byte);
        o
    }

    #[test]
    fn an_address_is_not_sender_and_entity_in_one_bundle() {
        let a = op(1, None, Some(9));
        assert!(entity_conflict([&a], &op(9, None, None)));
        assert!(entity_conflict([&op(9, None, None)], &op(2, None, Some(9))));
        assert!(entity_conflict([&op(9, None, None)], &op(2, Some(9), None)));
        assert!(entity_conflict([&op(2, Some(9), None)], &op(9, None, None)));
        assert!(!entity_conflict([&a], &op(2, None, Some(9))));
        assert!(!entity_conflict([&a], &op(3, Some(4), None)));
    }
}
