-- keel-durable: notify waiters when an instance reaches a terminal state (issue 17).
--
-- `Engine::await_terminal` (the API's `Prefer: wait`) used to be served by polling the
-- status every 100 ms. Now every transaction that makes an instance `completed`, `failed`
-- or `cancelled` sends `pg_notify('keel_durable_terminal', <instance id>)`, delivered at
-- its commit; each engine keeps one LISTEN connection for all its waiters.
--
-- A row trigger rather than a notify in the segment settle statements: it covers every
-- path that ends an instance (the batched and the single settle statements, an immediate
-- cancel) without changing those statements, and it costs the hot path little: the
-- trigger is `OF status` (statements that do not assign the status, such as journal
-- writes and lease renewals, never consider it), its WHEN clause is evaluated in the
-- executor without calling the function (no event is queued for a non-terminal update),
-- and a terminal update queues one notification, sent with the commit that already
-- happens. Like `durable_child_ended` (migration 0002), it fires on a change of status
-- only.

CREATE FUNCTION durable_instance_terminal_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('keel_durable_terminal', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER durable_instance_terminal_notify AFTER UPDATE OF status ON durable_instance
    FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION durable_instance_terminal_notify();
