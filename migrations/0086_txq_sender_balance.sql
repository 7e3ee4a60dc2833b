-- A signer pool per chain (issue 35 §2): the last balance and chain nonce the queue saw
-- for each sender registered on a runner (read every few seconds by the queue loop), so
-- Platform Status shows every configured sender — one that has not sent yet included —
-- with its balance, without the api role asking a node.
CREATE TABLE txq_sender_balance (
    chain_id     BIGINT      NOT NULL CHECK (chain_id > 0),
    sender       BYTEA       NOT NULL CHECK (octet_length(sender) = 20),
    -- Wei at the node's `pending` block, the decimal string of a U256.
    balance_wei  TEXT        NOT NULL CHECK (balance_wei ~ '^[0-9]{1,78}$'),
    -- The account's nonce at the node's `pending` block (its next transaction's).
    chain_nonce  BIGINT      NOT NULL CHECK (chain_nonce >= 0),
    checked_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, sender)
);
