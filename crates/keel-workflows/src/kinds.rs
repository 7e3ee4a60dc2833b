//! The operation kinds: **the one list** of what the Platform API can start.
//!
//! Each kind is one workflow (its name is the workflow's [`Workflow::NAME`]), one route
//! (`POST /v1/assets` or `POST /v1/assets/{id}/<segment>`) and one result shape. Every
//! other list is derived from [`OperationKind::ALL`] or proven equal to it by a test:
//! the runner's registrations ([`register_all`], [`WORKFLOWS`]), the
//! start dispatch of the operations service, the stored `operation.kind` (decoded at the
//! row as an [`OperationKind`]; migration 0085 dropped the SQL CHECK that repeated this
//! list), the API's result `oneOf`, its `kind` filter and its route table.
//!
//! ## Adding a token operation
//! 1. the workflow: its `token_workflow!` line in `workflows/token_op.rs`, its
//!    [`crate::workflows::TokenAction`] variant and contract call (`calldata`), its
//!    approval rule ([`crate::ops::accept::needs_approval`]);
//! 2. its line in the `token:` list below;
//! 3. its request: a [`crate::TokenRequest`] variant, and in keel-api its handler, route
//!    and scope line (a keel-api test fails until they exist) and its result variant;
//! 4. its docs (the API reference is generated).
//!
//! A kind with a route of its own (not under `/v1/assets/{id}`) goes in the `other:`
//! list with its path: `distribution.pay` (`POST /v1/distributions`),
//! `organization.system` (`POST /v1/organizations/{id}/system`).

use crate::env::WorkflowEnv;
use crate::error::{OpsError, Result};
use crate::ops::Ops;
use crate::tenancy::Caller;
use crate::workflows::contract::TokenOpInput;
use crate::workflows::{
    AssetBatchMint, AssetBatchTransfer, AssetBurn, AssetCreate, AssetForcedTransfer, AssetFreeze,
    AssetGrantRole, AssetMint, AssetPause, AssetRecover, AssetRevokeRole, AssetSetCompliance,
    AssetTransfer, AssetUnfreeze, AssetUnpause, DistributionPay, InvestorSet, OrgSystemDeploy,
};
use keel_durable::Workflow;
use std::sync::Arc;
use uuid::Uuid;

/// The shape of a completed operation's `result` (its workflow's output type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultShape {
    /// [`crate::workflows::AssetCreateOutput`]: the deployed contracts.
    AssetCreate,
    /// [`crate::workflows::TokenOpOutput`]: one transaction and its indexed block.
    TokenOp,
    /// [`crate::workflows::RoleChangeOutput`]: a token operation that also says whether
    /// the role changed.
    RoleChange,
    /// [`crate::workflows::DistributionOutput`]: the payments of a distribution tallied.
    Distribution,
    /// [`crate::workflows::OrgSystemOutput`]: the deployed organization system.
    OrgSystem,
}

/// An unknown operation kind name (from a request's `kind` filter or a stored row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown operation kind")]
pub struct UnknownKind;

