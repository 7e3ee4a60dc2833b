//! Accepting operations: `POST /v1/assets` ([`Ops::create_asset`]) and the token
//! operations ([`Ops::token_operation`]), idempotently by (organization,
//! `Idempotency-Key`) and the request's hash (see [`crate::ops`]).

use crate::error::{OpsError, Result};
use crate::kinds::OperationKind;
use crate::ops::Ops;
use crate::ops::amount::{above_threshold, decimals, price_answer, token_amount};
use crate::ops::read::AssetStatus;
use crate::ops::view::OperationView;
use crate::store::{self, NewAssetRow, NewOperationRow, OperationRow};
use crate::tenancy::{Caller, template};
use crate::workflows::asset_create::AssetCreate;
use crate::workflows::contract::{
    AssetCreateInput, ComplianceRules, TokenAction, TokenOpInput, TokenRole,
};
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

/// A token operation request (`POST /v1/assets/{id}/mint|transfer|pause|unpause|burn|`
/// `grant-role|revoke-role`).
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
    /// Burn `amount`: without `from`, from the issuer's (operator's) own holdings
    /// (`AssetToken.burn`); with `from`, a forced burn (redemption) of that holder's
    /// tokens (`AssetToken.forcedBurn`), which needs the operator to hold the token's
    /// `burner` role (else the operation fails `EXECUTION_REVERTED`, reason
    /// `AccessControlUnauthorizedAccount`).
    Burn {
        /// The holder of a forced burn (not the zero address); `None`: the issuer.
        from: Option<Address>,
        /// Token units, decimal string, at most the token's decimals.
        amount: String,
    },
    /// Grant `role` on the token to `account` (a no-op on chain when it holds it).
    GrantRole {
        /// The role.
        role: TokenRole,
        /// Who receives it (not the zero address).
        account: Address,
    },
    /// Revoke `role` on the token from `account` (a no-op on chain when it lacks it).
    RevokeRole {
        /// The role.
        role: TokenRole,
        /// Who loses it (not the zero address).
        account: Address,
    },
    /// Replace the asset's rules in its organization system's compliance contract
    /// (only an asset created through a system: else `ASSET_NOT_REGULATED`).
    SetCompliance {
        /// Recipients must be eligible in the system's registry.
        eligible_only: bool,
        /// `any`, `allow` (only `countries`) or `deny` (all but `countries`).
        country_mode: String,
        /// ISO 3166-1 numeric country codes (1..=999), at most 300.
        countries: Vec<u16>,
        /// Maximum number of holders (0: none).
        max_holders: u32,
        /// Maximum balance per holder in token units (decimal string); `None`: none.
        max_balance: Option<String>,
        /// Unix time (seconds) before which holder-to-holder transfers are refused (0: none).
        lockup_until: u64,
    },
    /// Freeze `account` entirely (`amount: None`: it can neither send nor receive) or
    /// freeze `amount` more of its balance (a regulated asset only).
    Freeze {
        /// The address (not the zero address).
        account: Address,
        /// Token units, decimal string; `None`: the whole address.
        amount: Option<String>,
    },
    /// Unfreeze `account` (`amount: None`) or release `amount` of its frozen balance.
    Unfreeze {
        /// The address (not the zero address).
        account: Address,
        /// Token units, decimal string; `None`: the whole address.
        amount: Option<String>,
    },
    /// Move `amount` of `from`'s tokens to `recipient` without `from`'s consent (an
    /// agent's forced transfer; frozen tokens are released as needed).
    ForcedTransfer {
        /// The holder (not the zero address).
        from: Address,
        /// The receiver (not the zero address, not `from`).
        recipient: Address,
        /// Token units, decimal string.
        amount: String,
    },
    /// Move a lost wallet's whole balance, frozen state and registry entry to a new one.
    Recover {
        /// The lost wallet (not the zero address).
        lost: Address,
        /// The new wallet (not the zero address, not `lost`).
        replacement: Address,
    },
    /// Mint to every recipient in one transaction.
    BatchMint {
        /// 1 to the template's `batchMaxRecipients` lines.
        recipients: Vec<BatchRecipient>,
    },
    /// Transfer from the issuer's holdings to every recipient in one transaction.
    BatchTransfer {
        /// 1 to the template's `batchMaxRecipients` lines.
        recipients: Vec<BatchRecipient>,
    },
}

