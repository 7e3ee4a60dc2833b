-- keel-durable: operation history, the decision log (issue 23, "Operation history").
--
-- durable_history     append-only entries of an instance, numbered 1, 2, ... per instance
--                     with no gap: each is written in the transaction of the change it
--                     logs (a command's recording, or the segment settle of the segment
--                     that decided it), so a rolled-back or lost segment takes its
--                     entries with it (see crates/keel-durable/src/history.rs).
--
-- seq                 1-based, per instance, allocated from durable_instance.history_seq
--                     under the instance's row lock (so entries commit in seq order)
-- kind                what happened: command_received, step_recorded, timer_set,
--                     timer_fired, timeout, wait_entered, signal_applied,
--                     transaction_enqueued, verdict_received, child_started, retry,
--                     cancel_requested, cancelled, suspended, completed, failed
-- command_id          the command the entry belongs to (no foreign key: retention deletes
--                     settled commands before their instance; the entry stays)
-- actor_*             the actor of that command (see migration 0055), copied at write time
-- detail              value-free facts of the entry (names, outcome kinds, durations in
--                     ms, codes), plus a redacted copy of a START's input
-- patch               RFC 6902 patch (add/remove/replace only) from the state after the
--                     previous entry to the state after this one; [] when unchanged;
--                     NULL when the entry carries a baseline or was truncated
-- baseline            the full (redacted) state after this entry, or NULL
-- truncated           the state change was too large to log: neither patch nor baseline;
--                     the next state-changing entry carries a baseline
--
-- The state is the instance's published projection ({status, progress, wait, output,
-- error}), redacted before it is diffed or stored. durable_instance gains the
-- engine's bookkeeping of its log: the next sequence (history_seq: the last one used),
-- the state after its latest entry (history_state, redacted; NULL: unknown, so the next
-- segment logs a baseline), and how many journal entries are logged (history_journal).
--
-- Retention: entries go with their instance (ON DELETE CASCADE), under the retention
-- window of the instance (crates/keel-durable/src/retention.rs).

ALTER TABLE durable_instance
    ADD COLUMN history_seq BIGINT NOT NULL DEFAULT 0 CHECK (history_seq >= 0),
    ADD COLUMN history_state JSONB,
    ADD COLUMN history_journal INTEGER NOT NULL DEFAULT 0 CHECK (history_journal >= 0);

CREATE TABLE durable_history (
    instance_id        UUID        NOT NULL REFERENCES durable_instance (id) ON DELETE CASCADE,
    seq                BIGINT      NOT NULL CHECK (seq >= 1),
    kind               TEXT        NOT NULL CHECK (char_length(kind) BETWEEN 1 AND 40),
    recorded_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    command_id         BIGINT,
    actor_kind         TEXT        NOT NULL DEFAULT 'NONE',
    actor_id           TEXT,
    actor_reason       TEXT,
    on_behalf_of       TEXT,
    attribution_status TEXT        NOT NULL DEFAULT 'ABSENT',
    detail             JSONB       NOT NULL DEFAULT '{}'::jsonb,
    patch              JSONB,
    baseline           JSONB,
    truncated          BOOLEAN     NOT NULL DEFAULT false,
    PRIMARY KEY (instance_id, seq),
    CONSTRAINT durable_history_actor CHECK (
        actor_kind IN ('USER', 'SERVICE', 'SYSTEM', 'NONE')
        AND attribution_status IN ('VERIFIED', 'ABSENT', 'DEGRADED')
        AND coalesce(char_length(actor_id), 0) <= 255
        AND coalesce(char_length(actor_reason), 0) <= 255
        AND coalesce(char_length(on_behalf_of), 0) <= 255
    ),
    CONSTRAINT durable_history_delta CHECK (
        (patch IS NULL OR jsonb_typeof(patch) = 'array')
        AND NOT (truncated AND (patch IS NOT NULL OR baseline IS NOT NULL))
        AND NOT (patch IS NOT NULL AND baseline IS NOT NULL)
    )
);

-- Append-only: entries are never changed (they go only with their instance).
CREATE FUNCTION durable_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'durable_history is append-only' USING ERRCODE = 'P0001';
END;
$$;

CREATE TRIGGER durable_history_append_only BEFORE UPDATE ON durable_history
    FOR EACH ROW EXECUTE FUNCTION durable_history_append_only();
