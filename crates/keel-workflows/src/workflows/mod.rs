//! The asset workflows: `asset.create` and the token operations `asset.mint`,
//! `asset.transfer`, `asset.pause`, `asset.unpause`, `asset.burn`, `asset.grant-role`,
//! `asset.revoke-role`.
//!
//! Every on-chain write is one transaction-queue request keyed
//! `op/<operation id>/<write>` and one journaled enqueue step; the workflow then waits
//! for the request's settlement verdict, which the queue's settlement sink
//! ([`crate::verdicts`]) records as the signal `tx.<link>` in the transaction that
//! settles the request. Replaying a workflow after a crash therefore
//! never enqueues a second transaction for a write (the key is the same and the queue
//! is idempotent) and never broadcasts a landed write again.
//!
//! - [`contract`]: the inputs, outputs, signal names and the typed failure;
//! - `send` (private): one write as queue requests and the retry gate between attempts;
//! - [`AssetCreate`] (`asset_create`) and the token operations (`token_op`);
//! - [`DistributionPay`] ([`distribution`]) and its shares ([`distribution_plan`]).
//!
//! The bodies use only [`crate::store`] for the database, never the operations service.

pub(crate) mod asset_create;
pub mod contract;
pub mod distribution;
pub mod distribution_plan;
pub mod org_system;
pub(crate) mod send;
pub(crate) mod token_op;

pub use asset_create::AssetCreate;
pub use contract::{
    APPROVAL_SIGNAL, ApprovalDecision, AssetCreateInput, AssetCreateOutput, BatchLine, CANCELLED,
    ComplianceRules, Landed, OpFailure, RoleChangeOutput, TX_SIGNAL_PREFIX, TokenAction,
    TokenOpInput, TokenOpOutput, TokenRole, onchain_asset_id,
};
pub use distribution::{DistributionInput, DistributionOutput, DistributionPay, PayWith};
pub use org_system::{
    InvestorSet, InvestorSetInput, OrgSystemDeploy, OrgSystemInput, OrgSystemOutput,
};
pub use send::{chain_wake_tag, custom_error_name};
pub use token_op::{
    AssetBatchMint, AssetBatchTransfer, AssetBurn, AssetForcedTransfer, AssetFreeze,
    AssetGrantRole, AssetMint, AssetPause, AssetRecover, AssetRevokeRole, AssetSetCompliance,
    AssetTransfer, AssetUnfreeze, AssetUnpause, RECOVER_CRASH_POINTS,
};

pub use crate::kinds::{WORKFLOWS, register_all};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::WorkflowEnv;
    use std::sync::Arc;

    #[test]
    fn workflow_names_are_distinct() {
        let mut names = WORKFLOWS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), WORKFLOWS.len());
    }

    #[tokio::test]
    async fn register_all_registers_every_workflow() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1:5432/unused")
            .unwrap();
        let env = Arc::new(WorkflowEnv {
            db: pool.clone(),
            operator: alloy::primitives::Address::ZERO,
            suffix: keel_chain::AttributionSuffix::new(&["keel"]).unwrap(),
            chains: Default::default(),
            later_chains: Default::default(),
            index_wait: std::time::Duration::from_secs(1),
        });
        let engine = register_all(
            keel_durable::Engine::new(pool, keel_durable::EngineConfig::default()).unwrap(),
            env,
        );
        let mut registered = engine.registered();
        registered.sort();
        let mut expected: Vec<String> = WORKFLOWS.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        assert_eq!(registered, expected);
    }
}
