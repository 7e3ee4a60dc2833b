//! Distributions (issue 36 §3): payouts to the holders of a final snapshot, their wire
//! shapes and handlers.
//!
//! | route | service call | answer |
//! |---|---|---|
//! | `POST /v1/distributions` | `Ops::distribution_create` | `202` (`200` once terminal) the `distribution.pay` operation, as every operation-creating `POST` |
//! | `GET /v1/distributions/{id}` | `Ops::distribution` | [`DistributionDto`] |
//! | `POST /v1/distributions/{id}/pause` | `Ops::distribution_pause` | `200` [`DistributionDto`] |
//! | `POST /v1/distributions/{id}/resume` | `Ops::distribution_resume` | `200` [`DistributionDto`] |
//! | `GET /v1/distributions/{id}/payments` (`?limit=&cursor=`) | `Ops::distribution_payments` | [`PaymentList`] |
//! | `GET /v1/assets/{id}/distributions` (`?limit=&cursor=`) | `Ops::distributions` | [`DistributionList`] |
//!
//! Amounts are base units of the paying token (wei for native ether) as decimal
//! integer strings. The distribution's id is its operation's id.

use crate::ApiState;
use crate::dto::{EmptyRequest, Operation, address_text};
use crate::extract::{
    Authed, Field, FieldKind, IdempotencyKey, JsonBody, PreferWait, RawPath, RequestBody,
    parse_address, parse_id,
};
use crate::handlers::{TokenOpAnswers, WriteErrors, answer};
use crate::page::{Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::Query;
use axum::extract::State;
use axum::extract::rejection::QueryRejection;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_workflows::ops::distributions::{
    DistributionView, NewDistribution, PayRequest, PaymentView, Tally,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoResponses, ToSchema};
use uuid::Uuid;

/// The body of `POST /v1/distributions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateDistributionRequest {
    /// The asset whose holders are paid.
    pub asset_id: String,
    /// A final snapshot of that asset (`POST /v1/assets/{id}/snapshots`).
    pub snapshot_id: String,
    /// What is paid: `asset` (the asset's own token), `erc20` (another ERC-20, named
    /// by `payToken`) or `native` (the chain's native currency, wei).
    #[schema(pattern = "^(asset|erc20|native)$")]
    pub pay_with: String,
    /// The ERC-20 paid when `payWith` is `erc20` (else absent).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub pay_token: Option<String>,
    /// `proRata` (`amountBaseUnits` is the total, split by balance) or `perUnit`
    /// (`amountBaseUnits` is paid per whole unit of the asset held).
    #[schema(pattern = "^(proRata|perUnit)$")]
    pub basis: String,
    /// Base units of the paying token (decimal integer string, up to 2^256-1): the
    /// total (`proRata`) or the amount per whole unit of the asset (`perUnit`).
    #[schema(pattern = "^[0-9]{1,78}$", example = "1000000000000000000")]
    pub amount_base_units: String,
    /// `floor` (each share rounded down; the remainder stays with the payer and is
    /// reported) or `largestRemainder` (the remainder handed out one base unit at a
    /// time by largest dropped fraction; pro rata only). Default `floor`.
    #[schema(pattern = "^(floor|largestRemainder)$")]
    pub rounding: Option<String>,
    /// Holders paid nothing (their balances do not count in a pro-rata split), at most
    /// 1,000.
    pub exclusions: Option<Vec<String>>,
    /// The most recipients per batch transaction, 1 to 500 (default: chosen from gas).
    #[schema(minimum = 1, maximum = 500)]
    pub max_batch_size: Option<u64>,
}

impl RequestBody for CreateDistributionRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "assetId",
            kind: FieldKind::Text,
        },
        Field {
            name: "snapshotId",
            kind: FieldKind::Text,
        },
        Field {
            name: "payWith",
            kind: FieldKind::Text,
        },
        Field {
            name: "payToken",
            kind: FieldKind::Address,
        },
        Field {
            name: "basis",
            kind: FieldKind::Text,
        },
        Field {
            name: "amountBaseUnits",
            kind: FieldKind::Decimal,
        },
        Field {
            name: "rounding",
            kind: FieldKind::Text,
        },
        Field {
            name: "exclusions",
            kind: FieldKind::TextList { max_items: 1_000 },
        },
        Field {
            name: "maxBatchSize",
            kind: FieldKind::UnsignedInteger,
        },
    ];
    const OPTIONAL: &'static [&'static str] =
        &["payToken", "rounding", "exclusions", "maxBatchSize"];
}

