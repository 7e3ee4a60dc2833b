//! The `debug_bundler_*` JSON-RPC namespace (the eth-infinitism bundler-spec-tests'
//! control methods), served only when `aa.debugMethods` is set (off by default: a
//! production bundler must not let a client change its mode or drop operations). Every
//! method acts on the route's chain:
//!
//! | method | params | answer |
//! |---|---|---|
//! | `debug_bundler_setBundlingMode` | `["manual"]` or `["auto"]` | `"ok"`: in manual mode the bundler ([`crate::bundler::Bundler`]) bundles only when asked |
//! | `debug_bundler_sendBundleNow` | `[]` | `"ok"` once the bundle of the operations pending now is settled (included or failed) by the runner, or at once when none is pending. Operations still `accepted` (their workflow's validation not done yet) are waited for first, so an operation `eth_sendUserOperation` accepted is in the bundle; `-32603` after [`SEND_BUNDLE_NOW_WAIT`] |
//! | `debug_bundler_dumpMempool` | `[entryPoint]` | the operations accepted or ready (not yet in a bundle) of that EntryPoint, oldest first, in the ERC-7769 form |
//! | `debug_bundler_clearMempool` / `debug_bundler_clearState` | `[]` | `"ok"`: every operation not yet in a bundle ends `failed` with reason `CLEARED_BY_DEBUG`, its workflow told once; `clearState` also clears the chain's reputation table |
//!
//! The reputation and stake methods are [`crate::validation::debug`]'s. The controls live in `aa_bundler_control` (migration 0080), so they reach the runner's
//! bundler whatever process serves the API.

use crate::flow::{AaChain, AaEnv, OUTCOME_SIGNAL, OutcomeSignal, chain_id_i64};
use crate::service::CallError;
use crate::store;
use alloy::primitives::Address;
use keel_durable::{Actor, DurableError, Engine};
use serde_json::{Value, json};
use std::time::Duration;

/// How long `debug_bundler_sendBundleNow` waits for the runner's bundler to enqueue and
/// settle the bundle.
pub const SEND_BUNDLE_NOW_WAIT: Duration = Duration::from_secs(30);
/// The actor recorded with the outcome signals of cleared operations.
pub const DEBUG_ACTOR: &str = "aa-debug";

fn internal<E>(_: E) -> CallError {
    CallError::internal()
}

fn address_param(params: &Value, index: usize, what: &'static str) -> Result<Address, CallError> {
    params
        .get(index)
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| CallError::invalid_params(what))
}

/// Answers one `debug_bundler_*` call on `chain_id` (see the module docs); `None` for a
/// method of another namespace.
pub(crate) async fn dispatch(
    env: &AaEnv,
    engine: &Engine,
    chain: &AaChain,
    chain_id: u64,
    method: &str,
    params: &Value,
) -> Option<Result<Value, CallError>> {
    let id = chain_id_i64(chain_id);
    let db = &env.db;
    Some(match method {
        "debug_bundler_setBundlingMode" => match params.get(0).and_then(Value::as_str) {
            Some(mode @ ("manual" | "auto")) => {
                store::bundler_control_set_manual(db, id, mode == "manual")
                    .await
                    .map(|()| json!("ok"))
                    .map_err(internal)
            }
            _ => Err(CallError::invalid_params(
                "expected [\"manual\"] or [\"auto\"]",
            )),
        },
        "debug_bundler_sendBundleNow" => send_bundle_now(env, chain_id).await,
        "debug_bundler_dumpMempool" => dump_mempool(env, chain, chain_id, params).await,
        "debug_bundler_clearMempool" => clear_mempool(env, engine, chain_id).await,
        "debug_bundler_clearState" => match clear_mempool(env, engine, chain_id).await {
            Ok(_) => store::reputation_clear(db, id)
                .await
                .map(|_| json!("ok"))
                .map_err(internal),
            Err(e) => Err(e),
        },
        _ => return None,
    })
}

async fn send_bundle_now(env: &AaEnv, chain_id: u64) -> Result<Value, CallError> {
    let id = chain_id_i64(chain_id);
    let db = &env.db;
    let deadline = tokio::time::Instant::now() + SEND_BUNDLE_NOW_WAIT;
    let mut probe = tokio::time::interval(Duration::from_millis(50));
    // Accepted operations are still being validated by their workflows: wait until
    // each is `ready` (or ended), so the bundle holds every operation accepted so far.
    loop {
        probe.tick().await;
        let pending = store::user_operations_pending(db, id, 1_000)
            .await
            .map_err(internal)?;
        if pending.is_empty() {
            return Ok(json!("ok"));
        }
        if pending.iter().all(|r| r.state != store::state::ACCEPTED) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(not_in_time());
        }
    }
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(db)
        .await
        .map_err(internal)?;
    store::bundler_control_send_now(db, id, true)
        .await
        .map_err(internal)?;
    loop {
        probe.tick().await;
        let (_, pending) = store::bundler_control_get(db, id).await.map_err(internal)?;
        if !pending {
            match store::bundle_latest_since(db, id, since)
                .await
                .map_err(internal)?
            {
                None => return Ok(json!("ok")),
                Some((_, state)) if state != "submitted" => return Ok(json!("ok")),
                Some(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(not_in_time());
        }
    }
}

fn not_in_time() -> CallError {
    CallError {
        code: -32603,
        message: "the runner's bundler did not settle a bundle in time; retry".into(),
        data: None,
    }
}

async fn dump_mempool(
    env: &AaEnv,
    chain: &AaChain,
    chain_id: u64,
    params: &Value,
) -> Result<Value, CallError> {
    let named = address_param(params, 0, "expected [entryPoint]")?;
    let resolved = crate::resolve_entry_point(&chain.pool, chain.directory)
        .await
        .map_err(internal)?;
    if !resolved.accepts_for_estimation(named) {
        return Ok(json!([]));
    }
    let rows = store::user_operations_pending(&env.db, chain_id_i64(chain_id), 10_000)
        .await
        .map_err(internal)?;
    Ok(Value::Array(
        rows.into_iter().map(|r| r.user_operation).collect(),
    ))
}

async fn clear_mempool(env: &AaEnv, engine: &Engine, chain_id: u64) -> Result<Value, CallError> {
    let id = chain_id_i64(chain_id);
    let code = crate::Erc7769Code::RejectedByEntryPoint.code();
    let reason = "CLEARED_BY_DEBUG";
    loop {
        let rows = store::user_operations_pending(&env.db, id, 500)
            .await
            .map_err(internal)?;
        if rows.is_empty() {
            return Ok(json!("ok"));
        }
        for row in rows {
            let mut tx = env.db.begin().await.map_err(internal)?;
            let (chain_id, hash) = row.key();
            if store::user_operation_end(
                &mut *tx,
                chain_id,
                hash,
                store::state::FAILED,
                code,
                reason,
            )
            .await
            .map_err(internal)?
            {
                let outcome = OutcomeSignal::ended(store::state::FAILED, code, reason);
                let payload = serde_json::to_value(&outcome).map_err(internal)?;
                match engine
                    .signal_in_as(
                        &mut tx,
                        row.instance_id,
                        OUTCOME_SIGNAL,
                        "debug-clear",
                        &payload,
                        &Actor::system(DEBUG_ACTOR),
                    )
                    .await
                {
                    Ok(_)
                    | Err(DurableError::InstanceEnded { .. } | DurableError::InstanceNotFound(_)) =>
                        {}
                    Err(e) => return Err(internal(e)),
                }
            }
            tx.commit().await.map_err(internal)?;
        }
    }
}
