//! The operations service the Platform API calls: accept an operation idempotently,
//! start its workflow, project its status (state, wait, milestones, result, error),
//! decide approvals, and read assets and balances from the Ledger Index.
//!
//! ## Idempotency
//! Operations are unique by (organization, `Idempotency-Key`). The request is hashed
//! (kind, asset and the normalized body: amounts in base units, addresses checksummed
//! away), so the same key with the same request returns the same operation — in
//! whatever state it is, a failure included — and the same key with another request
//! is [`OpsError::IdempotencyConflict`]. The workflow instance is started with the
//! operation id as its idempotency key after the operation row commits; a repeated
//! request re-issues that start, so a crash between the two loses nothing.

use crate::error::{OpsError, Result};
use crate::tenancy::{Caller, template};
use crate::workflows::{
    APPROVAL_SIGNAL, ApprovalDecision, AssetCreate, AssetCreateInput, AssetMint, AssetPause,
    AssetTransfer, AssetUnpause, OpFailure, TX_SIGNAL_PREFIX, TokenAction, TokenOpInput,
};
use alloy::primitives::{Address, B256, U256};
use chrono::{DateTime, Utc};
use keel_durable::{Engine, InstanceStatus, RunStatus, SignalReceipt, StartOptions, Workflow};
use keel_units::{ChainId, Decimals, Rounding, parse_units};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Longest `Prefer: wait` / `minBlock` wait the service honours.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

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
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    /// False when the idempotency key named an existing operation.
    pub created: bool,
    /// The operation's current status.
    pub operation: OperationView,
}

/// The status of an operation (`GET /v1/operations/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationView {
    /// Operation id.
    pub id: Uuid,
    /// `asset.create`, `asset.mint`, `asset.transfer`, `asset.pause`, `asset.unpause`.
    pub kind: String,
    /// The asset.
    pub asset_id: Uuid,
    /// `queued` (accepted, waiting behind another operation of its asset: see
    /// `queued_behind`), `running`, `waiting`, `suspended`, `completed`, `failed` or
    /// `cancelled`.
    pub state: &'static str,
    /// For a `queued` operation: the operation of the same asset it waits behind.
    pub queued_behind: Option<Uuid>,
    /// What a `waiting` operation waits for.
    pub wait: Option<WaitView>,
    /// When a cancel was requested (`POST /v1/operations/{id}/cancel`), if one was. A
    /// cancel cannot unsend a transaction that was already signed: such an operation
    /// runs to that transaction's verdict (and may still complete); `milestones.confirmed`
    /// always lists what landed.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// The four milestones.
    pub milestones: Milestones,
    /// The workflow's last progress snapshot.
    pub progress: Option<Value>,
    /// The result of a completed operation.
    pub result: Option<Value>,
    /// The failure of a failed operation (or the transient reason while suspended).
    pub error: Option<ErrorView>,
}

impl OperationView {
    /// Whether the operation has ended (`completed`, `failed`, `cancelled`); `queued`,
    /// `running`, `waiting` and `suspended` have not.
    pub fn is_terminal(&self) -> bool {
        matches!(self.state, "completed" | "failed" | "cancelled")
    }
}

/// What a waiting operation waits for.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitView {
    /// `approval`, `transaction`, `funding` or `timer`.
    #[serde(rename = "for")]
    pub waits_for: &'static str,
    /// The deadline, when there is one: the approval deadline, the funding deadline (after
    /// it the transaction fails `FUNDING_DEADLINE_EXPIRED`), or the timer's fire time.
    pub until: Option<DateTime<Utc>>,
    /// The step whose transaction it waits for.
    pub step: Option<String>,
    /// For a transaction wait: the error class of the last broadcast of that
    /// transaction that no node accepted (`internal`, `unavailable`, `rate_limited`,
    /// `nonce_too_high`, ...), while the transaction is unsettled; null when every
    /// broadcast went through so far.
    pub last_broadcast_error: Option<String>,
}

/// Accepted → submitted → confirmed → indexed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Milestones {
    /// When the operation was accepted.
    pub accepted: DateTime<Utc>,
    /// Every transaction signed (and, when `broadcast`, submitted), by step.
    pub submitted: Vec<TxMilestone>,
    /// Every transaction confirmed, by step.
    pub confirmed: Vec<TxMilestone>,
    /// The index block that reflects the operation, once read-after-write passed.
    pub indexed: Option<IndexedMilestone>,
}

/// A transaction of an operation step.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TxMilestone {
    /// The workflow step (`create-feed`, `deploy-token`, `mint`, ...).
    pub step: String,
    /// The transaction hash (latest attempt; the mined one once confirmed).
    pub tx_hash: Option<B256>,
    /// The nonce.
    pub nonce: Option<u64>,
    /// Whether a node accepted it.
    pub broadcast: bool,
    /// The block, once confirmed.
    pub block: Option<u64>,
}

/// The indexed milestone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexedMilestone {
    /// The index block.
    pub block: u64,
}

/// A failure as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorView {
    /// Stable code (`EXECUTION_REVERTED`, `APPROVAL_EXPIRED`, `GAS_REQUIRED`, ...).
    pub code: String,
    /// Whether a retry can help.
    pub retryable: bool,
    /// Value-free description.
    pub detail: String,
    /// The decoded revert reason, when a transaction reverted.
    pub reason: Option<String>,
}

