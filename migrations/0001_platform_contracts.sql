-- Keel's own platform contracts per chain (Directory, factories, resolver, EntryPoint
-- reference), as deployed by `keel chain bootstrap`. One row per (chain, name); a
-- re-bootstrap that finds the same contract already recorded leaves the row alone.
CREATE TABLE platform_contract (
    chain_id        BIGINT      NOT NULL CHECK (chain_id > 0),
    name            TEXT        NOT NULL CHECK (name ~ '^[a-zA-Z][a-zA-Z0-9]{0,63}$'),
    address         BYTEA       NOT NULL CHECK (octet_length(address) = 20),
    deploy_tx_hash  BYTEA       CHECK (deploy_tx_hash IS NULL OR octet_length(deploy_tx_hash) = 32),
    deployed_block  BIGINT      CHECK (deployed_block IS NULL OR deployed_block >= 0),
    recorded_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, name)
);