/// Holders and base units of one payment state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentTally {
    /// Holders.
    pub holders: u64,
    /// Base units of the paying token owed to them (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub amount: String,
}

/// A distribution's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DistributionProgressDto {
    /// Paid: their batch's transaction confirmed.
    pub paid: PaymentTally,
    /// Owed, not paid yet.
    pub pending: PaymentTally,
    /// Refused by the paying token or the recipient (left out of their batch; see
    /// each payment's `reason`).
    pub refused: PaymentTally,
    /// Excluded by the request.
    pub excluded: PaymentTally,
    /// Shares that rounded to 0.
    pub zero: PaymentTally,
    /// Batch transactions confirmed.
    pub batches_paid: u64,
}

/// A distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DistributionDto {
    /// The distribution (also its operation's id).
    pub id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// The snapshot.
    pub snapshot_id: Uuid,
    /// The record date (the snapshot's block).
    pub record_block: Option<u64>,
    /// `asset`, `erc20` or `native`.
    pub pay_with: String,
    /// The paying token (null for native).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub pay_token: Option<String>,
    /// `proRata` or `perUnit`.
    pub basis: String,
    /// Base units of the paying token: the total, or per whole unit of the asset.
    #[schema(pattern = "^[0-9]+$")]
    pub amount_base_units: String,
    /// `floor` or `largestRemainder`.
    pub rounding: String,
    /// Excluded holders (EIP-55).
    pub exclusions: Vec<String>,
    /// Holders of the snapshot; null until the plan is written.
    pub holder_count: Option<u64>,
    /// The sum owed (base units); null until planned.
    #[schema(pattern = "^[0-9]+$")]
    pub total_due: Option<String>,
    /// What the rounding left unpaid: it stays with the paying account (base units);
    /// null until planned.
    #[schema(pattern = "^[0-9]+$")]
    pub remainder: Option<String>,
    /// The payments tallied.
    pub progress: DistributionProgressDto,
    /// Its operation: state, wait (approval, funding), transactions, error.
    pub operation: Operation,
    /// When it was accepted (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When its last batch was paid; null before.
    pub completed_at: Option<DateTime<Utc>>,
    /// Since when it is paused (`POST …/pause`); null while it runs and once it ended.
    pub paused_at: Option<DateTime<Utc>>,
    /// Its per-holder payments.
    pub payments_url: String,
}

/// `GET /v1/assets/{id}/distributions`: an asset's distributions, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DistributionList {
    /// Distributions by `createdAt` descending.
    pub data: Vec<DistributionDto>,
    /// True when older distributions follow.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// One holder's payment: what it was owed and what happened, to reconcile against the
/// chain (`txHash` holds a `BatchPaid` event and the token's `Transfer` to `holder`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentDto {
    /// The holder (EIP-55).
    pub holder: String,
    /// Its balance at the record date, base units of the asset.
    #[schema(pattern = "^[0-9]+$")]
    pub balance: String,
    /// What it is owed, base units of the paying token.
    #[schema(pattern = "^[0-9]+$")]
    pub amount: String,
    /// `pending`, `paid`, `refused`, `excluded` or `zero`.
    #[schema(pattern = "^(pending|paid|refused|excluded|zero)$")]
    pub state: String,
    /// Its batch (from 0), once placed in one.
    pub batch: Option<u32>,
    /// The transaction that paid it.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub tx_hash: Option<String>,
    /// That transaction's block.
    pub block: Option<u64>,
    /// Why it was refused: the paying token's error name (e.g. `EnforcedPause`), or
    /// `TransferRefused` when the token or the recipient gave none Keel knows.
    pub reason: Option<String>,
}

/// `GET /v1/distributions/{id}/payments`: a page of a distribution's payments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentList {
    /// Payments in ascending holder order.
    pub data: Vec<PaymentDto>,
    /// True when more follow.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// Errors of the distribution reads (for the OpenAPI document).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum DistributionReadErrors {
    /// `INVALID_QUERY` (`limit` outside 1..=200), `INVALID_CURSOR`,
    /// `UNKNOWN_QUERY_PARAMETER`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such distribution (or asset) in the caller's organization.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `SERVICE_UNAVAILABLE`; retryable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

