//! The bundler's JSON-RPC 2.0 methods (ERC-7769) over [`AaService`]: the envelope,
//! the call errors and the dispatch.

use super::*;

pub(super) fn rpc_error(id: &Value, code: i32, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let Some(d) = data {
        error["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

pub(super) fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC call's failure.
pub(crate) struct CallError {
    pub(crate) code: i32,
    pub(crate) message: std::borrow::Cow<'static, str>,
    pub(crate) data: Option<Value>,
}

impl CallError {
    pub(crate) fn invalid_params(message: &'static str) -> Self {
        Self {
            code: -32602,
            message: message.into(),
            data: None,
        }
    }

    /// `-32602` naming the field of the user operation at fault (`data.field`).
    pub(crate) fn malformed(e: &crate::MalformedField) -> Self {
        Self {
            code: -32602,
            message: e.to_string().into(),
            data: Some(json!({ "field": e.field })),
        }
    }

    pub(crate) fn internal() -> Self {
        Self {
            code: -32603,
            message: "internal error; retry".into(),
            data: None,
        }
    }
}

impl From<SendError> for CallError {
    fn from(e: SendError) -> Self {
        let code = e.code();
        match e {
            SendError::Rejected { reason, revert, .. } => {
                let inner = revert
                    .as_ref()
                    .and_then(|b| crate::rejection::revert_reason_text(b));
                let message = match &inner {
                    Some(text) => format!("user operation rejected by the EntryPoint: {reason}: {text}"),
                    None => format!("user operation rejected by the EntryPoint: {reason}"),
                };
                let mut data = json!({ "reason": reason });
                if let Some(r) = revert {
                    data["revertData"] = json!(r);
                }
                Self {
                    code,
                    message: message.into(),
                    data: Some(data),
                }
            }
            SendError::Violation { reason, breach, .. } => Self {
                code,
                message: breach.message.into(),
                data: Some(json!({
                    "reason": reason,
                    "rule": breach.rule,
                    "entity": breach.entity.as_str(),
                })),
            },
            SendError::Refused(r) => Self {
                code,
                message: r.message().into(),
                data: Some(json!({ "field": r.field, "reason": r.reason })),
            },
            SendError::Submit(SubmitError::ReferenceAddress) => Self {
                code,
                message: "the EntryPoint named is the configured reference; rebuild and re-sign the user operation against the resolved EntryPoint (eth_supportedEntryPoints)".into(),
                data: None,
            },
            SendError::Submit(SubmitError::UnsupportedEntryPoint) => Self {
                code,
                message: "unsupported EntryPoint (see eth_supportedEntryPoints)".into(),
                data: None,
            },
            SendError::Submit(SubmitError::Malformed(e)) => Self {
                code,
                message: format!("malformed user operation: {e}").into(),
                data: None,
            },
            SendError::Submit(SubmitError::ChainNotServed(_)) => Self {
                code,
                message: "chain not served".into(),
                data: None,
            },
            _ => Self::internal(),
        }
    }
}

/// The latest block's base fee and gas limit ([`ChainView`]).
///
/// # Errors
/// The chain access error.
pub async fn chain_view(
    pool: &keel_chain::UpstreamPool,
) -> Result<ChainView, keel_chain::ChainError> {
    let latest = alloy::rpc::types::BlockNumberOrTag::Latest;
    let base_fee = pool
        .header(latest)
        .await?
        .and_then(|h| h.base_fee_per_gas)
        .map_or(0, |fee| {
            u128::try_from(fee.wei_per_gas).unwrap_or(u128::MAX)
        });
    let block_gas_limit = pool.block_gas_limit(latest).await?;
    Ok(ChainView {
        base_fee_per_gas: base_fee,
        block_gas_limit,
    })
}

pub(super) fn hash_param(params: &Value) -> Result<B256, CallError> {
    params
        .get(0)
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<B256>().ok())
        .ok_or_else(|| {
            CallError::invalid_params(
                "Missing/invalid userOpHash: expected [userOpHash], a 0x-prefixed 32-byte hash",
            )
        })
}

pub(super) fn hex_u64(n: u64) -> String {
    format!("{n:#x}")
}

impl AaService {
    /// Answers one JSON-RPC 2.0 request body (a single request or a batch) for `chain_id`
    /// on behalf of `organization_id` (see the module docs). Always a JSON-RPC response
    /// value; never fails.
    pub async fn rpc(&self, chain_id: u64, organization_id: Option<Uuid>, body: &[u8]) -> Value {
        let Ok(request) = serde_json::from_slice::<Value>(body) else {
            return rpc_error(&Value::Null, -32700, "parse error", None);
        };
        match request {
            Value::Array(calls) if !calls.is_empty() && calls.len() <= 32 => {
                let mut out = Vec::with_capacity(calls.len());
                for call in calls {
                    out.push(self.call(chain_id, organization_id, call).await);
                }
                Value::Array(out)
            }
            Value::Array(_) => rpc_error(
                &Value::Null,
                -32600,
                "invalid request: a batch holds 1 to 32 calls",
                None,
            ),
            call => self.call(chain_id, organization_id, call).await,
        }
    }

    pub(super) async fn call(
        &self,
        chain_id: u64,
        organization_id: Option<Uuid>,
        call: Value,
    ) -> Value {
        let id = call.get("id").cloned().unwrap_or(Value::Null);
        let (Some("2.0"), Some(method)) = (
            call.get("jsonrpc").and_then(Value::as_str),
            call.get("method").and_then(Value::as_str),
        ) else {
            return rpc_error(&id, -32600, "invalid request", None);
        };
        let params = call.get("params").cloned().unwrap_or(Value::Array(vec![]));
        match self
            .dispatch(chain_id, organization_id, method, &params)
            .await
        {
            Ok(result) => rpc_result(&id, result),
            Err(e) => rpc_error(&id, e.code, &e.message, e.data),
        }
    }

    pub(super) async fn dispatch(
        &self,
        chain_id: u64,
        organization_id: Option<Uuid>,
        method: &str,
        params: &Value,
    ) -> Result<Value, CallError> {
        let chain = self.env.chain(chain_id).ok_or(CallError {
            code: -32602,
            message: "chain not served".into(),
            data: None,
        })?;
        match method {
            "eth_chainId" => Ok(json!(hex_u64(chain_id))),
            "eth_supportedEntryPoints" => {
                let r = resolve_entry_point(&chain.pool, chain.directory)
                    .await
                    .map_err(|_| CallError::internal())?;
                Ok(json!([r.resolved.address().to_checksum(None)]))
            }
            "eth_sendUserOperation" => {
                let op: UserOperation = match params.get(0) {
                    Some(v) => {
                        crate::parse_user_operation(v).map_err(|e| CallError::malformed(&e))?
                    }
                    None => {
                        return Err(CallError::invalid_params(
                            "expected [userOperation, entryPoint]",
                        ));
                    }
                };
                let ep: Address = params
                    .get(1)
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| {
                        CallError::invalid_params("expected [userOperation, entryPoint]")
                    })?;
                let s = self.send(chain_id, ep, op, organization_id).await?;
                Ok(json!(s.user_op_hash))
            }
            "eth_getUserOperationByHash" => {
                let hash = hash_param(params)?;
                let Some(row) = self.row(chain_id, hash, organization_id).await? else {
                    return Ok(Value::Null);
                };
                if row.state == store::state::FAILED
                    || row.state == store::state::NONCE_USED_ELSEWHERE
                {
                    // Ended without inclusion: neither pending nor included, ever.
                    return Ok(Value::Null);
                }
                let resolution: Resolution = serde_json::from_value(row.resolution.clone())
                    .map_err(|_| CallError::internal())?;
                Ok(json!({
                    "userOperation": row.user_operation,
                    "entryPoint": resolution.resolved.address().to_checksum(None),
                    "blockNumber": row.block_number.and_then(|n| u64::try_from(n).ok()).map(hex_u64),
                    "blockHash": b256(&row.block_hash),
                    "transactionHash": b256(&row.tx_hash),
                }))
            }
            "eth_getUserOperationReceipt" => {
                let hash = hash_param(params)?;
                let Some(row) = self.row(chain_id, hash, organization_id).await? else {
                    return Ok(Value::Null);
                };
                let Some(tx) = b256(&row.tx_hash).filter(|_| row.state == store::state::INCLUDED)
                else {
                    return Ok(Value::Null);
                };
                let resolution: Resolution = serde_json::from_value(row.resolution.clone())
                    .map_err(|_| CallError::internal())?;
                let receipts = chain
                    .pool
                    .receipts(&[tx])
                    .await
                    .map_err(|_| CallError::internal())?;
                // The chain's answer: a reorg may have the bundle out right now (the
                // bundler then moves the row back to `bundled`).
                let Some(Some(receipt)) = receipts.into_iter().next() else {
                    return Ok(Value::Null);
                };
                let Some(r) = user_operation_receipt(&receipt, &resolution.resolved, hash) else {
                    return Ok(Value::Null);
                };
                Ok(json!({
                    "userOpHash": hash,
                    "entryPoint": r.entry_point.to_checksum(None),
                    "sender": r.sender.to_checksum(None),
                    "nonce": format!("{:#x}", r.nonce),
                    "paymaster": r.paymaster.to_checksum(None),
                    "actualGasCost": format!("{:#x}", r.actual_gas_cost.get()),
                    "actualGasUsed": format!("{:#x}", r.actual_gas_used),
                    "success": r.success,
                    "reason": r.revert_reason.map(|b| b.to_string()).unwrap_or_default(),
                    "logs": r.logs,
                    "receipt": receipt,
                }))
            }
            "keel_getUserOperationStatus" => {
                let hash = hash_param(params)?;
                let st = self
                    .user_operation_status(chain_id, hash, organization_id)
                    .await
                    .map_err(|_| CallError::internal())?;
                serde_json::to_value(st).map_err(|_| CallError::internal())
            }
            "eth_estimateUserOperationGas" => crate::estimate::estimate_rpc(chain, params).await,
            "pm_getPaymasterStubData" => {
                crate::estimate::paymaster_stub_rpc(chain, chain_id, params).await
            }
            "pm_getPaymasterData" => {
                crate::estimate::paymaster_data_rpc(
                    &self.env,
                    chain,
                    chain_id,
                    organization_id,
                    params,
                )
                .await
            }
            m if m.starts_with("debug_bundler_") => {
                // Bundling mode and mempool ([`crate::debug`], `aa.debugMethods` through
                // `with_debug_namespace`); reputation and stake ([`crate::validation::debug`]).
                let handled = if self.debug_namespace {
                    crate::debug::dispatch(&self.env, &self.engine, chain, chain_id, m, params)
                        .await
                } else {
                    None
                };
                match handled {
                    Some(answer) => answer,
                    None => crate::validation::debug::rpc(&self.env.db, chain, m, params).await,
                }
            }
            _ => Err(CallError {
                code: -32601,
                message: "method not found".into(),
                data: None,
            }),
        }
    }

    pub(super) async fn row(
        &self,
        chain_id: u64,
        hash: B256,
        organization_id: Option<Uuid>,
    ) -> Result<Option<UserOperationRow>, CallError> {
        let row =
            store::user_operation_get(&self.env.db, flow::chain_id_i64(chain_id), hash.as_slice())
                .await
                .map_err(|_| CallError::internal())?;
        Ok(row.filter(|r| organization_id.is_none() || r.organization_id == organization_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Breach, rules::Entity};

    /// A rule violation is answered with the reference bundler's phrasing and the rule,
    /// not as the EntryPoint's refusal; Keel's reason, rule and entity are in `data`.
    #[test]
    fn a_rule_violation_is_not_called_the_entry_point_s_refusal() {
        let e = CallError::from(SendError::Violation {
            code: Erc7769Code::BannedOpcode,
            reason: "OP-011 account TIMESTAMP".to_owned(),
            breach: Breach {
                rule: "OP-011",
                entity: Entity::Account,
                message: "account uses banned opcode: TIMESTAMP (OP-011)".to_owned(),
            },
        });
        assert_eq!(e.code, -32502);
        assert_eq!(e.message, "account uses banned opcode: TIMESTAMP (OP-011)");
        assert_eq!(
            e.data,
            Some(
                json!({"reason": "OP-011 account TIMESTAMP", "rule": "OP-011", "entity": "account"})
            )
        );
        let r = CallError::from(SendError::Rejected {
            code: Erc7769Code::RejectedByEntryPoint,
            reason: "AA25 invalid account nonce".to_owned(),
            revert: None,
        });
        assert_eq!(
            r.message,
            "user operation rejected by the EntryPoint: AA25 invalid account nonce"
        );
    }
}
