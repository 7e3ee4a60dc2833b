-- keel-txq: indexes for Platform Status (`keel_txq::queue_health`, issue 22).
--
-- txq_request_unsettled  per (chain, sender): the unsettled requests by age (depth,
--                        waiting funding, in flight, oldest unsettled) without a scan of
--                        the settled history
-- txq_attempt_replaced   replacements (attempt > 1) by time, for "replacements in the
--                        last hour"

CREATE INDEX txq_request_unsettled ON txq_request (chain_id, sender, created_at)
    WHERE state <> 'settled';
CREATE INDEX txq_attempt_replaced ON txq_attempt (created_at) WHERE attempt > 1;
