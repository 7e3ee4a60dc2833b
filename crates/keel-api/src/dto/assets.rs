//! Assets and the ledger reads: an asset and its status, asset lists, price
//! observations, balances.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// The lifecycle of an asset (from its `asset.create` operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AssetStatus {
    /// Its creation is in progress; token operations answer `409 ASSET_NOT_READY`.
    Creating,
    /// Created; mintable.
    Active,
    /// Its creation failed or was cancelled.
    Failed,
}

/// An asset: identity from Keel's records, on-chain state from the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Asset {
    /// Asset id.
    pub id: Uuid,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// The template it was created from.
    pub template_id: String,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// `creating`, `active` or `failed`.
    pub status: AssetStatus,
    /// Its `asset.create` operation.
    pub create_operation_id: Option<Uuid>,
    /// The token contract (EIP-55 checksummed), once deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub token_address: Option<String>,
    /// The price feed contract (EIP-55 checksummed), once deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub feed_address: Option<String>,
    /// Total supply in token units (decimal string), from the index.
    pub supply: Option<String>,
    /// Whether the token is paused, from the index.
    pub paused: Option<bool>,
    /// The feed's staleness bound in seconds (decimal string), from the index.
    pub staleness_bound_seconds: Option<String>,
    /// The feed's latest observation, from the index.
    pub latest_observation: Option<Observation>,
    /// The index block this view reflects (null before the index saw the chain).
    pub indexed_block: Option<u64>,
    /// True when the Ledger Index of the asset's chain is degraded (the chain
    /// reorganized below its finalized block; ingest stopped): the index state shown
    /// may include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
    /// The issuer (EIP-55 checksummed): the account that sends every transaction of the
    /// asset and administers its token and feed. `transfer` moves tokens from this
    /// account's balance, so mint to it first. Null until the token is deployed.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub issuer_address: Option<String>,
    /// When the asset was accepted (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When Keel's record of the asset last changed (RFC 3339, UTC): addresses recorded,
    /// its creation's progress. Index state (supply, paused, observation) is not a
    /// change of the record; see `indexedBlock`.
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/assets`: one page of the caller's assets, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssetList {
    /// The assets of this page.
    pub data: Vec<Asset>,
    /// True when more assets follow this page.
    pub has_more: bool,
    /// Pass as `cursor` to get the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// A price observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Observation {
    /// The answer in the feed's decimals (signed integer string).
    pub answer: String,
    /// The round id (integer string).
    pub round_id: String,
    /// The round's timestamp, unix seconds (integer string).
    pub updated_at: String,
    /// The block of the observation.
    pub block: u64,
}

/// A holder's balance of an asset, from the Ledger Index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Balance {
    /// The asset.
    pub asset_id: Uuid,
    /// The holder (EIP-55 checksummed).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// Token units (decimal string with the token's decimals).
    pub balance: String,
    /// Base units (decimal integer string).
    pub balance_base_units: String,
    /// The indexed tip when the balance was read (0 when nothing is indexed yet).
    pub indexed_block: u64,
    /// The block the balance reflects: `atBlock` when given (every canonical transfer
    /// at or below it), else the indexed tip.
    pub block: u64,
    /// True when `block` is at or below the chain's finalized block: the balance can
    /// no longer change. False: a reorg may still replace blocks up to `block`.
    pub finalized: bool,
    /// True when the Ledger Index of the asset's chain is degraded: the balance may
    /// include orphaned blocks until an operator re-indexes the chain.
    pub index_degraded: bool,
    /// True while an operator's re-index rebuilds the chain's Ledger Index (`keel index
    /// reindex`, `POST /v1/chains/{chain}/index/reindex`): rows may be missing until
    /// it is done.
    pub index_rebuilding: bool,
}
