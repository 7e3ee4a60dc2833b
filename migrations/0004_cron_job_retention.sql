-- Scheduled-job health (keel-cluster, `job_health`): each cron job's schedule and the
-- amount of work each cycle reported, so "ran and found nothing", "overdue" and
-- "stopped reporting" can be told apart by any process, not only the job's owner.
-- And the indexes the retention pass (keel-durable `Retention`) needs for its cascades.

-- One row per cron job, upserted by every replica that runs (or may run) the job. The
-- period is what "overdue" is measured against: no cycle started within 2 x period.
CREATE TABLE cron_job (
    name           TEXT        PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_./-]{0,127}$'),
    period_ms      BIGINT      NOT NULL CHECK (period_ms >= 1),
    offset_ms      BIGINT      NOT NULL DEFAULT 0 CHECK (offset_ms >= 0 AND offset_ms < period_ms),
    registered_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Work items a finished cycle reported (e.g. rows deleted); 0 is "ran and found
-- nothing", NULL when the job does not count or the cycle has not finished.
ALTER TABLE cron_cycle
    ADD COLUMN items BIGINT CHECK (items IS NULL OR items >= 0),
    ADD CONSTRAINT cron_cycle_items_finished CHECK (items IS NULL OR finished_at IS NOT NULL);

-- Job health reads the latest started cycle of a job.
CREATE INDEX cron_cycle_started ON cron_cycle (name, started_at);

-- Retention (keel-durable `Retention`) deletes ended instances in batches; each delete
-- cascades to the instance's commands, journal and signals and sets its children's
-- parent_id to NULL. Without these indexes every deleted instance would scan
-- durable_command (only open commands were indexed by instance) and durable_instance.
CREATE INDEX durable_command_instance ON durable_command (instance_id);
CREATE INDEX durable_instance_parent ON durable_instance (parent_id) WHERE parent_id IS NOT NULL;