/// An asset as the API shows it (identity from Keel's records, state from the index).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetView {
    /// Asset id.
    pub id: Uuid,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// Template id.
    pub template_id: String,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// `creating`, `active` or `failed` (from its creation operation).
    pub status: &'static str,
    /// The `asset.create` operation.
    pub create_operation_id: Option<Uuid>,
    /// Token contract, once deployed.
    pub token_address: Option<Address>,
    /// Price feed contract, once deployed.
    pub feed_address: Option<Address>,
    /// Total supply in token units (decimal string), from the index.
    pub supply: Option<String>,
    /// Paused state, from the index.
    pub paused: Option<bool>,
    /// The feed's staleness bound, seconds, from the index.
    pub staleness_bound_seconds: Option<String>,
    /// The latest observation, from the index.
    pub latest_observation: Option<ObservationView>,
    /// The index block this view reflects.
    pub indexed_block: Option<u64>,
    /// True when the Ledger Index of the asset's chain is **degraded**: the chain
    /// reorganized below its finalized block, tip ingest stopped, and the index state
    /// above (supply, paused, observation) may reflect orphaned blocks until an operator
    /// re-indexes the chain.
    pub index_degraded: bool,
}

/// A price observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservationView {
    /// Answer in the feed's decimals (signed integer string).
    pub answer: String,
    /// Round id.
    pub round_id: String,
    /// Round timestamp, unix seconds.
    pub updated_at: String,
    /// Block of the observation.
    pub block: u64,
}

/// A holder's balance of an asset, from the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BalanceView {
    /// The asset.
    pub asset_id: Uuid,
    /// The holder.
    pub address: Address,
    /// Token units (decimal string, the token's decimals).
    pub balance: String,
    /// Base units (decimal integer string).
    pub balance_base_units: String,
    /// The index block this balance reflects.
    pub indexed_block: u64,
    /// True when the Ledger Index of the asset's chain is degraded (see
    /// [`AssetView::index_degraded`]): the balance may reflect orphaned blocks.
    pub index_degraded: bool,
}

/// The operations service (no chain access: everything goes through the database and
/// the durable engine; the runner does the work).
#[derive(Debug, Clone)]
pub struct Ops {
    db: PgPool,
    engine: Engine,
}

fn sha256_json(v: &Value) -> Vec<u8> {
    Sha256::digest(v.to_string().as_bytes()).to_vec()
}

fn decimals(d: u8, field: &'static str) -> Result<Decimals> {
    Decimals::new(d).map_err(|source| OpsError::Amount { field, source })
}

fn parse_amount(s: &str, d: u8, field: &'static str) -> Result<U256> {
    let v = parse_units(s, decimals(d, field)?, Rounding::Exact)
        .map_err(|source| OpsError::Amount { field, source })?;
    if v.is_zero() {
        return Err(OpsError::InvalidField {
            field,
            reason: "must be greater than zero",
        });
    }
    Ok(v)
}

fn decode_err<E>(_: E) -> OpsError {
    OpsError::Store(keel_store::StoreError::Decode)
}

#[derive(sqlx::FromRow)]
struct OperationRow {
    id: Uuid,
    kind: String,
    asset_id: Uuid,
    request_sha256: Vec<u8>,
    api_key_id: Uuid,
    instance_id: Option<Uuid>,
    created_at: DateTime<Utc>,
    cancel_requested_at: Option<DateTime<Utc>>,
}

const OPERATION_COLUMNS: &str =
    "id, kind, asset_id, request_sha256, api_key_id, instance_id, created_at, cancel_requested_at";

async fn operation_get(db: &PgPool, organization_id: Uuid, id: Uuid) -> Result<OperationRow> {
    let row: Option<OperationRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {OPERATION_COLUMNS} FROM operation WHERE organization_id = $1 AND id = $2"
    )))
    .bind(organization_id)
    .bind(id)
    .fetch_optional(db)
    .await?;
    row.ok_or(OpsError::NotFound { what: "operation" })
}

async fn operation_by_key(
    db: &PgPool,
    organization_id: Uuid,
    key: &str,
) -> Result<Option<OperationRow>> {
    let row: Option<OperationRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {OPERATION_COLUMNS} FROM operation WHERE organization_id = $1 AND idempotency_key = $2"
    )))
    .bind(organization_id)
    .bind(key)
    .fetch_optional(db)
    .await?;
    Ok(row)
}

/// Records that `operation_id`'s `step` made the transaction-queue request
/// `txq_request_id`, whose verdict the relay delivers to `instance_id` as
/// `signal_name`. Idempotent (a repeat keeps the first row).
///
/// # Errors
/// [`OpsError::Store`].
pub async fn link_operation_tx(
    db: impl sqlx::PgExecutor<'_>,
    operation_id: Uuid,
    step: &str,
    txq_request_id: Uuid,
    instance_id: Uuid,
    signal_name: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO operation_tx (operation_id, step, txq_request_id, instance_id, signal_name)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (operation_id, step) DO NOTHING",
    )
    .bind(operation_id)
    .bind(step)
    .bind(txq_request_id)
    .bind(instance_id)
    .bind(signal_name)
    .execute(db)
    .await?;
    Ok(())
}

/// Takes operation `id`'s row lock for a step that is about to queue a transaction:
/// `Some(transaction)` holding the lock (link the request in it, then commit), or `None`
/// when a cancel was recorded for the operation (nothing may be queued any more). A
/// missing operation row (a workflow started outside the API) holds no lock and is never
/// cancelled this way.
///
/// # Errors
/// [`OpsError::Store`].
pub async fn write_guard(
    db: &PgPool,
    id: Uuid,
) -> Result<Option<sqlx::Transaction<'static, sqlx::Postgres>>> {
    let mut tx = db.begin().await?;
    let cancel: Option<Option<DateTime<Utc>>> =
        sqlx::query_scalar("SELECT cancel_requested_at FROM operation WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    if matches!(cancel, Some(Some(_))) {
        tx.rollback().await?;
        return Ok(None);
    }
    Ok(Some(tx))
}