fn tally(t: Tally) -> PaymentTally {
    PaymentTally {
        holders: t.holders,
        amount: t.amount.to_string(),
    }
}

fn dto(v: DistributionView) -> DistributionDto {
    let (pay_with, pay_token) = match v.pay {
        PayRequest::Asset => ("asset", None),
        PayRequest::Erc20 { token } => ("erc20", Some(address_text(token))),
        PayRequest::Native => ("native", None),
    };
    DistributionDto {
        id: v.id,
        asset_id: v.asset_id,
        snapshot_id: v.snapshot_id,
        record_block: v.record_block,
        pay_with: pay_with.to_owned(),
        pay_token,
        basis: v.basis.to_owned(),
        amount_base_units: v.amount.to_string(),
        rounding: v.rounding.to_owned(),
        exclusions: v.exclusions.into_iter().map(address_text).collect(),
        holder_count: v.holder_count,
        total_due: v.total_due.map(|t| t.to_string()),
        remainder: v.remainder.map(|t| t.to_string()),
        progress: DistributionProgressDto {
            paid: tally(v.progress.paid),
            pending: tally(v.progress.pending),
            refused: tally(v.progress.refused),
            excluded: tally(v.progress.excluded),
            zero: tally(v.progress.zero),
            batches_paid: v.progress.batches_paid,
        },
        operation: v.operation.into(),
        created_at: v.created_at,
        completed_at: v.completed_at,
        paused_at: v.paused_at,
        payments_url: format!("/v1/distributions/{}/payments", v.id),
    }
}

fn payment(p: PaymentView) -> PaymentDto {
    PaymentDto {
        holder: address_text(p.holder),
        balance: p.balance.to_string(),
        amount: p.amount.to_string(),
        state: p.state,
        batch: p.batch,
        tx_hash: p.tx_hash.map(|h| h.to_string()),
        block: p.block,
        reason: p.reason,
    }
}

/// Pay a distribution to the holders of a final snapshot.
///
/// Starts `distribution.pay`: the shares are computed from the sealed snapshot with the
/// named rounding rule, the paying account's funds are checked (a distribution waits
/// for funds until the template's funding deadline when the template enables the
/// funding pause), a distribution under the template's approval rule waits for an
/// approval by another key, and the holders are paid in batches through the platform's
/// `BatchPay` contract, each batch one transaction, exactly once per holder. A
/// recipient the paying token refuses is left out of its batch and reported. Same
/// idempotency and `Prefer: wait` rules as every operation-creating `POST`; the
/// operation's id is the distribution's (`GET /v1/distributions/{id}`).
#[utoipa::path(
    post,
    path = "/v1/distributions",
    tag = "distributions",
    operation_id = "createDistribution",
    request_body(content = CreateDistributionRequest, content_type = "application/json"),
    params(
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<CreateDistributionRequest>,
) -> Result<Response, Problem> {
    let asset_id = parse_id(&body.asset_id, "asset")?;
    let snapshot_id = parse_id(&body.snapshot_id, "snapshot")?;
    let pay = match (body.pay_with.as_str(), body.pay_token.as_deref()) {
        ("asset", None) => PayRequest::Asset,
        ("native", None) => PayRequest::Native,
        ("erc20", Some(t)) => PayRequest::Erc20 {
            token: parse_address(t, "payToken")?,
        },
        ("erc20", None) => {
            return Err(Problem::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_FIELD",
                "field `payToken`: required when payWith is erc20",
            ));
        }
        ("asset" | "native", Some(_)) => {
            return Err(Problem::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_FIELD",
                "field `payToken`: only with payWith erc20",
            ));
        }
        _ => {
            return Err(Problem::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_FIELD",
                "field `payWith`: must be asset, erc20 or native",
            ));
        }
    };
    let exclusions = body
        .exclusions
        .unwrap_or_default()
        .iter()
        .map(|a| parse_address(a, "exclusions"))
        .collect::<Result<Vec<_>, _>>()?;
    let max_batch_size = match body.max_batch_size {
        None => None,
        Some(n) => Some(u32::try_from(n).map_err(|_| {
            Problem::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_FIELD",
                "field `maxBatchSize`: must be 1 to 500",
            )
        })?),
    };
    let req = NewDistribution {
        asset_id,
        snapshot_id,
        pay,
        basis: body.basis,
        amount: body.amount_base_units,
        rounding: body.rounding.unwrap_or_else(|| "floor".to_owned()),
        exclusions,
        max_batch_size,
    };
    let (created, view) = state.ops().distribution_create(caller, &key, &req).await?;
    Ok(answer(&state, caller, view.operation, Some(created), wait).await)
}

