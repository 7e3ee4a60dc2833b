//! # keel-api
//!
//! Keel's Platform API: the HTTP layer (axum 0.8) over the operations service
//! [`keel_workflows::Ops`] (operations, tenancy, ledger reads, status, the custody
//! wake), keel-aa's `AaService` (user operations, the bundler route) and keel-webhooks
//! (endpoints): no SQL and no other crate's store here. The wire format is owned by [`dto`] (converted from the service's views). [`router`] builds the whole API from an [`ApiState`]; the
//! binary serves it with `axum::serve` and flips the readiness flag.
//!
//! ## Routes (JSON, camelCase)
//!
//! | route | service call | answer |
//! |---|---|---|
//! | `POST /v1/assets` | `Ops::create_asset` | `202` operation (+`created`, `statusUrl`, `Location`); `200` when terminal |
//! | `POST /v1/assets/{id}/mint`, `/transfer`, `/pause`, `/unpause` | `Ops::token_operation` | as above |
//! | `POST /v1/assets/{id}/burn` (`amount`; optional `from`: a forced burn of that holder's tokens, needs the `burner` role) | `Ops::token_operation` (`asset.burn`) | as above |
//! | `POST /v1/assets/{id}/grant-role`, `/revoke-role` (`role`: `minter`, `pauser`, `burner`; `account`) | `Ops::token_operation` (`asset.grant-role`, `asset.revoke-role`) | as above |
//! | `POST /v1/operations/{id}/approve`, `/reject` | `Ops::decide_approval` | `202`/`200` operation |
//! | `POST /v1/operations/{id}/retry` | `Ops::retry` | `202`/`200` operation |
//! | `POST /v1/operations/{id}/cancel` | `Ops::cancel` | `202`/`200` operation |
//! | `GET /v1/operations/{id}` | `Ops::operation` | operation |
//! | `GET /v1/operations` (`?state=&kind=&assetId=&createdAfter=&createdBefore=&limit=&cursor=`) | `Ops::operations` | page of operations, oldest first |
//! | `GET /v1/assets` (`?limit=&cursor=`) | `Ops::assets` | page of assets, oldest first |
//! | `GET /v1/assets/{id}` (`?minBlock=N&waitSeconds=S`) | `Ops::asset` | asset |
//! | `GET /v1/templates` (`?limit=&cursor=`) | `Ops::templates` | page of asset templates, by id |
//! | `GET /v1/assets/{id}/balances/{address}` (same query, and `?atBlock=N`: the balance as of a block) | `Ops::balance` | balance |
//! | `GET /v1/assets/{id}/holders` (`?atBlock=N&limit=&cursor=`) | `Ops::holders` | holders as of a block ([`ledger`]) |
//! | `GET /v1/assets/{id}/transfers`, `GET /v1/assets/{id}/holders/{address}/transfers` (`?limit=&cursor=`) | `Ops::transfers` | transfers, newest first |
//! | `GET /v1/assets/{id}/supply` (`?atBlock=N`) | `Ops::supply` | supply as of a block |
//! | `POST /v1/organizations/{id}/system`, `GET …/systems`, `POST …/systems/{systemId}/enable\|disable` | `Ops::org_system*` | organization systems ([`org_systems`]) |
//! | `POST /v1/distributions`, `GET /v1/distributions/{id}`, `…/payments`, `GET /v1/assets/{id}/distributions` | `Ops::distribution*` | distributions to a snapshot's holders ([`distributions`]) |
//! | `POST`/`GET /v1/assets/{id}/snapshots`, `GET …/snapshots/{snapshotId}`, `…/holders`, `…/export` | `Ops::snapshot_*` | record-date snapshots as objects ([`snapshots`]) |
//! | `GET /v1/funding-requests` (`?chainId=N`) | `Ops::funding_requests` (scoped to the caller's operations) | funding requests |
//! | `GET /v1/api-keys` (`?limit=N&cursor=C`) | `Ops::api_keys` | one page of the organization's keys (never a secret) |
//! | `POST /v1/api-keys` | `Ops::create_api_key` | `201` key + token (shown once) |
//! | `POST /v1/api-keys/{id}/revoke` | `Ops::revoke_api_key` | the key (both secrets stop at once) |
//! | `POST /v1/api-keys/{id}/rotate` (`{"expiresInSeconds": N}`) | `Ops::rotate_api_key` | key + new token (shown once) |
//! | `POST /v1/chains/{chain}/bundler` | `AaService::rpc` | JSON-RPC 2.0 (ERC-7769) answer ([`user_ops`]) |
//! | `POST /v1/user-operations` | `AaService::send` | `202` `{userOpHash, operationId, created}` |
//! | `GET /v1/user-operations/{hash}` | `AaService::user_operation` | state, bundle transaction, outcome |
//! | `GET /v1/status` (an `admin` key) | `Ops::platform_status` | Platform Status, from the database only ([`status`]) |
//! | `POST /v1/chains/{chain}/index/reindex` (an `admin` key; `{"fromBlock": N}` optional) | `Ops::reindex_chain` | `202`: the chain's Ledger Index re-index started ([`index`]) |
//! | `GET /status` (+ `POST /status/login`, `/status/logout`) | `Ops::platform_status` | the status page (HTML; bearer or the login form's cookie; [`status`]) |
//! | `GET /healthz`, `GET /readyz`, `GET /openapi.json` | —, `Ops::check_ready`, — | liveness, readiness, [`openapi`] |
//!
//! Lists are cursor-paginated ([`page`]): `{data, hasMore, nextCursor}`, `limit` 1 to
//! 200 (default 50), `nextCursor` passed back as `cursor`. Every resource carries its
//! timestamps (`createdAt`, `updatedAt`; operations also `completedAt`, milestones
//! their times), RFC 3339 UTC; every address is EIP-55 checksummed
//! ([`dto::address_text`]); an operation's `result` is typed by its kind
//! ([`dto::OperationResult`]).
//!
//! Operation-creating POSTs require `Idempotency-Key` (`400 IDEMPOTENCY_KEY_REQUIRED`).
//! Every POST honours `Prefer: wait=<seconds>` (RFC 7240, capped at 60 s): `200` with
//! `Preference-Applied: wait=N` when the operation is terminal within that time, else
//! `202` exactly as without it; malformed preferences are ignored.
//!
//! ## Auth, scopes and tenancy
//! `Authorization: Bearer <api key>`; missing, invalid, revoked or rotated-away keys →
//! `401 UNAUTHENTICATED`. Every route requires one scope, declared in ONE table,
//! [`scope::ROUTES`] (`GET` → `read`; operation-creating `POST`s, retry, cancel →
//! `operate`; approve, reject → `approve`; `/v1/api-keys*` → `admin`; the health
//! routes and `/openapi.json` are public). The authorization layer
//! ([`scope::authorize`], a `route_layer` keyed by the matched route template and
//! method) authenticates the key ([`keel_workflows::Ops::authenticate_credential`],
//! read from the database on every request — no cache, so a revoke answers `401` to
//! the next request) and refuses a key without the scope with `403
//! INSUFFICIENT_SCOPE` before any extractor or handler runs; the handlers get the
//! caller from [`extract::Authed`] / [`extract::Authorized`]. The OpenAPI document's
//! `security` requirements and `403` answers are generated from the same table. **To
//! add a route**: register it in [`router`] and add one line to [`scope::ROUTES`]
//! (a served route missing from the table answers `500`; a documented one fails the
//! test `every_documented_route_declares_its_scope`).
//!
//! ### Rate limits
//! Right after a key is authenticated and found to hold the route's scope, the layer
//! admits the request against the key's and then the organization's request rate limit
//! ([`rate_limit`], [`ApiConfig::rate_limits`]; `[api.rateLimit]` of the binary's
//! configuration): over a limit → `429 RATE_LIMITED` with `Retry-After` and the
//! `RateLimit` / `RateLimit-Policy` fields of draft-ietf-httpapi-ratelimit-headers,
//! which every admitted answer of a keyed route carries too. Public routes and the
//! status page are never limited; the limits are per api replica.
//!
//! The operations service scopes every read and write to the caller's organization:
//! other organizations' ids (API keys included) answer `404 NOT_FOUND`.
//!
//! ### Key lifecycle
//! A key is created (`POST /v1/api-keys` with an `admin` key, only with scopes the
//! calling key holds; or `keel api-key create`), shown once, stored as SHA-256.
//! Rotation (`POST /v1/api-keys/{id}/rotate`, `keel api-key rotate`) keeps the key's
//! id, label and scopes and issues a new secret: the old one stops at once, or — with
//! `expiresInSeconds` (≤ 7 days, as Stripe's rolled keys) — keeps working until then;
//! one previous secret at most (rotating again ends the older one at once). Revocation
//! (`POST /v1/api-keys/{id}/revoke`, `keel api-key revoke`) stops both secrets at once.
//!
//! ## Errors
//! Every error is an `application/problem+json` [`Problem`] with a stable `code`,
//! `retryable` and a value-free `detail`; every code with its status and meaning is in
//! [`codes::ERROR_CODES`] (rendered into the OpenAPI document and `docs/error-codes.md`). Service errors keep their
//! `OpsError::{code, retryable, detail}`; their HTTP status is this crate's mapping
//! ([`problem::ops_status`]). Request-level errors (see
//! [`extract::JsonBody`]): body over [`ApiConfig::max_body_bytes`] → `413
//! PAYLOAD_TOO_LARGE`; non-JSON media type → `415 UNSUPPORTED_MEDIA_TYPE`; nesting
//! deeper than 64 → `400 JSON_TOO_DEEP` (counted on the raw bytes, without recursion,
//! before parsing); bad syntax → `400 MALFORMED_JSON`; unknown members → `400
//! UNKNOWN_FIELD`; a member that appears more than once (whatever its copies hold, in
//! any order) → `400 INVALID_FIELD` naming it; missing members, wrong types and JSON
//! numbers where decimal strings are expected → `400 INVALID_FIELD`; bad addresses → `422 INVALID_ADDRESS`;
//! unknown role names → `422 UNKNOWN_ROLE`; malformed path ids → `404 NOT_FOUND`; bad query values (integers, `limit`, list
//! filters) → `400 INVALID_QUERY`; a query parameter the route does not declare →
//! `400 UNKNOWN_QUERY_PARAMETER` on every route ([`scope::check_query`], the accepted
//! names read from this document); a cursor a list did not issue → `400 INVALID_CURSOR`;
//! unknown routes → `404`, wrong methods → `405 METHOD_NOT_ALLOWED`; a panicking
//! handler → `500 INTERNAL` (a bug; never caused by input by design).
//!
//! Every route with a JSON-object body (webhook endpoints and user operations
//! included) reads it with [`extract::JsonBody`]; the two whose body is not such an
//! object (the bundler's JSON-RPC, a signed custody-provider webhook) read it with
//! [`extract::RawBody`] — both answer an oversized body with the `413` problem.
//! Bodies are validated in one streaming pass straight from the bytes
//! ([`extract::parse_body`]): no `serde_json::Value` of the body is built, so what a
//! body costs in memory is bounded by the schema plus one copy of its string members —
//! at the largest configurable limit (16 MiB) a body of millions of small values costs
//! under 1 MiB beyond its bytes (test `tests/body_memory.rs`; a `Value` of the same body
//! costs hundreds of MiB).
//!
//! ## Layers
//! Authorization (a `route_layer`: [`scope::authorize`]), body limit
//! (`axum::extract::DefaultBodyLimit`, read by the body extractor), request
//! tracing (`tower_http::trace::TraceLayer`, `Authorization` marked sensitive) and a
//! catch-panic layer answering a problem.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod codes;
pub mod compliance;
pub mod custody;
pub mod distributions;
pub mod dto;
pub mod extract;
mod handlers;
pub mod index;
mod keys;
pub mod ledger;
pub mod metrics;
mod openapi;
pub mod org_systems;
pub mod page;
pub mod problem;
pub mod rate_limit;
pub mod scope;
pub mod snapshots;
// Platform Status (issue 22).
pub mod status;
// ERC-4337 user operations (issue 20).
pub mod user_ops;
// Webhooks (issue 21).
pub mod webhooks;