/// How many times operation `id` was retried (`POST /v1/operations/{id}/retry`); 0
/// when it cannot be read (the workflow then fails again, retryably).
pub async fn operation_retries(db: &PgPool, id: Uuid) -> u32 {
    sqlx::query_scalar::<_, i32>("SELECT retries FROM operation WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
        .ok()
        .flatten()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

/// Records the token and feed addresses of `asset_id` (idempotent).
///
/// # Errors
/// [`OpsError::Store`].
pub async fn record_asset_addresses(
    db: &PgPool,
    asset_id: Uuid,
    token: Address,
    feed: Address,
) -> Result<()> {
    sqlx::query("UPDATE asset SET token_address = $2, feed_address = $3 WHERE id = $1")
        .bind(asset_id)
        .bind(token.as_slice())
        .bind(feed.as_slice())
        .execute(db)
        .await?;
    Ok(())
}

struct AssetRecord {
    id: Uuid,
    name: String,
    symbol: String,
    decimals: u8,
    template_id: String,
    chain_id: u64,
    token: Option<Address>,
    feed: Option<Address>,
    create_op: Option<Uuid>,
    create_status: Option<String>,
}

type AssetTuple = (
    Uuid,
    String,
    String,
    i16,
    String,
    i64,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Uuid>,
    Option<String>,
);

const ASSET_SELECT: &str = "SELECT a.id, a.name, a.symbol, a.decimals, a.template_id, a.chain_id,
        a.token_address, a.feed_address, o.id, i.status
   FROM asset a
   LEFT JOIN operation o ON o.asset_id = a.id AND o.kind = 'asset.create'
   LEFT JOIN durable_instance i ON i.id = o.instance_id
  WHERE a.organization_id = $1";

fn asset_record(t: AssetTuple) -> Result<AssetRecord> {
    let addr = |v: Option<Vec<u8>>| -> Result<Option<Address>> {
        v.map(|b| Address::try_from(b.as_slice()).map_err(decode_err))
            .transpose()
    };
    Ok(AssetRecord {
        id: t.0,
        name: t.1,
        symbol: t.2,
        decimals: u8::try_from(t.3).map_err(decode_err)?,
        template_id: t.4,
        chain_id: u64::try_from(t.5).map_err(decode_err)?,
        token: addr(t.6)?,
        feed: addr(t.7)?,
        create_op: t.8,
        create_status: t.9,
    })
}

fn asset_status(r: &AssetRecord) -> &'static str {
    match r.create_status.as_deref() {
        Some("completed") => "active",
        Some("failed") | Some("cancelled") => "failed",
        _ => "creating",
    }
}

fn view_state(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Pending | RunStatus::Running => "running",
        RunStatus::Waiting => "waiting",
        RunStatus::Suspended => "suspended",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
        RunStatus::Cancelled => "cancelled",
        _ => "running",
    }
}

impl Ops {
    /// A service over `db` that starts workflows through `engine` (which needs no
    /// registered workflows: the runner executes them).
    pub fn new(db: PgPool, engine: Engine) -> Self {
        Self { db, engine }
    }

