"""Schemathesis hooks for scripts/fuzz-api.

One `map_case` hook, which schemathesis runs on the cases of every phase (examples,
coverage, fuzzing; the per-container hooks such as `map_query` do not run in the coverage
phase). It changes only values whose refusal is right but cannot be stated in JSON Schema,
or that would end the fuzz run itself; after it, schemathesis re-validates the case against
the document, so a case it turned valid is checked as a valid one. Nothing else is changed
and no check is switched off.

Addresses: the document declares `0x` + 40 hex digits, and the server also requires a
mixed-case address to carry a valid EIP-55 checksum, which no JSON Schema keyword can
express. A random mixed-case string that matches the pattern is therefore schema-valid yet
rightly refused (422 INVALID_ADDRESS). Every string that matches the pattern is lowercased
(lowercase is always a valid address); other strings are left alone.

Cursors: `cursor` is an opaque token the server issued (base64url of a keyset position); a
random string of the declared length is schema-valid yet rightly refused (400
INVALID_CURSOR). `cursor` is dropped from every case, so the fuzzer exercises the first page
of every list; the cursor walk is covered by the list tests
(`crates/keel-api/tests/it/lists.rs`, `ledger.rs`, `keys.rs`, `webhooks.rs`).

Amounts and prices: the document declares what the server refuses whatever the asset
(zero, more than 78 digits before or after the point). Two rules depend on the asset or
template the request names: at most its decimals of fractional digits, and a value that
fits (2^256-1 base units; a price times 10^price decimals at most 2^127-1). The fuzzer
learns real asset ids and the template id from responses, so a valid-looking `amount` of a
decimals-0 asset would be rightly refused. Valid `amount` values of mint, transfer and burn
are made integers of at most 40 digits (their digits without the point: still non-zero; fits
every token of at most 36 decimals); valid `initialPrice` values keep at most
FUZZ_PRICE_DECIMALS (8, the fuzz template's) fractional and 29 integer digits.

The fuzz key: the fuzzer learns key ids from `GET /v1/api-keys` and would revoke or rotate
its own key (every later request then answers 401). scripts/fuzz-api creates a decoy key
next to it; a revoke or rotate of the fuzz key's id (FUZZ_KEY_ID) is sent to the decoy's id
(FUZZ_DECOY_KEY_ID) instead. Revoke and rotate stay fuzzed: on the decoy, on keys the fuzzer
creates, and with invalid and unknown ids.
"""

import os
import re
import uuid

import schemathesis

ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}\Z")
DECIMAL = re.compile(r"^([0-9]{1,78})(?:\.([0-9]{1,78}))?\Z")
FUZZ_KEY_ID = os.environ.get("FUZZ_KEY_ID")
DECOY_KEY_ID = os.environ.get("FUZZ_DECOY_KEY_ID")
PRICE_DECIMALS = int(os.environ.get("FUZZ_PRICE_DECIMALS", "8"))
KEY_ROUTES = ("/v1/api-keys/{id}/revoke", "/v1/api-keys/{id}/rotate")
AMOUNT_ROUTES = ("/v1/assets/{id}/mint", "/v1/assets/{id}/transfer", "/v1/assets/{id}/burn")


def _lower_addresses(value):
    if isinstance(value, str) and ADDRESS.match(value):
        return value.lower()
    if isinstance(value, dict):
        return {k: _lower_addresses(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_lower_addresses(v) for v in value]
    return value


def _integral_amount(value):
    """A valid amount as a non-zero integer of at most 40 digits; anything else unchanged."""
    m = DECIMAL.match(value) if isinstance(value, str) else None
    if m is None:
        return value
    digits = (m.group(1) + (m.group(2) or "")).lstrip("0")
    return digits[:40] if digits else value


def _fuzz_template_price(value):
    """A valid price with at most PRICE_DECIMALS fractional and 29 integer digits."""
    m = DECIMAL.match(value) if isinstance(value, str) else None
    if m is None:
        return value
    whole = m.group(1).lstrip("0")[:29] or "0"
    frac = (m.group(2) or "")[:PRICE_DECIMALS].rstrip("0")
    if whole == "0" and not frac:
        return "1"
    return whole + ("." + frac if frac else "")


def _same_uuid(a, b):
    try:
        return uuid.UUID(str(a)) == uuid.UUID(str(b))
    except ValueError:
        return False


@schemathesis.hook
def map_case(context, case):
    path = case.operation.path
    if isinstance(case.path_parameters, dict) and case.path_parameters:
        params = _lower_addresses(case.path_parameters)
        if (
            path in KEY_ROUTES
            and FUZZ_KEY_ID
            and DECOY_KEY_ID
            and _same_uuid(params.get("id"), FUZZ_KEY_ID)
        ):
            params = {**params, "id": DECOY_KEY_ID}
        if params != case.path_parameters:
            case.path_parameters = params
    if isinstance(case.query, dict) and "cursor" in case.query:
        case.query = {k: v for k, v in case.query.items() if k != "cursor"}
    body = case.body
    if isinstance(body, (dict, list)):
        new = _lower_addresses(body)
        if isinstance(new, dict):
            if path in AMOUNT_ROUTES and "amount" in new:
                new = {**new, "amount": _integral_amount(new["amount"])}
            if path == "/v1/assets" and "initialPrice" in new:
                new = {**new, "initialPrice": _fuzz_template_price(new["initialPrice"])}
        if new != body:
            case.body = new
    return case
