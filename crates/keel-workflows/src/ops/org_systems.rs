//! Organization systems (issue 37 §1): accepting a deployment, reading the systems, an
//! operator's on/off switch, and the abandonment sweep.

use super::{Ops, decode_err};
use crate::error::{OpsError, Result};
use crate::kinds::OperationKind;
use crate::ops::accept::Accepted;
use crate::store::{self, NewOperationRow, OperationRow, OrgSystemRow};
use crate::tenancy::Caller;
use crate::workflows::org_system::set_scope;
use crate::workflows::{OrgSystemDeploy, OrgSystemInput};
use alloy::primitives::Address;
use chrono::{DateTime, Utc};
use keel_durable::{RunStatus, Workflow};
use keel_units::ChainId;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::time::Duration;
use uuid::Uuid;

/// The state of an organization system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemState {
    /// Its deployment has not finished.
    Deploying,
    /// The organization carries it on its chain.
    Active,
    /// A later deployment replaced it (its assets stay indexed).
    Replaced,
    /// Its deployment's execution is gone; the abandonment sweep declared it failed.
    Failed,
}

impl SystemState {
    /// The wire name (`deploying`, `active`, `replaced`, `failed`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Deploying => "deploying",
            Self::Active => "active",
            Self::Replaced => "replaced",
            Self::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "deploying" => Self::Deploying,
            "active" => Self::Active,
            "replaced" => Self::Replaced,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// An organization system as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgSystemView {
    /// The system's id (its deploying operation's id).
    pub id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: ChainId,
    /// The deployment's serial per (organization, chain), from 1.
    pub serial: u64,
    /// Its state.
    pub state: SystemState,
    /// The `OrgAssetFactory`, once deployed.
    pub factory: Option<Address>,
    /// The `IdentityRegistry` (eligibility registry), once deployed.
    pub registry: Option<Address>,
    /// The `Compliance` contract, once deployed.
    pub compliance: Option<Address>,
    /// The block of its deployment transaction.
    pub deployed_block: Option<u64>,
    /// The operator's switch (a disabled system is out of the index scope and creates
    /// no assets).
    pub enabled: bool,
    /// Whether the organization carries it now on its chain.
    pub current: bool,
    /// Why the sweep declared it failed (`EXECUTION_GONE`).
    pub failure: Option<String>,
    /// Accepted at.
    pub created_at: DateTime<Utc>,
    /// Carried from.
    pub activated_at: Option<DateTime<Utc>>,
    /// Replaced or failed at.
    pub ended_at: Option<DateTime<Utc>>,
}

fn addr(b: Option<&[u8]>) -> Option<Address> {
    b.and_then(|b| Address::try_from(b).ok())
}

impl OrgSystemView {
    fn decode(r: OrgSystemRow, current: bool) -> Result<Self> {
        Ok(Self {
            id: r.id,
            chain_id: ChainId(u64::try_from(r.chain_id).map_err(decode_err)?),
            serial: u64::try_from(r.serial).map_err(decode_err)?,
            state: SystemState::parse(&r.state).ok_or_else(|| decode_err(()))?,
            factory: addr(r.factory.as_deref()),
            registry: addr(r.registry.as_deref()),
            compliance: addr(r.compliance.as_deref()),
            deployed_block: r.deployed_block.and_then(|b| u64::try_from(b).ok()),
            enabled: r.enabled,
            current,
            failure: r.failure,
            created_at: r.created_at,
            activated_at: r.activated_at,
            ended_at: r.ended_at,
        })
    }
}

/// What one abandonment sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// `deploying` systems looked at.
    pub examined: u64,
    /// Declared failed (their execution is gone) and taken out of the scope.
    pub failed: u64,
}

/// What the sweep knows of a deployment's execution.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Execution {
    /// Accepted `age_seconds` ago; its workflow was never started.
    NeverStarted { age_seconds: f64 },
    /// Its durable instance does not exist (dropped).
    Missing,
    /// Its instance, in `status`, last changed `idle_seconds` ago; `retryable` when it
    /// failed with a failure a retry can change.
    Known {
        status: RunStatus,
        retryable: bool,
        idle_seconds: f64,
    },
}

