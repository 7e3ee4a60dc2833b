//! The OpenAPI 3.1 document, generated from the handlers' annotations and the DTOs.

use crate::dto;
use crate::handlers;
use crate::keys;
use crate::problem::Problem;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// Adds the `bearer` security scheme (API keys and their scopes), states each keyed
/// route's scope as its `security` requirement with its `403` answer (from
/// [`crate::scope::ROUTES`]), marks the bodies of `pause`, `unpause`, `approve`,
/// `reject`, `retry`, `cancel`, `revoke`, `rotate` and `rotate-secret` optional (they
/// may be empty),
/// describes `OperationAccepted` as the one object it is on the wire, declares the
/// parameter constraints the server enforces, enumerates the operation kinds and lists
/// the error codes.
struct Fixups;

/// Replaces the generated `OperationAccepted` (an `allOf` of `Operation`, which has
/// `additionalProperties: false`, and an object with `created` and `statusUrl` — a
/// combination no body can satisfy) with one object: `Operation`'s properties and
/// required members plus `created` and `statusUrl`, still closed to other members.
fn merge_operation_accepted(components: &mut utoipa::openapi::Components) {
    use utoipa::openapi::{RefOr, Schema};
    let Some(RefOr::T(Schema::Object(operation))) = components.schemas.get("Operation") else {
        return;
    };
    let Some(RefOr::T(Schema::AllOf(accepted))) = components.schemas.get("OperationAccepted")
    else {
        return;
    };
    let mut merged = operation.clone();
    merged.description.clone_from(&accepted.description);
    for item in &accepted.items {
        if let RefOr::T(Schema::Object(extra)) = item {
            merged.properties.extend(extra.properties.clone());
            merged.required.extend(extra.required.iter().cloned());
        }
    }
    components.schemas.insert(
        "OperationAccepted".to_owned(),
        RefOr::T(Schema::Object(merged)),
    );
}

