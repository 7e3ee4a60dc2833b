-- keel-aa: user operations are watched until their bundle's block is final (issue 33 §2).
--
-- A bundle's queue verdict used to end its operations at once (`included`, reported to
-- the workflow); a reorg after the verdict went unnoticed. Now an included operation
-- stays watched while its bundle's queue request is (keel-txq's watch, migration 0065):
-- a re-included bundle updates its operations' transaction, block and receipt fields; a
-- bundle taken out for good puts its operations back to `ready` (or ends them); the
-- workflow is told only once the block is final.
--
-- aa_user_operation.finalized_at  database clock when the operation's inclusion was
--                                  found final and reported to its workflow; NULL while
--                                  an `included` operation is still watched
-- aa_bundle.final_at              database clock when an `included` bundle's block was
--                                  found final (its operations reported); NULL while
--                                  it is watched
-- aa_bundle.state                  adds `reorged` (included once, then taken out for
--                                  good or re-mined without its operations: they went
--                                  back to `ready`, ended, or were found elsewhere)
--
-- Additive: nullable columns, a widened CHECK, partial indexes; rows included before
-- this migration were reported already and are marked final.

ALTER TABLE aa_user_operation ADD COLUMN finalized_at TIMESTAMPTZ;

UPDATE aa_user_operation SET finalized_at = updated_at WHERE state = 'included';

ALTER TABLE aa_bundle ADD COLUMN final_at TIMESTAMPTZ;

UPDATE aa_bundle SET final_at = updated_at WHERE state = 'included';

ALTER TABLE aa_bundle DROP CONSTRAINT aa_bundle_state_check;
ALTER TABLE aa_bundle ADD CONSTRAINT aa_bundle_state_check
    CHECK (state IN ('submitted', 'included', 'reorged', 'failed'));

CREATE INDEX aa_bundle_watched ON aa_bundle (chain_id, created_at)
    WHERE state = 'included' AND final_at IS NULL;
CREATE INDEX aa_user_operation_unfinal ON aa_user_operation (chain_id, updated_at)
    WHERE state = 'included' AND finalized_at IS NULL;