/// Whether a deployment's execution is gone: dropped, cancelled, failed for good, or
/// never started / failed retryably and left so for `abandon_after` (the window in which
/// a caller can still start it again or retry it).
fn execution_gone(execution: Execution, abandon_after: Duration) -> bool {
    let window = abandon_after.as_secs_f64();
    match execution {
        Execution::NeverStarted { age_seconds } => age_seconds >= window,
        Execution::Missing => true,
        Execution::Known {
            status: RunStatus::Cancelled,
            ..
        } => true,
        Execution::Known {
            status: RunStatus::Failed,
            retryable,
            idle_seconds,
        } => !retryable || idle_seconds >= window,
        Execution::Known { .. } => false,
    }
}

/// Deployments the sweep looks at per pass.
const SWEEP_BATCH: i64 = 500;

impl Ops {
    /// Asks `compliance` (the asset's organization system's, at the chain's latest
    /// block) whether `token` may move `amount` base units from `from` (zero: a mint)
    /// to `to` — the same `Compliance.check` the token runs on chain.
    ///
    /// # Errors
    /// [`OpsError::ComplianceRefused`] with the typed code. A chain without a node
    /// here, or a read that fails, skips the pre-check (logged): the on-chain check is
    /// authoritative and ends such an operation failed with the same code.
    pub(crate) async fn compliance_precheck(
        &self,
        chain: ChainId,
        compliance: Address,
        token: Address,
        from: Address,
        to: Address,
        amount: alloy::primitives::U256,
    ) -> Result<()> {
        use alloy::sol_types::SolCall;
        let Some(node) = self.nodes.get(&chain.get()) else {
            return Ok(());
        };
        let call = keel_abi::bindings::Compliance::checkCall {
            token,
            from,
            to,
            amount,
        };
        let tx = alloy::rpc::types::TransactionRequest::default()
            .to(compliance)
            .input(call.abi_encode().into());
        let answer = node
            .call(&tx, alloy::eips::BlockNumberOrTag::Latest)
            .await
            .ok()
            .and_then(|out| {
                keel_abi::bindings::Compliance::checkCall::abi_decode_returns(&out).ok()
            });
        match answer {
            Some(code) => match crate::compliance::refusal_code(code) {
                Some(refusal) => Err(OpsError::ComplianceRefused { code: refusal }),
                None => Ok(()),
            },
            None => {
                tracing::warn!(target: "keel::workflows::compliance", chain_id = chain.get(),
                    "compliance pre-check skipped: the chain's node did not answer; the token's on-chain check decides");
                Ok(())
            }
        }
    }

    /// The chain an operation acts on: its asset's, or its organization system's.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`].
    pub(crate) async fn operation_chain(
        &self,
        caller: Caller,
        op: &OperationRow,
    ) -> Result<ChainId> {
        if let Some(asset) = op.asset_id {
            return Ok(self.asset_record(caller, asset).await?.chain_id);
        }
        let chain = match store::org_system_get(&self.db, op.id).await? {
            Some(system) => system.chain_id,
            None => store::investor_change_chain(&self.db, op.id)
                .await?
                .ok_or(OpsError::NotFound { what: "operation" })?,
        };
        Ok(ChainId(u64::try_from(chain).map_err(decode_err)?))
    }

