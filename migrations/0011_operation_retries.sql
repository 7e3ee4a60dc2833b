-- Manual retries of an operation (POST /v1/operations/{id}/retry). A workflow whose
-- transaction failed retryably (GAS_REQUIRED, FUNDING_DEADLINE_EXPIRED) sends a new
-- attempt of that transaction only when the operation was retried at least as many
-- times as it already failed there: the count only grows, so a replay takes the same
-- path up to the failure and the retried path after it.
ALTER TABLE operation ADD COLUMN retries INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0);
