//! The typed state of a request (`txq_request.state`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a request is in its lifecycle: every value `txq_request.state` takes
/// (`migrations/0005_txq.sql`, `waiting_funding` from `0008_txq_funding.sql`; the crate
/// docs' lifecycle table says who moves a request in and out of each). Serialized, and
/// stored, as the snake_case name (`"waiting_funding"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestState {
    /// Recorded, no nonce yet.
    Queued,
    /// The sender cannot pay and the request has a funding pause; no nonce.
    WaitingFunding,
    /// A nonce is assigned and the signed raw transaction is persisted; it may not have
    /// reached a node.
    Signed,
    /// A node accepted an attempt (or said it already knew it).
    Broadcast,
    /// The verdict is final.
    Settled,
}

impl RequestState {
    /// Every state, in lifecycle order.
    pub const ALL: [RequestState; 5] = [
        RequestState::Queued,
        RequestState::WaitingFunding,
        RequestState::Signed,
        RequestState::Broadcast,
        RequestState::Settled,
    ];

    /// The stored name: `queued`, `waiting_funding`, `signed`, `broadcast`, `settled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RequestState::Queued => "queued",
            RequestState::WaitingFunding => "waiting_funding",
            RequestState::Signed => "signed",
            RequestState::Broadcast => "broadcast",
            RequestState::Settled => "settled",
        }
    }

    /// True for `signed` and `broadcast`: a nonce is held and an attempt may be in a
    /// node's pool.
    pub const fn is_in_flight(self) -> bool {
        matches!(self, RequestState::Signed | RequestState::Broadcast)
    }
}

impl fmt::Display for RequestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a [`RequestState`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown request state")]
pub struct UnknownRequestState;

impl FromStr for RequestState {
    type Err = UnknownRequestState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RequestState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or(UnknownRequestState)
    }
}

// `txq_request.state` (migration 0005's CHECK list): decoded at the row, an unknown
// text a decode error naming the column.
keel_store::text_column!(RequestState, "txq_request.state");

#[cfg(test)]
mod tests {
    use super::RequestState;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for st in RequestState::ALL {
            assert_eq!(st.as_str().parse::<RequestState>(), Ok(st));
            let json = serde_json::to_string(&st).unwrap();
            assert_eq!(json, format!("\"{}\"", st.as_str()));
            assert_eq!(serde_json::from_str::<RequestState>(&json).unwrap(), st);
        }
        assert!("Settled".parse::<RequestState>().is_err());
    }
}