/// One distribution: its plan (holders, total due, remainder), progress and operation.
#[utoipa::path(
    get,
    path = "/v1/distributions/{id}",
    tag = "distributions",
    operation_id = "getDistribution",
    params(("id" = Uuid, Path, description = "Distribution id (its operation's id)")),
    responses(
        (status = 200, description = "The distribution.", body = DistributionDto),
        DistributionReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "distribution")?;
    let view = state.ops().distribution(caller, id).await?;
    Ok(Json(dto(view)).into_response())
}

/// Pause a distribution before its next batch.
///
/// The workflow holds before it queues its next batch (a batch already queued lands and
/// settles) until `POST /v1/distributions/{id}/resume`; `pausedAt` says since when, the
/// operation's `progress.phase` is `paused` once it holds. Pausing a paused
/// distribution changes nothing. No idempotency key: the call is idempotent.
#[utoipa::path(
    post,
    path = "/v1/distributions/{id}/pause",
    tag = "distributions",
    operation_id = "pauseDistribution",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(("id" = Uuid, Path, description = "Distribution id (its operation's id)")),
    responses(
        (status = 200, description = "The distribution, paused.", body = DistributionDto),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "distribution")?;
    let view = state.ops().distribution_pause(caller, id).await?;
    Ok(Json(dto(view)).into_response())
}

/// Resume a paused distribution.
///
/// Clears the pause and wakes the workflow (a `resume` signal its history records with
/// the caller's key), which goes on with its next batch. Resuming a distribution that is
/// not paused changes nothing.
#[utoipa::path(
    post,
    path = "/v1/distributions/{id}/resume",
    tag = "distributions",
    operation_id = "resumeDistribution",
    request_body(content = EmptyRequest, content_type = "application/json", description = "Optional: an empty body, or `{}`."),
    params(("id" = Uuid, Path, description = "Distribution id (its operation's id)")),
    responses(
        (status = 200, description = "The distribution, resumed.", body = DistributionDto),
        WriteErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn resume(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    JsonBody(_): JsonBody<EmptyRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "distribution")?;
    let view = state.ops().distribution_resume(caller, id).await?;
    Ok(Json(dto(view)).into_response())
}

/// A distribution's payments, one per holder of its snapshot, in ascending holder
/// order: amount, state, batch, transaction.
#[utoipa::path(
    get,
    path = "/v1/distributions/{id}/payments",
    tag = "distributions",
    operation_id = "listDistributionPayments",
    params(("id" = Uuid, Path, description = "Distribution id"), PageParams),
    responses(
        (status = 200, description = "A page of payments.", body = PaymentList),
        DistributionReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn payments(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let id = parse_id(&id, "distribution")?;
    let after = page
        .cursor::<String>()?
        .map(|c| parse_address(&c, "cursor").map_err(|_| crate::page::invalid_cursor()))
        .transpose()?;
    let rows = state
        .ops()
        .distribution_payments(caller, id, after, limit + 1)
        .await?;
    let page = Page::from_rows(rows, limit, |p| address_text(p.holder)).map(payment);
    Ok(Json(PaymentList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// The distributions of an asset, newest first.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/distributions",
    tag = "distributions",
    operation_id = "listDistributions",
    params(("id" = Uuid, Path, description = "Asset id"), PageParams),
    responses(
        (status = 200, description = "A page of distributions.", body = DistributionList),
        DistributionReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let id = parse_id(&id, "asset")?;
    let after = page.cursor::<(DateTime<Utc>, Uuid)>()?;
    let rows = state
        .ops()
        .distributions(caller, id, after, limit + 1)
        .await?;
    let page = Page::from_rows(rows, limit, |d| (d.created_at, d.id)).map(dto);
    Ok(Json(DistributionList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
    .into_response())
}
