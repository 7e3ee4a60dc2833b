-- Pausing a distribution (issue 36 §3): `paused_at` is set by the pause call and
-- cleared by the resume call (which also signals the workflow); the workflow reads it
-- before every batch. `pause_count` numbers the pauses, so each resume's signal has its
-- own dedupe key. Written only through keel-workflows' store (store/distribution.rs).
ALTER TABLE distribution
    ADD COLUMN paused_at   TIMESTAMPTZ,
    ADD COLUMN pause_count INTEGER NOT NULL DEFAULT 0;

-- The status page's unfinished distributions, newest first.
CREATE INDEX distribution_unfinished ON distribution (created_at DESC, id DESC)
    WHERE completed_at IS NULL;
