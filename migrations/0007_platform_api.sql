-- The Platform API's tenancy and operations (see crates/keel-workflows and crates/keel-api).
--
-- organization     a tenant; every API resource belongs to one
-- api_key          bearer secrets of an organization, stored as SHA-256 of the full token
--                  (the token is shown once, at creation; it is 256 bits of randomness, so
--                  a plain hash is the right store, not a password KDF)
-- asset_template   server-side settings an asset is created from: chain, feed decimals,
--                  staleness bound, approval threshold, funding pause. Callers name a
--                  template; they never choose a chain, resolver or bound themselves.
-- asset            one asset of an organization; token/feed addresses once known
-- operation        one accepted request (create, mint, transfer, pause, unpause), unique by
--                  (organization, idempotency key); runs as one durable workflow instance
-- operation_tx     every transaction-queue request an operation's workflow made, by step;
--                  the verdict relay delivers each settled verdict to the workflow as a
--                  signal and stamps `delivered_at`

CREATE TABLE organization (
    id          UUID        PRIMARY KEY,
    name        TEXT        NOT NULL UNIQUE CHECK (char_length(name) BETWEEN 1 AND 255),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_key (
    id               UUID        PRIMARY KEY,
    organization_id  UUID        NOT NULL REFERENCES organization (id),
    label            TEXT        NOT NULL CHECK (char_length(label) BETWEEN 1 AND 255),
    secret_sha256    BYTEA       NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at       TIMESTAMPTZ
);
CREATE INDEX api_key_organization ON api_key (organization_id);

CREATE TABLE asset_template (
    organization_id           UUID        NOT NULL REFERENCES organization (id),
    id                        TEXT        NOT NULL CHECK (id ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    chain_id                  BIGINT      NOT NULL CHECK (chain_id > 0),
    -- Decimals of the price feed's answers.
    price_decimals            SMALLINT    NOT NULL CHECK (price_decimals BETWEEN 0 AND 36),
    staleness_bound_seconds   BIGINT      NOT NULL CHECK (staleness_bound_seconds > 0),
    -- Mints above this amount (token units, decimal string) wait for an approval; NULL: never.
    mint_approval_threshold   TEXT        CHECK (mint_approval_threshold IS NULL
                                                 OR mint_approval_threshold ~ '^[0-9]{1,78}(\.[0-9]{1,36})?$'),
    approval_ttl_seconds      BIGINT      NOT NULL DEFAULT 86400 CHECK (approval_ttl_seconds > 0),
    -- Insufficient gas funds pause the operation (waiting for funding) instead of failing it.
    funding_pause             BOOLEAN     NOT NULL DEFAULT false,
    funding_deadline_seconds  BIGINT      NOT NULL DEFAULT 3600 CHECK (funding_deadline_seconds > 0),
    created_at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE asset (
    id               UUID        PRIMARY KEY,
    organization_id  UUID        NOT NULL REFERENCES organization (id),
    template_id      TEXT        NOT NULL,
    chain_id         BIGINT      NOT NULL CHECK (chain_id > 0),
    name             TEXT        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 64),
    symbol           TEXT        NOT NULL CHECK (char_length(symbol) BETWEEN 1 AND 16),
    decimals         SMALLINT    NOT NULL CHECK (decimals BETWEEN 0 AND 36),
    -- Initial price as given (decimal string, quote units per token).
    initial_price    TEXT        NOT NULL,
    token_address    BYTEA       CHECK (token_address IS NULL OR octet_length(token_address) = 20),
    feed_address     BYTEA       CHECK (feed_address IS NULL OR octet_length(feed_address) = 20),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    FOREIGN KEY (organization_id, template_id) REFERENCES asset_template (organization_id, id)
);
CREATE INDEX asset_organization ON asset (organization_id, created_at, id);

CREATE TABLE operation (
    id               UUID        PRIMARY KEY,
    organization_id  UUID        NOT NULL REFERENCES organization (id),
    kind             TEXT        NOT NULL CHECK (kind IN ('asset.create', 'asset.mint', 'asset.transfer',
                                                         'asset.pause', 'asset.unpause')),
    asset_id         UUID        NOT NULL REFERENCES asset (id),
    idempotency_key  TEXT        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    -- SHA-256 of the kind, the asset and the canonical request body: same key + other
    -- request is a conflict.
    request_sha256   BYTEA       NOT NULL CHECK (octet_length(request_sha256) = 32),
    -- The API key that made the request (approvals need a different one).
    api_key_id       UUID        NOT NULL REFERENCES api_key (id),
    -- The durable instance (workflow = kind, idempotency key = operation id); set right
    -- after the start, which a repeated request re-issues idempotently.
    instance_id      UUID,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT operation_idempotency UNIQUE (organization_id, idempotency_key)
);
CREATE INDEX operation_asset ON operation (asset_id, created_at);

CREATE TABLE operation_tx (
    operation_id    UUID        NOT NULL REFERENCES operation (id),
    step            TEXT        NOT NULL CHECK (char_length(step) BETWEEN 1 AND 64),
    txq_request_id  UUID        NOT NULL REFERENCES txq_request (id),
    instance_id     UUID        NOT NULL,
    signal_name     TEXT        NOT NULL,
    delivered_at    TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, step)
);
CREATE INDEX operation_tx_undelivered ON operation_tx (txq_request_id) WHERE delivered_at IS NULL;
