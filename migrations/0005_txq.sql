-- keel-txq: the nonce-serialized transaction queue (see crates/keel-txq/src/lib.rs).
--
-- txq_sender    one row per (chain, sender): the next nonce Keel will assign; its row
--               lock serializes nonce assignment across processes
-- txq_request   one logical transaction per (chain, sender, idempotency key)
-- txq_attempt   every signed attempt of a request, persisted BEFORE it is broadcast

CREATE TABLE txq_sender (
    chain_id    BIGINT      NOT NULL CHECK (chain_id > 0),
    sender      BYTEA       NOT NULL CHECK (octet_length(sender) = 20),
    next_nonce  BIGINT      NOT NULL CHECK (next_nonce >= 0),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, sender)
);

CREATE TABLE txq_request (
    id               UUID        PRIMARY KEY,
    chain_id         BIGINT      NOT NULL CHECK (chain_id > 0),
    sender           BYTEA       NOT NULL CHECK (octet_length(sender) = 20),
    idempotency_key  TEXT        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    -- NULL: contract creation.
    to_address       BYTEA       CHECK (to_address IS NULL OR octet_length(to_address) = 20),
    -- Wei, as the decimal string of a U256.
    value_wei        TEXT        NOT NULL CHECK (value_wei ~ '^[0-9]{1,78}$'),
    calldata         BYTEA       NOT NULL,
    -- Caller-fixed gas limit; NULL: estimated before signing.
    gas_limit        BIGINT      CHECK (gas_limit IS NULL OR gas_limit > 0),
    -- queued: waiting for a nonce; signed: an attempt is persisted, maybe not broadcast;
    -- broadcast: a node accepted an attempt; settled: the verdict is final.
    state            TEXT        NOT NULL DEFAULT 'queued'
                       CHECK (state IN ('queued', 'signed', 'broadcast', 'settled')),
    nonce            BIGINT      CHECK (nonce IS NULL OR nonce >= 0),
    verdict          JSONB,
    -- Verdict kind for indexes and metrics: confirmed | reverted | failed.
    verdict_kind     TEXT        CHECK (verdict_kind IN ('confirmed', 'reverted', 'failed')),
    broadcast_at     TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    settled_at       TIMESTAMPTZ,
    CONSTRAINT txq_request_idempotency UNIQUE (chain_id, sender, idempotency_key),
    CONSTRAINT txq_request_settled CHECK ((state = 'settled') = (settled_at IS NOT NULL)
                                         AND (state = 'settled') = (verdict IS NOT NULL)),
    CONSTRAINT txq_request_nonce CHECK (state = 'queued' OR state = 'settled' OR nonce IS NOT NULL)
);

-- A nonce belongs to at most one live request of a sender.
CREATE UNIQUE INDEX txq_request_live_nonce ON txq_request (chain_id, sender, nonce)
    WHERE nonce IS NOT NULL AND state IN ('signed', 'broadcast');
CREATE INDEX txq_request_queued ON txq_request (chain_id, sender, created_at, id) WHERE state = 'queued';
CREATE INDEX txq_request_in_flight ON txq_request (chain_id, state) WHERE state IN ('signed', 'broadcast');

CREATE TABLE txq_attempt (
    request_id               UUID        NOT NULL REFERENCES txq_request (id) ON DELETE CASCADE,
    attempt                  INTEGER     NOT NULL CHECK (attempt >= 1),
    nonce                    BIGINT      NOT NULL CHECK (nonce >= 0),
    tx_hash                  BYTEA       NOT NULL UNIQUE CHECK (octet_length(tx_hash) = 32),
    -- The signed EIP-2718 bytes; re-broadcast verbatim after a crash.
    raw                      BYTEA       NOT NULL,
    -- Wei per gas (EIP-1559), decimal strings of U256.
    max_fee_per_gas          TEXT        NOT NULL CHECK (max_fee_per_gas ~ '^[0-9]{1,78}$'),
    max_priority_fee_per_gas TEXT        NOT NULL CHECK (max_priority_fee_per_gas ~ '^[0-9]{1,78}$'),
    gas_limit                BIGINT      NOT NULL,
    created_at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, attempt)
);
