-- Issue 37 §2: the investor writes of organization systems' eligibility registries,
-- one row per `investor.set` operation (its chain, registry and the attributes written).
CREATE TABLE IF NOT EXISTS investor_change (
    operation_id     UUID        PRIMARY KEY REFERENCES operation (id),
    organization_id  UUID        NOT NULL REFERENCES organization (id),
    system_id        UUID        NOT NULL REFERENCES organization_system (id),
    chain_id         BIGINT      NOT NULL,
    investor         BYTEA       NOT NULL CHECK (octet_length(investor) = 20),
    eligible         BOOLEAN     NOT NULL,
    -- ISO 3166-1 numeric (0: none given).
    country          INTEGER     NOT NULL CHECK (country BETWEEN 0 AND 999),
    -- Unix seconds; 0: never expires.
    expires_at       BIGINT      NOT NULL CHECK (expires_at >= 0),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS investor_change_investor
    ON investor_change (organization_id, chain_id, investor, created_at);
