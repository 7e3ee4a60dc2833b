-- keel-txq: why Keel cancelled a custody submission at its provider (issue 32, class 5:
-- "a custody approval that never comes waits forever, and a cancel does not stop it").
--
-- txq_custody_attempt.cancel_reason
--   'approval_expired'  the submission waited for an approval at the provider
--                       (PENDING_AUTHORIZATION) past the vault's approvalDeadlineSecs:
--                       Keel cancelled it there; once the provider confirms CANCELLED the
--                       request fails CUSTODY_APPROVAL_EXPIRED.
--   'withdrawn'         the request was withdrawn (its operation was cancelled) while
--                       the submission was at the provider and not signed: Keel cancels
--                       it there; once the provider confirms CANCELLED the request
--                       settles WITHDRAWN (reason CANCELLED_AT_PROVIDER).
--   NULL                no cancel by Keel for these reasons (a silent-drop or budget
--                       cancel keeps its own rules).
-- Set once (never overwritten by another reason).

ALTER TABLE txq_custody_attempt
    ADD COLUMN IF NOT EXISTS cancel_reason TEXT
        CHECK (cancel_reason IS NULL OR cancel_reason IN ('approval_expired', 'withdrawn'));