macro_rules! operation_kinds {
    (
        create: $create:ident => $create_shape:ident;
        token: { $( $(#[$doc:meta])* $tok:ident => $segment:literal, $shape:ident; )* }
        other: { $( $(#[$odoc:meta])* $other:ident => $path:literal, $oshape:ident; )* }
    ) => {
        /// An operation kind. Serialized (JSON, SQL `operation.kind`) as its workflow's
        /// name: `asset.create`, `asset.mint`, ...
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum OperationKind {
            /// `asset.create` (`POST /v1/assets`): deploys an asset's contracts.
            $create,
            $( $(#[$doc])* $tok, )*
            $( $(#[$odoc])* $other, )*
        }

        impl OperationKind {
            /// Every kind, `asset.create` first, then the token operations in API order.
            pub const ALL: &'static [OperationKind] =
                &[Self::$create, $(Self::$tok,)* $(Self::$other,)*];

            /// The kind's name, which is its workflow's name (`asset.mint`).
            pub const fn name(self) -> &'static str {
                match self {
                    Self::$create => <$create as Workflow>::NAME,
                    $( Self::$tok => <$tok as Workflow>::NAME, )*
                    $( Self::$other => <$other as Workflow>::NAME, )*
                }
            }

            /// The last segment of the kind's `POST /v1/assets/{id}/<segment>` route, or
            /// `None` for `asset.create` (`POST /v1/assets`) and the kinds with a route of
            /// their own ([`OperationKind::own_route`]).
            pub const fn route_segment(self) -> Option<&'static str> {
                match self {
                    Self::$create => None,
                    $( Self::$tok => Some($segment), )*
                    $( Self::$other => None, )*
                }
            }

            /// The route of a kind that is not under `/v1/assets` (`POST /v1/distributions`).
            pub const fn own_route(self) -> Option<&'static str> {
                match self {
                    $( Self::$other => Some($path), )*
                    _ => None,
                }
            }

            /// The shape of the kind's result.
            pub const fn result_shape(self) -> ResultShape {
                match self {
                    Self::$create => ResultShape::$create_shape,
                    $( Self::$tok => ResultShape::$shape, )*
                    $( Self::$other => ResultShape::$oshape, )*
                }
            }
        }

        /// The workflow names of every kind, in [`OperationKind::ALL`] order: what the
        /// runner registers ([`register_all`]) and the durable gauges are labelled with.
        pub const WORKFLOWS: [&str; 1 + [$(stringify!($tok)),*].len() + [$(stringify!($other)),*].len()] =
            [<$create as Workflow>::NAME, $(<$tok as Workflow>::NAME,)* $(<$other as Workflow>::NAME,)*];

        /// Registers the workflow of every kind with `engine` (the runner's registration;
        /// [`WORKFLOWS`] lists the same names).
        pub fn register_all(
            engine: keel_durable::Engine,
            env: Arc<WorkflowEnv>,
        ) -> keel_durable::Engine {
            engine
                .register($create(env.clone()))
                $( .register($tok(env.clone())) )*
                $( .register($other(env.clone())) )*
        }

        impl Ops {
            /// Starts the workflow of token-operation `kind` for `operation_id`
            /// (idempotently: the operation id is the engine's idempotency key).
            ///
            /// # Errors
            /// [`OpsError::InvalidField`] (`kind`) for `asset.create`, whose input is not
            /// a [`TokenOpInput`]; the errors of starting a workflow.
            pub(crate) async fn start_token_op(
                &self,
                kind: OperationKind,
                operation_id: Uuid,
                input: &TokenOpInput,
                serialization_key: Option<String>,
                caller: Caller,
            ) -> Result<Uuid> {
                match kind {
                    OperationKind::$create $( | OperationKind::$other )* => Err(OpsError::InvalidField {
                        field: "kind",
                        reason: "is not a token operation",
                    }),
                    $( OperationKind::$tok => {
                        self.start::<$tok>(operation_id, input, serialization_key, caller).await
                    } )*
                }
            }
        }
    };
}

operation_kinds! {
    create: AssetCreate => AssetCreate;
    token: {
        /// `asset.mint` (`POST /v1/assets/{id}/mint`).
        AssetMint => "mint", TokenOp;
        /// `asset.transfer` (`POST /v1/assets/{id}/transfer`).
        AssetTransfer => "transfer", TokenOp;
        /// `asset.pause` (`POST /v1/assets/{id}/pause`).
        AssetPause => "pause", TokenOp;
        /// `asset.unpause` (`POST /v1/assets/{id}/unpause`).
        AssetUnpause => "unpause", TokenOp;
        /// `asset.burn` (`POST /v1/assets/{id}/burn`).
        AssetBurn => "burn", TokenOp;
        /// `asset.grant-role` (`POST /v1/assets/{id}/grant-role`).
        AssetGrantRole => "grant-role", RoleChange;
        /// `asset.revoke-role` (`POST /v1/assets/{id}/revoke-role`).
        AssetRevokeRole => "revoke-role", RoleChange;
        /// `asset.set-compliance` (`POST /v1/assets/{id}/set-compliance`): the asset's
        /// rules in its organization system's compliance contract.
        AssetSetCompliance => "set-compliance", TokenOp;
        /// `asset.freeze` (`POST /v1/assets/{id}/freeze`): freezes an address, or part
        /// of a holder's balance (issue 37 §3).
        AssetFreeze => "freeze", TokenOp;
        /// `asset.unfreeze` (`POST /v1/assets/{id}/unfreeze`): unfreezes an address, or
        /// part of a holder's frozen balance.
        AssetUnfreeze => "unfreeze", TokenOp;
        /// `asset.forced-transfer` (`POST /v1/assets/{id}/forced-transfer`): an agent's
        /// transfer of a holder's tokens.
        AssetForcedTransfer => "forced-transfer", TokenOp;
        /// `asset.recover` (`POST /v1/assets/{id}/recover`): a lost wallet's balance,
        /// frozen state and registry entry moved to a new wallet.
        AssetRecover => "recover", TokenOp;
        /// `asset.batch-mint` (`POST /v1/assets/{id}/batch-mint`): mints to many
        /// recipients in one transaction.
        AssetBatchMint => "batch-mint", TokenOp;
        /// `asset.batch-transfer` (`POST /v1/assets/{id}/batch-transfer`): transfers from
        /// the issuer's holdings to many recipients in one transaction.
        AssetBatchTransfer => "batch-transfer", TokenOp;
    }
    other: {
        /// `distribution.pay` (`POST /v1/distributions`): pays the holders of a final
        /// snapshot ([`crate::workflows::distribution`]).
        DistributionPay => "/v1/distributions", Distribution;
        /// `organization.system` (`POST /v1/organizations/{id}/system`): deploys the
        /// organization's own system on a chain ([`crate::workflows::org_system`]).
        OrgSystemDeploy => "/v1/organizations/{id}/system", OrgSystem;
        /// `investor.set` (`POST /v1/organizations/{id}/investors`): an investor's
        /// attributes in the organization system's eligibility registry.
        InvestorSet => "/v1/organizations/{id}/investors", TokenOp;
    }
}

impl OperationKind {
    /// The kind named `name` (exact).
    ///
    /// # Errors
    /// [`UnknownKind`] for any other name.
    pub fn from_name(name: &str) -> std::result::Result<Self, UnknownKind> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .ok_or(UnknownKind)
    }

    /// The kind's route template as the API router and its scope table spell it:
    /// `/v1/assets` or `/v1/assets/{id}/<segment>`.
    pub fn route(self) -> String {
        if let Some(path) = self.own_route() {
            return path.to_owned();
        }
        match self.route_segment() {
            None => "/v1/assets".to_owned(),
            Some(segment) => format!("/v1/assets/{{id}}/{segment}"),
        }
    }
}

impl std::fmt::Display for OperationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A kind equals its name (`kind == "asset.mint"`).
impl PartialEq<str> for OperationKind {
    fn eq(&self, other: &str) -> bool {
        self.name() == other
    }
}

/// A kind equals its name (`kind == "asset.mint"`).
impl PartialEq<&str> for OperationKind {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl std::str::FromStr for OperationKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> std::result::Result<Self, UnknownKind> {
        Self::from_name(s)
    }
}

impl serde::Serialize for OperationKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for OperationKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::from_name(&name).map_err(serde::de::Error::custom)
    }
}

// `operation.kind`: decoded at the row; a stored kind this build does not know is a
// decode error naming the column (never a fallback).
keel_store::text_column!(OperationKind, "operation.kind", name);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_parse_back() {
        let mut names: Vec<_> = OperationKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), OperationKind::ALL.len());
        for k in OperationKind::ALL {
            assert_eq!(OperationKind::from_name(k.name()), Ok(*k));
            assert_eq!(
                serde_json::from_value::<OperationKind>(serde_json::to_value(k).unwrap()).unwrap(),
                *k
            );
        }
        assert_eq!(OperationKind::from_name("asset.thaw"), Err(UnknownKind));
        assert_eq!(OperationKind::AssetCreate.route(), "/v1/assets");
        assert_eq!(
            OperationKind::AssetGrantRole.route(),
            "/v1/assets/{id}/grant-role"
        );
    }

    #[test]
    fn every_kind_but_create_names_its_route_after_its_workflow() {
        for k in OperationKind::ALL {
            match k.route_segment() {
                None if k.own_route().is_some() => {}
                None => assert_eq!(*k, OperationKind::AssetCreate),
                Some(segment) => assert_eq!(k.name(), format!("asset.{segment}")),
            }
        }
    }
}
