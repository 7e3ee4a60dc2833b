-- Cluster primitives (keel-cluster): the recorded shard count and the replica registry.
-- Shard ownership itself is not a table: it is a session advisory lock
-- `pg_try_advisory_lock(group_key, shard)` held on each replica's reserved connection.

-- The shard count every process must be configured with (`durable.sharding.shards`).
-- Exactly one row, written by the first process that starts; a process configured with
-- another count refuses to start (it is the modulus of every key -> shard mapping).
CREATE TABLE cluster_config (
    singleton    BOOLEAN     PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    shards       INTEGER     NOT NULL CHECK (shards BETWEEN 1 AND 65536),
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per replica process (per incarnation: a restarted process registers a new id).
-- A replica is live while `heartbeat_at` is within the liveness window (database clock);
-- shards are spread by rendezvous hashing over the live replicas of one shard group.
-- Rows are deleted on graceful shutdown; a crashed replica's row simply goes stale.
CREATE TABLE cluster_replica (
    id            UUID        PRIMARY KEY,
    shard_group   TEXT        NOT NULL CHECK (shard_group ~ '^[a-z][a-z0-9_-]{0,31}$'),
    role          TEXT        NOT NULL CHECK (role IN ('runner', 'indexer')),
    host          TEXT        NOT NULL CHECK (length(host) BETWEEN 1 AND 255),
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The live-set query: `WHERE shard_group = $1 AND heartbeat_at > now() - $window`.
CREATE INDEX cluster_replica_group_heartbeat ON cluster_replica (shard_group, heartbeat_at);

-- Cron cycles: one row per (job name, scheduled time), inserted by the owner *before* the
-- job starts, so an ownership handoff never starts a recorded cycle again (the next owner
-- skips it). `finished_at`/`outcome` are set when the job returns; a row left unfinished
-- is a cycle whose owner was lost mid-run (or a job that stopped reporting).
CREATE TABLE cron_cycle (
    name          TEXT        NOT NULL CHECK (name ~ '^[a-z][a-z0-9_./-]{0,127}$'),
    scheduled_at  TIMESTAMPTZ NOT NULL,
    replica_id    UUID        NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at   TIMESTAMPTZ,
    outcome       TEXT        CHECK (outcome IN ('succeeded', 'failed')),
    CHECK ((finished_at IS NULL) = (outcome IS NULL)),
    CHECK (finished_at IS NULL OR finished_at >= started_at),
    PRIMARY KEY (name, scheduled_at)
);
