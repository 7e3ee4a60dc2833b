//! Decoding of scoped logs into projection rows (pure; no I/O).

use crate::scope::ScopeKind;
use alloy::primitives::{Address, B256, U256};
use alloy::rpc::types::Log;
use alloy::sol_types::SolEvent;
use keel_abi::bindings::{
    AssetFactory, AssetToken, Directory, PriceFeed, PriceFeedFactory, PriceResolver,
};

/// One projected event, decoded from a log of a scoped contract of the right kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Projection {
    Transfer {
        token: Address,
        from: Address,
        to: Address,
        value: U256,
    },
    Asset {
        factory: Address,
        asset_id: B256,
        token: Address,
        symbol: String,
        decimals: u8,
    },
    FeedCreated {
        feed: Address,
    },
    Observation {
        feed: Address,
        round_id: U256,
        answer: String,
        updated_at: U256,
    },
    EntryChanged {
        directory: Address,
        name: B256,
        value: Address,
    },
    EntryRemoved {
        directory: Address,
        name: B256,
    },
    Pause {
        token: Address,
        paused: bool,
    },
    StalenessBound {
        resolver: Address,
        feed: Address,
        bound: Option<U256>,
    },
}

impl Projection {
    /// A contract this event brings into the scope (a new token or feed).
    pub(crate) fn discovers(&self) -> Option<(Address, ScopeKind)> {
        match self {
            Self::Asset { token, .. } => Some((*token, ScopeKind::AssetToken)),
            Self::FeedCreated { feed } => Some((*feed, ScopeKind::PriceFeed)),
            _ => None,
        }
    }
}

/// Decodes `log` emitted by a contract of `kind`; `None` for events that are not
/// projected (kept as raw logs only) or that do not decode.
pub(crate) fn decode(kind: ScopeKind, log: &Log) -> Option<Projection> {
    let address = log.inner.address;
    let data = &log.inner.data;
    let topic0 = *data.topics().first()?;
    match kind {
        ScopeKind::AssetToken if topic0 == AssetToken::Transfer::SIGNATURE_HASH => {
            let e = AssetToken::Transfer::decode_log_data(data).ok()?;
            Some(Projection::Transfer {
                token: address,
                from: e.from,
                to: e.to,
                value: e.value,
            })
        }
        ScopeKind::AssetToken if topic0 == AssetToken::Paused::SIGNATURE_HASH => {
            Some(Projection::Pause {
                token: address,
                paused: true,
            })
        }
        ScopeKind::AssetToken if topic0 == AssetToken::Unpaused::SIGNATURE_HASH => {
            Some(Projection::Pause {
                token: address,
                paused: false,
            })
        }
        ScopeKind::PriceResolver if topic0 == PriceResolver::StalenessBoundSet::SIGNATURE_HASH => {
            let e = PriceResolver::StalenessBoundSet::decode_log_data(data).ok()?;
            Some(Projection::StalenessBound {
                resolver: address,
                feed: e.feed,
                bound: Some(e.boundSeconds),
            })
        }
        ScopeKind::PriceResolver
            if topic0 == PriceResolver::StalenessBoundCleared::SIGNATURE_HASH =>
        {
            let e = PriceResolver::StalenessBoundCleared::decode_log_data(data).ok()?;
            Some(Projection::StalenessBound {
                resolver: address,
                feed: e.feed,
                bound: None,
            })
        }
        ScopeKind::AssetFactory if topic0 == AssetFactory::AssetCreated::SIGNATURE_HASH => {
            let e = AssetFactory::AssetCreated::decode_log_data(data).ok()?;
            Some(Projection::Asset {
                factory: address,
                asset_id: e.assetId,
                token: e.token,
                symbol: e.symbol,
                decimals: e.decimals,
            })
        }
        ScopeKind::PriceFeedFactory if topic0 == PriceFeedFactory::FeedCreated::SIGNATURE_HASH => {
            let e = PriceFeedFactory::FeedCreated::decode_log_data(data).ok()?;
            Some(Projection::FeedCreated { feed: e.feed })
        }
        ScopeKind::PriceFeed if topic0 == PriceFeed::AnswerUpdated::SIGNATURE_HASH => {
            let e = PriceFeed::AnswerUpdated::decode_log_data(data).ok()?;
            Some(Projection::Observation {
                feed: address,
                round_id: e.roundId,
                answer: e.current.to_string(),
                updated_at: e.updatedAt,
            })
        }
        ScopeKind::Directory if topic0 == Directory::EntryChanged::SIGNATURE_HASH => {
            let e = Directory::EntryChanged::decode_log_data(data).ok()?;
            Some(Projection::EntryChanged {
                directory: address,
                name: e.name,
                value: e.current,
            })
        }
        ScopeKind::Directory if topic0 == Directory::EntryRemoved::SIGNATURE_HASH => {
            let e = Directory::EntryRemoved::decode_log_data(data).ok()?;
            Some(Projection::EntryRemoved {
                directory: address,
                name: e.name,
            })
        }
        _ => None,
    }
}
