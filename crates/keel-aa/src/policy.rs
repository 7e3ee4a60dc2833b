//! Sponsorship policy of one organization: which accounts, which target contracts and
//! selectors, a gas ceiling per operation and a daily budget in wei. A refusal names the
//! rule that refused ([`PolicyRefusal::code`]), never silently.
//!
//! The calls an operation makes are read from its `callData` as the v0.8 `BaseAccount`
//! encodes them: `execute(address target, uint256 value, bytes data)` or
//! `executeBatch((address target, uint256 value, bytes data)[])`. Any other `callData`
//! is refused ([`PolicyRefusal::CallDataNotUnderstood`]): a policy that cannot see the
//! target cannot allow it.
//!
//! The operation's **maximum cost** (what the paymaster's deposit can be charged) is
//! `(verificationGasLimit + callGasLimit + paymasterVerificationGasLimit +
//! paymasterPostOpGasLimit + preVerificationGas) × maxFeePerGas` wei; the gas ceiling
//! bounds the gas sum, the daily budget bounds `spent today + maximum cost`.

use crate::user_op::UserOperation;
use alloy::primitives::{Address, Bytes, FixedBytes, U256};
use alloy::sol;
use alloy::sol_types::SolCall;
use keel_units::Wei;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

sol!(
    /// `BaseAccount` (v0.8) call encodings read by the policy.
    interface IBaseAccount {
        /// One call of a batch.
        struct Call {
            address target;
            uint256 value;
            bytes data;
        }
        /// A single call.
        function execute(address target, uint256 value, bytes calldata data) external;
        /// Several calls.
        function executeBatch(Call[] calldata calls) external;
    }
);

/// Which accounts may be sponsored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "accounts")]
pub enum AccountRule {
    /// Every account.
    Any,
    /// Only these accounts (`sender`).
    Only(BTreeSet<Address>),
}

/// One allowed target contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRule {
    /// The contract called by the account.
    pub target: Address,
    /// Allowed 4-byte selectors; `None` allows every call to `target` (including a
    /// plain value transfer without calldata).
    pub selectors: Option<BTreeSet<FixedBytes<4>>>,
}

/// The sponsorship policy of one organization (configuration or asset template).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SponsorshipPolicy {
    /// Which accounts.
    pub accounts: AccountRule,
    /// Allowed targets; every call of the operation must match one.
    pub targets: Vec<TargetRule>,
    /// Ceiling of the operation's total gas (sum of its five gas fields), gas units.
    pub max_gas_per_operation: u64,
    /// Budget of maximum costs per UTC day, wei.
    pub daily_budget: Wei,
}

/// Why a sponsorship was refused; each names one rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyRefusal {
    /// `sender` is not among the allowed accounts.
    #[error("the account is not allowed by the sponsorship policy")]
    AccountNotAllowed {
        /// The sender.
        sender: Address,
    },
    /// `callData` is not `execute` / `executeBatch`.
    #[error("the operation's callData is not an execute or executeBatch call")]
    CallDataNotUnderstood,
    /// A call targets a contract the policy does not list.
    #[error("a call targets a contract the sponsorship policy does not allow")]
    TargetNotAllowed {
        /// The target.
        target: Address,
    },
    /// A call uses a selector the policy does not list for its target (`None`: no
    /// calldata, a plain value transfer).
    #[error("a call uses a function the sponsorship policy does not allow")]
    SelectorNotAllowed {
        /// The target.
        target: Address,
        /// The selector used.
        selector: Option<FixedBytes<4>>,
    },
    /// The operation's gas exceeds the ceiling.
    #[error("the operation's gas exceeds the sponsorship ceiling")]
    GasCeilingExceeded {
        /// The ceiling, gas.
        ceiling: u64,
        /// The operation's gas sum (saturating).
        requested: u128,
    },
    /// Sponsoring would exceed the daily budget.
    #[error("sponsoring the operation would exceed the daily budget")]
    DailyBudgetExceeded {
        /// The budget, wei.
        budget: Wei,
        /// Already spent (maximum costs) today, wei.
        spent: Wei,
        /// This operation's maximum cost, wei.
        requested: Wei,
    },
}

impl PolicyRefusal {
    /// Stable code naming the refusing rule (API error code, bounded metric label).
    pub fn code(&self) -> &'static str {
        match self {
            Self::AccountNotAllowed { .. } => "SPONSOR_ACCOUNT_NOT_ALLOWED",
            Self::CallDataNotUnderstood => "SPONSOR_CALLDATA_NOT_UNDERSTOOD",
            Self::TargetNotAllowed { .. } => "SPONSOR_TARGET_NOT_ALLOWED",
            Self::SelectorNotAllowed { .. } => "SPONSOR_SELECTOR_NOT_ALLOWED",
            Self::GasCeilingExceeded { .. } => "SPONSOR_GAS_CEILING_EXCEEDED",
            Self::DailyBudgetExceeded { .. } => "SPONSOR_DAILY_BUDGET_EXCEEDED",
        }
    }
}

