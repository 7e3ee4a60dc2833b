//! `POST /v1/chains/{chain}/index/reindex` (an `admin` key): an operator's re-index of a
//! chain's Ledger Index (issue 32 §2), the API twin of `keel index reindex`, linked
//! from the status page next to a degraded chain.

use crate::ApiState;
use crate::extract::{Authed, Field, FieldKind, JsonBody, RequestBody};
use crate::problem::Problem;
use axum::Json;
use axum::extract::{RawPathParams, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoResponses, ToSchema};

/// The body of a re-index: empty, `{}`, or `{"fromBlock": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReindexRequest {
    /// The first block to rebuild (default: the lowest `fromBlock` of the chain's
    /// configured index scope).
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub from_block: Option<u64>,
}

impl RequestBody for ReindexRequest {
    const FIELDS: &'static [Field] = &[Field {
        name: "fromBlock",
        kind: FieldKind::UnsignedInteger,
    }];
    const OPTIONAL: &'static [&'static str] = &["fromBlock"];
    const EMPTY_ALLOWED: bool = true;
}

/// A re-index that started.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReindexAccepted {
    /// The chain id.
    pub chain_id: u64,
    /// The first block rebuilt.
    pub from_block: u64,
    /// The tip-ingest owner epoch the re-index took (the running owner is fenced and
    /// starts over above it).
    pub epoch: i64,
    /// Whether the chain was marked degraded (the marker is cleared).
    pub was_degraded: bool,
    /// History ranges reaching the first block that were deleted and planned again.
    pub ranges_replanned: u64,
    /// Where to follow the rebuild: reads of the chain say `indexRebuilding: true`
    /// until it is done, and Platform Status shows the chain.
    pub status_url: String,
}

/// Errors of the re-index route (for the OpenAPI document; `403` is added by the
/// document's fixups).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum ReindexErrors {
    /// `MALFORMED_JSON`, `JSON_TOO_DEEP`, `UNKNOWN_FIELD`, `INVALID_FIELD` (a
    /// `fromBlock` that is not a non-negative integer, a duplicate member),
    /// `MALFORMED_BODY`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing, invalid, revoked or rotated-away API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: the chain was never indexed (or the id is not a number).
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `PAYLOAD_TOO_LARGE`: the body exceeds the limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// `UNSUPPORTED_MEDIA_TYPE`: a body that is not `application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// `SERVICE_UNAVAILABLE` (retryable): the database is unavailable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// Re-index a chain's Ledger Index: the way back from a degraded chain without SQL
/// (the same as `keel index reindex --chain NAME [--from-block N]`).
///
/// In one transaction: a new tip-ingest epoch (the running indexer's owner is fenced and
/// starts over), every indexed row at and above the first block deleted (holder
/// balances follow and are recomputed from the transfers), the chain's discovered
/// contracts and history ranges from there dropped, the degraded marker cleared. The
/// indexer role then rebuilds the chain; reads of it say `indexRebuilding: true` until
/// it is done. Safe while the indexer runs. Not idempotent: each request starts over.
/// The chain's index is shared by every organization: any `admin` key may re-index it.
#[utoipa::path(
    post,
    path = "/v1/chains/{chain}/index/reindex",
    tag = "status",
    operation_id = "reindexChain",
    params(("chain" = u64, Path, description = "Chain id")),
    request_body(content = ReindexRequest, content_type = "application/json", description = "Optional: an empty body, `{}`, or `{\"fromBlock\": N}`."),
    responses(
        (status = 202, description = "The re-index started; the indexer role rebuilds the chain.", body = ReindexAccepted),
        ReindexErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn reindex(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    params: RawPathParams,
    JsonBody(body): JsonBody<ReindexRequest>,
) -> Result<Response, Problem> {
    let chain: u64 = params
        .iter()
        .find(|(k, _)| *k == "chain")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| Problem::not_found("chain"))?;
    let done = state
        .ops()
        .reindex_chain(caller, keel_units::ChainId(chain), body.from_block)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(ReindexAccepted {
            chain_id: chain,
            from_block: done.from_block,
            epoch: done.epoch,
            was_degraded: done.was_degraded,
            ranges_replanned: done.ranges_cut,
            status_url: "/v1/status".to_owned(),
        }),
    )
        .into_response())
}
