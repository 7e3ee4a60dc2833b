-- Reading what exists (issue 18 §2): list routes with keyset pagination, timestamps on
-- every resource, and the issuer address of an asset.
--
-- * `asset.updated_at`, `asset_template.updated_at`: when Keel's record last changed
--   (the addresses recorded by `asset.create`; a template upsert). Existing rows start at
--   their `created_at`.
-- * `asset.issuer_address`: the account that sends every transaction of the asset and is
--   the admin of its token and feed (the runner's operator). `asset.create` records it
--   with the token address; `transfer` moves tokens from its balance. Assets created
--   before this migration take it from the sender of their creation's first transaction
--   (a one-time backfill, like 0022's; keel-workflows reads no queue table at run time).
-- * Indexes for `GET /v1/operations`: every list is ordered by `(created_at, id)` within
--   the organization, optionally of one kind or one asset, so each filter combination
--   is a range scan of one index (`LIMIT n + 1`); a `state` filter is applied to the
--   rows of that scan. `operation_asset_created` supersedes `operation_asset`.
--   `GET /v1/assets` uses `asset_organization` (0007); `GET /v1/templates` the primary
--   key of `asset_template` (ordered by id).

ALTER TABLE asset ADD COLUMN updated_at TIMESTAMPTZ;
UPDATE asset SET updated_at = created_at;
ALTER TABLE asset ALTER COLUMN updated_at SET DEFAULT now(), ALTER COLUMN updated_at SET NOT NULL;

ALTER TABLE asset ADD COLUMN issuer_address BYTEA
    CHECK (issuer_address IS NULL OR octet_length(issuer_address) = 20);

UPDATE asset a
   SET issuer_address = s.sender
  FROM (SELECT DISTINCT ON (o.asset_id) o.asset_id, r.sender
          FROM operation o
          JOIN operation_tx ot ON ot.operation_id = o.id
          JOIN txq_request r ON r.id = ot.txq_request_id
         WHERE o.kind = 'asset.create'
         ORDER BY o.asset_id, ot.created_at, ot.step) s
 WHERE a.id = s.asset_id AND a.issuer_address IS NULL;

ALTER TABLE asset_template ADD COLUMN updated_at TIMESTAMPTZ;
UPDATE asset_template SET updated_at = created_at;
ALTER TABLE asset_template ALTER COLUMN updated_at SET DEFAULT now(),
    ALTER COLUMN updated_at SET NOT NULL;

CREATE INDEX operation_organization_created ON operation (organization_id, created_at, id);
CREATE INDEX operation_organization_kind_created ON operation (organization_id, kind, created_at, id);
CREATE INDEX operation_asset_created ON operation (asset_id, created_at, id);
DROP INDEX operation_asset;