    /// The database pool.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// Resolves a bearer token ([`crate::tenancy::authenticate`]).
    ///
    /// # Errors
    /// [`OpsError::Unauthenticated`]; [`OpsError::Store`].
    pub async fn authenticate(&self, token: &str) -> Result<Caller> {
        crate::tenancy::authenticate(&self.db, token).await
    }

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
        let answer = parse_units(
            &req.initial_price,
            decimals(t.price_decimals, "initialPrice")?,
            Rounding::Exact,
        )
        .map_err(|source| OpsError::Amount {
            field: "initialPrice",
            source,
        })?;
        if answer.is_zero() || answer > U256::from(i128::MAX as u128) {
            return Err(OpsError::InvalidField {
                field: "initialPrice",
                reason: "must be greater than zero and fit the feed's answer",
            });
        }
        let chain_id = i64::try_from(t.chain_id).map_err(|_| OpsError::ChainNotConfigured)?;
        let (operation_id, asset_id, created) = loop {
            if let Some(op) = operation_by_key(&self.db, caller.organization_id, key).await? {
                match self.existing(caller, &op, &request_hash).await? {
                    Some(accepted) => return Ok(accepted),
                    None => break (op.id, op.asset_id, false),
                }
            }
            let operation_id = Uuid::new_v4();
            let asset_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            sqlx::query(
                "INSERT INTO asset (id, organization_id, template_id, chain_id, name, symbol, decimals,
                                    initial_price)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(asset_id)
            .bind(caller.organization_id)
            .bind(&t.id)
            .bind(chain_id)
            .bind(&req.name)
            .bind(&req.symbol)
            .bind(i16::from(req.decimals))
            .bind(&req.initial_price)
            .execute(&mut *tx)
            .await?;
            let inserted = insert_operation(
                &mut tx,
                operation_id,
                caller,
                AssetCreate::NAME,
                asset_id,
                key,
                &request_hash,
            )
            .await?;
            if inserted {
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
                let v = parse_amount(amount, asset.decimals, "amount")?;
                let action = if matches!(req, TokenRequest::Mint { .. }) {
                    TokenAction::Mint {
                        to: *recipient,
                        amount: v,
                    }
                } else {
                    TokenAction::Transfer {
                        to: *recipient,
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
        let (Some(token), "active") = (asset.token, asset_status(&asset)) else {
            if let Some(op) = operation_by_key(&self.db, caller.organization_id, key).await?
                && let Some(accepted) = self.existing(caller, &op, &request_hash).await?
            {
                return Ok(accepted);
            }
            return Err(OpsError::AssetNotReady);
        };
        let t = template(&self.db, caller.organization_id, &asset.template_id).await?;
        let needs_approval = match (&action, amount, &t.mint_approval_threshold) {
            (TokenAction::Mint { .. }, Some(v), Some(th)) => {
                let th = parse_units(th, decimals(asset.decimals, "amount")?, Rounding::Down)
                    .map_err(|source| OpsError::Amount {
                        field: "amount",
                        source,
                    })?;
                v > th
            }
            _ => false,
        };
        let (operation_id, created) = loop {
            if let Some(op) = operation_by_key(&self.db, caller.organization_id, key).await? {
                match self.existing(caller, &op, &request_hash).await? {
                    Some(accepted) => return Ok(accepted),
                    None => break (op.id, false),
                }
            }
            let operation_id = Uuid::new_v4();
            let mut tx = self.db.begin().await?;
            if insert_operation(
                &mut tx,
                operation_id,
                caller,
                kind,
                asset_id,
                key,
                &request_hash,
            )
            .await?
            {
                tx.commit().await?;
                break (operation_id, true);
            }
            tx.rollback().await?;
        };
        let input = TokenOpInput {
            operation_id,
            asset_id,
            chain_id: asset.chain_id,
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
        sqlx::query("UPDATE operation SET instance_id = $2 WHERE id = $1 AND instance_id IS NULL")
            .bind(operation_id)
            .bind(started.instance_id)
            .execute(&self.db)
            .await?;
        Ok(started.instance_id)
    }

    /// The operation a repeated key names: a different request is a conflict; the
    /// same request returns `Some(view)` when its workflow was started, or `None` when a
    /// crash left it unstarted (the caller then starts it under the existing ids).
    async fn existing(
        &self,
        caller: Caller,
        op: &OperationRow,
        hash: &[u8],
    ) -> Result<Option<Accepted>> {
        if op.request_sha256 != hash {
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

    /// The status of operation `id` of the caller's organization.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn operation(&self, caller: Caller, id: Uuid) -> Result<OperationView> {
        let op = operation_get(&self.db, caller.organization_id, id).await?;
        let status = match op.instance_id {
            Some(instance) => Some(self.engine.status(instance).await?),
            None => None,
        };
        let txs = operation_txs(&self.db, op.id).await?;
        let queued_behind = match status.as_ref().and_then(|s| s.queued_behind) {
            Some(instance) => operation_of_instance(&self.db, instance).await?,
            None => None,
        };
        Ok(project(&op, status.as_ref(), txs, queued_behind))
    }

    /// The operator's view of operation `id`, whatever its organization (for `keel ops`,
    /// which authenticates by database access, not by an API key): the caller context
    /// of the operation's own request.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`].
    pub async fn operator_caller(&self, id: Uuid) -> Result<Caller> {
        let row: Option<(Uuid, Uuid)> =
            sqlx::query_as("SELECT organization_id, api_key_id FROM operation WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.db)
                .await?;
        let (organization_id, api_key_id) = row.ok_or(OpsError::NotFound { what: "operation" })?;
        Ok(Caller {
            organization_id,
            api_key_id,
        })
    }

    /// Cancels operation `id` of the caller's organization.
    ///
    /// What a cancel does depends on how far the operation got:
    /// - **no transaction queued yet** (queued behind another operation, waiting for an
    ///   approval, or before its first write): the operation ends `cancelled` and nothing
    ///   reaches the chain;
    /// - **a transaction queued but not signed** (waiting in the queue or for funding): the
    ///   request is withdrawn (verdict `WITHDRAWN`) and the operation ends `cancelled`;
    /// - **a transaction signed** (it may already be in a node's pool): it cannot be
    ///   unsent. The cancel is recorded (`cancelRequestedAt`), no further write of the
    ///   operation is queued, and the operation runs to that transaction's verdict: it
    ///   may still complete (a token operation whose only write landed) or end
    ///   `cancelled` before its next write (an asset creation);
    /// - in every case `milestones.confirmed` lists the writes that landed, and a
    ///   `cancelled` operation's `error` says how many did.
    ///
    /// Repeating a cancel is harmless (202 with the current view).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::OperationEnded`] when it is `completed`,
    /// `failed` or `cancelled`; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn cancel(&self, caller: Caller, id: Uuid) -> Result<OperationView> {
        let op = operation_get(&self.db, caller.organization_id, id).await?;
        if let Some(instance) = op.instance_id {
            let status = self.engine.status(instance).await?.status;
            if matches!(
                status,
                RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
            ) {
                return Err(OpsError::OperationEnded);
            }
        }
        // Under the row lock: waits for a step that is queueing a write right now, so
        // its request is linked (and seen below) before the flag is set.
        sqlx::query(
            "UPDATE operation SET cancel_requested_at = coalesce(cancel_requested_at, now())
              WHERE id = $1",
        )
        .bind(id)
        .execute(&self.db)
        .await?;
        let asset = self.asset_record(caller, op.asset_id).await?;
        let withdrawal = keel_txq::withdraw_by_key_prefix(
            &self.db,
            ChainId(asset.chain_id),
            &format!("op/{id}/"),
            None,
        )
        .await
        .map_err(|e| match e {
            keel_txq::TxqError::Store(s) => OpsError::Store(s),
            _ => OpsError::Store(keel_store::StoreError::Decode),
        })?;
        if let Some(instance) = op.instance_id
            && withdrawal.in_flight.is_empty()
        {
            match self.engine.cancel(instance).await {
                Ok(_) | Err(keel_durable::DurableError::InstanceEnded { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(
            target: "keel::ops",
            operation = %id,
            withdrawn = withdrawal.withdrawn.len(),
            in_flight = withdrawal.in_flight.len(),
            "operation cancel recorded"
        );
        self.operation(caller, id).await
    }

    /// Waits up to `wait` (capped at [`MAX_WAIT`]) for operation `id` to end; returns
    /// its status either way.
    ///
    /// # Errors
    /// As [`Ops::operation`].
    pub async fn operation_wait(
        &self,
        caller: Caller,
        id: Uuid,
        wait: Duration,
    ) -> Result<OperationView> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        loop {
            let view = self.operation(caller, id).await?;
            if view.is_terminal() || tokio::time::Instant::now() >= deadline {
                return Ok(view);
            }
            tokio::time::sleep_until(
                (tokio::time::Instant::now() + Duration::from_millis(100)).min(deadline),
            )
            .await;
        }
    }

    /// Approves (`approved = true`) or rejects operation `id`. The decision must come
    /// from another API key of the same organization than the request's; the first
    /// decision wins.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::ApprovalSameKey`];
    /// [`OpsError::ApprovalNotPending`] when the operation needs no approval, was
    /// decided already, or ended; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn decide_approval(
        &self,
        caller: Caller,
        id: Uuid,
        approved: bool,
    ) -> Result<OperationView> {
        let op = operation_get(&self.db, caller.organization_id, id).await?;
        let Some(instance) = op.instance_id else {
            return Err(OpsError::ApprovalNotPending);
        };
        let needs: Option<bool> = sqlx::query_scalar(
            "SELECT (input ? 'approvalTtlSeconds') AND input->'approvalTtlSeconds' <> 'null'::jsonb
               FROM durable_instance WHERE id = $1",
        )
        .bind(instance)
        .fetch_optional(&self.db)
        .await?;
        if needs != Some(true) {
            return Err(OpsError::ApprovalNotPending);
        }
        // A failed instance would keep the signal for a retry; a decision after the
        // operation ended (expired, rejected, cancelled) is refused instead.
        let current = self.engine.status(instance).await?;
        let failure_code = current
            .error
            .as_ref()
            .and_then(|e| e.detail.as_ref())
            .and_then(|d| d.get("code"))
            .and_then(Value::as_str);
        if failure_code == Some("APPROVAL_EXPIRED") {
            return Err(OpsError::ApprovalExpired);
        }
        if matches!(
            current.status,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        ) {
            return Err(OpsError::ApprovalNotPending);
        }
        // The deadline passed but the timer has not run yet: a signal recorded now would
        // lose against the deadline (see `wait_signal`), so refuse it instead of
        // answering 202 for a decision without effect. Database clock, as the engine.
        if let Some(deadline) = current
            .wait
            .as_ref()
            .filter(|w| w.name.as_deref() == Some(APPROVAL_SIGNAL))
            .and_then(|w| w.deadline)
        {
            let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
                .fetch_one(&self.db)
                .await?;
            if now >= deadline {
                return Err(OpsError::ApprovalExpired);
            }
        }
        if caller.api_key_id == op.api_key_id {
            return Err(OpsError::ApprovalSameKey);
        }
        let decision = ApprovalDecision {
            approved,
            api_key_id: caller.api_key_id,
        };
        match self
            .engine
            .signal(instance, APPROVAL_SIGNAL, "approval-decision", &decision)
            .await
        {
            Ok(SignalReceipt::Recorded) => {}
            Ok(SignalReceipt::Duplicate) => return Err(OpsError::ApprovalNotPending),
            Err(keel_durable::DurableError::InstanceEnded { .. }) => {
                return Err(OpsError::ApprovalNotPending);
            }
            Err(e) => return Err(e.into()),
        }
        self.operation(caller, id).await
    }

    /// Retries a `failed` operation (or hurries a `suspended` one): its workflow replays
    /// its journal, so every step with a recorded result — a landed transaction
    /// included — is not run again; it resumes at the first step without one.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::NotRetryable`] when the operation is not
    /// `failed` or `suspended`; [`OpsError::Store`] / [`OpsError::Engine`].
    pub async fn retry(&self, caller: Caller, id: Uuid) -> Result<OperationView> {
        let op = operation_get(&self.db, caller.organization_id, id).await?;
        let instance = op.instance_id.ok_or(OpsError::NotRetryable)?;
        let current = self.engine.status(instance).await?;
        if !matches!(current.status, RunStatus::Failed | RunStatus::Suspended) {
            return Err(OpsError::NotRetryable);
        }
        if current.status == RunStatus::Failed
            && let Some(e) = &current.error
        {
            // The workflow's typed failure says whether a retry can help; an engine-level
            // failure carries its own flag.
            let typed: Option<OpFailure> = e
                .detail
                .clone()
                .and_then(|d| serde_json::from_value(d).ok());
            let (code, retryable) = match typed {
                Some(f) => (f.code, f.retryable),
                None => (e.code.clone(), e.retryable),
            };
            if !retryable {
                return Err(OpsError::FailureNotRetryable { code });
            }
        }
        // Counted before the engine's retry, so the replay that the retry starts sees it.
        sqlx::query("UPDATE operation SET retries = retries + 1 WHERE id = $1")
            .bind(id)
            .execute(&self.db)
            .await?;
        match self.engine.retry(instance).await {
            Ok(()) => {}
            Err(
                keel_durable::DurableError::NotRetryable { .. }
                | keel_durable::DurableError::InstanceEnded { .. },
            ) => return Err(OpsError::NotRetryable),
            Err(e) => return Err(e.into()),
        }
        self.operation(caller, id).await
    }

    async fn asset_record(&self, caller: Caller, id: Uuid) -> Result<AssetRecord> {
        let row: Option<AssetTuple> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("{ASSET_SELECT} AND a.id = $2")))
                .bind(caller.organization_id)
                .bind(id)
                .fetch_optional(&self.db)
                .await?;
        asset_record(row.ok_or(OpsError::NotFound { what: "asset" })?)
    }

    /// The caller's assets, oldest first, with their index state.
    ///
    /// # Errors
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn assets(&self, caller: Caller) -> Result<Vec<AssetView>> {
        let rows: Vec<AssetTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "{ASSET_SELECT} ORDER BY a.created_at, a.id LIMIT 1000"
        )))
        .bind(caller.organization_id)
        .fetch_all(&self.db)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(self.asset_view(asset_record(r)?).await?);
        }
        Ok(out)
    }

    /// Asset `id` of the caller's organization. With `min_block`, first waits (up to
    /// `wait`, capped at [`MAX_WAIT`]) until the index has committed that block.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::IndexBehind`] when the wait ran out;
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn asset(
        &self,
        caller: Caller,
        id: Uuid,
        min_block: Option<u64>,
        wait: Duration,
    ) -> Result<AssetView> {
        let r = self.asset_record(caller, id).await?;
        if let Some(b) = min_block {
            self.wait_block(r.chain_id, b, wait).await?;
        }
        self.asset_view(r).await
    }

    /// The balance of `holder` in asset `id`, from the index (optionally after waiting
    /// for `min_block` as in [`Ops::asset`]).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::AssetNotReady`] before the token exists;
    /// [`OpsError::IndexBehind`]; [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn balance(
        &self,
        caller: Caller,
        id: Uuid,
        holder: Address,
        min_block: Option<u64>,
        wait: Duration,
    ) -> Result<BalanceView> {
        let r = self.asset_record(caller, id).await?;
        let token = r.token.ok_or(OpsError::AssetNotReady)?;
        if let Some(b) = min_block {
            self.wait_block(r.chain_id, b, wait).await?;
        }
        let chain = ChainId(r.chain_id);
        let mut tx = self.db.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let tip = keel_index::read::indexed_tip(&mut *tx, chain).await?;
        let base = keel_index::read::balance(&mut *tx, chain, token, holder).await?;
        let health = keel_index::read::chain_health(&mut *tx, chain).await?;
        tx.commit().await?;
        let base_u = U256::from_str_radix(&base, 10).map_err(decode_err)?;
        Ok(BalanceView {
            asset_id: id,
            address: holder,
            balance: keel_units::format_units(base_u, decimals(r.decimals, "decimals")?),
            balance_base_units: base,
            indexed_block: tip.map(|t| t.number).unwrap_or(0),
            index_degraded: health.is_degraded(),
        })
    }

