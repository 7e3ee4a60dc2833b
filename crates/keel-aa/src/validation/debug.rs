//! The `debug_bundler_*` methods of the bundler JSON-RPC (the ERC-4337 bundler spec
//! tests' debug namespace), answered only when [`super::ValidationSettings::debug_methods`]
//! is on for the chain (`aa.debugMethods`, off by default: they change chain-wide state
//! and any caller of the bundler route could call them).
//!
//! | method | params | result |
//! |---|---|---|
//! | `debug_bundler_dumpReputation` | `[entryPoint]` | `[{address, opsSeen, opsIncluded, status}]` (hex counts) |
//! | `debug_bundler_setReputation` | `[[{address, opsSeen, opsIncluded}], entryPoint]` | `"ok"` |
//! | `debug_bundler_clearReputation` | `[]` | `"ok"` |
//! | `debug_bundler_getStakeStatus` | `[address, entryPoint]` | `{stakeInfo: {addr, stake, unstakeDelaySec}, isStaked}` |
//!
//! The bundling-mode and mempool methods (`setBundlingMode`, `sendBundleNow`,
//! `dumpMempool`, `clearMempool`, `clearState`) are [`crate::debug`]'s.

use super::{IStakeQueryV08, settings};
use crate::flow::AaChain;
use crate::service::CallError;
use crate::store;
use alloy::primitives::{Address, TxKind, U256};
use alloy::rpc::types::{BlockNumberOrTag, TransactionInput, TransactionRequest};
use alloy::sol_types::SolCall;
use serde_json::{Value, json};
use sqlx::PgPool;

fn count(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => match s.strip_prefix("0x") {
            Some(h) => i64::from_str_radix(h, 16).ok(),
            None => s.parse().ok(),
        },
        _ => None,
    }
    .filter(|n| *n >= 0)
}

fn address(v: Option<&Value>) -> Option<Address> {
    v?.as_str()?.parse().ok()
}

/// Answers `method` (a `debug_bundler_*` name) for `chain`.
pub(crate) async fn rpc(
    db: &PgPool,
    chain: &AaChain,
    method: &str,
    params: &Value,
) -> Result<Value, CallError> {
    let chain_id = chain.pool.chain().get();
    let s = settings(chain_id);
    let not_found = CallError {
        code: -32601,
        message: "method not found".into(),
        data: None,
    };
    if !s.debug_methods {
        return Err(not_found);
    }
    let db_chain = crate::flow::chain_id_i64(chain_id);
    let db_err = |_| CallError::internal();
    match method {
        "debug_bundler_dumpReputation" => {
            let rows = store::reputation_list(db, db_chain).await.map_err(db_err)?;
            Ok(Value::Array(
                rows.into_iter()
                    .map(|r| {
                        let a = r.address.0;
                        let status = s.reputation.status(store::ReputationRow {
                            ops_seen: r.ops_seen,
                            ops_included: r.ops_included,
                        });
                        json!({
                            "address": a.to_checksum(None),
                            "opsSeen": format!("{:#x}", r.ops_seen),
                            "opsIncluded": format!("{:#x}", r.ops_included),
                            "status": status.as_str(),
                        })
                    })
                    .collect(),
            ))
        }
        "debug_bundler_setReputation" => {
            let entries = params
                .get(0)
                .and_then(Value::as_array)
                .ok_or_else(|| CallError::invalid_params("expected [[reputation], entryPoint]"))?;
            let mut parsed = Vec::with_capacity(entries.len());
            for e in entries {
                let (Some(a), Some(seen), Some(included)) = (
                    address(e.get("address")),
                    count(e.get("opsSeen")),
                    count(e.get("opsIncluded")),
                ) else {
                    return Err(CallError::invalid_params(
                        "each entry needs address, opsSeen and opsIncluded",
                    ));
                };
                parsed.push((a, seen, included));
            }
            for (a, seen, included) in parsed {
                store::reputation_set(db, db_chain, a.as_slice(), seen, included)
                    .await
                    .map_err(db_err)?;
            }
            Ok(json!("ok"))
        }
        "debug_bundler_clearReputation" => {
            store::reputation_clear(db, db_chain)
                .await
                .map_err(db_err)?;
            Ok(json!("ok"))
        }
        "debug_bundler_getStakeStatus" => {
            let (Some(a), Some(ep)) = (address(params.get(0)), address(params.get(1))) else {
                return Err(CallError::invalid_params("expected [address, entryPoint]"));
            };
            let call = IStakeQueryV08::getDepositInfoCall { account: a };
            let tx = TransactionRequest {
                to: Some(TxKind::Call(ep)),
                input: TransactionInput::new(call.abi_encode().into()),
                ..Default::default()
            };
            let out = chain
                .pool
                .call(&tx, BlockNumberOrTag::Latest)
                .await
                .map_err(|_| CallError::internal())?;
            let info = IStakeQueryV08::getDepositInfoCall::abi_decode_returns(&out)
                .map_err(|_| CallError::internal())?;
            let staked = info.staked
                && U256::from(info.stake) >= s.min_stake_wei
                && info.unstakeDelaySec >= s.min_unstake_delay_secs;
            Ok(json!({
                "stakeInfo": {
                    "addr": a.to_checksum(None),
                    "stake": format!("{:#x}", U256::from(info.stake)),
                    "unstakeDelaySec": format!("{:#x}", info.unstakeDelaySec),
                },
                "isStaked": staked,
            }))
        }
        _ => Err(not_found),
    }
}
