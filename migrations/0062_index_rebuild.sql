-- keel-index (issue 32 §2): an operator's re-index of a chain (`keel index reindex`, the
-- admin API route) without SQL.
--
-- rebuild_started_at   when the running rebuild was requested (NULL: none running). Reads
--                      say `indexRebuilding` while it is set; the tip-ingest owner clears
--                      it once the chain has a tip again and every history range of the
--                      chain is completed.
-- rebuild_from_block   the first block the last rebuild re-indexes: history planning
--                      starts there (not at the scope's lowest `from_block`) when no
--                      range is left above it.
ALTER TABLE index_chain
    ADD COLUMN rebuild_started_at TIMESTAMPTZ NULL,
    ADD COLUMN rebuild_from_block BIGINT      NULL CHECK (rebuild_from_block IS NULL OR rebuild_from_block >= 0);
