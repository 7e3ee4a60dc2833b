//! The reads: assets (identity from Keel's records, state from the Ledger Index),
//! balances, and the caller's open funding requests.

use crate::error::{OpsError, Result};
use crate::ops::amount::format_amount;
use crate::ops::{MAX_WAIT, Ops, decode_err};
use crate::store::{self, AssetRow};
use crate::tenancy::Caller;
use alloy::primitives::{Address, U256};
use chrono::{DateTime, Utc};
use keel_durable::RunStatus;
use keel_units::ChainId;
use std::time::Duration;
use uuid::Uuid;

/// The keyset position of an asset in the asset list: `(created_at, id)`.
pub type AssetKey = (DateTime<Utc>, Uuid);

/// The lifecycle of an asset, from its `asset.create` operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssetStatus {
    /// Its creation is in progress (or not started).
    Creating,
    /// Created; token operations are accepted.
    Active,
    /// Its creation failed or was cancelled.
    Failed,
}

/// An asset as the API shows it (identity from Keel's records, state from the index).
#[derive(Debug, Clone, PartialEq)]
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
    pub chain_id: ChainId,
    /// From its creation operation.
    pub status: AssetStatus,
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
    /// True while an operator's re-index rebuilds the Ledger Index of the asset's
    /// chain (`keel index reindex`): the index state above may miss rows until it is
    /// done.
    pub index_rebuilding: bool,
    /// The issuer: the account that sends the asset's transactions and administers its
    /// token and feed (Keel's operator on the chain). Mints go to any recipient;
    /// `transfer` moves tokens from this account's balance. Recorded by `asset.create`
    /// with the token address (`None` before).
    pub issuer_address: Option<Address>,
    /// When the asset was accepted.
    pub created_at: DateTime<Utc>,
    /// When Keel's record of the asset last changed: its row (addresses recorded) or its
    /// creation's progress (which moves its status). Index state is not a change of the
    /// record (see `indexed_block`).
    pub updated_at: DateTime<Utc>,
}

impl AssetView {
    /// Its position in the asset list ([`Ops::assets`]).
    pub fn key(&self) -> AssetKey {
        (self.created_at, self.id)
    }
}

/// An asset template with its timestamps ([`Ops::templates`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateView {
    /// The template's settings.
    pub template: crate::tenancy::Template,
    /// When it was first created.
    pub created_at: DateTime<Utc>,
    /// When it was last written (created or replaced).
    pub updated_at: DateTime<Utc>,
}

/// A price observation.
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceView {
    /// The asset.
    pub asset_id: Uuid,
    /// The holder.
    pub address: Address,
    /// Token units (decimal string, the token's decimals).
    pub balance: String,
    /// Base units (decimal integer string).
    pub balance_base_units: String,
    /// The indexed tip when the balance was read (0 when nothing is indexed yet).
    pub indexed_block: u64,
    /// The block the balance reflects: `at_block` when asked, else the indexed tip
    /// (0 when nothing is indexed yet).
    pub block: u64,
    /// True when `block` is at or below the chain's finalized block as the index last
    /// recorded it (the balance cannot change any more).
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded (see
    /// [`AssetView::index_degraded`]): the balance may reflect orphaned blocks.
    pub index_degraded: bool,
    /// True while a re-index rebuilds the chain's index (see
    /// [`AssetView::index_rebuilding`]).
    pub index_rebuilding: bool,
}

/// An open funding request of one of the caller's operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FundingRequestView {
    /// The operation that waits.
    pub operation_id: Uuid,
    /// Its link to the waiting queue request (wire name `step`).
    pub link: String,
    /// The queue's funding request.
    pub request: keel_txq::FundingRequest,
}

/// One of the caller's queue requests held up behind a funding wait of its sender
/// ([`keel_txq::QueuedBehindFunding`]).
#[derive(Debug, Clone)]
pub struct QueuedBehindFundingView {
    /// The operation that waits.
    pub operation_id: Uuid,
    /// Its link to the waiting queue request (wire name `step`).
    pub link: String,
    /// The operation it waits behind, when that one is the caller's too (`None`: another
    /// organization's operation on the same sender; its id is not shown).
    pub queued_behind: Option<Uuid>,
    /// The queue's view.
    pub request: keel_txq::QueuedBehindFunding,
}

