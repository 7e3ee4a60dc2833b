-- keel-aa: durable user operations and their bundles (see crates/keel-aa/src/store.rs,
-- docs/aa.md "The durable flow").
--
-- aa_user_operation     one row per (chain, user operation hash): the operation as
--                       packed, the journaled EntryPoint resolution, its state, the bundle
--                       it is in, the outcome (receipt fields or the ERC-7769 refusal)
-- aa_bundle             one handleOps transaction: the txq request that sends it (queue
--                       key aa-bundle:<id>), the ordered operation hashes, its state
-- aa_sponsorship_spend  per (organization, chain, UTC day): wei of maximum operation cost
--                       the sponsorship policy granted (its `spent_today`)

CREATE TABLE aa_bundle (
    id              UUID        PRIMARY KEY,
    chain_id        BIGINT      NOT NULL CHECK (chain_id > 0),
    entry_point     BYTEA       NOT NULL CHECK (octet_length(entry_point) = 20),
    txq_request_id  UUID        NOT NULL UNIQUE,
    -- The operation hashes in bundle order.
    user_op_hashes  BYTEA[]     NOT NULL,
    -- submitted: enqueued on the queue, no verdict handled yet; included: the verdict was
    -- confirmed and every operation's outcome recorded; failed: reverted or never took
    -- effect, its operations went back to ready (or ended).
    state           TEXT        NOT NULL DEFAULT 'submitted'
                      CHECK (state IN ('submitted', 'included', 'failed')),
    tx_hash         BYTEA       CHECK (tx_hash IS NULL OR octet_length(tx_hash) = 32),
    block_number    BIGINT,
    block_hash      BYTEA       CHECK (block_hash IS NULL OR octet_length(block_hash) = 32),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX aa_bundle_open ON aa_bundle (chain_id, created_at) WHERE state = 'submitted';

CREATE TABLE aa_user_operation (
    chain_id           BIGINT      NOT NULL CHECK (chain_id > 0),
    user_op_hash       BYTEA       NOT NULL CHECK (octet_length(user_op_hash) = 32),
    organization_id    UUID,
    sender             BYTEA       NOT NULL CHECK (octet_length(sender) = 20),
    -- The nonce, decimal string of a uint256 (key in the high 192 bits).
    nonce              TEXT        NOT NULL CHECK (nonce ~ '^[0-9]{1,78}$'),
    -- The ERC-7769 JSON form of the operation as accepted.
    user_operation     JSONB       NOT NULL,
    -- keel_aa::Resolution as JSON (configured, resolved, kind), journaled with the
    -- workflow: the address every step of this operation used.
    resolution         JSONB       NOT NULL,
    instance_id        UUID        NOT NULL,
    state              TEXT        NOT NULL DEFAULT 'accepted'
                         CHECK (state IN ('accepted', 'ready', 'bundled', 'included',
                                          'failed', 'nonce_used_elsewhere')),
    bundle_id          UUID        REFERENCES aa_bundle (id),
    -- Sponsorship granted (maximum cost, wei, decimal) when the policy applied.
    sponsored_wei      TEXT        CHECK (sponsored_wei IS NULL OR sponsored_wei ~ '^[0-9]{1,78}$'),
    -- Outcome of an included operation (UserOperationEvent of this hash).
    success            BOOLEAN,
    actual_gas_cost    TEXT        CHECK (actual_gas_cost IS NULL OR actual_gas_cost ~ '^[0-9]{1,78}$'),
    actual_gas_used    TEXT        CHECK (actual_gas_used IS NULL OR actual_gas_used ~ '^[0-9]{1,78}$'),
    revert_reason      BYTEA,
    tx_hash            BYTEA       CHECK (tx_hash IS NULL OR octet_length(tx_hash) = 32),
    block_number       BIGINT,
    block_hash         BYTEA       CHECK (block_hash IS NULL OR octet_length(block_hash) = 32),
    -- Refusal of a failed operation: ERC-7769 code (-32500 ...), the AAxx code or a
    -- Keel code (SPONSOR_*), never payload values.
    error_code         INTEGER,
    error_reason       TEXT        CHECK (error_reason IS NULL OR char_length(error_reason) <= 200),
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, user_op_hash)
);
CREATE INDEX aa_user_operation_hash ON aa_user_operation (user_op_hash);
CREATE INDEX aa_user_operation_ready ON aa_user_operation (chain_id, created_at)
    WHERE state = 'ready';
CREATE INDEX aa_user_operation_bundle ON aa_user_operation (bundle_id)
    WHERE bundle_id IS NOT NULL;
CREATE INDEX aa_user_operation_open ON aa_user_operation (created_at)
    WHERE state IN ('accepted', 'ready', 'bundled');

CREATE TABLE aa_sponsorship_spend (
    organization_id  UUID        NOT NULL,
    chain_id         BIGINT      NOT NULL CHECK (chain_id > 0),
    day              DATE        NOT NULL,
    -- Wei, decimal string of a U256.
    granted_wei      NUMERIC(78) NOT NULL CHECK (granted_wei >= 0),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, chain_id, day)
);