impl Modify for Fixups {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for (path, item) in doc.paths.paths.iter_mut() {
            let optional_body = [
                "/pause",
                "/unpause",
                "/approve",
                "/reject",
                "/retry",
                "/cancel",
                "/revoke",
                "/rotate",
                "/rotate-secret",
                "/reindex",
                "/test",
            ]
            .iter()
            .any(|suffix| path.ends_with(suffix));
            if let Some(body) = item
                .post
                .as_mut()
                .and_then(|op| op.request_body.as_mut())
                .filter(|_| optional_body)
            {
                body.required = Some(utoipa::openapi::Required::False);
            }
        }
        constrain_parameters(doc);
        declare_scopes(doc);
        declare_request_answers(doc);
        let components = doc.components.get_or_insert_with(Default::default);
        enumerate_kinds(components);
        merge_operation_accepted(components);
        name_result_kinds(components);
        unique_scopes(components);
        enumerate_event_types(components);
        list_error_codes(components);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key of the organization: `keel_sk_` followed by 64 hex digits. \
                         Missing, invalid, revoked or rotated-away keys answer 401 \
                         `UNAUTHENTICATED`. A key holds one or more scopes, and each route \
                         requires one (its `security` requirement names it): `read` for every \
                         GET route, `operate` for the operation-creating POSTs, retry and \
                         cancel, `approve` for approve and reject, `admin` for the \
                         `/v1/api-keys` routes. A key without the route's scope answers 403 \
                         `INSUFFICIENT_SCOPE`. Keys created before scopes existed hold all \
                         four. Manage keys with `/v1/api-keys` (an `admin` key) or \
                         `keel api-key create|list|revoke|rotate`.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Declares the parameter constraints the server enforces: `maximum` 2^63-1 on every
/// `int64` query parameter, 1 to 255 non-control characters on `Idempotency-Key`, and
/// the address pattern on the `address` path parameter.
fn constrain_parameters(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    use utoipa::openapi::{RefOr, Schema};
    for item in doc.paths.paths.values_mut() {
        let ops = [item.get.as_mut(), item.post.as_mut()];
        for op in ops.into_iter().flatten() {
            for p in op.parameters.iter_mut().flatten() {
                let Some(RefOr::T(Schema::Object(schema))) = p.schema.as_mut() else {
                    continue;
                };
                match (&p.parameter_in, p.name.as_str()) {
                    (ParameterIn::Query, _)
                        if schema.format
                            == Some(utoipa::openapi::SchemaFormat::KnownFormat(
                                utoipa::openapi::KnownFormat::Int64,
                            )) =>
                    {
                        // 2^63-1 on the 64-bit targets Keel is built for.
                        schema.maximum = Some(utoipa::Number::Int(isize::MAX));
                    }
                    (ParameterIn::Header, "Idempotency-Key") => {
                        schema.min_length = Some(1);
                        schema.max_length = Some(255);
                        schema.pattern = Some(r"^[^\u0000-\u001F\u007F-\u009F]*$".to_owned());
                    }
                    (ParameterIn::Query, "kind") => {
                        schema.enum_values = Some(kinds());
                    }
                    (ParameterIn::Path, "address") => {
                        schema.pattern = Some("^0x[0-9a-fA-F]{40}$".to_owned());
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Declares the items of `eventTypes` in the webhook-endpoint requests as the enum of
/// [`keel_webhooks::EVENT_TYPES`] and `*` (the server refuses any other string; the
/// DTOs hold them as strings so the refusal is a typed `422`).
fn enumerate_event_types(components: &mut utoipa::openapi::Components) {
    use utoipa::openapi::schema::ArrayItems;
    use utoipa::openapi::{RefOr, Schema};
    let values: Vec<serde_json::Value> = keel_webhooks::EVENT_TYPES
        .iter()
        .copied()
        .chain(["*"])
        .map(serde_json::Value::from)
        .collect();
    fn items(schema: &mut Schema, values: &[serde_json::Value]) {
        match schema {
            Schema::Array(array) => {
                if let ArrayItems::RefOrSchema(item) = &mut array.items
                    && let RefOr::T(Schema::Object(item)) = item.as_mut()
                {
                    item.enum_values = Some(values.to_vec());
                }
            }
            Schema::OneOf(one) => {
                for s in &mut one.items {
                    if let RefOr::T(s) = s {
                        items(s, values);
                    }
                }
            }
            _ => {}
        }
    }
    for name in [
        "CreateWebhookEndpointRequest",
        "UpdateWebhookEndpointRequest",
    ] {
        if let Some(RefOr::T(Schema::Object(request))) = components.schemas.get_mut(name)
            && let Some(RefOr::T(schema)) = request.properties.get_mut("eventTypes")
        {
            items(schema, &values);
        }
    }
}

/// Declares `uniqueItems` on `CreateApiKeyRequest.scopes` (the server refuses a
/// repeated scope; utoipa's derive cannot say so).
fn unique_scopes(components: &mut utoipa::openapi::Components) {
    use utoipa::openapi::{RefOr, Schema};
    let Some(RefOr::T(Schema::Object(request))) = components.schemas.get_mut("CreateApiKeyRequest")
    else {
        return;
    };
    if let Some(RefOr::T(Schema::Array(scopes))) = request.properties.get_mut("scopes") {
        scopes.unique_items = true;
    }
}

/// The `429 RATE_LIMITED` answer of every keyed route ([`crate::rate_limit`]), with its
/// `Retry-After`, `RateLimit` and `RateLimit-Policy` fields.
fn rate_limited_answer() -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::{ContentBuilder, RefOr, ResponseBuilder};
    let text = || ObjectBuilder::new().schema_type(Type::String).build();
    RefOr::T(
        ResponseBuilder::new()
            .description(
                "`RATE_LIMITED`: the API key's or its organization's request rate limit is \
                 exhausted (per api replica); wait `Retry-After` seconds.",
            )
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(1)),
                    )
                    .description(Some(
                        "Whole seconds until the limit admits another request (rounded up, \
                         at least 1; RFC 9110 §10.2.3).",
                    ))
                    .build(),
            )
            .header(
                "RateLimit",
                HeaderBuilder::new()
                    .schema(text())
                    .description(Some(
                        "draft-ietf-httpapi-ratelimit-headers: the refusing limit's state, \
                         `\"api-key\";r=0;t=<Retry-After>` or `\"organization\";r=0;t=<Retry-After>`.",
                    ))
                    .build(),
            )
            .header(
                "RateLimit-Policy",
                HeaderBuilder::new()
                    .schema(text())
                    .description(Some(
                        "draft-ietf-httpapi-ratelimit-headers: each enabled limit, \
                         `\"api-key\";q=<burst>;w=<seconds to refill>, \"organization\";q=…;w=…`.",
                    ))
                    .build(),
            )
            .content(
                crate::problem::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        "Problem",
                    ))))
                    .build(),
            )
            .build(),
    )
}