pub use dto::status_url;
pub use openapi::{openapi, openapi_json};
pub use problem::Problem;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use keel_workflows::Ops;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

/// Default request body limit: 256 KiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 262_144;

/// Default wait of `?minBlock=N` reads when `waitSeconds` is not given: 10 s.
pub const DEFAULT_MIN_BLOCK_WAIT: Duration = Duration::from_secs(10);

/// Request-level settings of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiConfig {
    /// Largest accepted request body, bytes (default [`DEFAULT_MAX_BODY_BYTES`]);
    /// larger bodies answer `413 PAYLOAD_TOO_LARGE`.
    pub max_body_bytes: usize,
    /// How long a `?minBlock=N` read waits for the index when the request gives no
    /// `waitSeconds` (default [`DEFAULT_MIN_BLOCK_WAIT`]; any wait is capped at 60 s).
    pub min_block_wait: Duration,
    /// What Platform Status (`GET /v1/status`, `/status`) looks for: the pending and
    /// no-mutation thresholds and the list limit (default
    /// [`keel_workflows::ops::status::StatusQuery::default`]).
    pub status: keel_workflows::ops::status::StatusQuery,
    /// How the status judges each indexed chain ([`IndexStatusConfig`]).
    pub index_status: IndexStatusConfig,
    /// Per-API-key and per-organization request rate limits of the keyed routes
    /// ([`rate_limit`]; default: none).
    pub rate_limits: rate_limit::RateLimitConfig,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            min_block_wait: DEFAULT_MIN_BLOCK_WAIT,
            status: keel_workflows::ops::status::StatusQuery::default(),
            index_status: IndexStatusConfig::default(),
            rate_limits: rate_limit::RateLimitConfig::default(),
        }
    }
}

