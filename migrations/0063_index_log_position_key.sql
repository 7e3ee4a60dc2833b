-- Ledger Index (keel-index), issue 25: cheaper writes of raw logs and transfers.
--
-- The idempotency key of `index_log` and `index_transfer` was UNIQUE (chain_id,
-- block_hash, log_index), next to an index on (chain_id, block_number). A key led by the
-- block hash puts every new row at a random place of that B-tree: at a million rows it
-- no longer fits the buffer cache, and each insert reads and dirties its own leaf page
-- (and logs a full-page image of it after every checkpoint).
--
-- Both are replaced by one UNIQUE index on (chain_id, block_number, log_index,
-- block_hash): rows of a block land together at the end of the B-tree (history ranges
-- and tip blocks are written in block order), the block index is its prefix (rollback
-- `DELETE … WHERE chain_id = $1 AND block_number > $2`, reads in chain order), and one
-- B-tree entry per row is saved. Uniqueness is the same: a block hash names one block
-- number, so (chain, hash, log index) and (chain, number, log index, hash) identify the
-- same rows. Writers name the new key in `ON CONFLICT (chain_id, block_number,
-- log_index, block_hash) DO NOTHING`.
--
-- On a large existing index this migration builds the new indexes (locking writes of
-- the two tables while it runs). Indexer replicas of earlier releases name the old key
-- in their `ON CONFLICT` and fail against this schema: stop them before migrating.
CREATE UNIQUE INDEX index_log_position
    ON index_log (chain_id, block_number, log_index, block_hash);
ALTER TABLE index_log DROP CONSTRAINT index_log_chain_id_block_hash_log_index_key;
DROP INDEX index_log_block;

CREATE UNIQUE INDEX index_transfer_position
    ON index_transfer (chain_id, block_number, log_index, block_hash);
ALTER TABLE index_transfer DROP CONSTRAINT index_transfer_chain_id_block_hash_log_index_key;
DROP INDEX index_transfer_block;

-- `index_log_address` (chain_id, address, block_number) had one reader: the
-- directory-entry restamp, which reads only `EntryChanged`/`EntryRemoved` logs
-- (topic 0 below: keccak256 of `EntryChanged(bytes32,address,address)` and
-- `EntryRemoved(bytes32,address)`). A partial index over those logs replaces it, so the
-- other logs (transfers: nearly all rows) write one B-tree entry fewer. The restamp
-- query names the same two topics as constants, which lets the planner use it.
CREATE INDEX index_log_directory ON index_log (chain_id, address, block_number)
    WHERE topics[1] IN ('\xc7f8d9196dd6481775e957c53a7e9211ac545058e9470a1f8049025c4a88ac0c'::bytea,
                        '\x66b649bb39237366330e060ff5a6055c1499853e2949219ae0f53ed5585b8108'::bytea);
DROP INDEX index_log_address;
