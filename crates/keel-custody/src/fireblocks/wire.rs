//! Fireblocks' JSON shapes (camelCase, as the REST API sends them) and their mapping
//! into the seam's types.

use alloy_primitives::Address;
use serde::{Deserialize, Serialize};

use crate::error::CustodyError;
use crate::types::{
    BlockInfo, ContractCall, ExternalTxId, ProviderTransaction, ProviderTxId, SubStatus, TxStatus,
    format_native_amount, parse_tx_hash,
};

/// Upper bound on a note's length in characters.
pub const MAX_NOTE_LEN: usize = 1000;

/// `POST /v1/transactions` body of a contract call.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateTransactionBody<'a> {
    operation: &'static str,
    asset_id: &'a str,
    source: Source<'a>,
    destination: Destination,
    amount: String,
    extra_parameters: ExtraParameters,
    external_tx_id: &'a str,
    note: String,
}

#[derive(Debug, Serialize)]
struct Source<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Destination {
    #[serde(rename = "type")]
    kind: &'static str,
    one_time_address: OneTimeAddress,
}

#[derive(Debug, Serialize)]
struct OneTimeAddress {
    address: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExtraParameters {
    contract_call_data: String,
}

impl<'a> CreateTransactionBody<'a> {
    pub(crate) fn contract_call(call: &'a ContractCall) -> Self {
        Self {
            operation: "CONTRACT_CALL",
            asset_id: call.asset.as_str(),
            source: Source {
                kind: "VAULT_ACCOUNT",
                id: call.vault.as_str(),
            },
            destination: Destination {
                kind: "ONE_TIME_ADDRESS",
                one_time_address: OneTimeAddress {
                    address: call.to.to_checksum(None),
                },
            },
            amount: format_native_amount(call.value),
            extra_parameters: ExtraParameters {
                contract_call_data: format!("0x{}", hex::encode(&call.calldata)),
            },
            external_tx_id: call.external_tx_id.as_str(),
            note: call.note.chars().take(MAX_NOTE_LEN).collect(),
        }
    }
}

/// `POST /v1/transactions` answer.
#[derive(Debug, Deserialize)]
pub(crate) struct CreateTransactionResponse {
    pub(crate) id: String,
    pub(crate) status: TxStatus,
}

/// `POST /v1/transactions/{id}/cancel` answer.
#[derive(Debug, Deserialize)]
pub(crate) struct CancelResponse {
    pub(crate) success: bool,
}

/// A Fireblocks error answer: `{"message": "...", "code": N}`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorResponse {
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default)]
    pub(crate) code: Option<i64>,
}

/// A transaction as `GET /v1/transactions/{id}` and webhook `data` carry it (the fields
/// Keel reads; others are ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionResponse {
    id: String,
    #[serde(default)]
    external_tx_id: Option<String>,
    status: TxStatus,
    #[serde(default)]
    sub_status: Option<String>,
    #[serde(default)]
    tx_hash: Option<String>,
    #[serde(default)]
    source_address: Option<String>,
    #[serde(default)]
    destination_address: Option<String>,
    #[serde(default)]
    num_of_confirmations: Option<u64>,
    #[serde(default)]
    block_info: Option<BlockInfoResponse>,
    #[serde(default)]
    created_at: Option<u64>,
    #[serde(default)]
    last_updated: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockInfoResponse {
    #[serde(default)]
    block_height: Option<String>,
    #[serde(default)]
    block_hash: Option<String>,
}

fn address(text: Option<String>, what: &'static str) -> Result<Option<Address>, CustodyError> {
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse::<Address>()
            .map(Some)
            .map_err(|_| CustodyError::Decode { what }),
    }
}

impl TransactionResponse {
    /// Maps the wire shape into the seam's typed view.
    ///
    /// # Errors
    /// [`CustodyError::Decode`] for an id, hash or address that does not parse.
    pub fn into_typed(self) -> Result<ProviderTransaction, CustodyError> {
        let block = match self.block_info {
            Some(BlockInfoResponse {
                block_height: Some(height),
                block_hash: Some(hash),
            }) if !height.is_empty() && !hash.is_empty() => Some(BlockInfo {
                number: height.parse().map_err(|_| CustodyError::Decode {
                    what: "blockInfo.blockHeight",
                })?,
                hash: parse_tx_hash(&hash)?.ok_or(CustodyError::Decode {
                    what: "blockInfo.blockHash",
                })?,
            }),
            _ => None,
        };
        Ok(ProviderTransaction {
            id: ProviderTxId::new(self.id).map_err(|_| CustodyError::Decode { what: "id" })?,
            external_tx_id: match self.external_tx_id.filter(|e| !e.is_empty()) {
                Some(e) => Some(ExternalTxId::new(e).map_err(|_| CustodyError::Decode {
                    what: "externalTxId",
                })?),
                None => None,
            },
            status: self.status,
            sub_status: self
                .sub_status
                .filter(|s| !s.is_empty())
                .map(|s| SubStatus::parse(&s)),
            tx_hash: match self.tx_hash {
                Some(h) => parse_tx_hash(&h)?,
                None => None,
            },
            source_address: address(self.source_address, "sourceAddress")?,
            destination_address: address(self.destination_address, "destinationAddress")?,
            confirmations: self.num_of_confirmations,
            block,
            created_at_ms: self.created_at,
            last_updated_ms: self.last_updated,
        })
    }
}
