//! `organization.system`: deploys an organization's own system on a chain (its asset
//! factory, eligibility registry and compliance contract) and makes it the one the
//! organization carries, putting it in the Ledger Index's scope in a safe order.
//!
//! ## The settings step writes state the workflow does not own
//! The step `settings` is the earliest point at which the new system's addresses exist
//! and the organization's record and the index scope outlive the workflow. Its order is
//! the design: it **reads** the system the organization carries now, **takes that one
//! out of the scope** when this deployment replaces it, and **only then writes** the new
//! one (scope first, then the organization's record). A step that fails part way (a
//! killed runner) is re-run from its first line, so the read comes before the write
//! that overwrites what it reads, and every write is idempotent. No failure handler
//! repairs anything: a killed runner skips failure handlers.
//!
//! A deployment whose execution is gone before it finishes is declared failed by the
//! runner's abandonment sweep ([`crate::ops::Ops::sweep_abandoned_systems`]), which also
//! takes the abandoned system out of the scope; only the sweep writes `failed`.
//!
//! `KEEL_CRASH_AT` (a comma-separated list of the [`crash_point`] names below) makes a
//! runner abort at those points: the kill tests' precise kill -9.

use crate::env::WorkflowEnv;
use crate::store;
use crate::workflows::contract::{Failure, OpFailure};
use crate::workflows::send::{Write, chain_of, find_events, send, step_ok, wait_indexed};
use alloy::primitives::{Address, B256};
use alloy::sol_types::SolCall;
use keel_abi::bindings::SystemFactory;
use keel_durable::{StepError, Workflow, WorkflowContext, WorkflowFailure};
use keel_index::{ScopeEntry, ScopeKind};
use keel_units::ChainId;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::{Arc, OnceLock};
use uuid::Uuid;

/// The crash points of `organization.system`, in the order they are passed.
pub const CRASH_POINTS: [&str; 6] = [
    "org-system.landed",
    "org-system.recorded",
    "org-system.settings-read",
    "org-system.old-out-of-scope",
    "org-system.new-in-scope",
    "org-system.settings-written",
];

/// Aborts the process (no unwinding, no shutdown path: as a kill -9) when `name` is in
/// `KEEL_CRASH_AT` (comma-separated; read once). A test hook: unset, it does nothing.
pub fn crash_point(name: &str) {
    static AT: OnceLock<Vec<String>> = OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("KEEL_CRASH_AT")
            .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
            .unwrap_or_default()
    });
    if at.iter().any(|a| a == name) {
        eprintln!("KEEL_CRASH_AT: aborting at {name}");
        std::process::abort();
    }
}

/// The on-chain key of an organization: its UUID's 16 bytes, left-padded to 32.
pub fn onchain_organization_id(organization_id: Uuid) -> B256 {
    B256::left_padding_from(organization_id.as_bytes())
}

/// Input of `organization.system`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrgSystemInput {
    /// The operation (and the system's id).
    pub operation_id: Uuid,
    /// The organization.
    pub organization_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The deployment's serial per (organization, chain), from 1 (part of the CREATE2 salt).
    pub serial: u64,
}

/// Output of `organization.system`: the deployed system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrgSystemOutput {
    /// The system's id (its operation's).
    pub system_id: Uuid,
    /// The `OrgAssetFactory`.
    pub factory: Address,
    /// The `IdentityRegistry` (eligibility registry).
    pub registry: Address,
    /// The `Compliance` contract.
    pub compliance: Address,
    /// The system it replaced, if any.
    pub replaced: Option<Uuid>,
    /// The newer system (accepted later, finished first) that made this deployment
    /// obsolete before it was carried: this one never became the organization's.
    #[serde(default)]
    pub superseded_by: Option<Uuid>,
    /// The block of the deployment transaction.
    pub deployed_block: u64,
}

/// `organization.system` (see the module documentation). Deployments of one
/// organization on one chain run one at a time (serialization key
/// `org-system:<organization>:<chain>`): a redeployment accepted while one is in flight
/// waits for it, then replaces it.
#[derive(Debug, Clone)]
pub struct OrgSystemDeploy(pub Arc<WorkflowEnv>);

fn db_err<E>(_: E) -> StepError<OpFailure> {
    StepError::transient("DATABASE_UNAVAILABLE")
}

fn index_err<E>(_: E) -> StepError<OpFailure> {
    StepError::transient("INDEX_UNAVAILABLE")
}

fn addr(bytes: Option<&[u8]>) -> Option<Address> {
    bytes.and_then(|b| Address::try_from(b).ok())
}

/// The factory's scope entry of a system.
fn factory_entry(factory: Address, organization: Uuid, from_block: u64) -> ScopeEntry {
    ScopeEntry {
        address: factory,
        kind: ScopeKind::AssetFactory,
        organization: Some(organization.to_string()),
        from_block,
    }
}

