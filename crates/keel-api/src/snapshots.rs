//! Record-date snapshots of an asset as objects (issue 36 §2): their wire shapes and
//! handlers.
//!
//! | route | service call | answer |
//! |---|---|---|
//! | `POST /v1/assets/{id}/snapshots` (`{"atBlock": N}`) | `Ops::snapshot_create` | `201` [`SnapshotDto`] (new) or `200` (the one of that block) |
//! | `GET /v1/assets/{id}/snapshots` (`?limit=&cursor=`) | `Ops::snapshots` | [`SnapshotList`] |
//! | `GET /v1/assets/{id}/snapshots/{snapshotId}` | `Ops::snapshot` | [`SnapshotDto`] |
//! | `GET /v1/assets/{id}/snapshots/{snapshotId}/holders` (`?limit=&cursor=`) | `Ops::snapshot_holders` | [`SnapshotHolderList`] |
//! | `GET /v1/assets/{id}/snapshots/{snapshotId}/export` | `Ops::snapshot_rows`, streamed | `text/csv` |
//!
//! A snapshot is `pending` until its block is final on the asset's chain (its pages are
//! computed from the Ledger Index and can still change with a reorg; `pendingReason`
//! says what it waits for), then `final`: sealed once with `holderCount`, `total` and
//! `contentHash`, and immutable. The export of a final snapshot is its canonical CSV,
//! streamed page by page: the line `holder,balance`, then one line per holder in
//! ascending address order (EIP-55 checksummed address, balance in base units).
//! `contentHash` is its SHA-256 (FIPS 180-4): `sha256sum` of the downloaded file
//! equals it, and the answer carries it as `Repr-Digest` (RFC 9530) and `ETag`.

use crate::ApiState;
use crate::extract::{Authed, Field, FieldKind, JsonBody, RawPath, RequestBody, parse_id};
use crate::ledger::Holder;
use crate::page::{Page, PageParams};
use crate::problem::Problem;
use alloy_primitives::{Address, U256};
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::Query;
use axum::extract::State;
use axum::extract::rejection::QueryRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use keel_workflows::{PendingReason, SnapshotView};
use serde::{Deserialize, Serialize};
use utoipa::{IntoResponses, ToSchema};
use uuid::Uuid;

/// Rows read per page while an export streams.
const EXPORT_PAGE: u32 = 2_000;

/// The body of a snapshot creation: `{"atBlock": N}`, or empty / `{}` for the indexed
/// tip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateSnapshotRequest {
    /// The record date: balances as of this block (every canonical transfer at or below
    /// it). Default: the indexed tip. A block the index has not reached yet is accepted
    /// (a record date announced ahead): the snapshot stays pending until it is final.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub at_block: Option<u64>,
}

impl RequestBody for CreateSnapshotRequest {
    const FIELDS: &'static [Field] = &[Field {
        name: "atBlock",
        kind: FieldKind::UnsignedInteger,
    }];
    const OPTIONAL: &'static [&'static str] = &["atBlock"];
    const EMPTY_ALLOWED: bool = true;
}

/// Whether a snapshot can still change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum SnapshotState {
    /// Its block is not final yet (see `pendingReason`): pages are computed from the
    /// index and a reorg may still change them.
    Pending,
    /// Sealed: holders, count, total and hash never change again.
    Final,
}

/// What a pending snapshot waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum SnapshotPendingReason {
    /// The Ledger Index has not reached its block yet.
    NotIndexed,
    /// Its block is above the chain's finalized block.
    NotFinal,
    /// History below its block is still being indexed.
    HistoryIndexing,
    /// The chain's index is degraded or being re-indexed (an operator's re-index
    /// repairs it).
    IndexUnhealthy,
}

/// A record-date snapshot of an asset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotDto {
    /// The snapshot id.
    pub id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// The record date (block number).
    pub block: u64,
    /// `pending` or `final`.
    pub state: SnapshotState,
    /// What a pending snapshot waits for; null once final.
    pub pending_reason: Option<SnapshotPendingReason>,
    /// Holders with a positive balance; null while pending.
    pub holder_count: Option<u64>,
    /// Sum of the holders' balances in token units (decimal string); null while pending.
    #[schema(pattern = r"^[0-9]+(\.[0-9]+)?$")]
    pub total: Option<String>,
    /// The same in base units (decimal integer string).
    #[schema(pattern = "^[0-9]+$")]
    pub total_base_units: Option<String>,
    /// SHA-256 of the CSV export, `0x` + 64 hex digits; null while pending.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    pub content_hash: Option<String>,
    /// When it was created (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When it was sealed; null while pending.
    pub finalized_at: Option<DateTime<Utc>>,
    /// Its holders, ranked by balance.
    pub holders_url: String,
    /// Its CSV export (final snapshots).
    pub export_url: String,
}

