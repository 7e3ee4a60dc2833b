-- Issue 37 §3: RegulatedToken freeze events, one row per event (decoded under the
-- asset_token scope kind; a plain AssetToken never emits them). A holder's frozen state
-- (frozen amount, frozen flag) is computed on read by folding its token's rows in chain
-- order, so the order in which blocks or ranges are written never matters and a reorg
-- rollback (rows deleted above the common ancestor) needs nothing else.
--   kind 'address':  AddressFrozenSet(account, frozen, agent)       -> frozen
--   kind 'freeze':   TokensFrozen(account, amount)                  -> amount
--   kind 'unfreeze': TokensUnfrozen(account, amount)                -> amount
--   kind 'recovery': RecoverySuccess(lost, replacement, agent)      -> account = lost, replacement
CREATE TABLE IF NOT EXISTS index_freeze_event (
    chain_id     BIGINT  NOT NULL,
    block_number BIGINT  NOT NULL,
    block_hash   BYTEA   NOT NULL,
    log_index    BIGINT  NOT NULL,
    tx_hash      BYTEA   NOT NULL,
    token        BYTEA   NOT NULL,
    kind         TEXT    NOT NULL CHECK (kind IN ('address', 'freeze', 'unfreeze', 'recovery')),
    account      BYTEA   NOT NULL,
    -- Recovery only: the wallet the lost one's balance and frozen state moved to.
    replacement  BYTEA   NULL,
    -- Freeze/unfreeze only: token base units.
    amount       NUMERIC NULL,
    -- Address only: frozen (true) or unfrozen (false).
    frozen       BOOLEAN NULL,
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX IF NOT EXISTS index_freeze_event_token
    ON index_freeze_event (chain_id, token, block_number, log_index);
CREATE INDEX IF NOT EXISTS index_freeze_event_block
    ON index_freeze_event (chain_id, block_number);