/// How Platform Status judges an indexed chain (issue 32 §7): it reads the chain's head
/// from the node itself (not only the tip owner's last observation, which stops when
/// the owner stops) and marks the chain red when it is degraded, has no live tip owner,
/// has no fresh head, or lags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStatusConfig {
    /// How long one head read of a chain's node may take (default 2 s); a read that
    /// fails or times out leaves the owner's observation as the only head.
    pub head_read_timeout: Duration,
    /// An owner observation older than this (default 30 s; a live owner re-records every
    /// 5 s) means no live owner; with no node read either, the head is stale.
    pub stale_after: Duration,
    /// Blocks of lag still green (default 2: a block may arrive between the tip's commit
    /// and the status read).
    pub lag_tolerance_blocks: u64,
}

impl Default for IndexStatusConfig {
    fn default() -> Self {
        Self {
            head_read_timeout: Duration::from_secs(2),
            stale_after: Duration::from_secs(30),
            lag_tolerance_blocks: 2,
        }
    }
}

/// What the handlers share: the operations service, the readiness flag and the
/// request-level settings. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ApiState {
    ops: Ops,
    ready: Arc<AtomicBool>,
    config: ApiConfig,
    /// The webhook endpoint service (issue 21); without it the webhook routes answer 404.
    webhooks: Option<keel_webhooks::Webhooks>,
    /// The user-operation service (issue 20); without it the bundler and
    /// `/v1/user-operations` routes answer 404.
    user_operations: Option<keel_aa::service::AaService>,
    /// Inbound custody-provider webhooks (issue 19); without it their route answers 404.
    custody: Option<custody::CustodyWebhooks>,
    /// The chains' nodes Platform Status reads heads from (by chain id), independently
    /// of the index's tip owner.
    chain_heads: Arc<std::collections::HashMap<u64, Arc<keel_chain::UpstreamPool>>>,
    /// The request rate limiters of `config.rate_limits`, shared by every request.
    rate_limits: Arc<rate_limit::RateLimits>,
}

