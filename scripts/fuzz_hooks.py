"""Schemathesis hooks for scripts/fuzz-api.

Addresses: the document declares `^0x[0-9a-fA-F]{40}$`, and the server also requires a
mixed-case address to carry a valid EIP-55 checksum, which no JSON Schema keyword can express.
A random mixed-case string that matches the pattern is therefore schema-valid yet rightly
refused (422 INVALID_ADDRESS), which schemathesis's positive_data_acceptance check would
report. Every generated string that matches the pattern is lowercased here (lowercase is
always a valid address); strings that do not match it are left alone, so negative cases stay
negative.

Cursors: `cursor` is an opaque token the server issued (base64url of a keyset position);
a random string of the declared length is schema-valid yet rightly refused (400
INVALID_CURSOR), which no JSON Schema keyword can express. Generated query parameters drop
`cursor`, so the fuzzer exercises the first page of every list; the cursor walk is covered
by the list tests (`crates/keel-api/tests/it/lists.rs`, `ledger.rs`, `keys.rs`).
"""

import re

import schemathesis

ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")


def _lower_addresses(value):
    if isinstance(value, str) and ADDRESS.match(value):
        return value.lower()
    if isinstance(value, dict):
        return {k: _lower_addresses(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_lower_addresses(v) for v in value]
    return value


@schemathesis.hook
def map_body(context, body):
    return _lower_addresses(body)


@schemathesis.hook
def map_path_parameters(context, path_parameters):
    return _lower_addresses(path_parameters)


@schemathesis.hook
def map_query(context, query):
    if isinstance(query, dict) and "cursor" in query:
        query = {k: v for k, v in query.items() if k != "cursor"}
    return query
