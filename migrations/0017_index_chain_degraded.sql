-- Ledger Index (keel-index): a chain whose reorg replaced a block at or below the
-- chain's finalized block is marked degraded. Tip ingest of that chain stops (once,
-- loudly) and reads report the index as degraded until an operator re-indexes the
-- chain (which clears the marker). NULL = healthy.
ALTER TABLE index_chain
    ADD COLUMN degraded_at     TIMESTAMPTZ NULL,
    ADD COLUMN degraded_reason TEXT        NULL,
    ADD COLUMN degraded_block  BIGINT      NULL,
    ADD CHECK ((degraded_at IS NULL) = (degraded_reason IS NULL));
