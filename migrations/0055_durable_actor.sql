-- keel-durable: who asked for a command (issue 23, "Actor attribution").
--
-- Every recorded command (durable_command) and every recorded signal (durable_signal)
-- carries the actor that recorded it, taken once at recording time from the caller's
-- authenticated context (see crates/keel-durable/src/actor.rs), never from a payload:
--
-- actor_kind          USER (a person), SERVICE (an API key), SYSTEM (the platform: the
--                     reason says which part), NONE (no authenticated context)
-- actor_id            USER/SERVICE: the principal's id; NULL for SYSTEM and NONE
-- actor_reason        SYSTEM: timer, recovery, verdict-relay, child-start, child-ended, ...
-- on_behalf_of        the subject the actor acted for, when it differs from actor_id
-- attribution_status  VERIFIED, ABSENT (exactly when NONE), DEGRADED
--
-- Ids and reasons are sanitized by the engine (no control, separator or format
-- characters, at most 255 characters). Rows written before this migration read as
-- NONE / ABSENT (the defaults; adding a column with a constant default rewrites nothing).

ALTER TABLE durable_command
    ADD COLUMN actor_kind TEXT NOT NULL DEFAULT 'NONE',
    ADD COLUMN actor_id TEXT,
    ADD COLUMN actor_reason TEXT,
    ADD COLUMN on_behalf_of TEXT,
    ADD COLUMN attribution_status TEXT NOT NULL DEFAULT 'ABSENT',
    ADD CONSTRAINT durable_command_actor CHECK (
        actor_kind IN ('USER', 'SERVICE', 'SYSTEM', 'NONE')
        AND attribution_status IN ('VERIFIED', 'ABSENT', 'DEGRADED')
        AND (actor_kind = 'NONE') = (attribution_status = 'ABSENT')
        AND (actor_kind IN ('USER', 'SERVICE')) = (actor_id IS NOT NULL)
        AND (actor_kind <> 'SYSTEM' OR actor_reason IS NOT NULL)
        AND (actor_kind <> 'NONE' OR (actor_reason IS NULL AND on_behalf_of IS NULL))
        AND coalesce(char_length(actor_id), 0) <= 255
        AND coalesce(char_length(actor_reason), 0) <= 255
        AND coalesce(char_length(on_behalf_of), 0) <= 255
    );

ALTER TABLE durable_signal
    ADD COLUMN actor_kind TEXT NOT NULL DEFAULT 'NONE',
    ADD COLUMN actor_id TEXT,
    ADD COLUMN actor_reason TEXT,
    ADD COLUMN on_behalf_of TEXT,
    ADD COLUMN attribution_status TEXT NOT NULL DEFAULT 'ABSENT',
    ADD CONSTRAINT durable_signal_actor CHECK (
        actor_kind IN ('USER', 'SERVICE', 'SYSTEM', 'NONE')
        AND attribution_status IN ('VERIFIED', 'ABSENT', 'DEGRADED')
        AND (actor_kind = 'NONE') = (attribution_status = 'ABSENT')
        AND (actor_kind IN ('USER', 'SERVICE')) = (actor_id IS NOT NULL)
        AND (actor_kind <> 'SYSTEM' OR actor_reason IS NOT NULL)
        AND (actor_kind <> 'NONE' OR (actor_reason IS NULL AND on_behalf_of IS NULL))
        AND coalesce(char_length(actor_id), 0) <= 255
        AND coalesce(char_length(actor_reason), 0) <= 255
        AND coalesce(char_length(on_behalf_of), 0) <= 255
    );

-- The signal a child's end records for its parent (0002) is the platform's:
-- SYSTEM / child-ended, on the signal and its SIGNAL command.
CREATE OR REPLACE FUNCTION durable_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE durable_instance SET open_signals = open_signals + 1, updated_at = now()
     WHERE id = NEW.parent_id AND status NOT IN ('completed', 'cancelled');
    IF FOUND THEN
        INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, recorded_at,
                                    actor_kind, actor_reason, attribution_status)
        VALUES (NEW.parent_id, 'child:' || NEW.id,
                jsonb_build_object('status', NEW.status, 'output', NEW.output),
                'child:' || NEW.id, clock_timestamp(), 'SYSTEM', 'child-ended', 'VERIFIED')
        ON CONFLICT (instance_id, dedupe_key) DO NOTHING;
        IF FOUND THEN
            INSERT INTO durable_command (instance_id, kind, max_attempts,
                                         actor_kind, actor_reason, attribution_status)
            VALUES (NEW.parent_id, 'signal', 5, 'SYSTEM', 'child-ended', 'VERIFIED');
        ELSE
            UPDATE durable_instance SET open_signals = open_signals - 1 WHERE id = NEW.parent_id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
