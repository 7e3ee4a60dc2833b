-- Ledger Index (keel-index): indexing scope, per-chain ownership and checkpoint, the
-- block-hash window, raw logs and projections of Keel's contracts.
--
-- Every derived row carries (chain_id, block_number, block_hash, tx_hash, log_index) so a
-- reorg can roll back everything above a common ancestor with `block_number > $n`.
-- Addresses, hashes and topics are BYTEA; token amounts are NUMERIC(78,0) (a uint256 fits)
-- and are read as decimal text.

-- Which contracts are watched. A removal is stamped (removed_at), never deleted.
-- `discovered_at_block` is set for rows added by ingest itself (a token announced by
-- AssetCreated, a feed announced by FeedCreated); those rows are rolled back with a reorg.
CREATE TABLE index_scope (
    chain_id            BIGINT      NOT NULL,
    address             BYTEA       NOT NULL CHECK (octet_length(address) = 20),
    kind                TEXT        NOT NULL CHECK (kind IN
                          ('asset_factory', 'asset_token', 'price_feed_factory',
                           'price_feed', 'price_resolver', 'directory')),
    organization        TEXT        NULL,
    from_block          BIGINT      NOT NULL CHECK (from_block >= 0),
    discovered_at_block BIGINT      NULL,
    added_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    removed_at          TIMESTAMPTZ NULL
);
-- At most one live scope row per (chain, address).
CREATE UNIQUE INDEX index_scope_live ON index_scope (chain_id, address) WHERE removed_at IS NULL;

-- One row per indexed chain: the tip-ingest owner's fencing epoch and the checkpoint.
CREATE TABLE index_chain (
    chain_id    BIGINT      PRIMARY KEY,
    owner_epoch BIGINT      NOT NULL DEFAULT 0,
    owner_id    TEXT        NULL,
    tip_number  BIGINT      NULL,
    tip_hash    BYTEA       NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((tip_number IS NULL) = (tip_hash IS NULL))
);

-- The hash window: the last `hash_window` ingested blocks of each chain.
CREATE TABLE index_block (
    chain_id    BIGINT NOT NULL,
    number      BIGINT NOT NULL,
    hash        BYTEA  NOT NULL,
    parent_hash BYTEA  NOT NULL,
    PRIMARY KEY (chain_id, number)
);

