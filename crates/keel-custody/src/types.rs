//! The typed vocabulary of a custody provider: identifiers, statuses, sub-statuses,
//! hashes, the contract-call request and the provider's view of a transaction.
//!
//! Every enum that mirrors a provider string is closed with an `Unknown(String)` arm: a
//! value a newer provider version adds is kept verbatim, never mistaken for a known one.

use std::fmt;

use alloy_primitives::{Address, B256, Bytes, U256};

use crate::error::CustodyError;

/// Upper bound on an identifier's length in bytes (provider ids, external ids, vault and
/// asset ids). Fireblocks' own ids are UUIDs (36 bytes); 255 leaves room for prefixes.
pub const MAX_ID_LEN: usize = 255;

fn check_id(what: &'static str, value: &str) -> Result<(), CustodyError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_ID_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(CustodyError::InvalidInput { what })
    }
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps an identifier: 1..=[`MAX_ID_LEN`] bytes of
            /// `[A-Za-z0-9._:-]` (safe as one URL path segment).
            ///
            /// # Errors
            /// [`CustodyError::InvalidInput`] otherwise (the value is not echoed).
            pub fn new(value: impl Into<String>) -> Result<Self, CustodyError> {
                let value = value.into();
                check_id($what, &value)?;
                Ok(Self(value))
            }

            /// The identifier as the provider spells it.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }
    };
}

id_type!(
    /// The provider's id of a transaction (Fireblocks: a UUID assigned at create).
    ProviderTxId,
    "provider transaction id"
);
id_type!(
    /// Keel's idempotency key at the provider (Fireblocks `externalTxId`): the provider
    /// refuses a second create with the same value, and a transaction can be looked up
    /// by it. Keel derives it from a request's stable id and its resubmission number
    /// ([`ExternalTxId::derive`]) and persists it before the create call.
    ExternalTxId,
    "external transaction id"
);
id_type!(
    /// A vault account at the provider (Fireblocks: a decimal number as a string).
    VaultAccountId,
    "vault account id"
);
id_type!(
    /// The provider's asset id for a chain's native coin (Fireblocks: `ETH`,
    /// `ETH_TEST5`, `BASECHAIN_ETH`, …), configured per chain.
    AssetId,
    "asset id"
);

impl ExternalTxId {
    /// The deterministic external id of attempt `resubmission` (0 for the first create)
    /// of the request whose stable id is `stable_id`: `keel.<stable_id>.<resubmission>`.
    /// The same inputs always give the same id, so a replay after a crash finds the
    /// transaction it created; a resubmission after a confirmed cancel gets the next one.
    ///
    /// # Errors
    /// [`CustodyError::InvalidInput`] when `stable_id` has characters outside
    /// `[A-Za-z0-9._:-]` or the result would exceed [`MAX_ID_LEN`].
    pub fn derive(stable_id: &str, resubmission: u32) -> Result<Self, CustodyError> {
        Self::new(format!("keel.{stable_id}.{resubmission}"))
    }
}

macro_rules! string_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
            /// A value this version of Keel does not know, kept verbatim.
            Unknown(String),
        }

        impl $name {
            /// Parses the provider's spelling; an unknown value becomes `Unknown`.
            pub fn parse(text: &str) -> Self {
                match text {
                    $($text => Self::$variant,)*
                    other => Self::Unknown(other.to_owned()),
                }
            }

            /// The provider's spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)*
                    Self::Unknown(other) => other,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                Ok(Self::parse(&text))
            }
        }
    };
}

