-- API key lifecycle (issue 18 §5): scopes, rotation with an optional overlap, listing.
--
-- scopes                      what the key may do: `read` (GET routes), `operate`
--                             (operation-creating POSTs, retry, cancel), `approve`
--                             (approve / reject), `admin` (the `/v1/api-keys` routes).
--                             A key holds one or more; keys that existed before this
--                             migration hold all four, so nothing that worked breaks.
-- rotated_at                  the last rotation (a new secret; the key's id, label and
--                             scopes stay).
-- previous_secret_sha256      the secret a rotation replaced, while it keeps working for
-- previous_secret_expires_at  the overlap the rotation asked for (`expiresInSeconds`);
--                             both NULL for an immediate rotation. A later rotation
--                             replaces them (the older secret stops at once); a revoke
--                             stops both secrets at once (`revoked_at`).
--
-- Authentication reads these columns on every request (no cache): a revoke or an
-- immediate rotation answers 401 to the next request.

ALTER TABLE api_key
    ADD COLUMN scopes TEXT[] NOT NULL
        DEFAULT ARRAY['read', 'operate', 'approve', 'admin']::TEXT[]
        CONSTRAINT api_key_scopes_known CHECK (
            cardinality(scopes) BETWEEN 1 AND 4
            AND scopes <@ ARRAY['read', 'operate', 'approve', 'admin']::TEXT[]
        ),
    ADD COLUMN rotated_at TIMESTAMPTZ,
    ADD COLUMN previous_secret_sha256 BYTEA
        CHECK (previous_secret_sha256 IS NULL OR octet_length(previous_secret_sha256) = 32),
    ADD COLUMN previous_secret_expires_at TIMESTAMPTZ,
    ADD CONSTRAINT api_key_previous_secret_pair CHECK (
        (previous_secret_sha256 IS NULL) = (previous_secret_expires_at IS NULL)
    );

-- The authentication lookup by a previous secret (the current one has its UNIQUE index).
CREATE UNIQUE INDEX api_key_previous_secret ON api_key (previous_secret_sha256)
    WHERE previous_secret_sha256 IS NOT NULL;

-- `GET /v1/api-keys`: an organization's keys in (created_at, id) keyset order.
CREATE INDEX api_key_organization_created ON api_key (organization_id, created_at, id);