/// Sets every keyed route's `security` to `bearer` with its scope from
/// [`crate::scope::ROUTES`] (whatever its annotation said) and adds its `403
/// INSUFFICIENT_SCOPE` answer when the annotation has none, and its `429 RATE_LIMITED`
/// answer ([`crate::rate_limit`]).
fn declare_scopes(doc: &mut utoipa::openapi::OpenApi) {
    use crate::scope::{Access, access};
    use axum::http::Method;
    use utoipa::openapi::security::SecurityRequirement;
    use utoipa::openapi::{ContentBuilder, RefOr, ResponseBuilder};
    for (path, item) in doc.paths.paths.iter_mut() {
        let ops = [
            (Method::GET, item.get.as_mut()),
            (Method::POST, item.post.as_mut()),
            (Method::PATCH, item.patch.as_mut()),
            (Method::DELETE, item.delete.as_mut()),
        ];
        for (method, op) in ops {
            let Some(op) = op else { continue };
            let Some(Access::Key(scope)) = access(&method, path) else {
                continue;
            };
            op.security = Some(vec![SecurityRequirement::new("bearer", [scope.as_str()])]);
            op.responses
                .responses
                .entry("403".to_owned())
                .or_insert_with(|| {
                    RefOr::T(
                        ResponseBuilder::new()
                            .description(format!(
                                "`INSUFFICIENT_SCOPE`: the API key lacks the `{scope}` scope."
                            ))
                            .content(
                                crate::problem::PROBLEM_JSON,
                                ContentBuilder::new()
                                    .schema(Some(RefOr::Ref(
                                        utoipa::openapi::Ref::from_schema_name("Problem"),
                                    )))
                                    .build(),
                            )
                            .build(),
                    )
                });
            op.responses
                .responses
                .entry("429".to_owned())
                .or_insert_with(rate_limited_answer);
        }
    }
}

/// A `problem+json` answer described by `description`.
fn problem_answer(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
    use utoipa::openapi::{ContentBuilder, RefOr, ResponseBuilder};
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                crate::problem::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        "Problem",
                    ))))
                    .build(),
            )
            .build(),
    )
}