string_enum!(
    /// A provider transaction's status, the known variants spelled as Fireblocks spells
    /// its `status` (terminal: `COMPLETED`, `CANCELLED`, `BLOCKED`, `REJECTED`,
    /// `FAILED`); a status outside that list (a newer Fireblocks, or another provider)
    /// is kept verbatim in `Unknown`. What a status means (its [`StatusPhase`], rank and
    /// [`Ending`]) is the provider's to say: [`CustodyProvider`](crate::CustodyProvider)'s
    /// status methods.
    TxStatus {
        /// Accepted by the provider, not yet processed.
        Submitted = "SUBMITTED",
        /// Anti-money-laundering screening.
        PendingAmlScreening = "PENDING_AML_SCREENING",
        /// Enrichment (travel rule and similar).
        PendingEnrichment = "PENDING_ENRICHMENT",
        /// Waiting for approvers under the workspace's policy (an approval at the provider).
        PendingAuthorization = "PENDING_AUTHORIZATION",
        /// Queued behind the vault account's earlier transactions.
        Queued = "QUEUED",
        /// Waiting for the signers.
        PendingSignature = "PENDING_SIGNATURE",
        /// Waiting for a third party's manual approval.
        Pending3rdPartyManualApproval = "PENDING_3RD_PARTY_MANUAL_APPROVAL",
        /// Waiting for a third party.
        Pending3rdParty = "PENDING_3RD_PARTY",
        /// Signed, being broadcast.
        Broadcasting = "BROADCASTING",
        /// On chain, waiting for the provider's confirmation count (`txHash` set).
        Confirming = "CONFIRMING",
        /// Confirmed by the provider (terminal; Keel still checks depth on chain).
        Completed = "COMPLETED",
        /// A cancel is in progress.
        Cancelling = "CANCELLING",
        /// Cancelled before broadcast (terminal).
        Cancelled = "CANCELLED",
        /// Blocked by a policy rule (terminal).
        Blocked = "BLOCKED",
        /// Rejected by an approver, a signer or screening (terminal).
        Rejected = "REJECTED",
        /// Failed, before or after broadcast (terminal; a revert is `FAILED`).
        Failed = "FAILED",
    }
);

/// Where a status stands, provider-neutrally, for the decisions Keel takes on it: each
/// provider maps its statuses here ([`CustodyProvider::status_phase`](crate::CustodyProvider::status_phase)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusPhase {
    /// Accepted, nothing signed or broadcast yet (the silent-drop window).
    PreBroadcast,
    /// Waiting for an approval at the provider (`PENDING_AUTHORIZATION`, third-party
    /// manual approval): Keel's wait of kind `custody_approval`.
    AwaitingApproval,
    /// Broadcast or being broadcast; a hash exists or is about to.
    Broadcast,
    /// A cancel is in progress; not yet terminal.
    Cancelling,
    /// `COMPLETED` at the provider.
    Completed,
    /// Ended without effect, or reverted: `CANCELLED`, `BLOCKED`, `REJECTED`, `FAILED`.
    Rejected,
    /// A status this version does not know: treated as in flight, never as final.
    Unknown,
}

/// How a transaction that ended without effect (phase [`StatusPhase::Rejected`])
/// ended, provider-neutrally: what the queue's failure code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ending {
    /// Cancelled before broadcast (by Keel's cancel, or a user at the provider).
    Cancelled,
    /// Rejected by an approver, a signer or screening.
    Rejected,
    /// Blocked by a policy rule.
    Blocked,
    /// Failed, before or after broadcast (a revert is a failure with a hash).
    Failed,
}

impl TxStatus {
    /// The phase of this status as Fireblocks means it ([`crate::fireblocks::status::phase`]).
    /// Provider-neutral code asks its provider instead
    /// ([`CustodyProvider::status_phase`](crate::CustodyProvider::status_phase)).
    pub fn phase(&self) -> StatusPhase {
        crate::fireblocks::status::phase(self)
    }

    /// Terminal at the provider: phase [`StatusPhase::Completed`] or
    /// [`StatusPhase::Rejected`] (Fireblocks: `COMPLETED`, `CANCELLED`, `BLOCKED`,
    /// `REJECTED`, `FAILED`).
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase(), StatusPhase::Completed | StatusPhase::Rejected)
    }

    /// The order of statuses along a transaction's life as Fireblocks means it
    /// ([`crate::fireblocks::status::rank`]): terminal statuses share the top rank; an
    /// unknown status ranks 0 (it never overrides a known one).
    pub fn rank(&self) -> u8 {
        crate::fireblocks::status::rank(self)
    }
}

