-- keel-aa: the ERC-7562 reputation of ERC-4337 entities (paymasters and factories) per
-- chain (crates/keel-aa/src/validation/reputation.rs; SQL in crates/keel-aa/src/store.rs,
-- docs/aa.md "Validation rules (ERC-7562)").
--
-- ops_seen      user operations naming the entity that passed validation here
-- ops_included  of those, how many were included on chain by Keel's bundler
-- decayed_at    the hour boundary both counters were last decayed to: every whole hour
--               since, both become floor(value * 23 / 24) (applied on read and write,
--               no background job)
-- A bundle failure of an operation after its validation (ERC-7562 GREP-040) sets
-- ops_seen to the ban penalty (10000) and ops_included to 0.

CREATE TABLE aa_reputation (
    chain_id      BIGINT      NOT NULL CHECK (chain_id > 0),
    address       BYTEA       NOT NULL CHECK (octet_length(address) = 20),
    ops_seen      BIGINT      NOT NULL DEFAULT 0 CHECK (ops_seen >= 0),
    ops_included  BIGINT      NOT NULL DEFAULT 0 CHECK (ops_included >= 0),
    decayed_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, address)
);
