//! The validation trace: `debug_traceCall` of `handleOps([op], bundler)` on the resolved
//! EntryPoint with Keel's JavaScript tracer (`tracer.js`), parsed into [`Trace`].
//!
//! Why a JavaScript tracer: Anvil 1.7 (revm-inspectors) answers the struct logger,
//! `callTracer`, `prestateTracer` and JavaScript tracers (no native ERC-7562 tracer).
//! The struct logger gives no memory without `enableMemory` (needed for the preimages
//! of `KECCAK256`, which decide the ERC-7562 "associated storage", and for the
//! selectors of calls to the EntryPoint) and answers megabytes per operation; the
//! JavaScript tracer folds every step into a few hundred bytes per validation phase.
//!
//! The tracer splits the trace into phases: one per call the EntryPoint (depth 1) makes
//! (`SenderCreator.createSender`, `validateUserOp`, `validatePaymasterUserOp`), and
//! stops at the first call of the EntryPoint to itself (`innerHandleOp`: the execution
//! phase, which ERC-7562 does not restrict). Per phase it records the banned-opcode
//! uses (with the executing address), the storage slots read and written per address
//! (persistent and transient), the `KECCAK256` preimages of 32 to 128 bytes, the
//! `*CALL`/`EXTCODE*` targets (with whether they have code, whether a value is sent,
//! and the selector and first argument of calls to the EntryPoint; for `EXTCODESIZE`
//! whether `ISZERO` follows), the `CREATE2` uses, whether a frame ran out of gas, and
//! the return data of the EntryPoint's call (the paymaster's `context`). Frames running
//! the EntryPoint's own code are not recorded.

use alloy::primitives::{Address, B256, Bytes, TxKind};
use alloy::rpc::types::{TransactionInput, TransactionRequest};
use keel_chain::{ChainError, UpstreamPool};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;

/// The tracer's source (a geth-style JavaScript tracer object).
pub const TRACER_JS: &str = include_str!("tracer.js");

/// One banned (or stake-gated) opcode use.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct OpcodeUse {
    /// The opcode's name (`TIMESTAMP`, `GAS` when not followed by a `*CALL`, ...).
    pub op: String,
    /// The address whose code (storage context) executed it.
    pub addr: Address,
}

/// One `*CALL` or `EXTCODE*` of a phase.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct CallUse {
    /// `CALL`, `STATICCALL`, `DELEGATECALL`, `CALLCODE`, `EXTCODESIZE`, ...
    pub op: String,
    /// The calling address (storage context).
    pub from: Address,
    /// The target.
    pub to: Address,
    /// Whether the target had code when accessed.
    pub code: bool,
    /// Whether a nonzero value was sent.
    pub value: bool,
    /// Calls to the EntryPoint: the selector (`0x…`), `""` for empty calldata,
    /// `"short"` for 1 to 3 bytes; empty for other targets.
    pub sel: String,
    /// Calls to the EntryPoint with at least 36 bytes of calldata: the address in the
    /// first argument word (`depositTo(address)`'s account); empty otherwise.
    #[serde(default)]
    pub arg: String,
    /// `EXTCODESIZE`: whether the next opcode was `ISZERO` (ERC-7562 OP-051).
    #[serde(default)]
    pub iszero: bool,
}

/// One phase: the frames under one call of the EntryPoint.
#[derive(Debug, Clone, Deserialize)]
pub struct Phase {
    /// The EntryPoint's callee.
    pub to: Address,
    /// The selector of the EntryPoint's call (`0x…`).
    pub sel: String,
    /// Banned or stake-gated opcodes used.
    pub ops: Vec<OpcodeUse>,
    /// Storage accessed: address → `"<s|t><r|w>:0x<slot>"` keys.
    pub acc: HashMap<Address, HashMap<String, u8>>,
    /// Calls and code accesses.
    pub calls: Vec<CallUse>,
    /// `KECCAK256` preimages (hex) of 32 to 128 bytes.
    pub keccak: Vec<Bytes>,
    /// The addresses that executed `CREATE2`, one entry per use.
    pub create2: Vec<Address>,
    /// Whether a frame of the phase ran out of gas.
    pub oog: bool,
    /// The return data of the EntryPoint's call (the first 4096 bytes; for
    /// `validatePaymasterUserOp`, the ABI-encoded `(context, validationData)`).
    #[serde(default)]
    pub out: Bytes,
}