/// One line of a batch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRecipient {
    /// The receiver (not the zero address).
    pub to: Address,
    /// Token units, decimal string, at most the token's decimals.
    pub amount: String,
}

impl std::str::FromStr for TokenRole {
    type Err = OpsError;

    /// A role by its API name (`minter`, `pauser`, `burner`; exact, lowercase).
    ///
    /// # Errors
    /// [`OpsError::UnknownRole`] for any other name (`DEFAULT_ADMIN_ROLE` included).
    fn from_str(name: &str) -> Result<Self> {
        TokenRole::from_name(name).ok_or(OpsError::UnknownRole)
    }
}

impl TokenRequest {
    /// The operation kind (`asset.mint`, ...), whose name is also the workflow's.
    pub fn kind(&self) -> OperationKind {
        match self {
            Self::Mint { .. } => OperationKind::AssetMint,
            Self::Transfer { .. } => OperationKind::AssetTransfer,
            Self::Pause => OperationKind::AssetPause,
            Self::Unpause => OperationKind::AssetUnpause,
            Self::Burn { .. } => OperationKind::AssetBurn,
            Self::GrantRole { .. } => OperationKind::AssetGrantRole,
            Self::RevokeRole { .. } => OperationKind::AssetRevokeRole,
            Self::SetCompliance { .. } => OperationKind::AssetSetCompliance,
            Self::Freeze { .. } => OperationKind::AssetFreeze,
            Self::Unfreeze { .. } => OperationKind::AssetUnfreeze,
            Self::ForcedTransfer { .. } => OperationKind::AssetForcedTransfer,
            Self::Recover { .. } => OperationKind::AssetRecover,
            Self::BatchMint { .. } => OperationKind::AssetBatchMint,
            Self::BatchTransfer { .. } => OperationKind::AssetBatchTransfer,
        }
    }
}

/// Whether `action` waits for an approval under a template's mint approval `threshold`
/// (token units, decimal string; `None`: nothing does) for a token with
/// `token_decimals`: a mint or burn (forced or not) above it, and every role change when
/// a threshold is set (a `minter` or `burner` grant enables mints or burns of any
/// amount). Transfers, pauses and unpauses never do.
///
/// The agent operations of regulated assets (issue 37 §3): a forced transfer above the
/// threshold, a batch mint whose total is above it; when a threshold is set, every
/// unfreeze (address or partial: it releases tokens) and every wallet recovery (it moves
/// a whole balance and an identity). A freeze never waits (it is the protective
/// action an agent takes in a hurry), nor does a batch transfer (as a transfer).
///
/// # Errors
/// [`OpsError::Amount`] when the threshold cannot be read with these decimals.
pub fn needs_approval(
    action: &TokenAction,
    threshold: Option<&str>,
    token_decimals: u8,
) -> Result<bool> {
    let Some(th) = threshold else {
        return Ok(false);
    };
    match action {
        TokenAction::Mint { amount, .. }
        | TokenAction::Burn { amount }
        | TokenAction::ForcedBurn { amount, .. } => above_threshold(*amount, th, token_decimals),
        TokenAction::ForcedTransfer { amount, .. } => above_threshold(*amount, th, token_decimals),
        TokenAction::BatchMint { recipients } => {
            let total = recipients
                .iter()
                .try_fold(alloy::primitives::U256::ZERO, |t, l| {
                    t.checked_add(l.amount)
                })
                .unwrap_or(alloy::primitives::U256::MAX);
            above_threshold(total, th, token_decimals)
        }
        TokenAction::GrantRole { .. }
        | TokenAction::RevokeRole { .. }
        | TokenAction::SetCompliance { .. }
        | TokenAction::SetAddressFrozen { frozen: false, .. }
        | TokenAction::UnfreezePartial { .. }
        | TokenAction::Recover { .. } => Ok(true),
        TokenAction::Transfer { .. }
        | TokenAction::Pause
        | TokenAction::Unpause
        | TokenAction::SetAddressFrozen { frozen: true, .. }
        | TokenAction::FreezePartial { .. }
        | TokenAction::BatchTransfer { .. } => Ok(false),
    }
}

