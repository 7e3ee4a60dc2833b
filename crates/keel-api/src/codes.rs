//! Every machine-readable `code` of a problem answer, with its HTTP status and meaning:
//! the one source of the `code` enum and the `x-error-codes` table of the OpenAPI
//! document's `Problem` schema, and of `docs/error-codes.md` ([`error_codes_markdown`]).
//!
//! A code may appear with more than one status (`INVALID_FIELD`: `400` when the body's
//! JSON shape is wrong, `422` when a value breaks a rule). The tests check that every
//! code the server can emit is listed here with the status it is emitted with.

/// One `(code, status)` pair a problem answer can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    /// The problem's `code` member (also the tail of its `type`, `urn:keel:problem:<code>`).
    pub code: &'static str,
    /// The HTTP status it is answered with.
    pub status: u16,
    /// What it means and what the client can do, in one or two sentences.
    pub meaning: &'static str,
}

const fn c(code: &'static str, status: u16, meaning: &'static str) -> ErrorCode {
    ErrorCode {
        code,
        status,
        meaning,
    }
}

/// Every code the Platform API answers, ordered by status, then code.
pub const ERROR_CODES: &[ErrorCode] = &[
    c(
        "IDEMPOTENCY_KEY_REQUIRED",
        400,
        "An operation-creating `POST` lacks the `Idempotency-Key` header.",
    ),
    c(
        "INVALID_CURSOR",
        400,
        "The `cursor` query parameter is not one this list returned as `nextCursor` \
         (cursors are opaque; pass them back unchanged, with the same filters).",
    ),
    c(
        "INVALID_FIELD",
        400,
        "The body's JSON shape is wrong: not an object, a member missing or of the wrong \
         JSON type (JSON numbers where decimal strings are expected), a duplicate member, \
         or a malformed `Idempotency-Key`. `detail` names the field.",
    ),
    c(
        "INVALID_QUERY",
        400,
        "A query parameter is malformed: an integer outside its range (non-negative, at \
         most 2^63-1), a `limit` outside 1 to 200, an unknown `state` or `kind`, a \
         malformed `assetId` or RFC 3339 time, or a parameter given twice.",
    ),
    c(
        "JSON_TOO_DEEP",
        400,
        "The body is nested deeper than 64 levels.",
    ),
    c("MALFORMED_BODY", 400, "The request body could not be read."),
    c("MALFORMED_JSON", 400, "The body is not valid JSON."),
    c(
        "UNKNOWN_FIELD",
        400,
        "The body has a member the schema does not define.",
    ),
    c(
        "UNKNOWN_QUERY_PARAMETER",
        400,
        "The query string names a parameter the route does not declare in this document \
         (every route refuses them rather than ignore them); `detail` names the parameter, \
         never its value, and lists the accepted ones.",
    ),
    c(
        "CUSTODY_WEBHOOK_UNVERIFIED",
        401,
        "A custody-provider webhook (`POST /v1/custody/webhooks/fireblocks`) without a valid \
         signature: missing, malformed or wrong `Fireblocks-Webhook-Signature`, an unknown \
         key, or a body that is not a webhook v2 event. Nothing was recorded.",
    ),
    c(
        "UNAUTHENTICATED",
        401,
        "The API key is missing, malformed, unknown or revoked.",
    ),
    c(
        "INSUFFICIENT_SCOPE",
        403,
        "The API key lacks the scope the route requires (`read` for other GET routes, `operate` \
         for operation-creating POSTs, retry and cancel, `approve` for approve and reject, \
         `admin` for `/v1/api-keys` and `/v1/webhook-endpoints`), or a new key would hold a scope the calling key lacks.",
    ),
    c(
        "NOT_FOUND",
        404,
        "No such resource for the caller's organization (other organizations' resources \
         and malformed path ids answer the same), or no such route.",
    ),
    c(
        "METHOD_NOT_ALLOWED",
        405,
        "The route does not support the method.",
    ),
    c(
        "API_KEY_REVOKED",
        409,
        "The API key is revoked; it cannot be rotated (create a new key).",
    ),
    c(
        "APPROVAL_EXPIRED",
        409,
        "The operation's approval deadline has passed; a decision has no effect.",
    ),
    c(
        "APPROVAL_NOT_PENDING",
        409,
        "The operation does not wait for an approval (none needed, already decided, or ended).",
    ),
    c(
        "APPROVAL_SAME_KEY",
        409,
        "An operation must be approved or rejected by a different API key than the one \
         that requested it.",
    ),
    c(
        "ASSET_NOT_READY",
        409,
        "The asset has not finished its creation.",
    ),
    c(
        "ASSET_NOT_REGULATED",
        409,
        "The asset was not created through an organization system, so it has no compliance \
         rules (deploy the organization's system first: `POST /v1/organizations/{id}/system`; \
         assets created afterwards are regulated).",
    ),
    c(
        "BLOCK_NOT_INDEXED",
        409,
        "`atBlock` is above the Ledger Index's indexed tip of the asset's chain (or nothing \
         is indexed yet): the index cannot answer for that block exactly; retry once it has \
         reached the block.",
    ),
    c(
        "IDEMPOTENCY_CONFLICT",
        409,
        "The `Idempotency-Key` was used before with a different request.",
    ),
    c(
        "INDEX_BEHIND",
        409,
        "The Ledger Index has not reached the requested `minBlock` within `waitSeconds`: \
         the request names a block the index cannot answer for yet (as `BLOCK_NOT_INDEXED`). \
         Retryable: the answer carries `Retry-After`.",
    ),
    c(
        "OPERATION_ENDED",
        409,
        "The operation has ended (`completed`, `failed` or `cancelled`); there is nothing \
         to cancel.",
    ),
    c(
        "OPERATION_NOT_RETRYABLE",
        409,
        "Only a `failed` or `suspended` operation can be retried, and not one whose failure \
         a retry cannot change: submit a new operation with a new `Idempotency-Key`.",
    ),
    c(
        "SNAPSHOT_NOT_FINAL",
        409,
        "The snapshot is still pending: its block is not final on its chain yet (or the \
         Ledger Index has not caught up to it), so it has no export; retry once its `state` \
         is `final`.",
    ),
    c(
        "SYSTEM_DISABLED",
        409,
        "The organization's system on the template's chain is switched off by an operator \
         (`POST /v1/organizations/{id}/systems/{systemId}/disable`): it creates no assets \
         until it is switched on again.",
    ),
    c(
        "SYSTEM_NOT_DEPLOYED",
        409,
        "The organization system's contracts were never deployed (its deployment failed \
         before its transaction landed): there is nothing to switch on or off.",
    ),
    c(
        "PAYLOAD_TOO_LARGE",
        413,
        "The request body exceeds the configured limit (256 KiB by default).",
    ),
    c(
        "PAYLOAD_TOO_LARGE_OR_DEEP",
        413,
        "The operation's input exceeds the workflow engine's size or depth bound.",
    ),
    c(
        "UNSUPPORTED_MEDIA_TYPE",
        415,
        "The request body is not `application/json`.",
    ),
    c(
        "AMOUNT_EXCEEDS_DECIMAL_RANGE",
        422,
        "A price or amount does not fit a 96-bit decimal.",
    ),
    c(
        "AMOUNT_MALFORMED",
        422,
        "An amount or price is not a plain decimal string.",
    ),
    c("AMOUNT_NEGATIVE", 422, "An amount or price is negative."),
    c(
        "AMOUNT_OVERFLOW",
        422,
        "An amount does not fit the token's 256-bit integer.",
    ),
    c(
        "AMOUNT_PRECISION_LOSS",
        422,
        "An amount has more fractional digits than the token's decimals (or a price more \
         than the template's price decimals), trailing zeros included: `1.0000000` of a \
         6-decimals token is refused, never trimmed or rounded.",
    ),
    c(
        "AMOUNT_TOO_MANY_DIGITS",
        422,
        "An amount has more integer or fractional digits than any 256-bit value can need.",
    ),
    c(
        "AMOUNT_UNDERFLOW",
        422,
        "An amount computation would go below zero.",
    ),
    c(
        "BATCH_TOO_LARGE",
        422,
        "A batch mint or batch transfer names more recipients than the asset's template \
         allows (`batchMaxRecipients`, default 100); split it into several operations.",
    ),
    c(
        "CHAIN_MISMATCH",
        422,
        "Values of different chains were combined.",
    ),
    c(
        "CHAIN_NOT_CONFIGURED",
        422,
        "The template's chain is not configured on this deployment.",
    ),
    c(
        "COMPLIANCE_COUNTRY_NOT_ALLOWED",
        422,
        "The recipient's country is not allowed by the asset's country list. Also an \
         operation's `error.code`.",
    ),
    c(
        "COMPLIANCE_EXPIRED",
        422,
        "The recipient's eligibility attestation has expired. Also an operation's `error.code`.",
    ),
    c(
        "COMPLIANCE_LOCKED_UP",
        422,
        "Holder-to-holder transfers of the asset are locked up until a date (mints are \
         not). Also an operation's `error.code`.",
    ),
    c(
        "COMPLIANCE_MAX_BALANCE",
        422,
        "The recipient would hold more than the asset's per-holder maximum. Also an \
         operation's `error.code`.",
    ),
    c(
        "COMPLIANCE_MAX_HOLDERS",
        422,
        "The asset has its maximum number of holders and the recipient holds none. Also an \
         operation's `error.code`.",
    ),
    c(
        "COMPLIANCE_NOT_ELIGIBLE",
        422,
        "The asset's rules accept only eligible recipients and the recipient is not \
         registered in the organization system's registry, or is attested ineligible. Also \
         the `error.code` of an operation the token refused on chain for this reason.",
    ),
    c("DECIMALS_OUT_OF_RANGE", 422, "Token decimals above 36."),
    c(
        "ENTRY_POINT_NOT_RESOLVED",
        422,
        "A user operation names an EntryPoint that is not the chain's resolved one (the \
         configured EntryPointReference, or another address). Rebuild and re-sign it \
         against the resolved EntryPoint (`eth_supportedEntryPoints`).",
    ),
    c(
        "INVALID_ADDRESS",
        422,
        "An address is not `0x` and 40 hex digits, or its mixed case is not a valid EIP-55 \
         checksum; the zero address as a recipient is `422 INVALID_FIELD`.",
    ),
    c(
        "INVALID_FIELD",
        422,
        "A field's value breaks a rule (length, characters, range). `detail` names the field \
         and the rule.",
    ),
    c(
        "TOKEN_MISMATCH",
        422,
        "Amounts of different tokens were combined.",
    ),
    c(
        "UNKNOWN_ROLE",
        422,
        "A role name the asset's token does not have among the roles Keel manages: \
         `minter`, `pauser` or `burner`.",
    ),
    c(
        "USER_OPERATION_REJECTED",
        422,
        "The EntryPoint refused the user operation in its simulation; `detail` holds the \
         ERC-7769 code and the `AAxx` reason (e.g. AA24 signature, AA31 paymaster deposit).",
    ),
    c(
        "RATE_LIMITED",
        429,
        "A request rate limit is exhausted: the API key's own, or its organization's \
         (shared by all its keys); `detail` says which. Retryable: wait the answer's \
         `Retry-After` seconds (its `RateLimit` and `RateLimit-Policy` fields give the \
         limit's state and policy). Limits are per api replica; public routes are never \
         limited.",
    ),
    c(
        "INTERNAL",
        500,
        "A bug: a request handler panicked. Never caused by input by design.",
    ),
    c(
        "CUSTODY_KEYS_UNAVAILABLE",
        503,
        "The custody provider's webhook keys (JWKS) could not be fetched to verify a \
         delivery; the provider redelivers later.",
    ),
    c(
        "INDEX_DEGRADED",
        503,
        "The Ledger Index did not reach the requested `minBlock` and the asset's chain is \
         marked degraded (a reorg below a block the index recorded as final): it will not \
         get there until an operator re-indexes the chain (`keel index reindex --chain NAME` \
         or `POST /v1/chains/{chain}/index/reindex`). Retryable after the re-index; the answer \
         carries `Retry-After`.",
    ),
    c(
        "INDEX_UNAVAILABLE",
        503,
        "The Ledger Index could not be read; retry.",
    ),
    c(
        "NOT_READY",
        503,
        "The server is not ready (shutting down, or a database migration is missing).",
    ),
    c(
        "SERVICE_UNAVAILABLE",
        503,
        "A dependency (database, workflow engine) is temporarily unavailable; retry.",
    ),
];

