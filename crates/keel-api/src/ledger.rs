//! The Ledger read API of an asset (issue 18 §3): its wire shapes and handlers.
//!
//! | route | service call | answer |
//! |---|---|---|
//! | `GET /v1/assets/{id}/holders` (`?atBlock=N&limit=&cursor=`) | `Ops::holders` | [`HolderList`] |
//! | `GET /v1/assets/{id}/transfers` (`?limit=&cursor=`) | `Ops::transfers` | [`TokenTransferList`] |
//! | `GET /v1/assets/{id}/holders/{address}/transfers` (same) | `Ops::transfers` of one holder | [`TokenTransferList`] |
//! | `GET /v1/assets/{id}/supply` (`?atBlock=N`) | `Ops::supply` | [`Supply`] |
//!
//! Lists use the shared cursor pagination ([`crate::page`]): keyset cursors, never
//! offsets. A holders cursor carries the block of its first page, so walking a list
//! read at the tip stays on that block while the chain moves on; `atBlock` with a
//! cursor of another block is `400 INVALID_CURSOR`. `atBlock` above the indexed tip
//! is `409 BLOCK_NOT_INDEXED`; a block above the chain's finalized block is answered
//! with `finalized: false`. Addresses are EIP-55 checksummed, block times RFC 3339 UTC.

use crate::ApiState;
use crate::extract::{Authed, RawPath, parse_address, parse_id};
use crate::handlers::{int64_query, query};
use crate::page::{Page, PageParams};
use crate::problem::Problem;
use alloy_primitives::{Address, U256};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_workflows::{HolderView, SupplyView, TransferView};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, IntoResponses, ToSchema};
use uuid::Uuid;

/// One holder of an asset with its balance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Holder {
    /// The holder (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// Token units (decimal string with the token's decimals).
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$")]
    pub balance: String,
    /// Base units (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub balance_base_units: String,
    /// The part of the balance that cannot move (frozen by an agent of a regulated
    /// asset: `POST /v1/assets/{id}/freeze` with `amount`), token units; `"0"` when none.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$")]
    pub frozen_balance: String,
    /// The same, base units (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub frozen_balance_base_units: String,
    /// True when the whole address is frozen: it can neither send nor receive.
    pub frozen: bool,
}

/// `GET /v1/assets/{id}/holders`: a page of holders as of one block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HolderList {
    /// Holders with a positive balance, by balance descending, then address ascending.
    pub data: Vec<Holder>,
    /// True when more holders follow this page.
    pub has_more: bool,
    /// Pass as `cursor` for the next page (same block); null exactly when `hasMore` is
    /// false.
    pub next_cursor: Option<String>,
    /// The asset.
    pub asset_id: Uuid,
    /// The block the balances reflect: `atBlock`, else the indexed tip when the first
    /// page was read. Balances count every canonical transfer at or below it.
    pub block: u64,
    /// True when `block` is at or below the chain's finalized block: the snapshot can
    /// no longer change. False: a reorg may still replace blocks up to `block`.
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded: balances may
    /// include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
}

/// One ERC-20 `Transfer` of an asset's token (a mint comes from the zero address, a
/// burn goes to it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenTransfer {
    /// Block number.
    pub block_number: u64,
    /// The block's timestamp (RFC 3339, UTC); null when the index does not have it
    /// (rows indexed before block times were recorded).
    pub block_time: Option<DateTime<Utc>>,
    /// Block hash.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub block_hash: String,
    /// Transaction hash.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub tx_hash: String,
    /// Log index within the block.
    pub log_index: u64,
    /// Sender (EIP-55 checksummed; the zero address for a mint).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub from: String,
    /// Receiver (EIP-55 checksummed; the zero address for a burn).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub to: String,
    /// Token units (decimal string with the token's decimals).
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$")]
    pub amount: String,
    /// Base units (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub amount_base_units: String,
}

