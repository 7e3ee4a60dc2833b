-- keel-durable: the open-instance census (Engine::open_census, the
-- keel_durable_open_instances gauge and the operator's "workflows by state" view)
-- counts instances not yet ended by workflow and status. This partial index keeps
-- that count an index-only scan over open instances, however many ended ones
-- retention has not yet removed.
CREATE INDEX durable_instance_open ON durable_instance (workflow, status) WHERE ended_at IS NULL;
