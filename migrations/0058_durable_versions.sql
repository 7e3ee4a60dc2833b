-- keel-durable: workflow versioning (issue 23, "Workflow versioning"; docs/versioning.md).
--
-- durable_instance.version   the code version of its workflow an instance is pinned to
--                            (`Workflow::VERSION` of the code that started it). NULL: not
--                            pinned yet (a start by name on a node that does not run the
--                            workflow); the first runner that claims its START pins it to
--                            its current version. Rows written before this migration, and
--                            rows inserted by binaries that predate it, read as 1: the
--                            code before versioning is version 1 of every workflow.
-- durable_journal 'version'  the decision of a `ctx.version(change_id, min, max)` gate,
--                            `{"ok": <version>}`, named by its change id.
-- durable_runner_version     which versions of which workflows each live executor can
--                            run (`Workflow::MIN_VERSION..=VERSION`), refreshed by a
--                            heartbeat; an open instance whose version no live executor
--                            covers is reported as waiting for a runner
--                            (Engine::version_waits, InstanceStatus::awaiting_runner).
-- durable_claim_versions     the claim (0012/0016) with a version range per workflow: an
--                            executor claims only commands of instances pinned to a
--                            version it can run (or not pinned yet, which it pins to the
--                            top of its range). durable_claim keeps its signature for
--                            binaries that predate versioning and claims version 1 only.

ALTER TABLE durable_instance
    ADD COLUMN version INTEGER DEFAULT 1 CHECK (version IS NULL OR version >= 1);

-- The version-wait report: open instances by workflow and version.
CREATE INDEX durable_instance_open_version ON durable_instance (workflow, version)
    WHERE ended_at IS NULL;

ALTER TABLE durable_journal DROP CONSTRAINT durable_journal_kind_check;
ALTER TABLE durable_journal ADD CONSTRAINT durable_journal_kind_check CHECK (kind IN
    ('step', 'now', 'uuid', 'random', 'sleep', 'wait', 'signal', 'child', 'version'));

CREATE TABLE durable_runner_version (
    runner_id   UUID        NOT NULL,
    workflow    TEXT        NOT NULL CHECK (char_length(workflow) BETWEEN 1 AND 255),
    min_version INTEGER     NOT NULL CHECK (min_version >= 1),
    max_version INTEGER     NOT NULL CHECK (max_version >= min_version),
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (runner_id, workflow)
);

CREATE INDEX durable_runner_version_workflow ON durable_runner_version (workflow, seen_at);

CREATE FUNCTION durable_claim_versions(p_workflows TEXT[], p_min INTEGER[], p_max INTEGER[],
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
                       OR (p.status = 'waiting' AND p.wait->>'kind' = 'timer'))))
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
        UPDATE durable_instance i
           SET lease_token = CASE WHEN exh THEN NULL ELSE gen_random_uuid() END,
               lease_expires_at = CASE WHEN exh THEN NULL
                                       ELSE now() + make_interval(secs => p_lease_secs) END,
               status = CASE WHEN flip AND NOT exh THEN 'running' ELSE i.status END,
               wait = CASE WHEN flip AND NOT exh THEN NULL ELSE i.wait END,
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

-- Binaries that predate versioning call durable_claim: their code is version 1 of every
-- workflow, so they claim instances pinned to version 1 (or not pinned yet) only, and
-- never run an instance that a newer release started.
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
LANGUAGE sql
AS $$
    SELECT v.command_id, v.kind, v.attempt, v.exhausted, v.latency, v.instance_id, v.workflow,
           v.status, v.input, v.lease_token, v.cancel, v.recovery_attempts, v.db_now
      FROM durable_claim_versions(
               p_workflows,
               array_fill(1, ARRAY[coalesce(cardinality(p_workflows), 0)]),
               array_fill(1, ARRAY[coalesce(cardinality(p_workflows), 0)]),
               p_lease_secs, p_limit) AS v
$$;
