-- keel-aa admission (issue 33 §3, crates/keel-aa/src/admission.rs, docs/aa.md "Acceptance"):
--
-- - state `replaced`: an operation superseded by another of the same sender and nonce
--   whose fees are at least the replacement increase higher on both (ERC-7562), before
--   it was bundled; its workflow is told once (error_reason REPLACED).
-- - the open operations of a sender (accepted, ready, bundled) are read at acceptance
--   (one operation per unstaked sender) and by the bundler (a sender whose earlier
--   operation is in an unsettled bundle is not bundled again).

ALTER TABLE aa_user_operation DROP CONSTRAINT aa_user_operation_state_check;
ALTER TABLE aa_user_operation ADD CONSTRAINT aa_user_operation_state_check
    CHECK (state IN ('accepted', 'ready', 'bundled', 'included', 'failed',
                     'nonce_used_elsewhere', 'replaced'));

CREATE INDEX aa_user_operation_sender_open ON aa_user_operation (chain_id, sender)
    WHERE state IN ('accepted', 'ready', 'bundled');