/// The typed lines of a batch: 1 or more (the template's limit is checked by the
/// caller), no zero address, amounts typed with the token's `decimals`.
fn batch_lines(
    recipients: &[BatchRecipient],
    decimals: u8,
) -> Result<Vec<crate::workflows::BatchLine>> {
    if recipients.is_empty() {
        return Err(OpsError::InvalidField {
            field: "recipients",
            reason: "must name at least one recipient",
        });
    }
    recipients
        .iter()
        .map(|r| {
            Ok(crate::workflows::BatchLine {
                to: not_zero(r.to, "recipients[].to")?,
                amount: token_amount(&r.amount, decimals, "recipients[].amount")?,
            })
        })
        .collect()
}

/// Refuses the zero address as `field`.
fn not_zero(a: Address, field: &'static str) -> Result<Address> {
    if a.is_zero() {
        return Err(OpsError::InvalidField {
            field,
            reason: "must not be the zero address",
        });
    }
    Ok(a)
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
pub(crate) fn check_key(key: &str) -> Result<()> {
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
        // The organization's system on the chain deploys the token (issue 37 §1), unless
        // an operator switched it off; without one, the platform's factory does.
        let system = store::org_system_current(&self.db, caller.organization_id, chain_id).await?;
        let (system_id, system_factory) = match system {
            Some(s) if !s.enabled => return Err(OpsError::SystemDisabled),
            Some(s) => (
                Some(s.id),
                s.factory.as_deref().and_then(|f| Address::try_from(f).ok()),
            ),
            None => (None, None),
        };
        let (operation_id, asset_id, system_factory, created) = loop {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
            {
                match self.existing(caller, &op, &request_hash).await? {
                    Some(accepted) => return Ok(accepted),
                    None => {
                        let asset_id = op.asset_id.ok_or(OpsError::IdempotencyConflict)?;
                        // A repeat starts the creation with the system recorded at
                        // acceptance.
                        let factory = store::asset_system_factory(&self.db, asset_id).await?;
                        break (op.id, asset_id, factory, false);
                    }
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
                    system_id,
                },
            )
            .await?;
            let inserted = store::operation_insert(
                &mut *tx,
                &NewOperationRow {
                    id: operation_id,
                    organization_id: caller.organization_id,
                    kind: OperationKind::AssetCreate,
                    asset_id: Some(asset_id),
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
                break (operation_id, asset_id, system_factory, true);
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
            sender: t.sender.as_ref().map(|s| s.address),
            system_factory,
        };
        self.start::<AssetCreate>(operation_id, &input, None, caller)
            .await?;
        Ok(Accepted {
            created,
            operation: self.operation(caller, operation_id).await?,
        })
    }

    /// Accepts a token operation on `asset_id` (mint, transfer, pause, unpause, burn,
    /// grant-role, revoke-role, set-compliance and the agent operations of a regulated
    /// asset, [`needs_approval`]): the asset must be `active`; amounts are typed with its
    /// decimals. When the template sets a mint approval threshold, a mint or burn (of
    /// the issuer's holdings or a forced one) above it, and every role change, waits for
    /// an approval: a `minter` or `burner` grant enables mints or burns of any amount,
    /// so role changes are held to at least the strictest rule of the template.
    /// Operations of one asset run one at a time, in acceptance order.
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
        let t = template(&self.db, caller.organization_id, &asset.template_id).await?;
        let amount = |s: &str| token_amount(s, asset.decimals, "amount");
        let action = match req {
            TokenRequest::Mint {
                recipient,
                amount: a,
            } => TokenAction::Mint {
                recipient: not_zero(*recipient, "recipient")?,
                amount: amount(a)?,
            },
            TokenRequest::Transfer {
                recipient,
                amount: a,
            } => TokenAction::Transfer {
                recipient: not_zero(*recipient, "recipient")?,
                amount: amount(a)?,
            },
            TokenRequest::Pause => TokenAction::Pause,
            TokenRequest::Unpause => TokenAction::Unpause,
            TokenRequest::Burn {
                from: None,
                amount: a,
            } => TokenAction::Burn { amount: amount(a)? },
            TokenRequest::Burn {
                from: Some(from),
                amount: a,
            } => TokenAction::ForcedBurn {
                from: not_zero(*from, "from")?,
                amount: amount(a)?,
            },
            TokenRequest::GrantRole { role, account } => TokenAction::GrantRole {
                role: *role,
                account: not_zero(*account, "account")?,
            },
            TokenRequest::RevokeRole { role, account } => TokenAction::RevokeRole {
                role: *role,
                account: not_zero(*account, "account")?,
            },
            TokenRequest::SetCompliance {
                eligible_only,
                country_mode,
                countries,
                max_holders,
                max_balance,
                lockup_until,
            } => TokenAction::SetCompliance {
                rules: ComplianceRules {
                    eligible_only: *eligible_only,
                    country_mode: match country_mode.as_str() {
                        "any" => 0,
                        "allow" => 1,
                        "deny" => 2,
                        _ => {
                            return Err(OpsError::InvalidField {
                                field: "countryMode",
                                reason: "must be any, allow or deny",
                            });
                        }
                    },
                    countries: {
                        if countries.len() > 300 || countries.iter().any(|c| !(1..=999).contains(c))
                        {
                            return Err(OpsError::InvalidField {
                                field: "countries",
                                reason: "at most 300 ISO 3166-1 numeric codes, each 1 to 999",
                            });
                        }
                        countries.clone()
                    },
                    max_holders: *max_holders,
                    max_balance: match max_balance {
                        Some(m) => token_amount(m, asset.decimals, "maxBalance")?,
                        None => alloy::primitives::U256::ZERO,
                    },
                    lockup_until: *lockup_until,
                },
            },
            TokenRequest::Freeze {
                account,
                amount: None,
            } => TokenAction::SetAddressFrozen {
                account: not_zero(*account, "account")?,
                frozen: true,
            },
            TokenRequest::Freeze {
                account,
                amount: Some(a),
            } => TokenAction::FreezePartial {
                account: not_zero(*account, "account")?,
                amount: amount(a)?,
            },
            TokenRequest::Unfreeze {
                account,
                amount: None,
            } => TokenAction::SetAddressFrozen {
                account: not_zero(*account, "account")?,
                frozen: false,
            },
            TokenRequest::Unfreeze {
                account,
                amount: Some(a),
            } => TokenAction::UnfreezePartial {
                account: not_zero(*account, "account")?,
                amount: amount(a)?,
            },
            TokenRequest::ForcedTransfer {
                from,
                recipient,
                amount: a,
            } => {
                let from = not_zero(*from, "from")?;
                let recipient = not_zero(*recipient, "recipient")?;
                if from == recipient {
                    return Err(OpsError::InvalidField {
                        field: "recipient",
                        reason: "must differ from `from`",
                    });
                }
                TokenAction::ForcedTransfer {
                    from,
                    recipient,
                    amount: amount(a)?,
                    // The template's rule (the request does not choose).
                    enforce_compliance: !t.forced_transfer_skips_compliance,
                }
            }
            TokenRequest::Recover { lost, replacement } => {
                let lost = not_zero(*lost, "lostWallet")?;
                let replacement = not_zero(*replacement, "newWallet")?;
                if lost == replacement {
                    return Err(OpsError::InvalidField {
                        field: "newWallet",
                        reason: "must differ from `lostWallet`",
                    });
                }
                TokenAction::Recover { lost, replacement }
            }
            TokenRequest::BatchMint { recipients } => TokenAction::BatchMint {
                recipients: batch_lines(recipients, asset.decimals)?,
            },
            TokenRequest::BatchTransfer { recipients } => TokenAction::BatchTransfer {
                recipients: batch_lines(recipients, asset.decimals)?,
            },
        };
        if let TokenAction::BatchMint { recipients } | TokenAction::BatchTransfer { recipients } =
            &action
            && recipients.len() > usize::from(t.batch_max_recipients)
        {
            return Err(OpsError::BatchTooLarge {
                max: t.batch_max_recipients,
            });
        }
        let kind = req.kind();
        let request_hash = sha256_json(&json!({
            "kind": kind.name(), "asset": asset_id, "action": action,
        }));
        let (Some(token), AssetStatus::Active) = (asset.token, asset.status()) else {
            if let Some(op) = store::operation_by_key(&self.db, caller.organization_id, key).await?
                && let Some(accepted) = self.existing(caller, &op, &request_hash).await?
            {
                return Ok(accepted);
            }
            return Err(OpsError::AssetNotReady);
        };
        // The organization system's compliance contract (issue 37 §2): the target of a
        // rules change, and the judge of a mint or transfer before it is accepted.
        let system = store::asset_system_contracts(&self.db, asset_id).await?;
        if system.is_none() && action.needs_system() {
            return Err(OpsError::AssetNotRegulated);
        }
        let compliance = system.map(|s| s.compliance);
        let target = match (&action, compliance) {
            (TokenAction::SetCompliance { .. }, c) => c,
            (
                TokenAction::ForcedTransfer {
                    from,
                    recipient,
                    amount,
                    enforce_compliance: true,
                },
                Some(c),
            ) => {
                self.compliance_precheck(asset.chain_id, c, token, *from, *recipient, *amount)
                    .await?;
                None
            }
            (TokenAction::BatchMint { recipients }, Some(c)) => {
                for l in recipients {
                    self.compliance_precheck(
                        asset.chain_id,
                        c,
                        token,
                        Address::ZERO,
                        l.to,
                        l.amount,
                    )
                    .await?;
                }
                None
            }
            (TokenAction::BatchTransfer { recipients }, Some(c)) => {
                if let Some(from) = asset.issuer {
                    for l in recipients {
                        self.compliance_precheck(asset.chain_id, c, token, from, l.to, l.amount)
                            .await?;
                    }
                }
                None
            }
            (TokenAction::Mint { recipient, amount }, Some(c)) => {
                self.compliance_precheck(
                    asset.chain_id,
                    c,
                    token,
                    Address::ZERO,
                    *recipient,
                    *amount,
                )
                .await?;
                None
            }
            (TokenAction::Transfer { recipient, amount }, Some(c)) => {
                if let Some(from) = asset.issuer {
                    self.compliance_precheck(asset.chain_id, c, token, from, *recipient, *amount)
                        .await?;
                }
                None
            }
            _ => None,
        };
        let needs_approval = needs_approval(
            &action,
            t.mint_approval_threshold.as_deref(),
            asset.decimals,
        )?;
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
                    asset_id: Some(asset_id),
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
        // Only a recovery writes the registry (its entry moves to the new wallet).
        let registry = system
            .filter(|_| matches!(action, TokenAction::Recover { .. }))
            .map(|s| s.registry);
        let input = TokenOpInput {
            operation_id,
            asset_id,
            chain_id: asset.chain_id.get(),
            token,
            action,
            approval_ttl_seconds: needs_approval.then_some(t.approval_ttl_seconds),
            funding_deadline_seconds: t.funding_pause.then_some(t.funding_deadline_seconds),
            // A custody template's assets are sent by their issuer (the vault that
            // created them); the others by the pool sender that created them when the
            // runner holds its key, else by the operator key.
            sender: t.sender.as_ref().and(asset.issuer),
            issuer: if t.sender.is_some() {
                None
            } else {
                asset.issuer
            },
            target,
            registry,
        };
        let serialization = Some(format!("asset:{asset_id}"));
        self.start_token_op(kind, operation_id, &input, serialization, caller)
            .await?;
        Ok(Accepted {
            created,
            operation: self.operation(caller, operation_id).await?,
        })
    }

    /// Starts (idempotently: the operation id is the engine's idempotency key) the
    /// workflow `W` of `operation_id` and records its instance on the operation.
    pub(crate) async fn start<W: Workflow>(
        &self,
        operation_id: Uuid,
        input: &W::Input,
        serialization_key: Option<String>,
        caller: Caller,
    ) -> Result<Uuid> {
        let actor = self.actor(caller).await?;
        let started = self
            .engine
            .start::<W>(
                &operation_id.to_string(),
                input,
                StartOptions {
                    serialization_key,
                    actor,
                },
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
#[path = "accept_tests.rs"]
mod tests;