-- Raw logs of scoped contracts. Idempotent key: (chain, block hash, log index).
CREATE TABLE index_log (
    chain_id     BIGINT  NOT NULL,
    block_number BIGINT  NOT NULL,
    block_hash   BYTEA   NOT NULL,
    log_index    BIGINT  NOT NULL,
    tx_hash      BYTEA   NOT NULL,
    address      BYTEA   NOT NULL,
    topics       BYTEA[] NOT NULL,
    data         BYTEA   NOT NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_log_block ON index_log (chain_id, block_number);

-- ERC-20 Transfer events of scoped asset tokens (mints from 0x0, burns to 0x0).
CREATE TABLE index_transfer (
    chain_id     BIGINT        NOT NULL,
    block_number BIGINT        NOT NULL,
    block_hash   BYTEA         NOT NULL,
    log_index    BIGINT        NOT NULL,
    tx_hash      BYTEA         NOT NULL,
    token        BYTEA         NOT NULL,
    from_address BYTEA         NOT NULL,
    to_address   BYTEA         NOT NULL,
    value        NUMERIC(78,0) NOT NULL CHECK (value >= 0),
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_transfer_block ON index_transfer (chain_id, block_number);
CREATE INDEX index_transfer_to ON index_transfer (chain_id, token, to_address);
CREATE INDEX index_transfer_from ON index_transfer (chain_id, token, from_address);

-- Balances are computed on read from index_transfer, so a reorg rollback (deleting
-- transfers above the ancestor) can never leave a balance behind. The zero address
-- (mint source / burn sink) is excluded.
CREATE VIEW index_balance AS
SELECT chain_id, token, holder, sum(delta) AS balance
FROM (
    SELECT chain_id, token, to_address AS holder, value AS delta FROM index_transfer
    UNION ALL
    SELECT chain_id, token, from_address AS holder, -value AS delta FROM index_transfer
) d
WHERE holder <> '\x0000000000000000000000000000000000000000'::bytea
GROUP BY chain_id, token, holder;

-- AssetFactory.AssetCreated.
CREATE TABLE index_asset (
    chain_id     BIGINT   NOT NULL,
    block_number BIGINT   NOT NULL,
    block_hash   BYTEA    NOT NULL,
    log_index    BIGINT   NOT NULL,
    tx_hash      BYTEA    NOT NULL,
    factory      BYTEA    NOT NULL,
    asset_id     BYTEA    NOT NULL,
    token        BYTEA    NOT NULL,
    symbol       TEXT     NOT NULL,
    decimals     SMALLINT NOT NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_asset_block ON index_asset (chain_id, block_number);

-- PriceFeed.AnswerUpdated.
CREATE TABLE index_observation (
    chain_id     BIGINT        NOT NULL,
    block_number BIGINT        NOT NULL,
    block_hash   BYTEA         NOT NULL,
    log_index    BIGINT        NOT NULL,
    tx_hash      BYTEA         NOT NULL,
    feed         BYTEA         NOT NULL,
    round_id     NUMERIC(78,0) NOT NULL,
    answer       NUMERIC(78,0) NOT NULL,
    updated_at   NUMERIC(78,0) NOT NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_observation_block ON index_observation (chain_id, block_number);

-- Directory entries: EntryChanged inserts a row (and stamps the entry's previous live row
-- as superseded); EntryRemoved stamps removed_at_block on the live row. Readers see live
-- rows (removed_at_block IS NULL) unless they ask for history.
CREATE TABLE index_directory_entry (
    chain_id         BIGINT NOT NULL,
    block_number     BIGINT NOT NULL,
    block_hash       BYTEA  NOT NULL,
    log_index        BIGINT NOT NULL,
    tx_hash          BYTEA  NOT NULL,
    directory        BYTEA  NOT NULL,
    name             BYTEA  NOT NULL,
    value            BYTEA  NOT NULL,
    removed_at_block BIGINT NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_directory_entry_block ON index_directory_entry (chain_id, block_number);
CREATE INDEX index_directory_entry_name ON index_directory_entry (chain_id, directory, name)
    WHERE removed_at_block IS NULL;
CREATE INDEX index_log_address ON index_log (chain_id, address, block_number);

-- AssetToken Paused/Unpaused: one row per event; a token's current state is its latest
-- row (tokens are deployed paused, so the creation block carries the first one).
CREATE TABLE index_token_pause (
    chain_id     BIGINT  NOT NULL,
    block_number BIGINT  NOT NULL,
    block_hash   BYTEA   NOT NULL,
    log_index    BIGINT  NOT NULL,
    tx_hash      BYTEA   NOT NULL,
    token        BYTEA   NOT NULL,
    paused       BOOLEAN NOT NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_token_pause_block ON index_token_pause (chain_id, block_number);
CREATE INDEX index_token_pause_latest ON index_token_pause (chain_id, token, block_number DESC, log_index DESC);

-- PriceResolver StalenessBoundSet/StalenessBoundCleared: one row per event (a clear has
-- bound_seconds NULL); a feed's current bound is its latest row.
CREATE TABLE index_staleness_bound (
    chain_id      BIGINT        NOT NULL,
    block_number  BIGINT        NOT NULL,
    block_hash    BYTEA         NOT NULL,
    log_index     BIGINT        NOT NULL,
    tx_hash       BYTEA         NOT NULL,
    resolver      BYTEA         NOT NULL,
    feed          BYTEA         NOT NULL,
    bound_seconds NUMERIC(78,0) NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX index_staleness_bound_block ON index_staleness_bound (chain_id, block_number);
CREATE INDEX index_staleness_bound_latest ON index_staleness_bound (chain_id, feed, block_number DESC, log_index DESC);

-- Historical catch-up: block ranges below the settled height, leased by any indexer
-- replica. `address` NULL means the whole live scope; an address means that one
-- contract's backfill (scheduled when a contract is discovered during history).
-- States: pending → running (claimed: attempt + 1, lease_expires_at set) → completed
-- (guarded by attempt, in the same transaction as the range's rows). A running range
-- whose lease expired is claimable again.
CREATE TABLE index_range (
    id               BIGSERIAL   PRIMARY KEY,
    chain_id         BIGINT      NOT NULL,
    address          BYTEA       NULL,
    from_block       BIGINT      NOT NULL CHECK (from_block >= 0),
    to_block         BIGINT      NOT NULL,
    state            TEXT        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'running', 'completed')),
    attempt          INT         NOT NULL DEFAULT 0,
    lease_owner      TEXT        NULL,
    lease_expires_at TIMESTAMPTZ NULL,
    completed_at     TIMESTAMPTZ NULL,
    logs             BIGINT      NULL,
    CHECK (to_block >= from_block),
    CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
    CHECK ((state = 'completed') = (completed_at IS NOT NULL))
);
CREATE INDEX index_range_claim ON index_range (chain_id, from_block) WHERE state <> 'completed';