/// `GET /v1/assets/{id}/transfers` and `…/holders/{address}/transfers`: a page of
/// transfers, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenTransferList {
    /// Transfers by block number, then log index, descending.
    pub data: Vec<TokenTransfer>,
    /// True when older transfers follow this page.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
    /// The asset.
    pub asset_id: Uuid,
    /// The indexed tip this page was read at (0 when nothing is indexed yet).
    pub indexed_block: u64,
    /// True when the Ledger Index of the asset's chain is degraded.
    pub index_degraded: bool,
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
}

/// `GET /v1/assets/{id}/supply`: the total supply as of one block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Supply {
    /// The asset.
    pub asset_id: Uuid,
    /// The block the supply reflects: `atBlock`, else the indexed tip.
    pub block: u64,
    /// As in [`HolderList`]: true when `block` is at or below the finalized block.
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded.
    pub index_degraded: bool,
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
    /// Mints minus burns at or below `block`, token units (decimal string).
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$")]
    pub supply: String,
    /// The same in base units (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub supply_base_units: String,
}

/// Errors of the Ledger reads (for the OpenAPI document).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum LedgerErrors {
    /// `INVALID_QUERY` (`atBlock` not an integer from 0 to 2^63-1, `limit` outside
    /// 1..=200), `INVALID_CURSOR` (not a `nextCursor` of this list, or of another
    /// `atBlock`).
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such asset in the caller's organization.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `ASSET_NOT_READY` (the token does not exist yet), `BLOCK_NOT_INDEXED` (`atBlock`
    /// above the indexed tip, or nothing indexed yet).
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// `INVALID_ADDRESS` (the holder in the path).
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// `INDEX_UNAVAILABLE`, `SERVICE_UNAVAILABLE`; retryable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// Query of the holders list (its pagination is [`PageParams`]).
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(crate) struct HoldersQuery {
    /// The record date: balances as of this block (every canonical transfer at or
    /// below it). Default: the indexed tip. Above the indexed tip: `409
    /// BLOCK_NOT_INDEXED`.
    at_block: Option<u64>,
}

/// Query of the supply read.
#[derive(Debug, Clone, Copy, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(crate) struct SupplyQuery {
    /// Supply as of this block. Default: the indexed tip. Above it: `409
    /// BLOCK_NOT_INDEXED`.
    at_block: Option<u64>,
}

/// The keyset of a holders page: (block, balance in base units, holder).
type HolderCursor = (u64, String, Address);

fn bad_cursor() -> Problem {
    Problem::bad_request(
        "INVALID_CURSOR",
        "cursor is not one this list returned; pass nextCursor back unchanged",
    )
}

pub(crate) fn holder(h: HolderView) -> Holder {
    Holder {
        address: h.address.to_checksum(None),
        balance: h.balance,
        balance_base_units: h.balance_base_units.to_string(),
        frozen_balance: h.frozen_balance,
        frozen_balance_base_units: h.frozen_balance_base_units.to_string(),
        frozen: h.frozen,
    }
}

fn transfer(t: TransferView) -> TokenTransfer {
    TokenTransfer {
        block_number: t.block_number,
        block_time: t.block_time,
        block_hash: t.block_hash.to_string(),
        tx_hash: t.tx_hash.to_string(),
        log_index: t.log_index,
        from: t.from.to_checksum(None),
        to: t.to.to_checksum(None),
        amount: t.amount,
        amount_base_units: t.amount_base_units.to_string(),
    }
}

impl From<SupplyView> for Supply {
    fn from(s: SupplyView) -> Self {
        Self {
            asset_id: s.asset_id,
            block: s.block,
            finalized: s.finalized,
            index_degraded: s.index_degraded,
            index_rebuilding: s.index_rebuilding,
            supply: s.supply,
            supply_base_units: s.supply_base_units.to_string(),
        }
    }
}