/// One storage access of a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotAccess {
    /// The contract whose storage was accessed.
    pub address: Address,
    /// The slot.
    pub slot: B256,
    /// A write (`SSTORE`/`TSTORE`) rather than a read.
    pub write: bool,
    /// Transient storage (EIP-1153), treated like persistent storage (ERC-7562 OP-070).
    pub transient: bool,
}

impl Phase {
    /// The storage accesses, parsed (unparseable keys are skipped), one per (address,
    /// kind of storage, slot) — a write when the slot was written at all — sorted.
    pub fn accesses(&self) -> Vec<SlotAccess> {
        let mut merged: std::collections::BTreeMap<(Address, bool, B256), bool> =
            std::collections::BTreeMap::new();
        for (address, keys) in &self.acc {
            for key in keys.keys() {
                let Some((kind, slot)) = key.split_once(':') else {
                    continue;
                };
                let Some(slot) = parse_word(slot) else {
                    continue;
                };
                let write = merged
                    .entry((*address, kind.starts_with('t'), slot))
                    .or_insert(false);
                *write |= kind.ends_with('w');
            }
        }
        merged
            .into_iter()
            .map(|((address, transient, slot), write)| SlotAccess {
                address,
                slot,
                write,
                transient,
            })
            .collect()
    }
}

fn parse_word(hex: &str) -> Option<B256> {
    let digits = hex.strip_prefix("0x")?;
    let n = alloy::primitives::U256::from_str_radix(digits, 16).ok()?;
    Some(B256::from(n))
}

/// The tracer's answer.
#[derive(Debug, Clone, Deserialize)]
pub struct Trace {
    /// The validation phases in order.
    pub phases: Vec<Phase>,
    /// Errors the tracer caught (a step it could not read); non-empty fails closed.
    #[serde(default)]
    pub errors: Vec<String>,
    /// The call's return data (the revert data when `error` is set).
    pub output: Bytes,
    /// The call's error (`execution reverted`, ...); empty on success.
    pub error: String,
}

/// The tracer configuration sent with `debug_traceCall`.
fn tracer_options() -> serde_json::Value {
    json!({ "tracer": TRACER_JS, "timeout": "10s" })
}

/// Traces `handleOps` calldata `data` sent from `from` to `entry_point` at the latest
/// block, with the operations' EIP-7702 `authorizations` applied (`authorizationList`,
/// see [`crate::eip7702`]; the delegations happen before the traced call, so they add
/// no frame or opcode to the trace).
///
/// # Errors
/// The chain error when the node does not answer or refuses the trace (a node without
/// `debug_traceCall` or JavaScript tracers answers a method or parameter error).
pub async fn trace_call(
    pool: &UpstreamPool,
    entry_point: Address,
    from: Address,
    data: Bytes,
    authorizations: Option<Vec<alloy::eips::eip7702::SignedAuthorization>>,
) -> Result<Trace, ChainError> {
    let tx = TransactionRequest {
        from: Some(from),
        to: Some(TxKind::Call(entry_point)),
        input: TransactionInput::new(data),
        authorization_list: authorizations,
        ..Default::default()
    };
    pool.request("debug_traceCall", (tx, "latest", tracer_options()))
        .await
}

/// Whether the node answers `debug_traceCall` with Keel's tracer: a trace of a plain
/// call from the zero address to itself.
///
/// # Errors
/// The chain error of the probe.
pub async fn probe(pool: &UpstreamPool) -> Result<(), ChainError> {
    let tx = TransactionRequest {
        from: Some(Address::ZERO),
        to: Some(TxKind::Call(Address::ZERO)),
        ..Default::default()
    };
    let _: Trace = pool
        .request("debug_traceCall", (tx, "latest", tracer_options()))
        .await?;
    Ok(())
}