    async fn wait_block(&self, chain_id: u64, block: u64, wait: Duration) -> Result<()> {
        match keel_index::wait_for_block(
            &self.db,
            ChainId(chain_id),
            block,
            wait.min(MAX_WAIT),
            Duration::from_millis(200),
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(keel_index::IndexError::WaitTimeout { .. }) => Err(OpsError::IndexBehind),
            Err(e) => Err(e.into()),
        }
    }

    async fn asset_view(&self, r: AssetRecord) -> Result<AssetView> {
        let chain = ChainId(r.chain_id);
        let status = asset_status(&r);
        let mut view = AssetView {
            id: r.id,
            name: r.name.clone(),
            symbol: r.symbol.clone(),
            decimals: r.decimals,
            template_id: r.template_id.clone(),
            chain_id: r.chain_id,
            status,
            create_operation_id: r.create_op,
            token_address: r.token,
            feed_address: r.feed,
            supply: None,
            paused: None,
            staleness_bound_seconds: None,
            latest_observation: None,
            indexed_block: None,
            index_degraded: false,
        };
        let mut tx = self.db.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        view.indexed_block = keel_index::read::indexed_tip(&mut *tx, chain)
            .await?
            .map(|t| t.number);
        view.index_degraded = keel_index::read::chain_health(&mut *tx, chain)
            .await?
            .is_degraded();
        if let Some(token) = r.token {
            let supply = token_supply(&mut tx, chain, token).await?;
            view.supply = Some(keel_units::format_units(
                supply,
                decimals(r.decimals, "decimals")?,
            ));
            view.paused = keel_index::read::token_paused(&mut *tx, chain, token)
                .await?
                .map(|(p, _)| p);
        }
        if let Some(feed) = r.feed {
            view.staleness_bound_seconds = keel_index::read::staleness_bound(&mut *tx, chain, feed)
                .await?
                .and_then(|(b, _)| b);
            view.latest_observation = keel_index::read::observations(&mut *tx, chain, feed)
                .await?
                .into_iter()
                .max_by_key(|o| (o.position.block_number, o.position.log_index))
                .map(|o| ObservationView {
                    answer: o.answer,
                    round_id: o.round_id,
                    updated_at: o.updated_at,
                    block: o.position.block_number,
                });
        }
        tx.commit().await?;
        Ok(view)
    }
}

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

