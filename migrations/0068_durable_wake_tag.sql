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
    ADD COLUMN wake_tag TEXT CHECK (wake_tag IS NULL OR char_length(wake_tag) BETWEEN 1 AND 255);

CREATE INDEX durable_instance_wake ON durable_instance (wake_tag)
    WHERE status = 'suspended' AND wake_tag IS NOT NULL;
