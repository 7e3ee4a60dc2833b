-- keel-durable: which instances hold their serialization key (issue 16).
--
-- Until now every instance that was not `completed` or `cancelled` held its key, so a
-- `failed` operation (a reverted transfer, a rejected approval) and one that waited for a
-- human or for funds blocked every later operation of its asset for good. The rule is now:
--
--   an instance holds its serialization key while it is `pending`, `running`,
--   `suspended`, or `waiting` on a durable timer (`ctx.sleep`); it releases it when it
--   ends (`completed`, `failed`, `cancelled`) and while it waits for a signal (an
--   approval, a transaction verdict, funding).
--
-- `pending` holds so that starts stay first-in-first-out; `suspended` holds because a
-- suspension interrupts a step mid-way (its recovery replays that step, which may write);
-- a timer is a pause the workflow itself chose inside its run. A signal wait depends on
-- the outside world, which may take a day (an approval) or never come. An instance that
-- waits for a signal has journaled every write it made before the wait; the writes of the
-- instances that start meanwhile are ordered after it by the transaction queue (nonces per
-- sender). A `failed` instance that is retried is `pending` again and so holds its key
-- until its RETRY runs (it does not jump ahead of instances already running).
--
-- The claim function keeps its contract (see 0012) except for that rule; the partial
-- index follows the new predicate.

CREATE INDEX durable_instance_serialization_holding ON durable_instance (serialization_key, start_order)
    WHERE serialization_key IS NOT NULL AND status IN ('pending', 'running', 'suspended', 'waiting');
DROP INDEX durable_instance_serialization;

CREATE OR REPLACE FUNCTION durable_claim(p_workflows TEXT[], p_lease_secs FLOAT8, p_limit INTEGER)
RETURNS TABLE (
    command_id        BIGINT,
    kind              TEXT,
    attempt           INTEGER,
    exhausted         BOOLEAN,
    latency           FLOAT8,
    instance_id       UUID,
    workflow          TEXT,
    status            TEXT,
    input             JSONB,
    lease_token       UUID,
    cancel            BOOLEAN,
    recovery_attempts INTEGER,
    db_now            TIMESTAMPTZ
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    q     RECORD;
    c     RECORD;
    exh   BOOLEAN;
    flip  BOOLEAN;
    got   INTEGER := 0;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RETURN;
    END IF;
    FOR q IN
        SELECT x.id FROM durable_command x
         WHERE x.state = 'queued' AND x.available_at <= now()
         ORDER BY x.available_at, x.id
    LOOP
        SELECT x.id, x.instance_id, x.kind, x.attempt, x.max_attempts, x.available_at,
               i.status AS instance_status
          INTO c
          FROM durable_command x
          JOIN durable_instance i ON i.id = x.instance_id
         WHERE x.id = q.id AND x.state = 'queued' AND x.available_at <= now()
           AND (i.lease_expires_at IS NULL OR i.lease_expires_at <= now())
           AND i.workflow = ANY (p_workflows)
           AND NOT EXISTS (
               SELECT 1 FROM durable_command e
                WHERE e.instance_id = x.instance_id AND e.id < x.id
                  AND (e.state = 'running' OR (e.state = 'queued' AND e.available_at <= now())))
           AND NOT (x.kind = 'start' AND i.serialization_key IS NOT NULL AND EXISTS (
               SELECT 1 FROM durable_instance p
                WHERE p.serialization_key = i.serialization_key AND p.start_order < i.start_order
                  AND (p.status IN ('pending', 'running', 'suspended')
                       OR (p.status = 'waiting' AND p.wait->>'kind' = 'timer'))))
           FOR UPDATE OF x, i SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;

        exh := c.attempt + 1 > c.max_attempts;
        flip := c.kind <> 'cancel' AND c.instance_status IN ('pending', 'waiting', 'suspended');
        UPDATE durable_command x
           SET attempt = CASE WHEN exh THEN x.attempt ELSE x.attempt + 1 END,
               state = CASE WHEN exh THEN 'dead' ELSE 'running' END,
               completed_at = CASE WHEN exh THEN now() END,
               outcome = CASE WHEN exh THEN 'dead_letter' END,
               last_error = CASE WHEN exh THEN coalesce(x.last_error, 'ATTEMPTS_EXHAUSTED')
                                 ELSE x.last_error END
         WHERE x.id = c.id;
        UPDATE durable_instance i
           SET lease_token = CASE WHEN exh THEN NULL ELSE gen_random_uuid() END,
               lease_expires_at = CASE WHEN exh THEN NULL
                                       ELSE now() + make_interval(secs => p_lease_secs) END,
               status = CASE WHEN flip AND NOT exh THEN 'running' ELSE i.status END,
               wait = CASE WHEN flip AND NOT exh THEN NULL ELSE i.wait END,
               updated_at = now()
         WHERE i.id = c.instance_id
     RETURNING i.workflow, i.status, i.input, i.lease_token,
               i.cancel_requested_at IS NOT NULL, i.recovery_attempts
          INTO workflow, status, input, lease_token, cancel, recovery_attempts;

        command_id := c.id;
        kind := c.kind;
        attempt := CASE WHEN exh THEN c.attempt ELSE c.attempt + 1 END;
        exhausted := exh;
        latency := extract(epoch FROM now() - c.available_at)::float8;
        instance_id := c.instance_id;
        db_now := now();
        RETURN NEXT;
        got := got + 1;
        EXIT WHEN got >= p_limit;
    END LOOP;
END;
$$;
