-- keel-txq: txq_commit_signed (0013) as a few set-based statements for the whole group
-- instead of five statements per sender.
--
-- Same contract as 0013: for each sender of the group whose next_nonce is still the
-- nonce its signatures start at and all of whose requests are still 'queued', the
-- attempts are inserted, the requests marked 'signed' with their nonces and next_nonce
-- advanced past them; any other sender writes nothing. Returns the senders whose slice
-- committed, in the order given. Sender rows are locked in sender order (callers sort
-- by sender, as before), request rows after every sender row.
--
-- Why: a group holds up to 128 attempts spread over many senders (with 50 senders, ~10
-- per group). Measured in psql on 2,000 queued requests (10,000 settled beside them),
-- per request: 3 per sender 98 -> 45-49 us, 13 per sender 45 -> 39-41 us, one sender
-- 36 -> 45 us.
--
-- The request locks go through the primary key (`id = ANY`), and the state is checked
-- after locking (a materialized CTE keeps the planner from pushing it down): without
-- statistics the planner otherwise scans the whole `queued` partial index for every
-- group.
CREATE OR REPLACE FUNCTION txq_commit_signed(
    p_chain    BIGINT,
    p_senders  BYTEA[],
    p_firsts   BIGINT[],
    p_counts   INTEGER[],
    p_ids      UUID[],
    p_nonces   BIGINT[],
    p_hashes   BYTEA[],
    p_raws     BYTEA[],
    p_max_fees TEXT[],
    p_tips     TEXT[],
    p_gas      BIGINT[]
) RETURNS SETOF BYTEA
LANGUAGE plpgsql AS $$
DECLARE
    row_senders BYTEA[];
    ready       BYTEA[];
    done        BYTEA[];
    ready_ids   UUID[];
BEGIN
    -- Callers never repeat a sender within a group (its slices would be one slice).
    IF (SELECT count(DISTINCT s) FROM unnest(p_senders) AS s) <> cardinality(p_senders) THEN
        RAISE EXCEPTION 'txq_commit_signed: a sender appears twice in one group';
    END IF;
    -- The sender each attempt is listed under (slices back to back, in sender order).
    SELECT coalesce(array_agg(u.sender ORDER BY u.ord, g.n), '{}') INTO row_senders
      FROM unnest(p_senders, p_counts) WITH ORDINALITY AS u(sender, cnt, ord),
           generate_series(1, u.cnt) AS g(n);
    IF cardinality(row_senders) <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'txq_commit_signed: the counts do not add up to the attempts given';
    END IF;
    -- Lock the sender rows in sender order; keep those whose next nonce is still where
    -- their signatures start (a row moved meanwhile is re-checked after its lock).
    SELECT coalesce(array_agg(t.sender), '{}') INTO ready
      FROM (SELECT s.sender
              FROM txq_sender s
              JOIN unnest(p_senders, p_firsts) AS u(sender, first) ON u.sender = s.sender
             WHERE s.chain_id = p_chain AND s.next_nonce = u.first
             ORDER BY s.sender
               FOR UPDATE OF s) AS t;
    IF cardinality(ready) = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(v.id), '{}') INTO ready_ids
      FROM unnest(p_ids, row_senders) AS v(id, sender)
     WHERE v.sender = ANY (ready);
    -- Lock the requests of those senders (primary key; the state is checked after the
    -- lock, so a request settled meanwhile is seen as such) and keep the senders all of
    -- whose requests are still 'queued' under the sender they are listed for.
    WITH locked AS MATERIALIZED (
        SELECT r.id, r.chain_id, r.sender, r.state
          FROM txq_request r
         WHERE r.id = ANY (ready_ids)
           FOR UPDATE)
    SELECT coalesce(array_agg(u.sender), '{}') INTO done
      FROM unnest(p_senders, p_counts) AS u(sender, cnt)
      LEFT JOIN (SELECT v.sender, count(*) AS n
                   FROM locked AS q
                   JOIN unnest(p_ids, row_senders) AS v(id, sender)
                     ON v.id = q.id AND v.sender = q.sender
                  WHERE q.chain_id = p_chain AND q.state = 'queued'
                  GROUP BY v.sender) AS c ON c.sender = u.sender
     WHERE u.sender = ANY (ready) AND coalesce(c.n, 0) = u.cnt;
    IF cardinality(done) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO txq_attempt (request_id, attempt, nonce, tx_hash, raw,
                             max_fee_per_gas, max_priority_fee_per_gas, gas_limit)
    SELECT v.id, 1, v.nonce, v.hash, v.raw, v.max_fee, v.tip, v.gas
      FROM unnest(p_ids, row_senders, p_nonces, p_hashes, p_raws, p_max_fees, p_tips, p_gas)
           AS v(id, sender, nonce, hash, raw, max_fee, tip, gas)
     WHERE v.sender = ANY (done);
    UPDATE txq_request r
       SET state = 'signed', nonce = v.nonce, updated_at = now()
      FROM unnest(p_ids, row_senders, p_nonces) AS v(id, sender, nonce)
     WHERE r.id = v.id AND v.sender = ANY (done);
    UPDATE txq_sender s
       SET next_nonce = u.first + u.cnt, updated_at = now()
      FROM unnest(p_senders, p_firsts, p_counts) AS u(sender, first, cnt)
     WHERE s.chain_id = p_chain AND s.sender = u.sender AND u.sender = ANY (done);
    RETURN QUERY
        SELECT u.sender FROM unnest(p_senders) WITH ORDINALITY AS u(sender, ord)
         WHERE u.sender = ANY (done) ORDER BY u.ord;
END
$$;