/// Whether `(code, status)` is listed in [`ERROR_CODES`].
pub fn is_listed(code: &str, status: u16) -> bool {
    ERROR_CODES
        .iter()
        .any(|e| e.code == code && e.status == status)
}

/// The distinct codes of [`ERROR_CODES`], sorted: the `enum` of the `Problem` schema's
/// `code`.
pub fn codes() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = ERROR_CODES.iter().map(|e| e.code).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `docs/error-codes.md`: a Markdown table of [`ERROR_CODES`] with a trailing newline.
pub fn error_codes_markdown() -> String {
    let mut s = String::from(
        "# Error codes of the Platform API\n\n\
         <!-- Generated from `keel_api::codes::ERROR_CODES`; do not edit. Regenerate with\n     \
         `KEEL_UPDATE_ERROR_CODES=1 cargo nextest run -p keel-api error_codes`. -->\n\n\
         Every error answer is `application/problem+json` with a stable `code`; `retryable` \
         is true exactly for `503`, `409 INDEX_BEHIND` and `429 RATE_LIMITED`, which carry `Retry-After`. The same table is in the OpenAPI document \
         (`components.schemas.Problem.x-error-codes`, and the `enum` of its `code`).\n\n\
         | code | status | meaning |\n|---|---|---|\n",
    );
    for e in ERROR_CODES {
        s.push_str(&format!(
            "| `{}` | {} | {} |\n",
            e.code,
            e.status,
            e.meaning.replace('|', "\\|")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;
    use keel_durable::DurableError;
    use keel_durable::payload::BoundError;
    use keel_units::UnitsError;
    use keel_workflows::OpsError;

    /// The `"UPPER_CASE"` string literals of `text` before its `#[cfg(test)]` module.
    fn code_literals(text: &str) -> Vec<String> {
        let text = text.split("#[cfg(test)]").next().unwrap_or(text);
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        for (i, _) in text.match_indices('"') {
            let rest = &bytes[i + 1..];
            let len = rest
                .iter()
                .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b'_')
                .count();
            if len >= 3 && rest[0].is_ascii_uppercase() && rest.get(len) == Some(&b'"') {
                found.push(String::from_utf8_lossy(&rest[..len]).into_owned());
            }
        }
        found
    }

    /// Every code literal in keel-api's sources (outside `dto/`, whose literals are
    /// examples, and this table) and every code `OpsError::code` and `UnitsError::code`
    /// can return is listed. A new code in any of them fails here until it is added.
    #[test]
    fn every_code_in_the_sources_is_listed() {
        let root = env!("CARGO_MANIFEST_DIR");
        let files = [
            "src/extract.rs",
            "src/handlers/mod.rs",
            "src/handlers/assets.rs",
            "src/handlers/funding.rs",
            "src/handlers/health.rs",
            "src/handlers/operations.rs",
            "src/handlers/templates.rs",
            "src/handlers/token_ops.rs",
            "src/lib.rs",
            "src/openapi.rs",
            "src/problem.rs",
            "src/scope.rs",
            "src/keys.rs",
            "src/page.rs",
            "src/ledger.rs",
            "src/webhooks.rs",
            "src/user_ops.rs",
            "src/custody.rs",
            "src/rate_limit.rs",
            "../keel-workflows/src/error.rs",
            "../keel-units/src/error.rs",
        ];
        let listed = codes();
        let mut seen = 0;
        for f in files {
            let text = std::fs::read_to_string(format!("{root}/{f}")).unwrap();
            for code in code_literals(&text) {
                seen += 1;
                assert!(
                    listed.contains(&code.as_str()),
                    "{f}: code {code} is not in keel_api::codes::ERROR_CODES"
                );
            }
        }
        assert!(seen > 30, "the scan found only {seen} code literals");
    }

    /// Every service error answers a listed `(code, status)` pair, including every
    /// units error an amount can carry.
    #[test]
    fn every_service_error_is_listed_with_its_status() {
        let token = keel_units::TokenRef::new(
            keel_units::ChainId(1),
            alloy_primitives::Address::ZERO,
            keel_units::Decimals::new(6).unwrap(),
        );
        let units = [
            UnitsError::Negative,
            UnitsError::PrecisionLoss { decimals: 6 },
            UnitsError::Malformed { reason: "r" },
            UnitsError::TooManyDigits { max: 78 },
            UnitsError::Overflow,
            UnitsError::Underflow,
            UnitsError::ExceedsDecimalRange,
            UnitsError::DecimalsOutOfRange,
            UnitsError::ChainMismatch {
                left: keel_units::ChainId(1),
                right: keel_units::ChainId(2),
            },
            UnitsError::TokenMismatch {
                left: token,
                right: token,
            },
        ];
        let mut cases: Vec<OpsError> = units
            .into_iter()
            .map(|source| OpsError::Amount {
                field: "amount",
                source,
            })
            .collect();
        cases.extend([
            OpsError::Unauthenticated,
            OpsError::NotFound { what: "asset" },
            OpsError::IdempotencyConflict,
            OpsError::InvalidField {
                field: "name",
                reason: "r",
            },
            OpsError::AssetNotReady,
            OpsError::UnknownRole,
            OpsError::ChainNotConfigured,
            OpsError::ApprovalSameKey,
            OpsError::ApprovalNotPending,
            OpsError::NotRetryable,
            OpsError::FailureNotRetryable {
                code: "EXECUTION_REVERTED".into(),
            },
            OpsError::ApprovalExpired,
            OpsError::OperationEnded,
            OpsError::InsufficientScope,
            OpsError::ApiKeyRevoked,
            OpsError::Engine(DurableError::InvalidInput(BoundError::TooLarge {
                what: "input",
                limit: 1,
            })),
            OpsError::Engine(DurableError::IdempotencyConflict {
                workflow: "asset.mint".into(),
                instance_id: uuid::Uuid::nil(),
            }),
            OpsError::Engine(DurableError::Fenced),
            OpsError::IndexBehind,
            OpsError::IndexDegraded,
            OpsError::BlockNotIndexed { indexed: Some(1) },
            OpsError::SnapshotNotFinal,
            OpsError::SystemDisabled,
            OpsError::SystemNotDeployed,
            OpsError::AssetNotRegulated,
            OpsError::ComplianceRefused {
                code: "COMPLIANCE_NOT_ELIGIBLE",
            },
            OpsError::ComplianceRefused {
                code: "COMPLIANCE_EXPIRED",
            },
            OpsError::ComplianceRefused {
                code: "COMPLIANCE_COUNTRY_NOT_ALLOWED",
            },
            OpsError::ComplianceRefused {
                code: "COMPLIANCE_MAX_HOLDERS",
            },
            OpsError::ComplianceRefused {
                code: "COMPLIANCE_MAX_BALANCE",
            },
            OpsError::ComplianceRefused {
                code: "COMPLIANCE_LOCKED_UP",
            },
            OpsError::BatchTooLarge { max: 100 },
            OpsError::Store(keel_store::StoreError::Decode),
        ]);
        for e in cases {
            let label = format!("{e:?}");
            let p = Problem::from(e);
            assert!(
                is_listed(&p.code, p.status),
                "{label}: ({}, {}) is not listed",
                p.code,
                p.status
            );
        }
        for p in [
            Problem::unauthenticated(),
            Problem::not_found("route"),
            Problem::internal(),
            crate::scope::insufficient_scope(keel_workflows::Scope::Admin),
            crate::rate_limit::Limited {
                which: crate::rate_limit::Which::Key,
                retry_after_secs: 1,
                policy: String::new(),
                rate: String::new(),
            }
            .problem(),
        ] {
            assert!(is_listed(&p.code, p.status), "{p:?}");
        }
    }

    /// The table has no duplicate `(code, status)` pair and is ordered by status, then
    /// code; every meaning is a sentence.
    #[test]
    fn the_table_is_ordered_and_unique() {
        for pair in ERROR_CODES.windows(2) {
            assert!(
                (pair[0].status, pair[0].code) < (pair[1].status, pair[1].code),
                "{:?} before {:?}",
                pair[0],
                pair[1]
            );
        }
        for e in ERROR_CODES {
            assert!(e.meaning.ends_with('.'), "{e:?}");
            assert!(!e.meaning.contains("  "), "{e:?}");
        }
    }
}
