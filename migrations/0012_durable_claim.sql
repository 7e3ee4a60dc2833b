-- keel-durable: the executor's claim as a function (see crates/keel-durable/src/executor.rs).
--
-- The claim used to be one statement that joined every available queued command to its
-- instance, filtered and sorted them all, then took the first few: its cost grew with the
-- backlog (a burst of starts made each claim read and sort the whole queue), and its plan
-- depended on the statistics of the moment. This function walks the queue in claim order
-- (`durable_command_claim`, i.e. (available_at, id) of queued commands) and stops as soon
-- as it has claimed `p_limit` commands: each candidate is checked and locked on its own by
-- primary key, so a claim costs about the same with 10 or 100,000 queued commands.
-- `enable_seqscan`/`enable_sort` are off inside it so that no plan can replace the ordered
-- index walk by a scan and sort of the whole queue (every statement in it is an index
-- lookup).
--
-- The rules are those of the statement it replaces: a command qualifies when it is queued
-- and available, its workflow is one of `p_workflows`, its instance holds no live lease,
-- no earlier runnable command of its instance precedes it, and (for a START) no earlier
-- unfinished instance with the same serialization key precedes its instance. The command
-- and its instance are locked together with `FOR UPDATE ... SKIP LOCKED` (a locked one is
-- skipped, never waited for: a journal write in flight share-locks its instance). A
-- claimed command is set running with attempt + 1 and its instance leased with a new
-- token for `p_lease_secs` (and `running` when it was pending, waiting or suspended and
-- the command is not a CANCEL) — or, when its attempts are spent, the command is
-- dead-lettered and the instance's lease cleared. Dead-lettered commands are returned too
-- (`exhausted`) and count towards `p_limit`.
CREATE FUNCTION durable_claim(p_workflows TEXT[], p_lease_secs FLOAT8, p_limit INTEGER)
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
                  AND p.status NOT IN ('completed', 'cancelled')))
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
