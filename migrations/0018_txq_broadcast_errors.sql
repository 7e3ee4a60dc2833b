-- keel-txq: what went wrong with a request's broadcasts (issue 16, class 2).
--
-- A signed transaction whose broadcasts keep failing used to stay `signed` without a
-- trace. The queue now records, per request, every broadcast that did not end with a
-- node accepting (or already knowing) the attempt and did not settle the request:
--
-- last_broadcast_error     the error class of the last such broadcast: a keel-chain
--                          node error kind (`internal`, `other`, `rate_limited`,
--                          `nonce_too_high`, `replacement_underpriced`, ...) or
--                          `unavailable` (no upstream answered); NULL: none yet
-- last_broadcast_error_at  database clock of that broadcast
-- broadcast_failures       how many there were (a request with failures is also
--                          reconciled by receipt and chain nonce while `signed`)
--
-- Additive: nullable columns and a constant default (no table rewrite).

ALTER TABLE txq_request
    ADD COLUMN last_broadcast_error    TEXT    CHECK (last_broadcast_error IS NULL OR last_broadcast_error ~ '^[a-z_]{1,64}$'),
    ADD COLUMN last_broadcast_error_at TIMESTAMPTZ,
    ADD COLUMN broadcast_failures      INTEGER NOT NULL DEFAULT 0 CHECK (broadcast_failures >= 0);
