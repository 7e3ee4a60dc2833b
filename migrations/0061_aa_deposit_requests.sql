-- keel-aa: funding requests of the SponsorPaymaster's EntryPoint deposit (the paymaster
-- deposit runway, crates/keel-aa/src/runway.rs; SQL in crates/keel-aa/src/store.rs).
--
-- One row per (chain, paymaster). The runway check opens it when the paymaster's
-- deposit at the EntryPoint (EntryPoint.balanceOf(paymaster)) is below the configured
-- minimum, updates it at every check while it stays below, and closes it once the
-- deposit is back at or above the minimum. Fund it with EntryPoint.depositTo(paymaster)
-- (or the paymaster's deposit()): the funds go to the EntryPoint deposit, not to the
-- paymaster's address.

CREATE TABLE aa_deposit_request (
    chain_id      BIGINT      NOT NULL CHECK (chain_id > 0),
    paymaster     BYTEA       NOT NULL CHECK (octet_length(paymaster) = 20),
    -- The resolved EntryPoint holding the deposit.
    entry_point   BYTEA       NOT NULL CHECK (octet_length(entry_point) = 20),
    -- At the last check, wei.
    deposit_wei   NUMERIC(78) NOT NULL CHECK (deposit_wei >= 0),
    minimum_wei   NUMERIC(78) NOT NULL CHECK (minimum_wei >= 0),
    -- minimum - deposit at the last check, wei.
    required_wei  NUMERIC(78) NOT NULL CHECK (required_wei >= 0),
    state         TEXT        NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed')),
    opened_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    closed_at     TIMESTAMPTZ,
    PRIMARY KEY (chain_id, paymaster)
);
CREATE INDEX aa_deposit_request_open ON aa_deposit_request (opened_at) WHERE state = 'open';
