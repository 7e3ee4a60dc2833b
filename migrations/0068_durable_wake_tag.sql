-- keel-durable: wake tags of suspended instances (issue 32, class 4: "a chain that comes
-- back is served minutes later").
--
-- durable_instance.wake_tag   set by the segment settle of a suspension whose step
--                             failed with `StepError::Unavailable` (the event that ends
--                             the failure is known: `chain:<chainId>` for a configured
--                             chain this runner does not serve yet); NULL for every
--                             other settle. Engine::wake_suspended(tag) records a RETRY
--                             due now for every suspended instance with that tag (the
--                             runner calls it when the chain becomes served), instead of
--                             leaving them to their recovery backoff (1 s doubling to
--                             300 s). Only read together with status = 'suspended'.

ALTER TABLE durable_instance
    ADD COLUMN IF NOT EXISTS wake_tag TEXT CHECK (wake_tag IS NULL OR char_length(wake_tag) BETWEEN 1 AND 255);

CREATE INDEX IF NOT EXISTS durable_instance_wake ON durable_instance (wake_tag)
    WHERE status = 'suspended' AND wake_tag IS NOT NULL;

-- Issue 32, class 6 (used by migration 0069 and the status projection): whether
-- instance p is a `pending` one whose START was never claimed (its body never ran) and
-- that is deferred by its version: a runner of its workflow is live (seen within 30 s,
-- crate::version::RUNNER_LIVENESS) but none can run its pinned version (a release was
-- rolled back). Such an instance does not hold its serialization key (see 0069). With
-- no live runner of the workflow at all nothing is skipped: start order is kept.
-- Idempotent, like the rest of this file (upgrade tests apply it over older schemas).
CREATE OR REPLACE FUNCTION durable_deferred_unstarted(p_id UUID, p_workflow TEXT, p_version INTEGER,
                                           p_status TEXT)
RETURNS BOOLEAN
LANGUAGE sql STABLE
AS $$
    SELECT p_status = 'pending'
       AND EXISTS (SELECT 1 FROM durable_command s
                    WHERE s.instance_id = p_id AND s.kind = 'start' AND s.state = 'queued'
                      AND s.attempt = 0)
       AND EXISTS (SELECT 1 FROM durable_runner_version r
                    WHERE r.workflow = p_workflow AND r.seen_at > now() - interval '30 seconds')
       AND NOT EXISTS (SELECT 1 FROM durable_runner_version r
                        WHERE r.workflow = p_workflow
                          AND r.seen_at > now() - interval '30 seconds'
                          AND (p_version IS NULL OR p_version BETWEEN r.min_version AND r.max_version))
$$;
