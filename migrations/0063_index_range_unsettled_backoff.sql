-- keel-index (issue 32 §8): a history range refused as unsettled (its answer held a
-- block the index does not hold as canonical yet, e.g. above the indexed tip) is not
-- claimed again at once: it backs off per range.
--
-- unsettled_count  refusals of the range so far (the backoff doubles with each)
-- retry_after      the range is not claimed before this time (NULL: claimable now)
ALTER TABLE index_range
    ADD COLUMN unsettled_count INT         NOT NULL DEFAULT 0 CHECK (unsettled_count >= 0),
    ADD COLUMN retry_after     TIMESTAMPTZ NULL;
