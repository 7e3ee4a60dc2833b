//! Decoding of scoped logs into projection rows (pure; no I/O).

use crate::scope::ScopeKind;
use alloy::primitives::{Address, B256, U256};
use alloy::rpc::types::Log;
use alloy::sol_types::SolEvent;
use keel_abi::bindings::{
    AssetFactory, AssetToken, Directory, PriceFeed, PriceFeedFactory, PriceResolver, RegulatedToken,
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
    /// A RegulatedToken freeze event → `index_freeze_event`.
    Freeze {
        token: Address,
        change: FreezeChange,
    },
}

/// One RegulatedToken event that changes a holder's frozen state (amounts in token base
/// units). Stored in `index_freeze_event` and folded in chain order on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FreezeChange {
    /// `AddressFrozenSet(account, frozen, agent)`: the whole address (un)frozen.
    Address { account: Address, frozen: bool },
    /// `TokensFrozen(account, amount)`: `amount` more of the balance frozen.
    Freeze { account: Address, amount: U256 },
    /// `TokensUnfrozen(account, amount)`: `amount` of the frozen balance released
    /// (also emitted by `forcedTransfer` for the frozen tokens it moves).
    Unfreeze { account: Address, amount: U256 },
    /// `RecoverySuccess(lost, replacement, agent)`: `lost`'s frozen amount is added to
    /// `replacement`'s, `replacement` is frozen if `lost` was, `lost` is cleared.
    Recovery { lost: Address, replacement: Address },
}

impl FreezeChange {
    /// The stored `kind` (`index_freeze_event.kind`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Address { .. } => "address",
            Self::Freeze { .. } => "freeze",
            Self::Unfreeze { .. } => "unfreeze",
            Self::Recovery { .. } => "recovery",
        }
    }

    /// The stored `account` (the lost wallet of a recovery).
    pub(crate) fn account(&self) -> Address {
        match *self {
            Self::Address { account, .. }
            | Self::Freeze { account, .. }
            | Self::Unfreeze { account, .. } => account,
            Self::Recovery { lost, .. } => lost,
        }
    }
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
        ScopeKind::AssetToken if topic0 == RegulatedToken::AddressFrozenSet::SIGNATURE_HASH => {
            let e = RegulatedToken::AddressFrozenSet::decode_log_data(data).ok()?;
            freeze(
                address,
                FreezeChange::Address {
                    account: e.account,
                    frozen: e.frozen,
                },
            )
        }
        ScopeKind::AssetToken if topic0 == RegulatedToken::TokensFrozen::SIGNATURE_HASH => {
            let e = RegulatedToken::TokensFrozen::decode_log_data(data).ok()?;
            freeze(
                address,
                FreezeChange::Freeze {
                    account: e.account,
                    amount: e.amount,
                },
            )
        }
        ScopeKind::AssetToken if topic0 == RegulatedToken::TokensUnfrozen::SIGNATURE_HASH => {
            let e = RegulatedToken::TokensUnfrozen::decode_log_data(data).ok()?;
            freeze(
                address,
                FreezeChange::Unfreeze {
                    account: e.account,
                    amount: e.amount,
                },
            )
        }
        ScopeKind::AssetToken if topic0 == RegulatedToken::RecoverySuccess::SIGNATURE_HASH => {
            let e = RegulatedToken::RecoverySuccess::decode_log_data(data).ok()?;
            freeze(
                address,
                FreezeChange::Recovery {
                    lost: e.lost,
                    replacement: e.replacement,
                },
            )
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

fn freeze(token: Address, change: FreezeChange) -> Option<Projection> {
    Some(Projection::Freeze { token, change })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::{LogData, address};

    const TOKEN: Address = address!("0x00000000000000000000000000000000000000aa");
    const A: Address = address!("0x000000000000000000000000000000000000000a");
    const B: Address = address!("0x000000000000000000000000000000000000000b");
    const AGENT: Address = address!("0x00000000000000000000000000000000000000ee");

    fn log(data: LogData) -> Log {
        Log {
            inner: alloy::primitives::Log {
                address: TOKEN,
                data,
            },
            ..Log::default()
        }
    }

    #[test]
    fn regulated_token_freeze_events_decode_under_asset_token() {
        let amount = U256::from(1_234_u64);
        let cases = [
            (
                RegulatedToken::AddressFrozenSet {
                    account: A,
                    frozen: true,
                    agent: AGENT,
                }
                .encode_log_data(),
                FreezeChange::Address {
                    account: A,
                    frozen: true,
                },
            ),
            (
                RegulatedToken::TokensFrozen { account: A, amount }.encode_log_data(),
                FreezeChange::Freeze { account: A, amount },
            ),
            (
                RegulatedToken::TokensUnfrozen { account: A, amount }.encode_log_data(),
                FreezeChange::Unfreeze { account: A, amount },
            ),
            (
                RegulatedToken::RecoverySuccess {
                    lost: A,
                    replacement: B,
                    agent: AGENT,
                }
                .encode_log_data(),
                FreezeChange::Recovery {
                    lost: A,
                    replacement: B,
                },
            ),
        ];
        for (data, change) in cases {
            let l = log(data);
            assert_eq!(
                decode(ScopeKind::AssetToken, &l),
                Some(Projection::Freeze {
                    token: TOKEN,
                    change
                })
            );
            // Not projected for a contract of another kind.
            assert_eq!(decode(ScopeKind::Directory, &l), None);
        }
    }

    #[test]
    fn a_truncated_freeze_event_is_not_projected() {
        let mut data = RegulatedToken::TokensFrozen {
            account: A,
            amount: U256::from(1),
        }
        .encode_log_data();
        let topics = data.topics().to_vec();
        data = LogData::new_unchecked(topics, Default::default());
        assert_eq!(decode(ScopeKind::AssetToken, &log(data)), None);
    }
}