/// An asset row, decoded.
#[derive(Debug, Clone)]
pub(crate) struct AssetRecord {
    pub(crate) id: Uuid,
    pub(crate) name: String,
    pub(crate) symbol: String,
    pub(crate) decimals: u8,
    pub(crate) template_id: String,
    pub(crate) chain_id: ChainId,
    pub(crate) token: Option<Address>,
    pub(crate) feed: Option<Address>,
    pub(crate) create_operation_id: Option<Uuid>,
    pub(crate) create_status: Option<RunStatus>,
    pub(crate) issuer: Option<Address>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

impl AssetRecord {
    /// The asset's status from its creation instance's status.
    pub(crate) fn status(&self) -> AssetStatus {
        match self.create_status {
            Some(RunStatus::Completed) => AssetStatus::Active,
            Some(RunStatus::Failed | RunStatus::Cancelled) => AssetStatus::Failed,
            _ => AssetStatus::Creating,
        }
    }

    /// Decodes `r`, with its creation instance's status and last change as the engine
    /// reports them.
    fn decode(
        r: AssetRow,
        create_status: Option<RunStatus>,
        create_updated_at: Option<DateTime<Utc>>,
    ) -> Result<Self> {
        let addr = |v: Option<Vec<u8>>| -> Result<Option<Address>> {
            v.map(|b| Address::try_from(b.as_slice()).map_err(decode_err))
                .transpose()
        };
        Ok(Self {
            id: r.id,
            name: r.name,
            symbol: r.symbol,
            decimals: u8::try_from(r.decimals).map_err(decode_err)?,
            template_id: r.template_id,
            chain_id: ChainId(u64::try_from(r.chain_id).map_err(decode_err)?),
            token: addr(r.token_address)?,
            feed: addr(r.feed_address)?,
            create_operation_id: r.create_operation_id,
            create_status,
            issuer: addr(r.issuer_address)?,
            created_at: r.created_at,
            updated_at: create_updated_at.map_or(r.updated_at, |u| u.max(r.updated_at)),
        })
    }
}

impl Ops {
    /// Asset `id` of the caller's organization, decoded.
    pub(crate) async fn asset_record(&self, caller: Caller, id: Uuid) -> Result<AssetRecord> {
        let row = store::asset_get(&self.db, caller.organization_id, id)
            .await?
            .ok_or(OpsError::NotFound { what: "asset" })?;
        self.asset_records(vec![row])
            .await?
            .pop()
            .ok_or(OpsError::NotFound { what: "asset" })
    }

    /// Decodes `rows` (in order), with their creation instances' statuses read from the
    /// engine in one batch.
    async fn asset_records(&self, rows: Vec<AssetRow>) -> Result<Vec<AssetRecord>> {
        let instances: Vec<Uuid> = rows.iter().filter_map(|r| r.create_instance_id).collect();
        let statuses = self.engine.statuses(&instances).await?;
        rows.into_iter()
            .map(|r| {
                let status = r
                    .create_instance_id
                    .and_then(|i| statuses.iter().find(|s| s.id == i));
                AssetRecord::decode(r, status.map(|s| s.status), status.map(|s| s.updated_at))
            })
            .collect()
    }

