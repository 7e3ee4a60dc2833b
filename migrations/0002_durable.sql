-- keel-durable: the durable workflow engine (see crates/keel-durable/src/lib.rs).
--
-- durable_instance   one row per workflow instance: status projection + execution lock
-- durable_command    every change to an instance is a recorded command in its queue
-- durable_journal    the recorded results of an instance's steps, in body order
-- durable_signal     external signals, deduplicated per instance, consumed by a wait

CREATE TABLE durable_instance (
    id                  UUID        PRIMARY KEY,
    workflow            TEXT        NOT NULL CHECK (char_length(workflow) BETWEEN 1 AND 255),
    idempotency_key     TEXT        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    input               JSONB       NOT NULL,
    status              TEXT        NOT NULL DEFAULT 'pending' CHECK (status IN
                          ('pending', 'running', 'waiting', 'suspended', 'completed', 'failed', 'cancelled')),
    -- Instances sharing a serialization key run one at a time, in start_order.
    serialization_key   TEXT        CHECK (serialization_key IS NULL OR char_length(serialization_key) BETWEEN 1 AND 255),
    -- The instance that started this one as a child (ctx.start_child), if any.
    parent_id           UUID        REFERENCES durable_instance (id) ON DELETE SET NULL,
    start_order         BIGSERIAL   NOT NULL,
    output              JSONB,
    error_code          TEXT,
    error_retryable     BOOLEAN,
    error_message       TEXT,
    error_detail        JSONB,
    progress            JSONB,
    -- {"kind": "signal"|"timer", "name": ..., "deadline": RFC 3339} while waiting.
    wait                JSONB,
    -- The execution lock: a segment holds it with a token until lease_expires_at (DB clock).
    lease_token         UUID,
    lease_expires_at    TIMESTAMPTZ,
    -- Unconsumed signals, bounded by the engine's maxOpenSignals.
    open_signals        INTEGER     NOT NULL DEFAULT 0 CHECK (open_signals >= 0),
    -- Consecutive suspensions, for the capped exponential recovery backoff.
    recovery_attempts   INTEGER     NOT NULL DEFAULT 0 CHECK (recovery_attempts >= 0),
    cancel_requested_at TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at            TIMESTAMPTZ,
    CONSTRAINT durable_instance_idempotency UNIQUE (workflow, idempotency_key),
    CONSTRAINT durable_instance_ended_at CHECK (
        (status IN ('completed', 'failed', 'cancelled')) = (ended_at IS NOT NULL)),
    CONSTRAINT durable_instance_lease CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT durable_instance_completed_output CHECK (status <> 'completed' OR output IS NOT NULL),
    CONSTRAINT durable_instance_failed_error CHECK (status <> 'failed' OR error_code IS NOT NULL)
);

CREATE INDEX durable_instance_serialization ON durable_instance (serialization_key, start_order)
    WHERE serialization_key IS NOT NULL AND status NOT IN ('completed', 'cancelled');
CREATE INDEX durable_instance_ended ON durable_instance (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX durable_instance_leased ON durable_instance (lease_expires_at) WHERE lease_expires_at IS NOT NULL;

CREATE TABLE durable_command (
    id              BIGSERIAL   PRIMARY KEY,
    instance_id     UUID        NOT NULL REFERENCES durable_instance (id) ON DELETE CASCADE,
    kind            TEXT        NOT NULL CHECK (kind IN ('start', 'signal', 'timer', 'retry', 'cancel')),
    -- Database clock; a timer's fire time.
    available_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    state           TEXT        NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'dead')),
    attempt         INTEGER     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts    INTEGER     NOT NULL CHECK (max_attempts >= 1),
    -- Outcome code of a settled command (value-free), e.g. `completed`, `waiting`, `stale`.
    outcome         TEXT,
    -- Code of the last failed attempt (value-free).
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at    TIMESTAMPTZ,
    CONSTRAINT durable_command_completed_at CHECK ((state IN ('done', 'dead')) = (completed_at IS NOT NULL))
);

-- The claim: available queued commands by (available_at, id); per-instance ordering.
CREATE INDEX durable_command_claim ON durable_command (available_at, id) WHERE state = 'queued';
CREATE INDEX durable_command_instance_open ON durable_command (instance_id, id)
    WHERE state IN ('queued', 'running');
CREATE INDEX durable_command_running ON durable_command (id) WHERE state = 'running';
CREATE INDEX durable_command_dead ON durable_command (id) WHERE state = 'dead';
CREATE INDEX durable_command_retention ON durable_command (completed_at) WHERE state = 'done';

-- Wake executors whenever a command is recorded (delivered at commit; identical
-- payloads within one transaction are collapsed by PostgreSQL).
CREATE FUNCTION durable_command_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('keel_durable', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER durable_command_notify AFTER INSERT ON durable_command
    FOR EACH STATEMENT EXECUTE FUNCTION durable_command_notify();

CREATE TABLE durable_journal (
    instance_id UUID        NOT NULL REFERENCES durable_instance (id) ON DELETE CASCADE,
    seq         INTEGER     NOT NULL CHECK (seq >= 0),
    kind        TEXT        NOT NULL CHECK (kind IN ('step', 'now', 'uuid', 'random', 'sleep', 'wait', 'signal', 'child')),
    name        TEXT        NOT NULL CHECK (char_length(name) <= 255),
    -- {"ok": value} or {"err": typed error}
    result      JSONB       NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, seq)
);

CREATE TABLE durable_signal (
    id           BIGSERIAL   PRIMARY KEY,
    instance_id  UUID        NOT NULL REFERENCES durable_instance (id) ON DELETE CASCADE,
    name         TEXT        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
    payload      JSONB       NOT NULL,
    dedupe_key   TEXT        NOT NULL CHECK (char_length(dedupe_key) BETWEEN 1 AND 255),
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The journal position of the wait that consumed it.
    consumed_seq INTEGER,
    CONSTRAINT durable_signal_dedupe UNIQUE (instance_id, dedupe_key)
);

CREATE INDEX durable_signal_open ON durable_signal (instance_id, name, recorded_at, id)
    WHERE consumed_seq IS NULL;

-- A child instance that ends (completed or cancelled) signals its parent: a signal named
-- `child:<child id>` carrying {status, output}, and a SIGNAL command, whatever path ended
-- it (a segment's settlement or an immediate cancel). Not sent when the parent has ended.
CREATE FUNCTION durable_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE durable_instance SET open_signals = open_signals + 1, updated_at = now()
     WHERE id = NEW.parent_id AND status NOT IN ('completed', 'cancelled');
    IF FOUND THEN
        INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, recorded_at)
        VALUES (NEW.parent_id, 'child:' || NEW.id,
                jsonb_build_object('status', NEW.status, 'output', NEW.output),
                'child:' || NEW.id, clock_timestamp())
        ON CONFLICT (instance_id, dedupe_key) DO NOTHING;
        IF FOUND THEN
            INSERT INTO durable_command (instance_id, kind, max_attempts)
            VALUES (NEW.parent_id, 'signal', 5);
        ELSE
            UPDATE durable_instance SET open_signals = open_signals - 1 WHERE id = NEW.parent_id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER durable_child_ended AFTER UPDATE OF status ON durable_instance
    FOR EACH ROW
    WHEN (NEW.parent_id IS NOT NULL AND NEW.status IN ('completed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION durable_child_ended();
