//! What several test modules share: the plain value transfer they enqueue.

use alloy::primitives::{Address, Bytes, U256};
use keel_txq::TxRequest;
use keel_units::Wei;

/// A plain value transfer by `sender` under the idempotency key `key`: 1 wei to
/// `0x4242…42`, gas limit 21,000 (so nothing is estimated), no calldata, no
/// authorizations. [`Transfer`] changes a field.
pub(crate) fn transfer(sender: Address, key: &str) -> TxRequest {
    TxRequest {
        sender,
        idempotency_key: key.to_owned(),
        to: Some(Address::repeat_byte(0x42)),
        value: Wei::new(U256::from(1u64)),
        data: Bytes::new(),
        gas_limit: Some(21_000),
        authorization_list: Vec::new(),
    }
}

/// Changes to a [`transfer`], chained: `transfer(s, "k").worth(5).gas(None)`.
pub(crate) trait Transfer {
    /// The value sent, wei.
    fn worth(self, wei: u64) -> Self;
    /// The gas limit; `None` lets the queue estimate it.
    fn gas(self, limit: Option<u64>) -> Self;
    /// The recipient.
    fn to(self, to: Address) -> Self;
}

impl Transfer for TxRequest {
    fn worth(self, wei: u64) -> Self {
        Self {
            value: Wei::new(U256::from(wei)),
            ..self
        }
    }

    fn gas(self, limit: Option<u64>) -> Self {
        Self {
            gas_limit: limit,
            ..self
        }
    }

    fn to(self, to: Address) -> Self {
        Self {
            to: Some(to),
            ..self
        }
    }
}
