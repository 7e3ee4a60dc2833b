-- API keys issued to a named person (issue 23, "Actor attribution"): a key with
-- issued_to records the commands it asks for as actor_kind USER with that id (the
-- person's id in the issuer's directory, e.g. an employee number or e-mail); a key
-- without it records them as SERVICE with the key's id. Set once, at creation
-- (`POST /v1/api-keys` with `issuedTo`); 1 to 255 characters with no control, separator
-- or format characters (checked by the service before the insert).
ALTER TABLE api_key
    ADD COLUMN issued_to TEXT
        CONSTRAINT api_key_issued_to_bounds CHECK (
            issued_to IS NULL OR char_length(issued_to) BETWEEN 1 AND 255
        );
