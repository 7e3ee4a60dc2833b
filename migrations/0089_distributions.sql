-- Distributions (issue 36 §3): a payout to the holders of a final snapshot, run by the
-- `distribution.pay` workflow. The operation row is the distribution's acceptance
-- (idempotency key, request hash, approval, cancel); these rows are what it pays.
-- Written only through keel-workflows' store (store/distribution.rs).

CREATE TABLE distribution (
    -- The operation's id (one distribution per `distribution.pay` operation).
    id              UUID          PRIMARY KEY REFERENCES operation (id),
    organization_id UUID          NOT NULL REFERENCES organization (id),
    -- The asset whose holders are paid (the snapshot's token).
    asset_id        UUID          NOT NULL REFERENCES asset (id),
    snapshot_id     UUID          NOT NULL REFERENCES index_snapshot (id),
    chain_id        BIGINT        NOT NULL,
    -- What is paid: the asset itself, another ERC-20, or the chain's native currency.
    pay_kind        TEXT          NOT NULL CHECK (pay_kind IN ('asset', 'erc20', 'native')),
    -- The paying token (20 bytes); NULL for native.
    pay_token       BYTEA         CHECK (octet_length(pay_token) = 20),
    CHECK ((pay_kind = 'native') = (pay_token IS NULL)),
    -- `proRata` (amount = the total) or `perUnit` (amount per whole unit of the asset),
    -- base units of the paying token.
    basis           TEXT          NOT NULL CHECK (basis IN ('proRata', 'perUnit')),
    amount          NUMERIC(78,0) NOT NULL CHECK (amount >= 0),
    rounding        TEXT          NOT NULL CHECK (rounding IN ('floor', 'largestRemainder')),
    -- Excluded holders (20 bytes each).
    exclusions      BYTEA[]       NOT NULL DEFAULT '{}',
    -- Set by the plan step: holders of the snapshot, the sum owed, what rounding left.
    holder_count    INTEGER,
    total_due       NUMERIC(78,0),
    remainder       NUMERIC(78,0),
    planned_at      TIMESTAMPTZ,
    -- Set once by the workflow's last step, with its `distribution.completed` event.
    completed_at    TIMESTAMPTZ,
    created_at      TIMESTAMPTZ   NOT NULL DEFAULT now()
);

CREATE INDEX distribution_by_asset ON distribution (asset_id, created_at DESC, id DESC);

-- One row per holder of the snapshot: what it is owed and what happened.
--   pending  owed, not paid yet (batch set once it is placed in a batch)
--   paid     its batch's transaction confirmed (tx_hash, block_number)
--   refused  the paying token (or the recipient) refused the payment; left out of the
--            batch, which was sent without it (reason: the token's error name)
--   excluded excluded by the request
--   zero     its share rounded to 0
CREATE TABLE distribution_payment (
    distribution_id UUID          NOT NULL REFERENCES distribution (id),
    holder          BYTEA         NOT NULL CHECK (octet_length(holder) = 20),
    balance         NUMERIC(78,0) NOT NULL CHECK (balance > 0),
    amount          NUMERIC(78,0) NOT NULL CHECK (amount >= 0),
    state           TEXT          NOT NULL
                    CHECK (state IN ('pending', 'paid', 'refused', 'excluded', 'zero')),
    batch           INTEGER,
    tx_hash         BYTEA         CHECK (octet_length(tx_hash) = 32),
    block_number    BIGINT,
    reason          TEXT,
    PRIMARY KEY (distribution_id, holder),
    CHECK ((state = 'paid') = (tx_hash IS NOT NULL))
);

-- The next unplaced payments in holder order, and a batch's rows.
CREATE INDEX distribution_payment_unplaced ON distribution_payment (distribution_id, holder)
    WHERE state = 'pending' AND batch IS NULL;
CREATE INDEX distribution_payment_by_batch ON distribution_payment (distribution_id, batch)
    WHERE batch IS NOT NULL;