async fn insert_operation(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    caller: Caller,
    kind: &str,
    asset_id: Uuid,
    key: &str,
    hash: &[u8],
) -> Result<bool> {
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO operation (id, organization_id, kind, asset_id, idempotency_key, request_sha256,
                                api_key_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (organization_id, idempotency_key) DO NOTHING RETURNING id",
    )
    .bind(id)
    .bind(caller.organization_id)
    .bind(kind)
    .bind(asset_id)
    .bind(key)
    .bind(hash)
    .bind(caller.api_key_id)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(inserted.is_some())
}

/// Total supply of `token` in base units: minted (from the zero address) minus burned
/// (to the zero address), from the index.
async fn token_supply(tx: &mut sqlx::PgConnection, chain: ChainId, token: Address) -> Result<U256> {
    let chain_id = i64::try_from(chain.get()).map_err(decode_err)?;
    let s: String = sqlx::query_scalar(
        "SELECT (COALESCE(SUM(value) FILTER (WHERE from_address = '\\x0000000000000000000000000000000000000000'::bytea), 0)
               - COALESCE(SUM(value) FILTER (WHERE to_address = '\\x0000000000000000000000000000000000000000'::bytea), 0))::text
           FROM index_transfer WHERE chain_id = $1 AND token = $2",
    )
    .bind(chain_id)
    .bind(token.as_slice())
    .fetch_one(&mut *tx)
    .await?;
    U256::from_str_radix(&s, 10).map_err(decode_err)
}

