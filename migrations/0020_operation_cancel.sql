-- Cancelling an operation (POST /v1/operations/{id}/cancel, `keel ops cancel`).
--
-- `cancel_requested_at` is set once, under the operation's row lock. Every workflow step
-- that enqueues a transaction takes the same lock and refuses to enqueue once it is set,
-- so after a cancel no new write of the operation can reach the queue; writes already
-- queued but unsigned are withdrawn, writes already signed run to their verdict (a cancel
-- cannot unsend them) and the operation's view says what landed.
ALTER TABLE operation ADD COLUMN cancel_requested_at TIMESTAMPTZ;
