-- Trace context carried through the rows of an operation (issue 22, "one trace per
-- operation ... so a trace survives a process restart").
--
-- durable_instance.trace_context  the W3C `traceparent` (https://www.w3.org/TR/trace-context/)
--                                 of the span that started the instance (the API request
--                                 that accepted it, or the parent's segment for a child);
--                                 the runner's segment spans of the instance continue it.
-- txq_request.trace_context       the `traceparent` of the segment that enqueued the
--                                 request; the queue's broadcast and settlement spans of
--                                 the request continue it.
--
-- NULL: written without trace export (the default) or before this migration; such rows
-- start their own traces as before. Nullable columns without defaults: adding them
-- rewrites no row.
ALTER TABLE durable_instance ADD COLUMN IF NOT EXISTS trace_context text;
ALTER TABLE txq_request ADD COLUMN IF NOT EXISTS trace_context text;
