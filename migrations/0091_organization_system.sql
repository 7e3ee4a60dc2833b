-- Idempotent (IF NOT EXISTS): upgrade tests apply it ahead of the full set.
-- Issue 37 §1: organization systems. An organization's own contracts on a chain (its
-- asset factory, eligibility registry and compliance contract), deployed by the durable
-- `organization.system` workflow. The deployment is an operation without an asset, so
-- `operation.asset_id` becomes optional (relaxing a constraint: additive).
ALTER TABLE operation ALTER COLUMN asset_id DROP NOT NULL;

CREATE TABLE IF NOT EXISTS organization_system (
    -- The deploying operation's id.
    id               UUID        PRIMARY KEY REFERENCES operation (id),
    organization_id  UUID        NOT NULL REFERENCES organization (id),
    chain_id         BIGINT      NOT NULL,
    -- Per (organization, chain), from 1: the SystemFactory's `serial` (part of the salt).
    serial           BIGINT      NOT NULL CHECK (serial >= 1),
    -- deploying → active (the organization carries it) → replaced (a later deployment
    -- replaced it); deploying → failed (only the abandonment sweep writes this).
    state            TEXT        NOT NULL CHECK (state IN ('deploying', 'active', 'replaced', 'failed')),
    -- Set once the deployment transaction landed.
    factory          BYTEA       CHECK (octet_length(factory) = 20),
    registry         BYTEA       CHECK (octet_length(registry) = 20),
    compliance       BYTEA       CHECK (octet_length(compliance) = 20),
    deployed_block   BIGINT,
    -- The operator's switch: a disabled system is out of the index scope and creates no assets.
    enabled          BOOLEAN     NOT NULL DEFAULT true,
    -- The deployment that replaced it.
    replaced_by      UUID,
    -- Why the sweep declared it failed (a code, e.g. EXECUTION_GONE).
    failure          TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    deployed_at      TIMESTAMPTZ,
    activated_at     TIMESTAMPTZ,
    ended_at         TIMESTAMPTZ,
    CONSTRAINT organization_system_serial UNIQUE (organization_id, chain_id, serial)
);
CREATE INDEX IF NOT EXISTS organization_system_deploying ON organization_system (created_at)
    WHERE state = 'deploying';

-- The system an organization carries now, per chain ("the address the organization
-- carries": read first by the settings step, written last).
CREATE TABLE IF NOT EXISTS organization_system_current (
    organization_id  UUID        NOT NULL REFERENCES organization (id),
    chain_id         BIGINT      NOT NULL,
    system_id        UUID        NOT NULL REFERENCES organization_system (id),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, chain_id)
);

-- The system whose factory deployed an asset's token (NULL: the platform factory).
ALTER TABLE asset ADD COLUMN IF NOT EXISTS system_id UUID REFERENCES organization_system (id);