/// Declares the answers every request can get before its handler runs, on every
/// operation that lacks them: `400` (`UNKNOWN_QUERY_PARAMETER`: every route refuses
/// undeclared query parameters, [`crate::scope::check_query`]), `405
/// METHOD_NOT_ALLOWED` (the path exists, the method does not), and on every operation
/// with a request body `413 PAYLOAD_TOO_LARGE` and `415 UNSUPPORTED_MEDIA_TYPE` (the
/// shared body extractors, [`crate::extract::RawBody`] and
/// [`crate::extract::JsonBody`]).
fn declare_request_answers(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [
            item.get.as_mut(),
            item.post.as_mut(),
            item.put.as_mut(),
            item.patch.as_mut(),
            item.delete.as_mut(),
        ];
        for op in ops.into_iter().flatten() {
            let with_body = op.request_body.is_some();
            let answers = &mut op.responses.responses;
            let unknown = "`UNKNOWN_QUERY_PARAMETER`: the query string names a parameter this \
                           route does not declare.";
            match answers.get_mut("400") {
                Some(utoipa::openapi::RefOr::T(answer))
                    if !answer.description.contains("UNKNOWN_QUERY_PARAMETER") =>
                {
                    answer.description = format!("{} {unknown}", answer.description.trim_end());
                }
                Some(_) => {}
                None => {
                    answers.insert("400".to_owned(), problem_answer(unknown));
                }
            }
            answers.entry("405".to_owned()).or_insert_with(|| {
                problem_answer(
                    "`METHOD_NOT_ALLOWED`: the path exists but not with this method (the \
                     answer's `Allow` header lists the methods it has).",
                )
            });
            if with_body {
                answers.entry("413".to_owned()).or_insert_with(|| {
                    problem_answer(
                        "`PAYLOAD_TOO_LARGE`: the body exceeds the limit (default 256 KiB).",
                    )
                });
                answers.entry("415".to_owned()).or_insert_with(|| {
                    problem_answer("`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.")
                });
            }
        }
    }
}

/// The schema name of the result of operation kind `kind`: `asset.grant-role` →
/// `AssetGrantRoleOperationResult`.
fn result_schema_name(kind: &str) -> String {
    let mut name = String::new();
    for part in kind.split(['.', '-']) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name.push_str("OperationResult");
    name
}

/// Replaces `OperationResult`'s inline `oneOf` of `allOf[$ref, {kind}]` (which
/// generators such as openapi-python-client cannot read) with one named, closed object
/// per kind (`AssetMintOperationResult`, ...: the kind's result members plus `kind`,
/// whose only value is the kind) and a `oneOf` of their references with a
/// `discriminator` on `kind`. The wire shape is unchanged.
fn name_result_kinds(components: &mut utoipa::openapi::Components) {
    use serde_json::Value;
    use utoipa::openapi::schema::{
        AdditionalProperties, Discriminator, ObjectBuilder, OneOfBuilder, Type,
    };
    use utoipa::openapi::{Ref, RefOr, Schema};
    // Read the generated `oneOf` (as JSON: which base schema and which kind per item).
    let Some(result) = components
        .schemas
        .get("OperationResult")
        .and_then(|s| serde_json::to_value(s).ok())
    else {
        return;
    };
    let Some(items) = result.get("oneOf").and_then(Value::as_array) else {
        return;
    };
    let mut kinds = Vec::new();
    for item in items {
        let parts = item.get("allOf").and_then(Value::as_array);
        let base = parts
            .and_then(|p| p.iter().find_map(|s| s.get("$ref")))
            .and_then(Value::as_str)
            .and_then(|r| r.rsplit('/').next());
        let kind = parts
            .and_then(|p| p.iter().find_map(|s| s.pointer("/properties/kind/enum/0")))
            .and_then(Value::as_str);
        let (Some(base), Some(kind)) = (base, kind) else {
            return;
        };
        let description = item
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned);
        kinds.push((base.to_owned(), kind.to_owned(), description));
    }
    let mut one_of = OneOfBuilder::new();
    let mut mapping = Vec::new();
    for (base, kind, description) in kinds {
        let Some(RefOr::T(Schema::Object(mut object))) = components.schemas.get(&base).cloned()
        else {
            return;
        };
        object.properties.insert(
            "kind".to_owned(),
            RefOr::T(Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([kind.as_str()]))
                    .description(Some("The operation kind (repeats the operation's `kind`)."))
                    .build(),
            )),
        );
        object.required.insert(0, "kind".to_owned());
        object.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        if description.is_some() {
            object.description = description;
        }
        let name = result_schema_name(&kind);
        components
            .schemas
            .insert(name.clone(), RefOr::T(Schema::Object(object)));
        one_of = one_of.item(RefOr::Ref(Ref::from_schema_name(&name)));
        mapping.push((kind, format!("#/components/schemas/{name}")));
    }
    let description = result
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let one_of = one_of
        .description(description)
        .discriminator(Some(Discriminator::with_mapping("kind", mapping)))
        .build();
    components.schemas.insert(
        "OperationResult".to_owned(),
        RefOr::T(Schema::OneOf(one_of)),
    );
}

