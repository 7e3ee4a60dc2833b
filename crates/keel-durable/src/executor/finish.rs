//! How a segment ends, written: a segment that ran is settled ([`super::settle`]), a
//! command that ran no body is settled alone, a released command goes back to the
//! queue with a backoff, an abandoned one (fenced out) writes nothing.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use uuid::Uuid;

use super::claim::Claimed;
use super::outcome::Outcome;
use super::segment::{Disposition, REFUNDED};
use super::settle::SettleRow;
use crate::engine::Engine;
use crate::error::{DurableError, Result};
use crate::status::RunStatus;
use crate::store;
use crate::version::ClaimSet;

/// The segment settle; a plain one may bring the slot's next command
/// (`want_next`: the workflows to claim from).
pub(super) async fn finish(
    engine: &Engine,
    c: &Claimed,
    token: Uuid,
    disposition: Disposition,
    progress: Option<Value>,
    mut trail: crate::history::SegmentTrail,
    want_next: Option<Arc<ClaimSet>>,
) -> Result<(Outcome, Option<(Claimed, Instant)>, bool)> {
    let max_attempts = i32::try_from(engine.config.command_max_attempts).unwrap_or(i32::MAX);
    match disposition {
        Disposition::Abandon => Ok((Outcome::Fenced, None, false)),
        Disposition::SettleCommand(outcome) => {
            let settled = store::command_settle_alone(
                &engine.pool,
                c.instance_id,
                token,
                c.command_id,
                outcome.as_str(),
            )
            .await?;
            let outcome = if settled { outcome } else { Outcome::Fenced };
            Ok((outcome, None, false))
        }
        Disposition::Release(code) => {
            let attempt = u32::try_from(c.attempt).unwrap_or(1);
            let delay = engine.config.release_backoff.delay(attempt);
            store::command_release(
                &engine.pool,
                c.instance_id,
                token,
                c.command_id,
                delay.as_secs_f64(),
                code,
                REFUNDED.contains(&code),
            )
            .await?;
            Ok((Outcome::Released, None, false))
        }
        Disposition::Settle(s) => {
            let recovery = engine
                .config
                .recovery_backoff
                .delay(u32::try_from(c.recovery_attempts).unwrap_or(0) + 1);
            let wait = match &s.wait {
                Some(w) => {
                    Some(serde_json::to_value(w).map_err(|_| DurableError::Json { what: "wait" })?)
                }
                None => None,
            };
            let timer_at = s.wait.as_ref().and_then(|w| w.deadline);
            let (code, retryable, message, detail) = match s.error {
                Some((c, r, m, d)) => (Some(c), Some(r), Some(m), d),
                None => (None, None, None, None),
            };
            // The decision log: the segment's entries and its state change, appended
            // by the settle statement itself.
            if trail.prior.is_none() {
                trail.prior = crate::history::prior(&engine.pool, c.instance_id)
                    .await
                    .ok()
                    .flatten();
            }
            let history = {
                let prior_progress = trail
                    .prior
                    .as_ref()
                    .and_then(|p| p.history_state.as_ref())
                    .and_then(|st| st.get("progress").cloned());
                let end = match s.status {
                    RunStatus::Waiting => ("wait_entered", wait.clone().unwrap_or(Value::Null)),
                    RunStatus::Suspended => ("suspended", serde_json::json!({ "code": code })),
                    RunStatus::Failed => ("failed", serde_json::json!({ "code": code })),
                    RunStatus::Cancelled => ("cancelled", serde_json::json!({})),
                    _ => ("completed", serde_json::json!({})),
                };
                let after = crate::history::Projection {
                    status: s.status.as_str().to_owned(),
                    progress: trail.last_progress.clone().or(prior_progress),
                    wait: wait.clone(),
                    output: s.output.clone(),
                    error_code: code.clone(),
                    error_retryable: retryable,
                    error_message: message.map(str::to_owned),
                    error_detail: detail.clone(),
                };
                engine.settle_history(&c.workflow, c.kind, trail, end, after)
            };
            let text = |v: Option<Value>, what| match v {
                Some(v) => serde_json::to_string(&v)
                    .map(Some)
                    .map_err(|_| DurableError::Json { what }),
                None => Ok(None),
            };
            let row = SettleRow {
                instance_id: c.instance_id,
                workflow: c.workflow.clone(),
                token,
                status: s.status,
                output: text(s.output, "output")?,
                error_code: code,
                error_retryable: retryable,
                error_message: message,
                error_detail: text(detail, "error detail")?,
                wait: text(wait, "wait")?,
                progress: text(progress, "progress")?,
                outcome: s.outcome,
                command_id: c.command_id,
                history,
                wake_tag: s.wake,
                recovery_secs: recovery.as_secs_f64(),
                max_attempts,
                timer_at: if s.status == RunStatus::Waiting {
                    timer_at
                } else {
                    None
                },
                next: want_next,
            };
            let Some(answer) = engine.segment_settles.submit(row).await else {
                return Err(DurableError::Store(keel_store::StoreError::Transient {
                    kind: keel_store::TransientKind::ConnectionLost,
                    sqlstate: None,
                }));
            };
            let answer = answer?;
            let outcome = if answer.settled {
                s.outcome
            } else {
                Outcome::Fenced
            };
            Ok((outcome, answer.next, answer.drained))
        }
    }
}
