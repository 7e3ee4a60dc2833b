//! Spans of one request that join the trace it was enqueued in (its
//! `trace_context`, migration 0060; see [`keel_service::trace`]). Requests enqueued
//! without trace export get none: the queue's own loop spans cover them.

use crate::store::RequestRow;

/// A span `txq.<stage>` (target `keel::txq`, fields `request_id`, `nonce`, `outcome`)
/// that continues `req`'s trace; `None` when the request carries no trace context. It
/// lasts until dropped: create it before the stage's I/O, record `outcome`, drop it
/// after.
pub(super) fn request_span(stage: &'static str, req: &RequestRow) -> Option<tracing::Span> {
    let traceparent = req.trace_context.as_deref()?;
    let span = tracing::info_span!(target: "keel::txq", "txq.request",
        otel.name = stage, request_id = %req.id, nonce = req.nonce,
        outcome = tracing::field::Empty);
    keel_service::trace::continue_trace(&span, traceparent);
    Some(span)
}

/// Records `outcome` on `span` when there is one.
pub(super) fn record_outcome(span: Option<&tracing::Span>, outcome: &str) {
    if let Some(s) = span {
        s.record("outcome", outcome);
    }
}
