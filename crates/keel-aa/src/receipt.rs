//! One user operation's outcome, read from the receipt of the bundle (`handleOps`)
//! transaction that included it.
//!
//! EntryPoint v0.8 emits, per bundle: validation-phase logs (`AccountDeployed`, a
//! factory's and paymaster's own logs), then one `BeforeExecution`, then per operation in
//! order its execution logs, an optional `UserOperationRevertReason` /
//! `PostOpRevertReason`, and its `UserOperationEvent`. So the logs of operation *i* are
//! those strictly between the previous boundary (`BeforeExecution` or the previous
//! operation's `UserOperationEvent`, both emitted by the **resolved** EntryPoint) and its
//! own `UserOperationEvent` — what rundler and alto return as the receipt's `logs`.

use crate::entry_point::ResolvedEntryPoint;
use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::rpc::types::{Log, TransactionReceipt};
use alloy::sol_types::SolEvent;
use keel_abi::erc4337::IEntryPointV08;
use keel_units::Wei;

/// The outcome of one operation in one bundle (ERC-7769 `eth_getUserOperationReceipt`).
#[derive(Debug, Clone, PartialEq)]
pub struct UserOperationReceipt {
    /// The operation hash (v0.8).
    pub user_op_hash: B256,
    /// The EntryPoint that emitted the events (the resolved one).
    pub entry_point: Address,
    /// The account.
    pub sender: Address,
    /// The operation's nonce.
    pub nonce: U256,
    /// The paymaster (zero address when the account paid).
    pub paymaster: Address,
    /// True when the execution call did not revert.
    pub success: bool,
    /// What the sender or paymaster paid, wei.
    pub actual_gas_cost: Wei,
    /// Gas charged for the operation (including pre-verification gas), gas units.
    pub actual_gas_used: U256,
    /// Revert data of the execution call (`UserOperationRevertReason`), when it reverted
    /// with data.
    pub revert_reason: Option<Bytes>,
    /// Revert data of the paymaster's `postOp` (`PostOpRevertReason`), when it reverted.
    pub post_op_revert_reason: Option<Bytes>,
    /// True when this operation created its account (`AccountDeployed`).
    pub account_deployed: bool,
    /// This operation's execution logs, in order (see the module docs).
    pub logs: Vec<Log>,
    /// The bundle transaction.
    pub transaction_hash: B256,
    /// Its block number, when mined.
    pub block_number: Option<u64>,
    /// Its block hash, when mined.
    pub block_hash: Option<B256>,
}

impl UserOperationReceipt {
    /// The execution revert as text: `Error(string)`'s message, `Panic(uint256)`'s
    /// code, or the raw selector-prefixed hex of a custom error.
    pub fn revert_reason_text(&self) -> Option<String> {
        self.revert_reason.as_ref().map(|data| {
            alloy::sol_types::decode_revert_reason(data).unwrap_or_else(|| data.to_string())
        })
    }
}

fn is_event<E: SolEvent>(log: &Log, entry_point: Address) -> bool {
    log.address() == entry_point && log.topics().first() == Some(&E::SIGNATURE_HASH)
}

fn about(log: &Log, user_op_hash: B256) -> bool {
    log.topics().get(1) == Some(&user_op_hash)
}

/// The receipt of operation `user_op_hash` in `receipt`, or `None` when the bundle does
/// not hold it (no `UserOperationEvent` for it from `entry_point`).
pub fn user_operation_receipt(
    receipt: &TransactionReceipt,
    entry_point: &ResolvedEntryPoint,
    user_op_hash: B256,
) -> Option<UserOperationReceipt> {
    let ep = entry_point.address();
    let logs = receipt.inner.logs();
    let mut start = 0usize;
    let mut account_deployed = false;
    for (i, log) in logs.iter().enumerate() {
        if is_event::<IEntryPointV08::AccountDeployed>(log, ep) && about(log, user_op_hash) {
            account_deployed = true;
        }
        if is_event::<IEntryPointV08::BeforeExecution>(log, ep) {
            start = i + 1;
            continue;
        }
        if !is_event::<IEntryPointV08::UserOperationEvent>(log, ep) {
            continue;
        }
        if !about(log, user_op_hash) {
            start = i + 1;
            continue;
        }
        let event = log
            .log_decode::<IEntryPointV08::UserOperationEvent>()
            .ok()?;
        let event = event.inner.data;
        let own = &logs[start..i];
        let revert_reason = own
            .iter()
            .filter(|l| {
                is_event::<IEntryPointV08::UserOperationRevertReason>(l, ep)
                    && about(l, user_op_hash)
            })
            .find_map(|l| {
                l.log_decode::<IEntryPointV08::UserOperationRevertReason>()
                    .ok()
                    .map(|e| e.inner.data.revertReason)
            });
        let post_op_revert_reason = own
            .iter()
            .filter(|l| {
                is_event::<IEntryPointV08::PostOpRevertReason>(l, ep) && about(l, user_op_hash)
            })
            .find_map(|l| {
                l.log_decode::<IEntryPointV08::PostOpRevertReason>()
                    .ok()
                    .map(|e| e.inner.data.revertReason)
            });
        return Some(UserOperationReceipt {
            user_op_hash,
            entry_point: ep,
            sender: event.sender,
            nonce: event.nonce,
            paymaster: event.paymaster,
            success: event.success,
            actual_gas_cost: Wei::new(event.actualGasCost),
            actual_gas_used: event.actualGasUsed,
            revert_reason,
            post_op_revert_reason,
            account_deployed,
            logs: own.to_vec(),
            transaction_hash: receipt.transaction_hash,
            block_number: receipt.block_number,
            block_hash: receipt.block_hash,
        });
    }
    None
}