/// The holders of an asset with their balances, by balance descending (ties by
/// address), at the indexed tip or as of a record date (`atBlock`): the snapshot a
/// dividend, coupon or redemption needs. Exact and reorg-safe: computed from the
/// canonical transfers at or below the block.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/holders",
    tag = "assets",
    operation_id = "listHolders",
    params(("id" = Uuid, Path, description = "Asset id"), HoldersQuery, PageParams),
    responses(
        (status = 200, description = "A page of holders as of `block`.", body = HolderList),
        LedgerErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn holders(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    q: Result<Query<HoldersQuery>, QueryRejection>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let q = query(q)?;
    int64_query(q.at_block)?;
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let id = parse_id(&id, "asset")?;
    let (at_block, after) = match page.cursor::<HolderCursor>()? {
        None => (q.at_block, None),
        Some((block, balance, holder)) => {
            let balance = U256::from_str_radix(&balance, 10).map_err(|_| bad_cursor())?;
            if q.at_block.is_some_and(|b| b != block) || i64::try_from(block).is_err() {
                return Err(bad_cursor());
            }
            (Some(block), Some((balance, holder)))
        }
    };
    let view = state
        .ops()
        .holders(caller, id, at_block, after, limit + 1)
        .await?;
    let block = view.block;
    let page = Page::from_rows(view.holders, limit, |h| -> HolderCursor {
        (block, h.balance_base_units.to_string(), h.address)
    })
    .map(holder);
    Ok(Json(HolderList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        asset_id: view.asset_id,
        block,
        finalized: view.finalized,
        index_degraded: view.index_degraded,
        index_rebuilding: view.index_rebuilding,
    })
    .into_response())
}

async fn transfer_list(
    state: &ApiState,
    caller: keel_workflows::Caller,
    id: Uuid,
    holder: Option<Address>,
    page: PageParams,
) -> Result<Response, Problem> {
    let limit = page.limit()?;
    let before = match page.cursor::<(u64, u64)>()? {
        None => None,
        Some((block, log)) => {
            if i64::try_from(block).is_err() || i64::try_from(log).is_err() {
                return Err(bad_cursor());
            }
            Some((block, log))
        }
    };
    let view = state
        .ops()
        .transfers(caller, id, holder, before, limit + 1)
        .await?;
    let page =
        Page::from_rows(view.transfers, limit, |t| (t.block_number, t.log_index)).map(transfer);
    Ok(Json(TokenTransferList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        asset_id: view.asset_id,
        indexed_block: view.indexed_block,
        index_degraded: view.index_degraded,
        index_rebuilding: view.index_rebuilding,
    })
    .into_response())
}

/// The transfers of an asset's token (mints and burns included), newest first, with
/// block, block time, transaction hash and log index.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/transfers",
    tag = "assets",
    operation_id = "listTransfers",
    params(("id" = Uuid, Path, description = "Asset id"), PageParams),
    responses(
        (status = 200, description = "A page of transfers, newest first.", body = TokenTransferList),
        LedgerErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn transfers(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let id = parse_id(&id, "asset")?;
    transfer_list(&state, caller, id, None, page).await
}

/// The transfers of one holder (as sender or receiver), newest first.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/holders/{address}/transfers",
    tag = "assets",
    operation_id = "listHolderTransfers",
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("address" = String, Path, description = "Holder: `0x` + 40 hex digits (mixed case must be a valid EIP-55 checksum)"),
        PageParams,
    ),
    responses(
        (status = 200, description = "A page of the holder's transfers, newest first.", body = TokenTransferList),
        LedgerErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn holder_transfers(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, address)): RawPath<(String, String)>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let id = parse_id(&id, "asset")?;
    let holder = parse_address(&address, "address")?;
    transfer_list(&state, caller, id, Some(holder), page).await
}

/// The total supply of an asset (mints minus burns) at the indexed tip or as of a
/// block.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/supply",
    tag = "assets",
    operation_id = "getSupply",
    params(("id" = Uuid, Path, description = "Asset id"), SupplyQuery),
    responses(
        (status = 200, description = "The supply as of `block`.", body = Supply),
        LedgerErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn supply(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    q: Result<Query<SupplyQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let q = query(q)?;
    int64_query(q.at_block)?;
    let id = parse_id(&id, "asset")?;
    let view = state.ops().supply(caller, id, q.at_block).await?;
    Ok(Json(Supply::from(view)).into_response())
}