#[derive(sqlx::FromRow)]
struct TxRow {
    step: String,
    state: String,
    nonce: Option<i64>,
    verdict: Option<Value>,
    last_hash: Option<Vec<u8>>,
    funding_deadline: Option<DateTime<Utc>>,
    last_broadcast_error: Option<String>,
}

async fn operation_txs(db: &PgPool, operation_id: Uuid) -> Result<Vec<TxRow>> {
    Ok(sqlx::query_as(
        "SELECT ot.step, r.state, r.nonce, r.verdict,
                (SELECT a.tx_hash FROM txq_attempt a WHERE a.request_id = r.id
                  ORDER BY a.attempt DESC LIMIT 1) AS last_hash,
                r.funding_deadline, r.last_broadcast_error
           FROM operation_tx ot JOIN txq_request r ON r.id = ot.txq_request_id
          WHERE ot.operation_id = $1 ORDER BY ot.created_at, ot.step",
    )
    .bind(operation_id)
    .fetch_all(db)
    .await?)
}

/// The operation whose workflow instance is `instance`, if any.
async fn operation_of_instance(db: &PgPool, instance: Uuid) -> Result<Option<Uuid>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM operation WHERE instance_id = $1")
            .bind(instance)
            .fetch_optional(db)
            .await?,
    )
}