/// Every operation kind ([`dto::OperationResult::kinds`]) as JSON values.
fn kinds() -> Vec<serde_json::Value> {
    dto::OperationResult::kinds()
        .map(serde_json::Value::from)
        .collect()
}

/// Declares `Operation.kind` as the enum of [`dto::OperationResult::kinds`] (before
/// `OperationAccepted` copies `Operation`'s properties).
fn enumerate_kinds(components: &mut utoipa::openapi::Components) {
    use utoipa::openapi::{RefOr, Schema};
    let Some(RefOr::T(Schema::Object(operation))) = components.schemas.get_mut("Operation") else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(kind))) = operation.properties.get_mut("kind") {
        kind.enum_values = Some(kinds());
    }
}

/// Puts [`crate::codes::ERROR_CODES`] on the `Problem` schema: the distinct codes as
/// the `enum` of `code`, and the whole table (code, status, meaning) as `x-error-codes`.
fn list_error_codes(components: &mut utoipa::openapi::Components) {
    use utoipa::openapi::{RefOr, Schema};
    let Some(RefOr::T(Schema::Object(problem))) = components.schemas.get_mut("Problem") else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(code))) = problem.properties.get_mut("code") {
        code.enum_values = Some(
            crate::codes::codes()
                .into_iter()
                .map(serde_json::Value::from)
                .collect(),
        );
    }
    let table: Vec<serde_json::Value> = crate::codes::ERROR_CODES
        .iter()
        .map(|e| serde_json::json!({"code": e.code, "status": e.status, "meaning": e.meaning}))
        .collect();
    problem
        .extensions
        .get_or_insert_with(Default::default)
        .insert("x-error-codes".to_owned(), serde_json::Value::from(table));
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Keel Platform API",
        version = "1",
        description = "Create and operate digital assets on EVM chains. Writes are accepted \
            idempotently (`Idempotency-Key`) and run as durable operations: poll \
            `GET /v1/operations/{id}` or send `Prefer: wait=<seconds>`. Every read and write \
            is scoped to the API key's organization; other organizations' resources answer 404. \
            Every route but the health routes needs an API key holding the route's scope \
            (`read`, `operate`, `approve` or `admin`; see the `bearer` scheme): 401 without a \
            valid key, 403 `INSUFFICIENT_SCOPE` without the scope, and 429 `RATE_LIMITED` \
            over the key's or the organization's request rate limit (per api replica; with \
            `Retry-After` and the `RateLimit` / `RateLimit-Policy` fields of \
            draft-ietf-httpapi-ratelimit-headers, which admitted answers carry too). \
            Errors are `application/problem+json` with a stable `code`, `retryable` and a \
            value-free `detail`. Amounts and prices are decimal strings in token (or quote) \
            units; JSON numbers are refused for them. Request bodies are limited to 256 KiB \
            (by default; at most 16 MiB by configuration) and 64 levels of nesting; they are \
            validated while parsed, never held as a generic JSON tree. A member that appears \
            twice is refused (400 `INVALID_FIELD`), whatever its values."
    ),
    paths(
        handlers::create_asset,
        handlers::mint,
        handlers::transfer,
        handlers::pause,
        handlers::unpause,
        handlers::burn,
        handlers::grant_role,
        crate::compliance::set_compliance,
        crate::agent::freeze,
        crate::agent::unfreeze,
        crate::agent::forced_transfer,
        crate::agent::recover,
        crate::agent::batch_mint,
        crate::agent::batch_transfer,
        handlers::revoke_role,
        handlers::assets,
        handlers::asset,
        handlers::balance,
        crate::ledger::holders,
        crate::ledger::transfers,
        crate::ledger::holder_transfers,
        crate::ledger::supply,
        crate::snapshots::create,
        crate::snapshots::list,
        crate::snapshots::get,
        crate::snapshots::holders,
        crate::snapshots::export,
        crate::org_systems::deploy,
        crate::org_systems::list,
        crate::org_systems::set_investor,
        crate::org_systems::enable,
        crate::org_systems::disable,
        crate::distributions::create,
        crate::distributions::get,
        crate::distributions::pause,
        crate::distributions::resume,
        crate::distributions::payments,
        crate::distributions::list,
        handlers::operation,
        handlers::operation_history,
        handlers::operations,
        handlers::templates,
        handlers::approve,
        handlers::reject,
        handlers::retry,
        handlers::cancel,
        handlers::funding_requests,
        keys::list,
        keys::create,
        keys::revoke,
        keys::rotate,
        // Webhooks (issue 21).
        crate::webhooks::create,
        crate::webhooks::list,
        crate::webhooks::get,
        crate::webhooks::update,
        crate::webhooks::delete,
        crate::webhooks::rotate,
        crate::webhooks::test,
        crate::webhooks::deliveries,
        crate::status::get_status,
        crate::index::reindex,
        // ERC-4337 user operations (issue 20).
        crate::user_ops::bundler_rpc,
        crate::user_ops::submit,
        crate::user_ops::get,
        crate::custody::fireblocks_webhook,
        handlers::healthz,
        handlers::readyz,
        handlers::openapi_json,
    ),
    components(schemas(
        Problem,
        dto::CreateAssetRequest,
        crate::index::ReindexRequest,
        crate::index::ReindexAccepted,
        dto::TokenAmountRequest,
        dto::BurnRequest,
        dto::RoleRequest,
        crate::compliance::ComplianceRequest,
        crate::agent::FreezeRequest,
        crate::agent::ForcedTransferRequest,
        crate::agent::RecoverRequest,
        crate::agent::BatchRequest,
        dto::EmptyRequest,
        dto::Operation,
        dto::OperationAccepted,
        dto::OperationState,
        dto::OperationWait,
        dto::WaitFor,
        dto::CustodyWaitDetail,
        dto::Milestones,
        dto::TxMilestone,
        dto::IndexedMilestone,
        dto::OperationError,
        dto::OperationResult,
        dto::AssetCreateResult,
        dto::TokenOperationResult,
        dto::RoleChangeResult,
        dto::DistributionResult,
        dto::OrgSystemResult,
        dto::OperationList,
        dto::OperationHistory,
        dto::OperationHistoryEntry,
        dto::Template,
        dto::TemplateList,
        dto::Asset,
        dto::AssetStatus,
        dto::AssetList,
        dto::Observation,
        dto::Balance,
        crate::ledger::Holder,
        crate::ledger::HolderList,
        crate::ledger::TokenTransfer,
        crate::ledger::TokenTransferList,
        crate::ledger::Supply,
        crate::snapshots::CreateSnapshotRequest,
        crate::snapshots::SnapshotDto,
        crate::snapshots::SnapshotList,
        crate::snapshots::SnapshotHolderList,
        crate::snapshots::SnapshotState,
        crate::snapshots::SnapshotPendingReason,
        crate::org_systems::DeploySystemRequest,
        crate::org_systems::OrgSystemDto,
        crate::org_systems::OrgSystemList,
        crate::org_systems::InvestorRequest,
        crate::distributions::CreateDistributionRequest,
        crate::distributions::DistributionDto,
        crate::distributions::DistributionList,
        crate::distributions::DistributionProgressDto,
        crate::distributions::PaymentTally,
        crate::distributions::PaymentDto,
        crate::distributions::PaymentList,
        dto::FundingRequest,
        dto::FundingRequestList,
        dto::EntryPointDepositRequest,
        dto::QueuedBehindFunding,
        dto::Health,
        dto::ApiKeyScope,
        dto::CreateApiKeyRequest,
        dto::RotateApiKeyRequest,
        dto::ApiKey,
        dto::ApiKeyWithToken,
        dto::ApiKeyList,
        // Webhooks (issue 21).
        crate::webhooks::WebhookEndpoint,
        crate::webhooks::WebhookEndpointWithSecret,
        crate::webhooks::WebhookEndpointList,
        crate::webhooks::CreateWebhookEndpointRequest,
        crate::webhooks::UpdateWebhookEndpointRequest,
        crate::webhooks::RotateSecretRequest,
        crate::webhooks::WebhookTestQueued,
        crate::webhooks::WebhookAttempt,
        crate::webhooks::WebhookDelivery,
        crate::webhooks::WebhookDeliveryList,
        // ERC-4337 user operations (issue 20).
        crate::user_ops::SubmitUserOperationRequest,
        crate::user_ops::UserOperationJson,
        crate::user_ops::Eip7702AuthJson,
        crate::user_ops::UserOperationAccepted,
        crate::user_ops::UserOperationStatus,
        // Platform Status (issue 22).
        crate::custody::CustodyWebhookAck,
        crate::status::PlatformStatus,
        crate::status::StatusThresholds,
        crate::status::WorkflowsStatus,
        crate::status::WorkflowStateCount,
        crate::status::StatusInstance,
        crate::status::StatusDeadLetter,
        crate::status::StatusVersionWait,
        crate::status::QueueSenderStatus,
        crate::status::FundingStatus,
        crate::status::StatusFundingRequest,
        crate::status::IndexChainStatus,
        crate::status::RangeCounts,
        crate::status::ClusterInfo,
        crate::status::ReplicaInfo,
        crate::status::SingletonInfo,
        crate::status::JobInfo,
        crate::status::CustodyInfo,
        crate::status::CustodyRequestCount,
        crate::status::CustodyPendingApproval,
        crate::status::WebhooksInfo,
        crate::status::DisabledEndpointInfo,
        crate::status::UnhealthyEndpointInfo,
        crate::status::DistributionInfo,
    )),
    modifiers(&Fixups),
    tags(
        (name = "assets", description = "Assets: creation, token operations and reads from the Ledger Index"),
        (name = "organizations", description = "Organization systems: an organization's own asset factory, eligibility registry and compliance contract on a chain"),
        (name = "distributions", description = "Distributions: payouts to the holders of a final snapshot, paid in batches exactly once per holder"),
        (name = "operations", description = "Durable operations: status, approvals, funding requests"),
        (name = "api-keys", description = "API keys of the organization: list, create, revoke, rotate (an `admin` key)"),
        (name = "webhooks", description = "Webhook endpoints: subscriptions, secret rotation, test deliveries, delivery attempts"),
        (name = "user-operations", description = "ERC-4337 user operations: the bundler's JSON-RPC endpoint (ERC-7769) and the REST submission and status"),
        (name = "status", description = "Platform Status for operators (an `admin` key): workflows, queue, index, cluster, jobs, webhooks, from the database"),
        (name = "custody", description = "Inbound custody-provider webhooks (authenticated by the provider's signature, not an API key): a wake-up for the transaction queue's read of the provider"),
        (name = "health", description = "Liveness, readiness and this document"),
    )
)]
struct ApiDoc;

/// The OpenAPI 3.1 document of the Platform API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as served at `/openapi.json` and committed as `docs/openapi.json`:
/// pretty-printed JSON with a trailing newline.
pub fn openapi_json() -> String {
    let mut s = openapi()
        .to_pretty_json()
        .unwrap_or_else(|_| "{}".to_owned());
    s.push('\n');
    s
}
