-- keel-txq: the custody path (issue 19; see crates/keel-txq/src/custody.rs).
--
-- A request whose sender is a custody vault never takes a local nonce: the provider
-- signs and broadcasts. Its `txq_request` row stays `queued` (no nonce) until it
-- settles; what happened at the provider lives here, one row per submission
-- (resubmission 0 is the first create, n + 1 follows a confirmed cancel of n).
--
-- txq_custody_attempt  one row per (request, resubmission). The row, with its
--                      deterministic external_tx_id, is committed BEFORE the create
--                      call (phase `creating`). Phases:
--                        ready       nothing was created with this external id (yet,
--                                    or provably): a create may be sent
--                        creating    a create may be in flight (or its process died):
--                                    in doubt on the next pass
--                        in_doubt    the create's answer was lost: look up by
--                                    external id; `None` proves absence only after
--                                    absent_after (the create JWT's exp + clock skew)
--                        submitted   the provider has it (provider_tx_id known)
--                        cancelling  a silent drop: cancel accepted, waiting for CANCELLED
--                        superseded  cancelled at the provider; resubmission n + 1 exists
--                        done        the request settled from this submission

CREATE TABLE txq_custody_attempt (
    request_id      UUID        NOT NULL REFERENCES txq_request (id) ON DELETE CASCADE,
    resubmission    INTEGER     NOT NULL CHECK (resubmission >= 0),
    external_tx_id  TEXT        NOT NULL UNIQUE CHECK (char_length(external_tx_id) BETWEEN 1 AND 255),
    -- The provider's bounded name (`fireblocks`).
    provider        TEXT        NOT NULL CHECK (char_length(provider) BETWEEN 1 AND 64),
    phase           TEXT        NOT NULL DEFAULT 'ready'
                      CHECK (phase IN ('ready', 'creating', 'in_doubt', 'submitted',
                                       'cancelling', 'superseded', 'done')),
    provider_tx_id  TEXT        CHECK (provider_tx_id IS NULL OR char_length(provider_tx_id) BETWEEN 1 AND 255),
    -- The provider's last status / sub-status as reported (Fireblocks names), and the
    -- status rank (webhook ordering: a lower rank never overwrites a higher one).
    status          TEXT        CHECK (status IS NULL OR char_length(status) BETWEEN 1 AND 64),
    sub_status      TEXT        CHECK (sub_status IS NULL OR char_length(sub_status) BETWEEN 1 AND 128),
    status_rank     SMALLINT    NOT NULL DEFAULT 0,
    -- When `status` last changed (a silent drop is judged by how long a pre-broadcast
    -- status stays the same).
    status_since    TIMESTAMPTZ NOT NULL DEFAULT now(),
    tx_hash         BYTEA       CHECK (tx_hash IS NULL OR octet_length(tx_hash) = 32),
    -- In doubt: a lookup's `None` proves absence only from this time on.
    absent_after    TIMESTAMPTZ,
    -- Reads of the provider for this submission, and when the next one is due.
    polls           INTEGER     NOT NULL DEFAULT 0 CHECK (polls >= 0),
    next_poll_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The last wake-up hint (a verified provider webhook): one that arrives while a
    -- step is under way makes the next read due at once instead of after the backoff.
    woken_at        TIMESTAMPTZ,
    -- Set once when the poll budget ran out (visible; a WARN and a metric).
    budget_exceeded_at TIMESTAMPTZ,
    -- When a hash was first persisted (the chain must see it within the drop budget).
    hash_at         TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, resubmission)
);

-- The live submissions of the queue's custody pass (never the settled history).
CREATE INDEX txq_custody_attempt_live ON txq_custody_attempt (next_poll_at)
    WHERE phase NOT IN ('superseded', 'done');
CREATE INDEX txq_custody_attempt_provider_tx ON txq_custody_attempt (provider_tx_id)
    WHERE provider_tx_id IS NOT NULL;