/// One call an operation makes (decoded from `callData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountCall {
    /// The called contract.
    pub target: Address,
    /// Value sent, wei.
    pub value: Wei,
    /// The calldata.
    pub data: Bytes,
}

/// The calls of `call_data` (`execute` or `executeBatch`), `None` otherwise.
pub fn decode_account_calls(call_data: &[u8]) -> Option<Vec<AccountCall>> {
    if let Ok(c) = IBaseAccount::executeCall::abi_decode(call_data) {
        return Some(vec![AccountCall {
            target: c.target,
            value: Wei::new(c.value),
            data: c.data,
        }]);
    }
    IBaseAccount::executeBatchCall::abi_decode(call_data)
        .ok()
        .map(|b| {
            b.calls
                .into_iter()
                .map(|c| AccountCall {
                    target: c.target,
                    value: Wei::new(c.value),
                    data: c.data,
                })
                .collect()
        })
}

/// The operation's total gas (its five gas fields), saturating at `u128::MAX`.
pub fn total_gas(op: &UserOperation) -> u128 {
    let pvg = u128::try_from(op.pre_verification_gas).unwrap_or(u128::MAX);
    [
        op.verification_gas_limit,
        op.call_gas_limit,
        op.paymaster_verification_gas_limit,
        op.paymaster_post_op_gas_limit,
        pvg,
    ]
    .into_iter()
    .fold(0u128, u128::saturating_add)
}

/// The operation's maximum cost, wei: [`total_gas`] × `maxFeePerGas` (saturating).
pub fn max_cost(op: &UserOperation) -> Wei {
    Wei::new(U256::from(total_gas(op)).saturating_mul(op.max_fee_per_gas.get()))
}