impl ApiState {
    /// A state over `ops` with default [`ApiConfig`]. `ready` is the readiness flag the
    /// binary sets once started and clears first on shutdown; `/readyz` answers `200`
    /// only while it is set (and the database is reachable and migrated).
    pub fn new(ops: Ops, ready: Arc<AtomicBool>) -> Self {
        Self {
            ops,
            ready,
            config: ApiConfig::default(),
            webhooks: None,
            user_operations: None,
            custody: None,
            chain_heads: Arc::default(),
            rate_limits: Arc::new(rate_limit::RateLimits::new(
                rate_limit::RateLimitConfig::default(),
            )),
        }
    }

    /// The same state reading chain heads for Platform Status from `nodes` (one per
    /// chain; [`IndexStatusConfig`]).
    pub fn with_chain_heads(
        mut self,
        nodes: impl IntoIterator<Item = Arc<keel_chain::UpstreamPool>>,
    ) -> Self {
        self.chain_heads = Arc::new(nodes.into_iter().map(|n| (n.chain().get(), n)).collect());
        self
    }

    /// The node of `chain` Platform Status reads heads from, when configured.
    pub fn chain_head_node(&self, chain: u64) -> Option<&Arc<keel_chain::UpstreamPool>> {
        self.chain_heads.get(&chain)
    }

