//! W3C trace context carried through rows (<https://www.w3.org/TR/trace-context/>),
//! so one operation's spans form one trace across processes and restarts: the API
//! request that accepted it, the runner's workflow segments, the queue's broadcast and
//! settlement of its transactions.
//!
//! The context is stored as a `traceparent` header value (`00-<32 hex trace id>-<16 hex
//! parent span id>-<2 hex flags>`, 55 characters). Both functions use the process's
//! global OpenTelemetry propagator: until the binary installs one (trace export on,
//! `keel_service` never installs it), [`current_traceparent`] returns `None` and
//! [`continue_trace`] changes nothing, so rows written without export carry no context.

use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The longest `traceparent` accepted from a row (version 00 is 55 characters; later
/// versions may append fields).
pub const TRACEPARENT_MAX: usize = 512;

/// The current span's trace context as a W3C `traceparent` value; `None` when no
/// propagator is installed or the current span has no valid OpenTelemetry context.
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let mut carrier: HashMap<String, String> = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier
        .remove("traceparent")
        .filter(|v| !v.is_empty() && v.len() <= TRACEPARENT_MAX)
}

/// Makes `span` a child of the span named by `traceparent` (a value written by
/// [`current_traceparent`]), so it joins that trace. Call before the span is first
/// entered. A malformed or oversized value, or no installed propagator, leaves the span
/// as it was (its own trace).
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || traceparent.len() > TRACEPARENT_MAX {
        return;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    let _ = span.set_parent(parent);
}