/// `GET /v1/assets/{id}/snapshots`: snapshots of an asset, newest record date first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotList {
    /// Snapshots by `block` descending.
    pub data: Vec<SnapshotDto>,
    /// True when older snapshots follow.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}

/// `GET /v1/assets/{id}/snapshots/{snapshotId}/holders`: a page of a snapshot's holders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotHolderList {
    /// Holders with a positive balance, by balance descending, then address ascending.
    pub data: Vec<Holder>,
    /// True when more holders follow this page.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
    /// The snapshot as it was when this page was read (a pending one's page may differ
    /// from the final one after a reorg; walk a final snapshot for the immutable list).
    pub snapshot: SnapshotDto,
}

/// Errors of the snapshot routes (for the OpenAPI document; `403` is added by the
/// document's fixups).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum SnapshotErrors {
    /// `INVALID_QUERY` (`limit` outside 1..=200), `INVALID_CURSOR`; on creation
    /// `MALFORMED_JSON`, `JSON_TOO_DEEP`, `UNKNOWN_FIELD`, `INVALID_FIELD` (an `atBlock`
    /// that is not an integer from 0 to 2^63-1), `MALFORMED_BODY`.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// `UNAUTHENTICATED`: missing or invalid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `NOT_FOUND`: no such asset in the caller's organization, or no such snapshot of
    /// it.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// `ASSET_NOT_READY` (creation: the token does not exist yet), `BLOCK_NOT_INDEXED`
    /// (creation without `atBlock` before anything is indexed; holders of a pending
    /// snapshot whose block the index has not reached), `SNAPSHOT_NOT_FINAL` (export of
    /// a pending snapshot).
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// `PAYLOAD_TOO_LARGE`: the body exceeds the limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// `UNSUPPORTED_MEDIA_TYPE`: a body that is not `application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// `INVALID_FIELD`: an `atBlock` above 2^63-1.
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// `INDEX_UNAVAILABLE`, `SERVICE_UNAVAILABLE`; retryable.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

fn dto(s: SnapshotView) -> SnapshotDto {
    let base = format!("/v1/assets/{}/snapshots/{}", s.asset_id, s.id);
    SnapshotDto {
        id: s.id,
        asset_id: s.asset_id,
        block: s.block,
        state: if s.finalized {
            SnapshotState::Final
        } else {
            SnapshotState::Pending
        },
        pending_reason: s.pending_reason.map(|r| match r {
            PendingReason::NotIndexed => SnapshotPendingReason::NotIndexed,
            PendingReason::NotFinal => SnapshotPendingReason::NotFinal,
            PendingReason::HistoryIndexing => SnapshotPendingReason::HistoryIndexing,
            PendingReason::IndexUnhealthy => SnapshotPendingReason::IndexUnhealthy,
        }),
        holder_count: s.holder_count,
        total: s.total,
        total_base_units: s.total_base_units.map(|t| t.to_string()),
        content_hash: s.content_hash.map(|h| h.to_string()),
        created_at: s.created_at,
        finalized_at: s.finalized_at,
        holders_url: format!("{base}/holders"),
        export_url: format!("{base}/export"),
    }
}

fn bad_cursor() -> Problem {
    Problem::bad_request(
        "INVALID_CURSOR",
        "cursor is not one this list returned; pass nextCursor back unchanged",
    )
}

/// Create a record-date snapshot of an asset: the holders at `atBlock` (default: the
/// indexed tip). One snapshot per block: asking again for the same block answers the
/// existing one (`200`). It is sealed — final, immutable, with its holder count, total
/// and content hash — once its block is final on the asset's chain (at once when it
/// already is).
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/snapshots",
    tag = "assets",
    operation_id = "createSnapshot",
    params(("id" = Uuid, Path, description = "Asset id")),
    request_body(content = CreateSnapshotRequest, content_type = "application/json", description = "`{\"atBlock\": N}`; empty or `{}` for the indexed tip."),
    responses(
        (status = 201, description = "The snapshot was created.", body = SnapshotDto),
        (status = 200, description = "The asset's snapshot of that block already existed.", body = SnapshotDto),
        SnapshotErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    JsonBody(body): JsonBody<CreateSnapshotRequest>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "asset")?;
    if body.at_block.is_some_and(|b| i64::try_from(b).is_err()) {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_FIELD",
            "atBlock must be an integer from 0 to 2^63-1",
        ));
    }
    let (view, created) = state
        .ops()
        .snapshot_create(caller, id, body.at_block)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(dto(view))).into_response())
}

