//! Organization systems (issue 37 §1): an organization's own contracts on a chain (its
//! asset factory, eligibility registry and compliance contract), deployed by a durable
//! operation.
//!
//! | route | service call | answer |
//! |---|---|---|
//! | `POST /v1/organizations/{id}/system` | `Ops::org_system_deploy` | `202` (`200` once terminal) the `organization.system` operation |
//! | `GET /v1/organizations/{id}/systems` | `Ops::org_systems` | [`OrgSystemList`] |
//! | `POST /v1/organizations/{id}/systems/{systemId}/enable` | `Ops::org_system_switch` | `200` [`OrgSystemDto`] |
//! | `POST /v1/organizations/{id}/systems/{systemId}/disable` | `Ops::org_system_switch` | `200` [`OrgSystemDto`] |

use crate::ApiState;
use crate::dto::{EmptyRequest, address_text};
use crate::extract::{
    Authed, Field, FieldKind, IdempotencyKey, JsonBody, PreferWait, RawPath, RequestBody, parse_id,
};
use crate::handlers::{ReadErrors, TokenOpAnswers, WriteErrors, answer};
use crate::problem::Problem;
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_workflows::ops::org_systems::OrgSystemView;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// The body of `POST /v1/organizations/{id}/system`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeploySystemRequest {
    /// EIP-155 id of a bootstrapped chain.
    pub chain_id: u64,
}

impl RequestBody for DeploySystemRequest {
    const FIELDS: &'static [Field] = &[Field {
        name: "chainId",
        kind: FieldKind::UnsignedInteger,
    }];
}

/// An organization system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgSystemDto {
    /// The system's id (its deploying `organization.system` operation's id).
    pub id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The deployment's serial per organization and chain, from 1.
    pub serial: u64,
    /// `deploying`, `active` (the organization carries it), `replaced` (a later
    /// deployment replaced it; its assets stay indexed) or `failed` (its execution was
    /// gone; declared by the abandonment sweep, which took it out of the index scope).
    #[schema(pattern = "^(deploying|active|replaced|failed)$")]
    pub state: String,
    /// Its `OrgAssetFactory` (EIP-55), once deployed: deploys the organization's assets.
    pub factory_address: Option<String>,
    /// Its `IdentityRegistry` (eligibility registry), once deployed.
    pub registry_address: Option<String>,
    /// Its `Compliance` contract, once deployed.
    pub compliance_address: Option<String>,
    /// The block of its deployment transaction.
    pub deployed_block: Option<u64>,
    /// The operator's switch: a disabled system is out of the index scope and creates
    /// no assets (`409 SYSTEM_DISABLED`).
    pub enabled: bool,
    /// Whether the organization carries it now on its chain.
    pub current: bool,
    /// Why it failed (`EXECUTION_GONE`), or null.
    pub failure: Option<String>,
    /// Accepted at (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// Carried from, or null.
    pub activated_at: Option<DateTime<Utc>>,
    /// Replaced or failed at, or null.
    pub ended_at: Option<DateTime<Utc>>,
}

/// The systems of an organization, by chain, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgSystemList {
    /// The systems.
    pub data: Vec<OrgSystemDto>,
}

fn dto(v: OrgSystemView) -> OrgSystemDto {
    OrgSystemDto {
        id: v.id,
        chain_id: v.chain_id.get(),
        serial: v.serial,
        state: v.state.name().to_owned(),
        factory_address: v.factory.map(address_text),
        registry_address: v.registry.map(address_text),
        compliance_address: v.compliance.map(address_text),
        deployed_block: v.deployed_block,
        enabled: v.enabled,
        current: v.current,
        failure: v.failure,
        created_at: v.created_at,
        activated_at: v.activated_at,
        ended_at: v.ended_at,
    }
}

/// Deploy the organization's system on a chain.
///
/// Starts an `organization.system` operation: one transaction through the platform's
/// `SystemFactory` deploys an `IdentityRegistry`, a `Compliance` contract and an
/// `OrgAssetFactory`; its settings step then takes the system the organization carried
/// out of the Ledger Index's scope and puts the new one in, and the organization carries
/// it. Assets created afterwards from the organization's templates on that chain are
/// deployed by its factory (regulated tokens that consult its compliance contract).
/// Deploying again replaces the system; deployments of one organization and chain run
/// one at a time, in acceptance order. Same idempotency and `Prefer: wait` rules as
/// every operation-creating `POST`.
#[utoipa::path(
    post,
    path = "/v1/organizations/{id}/system",
    tag = "organizations",
    operation_id = "deployOrganizationSystem",
    request_body(content = DeploySystemRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "The caller's organization id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn deploy(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    RawPath(id): RawPath<String>,
    JsonBody(body): JsonBody<DeploySystemRequest>,
) -> Result<Response, Problem> {
    let org = parse_id(&id, "organization")?;
    let accepted = state
        .ops()
        .org_system_deploy(caller, &key, org, body.chain_id)
        .await?;
    Ok(answer(
        &state,
        caller,
        accepted.operation,
        Some(accepted.created),
        wait,
    )
    .await)
}