impl Workflow for OrgSystemDeploy {
    const NAME: &'static str = "organization.system";
    const VERSION: u32 = 1;
    type Input = OrgSystemInput;
    type Output = OrgSystemOutput;
    type Error = OpFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: OrgSystemInput,
    ) -> Result<OrgSystemOutput, Failure> {
        let p = &*self.0;
        let chain = chain_of(ctx, p, input.chain_id).await?;
        let Some(system_factory) = chain.contracts.system_factory else {
            return Err(WorkflowFailure::Failed(OpFailure::new(
                "SYSTEM_FACTORY_MISSING",
                false,
                "the chain was bootstrapped before organization systems existed; run `keel chain bootstrap` again",
            )));
        };
        let id = input.operation_id;
        let org = input.organization_id;
        let chain_id = chain.chain_id;
        let chain_db = i64::try_from(input.chain_id).map_err(|_| {
            WorkflowFailure::Failed(OpFailure::new("INVALID_INPUT", false, "chain id range"))
        })?;

        ctx.set_progress(json!({ "phase": "deploy", "serial": input.serial }));
        let call = SystemFactory::createSystemCall {
            organization: onchain_organization_id(org),
            serial: input.serial,
            admin: p.operator,
            deployers: chain.senders.senders().to_vec(),
        }
        .abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            Write {
                operation_id: id,
                name: "deploy-system",
                contract: system_factory,
                funding_deadline: None,
                sender: p.operator,
                value: keel_units::Wei::ZERO,
            },
            call,
        )
        .await?;

        let (factory, registry, compliance) = step_ok(
            ctx.step("record system", || async move {
                crash_point(CRASH_POINTS[0]);
                let created =
                    find_events::<SystemFactory::SystemCreated>(chain, landed, system_factory)
                        .await?
                        .into_iter()
                        .find(|e| {
                            e.organization == onchain_organization_id(org)
                                && e.serial == input.serial
                        })
                        .ok_or_else(|| {
                            StepError::Failed(OpFailure::new(
                                "EVENT_MISSING",
                                false,
                                "the confirmed transaction did not emit SystemCreated",
                            ))
                        })?;
                store::org_system_deployed(
                    &p.db,
                    id,
                    created.factory.as_slice(),
                    created.registry.as_slice(),
                    created.compliance.as_slice(),
                    i64::try_from(landed.block).unwrap_or(i64::MAX),
                )
                .await
                .map_err(db_err)?;
                crash_point(CRASH_POINTS[1]);
                Ok((created.factory, created.registry, created.compliance))
            })
            .await?,
        )?;

        ctx.set_progress(json!({ "phase": "settings", "factory": factory }));
        let serial = input.serial;
        let settled = step_ok(
            ctx.step("settings", || async move {
                // One settings step (or sweep) per organization and chain at a time; the
                // lock dies with the connection, which is closed afterwards on every path.
                let mut lock = p.db.acquire().await.map_err(db_err)?;
                store::org_system_lock(&mut lock, org, chain_db)
                    .await
                    .map_err(db_err)?;
                let settled = settings(
                    p,
                    id,
                    org,
                    chain_db,
                    chain_id,
                    serial,
                    factory,
                    landed.block,
                )
                .await;
                drop(lock.detach());
                settled
            })
            .await?,
        )?;
        let (replaced, superseded_by) = match settled {
            Settled::Carried { replaced } => (replaced, None),
            Settled::Superseded { by } => (None, Some(by)),
        };

        ctx.set_progress(json!({ "phase": "index", "factory": factory }));
        step_ok(
            ctx.step("wait indexed", || async move {
                wait_indexed(p, chain_id, landed.block).await
            })
            .await?,
        )?;
        ctx.set_progress(json!({ "phase": "done", "factory": factory }));
        Ok(OrgSystemOutput {
            system_id: id,
            factory,
            registry,
            compliance,
            replaced,
            superseded_by,
            deployed_block: landed.block,
        })
    }
}

/// What the settings step decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
enum Settled {
    /// The organization carries the new system now (replacing `replaced`).
    Carried { replaced: Option<Uuid> },
    /// A deployment accepted later is carried already: this one stays out.
    Superseded { by: Uuid },
}