    /// Accepts an investor write (issue 37 §2): `investor.set` writes `investor`'s
    /// attributes into the eligibility registry of the system `organization_id` carries
    /// on `chain_id`. Writes of one organization and chain run one at a time, in
    /// acceptance order.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`organization`); [`OpsError::SystemNotDeployed`] when the
    /// organization carries no system there; [`OpsError::InvalidField`] (`address`,
    /// `countryCode`); [`OpsError::IdempotencyConflict`]; [`OpsError::Store`] /
    /// [`OpsError::Engine`].
    #[allow(clippy::too_many_arguments)]
    pub async fn investor_set(
        &self,
        caller: Caller,
        key: &str,
        organization_id: Uuid,
        chain_id: u64,
        investor: Address,
        eligible: bool,
        country: u16,
        expires_at: u64,
    ) -> Result<Accepted> {
        if organization_id != caller.organization_id {
            return Err(OpsError::NotFound {
                what: "organization",
            });
        }
        if investor.is_zero() {
            return Err(OpsError::InvalidField {
                field: "address",
                reason: "must not be the zero address",
            });
        }
        if country > 999 {
            return Err(OpsError::InvalidField {
                field: "countryCode",
                reason: "must be an ISO 3166-1 numeric code (0 to 999)",
            });
        }
        let chain_db = i64::try_from(chain_id).map_err(|_| OpsError::ChainNotConfigured)?;
        let system = store::org_system_current(&self.db, organization_id, chain_db)
            .await?
            .ok_or(OpsError::SystemNotDeployed)?;
        let registry = system
            .registry
            .as_deref()
            .and_then(|r| Address::try_from(r).ok())
            .ok_or(OpsError::SystemNotDeployed)?;
        let expires = i64::try_from(expires_at).map_err(|_| OpsError::InvalidField {
            field: "expiresAt",
            reason: "out of range",
        })?;
        let request_hash: Vec<u8> = Sha256::digest(
            json!({ "kind": crate::workflows::InvestorSet::NAME, "chainId": chain_id,
                    "investor": investor, "eligible": eligible, "country": country,
                    "expiresAt": expires_at })
            .to_string()
            .as_bytes(),
        )
        .to_vec();
        let (operation_id, created) = loop {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
            {
                if op.request_sha256 != request_hash {
                    return Err(OpsError::IdempotencyConflict);
                }
                if op.instance_id.is_some() {
                    return Ok(Accepted {
                        created: false,
                        operation: self.operation(caller, op.id).await?,
                    });
                }
                break (op.id, false);
            }
            let operation_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            let inserted = store::operation_insert(
                &mut *tx,
                &NewOperationRow {
                    id: operation_id,
                    organization_id: caller.organization_id,
                    kind: OperationKind::InvestorSet,
                    asset_id: None,
                    idempotency_key: key,
                    request_sha256: &request_hash,
                    api_key_id: caller.api_key_id,
                },
            )
            .await?;
            if inserted {
                store::investor_change_insert(
                    &mut *tx,
                    &store::NewInvestorChange {
                        operation_id,
                        organization_id,
                        system_id: system.id,
                        chain_id: chain_db,
                        investor: investor.as_slice(),
                        eligible,
                        country: i32::from(country),
                        expires_at: expires,
                    },
                )
                .await?;
                self.emit_accepted(&mut tx, caller.organization_id, operation_id)
                    .await?;
                tx.commit().await?;
                break (operation_id, true);
            }
            tx.rollback().await?;
        };
        let input = crate::workflows::InvestorSetInput {
            operation_id,
            chain_id,
            registry,
            investor,
            eligible,
            country,
            expires_at,
        };
        self.start::<crate::workflows::InvestorSet>(
            operation_id,
            &input,
            Some(format!("investors:{organization_id}:{chain_id}")),
            caller,
        )
        .await?;
        Ok(Accepted {
            created,
            operation: self.operation(caller, operation_id).await?,
        })
    }

