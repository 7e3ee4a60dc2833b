-- keel-txq: commit the signed attempts of one signing group in one statement.
--
-- A sender round reads every sender's next nonce together with its queued requests,
-- signs them off the database (the signer may be slow or remote, and no row is locked
-- meanwhile), then calls txq_commit_signed once for the group. For each sender of the
-- group, in the order given (callers sort by sender, so concurrent callers lock rows in
-- the same order), under the sender's row lock:
--
--   * the sender's next_nonce must still be the nonce the signatures start at, and
--   * every request of the sender's slice must still be 'queued' (locked FOR UPDATE);
--
-- then its attempts are inserted, its requests marked 'signed' with their nonces and
-- next_nonce advanced past them. A sender that fails either check writes nothing (its
-- signatures are discarded unbroadcast and its requests stay queued for the next
-- round); the other senders of the group are unaffected. Returns the senders whose
-- slice committed. The statement is one transaction: a crash or a lost connection
-- commits either every committed slice or none.
--
-- Arrays: p_senders/p_firsts/p_counts per sender; the attempt arrays hold the slices of
-- all senders back to back, in sender order, each slice in nonce order (nonces
-- p_firsts[i] .. p_firsts[i] + p_counts[i] - 1). Fees are wei per gas (decimal text).
CREATE FUNCTION txq_commit_signed(
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
    i     INTEGER;
    lo    INTEGER := 1;
    hi    INTEGER;
    nxt   BIGINT;
    still INTEGER;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_senders, 1), 0) LOOP
        hi := lo + p_counts[i] - 1;
        SELECT next_nonce INTO nxt
          FROM txq_sender
         WHERE chain_id = p_chain AND sender = p_senders[i]
           FOR UPDATE;
        IF FOUND AND nxt = p_firsts[i] THEN
            SELECT count(*) INTO still
              FROM (SELECT 1 FROM txq_request
                     WHERE id = ANY (p_ids[lo:hi]) AND chain_id = p_chain
                       AND sender = p_senders[i] AND state = 'queued'
                       FOR UPDATE) AS q;
            IF still = p_counts[i] THEN
                INSERT INTO txq_attempt (request_id, attempt, nonce, tx_hash, raw,
                                         max_fee_per_gas, max_priority_fee_per_gas, gas_limit)
                SELECT v.id, 1, v.nonce, v.hash, v.raw, v.max_fee, v.tip, v.gas
                  FROM unnest(p_ids[lo:hi], p_nonces[lo:hi], p_hashes[lo:hi], p_raws[lo:hi],
                              p_max_fees[lo:hi], p_tips[lo:hi], p_gas[lo:hi])
                       AS v(id, nonce, hash, raw, max_fee, tip, gas);
                UPDATE txq_request r
                   SET state = 'signed', nonce = v.nonce, updated_at = now()
                  FROM unnest(p_ids[lo:hi], p_nonces[lo:hi]) AS v(id, nonce)
                 WHERE r.id = v.id;
                UPDATE txq_sender
                   SET next_nonce = nxt + p_counts[i], updated_at = now()
                 WHERE chain_id = p_chain AND sender = p_senders[i];
                RETURN NEXT p_senders[i];
            END IF;
        END IF;
        lo := hi + 1;
    END LOOP;
END
$$;