/// The snapshots of an asset, newest record date first.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/snapshots",
    tag = "assets",
    operation_id = "listSnapshots",
    params(("id" = Uuid, Path, description = "Asset id"), PageParams),
    responses(
        (status = 200, description = "A page of snapshots.", body = SnapshotList),
        SnapshotErrors,
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
    let before = match page.cursor::<u64>()? {
        Some(b) if i64::try_from(b).is_err() => return Err(bad_cursor()),
        c => c,
    };
    let rows = state.ops().snapshots(caller, id, before, limit + 1).await?;
    let page = Page::from_rows(rows, limit, |s| s.block).map(dto);
    Ok(Json(SnapshotList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// One snapshot of an asset (sealed first if its block became final).
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/snapshots/{snapshotId}",
    tag = "assets",
    operation_id = "getSnapshot",
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("snapshotId" = Uuid, Path, description = "Snapshot id"),
    ),
    responses(
        (status = 200, description = "The snapshot.", body = SnapshotDto),
        SnapshotErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, sid)): RawPath<(String, String)>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "asset")?;
    let sid = parse_id(&sid, "snapshot")?;
    let view = state.ops().snapshot(caller, id, sid).await?;
    Ok(Json(dto(view)).into_response())
}

/// The keyset of a snapshot holders page: (balance in base units, holder).
type HolderCursor = (String, Address);

/// The holders of a snapshot ranked by balance (descending, then address ascending).
/// A final snapshot's pages come from its own rows: the same list on every read, in
/// O(page size) whatever the token's history.
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/snapshots/{snapshotId}/holders",
    tag = "assets",
    operation_id = "listSnapshotHolders",
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("snapshotId" = Uuid, Path, description = "Snapshot id"),
        PageParams,
    ),
    responses(
        (status = 200, description = "A page of the snapshot's holders.", body = SnapshotHolderList),
        SnapshotErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn holders(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, sid)): RawPath<(String, String)>,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let id = parse_id(&id, "asset")?;
    let sid = parse_id(&sid, "snapshot")?;
    let after = match page.cursor::<HolderCursor>()? {
        None => None,
        Some((balance, holder)) => Some((
            U256::from_str_radix(&balance, 10).map_err(|_| bad_cursor())?,
            holder,
        )),
    };
    let view = state
        .ops()
        .snapshot_holders(caller, id, sid, after, limit + 1)
        .await?;
    let page = Page::from_rows(view.holders, limit, |h| -> HolderCursor {
        (h.balance_base_units.to_string(), h.address)
    })
    .map(crate::ledger::holder);
    Ok(Json(SnapshotHolderList {
        data: page.data,
        has_more: page.has_more,
        next_cursor: page.next_cursor,
        snapshot: dto(view.snapshot),
    })
    .into_response())
}

/// The CSV export of a final snapshot, streamed: `holder,balance`, then one line per
/// holder in ascending address order (EIP-55 checksummed address, balance in base
/// units). Its SHA-256 is the snapshot's `contentHash` (also sent as `Repr-Digest`,
/// RFC 9530, and `ETag`).
#[utoipa::path(
    get,
    path = "/v1/assets/{id}/snapshots/{snapshotId}/export",
    tag = "assets",
    operation_id = "exportSnapshot",
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("snapshotId" = Uuid, Path, description = "Snapshot id"),
    ),
    responses(
        (status = 200, description = "The snapshot's canonical CSV.", content_type = "text/csv", body = String),
        SnapshotErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn export(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath((id, sid)): RawPath<(String, String)>,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "asset")?;
    let sid = parse_id(&sid, "snapshot")?;
    let view = state.ops().snapshot_for_export(caller, id, sid).await?;
    let hash = view.content_hash.unwrap_or_default();
    let ops = state.ops().clone();
    // Chunks of the CSV by address; the state is `None` after the last one.
    let chunks = futures::stream::unfold(Some(None::<Address>), move |cursor| {
        let ops = ops.clone();
        async move {
            let after = cursor?;
            match ops.snapshot_csv_chunk(sid, after, EXPORT_PAGE).await {
                Ok((text, next)) => Some((Ok(Bytes::from(text)), next.map(Some))),
                Err(e) => {
                    // The client sees a cut-off body (its digest will not match).
                    tracing::warn!(error = %e, "snapshot export stopped: a page read failed");
                    Some((
                        Err(std::io::Error::other("snapshot page read failed")),
                        None,
                    ))
                }
            }
        }
    });
    let digest = base64::engine::general_purpose::STANDARD.encode(hash.0);
    let mut resp = Response::new(Body::from_stream(chunks));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"snapshot-{sid}.csv\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("sha-256=:{digest}:")) {
        h.insert("repr-digest", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{hash}\"")) {
        h.insert(header::ETAG, v);
    }
    Ok(resp)
}
