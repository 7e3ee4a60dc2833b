-- Ledger Index (issue 36 §1, §2): per-holder balance history and record-date snapshots
-- as objects.
--
-- index_holder_change: the net change of one holder's balance of one token in one
-- block (base units, signed; a change that nets to zero is not kept, see below): the
-- balance history. The holders at block N are every holder's kept balance minus its
-- changes above N, and the holders whose balance at N differs from now are the distinct
-- holders of the change rows above N: one primary-key range scan from N, one row per
-- holder and block however many transfers moved it there. The zero address's rows are
-- burns minus mints (its balance is −supply), so supply at N is read the same way.
-- (The balance of one holder at N reads its own transfers above N through
-- index_transfer's holder indexes: a second index on this table, by holder, would cost
-- every write another B-tree insert; measured in benches/README.md.)
--
-- Maintained by the same statement triggers on index_transfer as index_holder_balance
-- (migration 0025), which aggregate each statement's transition table by (token,
-- holder, block) before they write: every write path (tip inserts, history COPY, the
-- staged INSERT … ON CONFLICT DO NOTHING, rollback DELETEs above a common ancestor)
-- moves both tables in its own transaction. Sums commute, so history ranges written
-- out of order still add up; a rollback's DELETE of the blocks above an ancestor
-- subtracts exactly what their inserts added, and rows that net to zero are removed.
CREATE TABLE index_holder_change (
    chain_id     BIGINT        NOT NULL,
    token        BYTEA         NOT NULL,
    holder       BYTEA         NOT NULL,
    block_number BIGINT        NOT NULL,
    delta        NUMERIC(78,0) NOT NULL,
    PRIMARY KEY (chain_id, token, block_number, holder)
);

CREATE OR REPLACE FUNCTION index_holder_balance_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Rows are upserted in key order so two concurrent writers cannot deadlock on them.
    WITH d AS MATERIALIZED (
        SELECT chain_id, token, holder, block_number, sum(delta) AS delta
        FROM (SELECT chain_id, token, to_address AS holder, block_number, value AS delta
                FROM keel_new_transfers
              UNION ALL
              SELECT chain_id, token, from_address, block_number, -value
                FROM keel_new_transfers) t
        GROUP BY chain_id, token, holder, block_number
    ), balance AS (
        INSERT INTO index_holder_balance (chain_id, token, holder, balance)
        SELECT chain_id, token, holder, sum(delta) FROM d
        GROUP BY chain_id, token, holder
        ORDER BY chain_id, token, holder
        ON CONFLICT (chain_id, token, holder)
            DO UPDATE SET balance = index_holder_balance.balance + EXCLUDED.balance
    )
    INSERT INTO index_holder_change (chain_id, token, holder, block_number, delta)
    SELECT chain_id, token, holder, block_number, delta FROM d
    WHERE delta <> 0
    ORDER BY chain_id, token, block_number, holder
    ON CONFLICT (chain_id, token, block_number, holder)
        DO UPDATE SET delta = index_holder_change.delta + EXCLUDED.delta;
    RETURN NULL;
END $$;

-- A rollback (or any DELETE of transfers) subtracts what the rows added, then removes
-- the change rows of the touched blocks that now net to zero. (Only here: an insert
-- that makes a row zero — two writes of distinct transfers of one block that cancel —
-- leaves a zero row, which every read sums as nothing.)
CREATE OR REPLACE FUNCTION index_holder_balance_subtract() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH d AS MATERIALIZED (
        SELECT chain_id, token, holder, block_number, sum(delta) AS delta
        FROM (SELECT chain_id, token, to_address AS holder, block_number, -value AS delta
                FROM keel_old_transfers
              UNION ALL
              SELECT chain_id, token, from_address, block_number, value
                FROM keel_old_transfers) t
        GROUP BY chain_id, token, holder, block_number
    ), balance AS (
        INSERT INTO index_holder_balance (chain_id, token, holder, balance)
        SELECT chain_id, token, holder, sum(delta) FROM d
        GROUP BY chain_id, token, holder
        ORDER BY chain_id, token, holder
        ON CONFLICT (chain_id, token, holder)
            DO UPDATE SET balance = index_holder_balance.balance + EXCLUDED.balance
    )
    INSERT INTO index_holder_change (chain_id, token, holder, block_number, delta)
    SELECT chain_id, token, holder, block_number, delta FROM d
    WHERE delta <> 0
    ORDER BY chain_id, token, block_number, holder
    ON CONFLICT (chain_id, token, block_number, holder)
        DO UPDATE SET delta = index_holder_change.delta + EXCLUDED.delta;
    DELETE FROM index_holder_change c
     USING (SELECT DISTINCT chain_id, token, block_number FROM keel_old_transfers) k
     WHERE c.chain_id = k.chain_id AND c.token = k.token
       AND c.block_number = k.block_number AND c.delta = 0;
    RETURN NULL;
END $$;

-- Existing transfers.
INSERT INTO index_holder_change (chain_id, token, holder, block_number, delta)
SELECT chain_id, token, holder, block_number, sum(delta)
FROM (SELECT chain_id, token, to_address AS holder, block_number, value AS delta
        FROM index_transfer
      UNION ALL
      SELECT chain_id, token, from_address, block_number, -value FROM index_transfer) d
GROUP BY chain_id, token, holder, block_number
HAVING sum(delta) <> 0;

-- A record-date snapshot of one token's holders (issue 36 §2). `pending` until its
-- block is at or below the chain's finalized block (a reorg may still change it, reads
-- compute it from the index); then sealed once — `final`, its rows copied into
-- index_snapshot_holder with holder_count, total (base units) and content_hash
-- (sha-256 of its canonical CSV: see keel_index::snapshot) — and never written again.
-- One snapshot per (chain, token, block): creating it again answers the same one.
CREATE TABLE index_snapshot (
    id           UUID          PRIMARY KEY,
    chain_id     BIGINT        NOT NULL,
    token        BYTEA         NOT NULL,
    at_block     BIGINT        NOT NULL CHECK (at_block >= 0),
    state        TEXT          NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'final')),
    holder_count BIGINT        NULL,
    total        NUMERIC(78,0) NULL,
    content_hash BYTEA         NULL,
    created_at   TIMESTAMPTZ   NOT NULL DEFAULT now(),
    finalized_at TIMESTAMPTZ   NULL,
    UNIQUE (chain_id, token, at_block),
    CHECK ((state = 'final') = (finalized_at IS NOT NULL)),
    CHECK ((state = 'final') = (holder_count IS NOT NULL AND total IS NOT NULL
                                AND content_hash IS NOT NULL))
);
-- Snapshots of a token, newest record date first (the list route), and pending ones.
CREATE INDEX index_snapshot_token ON index_snapshot (chain_id, token, at_block DESC);
CREATE INDEX index_snapshot_pending ON index_snapshot (chain_id, at_block) WHERE state = 'pending';

-- The holders of a final snapshot: positive balances only, the zero address never.
CREATE TABLE index_snapshot_holder (
    snapshot_id UUID          NOT NULL REFERENCES index_snapshot (id),
    holder      BYTEA         NOT NULL,
    balance     NUMERIC(78,0) NOT NULL CHECK (balance > 0),
    PRIMARY KEY (snapshot_id, holder)
);
-- Pages ranked by balance (keyset `(balance DESC, holder ASC)`).
CREATE INDEX index_snapshot_holder_rank
    ON index_snapshot_holder (snapshot_id, balance DESC, holder);
