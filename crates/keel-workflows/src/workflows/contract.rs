//! What the workflows and their callers agree on: the inputs and outputs of every
//! workflow, the signal names, the approval decision and the typed failure
//! [`OpFailure`]. Every type here is journaled or stored as JSON (camelCase): renaming a
//! Rust field keeps its serde name.
//!
//! ## The result of each operation kind
//! A completed operation's `result` is its workflow's output, serialized as below (the
//! one place these shapes are defined):
//!
//! | kind | output |
//! |---|---|
//! | `asset.create` | [`AssetCreateOutput`] |
//! | `asset.mint`, `asset.transfer`, `asset.pause`, `asset.unpause`, `asset.burn` | [`TokenOpOutput`] |
//! | `asset.grant-role`, `asset.revoke-role` | [`RoleChangeOutput`] |

use alloy::primitives::{Address, B256, U256, keccak256};
use keel_durable::WorkflowFailure;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The code of an enqueue step that found its operation cancelled (journaled as that
/// step's result; the workflow then ends `cancelled`).
pub const CANCELLED: &str = "CANCELLED";

/// The signal an approval decision is delivered as.
pub const APPROVAL_SIGNAL: &str = "approval";

/// Prefix of the signal a transaction's verdict is delivered as (`tx.<link>`, the link
/// being the write's name, or `<write>#<attempt>` for a later attempt).
pub const TX_SIGNAL_PREFIX: &str = "tx.";

/// The typed failure of an operation (the workflow's `Error`). `detail` is value-free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpFailure {
    /// Stable code: `EXECUTION_REVERTED`, `GAS_REQUIRED`, `FUNDING_DEADLINE_EXPIRED`,
    /// `NONCE_CONSUMED_EXTERNALLY`, `APPROVAL_EXPIRED`, `APPROVAL_REJECTED`,
    /// `CHAIN_NOT_CONFIGURED`, `REJECTED`, ...
    pub code: String,
    /// Whether retrying the operation can help.
    pub retryable: bool,
    /// A value-free description.
    pub detail: String,
    /// The on-chain write that failed (`create-feed`, `mint`, ...), when a transaction
    /// did. Serialized as `step` (its stored name).
    #[serde(rename = "step")]
    pub write: Option<String>,
    /// The decoded revert reason (`Error(string)`) or custom error name, when the chain
    /// reported one. Contract texts, not caller input.
    pub reason: Option<String>,
}

impl OpFailure {
    /// A failure with `code`, `retryable` and a value-free `detail`, not tied to a write.
    pub fn new(code: &str, retryable: bool, detail: &str) -> Self {
        Self {
            code: code.to_owned(),
            retryable,
            detail: detail.to_owned(),
            write: None,
            reason: None,
        }
    }
}

/// The failure type of every workflow body here.
pub(crate) type Failure = WorkflowFailure<OpFailure>;

/// A confirmed transaction of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Landed {
    /// The hash of the attempt that mined.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
}

/// Input of `asset.create` (built by the operations service from the request and the
/// asset's template).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateInput {
    /// The operation.
    pub operation_id: Uuid,
    /// The asset (its 16 bytes, left-padded, are the on-chain asset id).
    pub asset_id: Uuid,
    /// EIP-155 chain id (from the template).
    pub chain_id: u64,
    /// ERC-20 name.
    pub name: String,
    /// ERC-20 symbol.
    pub symbol: String,
    /// ERC-20 decimals.
    pub decimals: u8,
    /// Decimals of the feed's answers (from the template).
    pub price_decimals: u8,
    /// The first observation: the initial price scaled by `price_decimals`, as a
    /// decimal integer string (an `int256` answer).
    pub price_answer: String,
    /// Staleness bound installed on the `PriceResolver`, seconds (from the template).
    pub staleness_bound_seconds: u64,
    /// Funding pause deadline, seconds, when the template enables the pause.
    pub funding_deadline_seconds: Option<u64>,
    /// The sender of every write and the asset's issuer (its token's and feed's admin):
    /// the template's custody vault (issue 19); absent: the operator key. Absent from
    /// inputs written before it existed, which therefore run as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<Address>,
    /// The `OrgAssetFactory` of the organization system that deploys the token (issue
    /// 37; the asset's `system_id`); absent: the platform's `AssetFactory`. A token of a
    /// system is added to the index scope by the workflow itself (step `scope token`),
    /// so it stays indexed after its system is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_factory: Option<Address>,
}