string_enum!(
    /// A provider transaction's sub-status (Fireblocks `subStatus`): the reason behind a
    /// status. The provider sends an empty string when there is none; Keel maps that to
    /// `None` ([`ProviderTransaction::sub_status`]).
    SubStatus {
        /// Confirmed on chain at the provider's confirmation count.
        Confirmed = "CONFIRMED",
        /// Waiting for blockchain confirmations.
        PendingBlockchainConfirmations = "PENDING_BLOCKCHAIN_CONFIRMATIONS",
        /// A third party is processing.
        ThirdPartyProcessing = "3RD_PARTY_PROCESSING",
        /// A third party's manual approval.
        ThirdPartyPendingServiceManualApproval = "3RD_PARTY_PENDING_SERVICE_MANUAL_APPROVAL",
        /// Cancelled by a user (console or API).
        CancelledByUser = "CANCELLED_BY_USER",
        /// Rejected by an approver.
        RejectedByUser = "REJECTED_BY_USER",
        /// Blocked by a transaction-authorization-policy rule.
        BlockedByPolicy = "BLOCKED_BY_POLICY",
        /// Rejected by anti-money-laundering screening.
        RejectedAmlScreening = "REJECTED_AML_SCREENING",
        /// No approver matched the policy.
        AuthorizerNotFound = "AUTHORIZER_NOT_FOUND",
        /// Frozen automatically by a policy.
        AutoFreeze = "AUTO_FREEZE",
        /// The vault account cannot pay the value.
        InsufficientFunds = "INSUFFICIENT_FUNDS",
        /// The vault account cannot pay the fee.
        InsufficientFundsForFee = "INSUFFICIENT_FUNDS_FOR_FEE",
        /// The provider could not reach the chain.
        NetworkError = "NETWORK_ERROR",
        /// The provider gave up waiting.
        Timeout = "TIMEOUT",
        /// An error inside the provider.
        InternalError = "INTERNAL_ERROR",
        /// The contract call reverted on chain (receipt status 0).
        SmartContractExecutionFailed = "SMART_CONTRACT_EXECUTION_FAILED",
        /// The chain dropped the transaction.
        DroppedByBlockchain = "DROPPED_BY_BLOCKCHAIN",
        /// The transaction expired before it was signed.
        TxOutdated = "TX_OUTDATED",
    }
);

/// A transaction hash as the provider reports it (32 bytes). Fireblocks sends `txHash`
/// as `0x`-prefixed hex for EVM chains, an empty string before broadcast; it is only
/// guaranteed from `CONFIRMING` on.
pub type TxHash = B256;

/// Parses a provider `txHash`: `None` for an empty string, else 32 bytes of hex with or
/// without `0x`.
///
/// # Errors
/// [`CustodyError::Decode`] for anything else.
pub fn parse_tx_hash(text: &str) -> Result<Option<TxHash>, CustodyError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let hex_part = text.strip_prefix("0x").unwrap_or(text);
    let bytes = hex::decode(hex_part).map_err(|_| CustodyError::Decode { what: "txHash" })?;
    if bytes.len() != 32 {
        return Err(CustodyError::Decode { what: "txHash" });
    }
    Ok(Some(B256::from_slice(&bytes)))
}

/// A contract call from a vault account: the one kind of write Keel asks a custody
/// provider for (Fireblocks `operation: CONTRACT_CALL`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContractCall {
    /// The vault account that signs and pays.
    pub vault: VaultAccountId,
    /// The chain's native asset at the provider (configured per chain).
    pub asset: AssetId,
    /// The contract called (Fireblocks `destination: ONE_TIME_ADDRESS`).
    pub to: Address,
    /// The calldata **including the ERC-8021 attribution suffix**; identical on every
    /// attempt of one request (`extraParameters.contractCallData`).
    pub calldata: Bytes,
    /// Native value sent with the call, in wei (sent as a decimal amount of the coin,
    /// 18 decimals: [`format_native_amount`]).
    pub value: U256,
    /// Keel's idempotency key at the provider.
    pub external_tx_id: ExternalTxId,
    /// A free-text note shown to approvers at the provider (bounded to 1,000 chars).
    pub note: String,
}

/// Formats a wei value as the provider's decimal amount of an 18-decimal coin, exactly:
/// `0` → `"0"`, `1500000000000000000` → `"1.5"`.
pub fn format_native_amount(wei: U256) -> String {
    let unit = U256::from(10u64).pow(U256::from(18u64));
    let whole = wei / unit;
    let frac = wei % unit;
    if frac.is_zero() {
        return whole.to_string();
    }
    let frac = format!("{:0>18}", frac.to_string());
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// What a create returned: the provider's id and the first status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// The provider's id of the new transaction.
    pub id: ProviderTxId,
    /// Its status at create (normally `SUBMITTED`).
    pub status: TxStatus,
}

