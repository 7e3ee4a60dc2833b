-- Settlement verdicts are pushed, not polled (issue 17). keel-workflows' VerdictSink
-- records each verdict as its workflow's signal `tx.<link>` inside the transaction
-- that settles the queue request, and the enqueue step writes the request and its
-- operation_tx link in one transaction; the polling relay and its `delivered_at`
-- stamp go.
--
-- Catch-up for a database upgraded with verdicts the relay had not delivered yet:
-- each gets its signal here, as Engine::signal records one (a signal row deduplicated
-- by the queue request id, the instance's open-signal count, a SIGNAL command with
-- the engine's default 5 attempts; cf. durable_child_ended in 0002). Instances that
-- ended take no signal, as before.
WITH pending AS (
    SELECT ot.instance_id, ot.signal_name, r.verdict, ot.txq_request_id::text AS dedupe_key
      FROM operation_tx ot
      JOIN txq_request r ON r.id = ot.txq_request_id
      JOIN durable_instance i ON i.id = ot.instance_id
     WHERE ot.delivered_at IS NULL
       AND r.state = 'settled'
       AND r.verdict IS NOT NULL
       AND i.status NOT IN ('completed', 'cancelled')
), inserted AS (
    INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, recorded_at)
    SELECT instance_id, signal_name, verdict, dedupe_key, clock_timestamp() FROM pending
    ON CONFLICT (instance_id, dedupe_key) DO NOTHING
    RETURNING instance_id
), counted AS (
    UPDATE durable_instance d
       SET open_signals = d.open_signals + n.k, updated_at = now()
      FROM (SELECT instance_id, count(*)::int AS k FROM inserted GROUP BY instance_id) n
     WHERE d.id = n.instance_id
 RETURNING d.id
)
INSERT INTO durable_command (instance_id, kind, max_attempts)
SELECT id, 'signal', 5 FROM counted;

DROP INDEX operation_tx_undelivered;
ALTER TABLE operation_tx DROP COLUMN delivered_at;

-- The sink finds a settled request's link by request id.
CREATE INDEX operation_tx_request ON operation_tx (txq_request_id);
