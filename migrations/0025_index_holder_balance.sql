-- Ledger Index read API (issue 18 §3): holders, record-date snapshots, transfers and
-- supply of an asset token, fast at millions of transfers.
--
-- index_holder_balance: the current balance of every (chain, token, holder) that ever
-- appeared in index_transfer, the zero address included (its balance is burns − mints,
-- i.e. −supply). It is kept by statement triggers on index_transfer, so every write path
-- (tip UNNEST inserts, history COPY, staged INSERT … SELECT … ON CONFLICT DO NOTHING,
-- rollback DELETEs above a common ancestor) moves it in the same transaction: the
-- transition tables hold exactly the rows inserted or deleted. Sums commute, so history
-- ranges written out of order still add up. index_transfer rows are never updated.
--
-- A snapshot at block N is computed as current balance − the deltas of the transfers
-- above N (only the holders those transfers touched differ from the current ranking);
-- its cost grows with the transfers above N, not with the token's history.
CREATE TABLE index_holder_balance (
    chain_id BIGINT        NOT NULL,
    token    BYTEA         NOT NULL,
    holder   BYTEA         NOT NULL,
    balance  NUMERIC(78,0) NOT NULL,
    PRIMARY KEY (chain_id, token, holder)
);
-- Holders ranked by balance (keyset `(balance DESC, holder ASC)`); only positive ones.
CREATE INDEX index_holder_balance_rank
    ON index_holder_balance (chain_id, token, balance DESC, holder)
    WHERE balance > 0;

-- Rows are upserted in key order so two concurrent writers cannot deadlock on them.
CREATE FUNCTION index_holder_balance_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO index_holder_balance (chain_id, token, holder, balance)
    SELECT chain_id, token, holder, sum(delta)
    FROM (SELECT chain_id, token, to_address AS holder, value AS delta FROM keel_new_transfers
          UNION ALL
          SELECT chain_id, token, from_address, -value FROM keel_new_transfers) d
    GROUP BY chain_id, token, holder
    ORDER BY chain_id, token, holder
    ON CONFLICT (chain_id, token, holder)
        DO UPDATE SET balance = index_holder_balance.balance + EXCLUDED.balance;
    RETURN NULL;
END $$;

CREATE FUNCTION index_holder_balance_subtract() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO index_holder_balance (chain_id, token, holder, balance)
    SELECT chain_id, token, holder, sum(delta)
    FROM (SELECT chain_id, token, to_address AS holder, -value AS delta FROM keel_old_transfers
          UNION ALL
          SELECT chain_id, token, from_address, value FROM keel_old_transfers) d
    GROUP BY chain_id, token, holder
    ORDER BY chain_id, token, holder
    ON CONFLICT (chain_id, token, holder)
        DO UPDATE SET balance = index_holder_balance.balance + EXCLUDED.balance;
    RETURN NULL;
END $$;

CREATE TRIGGER index_transfer_balance_insert AFTER INSERT ON index_transfer
    REFERENCING NEW TABLE AS keel_new_transfers
    FOR EACH STATEMENT EXECUTE FUNCTION index_holder_balance_add();
CREATE TRIGGER index_transfer_balance_delete AFTER DELETE ON index_transfer
    REFERENCING OLD TABLE AS keel_old_transfers
    FOR EACH STATEMENT EXECUTE FUNCTION index_holder_balance_subtract();

-- Existing transfers.
INSERT INTO index_holder_balance (chain_id, token, holder, balance)
SELECT chain_id, token, holder, sum(delta)
FROM (SELECT chain_id, token, to_address AS holder, value AS delta FROM index_transfer
      UNION ALL
      SELECT chain_id, token, from_address, -value FROM index_transfer) d
GROUP BY chain_id, token, holder;

-- The balance view now reads the kept balances (same columns and rows as before:
-- holders that ever appeared, the zero address excluded).
CREATE OR REPLACE VIEW index_balance AS
SELECT chain_id, token, holder, balance::numeric AS balance
FROM index_holder_balance
WHERE holder <> '\x0000000000000000000000000000000000000000'::bytea;

-- Transfers of a token in chain order (pages newest first, and "transfers above N"
-- of a snapshot), and of one holder as sender or receiver. The last two supersede the
-- (chain_id, token, to_address) / (…, from_address) indexes of 0006.
CREATE INDEX index_transfer_token_position
    ON index_transfer (chain_id, token, block_number, log_index);
CREATE INDEX index_transfer_to_position
    ON index_transfer (chain_id, token, to_address, block_number, log_index);
CREATE INDEX index_transfer_from_position
    ON index_transfer (chain_id, token, from_address, block_number, log_index);
DROP INDEX index_transfer_to;
DROP INDEX index_transfer_from;

-- The time of the block a transfer is in (the node's block timestamp; NULL for rows
-- written before this migration, or backfilled from a node whose logs do not carry
-- `blockTimestamp`).
ALTER TABLE index_transfer ADD COLUMN block_time TIMESTAMPTZ NULL;

-- The chain's finalized block as the tip ingest last saw it (the node's `finalized`
-- tag, else head − finality depth); never lowered. NULL until first recorded. Readers
-- flag snapshots above it as not final.
ALTER TABLE index_chain ADD COLUMN finalized_number BIGINT NULL;