    /// The same state serving `POST /v1/custody/webhooks/fireblocks` through `custody`.
    pub fn with_custody_webhooks(mut self, custody: custody::CustodyWebhooks) -> Self {
        self.custody = Some(custody);
        self
    }

    /// The inbound custody webhooks, when configured.
    pub fn custody_webhooks(&self) -> Option<&custody::CustodyWebhooks> {
        self.custody.as_ref()
    }

    /// The same state serving `/v1/webhook-endpoints` through `webhooks`.
    pub fn with_webhooks(mut self, webhooks: keel_webhooks::Webhooks) -> Self {
        self.webhooks = Some(webhooks);
        self
    }

    /// The same state serving the bundler JSON-RPC route and `/v1/user-operations`
    /// through `service`.
    pub fn with_user_operations(mut self, service: keel_aa::service::AaService) -> Self {
        self.user_operations = Some(service);
        self
    }

    /// The user-operation service, when configured.
    pub fn user_operations(&self) -> Option<&keel_aa::service::AaService> {
        self.user_operations.as_ref()
    }

    /// The webhook endpoint service, when configured.
    pub fn webhooks(&self) -> Option<&keel_webhooks::Webhooks> {
        self.webhooks.as_ref()
    }

    /// The same state with `config`: its rate limiters are built afresh (every
    /// bucket full) and the configured limits exported as gauges ([`metrics`]).
    pub fn with_config(mut self, config: ApiConfig) -> Self {
        self.config = config;
        self.rate_limits = Arc::new(rate_limit::RateLimits::new(config.rate_limits));
        metrics::rate_limits_configured(&config.rate_limits);
        self
    }

    /// The request rate limiters ([`rate_limit`]).
    pub fn rate_limits(&self) -> &rate_limit::RateLimits {
        &self.rate_limits
    }

    /// The operations service.
    pub fn ops(&self) -> &Ops {
        &self.ops
    }

    /// The readiness flag.
    pub fn ready_flag(&self) -> &Arc<AtomicBool> {
        &self.ready
    }

    /// Whether the readiness flag is set.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The request-level settings.
    pub fn config(&self) -> &ApiConfig {
        &self.config
    }
}