/// Output of `asset.create`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssetCreateOutput {
    /// The token contract.
    pub token: Address,
    /// The price feed contract.
    pub feed: Address,
    /// The index block that showed the asset (read-after-write).
    pub indexed_block: u64,
}

/// The token operation of a [`TokenOpInput`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum TokenAction {
    /// `AssetToken.mint(recipient, amount)`.
    Mint {
        /// The receiver of the tokens (serialized as `to`, its journaled name).
        #[serde(rename = "to")]
        recipient: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.transfer(recipient, amount)` from the operator's (issuer's) holdings.
    Transfer {
        /// The receiver of the tokens (serialized as `to`, its journaled name).
        #[serde(rename = "to")]
        recipient: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.pause()`.
    Pause,
    /// `AssetToken.unpause()`.
    Unpause,
    /// `AssetToken.burn(amount)`: the operator (issuer) burns its own holdings
    /// (`asset.burn` without `from`).
    Burn {
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.forcedBurn(from, amount)`: a forced burn (redemption) of a holder's
    /// tokens; the operator needs [`TokenRole::Burner`] (`asset.burn` with `from`).
    ForcedBurn {
        /// The holder whose tokens are burned.
        from: Address,
        /// Token base units.
        amount: U256,
    },
    /// `AssetToken.grantRole(role, account)` (`asset.grant-role`).
    GrantRole {
        /// The role.
        role: TokenRole,
        /// Who receives it.
        account: Address,
    },
    /// `AssetToken.revokeRole(role, account)` (`asset.revoke-role`).
    RevokeRole {
        /// The role.
        role: TokenRole,
        /// Who loses it.
        account: Address,
    },
    /// `Compliance.setRules(token, rules, countries)` on the asset's organization
    /// system (`asset.set-compliance`, issue 37 §2); sent by the operator (the
    /// system's admin) to the input's `target`.
    SetCompliance {
        /// The rules.
        rules: ComplianceRules,
    },
    /// `RegulatedToken.setAddressFrozen(account, frozen)` (`asset.freeze` /
    /// `asset.unfreeze` without `amount`, issue 37 §3): a frozen address can neither
    /// send nor receive.
    SetAddressFrozen {
        /// The address.
        account: Address,
        /// Frozen (`asset.freeze`) or not (`asset.unfreeze`).
        frozen: bool,
    },
    /// `RegulatedToken.freezePartialTokens(account, amount)` (`asset.freeze` with
    /// `amount`): that much more of the holder's balance cannot move.
    FreezePartial {
        /// The holder.
        account: Address,
        /// Token base units.
        amount: U256,
    },
    /// `RegulatedToken.unfreezePartialTokens(account, amount)` (`asset.unfreeze` with
    /// `amount`).
    UnfreezePartial {
        /// The holder.
        account: Address,
        /// Token base units.
        amount: U256,
    },
    /// `RegulatedToken.forcedTransfer(from, to, amount, enforceCompliance)`
    /// (`asset.forced-transfer`): moves a holder's tokens without its consent, frozen
    /// ones released as needed.
    ForcedTransfer {
        /// The holder whose tokens move.
        from: Address,
        /// The receiver (serialized as `to`).
        #[serde(rename = "to")]
        recipient: Address,
        /// Token base units.
        amount: U256,
        /// Whether the asset's compliance rules judge the receiver (false only when the
        /// template's `forcedTransferSkipsCompliance` is set).
        enforce_compliance: bool,
    },
    /// `RegulatedToken.recoveryAddress(lost, replacement)` (`asset.recover`): the lost
    /// wallet's whole balance, frozen amount and frozen flag move to `replacement`;
    /// its registry entry moves too (workflow steps around this write).
    Recover {
        /// The lost wallet.
        lost: Address,
        /// The new wallet.
        replacement: Address,
    },
    /// `RegulatedToken.batchMint(to[], amounts[])` (`asset.batch-mint`): every mint in
    /// one transaction, all or nothing.
    BatchMint {
        /// The receivers and their amounts (token base units), in request order.
        recipients: Vec<BatchLine>,
    },
    /// `RegulatedToken.batchTransfer(to[], amounts[])` (`asset.batch-transfer`) from the
    /// issuer's holdings: every transfer in one transaction, all or nothing.
    BatchTransfer {
        /// The receivers and their amounts (token base units), in request order.
        recipients: Vec<BatchLine>,
    },
}

/// One line of a batch mint or batch transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchLine {
    /// The receiver.
    pub to: Address,
    /// Token base units.
    pub amount: U256,
}

/// An asset's transfer rules in its organization system's `Compliance` contract
/// (`abi/src/Compliance.sol`). Zero values switch a rule off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComplianceRules {
    /// Recipients must be eligible in the system's registry.
    pub eligible_only: bool,
    /// 0: any country; 1: only `countries`; 2: all but `countries`.
    pub country_mode: u8,
    /// ISO 3166-1 numeric country codes of the list.
    pub countries: Vec<u16>,
    /// Maximum number of holders (0: none).
    pub max_holders: u32,
    /// Maximum balance per holder, token base units (0: none).
    pub max_balance: U256,
    /// Unix time (seconds) before which holder-to-holder transfers are refused (0: none).
    pub lockup_until: u64,
}

impl TokenAction {
    /// Whether the action exists only on an organization system's tokens (a
    /// `RegulatedToken`, or its `Compliance`): the rules change and the agent
    /// operations. On another asset it is refused `ASSET_NOT_REGULATED`.
    pub fn needs_system(&self) -> bool {
        matches!(
            self,
            Self::SetCompliance { .. }
                | Self::SetAddressFrozen { .. }
                | Self::FreezePartial { .. }
                | Self::UnfreezePartial { .. }
                | Self::ForcedTransfer { .. }
                | Self::Recover { .. }
                | Self::BatchMint { .. }
                | Self::BatchTransfer { .. }
        )
    }

    /// The name of the action's on-chain write (`mint`, `transfer`, `pause`, `unpause`,
    /// `burn`, `forced-burn`, `grant-role`, `revoke-role`, `set-compliance`,
    /// `freeze-address`, `unfreeze-address`, `freeze-partial`, `unfreeze-partial`,
    /// `forced-transfer`, `recover`, `batch-mint`, `batch-transfer`): the link of its transaction
    /// and the progress phase while it runs.
    pub fn write(&self) -> &'static str {
        match self {
            Self::Mint { .. } => "mint",
            Self::Transfer { .. } => "transfer",
            Self::Pause => "pause",
            Self::Unpause => "unpause",
            Self::Burn { .. } => "burn",
            Self::ForcedBurn { .. } => "forced-burn",
            Self::GrantRole { .. } => "grant-role",
            Self::RevokeRole { .. } => "revoke-role",
            Self::SetCompliance { .. } => "set-compliance",
            Self::SetAddressFrozen { frozen: true, .. } => "freeze-address",
            Self::SetAddressFrozen { frozen: false, .. } => "unfreeze-address",
            Self::FreezePartial { .. } => "freeze-partial",
            Self::UnfreezePartial { .. } => "unfreeze-partial",
            Self::ForcedTransfer { .. } => "forced-transfer",
            Self::Recover { .. } => "recover",
            Self::BatchMint { .. } => "batch-mint",
            Self::BatchTransfer { .. } => "batch-transfer",
        }
    }
}

/// A role of `AssetToken` that `asset.grant-role` and `asset.revoke-role` manage
/// (`abi/src/AssetToken.sol`). Serialized by its API name (`minter`, `pauser`,
/// `burner`). `DEFAULT_ADMIN_ROLE` is deliberately not among them: the operator keeps
/// the administration of its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum TokenRole {
    /// `MINTER_ROLE`: may call `mint` (the operator holds it from deployment).
    Minter,
    /// `PAUSER_ROLE`: may call `pause` and `unpause` (the operator holds it from
    /// deployment).
    Pauser,
    /// `BURNER_ROLE`: may call `forcedBurn` (nobody holds it at deployment).
    Burner,
}

impl TokenRole {
    /// Every role, in API order.
    pub const ALL: [TokenRole; 3] = [Self::Minter, Self::Pauser, Self::Burner];

    /// The API name: `minter`, `pauser`, `burner`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Minter => "minter",
            Self::Pauser => "pauser",
            Self::Burner => "burner",
        }
    }

    /// The role by its API name (exact, lowercase), or `None`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The Solidity constant's name: `MINTER_ROLE`, `PAUSER_ROLE`, `BURNER_ROLE`.
    pub fn constant(self) -> &'static str {
        match self {
            Self::Minter => "MINTER_ROLE",
            Self::Pauser => "PAUSER_ROLE",
            Self::Burner => "BURNER_ROLE",
        }
    }

    /// The on-chain role id: `keccak256` of [`TokenRole::constant`] (as
    /// OpenZeppelin's `AccessControl` roles are defined).
    pub fn id(self) -> B256 {
        keccak256(self.constant())
    }
}

/// Input of the token operations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOpInput {
    /// The operation.
    pub operation_id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The token contract.
    pub token: Address,
    /// What to do.
    pub action: TokenAction,
    /// When set, the operation waits for an approval this many seconds before it fails
    /// `APPROVAL_EXPIRED`.
    pub approval_ttl_seconds: Option<u64>,
    /// Funding pause deadline, seconds, when the template enables the pause.
    pub funding_deadline_seconds: Option<u64>,
    /// The sender of the write: the asset's issuer when its template sends through a
    /// custody vault (issue 19); absent: the operator key (as for inputs written before
    /// it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<Address>,
    /// The asset's issuer when it is not a custody vault (the sender of the chain's
    /// signer pool that created it, issue 35 §2): the write is sent by it when the
    /// runner holds its key (so the asset's writes stay on its nonce stream), else by
    /// the operator key (which got `DEFAULT_ADMIN_ROLE` on the token at creation).
    /// Absent: the operator key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<Address>,
    /// The contract the write goes to when it is not the token: the organization
    /// system's `Compliance` of `asset.set-compliance`. Absent: the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Address>,
    /// The organization system's `IdentityRegistry` of `asset.recover` (the lost
    /// wallet's entry moves to the new one). Absent for every other kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<Address>,
}

/// Output of the token operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOpOutput {
    /// The transaction.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
    /// The index block that reflects it (read-after-write).
    pub indexed_block: u64,
}

/// Output of `asset.grant-role` and `asset.revoke-role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleChangeOutput {
    /// The transaction.
    pub tx_hash: B256,
    /// Its block.
    pub block: u64,
    /// The index block that reflects it (read-after-write).
    pub indexed_block: u64,
    /// The role.
    pub role: TokenRole,
    /// The account that received or lost it.
    pub account: Address,
    /// Whether the role changed: false when the account already held (grant) or did not
    /// hold (revoke) it — the transaction then landed without a `RoleGranted` /
    /// `RoleRevoked` event.
    pub changed: bool,
}

/// An approval decision (the payload of the [`APPROVAL_SIGNAL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// Approved (true) or rejected (false).
    pub approved: bool,
    /// The deciding API key.
    pub api_key_id: Uuid,
}

/// The on-chain asset id of a Keel asset: its UUID's 16 bytes, left-padded to 32.
pub fn onchain_asset_id(asset_id: Uuid) -> B256 {
    B256::left_padding_from(asset_id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_ids_are_left_padded_uuids() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let b = onchain_asset_id(id);
        assert!(b[..16].iter().all(|x| *x == 0));
        assert_eq!(&b[16..], id.as_bytes());
    }

    /// The Rust names changed, the journaled JSON names did not.
    #[test]
    fn renamed_fields_keep_their_journaled_names() {
        let action = TokenAction::Mint {
            recipient: Address::repeat_byte(1),
            amount: U256::from(5u64),
        };
        let v = serde_json::to_value(&action).unwrap();
        assert_eq!(v["type"], "mint");
        assert!(v.get("to").is_some(), "{v}");
        let mut f = OpFailure::new("GAS_REQUIRED", true, "d");
        f.write = Some("mint".into());
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["step"], "mint");
    }

    /// Roles are named as the API names them and identified as the contract does.
    #[test]
    fn roles_have_api_names_and_contract_ids() {
        for role in TokenRole::ALL {
            assert_eq!(TokenRole::from_name(role.name()), Some(role));
            assert_eq!(serde_json::to_value(role).unwrap(), role.name());
        }
        assert_eq!(TokenRole::from_name("admin"), None);
        assert_eq!(TokenRole::from_name("Minter"), None);
        assert_eq!(
            TokenRole::Burner.id(),
            alloy::primitives::keccak256("BURNER_ROLE")
        );
        let action = TokenAction::ForcedBurn {
            from: Address::repeat_byte(2),
            amount: U256::from(3u64),
        };
        let v = serde_json::to_value(&action).unwrap();
        assert_eq!(v["type"], "forcedBurn", "{v}");
        assert_eq!(action.write(), "forced-burn");
    }
}
