//! Accepting operations: `POST /v1/assets` ([`Ops::create_asset`]) and the token
//! operations ([`Ops::token_operation`]), idempotently by (organization,
//! `Idempotency-Key`) and the request's hash (see [`crate::ops`]).

use crate::error::{OpsError, Result};
use crate::ops::Ops;
use crate::ops::amount::{above_threshold, decimals, price_answer, token_amount};
use crate::ops::read::AssetStatus;
use crate::ops::view::OperationView;
use crate::store::{self, NewAssetRow, NewOperationRow, OperationRow};
use crate::tenancy::{Caller, template};
use crate::workflows::asset_create::AssetCreate;
use crate::workflows::contract::{AssetCreateInput, TokenAction, TokenOpInput};
use crate::workflows::token_op::{AssetMint, AssetPause, AssetTransfer, AssetUnpause};
use alloy::primitives::Address;
use keel_durable::{StartOptions, Workflow};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// A request to create an asset (`POST /v1/assets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAsset {
    /// ERC-20 name, 1..=64 characters.
    pub name: String,
    /// ERC-20 symbol, 1..=16 characters of `[A-Za-z0-9]`.
    pub symbol: String,
    /// ERC-20 decimals, 0..=36.
    pub decimals: u8,
    /// The organization's asset template.
    pub template_id: String,
    /// Initial price, decimal string in quote units (at most the template's
    /// `price_decimals` fractional digits).
    pub initial_price: String,
}

/// A token operation request (`POST /v1/assets/{id}/mint|transfer|pause|unpause`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRequest {
    /// Mint `amount` (decimal string in token units) to `recipient`.
    Mint {
        /// Receiver (not the zero address).
        recipient: Address,
        /// Token units, decimal string, at most the token's decimals.
        amount: String,
    },
    /// Transfer `amount` from the issuer's (operator's) holdings to `recipient`.
    Transfer {
        /// Receiver (not the zero address).
        recipient: Address,
        /// Token units, decimal string, at most the token's decimals.
        amount: String,
    },
    /// Pause all balance changes.
    Pause,
    /// Unpause balance changes.
    Unpause,
}

impl TokenRequest {
    /// The operation kind (`asset.mint`, ...), also the workflow's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Mint { .. } => AssetMint::NAME,
            Self::Transfer { .. } => AssetTransfer::NAME,
            Self::Pause => AssetPause::NAME,
            Self::Unpause => AssetUnpause::NAME,
        }
    }
}

/// An accepted operation: its id and current view.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// False when the idempotency key named an existing operation.
    pub created: bool,
    /// The operation's current status.
    pub operation: OperationView,
}

/// The request hash: SHA-256 of the canonical JSON of the request.
fn sha256_json(v: &Value) -> Vec<u8> {
    Sha256::digest(v.to_string().as_bytes()).to_vec()
}

/// An `Idempotency-Key` is 1 to 255 printable characters.
fn check_key(key: &str) -> Result<()> {
    let len = key.chars().count();
    if len == 0 || len > 255 || key.chars().any(char::is_control) {
        return Err(OpsError::InvalidField {
            field: "Idempotency-Key",
            reason: "must be 1 to 255 printable characters",
        });
    }
    Ok(())
}