/// The block the provider saw the transaction in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Block number.
    pub number: u64,
    /// Block hash.
    pub hash: B256,
}

/// The provider's view of one transaction (Fireblocks `GET /v1/transactions/{id}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderTransaction {
    /// The provider's id.
    pub id: ProviderTxId,
    /// Keel's external id, when the transaction was created with one.
    pub external_tx_id: Option<ExternalTxId>,
    /// The status.
    pub status: TxStatus,
    /// The sub-status; `None` when the provider sent an empty string or none.
    pub sub_status: Option<SubStatus>,
    /// The on-chain hash, once the provider has one (guaranteed from `CONFIRMING`).
    pub tx_hash: Option<TxHash>,
    /// The vault address that signed (when reported).
    pub source_address: Option<Address>,
    /// The called contract (when reported).
    pub destination_address: Option<Address>,
    /// Confirmations the provider counted (when reported).
    pub confirmations: Option<u64>,
    /// The block the transaction landed in (when reported).
    pub block: Option<BlockInfo>,
    /// Creation time at the provider, milliseconds since the Unix epoch.
    pub created_at_ms: Option<u64>,
    /// Last update at the provider, milliseconds since the Unix epoch.
    pub last_updated_ms: Option<u64>,
}

/// The reason a transaction ended without effect (or reverted), as the provider gave it:
/// what a terminal settlement verdict carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderReason {
    /// The terminal status (`CANCELLED`, `BLOCKED`, `REJECTED` or `FAILED`).
    pub status: TxStatus,
    /// The sub-status, when given.
    pub sub_status: Option<SubStatus>,
    /// The hash, when the transaction was broadcast before failing (a revert).
    pub tx_hash: Option<TxHash>,
}

impl ProviderTransaction {
    /// The rejection this transaction ended in, if it did (`CANCELLED`, `BLOCKED`,
    /// `REJECTED`, `FAILED`).
    /// Fireblocks' meaning of the status ([`TxStatus::phase`]).
    pub fn rejection(&self) -> Option<ProviderReason> {
        (self.status.phase() == StatusPhase::Rejected).then(|| ProviderReason {
            status: self.status.clone(),
            sub_status: self.sub_status.clone(),
            tx_hash: self.tx_hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_unknown_is_kept() {
        for s in ["SUBMITTED", "PENDING_AUTHORIZATION", "CONFIRMING", "FAILED"] {
            assert_eq!(TxStatus::parse(s).as_str(), s);
            assert!(!matches!(TxStatus::parse(s), TxStatus::Unknown(_)));
        }
        let new = TxStatus::parse("PENDING_QUANTUM_REVIEW");
        assert_eq!(new, TxStatus::Unknown("PENDING_QUANTUM_REVIEW".into()));
        assert_eq!(new.phase(), StatusPhase::Unknown);
        assert!(!new.is_terminal());
        assert!(TxStatus::Completed.rank() > TxStatus::Queued.rank());
        assert_eq!(
            SubStatus::parse("BLOCKED_BY_POLICY"),
            SubStatus::BlockedByPolicy
        );
    }

    #[test]
    fn native_amounts_are_exact() {
        assert_eq!(format_native_amount(U256::ZERO), "0");
        assert_eq!(
            format_native_amount(U256::from(1_500_000_000_000_000_000u128)),
            "1.5"
        );
        assert_eq!(
            format_native_amount(U256::from(1u64)),
            "0.000000000000000001"
        );
    }

    #[test]
    fn ids_are_checked_and_derived_ids_are_stable() {
        assert!(ExternalTxId::new("a/b").is_err());
        assert!(ExternalTxId::new("").is_err());
        let a = ExternalTxId::derive("op-1.mint", 0).unwrap();
        assert_eq!(a.as_str(), "keel.op-1.mint.0");
        assert_eq!(a, ExternalTxId::derive("op-1.mint", 0).unwrap());
        assert_ne!(a, ExternalTxId::derive("op-1.mint", 1).unwrap());
        assert_eq!(parse_tx_hash("").unwrap(), None);
        assert!(parse_tx_hash("0x12").is_err());
    }
}