    /// The caller's assets with their index state, oldest first (`(created_at, id)`),
    /// after the keyset position `after` (exclusive) when given: at most `limit + 1`, so
    /// the caller can tell whether more follow. One index range scan.
    ///
    /// # Errors
    /// [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn assets(
        &self,
        caller: Caller,
        after: Option<AssetKey>,
        limit: u32,
    ) -> Result<Vec<AssetView>> {
        let rows = store::asset_list(
            &self.db,
            caller.organization_id,
            after,
            i64::from(limit) + 1,
        )
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in self.asset_records(rows).await? {
            out.push(self.asset_view(r).await?);
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
    /// for `min_block` as in [`Ops::asset`]): at the indexed tip, or as of `at_block`
    /// (every canonical transfer at or below it, as [`Ops::holders`] reads a record
    /// date).
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::AssetNotReady`] before the token exists;
    /// [`OpsError::IndexBehind`]; [`OpsError::BlockNotIndexed`] when `at_block` is above
    /// the indexed tip or nothing is indexed; [`OpsError::Store`] / [`OpsError::Index`].
    pub async fn balance(
        &self,
        caller: Caller,
        id: Uuid,
        holder: Address,
        at_block: Option<u64>,
        min_block: Option<u64>,
        wait: Duration,
    ) -> Result<BalanceView> {
        let r = self.asset_record(caller, id).await?;
        let token = r.token.ok_or(OpsError::AssetNotReady)?;
        if let Some(b) = min_block {
            self.wait_block(r.chain_id, b, wait).await?;
        }
        let chain = r.chain_id;
        let mut tx = self.db.begin().await?;
        store::transaction_snapshot(&mut *tx).await?;
        let tip = keel_index::read::indexed_tip(&mut *tx, chain)
            .await?
            .map(|t| t.number);
        let (block, base_u) = match at_block {
            None => {
                let base = keel_index::read::balance(&mut *tx, chain, token, holder).await?;
                (
                    tip.unwrap_or(0),
                    U256::from_str_radix(&base, 10).map_err(decode_err)?,
                )
            }
            Some(at) => {
                match tip {
                    None => return Err(OpsError::BlockNotIndexed { indexed: None }),
                    Some(t) if at > t => {
                        return Err(OpsError::BlockNotIndexed { indexed: Some(t) });
                    }
                    Some(_) => {}
                }
                let base = keel_index::read::balance_at(&mut *tx, chain, token, holder, at).await?;
                (at, base)
            }
        };
        let finalized = tip.is_some()
            && keel_index::read::finalized_block(&mut *tx, chain)
                .await?
                .is_some_and(|f| block <= f);
        let health = keel_index::read::chain_health(&mut *tx, chain).await?;
        tx.commit().await?;
        Ok(BalanceView {
            asset_id: id,
            address: holder,
            balance: format_amount(base_u, r.decimals)?,
            balance_base_units: base_u.to_string(),
            indexed_block: tip.unwrap_or(0),
            block,
            finalized,
            index_degraded: health.is_degraded(),
            index_rebuilding: health.is_rebuilding(),
        })
    }

    /// The open funding requests of the caller's operations, oldest first, optionally
    /// of one chain only (a chain id above `i64::MAX` names no chain: empty).
    ///
    /// # Errors
    /// [`OpsError::Store`] (the queue or the database failed).
    pub async fn funding_requests(
        &self,
        caller: Caller,
        chain_id: Option<u64>,
    ) -> Result<Vec<FundingRequestView>> {
        let open = keel_txq::funding_requests(&self.db, chain_id.map(ChainId))
            .await
            .map_err(txq_err)?;
        if open.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = open.iter().map(|r| r.request_id).collect();
        let owned = store::operation_tx_owned(&self.db, caller.organization_id, &ids).await?;
        Ok(open
            .into_iter()
            .filter_map(|request| {
                owned
                    .iter()
                    .find(|o| o.txq_request_id == request.request_id)
                    .map(|o| FundingRequestView {
                        operation_id: o.operation_id,
                        link: o.link.clone(),
                        request,
                    })
            })
            .collect())
    }

    /// The caller's queue requests held up `queued` behind their sender's open funding
    /// request (of every chain, or of `chain_id`), oldest first: with
    /// [`Self::funding_requests`], every request a funding wait blocks, not only the first.
    ///
    /// # Errors
    /// [`OpsError::Store`].
    pub async fn funding_queued_behind(
        &self,
        caller: Caller,
        chain_id: Option<u64>,
    ) -> Result<Vec<QueuedBehindFundingView>> {
        let blocked = keel_txq::funding_queued_behind(&self.db, chain_id.map(ChainId))
            .await
            .map_err(txq_err)?;
        if blocked.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids: Vec<Uuid> = blocked.iter().map(|r| r.request_id).collect();
        ids.extend(blocked.iter().map(|r| r.queued_behind));
        let owned = store::operation_tx_owned(&self.db, caller.organization_id, &ids).await?;
        let owner = |id: Uuid| owned.iter().find(|o| o.txq_request_id == id);
        Ok(blocked
            .into_iter()
            .filter_map(|request| {
                let own = owner(request.request_id)?;
                Some(QueuedBehindFundingView {
                    operation_id: own.operation_id,
                    link: own.link.clone(),
                    queued_behind: owner(request.queued_behind).map(|o| o.operation_id),
                    request,
                })
            })
            .collect())
    }

    /// The caller's asset templates ordered by id, after template `after` (exclusive)
    /// when given: at most `limit + 1`, so the caller can tell whether more follow.
    ///
    /// # Errors
    /// [`OpsError::Store`] (also for a stored row out of range).
    pub async fn templates(
        &self,
        caller: Caller,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<TemplateView>> {
        store::asset_template_list(
            &self.db,
            caller.organization_id,
            after,
            i64::from(limit) + 1,
        )
        .await?
        .into_iter()
        .map(|r| {
            Ok(TemplateView {
                template: crate::tenancy::Template::try_from(r.template)?,
                created_at: r.created_at,
                updated_at: r.updated_at,
            })
        })
        .collect()
    }

    async fn wait_block(&self, chain_id: ChainId, block: u64, wait: Duration) -> Result<()> {
        match keel_index::wait_for_block(
            &self.db,
            chain_id,
            block,
            wait.min(MAX_WAIT),
            Duration::from_millis(200),
        )
        .await
        {
            Ok(_) => Ok(()),
            // A degraded chain's index will not get there without an operator: say so
            // (issue 32 §2), not "behind".
            Err(keel_index::IndexError::WaitTimeout { .. }) => {
                match keel_index::read::chain_health(&self.db, chain_id).await {
                    Ok(h) if h.is_degraded() => Err(OpsError::IndexDegraded),
                    _ => Err(OpsError::IndexBehind),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn asset_view(&self, r: AssetRecord) -> Result<AssetView> {
        let chain = r.chain_id;
        let status = r.status();
        let mut view = AssetView {
            id: r.id,
            name: r.name.clone(),
            symbol: r.symbol.clone(),
            decimals: r.decimals,
            template_id: r.template_id.clone(),
            chain_id: r.chain_id,
            status,
            create_operation_id: r.create_operation_id,
            token_address: r.token,
            feed_address: r.feed,
            supply: None,
            paused: None,
            staleness_bound_seconds: None,
            latest_observation: None,
            indexed_block: None,
            index_degraded: false,
            index_rebuilding: false,
            issuer_address: r.issuer,
            created_at: r.created_at,
            updated_at: r.updated_at,
        };
        let mut tx = self.db.begin().await?;
        store::transaction_snapshot(&mut *tx).await?;
        view.indexed_block = keel_index::read::indexed_tip(&mut *tx, chain)
            .await?
            .map(|t| t.number);
        let health = keel_index::read::chain_health(&mut *tx, chain).await?;
        view.index_degraded = health.is_degraded();
        view.index_rebuilding = health.is_rebuilding();
        if let Some(token) = r.token {
            let supply = keel_index::token_supply(&mut *tx, chain, token).await?;
            view.supply = Some(format_amount(supply, r.decimals)?);
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

/// A queue failure as the service reports it (the queue's store failure as is; any
/// other as a decode failure: both answer "unavailable").
pub(crate) fn txq_err(e: keel_txq::TxqError) -> OpsError {
    match e {
        keel_txq::TxqError::Store(s) => OpsError::Store(s),
        _ => OpsError::Store(keel_store::StoreError::Decode),
    }
}