/// The Platform API (every route of the crate docs) with its layers: authorization by
/// [`scope::ROUTES`], body limit, catch-panic, request metrics ([`metrics`]), tracing; unknown routes answer `404 NOT_FOUND`, wrong methods `405
/// METHOD_NOT_ALLOWED`, both as problems.
pub fn router(state: ApiState) -> Router {
    let max_body = state.config.max_body_bytes;
    Router::new()
        .route(
            "/v1/assets",
            post(handlers::create_asset).get(handlers::assets),
        )
        .route("/v1/assets/{id}", get(handlers::asset))
        .route("/v1/assets/{id}/mint", post(handlers::mint))
        .route("/v1/assets/{id}/transfer", post(handlers::transfer))
        .route("/v1/assets/{id}/pause", post(handlers::pause))
        .route("/v1/assets/{id}/unpause", post(handlers::unpause))
        .route("/v1/assets/{id}/burn", post(handlers::burn))
        .route("/v1/assets/{id}/grant-role", post(handlers::grant_role))
        .route("/v1/assets/{id}/revoke-role", post(handlers::revoke_role))
        .route(
            "/v1/assets/{id}/set-compliance",
            post(compliance::set_compliance),
        )
        .route("/v1/assets/{id}/freeze", post(agent::freeze))
        .route("/v1/assets/{id}/unfreeze", post(agent::unfreeze))
        .route(
            "/v1/assets/{id}/forced-transfer",
            post(agent::forced_transfer),
        )
        .route("/v1/assets/{id}/recover", post(agent::recover))
        .route("/v1/assets/{id}/batch-mint", post(agent::batch_mint))
        .route(
            "/v1/assets/{id}/batch-transfer",
            post(agent::batch_transfer),
        )
        .route("/v1/assets/{id}/balances/{address}", get(handlers::balance))
        .route("/v1/assets/{id}/holders", get(ledger::holders))
        .route(
            "/v1/assets/{id}/holders/{address}/transfers",
            get(ledger::holder_transfers),
        )
        .route("/v1/assets/{id}/transfers", get(ledger::transfers))
        .route("/v1/assets/{id}/supply", get(ledger::supply))
        .route(
            "/v1/assets/{id}/snapshots",
            post(snapshots::create).get(snapshots::list),
        )
        .route(
            "/v1/assets/{id}/snapshots/{snapshotId}",
            get(snapshots::get),
        )
        .route(
            "/v1/assets/{id}/snapshots/{snapshotId}/holders",
            get(snapshots::holders),
        )
        .route(
            "/v1/assets/{id}/snapshots/{snapshotId}/export",
            get(snapshots::export),
        )
        .route("/v1/assets/{id}/distributions", get(distributions::list))
        .route("/v1/organizations/{id}/system", post(org_systems::deploy))
        .route("/v1/organizations/{id}/systems", get(org_systems::list))
        .route(
            "/v1/organizations/{id}/investors",
            post(org_systems::set_investor),
        )
        .route(
            "/v1/organizations/{id}/systems/{systemId}/enable",
            post(org_systems::enable),
        )
        .route(
            "/v1/organizations/{id}/systems/{systemId}/disable",
            post(org_systems::disable),
        )
        .route("/v1/distributions", post(distributions::create))
        .route("/v1/distributions/{id}", get(distributions::get))
        .route("/v1/distributions/{id}/pause", post(distributions::pause))
        .route("/v1/distributions/{id}/resume", post(distributions::resume))
        .route(
            "/v1/distributions/{id}/payments",
            get(distributions::payments),
        )
        .route("/v1/operations", get(handlers::operations))
        .route("/v1/templates", get(handlers::templates))
        .route("/v1/operations/{id}", get(handlers::operation))
        .route(
            "/v1/operations/{id}/history",
            get(handlers::operation_history),
        )
        .route("/v1/operations/{id}/approve", post(handlers::approve))
        .route("/v1/operations/{id}/reject", post(handlers::reject))
        .route("/v1/operations/{id}/retry", post(handlers::retry))
        .route("/v1/operations/{id}/cancel", post(handlers::cancel))
        .route("/v1/funding-requests", get(handlers::funding_requests))
        .route("/v1/api-keys", get(keys::list).post(keys::create))
        .route("/v1/api-keys/{id}/revoke", post(keys::revoke))
        .route("/v1/api-keys/{id}/rotate", post(keys::rotate))
        // Webhooks (issue 21).
        .route(
            "/v1/webhook-endpoints",
            post(webhooks::create).get(webhooks::list),
        )
        .route(
            "/v1/webhook-endpoints/{id}",
            get(webhooks::get)
                .patch(webhooks::update)
                .delete(webhooks::delete),
        )
        .route(
            "/v1/webhook-endpoints/{id}/rotate-secret",
            post(webhooks::rotate),
        )
        .route("/v1/webhook-endpoints/{id}/test", post(webhooks::test))
        .route(
            "/v1/webhook-endpoints/{id}/deliveries",
            get(webhooks::deliveries),
        )
        // ERC-4337 user operations (issue 20).
        .route("/v1/chains/{chain}/bundler", post(user_ops::bundler_rpc))
        .route("/v1/user-operations", post(user_ops::submit))
        .route("/v1/user-operations/{hash}", get(user_ops::get))
        // Platform Status (issue 22): the JSON route; the page is merged below.
        .route("/v1/status", get(status::get_status))
        .route("/v1/chains/{chain}/index/reindex", post(index::reindex))
        .route(
            "/v1/custody/webhooks/fireblocks",
            post(custody::fireblocks_webhook),
        )
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .route("/openapi.json", get(handlers::openapi_json))
        // After every route, before the fallbacks: runs for matched routes only.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            scope::authorize,
        ))
        // The status page checks its own credential (bearer or cookie; see [`status`]).
        .route("/status", get(status::page))
        .route("/status/login", post(status::login))
        .route("/status/logout", post(status::logout))
        .fallback(|| async { Problem::not_found("route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "the route does not support this method",
            )
        })
        .with_state(state)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(CatchPanicLayer::custom(
            |_panic: Box<dyn std::any::Any + Send>| {
                tracing::error!("a request handler panicked");
                Problem::internal().into_response()
            },
        ))
        .layer(axum::middleware::from_fn(metrics::layer))
        .layer(TraceLayer::new_for_http())
        .layer(SetSensitiveRequestHeadersLayer::new([
            header::AUTHORIZATION,
        ]))
}