/// The organization's systems.
#[utoipa::path(
    get,
    path = "/v1/organizations/{id}/systems",
    tag = "organizations",
    operation_id = "listOrganizationSystems",
    params(("id" = Uuid, Path, description = "The caller's organization id")),
    responses(
        (status = 200, description = "The systems, by chain, newest first.", body = OrgSystemList),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
) -> Result<Response, Problem> {
    let org = parse_id(&id, "organization")?;
    let data = state.ops().org_systems(caller, org).await?;
    Ok(Json(OrgSystemList {
        data: data.into_iter().map(dto).collect(),
    })
    .into_response())
}

async fn switch(
    state: &ApiState,
    caller: keel_workflows::Caller,
    id: &str,
    sid: &str,
    enabled: bool,
) -> Result<Response, Problem> {
    let org = parse_id(id, "organization")?;
    let system = parse_id(sid, "system")?;
    let view = state
        .ops()
        .org_system_switch(caller, org, system, enabled)
        .await?;
    Ok(Json(dto(view)).into_response())
}

/// Switch a system on: its factory is back in the Ledger Index's scope and, if the
/// organization carries it, assets can be created through it again. Idempotent.
#[utoipa::path(
    post,
    path = "/v1/organizations/{id}/systems/{systemId}/enable",
    tag = "organizations",
    operation_id = "enableOrganizationSystem",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "The caller's organization id"),
        ("systemId" = Uuid, Path, description = "The system's id"),
    ),
    responses(
        (status = 200, description = "The system, enabled.", body = OrgSystemDto),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn enable(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, sid)): RawPath<(String, String)>,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    switch(&state, caller, &id, &sid, true).await
}

/// Switch a system off: its factory leaves the Ledger Index's scope (the tokens it
/// deployed stay indexed) and asset creations through it answer `409 SYSTEM_DISABLED`.
/// Idempotent.
#[utoipa::path(
    post,
    path = "/v1/organizations/{id}/systems/{systemId}/disable",
    tag = "organizations",
    operation_id = "disableOrganizationSystem",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(
        ("id" = Uuid, Path, description = "The caller's organization id"),
        ("systemId" = Uuid, Path, description = "The system's id"),
    ),
    responses(
        (status = 200, description = "The system, disabled.", body = OrgSystemDto),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn disable(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, sid)): RawPath<(String, String)>,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    switch(&state, caller, &id, &sid, false).await
}

/// The body of `POST /v1/organizations/{id}/investors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InvestorRequest {
    /// EIP-155 id of the chain whose organization system's registry is written.
    pub chain_id: u64,
    /// The investor's address (`0x` + 40 hex digits).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub address: String,
    /// The issuer's attestation that the address may hold the organization's assets.
    pub eligible: bool,
    /// ISO 3166-1 numeric country code as a string (`"840"`); absent: none.
    #[schema(pattern = "^[0-9]{1,3}$")]
    pub country_code: Option<String>,
    /// Unix time (seconds) after which the attestation lapses; absent or 0: never.
    pub expires_at: Option<u64>,
}

impl RequestBody for InvestorRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "chainId",
            kind: FieldKind::UnsignedInteger,
        },
        Field {
            name: "address",
            kind: FieldKind::Address,
        },
        Field {
            name: "eligible",
            kind: FieldKind::Bool,
        },
        Field {
            name: "countryCode",
            kind: FieldKind::Text,
        },
        Field {
            name: "expiresAt",
            kind: FieldKind::UnsignedInteger,
        },
    ];
    const OPTIONAL: &'static [&'static str] = &["countryCode", "expiresAt"];
}

/// Register or change an investor.
///
/// Starts `investor.set`: `IdentityRegistry.setInvestor` of the eligibility registry of
/// the system the organization carries on the chain (`409 SYSTEM_NOT_DEPLOYED` without
/// one), sent by the operator. The organization's regulated assets then judge mints and
/// transfers to the address by it (with `eligibleOnly`, a country list). Same
/// idempotency and `Prefer: wait` rules as every operation-creating `POST`.
#[utoipa::path(
    post,
    path = "/v1/organizations/{id}/investors",
    tag = "organizations",
    operation_id = "setInvestor",
    request_body(content = InvestorRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "The caller's organization id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn set_investor(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    RawPath(id): RawPath<String>,
    JsonBody(body): JsonBody<InvestorRequest>,
) -> Result<Response, Problem> {
    let org = parse_id(&id, "organization")?;
    let investor = crate::extract::parse_address(&body.address, "address")?;
    let country = match body.country_code.as_deref() {
        None => 0,
        Some(c) => c
            .parse::<u16>()
            .ok()
            .filter(|n| *n <= 999 && c.len() <= 3)
            .ok_or_else(|| {
                Problem::new(
                    axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                    "INVALID_FIELD",
                    "field `countryCode`: must be an ISO 3166-1 numeric code (\"840\")",
                )
            })?,
    };
    let accepted = state
        .ops()
        .investor_set(
            caller,
            &key,
            org,
            body.chain_id,
            investor,
            body.eligible,
            country,
            body.expires_at.unwrap_or(0),
        )
        .await?;
    Ok(answer(
        &state,
        caller,
        accepted.operation,
        Some(accepted.created),
        wait,
    )
    .await)
}
