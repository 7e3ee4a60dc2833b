-- keel-index: the last chain head the tip-ingest owner observed, persisted for Platform
-- Status (issue 22), so every api replica shows the same lag without asking a node.
--
-- head_number       the node's head (eth_blockNumber) at the owner's last observation
-- head_observed_at  when it was recorded (database clock); an old value means the owner
--                   stopped reporting
-- behind_since      since when the indexed tip has been below the observed head (NULL:
--                   caught up at the last observation); the lag in seconds is its age
--
-- Written by the fenced owner only (`owner_epoch` guard), at most once per change of
-- (head, tip) or every few seconds.

ALTER TABLE index_chain
    ADD COLUMN head_number      BIGINT      NULL CHECK (head_number IS NULL OR head_number >= 0),
    ADD COLUMN head_observed_at TIMESTAMPTZ NULL,
    ADD COLUMN behind_since     TIMESTAMPTZ NULL,
    ADD CHECK ((head_number IS NULL) = (head_observed_at IS NULL));
