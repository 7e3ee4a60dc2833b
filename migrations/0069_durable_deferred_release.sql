-- keel-durable: an instance no runner can run yet does not block the ones that can
-- (issue 32, class 6).
--
-- During a rollback of a release, an instance started by the newer release (pinned to a
-- version no live runner knows: "deferred", docs/versioning.md) used to hold its
-- serialization key while it waited, so every later instance of the same key (an
-- asset's operations) queued behind it for as long as the rollback lasted.
--
-- The rule now (durable_claim_versions, and the `queued_behind` of the status
-- projection, crate keel-durable store.rs): an instance holds its key as before, EXCEPT
-- a `pending` instance whose START was never claimed (attempt 0: its body never ran, so
-- it has written nothing and sent nothing) and whose pinned version no live runner
-- (durable_runner_version seen within 30 s, crate::version::RUNNER_LIVENESS), nor the
-- claiming executor, can run while a runner of its workflow is live (with none live at
-- all, nothing is skipped).
-- Such an instance is skipped: the instances after it that a runner can run start in
-- their order. Per-key order is kept among the instances that can run; the deferred
-- one keeps its place in start order and holds the key again as soon as a runner that
-- knows its version is live (it then starts before every instance of its key that has
-- not started yet). An instance that already ran a segment keeps holding its key even
-- when deferred: it may be part-way through its writes.

-- A dead-lettered command never strands its instance (issue 32, class 11). Before,
-- the claim that found a command's attempts spent marked it `dead` and released the
-- lease, and left the instance as it was: a START dead-lettered before the body ran left
-- an accepted operation `pending`/`running` with no command that would ever run it (a
-- START dead-lettered after the body had queued its transaction was completed later by
-- the verdict's SIGNAL, which is how the dead-lettered starts of the kill test still
-- minted). Now the same claim also fails an open instance (`pending`, `running`,
-- `waiting`, `suspended`) with `ATTEMPTS_EXHAUSTED`, retryable: it is visible as
-- failed, releases its serialization key, and a retry resumes it from its journal
-- (signals that arrived meanwhile are parked and consumed then).

-- durable_deferred_unstarted(...) (migration 0068) is the predicate of the exception.


CREATE OR REPLACE FUNCTION durable_claim_versions(p_workflows TEXT[], p_min INTEGER[], p_max INTEGER[],
                                       p_lease_secs FLOAT8, p_limit INTEGER)
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
    db_now            TIMESTAMPTZ,
    version           INTEGER
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    q     RECORD;
    c     RECORD;
    exh    BOOLEAN;
    flip   BOOLEAN;
    strand BOOLEAN;
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
               i.status AS instance_status, w.hi AS top_version
          INTO c
          FROM durable_command x
          JOIN durable_instance i ON i.id = x.instance_id
          JOIN unnest(p_workflows, p_min, p_max) AS w(name, lo, hi)
            ON w.name = i.workflow AND (i.version IS NULL OR i.version BETWEEN w.lo AND w.hi)
         WHERE x.id = q.id AND x.state = 'queued' AND x.available_at <= now()
           AND (i.lease_expires_at IS NULL OR i.lease_expires_at <= now())
           AND NOT EXISTS (
               SELECT 1 FROM durable_command e
                WHERE e.instance_id = x.instance_id AND e.id < x.id
                  AND (e.state = 'running' OR (e.state = 'queued' AND e.available_at <= now())))
           AND NOT (x.kind = 'start' AND i.serialization_key IS NOT NULL AND EXISTS (
               SELECT 1 FROM durable_instance p
                WHERE p.serialization_key = i.serialization_key AND p.start_order < i.start_order
                  AND (p.status IN ('pending', 'running', 'suspended')
                       OR (p.status = 'waiting' AND p.wait->>'kind' = 'timer'))
                  -- ... unless it never started and is deferred by its version (0068),
                  -- which this executor cannot run either (an executor that can is a
                  -- live runner of it, whether or not its heartbeat is recorded yet).
                  AND NOT (durable_deferred_unstarted(p.id, p.workflow, p.version, p.status)
                           AND NOT EXISTS (
                               SELECT 1 FROM unnest(p_workflows, p_min, p_max) AS v(name, lo, hi)
                                WHERE v.name = p.workflow
                                  AND (p.version IS NULL OR p.version BETWEEN v.lo AND v.hi)))))
         LIMIT 1
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
        strand := exh AND c.instance_status IN ('pending', 'running', 'waiting', 'suspended');
        UPDATE durable_instance i
           SET lease_token = CASE WHEN exh THEN NULL ELSE gen_random_uuid() END,
               lease_expires_at = CASE WHEN exh THEN NULL
                                       ELSE now() + make_interval(secs => p_lease_secs) END,
               status = CASE WHEN strand THEN 'failed'
                             WHEN flip AND NOT exh THEN 'running' ELSE i.status END,
               wait = CASE WHEN strand THEN NULL WHEN flip AND NOT exh THEN NULL ELSE i.wait END,
               ended_at = CASE WHEN strand THEN now() ELSE i.ended_at END,
               error_code = CASE WHEN strand THEN 'ATTEMPTS_EXHAUSTED' ELSE i.error_code END,
               error_retryable = CASE WHEN strand THEN true ELSE i.error_retryable END,
               error_message = CASE WHEN strand
                   THEN 'a command of the instance was dead-lettered (its attempts were exhausted); retry the instance to resume it from its journal'
                   ELSE i.error_message END,
               error_detail = CASE WHEN strand
                   THEN jsonb_build_object('command', c.kind, 'attempts', c.attempt)
                   ELSE i.error_detail END,
               recovery_attempts = CASE WHEN strand THEN 0 ELSE i.recovery_attempts END,
               version = CASE WHEN exh THEN i.version ELSE coalesce(i.version, c.top_version) END,
               updated_at = now()
         WHERE i.id = c.instance_id
     RETURNING i.workflow, i.status, i.input, i.lease_token,
               i.cancel_requested_at IS NOT NULL, i.recovery_attempts, i.version
          INTO workflow, status, input, lease_token, cancel, recovery_attempts, version;

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
