-- Issue 37 §3: the agent-operation rules of an asset template.
--   forced_transfer_skips_compliance: an `asset.forced-transfer` of the template's assets
--     does not ask the compliance contract about the receiver (default: it does).
--   batch_max_recipients: the most recipients an `asset.batch-mint` or
--     `asset.batch-transfer` may name (one transaction each).
ALTER TABLE asset_template
    ADD COLUMN IF NOT EXISTS forced_transfer_skips_compliance boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS batch_max_recipients integer NOT NULL DEFAULT 100
        CHECK (batch_max_recipients BETWEEN 1 AND 500);
