-- keel-webhooks (issue 21): outbound webhooks. Read and written only through
-- crates/keel-webhooks/src/store.rs.
--
-- webhook_endpoint: an organization's subscription. `secret` is the current signing
-- secret (the `whsec_` base64 text as shown once at creation); during a rotation
-- overlap `previous_secret` also signs until `previous_secret_expires_at`.
CREATE TABLE webhook_endpoint (
    id                         uuid PRIMARY KEY,
    organization_id            uuid NOT NULL,
    url                        text NOT NULL,
    description                text NOT NULL DEFAULT '',
    event_types                text[] NOT NULL,
    enabled                    boolean NOT NULL DEFAULT true,
    -- why the endpoint was disabled by Keel: 'gone' (HTTP 410), 'failing' (failed for
    -- the whole retry window); NULL when enabled or disabled by its owner.
    disabled_reason            text,
    secret                     text NOT NULL,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    -- the circuit breaker: failed attempts in a row, and until when it is open.
    consecutive_failures       integer NOT NULL DEFAULT 0,
    breaker_open_until         timestamptz,
    -- the first failed attempt since the last success (NULL: the last attempt succeeded).
    failing_since              timestamptz,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    deleted_at                 timestamptz
);
CREATE INDEX webhook_endpoint_org ON webhook_endpoint (organization_id, created_at, id)
    WHERE deleted_at IS NULL;

-- webhook_event: one reported change, written in the transaction of the change (the
-- outbox). `seq` orders the events of one operation (they are written under the
-- operation's instance lock, so seq order is commit order per operation).
-- `dispatch_settled_at`: set once no delivery of the event can change any more (every
-- delivery succeeded, failed for good or was cancelled); retention counts from it.
CREATE TABLE webhook_event (
    id                  uuid PRIMARY KEY,
    seq                 bigint GENERATED ALWAYS AS IDENTITY,
    organization_id     uuid NOT NULL,
    event_type          text NOT NULL,
    operation_id        uuid,
    payload             jsonb NOT NULL,
    is_test             boolean NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT now(),
    dispatch_settled_at timestamptz
);
CREATE INDEX webhook_event_settled ON webhook_event (dispatch_settled_at)
    WHERE dispatch_settled_at IS NOT NULL AND NOT is_test;
CREATE INDEX webhook_event_unsettled ON webhook_event (created_at)
    WHERE dispatch_settled_at IS NULL;

-- webhook_delivery: an event to one endpoint. state: 'pending' (will be attempted,
-- maybe leased by a runner right now), 'succeeded', 'failed' (given up), 'cancelled'
-- (the endpoint was disabled or deleted first).
CREATE TABLE webhook_delivery (
    id              uuid PRIMARY KEY,
    event_id        uuid NOT NULL REFERENCES webhook_event (id),
    endpoint_id     uuid NOT NULL REFERENCES webhook_endpoint (id),
    seq             bigint NOT NULL,
    operation_id    uuid,
    event_type      text NOT NULL,
    is_test         boolean NOT NULL DEFAULT false,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'succeeded', 'failed', 'cancelled')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz
);
CREATE INDEX webhook_delivery_due ON webhook_delivery (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX webhook_delivery_order ON webhook_delivery (endpoint_id, operation_id, seq)
    WHERE state = 'pending';
CREATE INDEX webhook_delivery_event ON webhook_delivery (event_id);
CREATE INDEX webhook_delivery_endpoint ON webhook_delivery (endpoint_id, created_at DESC, id DESC);

-- webhook_attempt: one HTTP attempt of a delivery (the receipt): when, the HTTP status
-- (NULL without a response), latency, the error class, and the next retry it scheduled.
CREATE TABLE webhook_attempt (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id   uuid NOT NULL REFERENCES webhook_delivery (id),
    attempted_at  timestamptz NOT NULL DEFAULT now(),
    http_status   integer,
    latency_ms    integer NOT NULL,
    error_class   text,
    next_retry_at timestamptz
);
CREATE INDEX webhook_attempt_delivery ON webhook_attempt (delivery_id, id);
