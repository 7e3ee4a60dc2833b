-- keel-txq: funding pauses (see crates/keel-txq/src/lib.rs, "Funding pauses").
--
-- A request enqueued with a funding pause that its sender cannot pay for
-- (gas limit × max fee per gas + value > balance) waits in the new state
-- `waiting_funding` instead of failing `GAS_REQUIRED`. It holds no nonce while it waits.
--
-- funding_pause_ms      set at enqueue; NULL: no funding pause (fails GAS_REQUIRED)
-- funding_deadline      database clock; set once, at the first detection of missing
--                       funds (now() + funding_pause_ms), never moved afterwards
-- funding_required_wei  the shortfall last computed: gas limit × max fee + value − balance
-- funding_gas_limit     the gas limit of that computation (units of gas)
-- funding_max_fee_wei   the max fee per gas of that computation (wei per gas)
-- funding_refusals      broadcasts refused for insufficient funds after signing (bounded)

ALTER TABLE txq_request
    ADD COLUMN funding_pause_ms     BIGINT  CHECK (funding_pause_ms IS NULL OR funding_pause_ms >= 0),
    ADD COLUMN funding_deadline     TIMESTAMPTZ,
    ADD COLUMN funding_required_wei TEXT    CHECK (funding_required_wei IS NULL OR funding_required_wei ~ '^[0-9]{1,78}$'),
    ADD COLUMN funding_gas_limit    BIGINT  CHECK (funding_gas_limit IS NULL OR funding_gas_limit > 0),
    ADD COLUMN funding_max_fee_wei  TEXT    CHECK (funding_max_fee_wei IS NULL OR funding_max_fee_wei ~ '^[0-9]{1,78}$'),
    ADD COLUMN funding_refusals     INTEGER NOT NULL DEFAULT 0 CHECK (funding_refusals >= 0);

-- The state set gains `waiting_funding`.
ALTER TABLE txq_request DROP CONSTRAINT txq_request_state_check;
ALTER TABLE txq_request ADD CONSTRAINT txq_request_state_check
    CHECK (state IN ('queued', 'waiting_funding', 'signed', 'broadcast', 'settled'));

-- A waiting request holds no nonce.
ALTER TABLE txq_request DROP CONSTRAINT txq_request_nonce;
ALTER TABLE txq_request ADD CONSTRAINT txq_request_nonce
    CHECK (state IN ('queued', 'waiting_funding', 'settled') OR nonce IS NOT NULL);

-- Only a request with a funding pause waits, and a waiting request carries its
-- complete funding request.
ALTER TABLE txq_request ADD CONSTRAINT txq_request_waiting_funding
    CHECK (state <> 'waiting_funding'
           OR (nonce IS NULL AND funding_pause_ms IS NOT NULL AND funding_deadline IS NOT NULL
               AND funding_required_wei IS NOT NULL AND funding_gas_limit IS NOT NULL
               AND funding_max_fee_wei IS NOT NULL));

CREATE INDEX txq_request_waiting ON txq_request (chain_id, sender, created_at, id)
    WHERE state = 'waiting_funding';
