-- A template chooses its assets' sender (issue 19, "Templates choose the sender"): a
-- custody vault of the template's chain (`chains.<name>.custody.vaults.<vault>` in the
-- binary's configuration), named and with its address as configured when the template
-- was set (`keel template set --sender <vault>`). The asset workflows send from that
-- address (the asset's issuer) through the vault's provider; both NULL: the local
-- operator key, as before.
ALTER TABLE asset_template
    ADD COLUMN sender_vault TEXT
        CONSTRAINT asset_template_sender_vault_name
            CHECK (sender_vault IS NULL OR sender_vault ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    ADD COLUMN sender_address BYTEA
        CONSTRAINT asset_template_sender_address_len
            CHECK (sender_address IS NULL OR octet_length(sender_address) = 20),
    ADD CONSTRAINT asset_template_sender_both
        CHECK ((sender_vault IS NULL) = (sender_address IS NULL));
