//! An asset's compliance rules (issue 37 §2): `POST /v1/assets/{id}/set-compliance`
//! starts `asset.set-compliance`, `Compliance.setRules` on the asset's organization
//! system. Mints and transfers of such an asset are checked against the rules before
//! they are accepted (`422 COMPLIANCE_*`, [`keel_workflows::compliance`]).

use crate::ApiState;
use crate::extract::{
    Authed, Field, FieldKind, IdempotencyKey, JsonBody, PreferWait, RawPath, RequestBody,
};
use crate::handlers::{TokenOpAnswers, WriteErrors, token_op};
use crate::problem::Problem;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use keel_workflows::TokenRequest;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `POST /v1/assets/{id}/set-compliance`: the asset's rules, replacing the
/// ones it had. Absent or zero values switch a rule off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ComplianceRequest {
    /// Recipients of mints and transfers must be eligible (registered, attested
    /// eligible, not expired) in the organization system's registry.
    pub eligible_only: Option<bool>,
    /// `any` (default), `allow` (the recipient's country must be in `countries`) or
    /// `deny` (must not be).
    #[schema(pattern = "^(any|allow|deny)$")]
    pub country_mode: Option<String>,
    /// ISO 3166-1 numeric country codes as strings (`"840"`), at most 300.
    pub countries: Option<Vec<String>>,
    /// Maximum number of holders (0 or absent: none).
    pub max_holders: Option<u64>,
    /// Maximum balance per holder in token units (decimal string); absent: none.
    #[schema(pattern = "^[0-9]+(\\.[0-9]+)?$")]
    pub max_balance: Option<String>,
    /// Unix time (seconds) before which holder-to-holder transfers are refused (mints
    /// are not); 0 or absent: none.
    pub lockup_until: Option<u64>,
}

impl RequestBody for ComplianceRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "eligibleOnly",
            kind: FieldKind::Bool,
        },
        Field {
            name: "countryMode",
            kind: FieldKind::Text,
        },
        Field {
            name: "countries",
            kind: FieldKind::TextList { max_items: 300 },
        },
        Field {
            name: "maxHolders",
            kind: FieldKind::UnsignedInteger,
        },
        Field {
            name: "maxBalance",
            kind: FieldKind::Decimal,
        },
        Field {
            name: "lockupUntil",
            kind: FieldKind::UnsignedInteger,
        },
    ];
    const OPTIONAL: &'static [&'static str] = &[
        "eligibleOnly",
        "countryMode",
        "countries",
        "maxHolders",
        "maxBalance",
        "lockupUntil",
    ];
}

fn invalid(field: &str, reason: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "INVALID_FIELD",
        format!("field `{field}`: {reason}"),
    )
}

/// Set an asset's compliance rules.
///
/// Starts `asset.set-compliance`: `Compliance.setRules` of the asset's organization
/// system, sent by the operator (the system's admin). Only an asset created through an
/// organization system has rules (`409 ASSET_NOT_REGULATED` otherwise). The token asks
/// the rules on every mint and transfer; Keel asks them too, at the latest block,
/// before it accepts one (`422 COMPLIANCE_*`). When the template sets a mint approval
/// threshold, a rules change waits for an approval like a role change. Same
/// idempotency and `Prefer: wait` rules as every operation-creating `POST`.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/set-compliance",
    tag = "assets",
    operation_id = "setAssetCompliance",
    request_body(content = ComplianceRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn set_compliance(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<ComplianceRequest>,
) -> Result<Response, Problem> {
    let countries = body
        .countries
        .unwrap_or_default()
        .iter()
        .map(|c| {
            c.parse::<u16>()
                .ok()
                .filter(|n| (1..=999).contains(n) && c.len() <= 3)
                .ok_or_else(|| {
                    invalid(
                        "countries",
                        "each must be an ISO 3166-1 numeric code (\"840\")",
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let max_holders = u32::try_from(body.max_holders.unwrap_or(0))
        .map_err(|_| invalid("maxHolders", "must be at most 4294967295"))?;
    let req = TokenRequest::SetCompliance {
        eligible_only: body.eligible_only.unwrap_or(false),
        country_mode: body.country_mode.unwrap_or_else(|| "any".to_owned()),
        countries,
        max_holders,
        max_balance: body.max_balance,
        lockup_until: body.lockup_until.unwrap_or(0),
    };
    token_op(&state, caller, &id, &key, wait, req).await
}