fn project(
    op: &OperationRow,
    status: Option<&InstanceStatus>,
    txs: Vec<TxRow>,
    queued_behind: Option<Uuid>,
) -> OperationView {
    let mut submitted = Vec::new();
    let mut confirmed = Vec::new();
    // The unsettled transaction's step, state, funding deadline, last broadcast error.
    type Unsettled = (String, String, Option<DateTime<Utc>>, Option<String>);
    let mut waiting_step_state: Option<Unsettled> = None;
    for t in txs {
        let verdict: Option<keel_txq::SettlementVerdict> =
            t.verdict.and_then(|v| serde_json::from_value(v).ok());
        let (mined_hash, block) = match &verdict {
            Some(keel_txq::SettlementVerdict::Confirmed { hash, block, .. }) => {
                (Some(*hash), Some(*block))
            }
            Some(keel_txq::SettlementVerdict::Reverted { hash, block, .. }) => {
                (Some(*hash), Some(*block))
            }
            _ => (None, None),
        };
        let hash =
            mined_hash.or_else(|| t.last_hash.and_then(|h| B256::try_from(h.as_slice()).ok()));
        let nonce = t.nonce.and_then(|n| u64::try_from(n).ok());
        if t.state != keel_txq::RequestState::Settled.as_str() {
            waiting_step_state = Some((
                t.step.clone(),
                t.state.clone(),
                t.funding_deadline,
                t.last_broadcast_error.clone(),
            ));
        }
        if hash.is_some() {
            submitted.push(TxMilestone {
                step: t.step.clone(),
                tx_hash: hash,
                nonce,
                broadcast: t.state == keel_txq::RequestState::Broadcast.as_str() || block.is_some(),
                block: None,
            });
        }
        if matches!(verdict, Some(keel_txq::SettlementVerdict::Confirmed { .. })) {
            confirmed.push(TxMilestone {
                step: t.step,
                tx_hash: hash,
                nonce,
                broadcast: true,
                block,
            });
        }
    }
    let queued_behind = queued_behind.filter(|_| {
        status.is_some_and(|s| s.status == RunStatus::Pending && s.queued_behind.is_some())
    });
    let state = if queued_behind.is_some() {
        "queued"
    } else {
        status.map(|s| view_state(s.status)).unwrap_or("running")
    };
    let wait = status
        .and_then(|s| s.wait.as_ref())
        .filter(|_| state == "waiting")
        .map(|w| {
            let name = w.name.as_deref().unwrap_or("");
            if name == APPROVAL_SIGNAL {
                WaitView {
                    waits_for: "approval",
                    until: w.deadline,
                    step: None,
                    last_broadcast_error: None,
                }
            } else if let Some(step) = name.strip_prefix(TX_SIGNAL_PREFIX) {
                let unsettled = waiting_step_state.as_ref().filter(|(s, ..)| s == step);
                match unsettled {
                    Some((_, st, deadline, _))
                        if st == keel_txq::RequestState::WaitingFunding.as_str() =>
                    {
                        WaitView {
                            waits_for: "funding",
                            until: *deadline,
                            step: Some(step.to_owned()),
                            last_broadcast_error: None,
                        }
                    }
                    _ => WaitView {
                        waits_for: "transaction",
                        until: w.deadline,
                        step: Some(step.to_owned()),
                        last_broadcast_error: unsettled.and_then(|(.., e)| e.clone()),
                    },
                }
            } else {
                WaitView {
                    waits_for: "timer",
                    until: w.deadline,
                    step: None,
                    last_broadcast_error: None,
                }
            }
        });
    let indexed = status
        .and_then(|s| s.output.as_ref())
        .and_then(|o| o.get("indexedBlock"))
        .and_then(Value::as_u64)
        .map(|block| IndexedMilestone { block });
    let landed = confirmed.len();
    let cancelled = status.is_some_and(|s| s.status == RunStatus::Cancelled);
    let error = status.and_then(|s| s.error.as_ref()).map(|e| {
        let typed: Option<OpFailure> = e
            .detail
            .clone()
            .and_then(|d| serde_json::from_value(d).ok());
        match typed {
            Some(f) => ErrorView {
                code: f.code,
                retryable: f.retryable,
                detail: f.detail,
                reason: f.reason,
            },
            None => ErrorView {
                code: e.code.clone(),
                retryable: e.retryable,
                detail: e.message.clone(),
                reason: None,
            },
        }
    });
    // A cancelled operation always says whether any of its writes landed.
    let error = error.or_else(|| {
        cancelled.then(|| ErrorView {
            code: "CANCELLED".to_owned(),
            retryable: false,
            detail: if landed == 0 {
                "the operation was cancelled; none of its transactions landed".to_owned()
            } else {
                format!(
                    "the operation was cancelled after {landed} of its transactions had landed (see milestones.confirmed)"
                )
            },
            reason: None,
        })
    });
    OperationView {
        id: op.id,
        kind: op.kind.clone(),
        asset_id: op.asset_id,
        state,
        queued_behind,
        wait,
        cancel_requested_at: op.cancel_requested_at,
        milestones: Milestones {
            accepted: op.created_at,
            submitted,
            confirmed,
            indexed,
        },
        progress: status.and_then(|s| s.progress.clone()),
        result: status.and_then(|s| s.output.clone()),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::WORKFLOWS;
    use keel_durable::{WaitDescription, WaitKind};

    fn op_row() -> OperationRow {
        OperationRow {
            id: Uuid::new_v4(),
            kind: "asset.mint".into(),
            asset_id: Uuid::new_v4(),
            request_sha256: vec![],
            api_key_id: Uuid::new_v4(),
            instance_id: Some(Uuid::new_v4()),
            created_at: Utc::now(),
            cancel_requested_at: None,
        }
    }

    fn instance(status: RunStatus, wait: Option<&str>) -> InstanceStatus {
        InstanceStatus {
            id: Uuid::new_v4(),
            workflow: "asset.mint".into(),
            status,
            progress: None,
            wait: wait.map(|name| WaitDescription {
                kind: WaitKind::Signal,
                name: Some(name.to_owned()),
                deadline: None,
            }),
            output: None,
            error: None,
            created_at: Utc::now(),
            ended_at: None,
            cancel_requested_at: None,
            queued_behind: None,
        }
    }

    fn tx(state: &str, verdict: Option<Value>) -> TxRow {
        TxRow {
            step: "mint".into(),
            state: state.into(),
            nonce: Some(3),
            verdict,
            last_hash: Some(vec![7; 32]),
            funding_deadline: None,
            last_broadcast_error: None,
        }
    }

    /// A transaction wait shows the last broadcast error class of the unsettled request;
    /// a funding wait shows the funding deadline in `until`.
    #[test]
    fn transaction_and_funding_waits_carry_their_error_class_and_deadline() {
        let status = instance(RunStatus::Waiting, Some("tx.mint"));
        let mut signed = tx("signed", None);
        signed.last_broadcast_error = Some("internal".into());
        let view = project(&op_row(), Some(&status), vec![signed], None);
        let wait = view.wait.unwrap();
        assert_eq!(wait.waits_for, "transaction");
        assert_eq!(wait.last_broadcast_error.as_deref(), Some("internal"));

        let deadline = Utc::now() + chrono::Duration::seconds(600);
        let mut funding = tx("waiting_funding", None);
        funding.funding_deadline = Some(deadline);
        let view = project(&op_row(), Some(&status), vec![funding], None);
        let wait = view.wait.unwrap();
        assert_eq!(wait.waits_for, "funding");
        assert_eq!(wait.until, Some(deadline));
    }

    /// A pending instance blocked by another of its key reads `queued` with the blocking
    /// operation; a pending one that is not blocked reads `running`.
    #[test]
    fn a_blocked_pending_operation_reads_queued_behind_the_blocker() {
        let blocker = Uuid::new_v4();
        let mut status = instance(RunStatus::Pending, None);
        status.queued_behind = Some(Uuid::new_v4());
        let view = project(&op_row(), Some(&status), vec![], Some(blocker));
        assert_eq!(view.state, "queued");
        assert_eq!(view.queued_behind, Some(blocker));
        status.queued_behind = None;
        let view = project(&op_row(), Some(&status), vec![], None);
        assert_eq!(view.state, "running");
        assert_eq!(view.queued_behind, None);
    }

    /// A cancelled operation always says how many of its writes landed.
    #[test]
    fn a_cancelled_operation_says_what_landed() {
        let status = instance(RunStatus::Cancelled, None);
        let view = project(&op_row(), Some(&status), vec![], None);
        let e = view.error.unwrap();
        assert_eq!(e.code, "CANCELLED");
        assert!(e.detail.contains("none"), "{}", e.detail);
        let confirmed = serde_json::to_value(keel_txq::SettlementVerdict::Confirmed {
            block: 9,
            hash: B256::repeat_byte(7),
            gas_used: 21_000,
            effective_gas_price: "1".into(),
            attempts: vec![],
        })
        .unwrap();
        let view = project(
            &op_row(),
            Some(&status),
            vec![tx("settled", Some(confirmed))],
            None,
        );
        assert_eq!(view.state, "cancelled");
        assert_eq!(view.milestones.confirmed.len(), 1);
        let e = view.error.unwrap();
        assert!(
            e.detail.contains("after 1 of its transactions"),
            "{}",
            e.detail
        );
    }

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

    #[tokio::test]
    async fn register_all_registers_every_workflow() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1:5432/unused")
            .unwrap();
        let platform = std::sync::Arc::new(crate::Platform {
            db: pool.clone(),
            operator: Address::ZERO,
            suffix: keel_chain::AttributionSuffix::new(&["keel"]).unwrap(),
            chains: Default::default(),
            later_chains: Default::default(),
            index_wait: Duration::from_secs(1),
        });
        let engine = crate::workflows::register_all(
            Engine::new(pool, keel_durable::EngineConfig::default()).unwrap(),
            platform,
        );
        let mut registered = engine.registered();
        registered.sort();
        let mut expected: Vec<String> = WORKFLOWS.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        assert_eq!(registered, expected);
    }
}
