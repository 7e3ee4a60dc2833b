-- Issue 18 §4: the operation kinds `asset.burn` (the issuer's holdings, or a forced burn
-- of a holder's), `asset.grant-role` and `asset.revoke-role` (crates/keel-workflows).
-- The kind CHECK of 0007 is replaced by one that admits them; existing rows satisfy both.
ALTER TABLE operation DROP CONSTRAINT operation_kind_check;
ALTER TABLE operation ADD CONSTRAINT operation_kind_check CHECK (kind IN (
    'asset.create', 'asset.mint', 'asset.transfer', 'asset.pause', 'asset.unpause',
    'asset.burn', 'asset.grant-role', 'asset.revoke-role'));
