-- keel-durable: notify waiters when a watched instance reaches a terminal state (issue 17).
--
-- `Engine::await_terminal` (what the API's `Prefer: wait` uses) used to be served by
-- polling the status every 100 ms. Now a waiter marks the instance `terminal_watched`
-- and listens; every transaction that makes a watched instance `completed`, `failed` or
-- `cancelled` sends `pg_notify('keel_durable_terminal', <instance id>)`, delivered at its
-- commit. Each engine keeps one LISTEN connection for all its waiters.
--
-- Why a row trigger, and why only for watched instances:
--
-- * A trigger covers every path that makes an instance terminal (the batched and the
--   single segment settle statements, an immediate cancel) without changing those
--   statements. It is `OF status`, so statements that do not assign the status (journal
--   writes, lease renewals, the waiter's own mark) never consider it, and its WHEN clause
--   is evaluated without calling the function: no event is queued for a row it rejects.
-- * PostgreSQL serializes the commits of transactions that notify (PreCommit_Notify takes
--   a database-wide lock held through the commit's WAL flush, and assigns an xid). A
--   notification at every instance end would put every ending segment settle in that line,
--   next to the starts (which notify through `durable_command_notify`). So only instances
--   someone waits for notify; a workload without waiters (the engine benchmark) sends
--   nothing more than before.
-- * The mark is taken under the instance's row lock (an UPDATE), so it serializes with the
--   settle that ends the instance: either the settle's row already carries the mark (it
--   notifies), or the waiter's update runs after the settle committed and the waiter's next
--   status read sees the terminal state. No lost wake-up. The mark is never cleared (a
--   retried instance that ends again notifies again).

ALTER TABLE durable_instance ADD COLUMN terminal_watched BOOLEAN NOT NULL DEFAULT false;

CREATE FUNCTION durable_instance_terminal_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('keel_durable_terminal', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER durable_instance_terminal_notify AFTER UPDATE OF status ON durable_instance
    FOR EACH ROW
    WHEN (NEW.terminal_watched
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION durable_instance_terminal_notify();