impl SponsorshipPolicy {
    /// Checks `op` against the rules in this order: account, calls (targets then
    /// selectors), gas ceiling, daily budget given `spent_today` wei. Returns the
    /// operation's maximum cost to add to the day's spending when it is sponsored.
    ///
    /// # Errors
    /// The first [`PolicyRefusal`] that applies.
    pub fn evaluate(&self, op: &UserOperation, spent_today: Wei) -> Result<Wei, PolicyRefusal> {
        if let AccountRule::Only(allowed) = &self.accounts
            && !allowed.contains(&op.sender)
        {
            return Err(PolicyRefusal::AccountNotAllowed { sender: op.sender });
        }
        let calls =
            decode_account_calls(&op.call_data).ok_or(PolicyRefusal::CallDataNotUnderstood)?;
        for call in &calls {
            let rule = self
                .targets
                .iter()
                .find(|t| t.target == call.target)
                .ok_or(PolicyRefusal::TargetNotAllowed {
                    target: call.target,
                })?;
            if let Some(selectors) = &rule.selectors {
                let selector = call.data.get(..4).map(FixedBytes::<4>::from_slice);
                if !selector.is_some_and(|s| selectors.contains(&s)) {
                    return Err(PolicyRefusal::SelectorNotAllowed {
                        target: call.target,
                        selector,
                    });
                }
            }
        }
        let gas = total_gas(op);
        if gas > u128::from(self.max_gas_per_operation) {
            return Err(PolicyRefusal::GasCeilingExceeded {
                ceiling: self.max_gas_per_operation,
                requested: gas,
            });
        }
        let cost = max_cost(op);
        let after = spent_today.get().saturating_add(cost.get());
        if after > self.daily_budget.get() {
            return Err(PolicyRefusal::DailyBudgetExceeded {
                budget: self.daily_budget,
                spent: spent_today,
                requested: cost,
            });
        }
        Ok(cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::address;

    const TOKEN: Address = address!("0x00000000000000000000000000000000000000aa");
    const OTHER: Address = address!("0x00000000000000000000000000000000000000bb");
    const ACCOUNT: Address = address!("0x00000000000000000000000000000000000000cc");
    const TRANSFER: [u8; 4] = [0xa9, 0x05, 0x9c, 0xbb];

    fn op(call_data: Vec<u8>) -> UserOperation {
        UserOperation {
            sender: ACCOUNT,
            nonce: U256::ZERO,
            factory: None,
            factory_data: Bytes::new(),
            call_data: call_data.into(),
            call_gas_limit: 100_000,
            verification_gas_limit: 200_000,
            pre_verification_gas: U256::from(50_000u64),
            max_fee_per_gas: Wei::from(10u64),
            max_priority_fee_per_gas: Wei::from(1u64),
            paymaster: None,
            paymaster_verification_gas_limit: 40_000,
            paymaster_post_op_gas_limit: 10_000,
            paymaster_data: Bytes::new(),
            signature: Bytes::new(),
            eip7702_auth: None,
        }
    }

    fn execute(target: Address, data: &[u8]) -> Vec<u8> {
        IBaseAccount::executeCall {
            target,
            value: U256::ZERO,
            data: Bytes::copy_from_slice(data),
        }
        .abi_encode()
    }

    fn policy() -> SponsorshipPolicy {
        SponsorshipPolicy {
            accounts: AccountRule::Only([ACCOUNT].into()),
            targets: vec![TargetRule {
                target: TOKEN,
                selectors: Some([FixedBytes(TRANSFER)].into()),
            }],
            max_gas_per_operation: 400_000,
            daily_budget: Wei::from(10_000_000u64),
        }
    }

    #[test]
    fn an_allowed_operation_costs_its_gas_times_max_fee() {
        let transfer = [&TRANSFER[..], &[0u8; 64]].concat();
        let cost = policy()
            .evaluate(&op(execute(TOKEN, &transfer)), Wei::ZERO)
            .unwrap();
        assert_eq!(cost, Wei::from(400_000u64 * 10));
    }

    #[test]
    fn each_rule_refuses_with_its_code() {
        let transfer = [&TRANSFER[..], &[0u8; 64]].concat();
        let p = policy();
        let mut stranger = op(execute(TOKEN, &transfer));
        stranger.sender = OTHER;
        let approve = [0x09, 0x5e, 0xa7, 0xb3, 0, 0];
        let mut heavy = op(execute(TOKEN, &transfer));
        heavy.call_gas_limit += 1;
        let batch = IBaseAccount::executeBatchCall {
            calls: vec![
                IBaseAccount::Call {
                    target: TOKEN,
                    value: U256::ZERO,
                    data: transfer.clone().into(),
                },
                IBaseAccount::Call {
                    target: OTHER,
                    value: U256::ZERO,
                    data: Bytes::new(),
                },
            ],
        }
        .abi_encode();
        let cases: [(UserOperation, Wei, &str); 7] = [
            (stranger, Wei::ZERO, "SPONSOR_ACCOUNT_NOT_ALLOWED"),
            (
                op(vec![1, 2, 3, 4]),
                Wei::ZERO,
                "SPONSOR_CALLDATA_NOT_UNDERSTOOD",
            ),
            (
                op(execute(OTHER, &transfer)),
                Wei::ZERO,
                "SPONSOR_TARGET_NOT_ALLOWED",
            ),
            (
                op(execute(TOKEN, &approve)),
                Wei::ZERO,
                "SPONSOR_SELECTOR_NOT_ALLOWED",
            ),
            (
                op(execute(TOKEN, &[])),
                Wei::ZERO,
                "SPONSOR_SELECTOR_NOT_ALLOWED",
            ),
            (heavy, Wei::ZERO, "SPONSOR_GAS_CEILING_EXCEEDED"),
            (op(batch), Wei::ZERO, "SPONSOR_TARGET_NOT_ALLOWED"),
        ];
        for (o, spent, code) in cases {
            assert_eq!(p.evaluate(&o, spent).unwrap_err().code(), code);
        }
        let over = p
            .evaluate(&op(execute(TOKEN, &transfer)), Wei::from(6_000_001u64))
            .unwrap_err();
        assert_eq!(over.code(), "SPONSOR_DAILY_BUDGET_EXCEEDED");
        assert!(
            p.evaluate(&op(execute(TOKEN, &transfer)), Wei::from(6_000_000u64))
                .is_ok(),
            "exactly the budget is allowed"
        );
    }

    #[test]
    fn any_account_and_any_selector_rules() {
        let p = SponsorshipPolicy {
            accounts: AccountRule::Any,
            targets: vec![TargetRule {
                target: OTHER,
                selectors: None,
            }],
            max_gas_per_operation: u64::MAX,
            daily_budget: Wei::new(U256::MAX),
        };
        let mut o = op(execute(OTHER, &[]));
        o.sender = TOKEN;
        assert!(p.evaluate(&o, Wei::ZERO).is_ok());
        let json = serde_json::to_value(&p).unwrap();
        let back: SponsorshipPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
    }
}