    /// Accepts the deployment of `organization_id`'s system on `chain_id` (issue 37 §1):
    /// one `organization.system` operation with the next serial. Deployments of one
    /// organization and chain run one at a time, in acceptance order; each replaces the
    /// system the organization carries when it finishes.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`organization`) for another organization than the
    /// caller's; [`OpsError::ChainNotConfigured`] for a chain that was not bootstrapped;
    /// [`OpsError::IdempotencyConflict`]; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn org_system_deploy(
        &self,
        caller: Caller,
        key: &str,
        organization_id: Uuid,
        chain_id: u64,
    ) -> Result<Accepted> {
        if organization_id != caller.organization_id {
            return Err(OpsError::NotFound {
                what: "organization",
            });
        }
        let chain_db = i64::try_from(chain_id).map_err(|_| OpsError::ChainNotConfigured)?;
        crate::platform::PlatformAddresses::load(&self.db, chain_id)
            .await
            .map_err(|e| match e {
                crate::platform::PlatformError::Store(s) => OpsError::Store(s),
                _ => OpsError::ChainNotConfigured,
            })?;
        let request_hash: Vec<u8> = Sha256::digest(
            json!({ "kind": OrgSystemDeploy::NAME, "organization": organization_id, "chainId": chain_id })
                .to_string()
                .as_bytes(),
        )
        .to_vec();
        let (operation_id, created) = loop {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
            {
                if op.request_sha256 != request_hash {
                    return Err(OpsError::IdempotencyConflict);
                }
                if op.instance_id.is_some() {
                    return Ok(Accepted {
                        created: false,
                        operation: self.operation(caller, op.id).await?,
                    });
                }
                break (op.id, false);
            }
            let operation_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            let inserted = store::operation_insert(
                &mut *tx,
                &NewOperationRow {
                    id: operation_id,
                    organization_id: caller.organization_id,
                    kind: OperationKind::OrgSystemDeploy,
                    asset_id: None,
                    idempotency_key: key,
                    request_sha256: &request_hash,
                    api_key_id: caller.api_key_id,
                },
            )
            .await?;
            if inserted {
                store::org_system_insert(&mut tx, operation_id, organization_id, chain_db).await?;
                self.emit_accepted(&mut tx, caller.organization_id, operation_id)
                    .await?;
                tx.commit().await?;
                break (operation_id, true);
            }
            tx.rollback().await?;
        };
        let system = store::org_system_get(&self.db, operation_id)
            .await?
            .ok_or(OpsError::NotFound { what: "operation" })?;
        let input = OrgSystemInput {
            operation_id,
            organization_id,
            chain_id,
            serial: u64::try_from(system.serial).map_err(decode_err)?,
        };
        self.start::<OrgSystemDeploy>(
            operation_id,
            &input,
            Some(format!("org-system:{organization_id}:{chain_id}")),
            caller,
        )
        .await?;
        Ok(Accepted {
            created,
            operation: self.operation(caller, operation_id).await?,
        })
    }

    /// The caller's organization's systems, by chain, newest first.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`organization`) for another organization;
    /// [`OpsError::Store`].
    pub async fn org_systems(
        &self,
        caller: Caller,
        organization_id: Uuid,
    ) -> Result<Vec<OrgSystemView>> {
        if organization_id != caller.organization_id {
            return Err(OpsError::NotFound {
                what: "organization",
            });
        }
        let rows = store::org_systems_list(&self.db, organization_id).await?;
        let mut out = Vec::with_capacity(rows.len());
        let mut current: Vec<(i64, Option<Uuid>)> = Vec::new();
        for r in rows {
            let carried = match current.iter().find(|(c, _)| *c == r.chain_id) {
                Some((_, id)) => *id,
                None => {
                    let id = store::org_system_current(&self.db, organization_id, r.chain_id)
                        .await?
                        .map(|s| s.id);
                    current.push((r.chain_id, id));
                    id
                }
            };
            let is_current = carried == Some(r.id);
            out.push(OrgSystemView::decode(r, is_current)?);
        }
        Ok(out)
    }

    /// An operator's switch of system `system_id` (issue 37 §1: "turn a known system on
    /// or off, nothing else"): `enabled = false` takes its factory out of the index
    /// scope and stops asset creations through it (`SYSTEM_DISABLED`); `true` puts it
    /// back. Idempotent.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`system`); [`OpsError::SystemNotDeployed`] for a system
    /// without contracts; [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn org_system_switch(
        &self,
        caller: Caller,
        organization_id: Uuid,
        system_id: Uuid,
        enabled: bool,
    ) -> Result<OrgSystemView> {
        let row = store::org_system_get(&self.db, system_id)
            .await?
            .filter(|s| {
                s.organization_id == caller.organization_id && s.organization_id == organization_id
            })
            .ok_or(OpsError::NotFound { what: "system" })?;
        if row.factory.is_none() {
            return Err(OpsError::SystemNotDeployed);
        }
        // The flag first, then the scope (under the settings steps' lock): a repeat of
        // a switch that failed part way writes both again.
        let mut lock = self.db.acquire().await?;
        store::org_system_lock(&mut lock, row.organization_id, row.chain_id).await?;
        let switched = async {
            store::org_system_set_enabled(&self.db, system_id, enabled).await?;
            let row = store::org_system_get(&self.db, system_id)
                .await?
                .ok_or(OpsError::NotFound { what: "system" })?;
            set_scope(&self.db, &row, enabled).await?;
            Ok::<_, OpsError>(())
        }
        .await;
        drop(lock.detach());
        switched?;
        self.org_systems(caller, organization_id)
            .await?
            .into_iter()
            .find(|s| s.id == system_id)
            .ok_or(OpsError::NotFound { what: "system" })
    }

    /// One pass of the abandonment sweep (the runner's `org-systems-sweep` cron job):
    /// every `deploying` system whose execution is gone — its workflow instance does
    /// not exist, was cancelled or failed for good, or it was never started (or failed
    /// retryably and was not retried) `abandon_after` after acceptance (its failure) —
    /// is declared `failed` (`EXECUTION_GONE`) and its factory taken
    /// out of the index scope; the system its organization carries on that chain is
    /// then put (back) in the scope when enabled, repairing a removal the abandoned
    /// deployment's settings step made before it disappeared. Only this sweep writes
    /// `failed`.
    ///
    /// # Errors
    /// [`OpsError::Store`] / [`OpsError::Engine`] / [`OpsError::Index`]; a later pass
    /// retries.
    pub async fn sweep_abandoned_systems(&self, abandon_after: Duration) -> Result<SweepReport> {
        let rows = store::org_systems_deploying(&self.db, SWEEP_BATCH).await?;
        let mut report = SweepReport {
            examined: rows.len() as u64,
            failed: 0,
        };
        let instances: Vec<Uuid> = rows.iter().filter_map(|r| r.instance_id).collect();
        let statuses = self.engine.statuses(&instances).await?;
        let now = Utc::now();
        for r in rows {
            let execution = match r.instance_id {
                None => Execution::NeverStarted {
                    age_seconds: r.age_seconds,
                },
                Some(instance) => match statuses.iter().find(|s| s.id == instance) {
                    None => Execution::Missing,
                    Some(s) => Execution::Known {
                        status: s.status,
                        retryable: s.error.as_ref().is_some_and(|e| {
                            e.retryable
                                || e.detail.as_ref().and_then(|d| d.get("retryable"))
                                    == Some(&serde_json::Value::Bool(true))
                        }),
                        idle_seconds: (now - s.updated_at).num_milliseconds() as f64 / 1000.0,
                    },
                },
            };
            let gone = execution_gone(execution, abandon_after);
            if !gone {
                continue;
            }
            let Some(system) = store::org_system_get(&self.db, r.id).await? else {
                continue;
            };
            // Under the lock the settings steps take; out of the scope first, then the
            // record: a pass killed in between finds the row still `deploying` and does
            // both again.
            let mut lock = self.db.acquire().await?;
            store::org_system_lock(&mut lock, system.organization_id, system.chain_id).await?;
            let swept = self.sweep_one(&system).await;
            drop(lock.detach());
            if swept? {
                report.failed += 1;
                tracing::warn!(target: "keel::workflows::org_system", system = %system.id,
                    "organization system deployment abandoned: its execution is gone; declared failed and taken out of the index scope");
            }
        }
        Ok(report)
    }

    /// Fails one abandoned system (under the caller's lock); true when this call did.
    async fn sweep_one(&self, system: &OrgSystemRow) -> Result<bool> {
        // A re-read under the lock: a settings step may have carried it meanwhile.
        let Some(system) = store::org_system_get(&self.db, system.id).await? else {
            return Ok(false);
        };
        if system.state != "deploying" {
            return Ok(false);
        }
        set_scope(&self.db, &system, false).await?;
        let carried =
            store::org_system_current(&self.db, system.organization_id, system.chain_id).await?;
        if let Some(current) = carried
            && current.id != system.id
        {
            set_scope(&self.db, &current, current.enabled).await?;
        }
        Ok(store::org_system_failed(&self.db, system.id, "EXECUTION_GONE").await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every execution shape: gone at once when dropped, cancelled or failed for good;
    /// after the window when never started or failed retryably; never while it runs,
    /// waits or completed.
    #[test]
    fn an_execution_is_gone_only_when_nothing_can_finish_it() {
        let window = Duration::from_secs(300);
        let known = |status, retryable, idle_seconds| Execution::Known {
            status,
            retryable,
            idle_seconds,
        };
        assert!(execution_gone(Execution::Missing, window));
        assert!(execution_gone(
            known(RunStatus::Cancelled, false, 0.0),
            window
        ));
        assert!(execution_gone(known(RunStatus::Failed, false, 0.0), window));
        assert!(!execution_gone(
            known(RunStatus::Failed, true, 299.0),
            window
        ));
        assert!(execution_gone(
            known(RunStatus::Failed, true, 300.0),
            window
        ));
        assert!(!execution_gone(
            Execution::NeverStarted { age_seconds: 10.0 },
            window
        ));
        assert!(execution_gone(
            Execution::NeverStarted { age_seconds: 301.0 },
            window
        ));
        for status in [
            RunStatus::Pending,
            RunStatus::Running,
            RunStatus::Waiting,
            RunStatus::Suspended,
            RunStatus::Completed,
        ] {
            assert!(
                !execution_gone(known(status, true, 10_000.0), window),
                "{status:?}"
            );
            assert!(
                !execution_gone(known(status, false, 10_000.0), window),
                "{status:?}"
            );
        }
    }
}
