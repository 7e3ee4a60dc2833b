-- keel-txq: settled writes stay watched until their block is final (issue 32 §10).
--
-- A request settled `confirmed` or `reverted` at the confirmation depth used to be
-- forgotten; a reorg after that verdict went unnoticed. The queue now keeps looking at
-- it until the verdict's block is final for the chain (see TxQueueConfig::finality):
--
-- final_at      database clock when the verdict's block was found final (or the
--               verdict was replaced by REORGED_OUT): the watch ended; NULL while
--               watched (rows settled before this migration are checked once and
--               marked: their blocks are old)
-- reorged_at    set while a reorg has the verdict's transaction out of the chain (NULL
--               again once it is re-included; kept on a REORGED_OUT verdict)
-- reorgs        how many times that happened (the transaction re-included, or its
--               exact bytes re-broadcast while the nonce was free)
--
-- Additive: nullable columns, a constant default, a partial index over the watched rows.

ALTER TABLE txq_request
    ADD COLUMN final_at   TIMESTAMPTZ,
    ADD COLUMN reorged_at TIMESTAMPTZ,
    ADD COLUMN reorgs     INTEGER NOT NULL DEFAULT 0 CHECK (reorgs >= 0);

CREATE INDEX txq_request_watched ON txq_request (chain_id, settled_at)
    WHERE state = 'settled' AND final_at IS NULL AND verdict_kind IN ('confirmed', 'reverted');