impl Ops {
    /// Accepts `POST /v1/assets`: validates against the template, records the asset
    /// and the operation (idempotently by `key`), and starts `asset.create`.
    ///
    /// # Errors
    /// [`OpsError::InvalidField`] / [`OpsError::Amount`] for bad fields;
    /// [`OpsError::NotFound`] (`template`); [`OpsError::IdempotencyConflict`];
    /// [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn create_asset(
        &self,
        caller: Caller,
        key: &str,
        req: &NewAsset,
    ) -> Result<Accepted> {
        check_key(key)?;
        let name_len = req.name.chars().count();
        if name_len == 0 || name_len > 64 || req.name.chars().any(char::is_control) {
            return Err(OpsError::InvalidField {
                field: "name",
                reason: "must be 1 to 64 printable characters",
            });
        }
        if req.symbol.is_empty()
            || req.symbol.len() > 16
            || !req.symbol.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(OpsError::InvalidField {
                field: "symbol",
                reason: "must be 1 to 16 ASCII letters or digits",
            });
        }
        decimals(req.decimals, "decimals")?;
        let request_hash = sha256_json(&json!({
            "kind": AssetCreate::NAME,
            "name": req.name, "symbol": req.symbol, "decimals": req.decimals,
            "templateId": req.template_id, "initialPrice": req.initial_price,
        }));
        let t = template(&self.db, caller.organization_id, &req.template_id).await?;
        let answer = price_answer(&req.initial_price, t.price_decimals)?;
        let chain_id = i64::try_from(t.chain_id).map_err(|_| OpsError::ChainNotConfigured)?;
        let (operation_id, asset_id, created) = loop {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
            {
                match self.existing(caller, &op, &request_hash).await? {
                    Some(accepted) => return Ok(accepted),
                    None => break (op.id, op.asset_id, false),
                }
            }
            let operation_id = Uuid::new_v4();
            let asset_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            store::asset_insert(
                &mut *tx,
                &NewAssetRow {
                    id: asset_id,
                    organization_id: caller.organization_id,
                    template_id: &t.id,
                    chain_id,
                    name: &req.name,
                    symbol: &req.symbol,
                    decimals: i16::from(req.decimals),
                    initial_price: &req.initial_price,
                },
            )
            .await?;
            let inserted = store::operation_insert(
                &mut *tx,
                &NewOperationRow {
                    id: operation_id,
                    organization_id: caller.organization_id,
                    kind: AssetCreate::NAME,
                    asset_id,
                    idempotency_key: key,
                    request_sha256: &request_hash,
                    api_key_id: caller.api_key_id,
                },
            )
            .await?;
            if inserted {
                self.emit_accepted(&mut tx, caller.organization_id, operation_id)
                    .await?;
                tx.commit().await?;
                break (operation_id, asset_id, true);
            }
            // A concurrent request with the same key won; answer as its repeat.
            tx.rollback().await?;
        };
        let input = AssetCreateInput {
            operation_id,
            asset_id,
            chain_id: t.chain_id,
            name: req.name.clone(),
            symbol: req.symbol.clone(),
            decimals: req.decimals,
            price_decimals: t.price_decimals,
            price_answer: answer.to_string(),
            staleness_bound_seconds: t.staleness_bound_seconds,
            funding_deadline_seconds: t.funding_pause.then_some(t.funding_deadline_seconds),
        };
        self.start::<AssetCreate>(operation_id, &input, None)
            .await?;
        Ok(Accepted {
            created,
            operation: self.operation(caller, operation_id).await?,
        })
    }

    /// Accepts a token operation on `asset_id` (mint, transfer, pause, unpause): the
    /// asset must be `active`; amounts are typed with its decimals; a mint above the
    /// template's threshold waits for an approval. Operations of one asset run one at
    /// a time, in acceptance order.
    ///
    /// # Errors
    /// [`OpsError::NotFound`] (`asset`, also for other organizations' assets);
    /// [`OpsError::AssetNotReady`]; [`OpsError::InvalidField`] / [`OpsError::Amount`];
    /// [`OpsError::IdempotencyConflict`]; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn token_operation(
        &self,
        caller: Caller,
        key: &str,
        asset_id: Uuid,
        req: &TokenRequest,
    ) -> Result<Accepted> {
        check_key(key)?;
        let asset = self.asset_record(caller, asset_id).await?;
        let (action, amount) = match req {
            TokenRequest::Mint { recipient, amount }
            | TokenRequest::Transfer { recipient, amount } => {
                if recipient.is_zero() {
                    return Err(OpsError::InvalidField {
                        field: "recipient",
                        reason: "must not be the zero address",
                    });
                }
                let v = token_amount(amount, asset.decimals, "amount")?;
                let action = if matches!(req, TokenRequest::Mint { .. }) {
                    TokenAction::Mint {
                        recipient: *recipient,
                        amount: v,
                    }
                } else {
                    TokenAction::Transfer {
                        recipient: *recipient,
                        amount: v,
                    }
                };
                (action, Some(v))
            }
            TokenRequest::Pause => (TokenAction::Pause, None),
            TokenRequest::Unpause => (TokenAction::Unpause, None),
        };
        let kind = req.kind();
        let request_hash = sha256_json(&json!({
            "kind": kind, "asset": asset_id, "action": action,
        }));
        let (Some(token), AssetStatus::Active) = (asset.token, asset.status()) else {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
                && let Some(accepted) = self.existing(caller, &op, &request_hash).await?
            {
                return Ok(accepted);
            }
            return Err(OpsError::AssetNotReady);
        };
        let t = template(&self.db, caller.organization_id, &asset.template_id).await?;
        let needs_approval = match (&action, amount, &t.mint_approval_threshold) {
            (TokenAction::Mint { .. }, Some(v), Some(th)) => {
                above_threshold(v, th, asset.decimals)?
            }
            _ => false,
        };
        let (operation_id, created) = loop {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
            {
                match self.existing(caller, &op, &request_hash).await? {
                    Some(accepted) => return Ok(accepted),
                    None => break (op.id, false),
                }
            }
            let operation_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            let inserted = store::operation_insert(
                &mut *tx,
                &NewOperationRow {
                    id: operation_id,
                    organization_id: caller.organization_id,
                    kind,
                    asset_id,
                    idempotency_key: key,
                    request_sha256: &request_hash,
                    api_key_id: caller.api_key_id,
                },
            )
            .await?;
            if inserted {
                self.emit_accepted(&mut tx, caller.organization_id, operation_id)
                    .await?;
                tx.commit().await?;
                break (operation_id, true);
            }
            tx.rollback().await?;
        };
        let input = TokenOpInput {
            operation_id,
            asset_id,
            chain_id: asset.chain_id.get(),
            token,
            action,
            approval_ttl_seconds: needs_approval.then_some(t.approval_ttl_seconds),
            funding_deadline_seconds: t.funding_pause.then_some(t.funding_deadline_seconds),
        };
        let serialization = Some(format!("asset:{asset_id}"));
        let _instance = match req {
            TokenRequest::Mint { .. } => {
                self.start::<AssetMint>(operation_id, &input, serialization)
                    .await?
            }
            TokenRequest::Transfer { .. } => {
                self.start::<AssetTransfer>(operation_id, &input, serialization)
                    .await?
            }
            TokenRequest::Pause => {
                self.start::<AssetPause>(operation_id, &input, serialization)
                    .await?
            }
            TokenRequest::Unpause => {
                self.start::<AssetUnpause>(operation_id, &input, serialization)
                    .await?
            }
        };
        Ok(Accepted {
            created,
            operation: self.operation(caller, operation_id).await?,
        })
    }

    /// Starts (idempotently: the operation id is the engine's idempotency key) the
    /// workflow `W` of `operation_id` and records its instance on the operation.
    async fn start<W: Workflow>(
        &self,
        operation_id: Uuid,
        input: &W::Input,
        serialization_key: Option<String>,
    ) -> Result<Uuid> {
        let started = self
            .engine
            .start::<W>(
                &operation_id.to_string(),
                input,
                StartOptions { serialization_key },
            )
            .await?;
        store::operation_instance_set(&self.db, operation_id, started.instance_id).await?;
        Ok(started.instance_id)
    }

    /// The operation a repeated key names: a different request is a conflict; the
    /// same request returns `Some(view)` when its workflow was started, or `None` when a
    /// crash left it unstarted (the caller then starts it under the existing ids).
    async fn existing(
        &self,
        caller: Caller,
        op: &OperationRow,
        request_sha256: &[u8],
    ) -> Result<Option<Accepted>> {
        if op.request_sha256 != request_sha256 {
            return Err(OpsError::IdempotencyConflict);
        }
        if op.instance_id.is_none() {
            return Ok(None);
        }
        Ok(Some(Accepted {
            created: false,
            operation: self.operation(caller, op.id).await?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::WORKFLOWS;

    /// Every operation the API accepts starts a workflow the runner registers.
    #[test]
    fn every_accepted_kind_is_a_registered_workflow() {
        let kinds = [
            AssetCreate::NAME,
            TokenRequest::Mint {
                recipient: Address::ZERO,
                amount: String::new(),
            }
            .kind(),
            TokenRequest::Transfer {
                recipient: Address::ZERO,
                amount: String::new(),
            }
            .kind(),
            TokenRequest::Pause.kind(),
            TokenRequest::Unpause.kind(),
        ];
        for kind in kinds {
            assert!(WORKFLOWS.contains(&kind), "{kind}");
        }
        assert_eq!(kinds.len(), WORKFLOWS.len());
    }
}