/// The settings step's body (see the module documentation), under the lock.
#[allow(clippy::too_many_arguments)]
async fn settings(
    p: &WorkflowEnv,
    id: Uuid,
    org: Uuid,
    chain_db: i64,
    chain_id: ChainId,
    serial: u64,
    factory: Address,
    block: u64,
) -> Result<Settled, StepError<OpFailure>> {
    // A deployment the sweep declared failed (its execution was gone) does not come
    // back: it never becomes the organization's system.
    let own = store::org_system_get(&p.db, id).await.map_err(db_err)?;
    if own.is_some_and(|s| s.state == "failed") {
        return Err(StepError::Failed(OpFailure::new(
            "SYSTEM_ABANDONED",
            false,
            "the abandonment sweep declared this deployment failed; deploy again",
        )));
    }
    // 1. Read what the organization carries now.
    let current = store::org_system_current(&p.db, org, chain_db)
        .await
        .map_err(db_err)?;
    crash_point(CRASH_POINTS[2]);
    let replaced = match current {
        // A later deployment finished first: this one stays out of the scope.
        Some(newer) if newer.id != id && u64::try_from(newer.serial).unwrap_or(0) > serial => {
            keel_index::scope::remove_scope(&p.db, chain_id, factory)
                .await
                .map_err(index_err)?;
            store::org_system_superseded(&p.db, id, newer.id)
                .await
                .map_err(db_err)?;
            return Ok(Settled::Superseded { by: newer.id });
        }
        // 2. Take the carried one out of the scope: this deployment replaces it.
        Some(old) if old.id != id => {
            if let Some(old_factory) = addr(old.factory.as_deref()) {
                keel_index::scope::remove_scope(&p.db, chain_id, old_factory)
                    .await
                    .map_err(index_err)?;
            }
            crash_point(CRASH_POINTS[3]);
            Some(old.id)
        }
        // A re-run after the record was written reads this deployment as the
        // organization's: the system it replaced is on record.
        Some(_) => store::org_system_replaced_by(&p.db, id)
            .await
            .map_err(db_err)?,
        None => None,
    };
    // 3. Only then write the new one: the scope, then the record.
    keel_index::scope::add_scope(&p.db, chain_id, &factory_entry(factory, org, block))
        .await
        .map_err(index_err)?;
    crash_point(CRASH_POINTS[4]);
    let mut tx = p.db.begin().await.map_err(db_err)?;
    if let Some(old) = replaced {
        store::org_system_replaced(&mut *tx, old, id)
            .await
            .map_err(db_err)?;
    }
    store::org_system_activate(&mut tx, id)
        .await
        .map_err(db_err)?;
    tx.commit().await.map_err(db_err)?;
    crash_point(CRASH_POINTS[5]);
    Ok(Settled::Carried { replaced })
}

/// Puts `system`'s factory in the scope of its chain (`in_scope`) or takes it out: the
/// write of the abandonment sweep and of an operator's switch. A system without
/// deployed contracts has nothing to write. Idempotent.
///
/// # Errors
/// [`keel_index::IndexError`].
pub(crate) async fn set_scope(
    db: &sqlx::PgPool,
    system: &store::OrgSystemRow,
    in_scope: bool,
) -> Result<(), keel_index::IndexError> {
    let (Some(factory), Ok(chain)) = (
        addr(system.factory.as_deref()),
        u64::try_from(system.chain_id),
    ) else {
        return Ok(());
    };
    let chain = ChainId(chain);
    if in_scope {
        let from = u64::try_from(system.deployed_block.unwrap_or(0)).unwrap_or(0);
        keel_index::scope::add_scope(
            db,
            chain,
            &factory_entry(factory, system.organization_id, from),
        )
        .await?;
    } else {
        keel_index::scope::remove_scope(db, chain, factory).await?;
    }
    Ok(())
}

/// Input of `investor.set`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InvestorSetInput {
    /// The operation.
    pub operation_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The organization system's `IdentityRegistry`.
    pub registry: Address,
    /// The investor.
    pub investor: Address,
    /// Attested eligible.
    pub eligible: bool,
    /// ISO 3166-1 numeric country code (0: none).
    pub country: u16,
    /// Unix seconds after which the attestation lapses (0: never).
    pub expires_at: u64,
}

/// `investor.set` (issue 37 §2): `IdentityRegistry.setInvestor` of the organization's
/// system, sent by the operator (an agent of the registry), then the read-after-write.
/// One at a time per organization and chain.
#[derive(Debug, Clone)]
pub struct InvestorSet(pub Arc<WorkflowEnv>);

impl Workflow for InvestorSet {
    const NAME: &'static str = "investor.set";
    const VERSION: u32 = 1;
    type Input = InvestorSetInput;
    type Output = crate::workflows::TokenOpOutput;
    type Error = OpFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: InvestorSetInput,
    ) -> Result<crate::workflows::TokenOpOutput, Failure> {
        let p = &*self.0;
        let chain = chain_of(ctx, p, input.chain_id).await?;
        ctx.set_progress(json!({ "phase": "set-investor" }));
        let call = keel_abi::bindings::IdentityRegistry::setInvestorCall {
            investor: input.investor,
            eligible: input.eligible,
            country: input.country,
            expiry: input.expires_at,
        }
        .abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            Write {
                operation_id: input.operation_id,
                name: "set-investor",
                contract: input.registry,
                funding_deadline: None,
                sender: p.operator,
                value: keel_units::Wei::ZERO,
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
        Ok(crate::workflows::TokenOpOutput {
            tx_hash: landed.tx_hash,
            block: landed.block,
            indexed_block,
        })
    }
}
