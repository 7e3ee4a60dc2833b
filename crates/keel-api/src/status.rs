//! Platform Status (issue 22): `GET /v1/status` (JSON, an `admin` key) and the
//! server-rendered page `/status` (HTML with a little inline CSS; no script, nothing
//! loaded from elsewhere), both from [`keel_workflows::Ops::platform_status`], which
//! reads the database only: every api replica shows the same.
//!
//! ## The page's credential
//! An operator's browser cannot set an `Authorization` header, so the page takes the
//! admin key either way:
//! - `Authorization: Bearer <key>` (curl, a proxy that injects it);
//! - the cookie `keel_status`, set by the page's own login form: `GET /status`
//!   without a valid credential answers `401` with a form; `POST /status/login`
//!   (`key=<api key>`, form-encoded) checks the key (it must hold the `admin` scope)
//!   and answers `303` to `/status` with `Set-Cookie: keel_status=<key>; HttpOnly;
//!   SameSite=Lax; Path=/status; Max-Age=28800`; `POST /status/logout` clears it.
//!
//! The cookie holds the key itself (no server-side session: any replica accepts it,
//! and a revoked key stops working at the next request). It is not marked `Secure`
//! because Keel serves plain HTTP behind the TLS terminator; serve `/status` only over
//! HTTPS. The page sends `Content-Security-Policy: default-src 'none'; style-src
//! 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'`, `Cache-Control:
//! no-store` and `Referrer-Policy: no-referrer`.
//!
//! The page routes are outside [`crate::scope::ROUTES`] (they are not part of the
//! JSON API and its document) and check the credential themselves.

use crate::ApiState;
use crate::extract::Authed;
use crate::problem::Problem;
use axum::Form;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_workflows::ops::status::{CronOutcome, HealthInstance, PlatformStatus as View};
use keel_workflows::{OpsError, Scope};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};
use utoipa::{IntoResponses, ToSchema};
use uuid::Uuid;

/// The page's cookie.
pub const COOKIE: &str = "keel_status";

/// How long the page's cookie lives, seconds (8 h).
pub const COOKIE_MAX_AGE_SECS: u64 = 28_800;

fn secs(d: Duration) -> u64 {
    d.as_secs()
}

fn age(now: DateTime<Utc>, at: DateTime<Utc>) -> u64 {
    u64::try_from((now - at).num_seconds()).unwrap_or(0)
}

fn utc(t: SystemTime) -> DateTime<Utc> {
    DateTime::<Utc>::from(t)
}

/// The thresholds the status was read with.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusThresholds {
    /// A `pending` instance older than this many seconds is over the pending threshold.
    pub pending_seconds: u64,
    /// An open instance unchanged for longer than this many seconds is over the
    /// no-mutation threshold.
    pub no_mutation_seconds: u64,
    /// Items per list at most.
    pub limit: u32,
}

/// How many instances of a workflow are in a state.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStateCount {
    /// The workflow (`asset.create`, `asset.mint`, ...).
    pub workflow: String,
    /// The engine's run state (`pending`, `running`, `waiting`, `suspended`,
    /// `completed`, `failed`, `cancelled`).
    pub state: String,
    /// Instances.
    pub count: u64,
}

/// A workflow instance Platform Status points at.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusInstance {
    /// The instance id (for the asset workflows, the operation id).
    pub id: Uuid,
    /// Its workflow.
    pub workflow: String,
    /// Its run state.
    pub state: String,
    /// Started.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// Seconds since it started.
    pub age_seconds: u64,
    /// Seconds since it last changed.
    pub unchanged_seconds: u64,
    /// The operation it runs (the instance's idempotency key, for the operation
    /// workflows); null for other instances.
    pub operation_id: Option<Uuid>,
    /// The operation's API resource (`GET`, a `read` key), when there is one.
    pub operation_url: Option<String>,
}

/// A dead-lettered command.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusDeadLetter {
    /// Its instance.
    pub instance_id: Uuid,
    /// The instance's workflow.
    pub workflow: String,
    /// The command kind (`start`, `signal`, `timer`, `retry`, `cancel`).
    pub kind: String,
    /// The value-free code of its last failed attempt.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: DateTime<Utc>,
}

/// Workflows.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowsStatus {
    /// Instances by workflow and state.
    pub counts: Vec<WorkflowStateCount>,
    /// The oldest `running`, `waiting` and `suspended` instance of each workflow.
    pub oldest: Vec<StatusInstance>,
    /// Instances over the pending threshold.
    pub over_pending: u64,
    /// The oldest of them.
    pub over_pending_list: Vec<StatusInstance>,
    /// Open instances over the no-mutation threshold.
    pub over_no_mutation: u64,
    /// The least recently changed of them.
    pub over_no_mutation_list: Vec<StatusInstance>,
    /// Dead-lettered commands.
    pub dead_letters: u64,
    /// The most recent of them.
    pub dead_letter_list: Vec<StatusDeadLetter>,
    /// Open instances that no live runner can run ("waiting for a runner that knows
    /// version N"): deferred, never failed; a runner with the version in its range
    /// resumes them. Empty when every open instance has a runner.
    pub awaiting_runner: Vec<StatusVersionWait>,
}

/// Open instances of one workflow pinned to one version no live runner covers.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusVersionWait {
    /// The workflow.
    pub workflow: String,
    /// The code version they are pinned to (`Workflow::VERSION` of the release that
    /// started them); null: not pinned yet, because no live runner runs the workflow.
    pub version: Option<u32>,
    /// How many open instances wait.
    pub instances: u64,
    /// When the oldest of them was started.
    pub oldest_created_at: DateTime<Utc>,
    /// Seconds since then (database clock).
    pub oldest_age_seconds: u64,
}

/// One (chain, sender) of the transaction queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueSenderStatus {
    /// Chain id (decimal string).
    pub chain_id: String,
    /// The sender (EIP-55).
    pub sender: String,
    /// The next nonce the queue assigns.
    pub next_nonce: u64,
    /// Unsettled requests.
    pub depth: u64,
    /// Of them, waiting for funding.
    pub waiting_funding: u64,
    /// Of them, signed or broadcast.
    pub in_flight: u64,
    /// When the oldest unsettled request was enqueued.
    pub oldest_unsettled_at: Option<DateTime<Utc>>,
    /// Its age, seconds.
    pub oldest_unsettled_age_seconds: Option<u64>,
    /// Replacement attempts (fee bumps) in the last hour.
    pub replacements_last_hour: u64,
}

/// An open funding request.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusFundingRequest {
    /// The paused queue request.
    pub request_id: Uuid,
    /// Chain id (decimal string).
    pub chain_id: String,
    /// Where to send funds (the sender, EIP-55).
    pub address: String,
    /// At least this much, wei (decimal string).
    pub required_wei: String,
    /// Before this instant, else the request fails `FUNDING_DEADLINE_EXPIRED`.
    pub deadline: DateTime<Utc>,
}

/// Open funding requests.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FundingStatus {
    /// How many are open.
    pub open: u64,
    /// The oldest of them.
    pub data: Vec<StatusFundingRequest>,
}

/// History ranges of a chain by state.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RangeCounts {
    /// Waiting for a worker.
    pub pending: u64,
    /// Leased by a worker.
    pub leased: u64,
    /// Done.
    pub done: u64,
}

/// One chain of the Ledger Index.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexChainStatus {
    /// Chain id (decimal string).
    pub chain_id: String,
    /// The tip-ingest owner's fencing epoch.
    pub owner_epoch: u64,
    /// The indexed tip.
    pub tip: Option<u64>,
    /// The node's head at the owner's last observation.
    pub head: Option<u64>,
    /// When that observation was recorded.
    pub head_observed_at: Option<DateTime<Utc>>,
    /// Its age, seconds (re-recorded every few seconds while an owner runs).
    pub head_observed_age_seconds: Option<u64>,
    /// The chain's head read from its node by this status read (independently of the
    /// tip owner, with a short timeout); null when it could not be read.
    pub node_head: Option<u64>,
    /// Where the head the lag is measured against comes from: `node` (read now; the
    /// higher of it and the owner's observation), `owner` (the node could not be read)
    /// or `unknown`.
    pub head_source: String,
    /// Blocks the tip is below that head (all of it with no tip).
    pub lag_blocks: u64,
    /// Seconds the tip has been behind (since the owner saw it behind, else since the
    /// owner's last observation); 0 when not behind.
    pub lag_seconds: u64,
    /// True when the tip owner recorded an observation recently (a live owner
    /// re-records every 5 s).
    pub owner_live: bool,
    /// True when no fresh head is known (no node read, an old owner observation).
    pub stale: bool,
    /// Red: degraded, no live owner, a stale head, or lagging beyond the tolerance.
    pub red: bool,
    /// Why it is red: `degraded`, `no_live_owner`, `stale_head`, `lagging`.
    pub red_reasons: Vec<String>,
    /// The degraded marker's reason, if the chain is degraded.
    pub degraded_reason: Option<String>,
    /// Since when an operator's re-index rebuilds the chain (null: none running).
    pub rebuilding_since: Option<DateTime<Utc>>,
    /// The route that re-indexes the chain (`POST`, an `admin` key): the way back from a
    /// degraded chain (`keel index reindex --chain NAME` does the same).
    pub reindex_url: String,
    /// History ranges by state.
    pub ranges: RangeCounts,
}

/// A registered replica.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaInfo {
    /// Replica id.
    pub id: Uuid,
    /// `runner` or `indexer`.
    pub role: String,
    /// Host it reported.
    pub host: String,
    /// Registered.
    pub started_at: DateTime<Utc>,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_seconds: u64,
    /// Shards it holds.
    pub shards_owned: u32,
    /// Shards it declines.
    pub shards_declined: u32,
}

/// The owner of a singleton.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SingletonInfo {
    /// Its name (`txq/<chainId>`, `index-tip/<chainId>`).
    pub name: String,
    /// The role running it.
    pub role: String,
    /// Its shard.
    pub shard: u32,
    /// The replica holding that shard (null: nobody).
    pub owner: Option<Uuid>,
}

/// The cluster.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// The recorded shard count.
    pub shards: Option<u32>,
    /// Replicas by role.
    pub replicas: Vec<ReplicaInfo>,
    /// Singleton owners.
    pub singletons: Vec<SingletonInfo>,
}

/// A scheduled job.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    /// Its name.
    pub name: String,
    /// Its period, seconds.
    pub period_seconds: u64,
    /// The scheduled time of its latest cycle.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// That cycle's outcome (`succeeded`, `failed`; null while running or silent).
    pub last_outcome: Option<String>,
    /// Work items it reported.
    pub last_items: Option<u64>,
    /// Duration of the latest finished cycle, milliseconds.
    pub last_duration_ms: Option<u64>,
    /// The latest successful cycle.
    pub last_success_at: Option<DateTime<Utc>>,
    /// The next cycle.
    pub next_due_at: DateTime<Utc>,
    /// The detailed state (`pending`, `running`, `succeeded`, `found_nothing`,
    /// `failed`, `overdue`, `stopped_reporting`, `unknown`).
    pub state: String,
    /// `ok`, `quiet` (ran, found nothing), `failed`, `overdue`, `stopped_reporting`,
    /// `unknown`.
    pub verdict: String,
}

/// Custody providers (issue 19): the queue's live custody submissions by provider
/// status, and the oldest approval pending at a provider. Webhook verified / refused
/// counts are metrics (`keel_api_custody_webhooks_total`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustodyInfo {
    /// Whether any custody submission is live (a custody sender is at work).
    pub configured: bool,
    /// Live submissions (not settled, not superseded) by chain, provider, phase and
    /// provider status.
    pub requests: Vec<CustodyRequestCount>,
    /// The submission waiting longest for an approval at its provider; null when none
    /// waits.
    pub oldest_pending_approval: Option<CustodyPendingApproval>,
}

/// Live custody submissions of one (chain, provider, phase, status).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustodyRequestCount {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The provider (`fireblocks`).
    pub provider: String,
    /// The submission phase: `ready`, `creating`, `in_doubt`, `submitted`,
    /// `cancelling`.
    pub phase: String,
    /// The provider's last status (Fireblocks name); null before the first read.
    pub status: Option<String>,
    /// How many submissions.
    pub count: u64,
}

/// A custody approval pending at a provider.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustodyPendingApproval {
    /// The queue request.
    pub request_id: Uuid,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The provider (`fireblocks`).
    pub provider: String,
    /// The provider's transaction id.
    pub provider_tx_id: Option<String>,
    /// `PENDING_AUTHORIZATION` or `PENDING_3RD_PARTY_MANUAL_APPROVAL`.
    pub status: Option<String>,
    /// Since when it has waited (RFC 3339, database clock).
    pub since: DateTime<Utc>,
}

/// A disabled webhook endpoint.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisabledEndpointInfo {
    /// Endpoint id.
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// Why (`gone`, `failing`; null: by its owner).
    pub reason: Option<String>,
    /// Since.
    pub since: DateTime<Utc>,
}

/// An enabled webhook endpoint whose deliveries fail, or whose breaker is open.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyEndpointInfo {
    /// Endpoint id.
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// True while its circuit breaker is open (deliveries held until
    /// `breakerOpenUntil`); false: failing, breaker closed.
    pub breaker_open: bool,
    /// Since when its deliveries fail.
    pub failing_since: Option<DateTime<Utc>>,
    /// Failed deliveries in a row.
    pub consecutive_failures: u32,
    /// Until when the open breaker holds deliveries.
    pub breaker_open_until: Option<DateTime<Utc>>,
}

/// Webhooks.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhooksInfo {
    /// Enabled endpoints delivering.
    pub healthy: u64,
    /// Enabled endpoints failing.
    pub failing: u64,
    /// Enabled endpoints with an open circuit breaker.
    pub breaker_open: u64,
    /// Disabled endpoints.
    pub disabled: u64,
    /// Deliveries not yet delivered.
    pub undelivered: u64,
    /// The oldest of them.
    pub oldest_undelivered_at: Option<DateTime<Utc>>,
    /// Disabled endpoints.
    pub disabled_endpoints: Vec<DisabledEndpointInfo>,
    /// The failing and breaker-open endpoints by id (breaker open first), at most the
    /// list limit.
    pub unhealthy_endpoints: Vec<UnhealthyEndpointInfo>,
}

/// The platform's state, from the database only.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformStatus {
    /// The database clock at the read; ages are relative to it.
    pub generated_at: DateTime<Utc>,
    /// The thresholds used.
    pub thresholds: StatusThresholds,
    /// Workflows.
    pub workflows: WorkflowsStatus,
    /// The transaction queue per chain and sender.
    pub queue: Vec<QueueSenderStatus>,
    /// Open funding requests.
    pub funding_requests: FundingStatus,
    /// The Ledger Index per chain.
    pub index: Vec<IndexChainStatus>,
    /// The cluster.
    pub cluster: ClusterInfo,
    /// Scheduled jobs.
    pub jobs: Vec<JobInfo>,
    /// Custody (not built yet).
    pub custody: CustodyInfo,
    /// Webhooks.
    pub webhooks: WebhooksInfo,
}

fn instance(now: DateTime<Utc>, i: &HealthInstance) -> StatusInstance {
    let operation_id = Uuid::parse_str(&i.idempotency_key).ok();
    StatusInstance {
        operation_id,
        operation_url: operation_id.map(|id| format!("/v1/operations/{id}")),
        id: i.id,
        workflow: i.workflow.clone(),
        state: i.status.as_str().to_owned(),
        created_at: i.created_at,
        updated_at: i.updated_at,
        age_seconds: age(now, i.created_at),
        unchanged_seconds: age(now, i.updated_at),
    }
}

/// The index part of the status: each chain judged against the head read from its
/// node (`heads`, by chain id; absent when not read) with `cfg`.
fn index_status(
    v: &View,
    heads: &std::collections::HashMap<u64, u64>,
    cfg: crate::IndexStatusConfig,
) -> Vec<IndexChainStatus> {
    let now = v.generated_at;
    v.index
        .iter()
        .map(|c| {
            let node_head = heads.get(&c.chain_id.get()).copied();
            let verdict = c.judge(now, node_head, cfg.stale_after, cfg.lag_tolerance_blocks);
            IndexChainStatus {
                chain_id: c.chain_id.get().to_string(),
                owner_epoch: c.owner_epoch,
                tip: c.tip,
                head: c.head,
                head_observed_at: c.head_observed_at,
                head_observed_age_seconds: c.head_observed_at.map(|t| age(now, t)),
                node_head,
                head_source: verdict.head_source.as_str().to_owned(),
                lag_blocks: verdict.lag_blocks,
                lag_seconds: verdict.lag_seconds,
                owner_live: verdict.owner_live,
                stale: verdict.stale,
                red: verdict.red,
                red_reasons: verdict.reasons.iter().map(|r| (*r).to_owned()).collect(),
                degraded_reason: c.degraded_reason.clone(),
                rebuilding_since: c.rebuilding_since,
                reindex_url: format!("/v1/chains/{}/index/reindex", c.chain_id.get()),
                ranges: RangeCounts {
                    pending: c.ranges_pending,
                    leased: c.ranges_leased,
                    done: c.ranges_done,
                },
            }
        })
        .collect()
}

/// Reads each indexed chain's head from its node (those the state has a node for),
/// side by side, each bounded by `timeout`; a failed or late read is left out.
async fn read_heads(
    state: &ApiState,
    v: &View,
    timeout: Duration,
) -> std::collections::HashMap<u64, u64> {
    let reads = v.index.iter().filter_map(|c| {
        let chain = c.chain_id.get();
        let node = state.chain_head_node(chain)?.clone();
        Some(async move {
            match tokio::time::timeout(timeout, node.block_number()).await {
                Ok(Ok(head)) => Some((chain, head)),
                _ => {
                    tracing::warn!(target: "keel::api::status", chain, "reading the chain head for the status failed or timed out");
                    None
                }
            }
        })
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect()
}

impl PlatformStatus {
    /// The status of `v`, the index judged against `heads` with `cfg`.
    fn of(
        v: &View,
        heads: &std::collections::HashMap<u64, u64>,
        cfg: crate::IndexStatusConfig,
    ) -> Self {
        let mut s = Self::from(v);
        s.index = index_status(v, heads, cfg);
        s
    }
}

impl From<&View> for PlatformStatus {
    /// The status without the index chains (see [`PlatformStatus::of`]).
    fn from(v: &View) -> Self {
        let now = v.generated_at;
        let w = &v.workflows;
        Self {
            generated_at: now,
            thresholds: StatusThresholds {
                pending_seconds: secs(v.query.pending_threshold),
                no_mutation_seconds: secs(v.query.no_mutation_threshold),
                limit: v.query.limit,
            },
            workflows: WorkflowsStatus {
                counts: w
                    .counts
                    .iter()
                    .map(|c| WorkflowStateCount {
                        workflow: c.workflow.clone(),
                        state: c.status.as_str().to_owned(),
                        count: c.count,
                    })
                    .collect(),
                oldest: w.oldest.iter().map(|i| instance(now, i)).collect(),
                over_pending: w.over_pending,
                over_pending_list: w
                    .over_pending_list
                    .iter()
                    .map(|i| instance(now, i))
                    .collect(),
                over_no_mutation: w.over_no_mutation,
                over_no_mutation_list: w
                    .over_no_mutation_list
                    .iter()
                    .map(|i| instance(now, i))
                    .collect(),
                dead_letters: w.dead_letters,
                dead_letter_list: w
                    .dead_letter_list
                    .iter()
                    .map(|d| StatusDeadLetter {
                        instance_id: d.instance_id,
                        workflow: d.workflow.clone(),
                        kind: d.kind.clone(),
                        last_error: d.last_error.clone(),
                        dead_at: d.dead_at,
                    })
                    .collect(),
                awaiting_runner: v
                    .version_waits
                    .iter()
                    .map(|w| StatusVersionWait {
                        workflow: w.workflow.clone(),
                        version: w.version,
                        instances: w.instances,
                        oldest_created_at: w.oldest_created_at,
                        oldest_age_seconds: u64::try_from(
                            (now - w.oldest_created_at).num_seconds().max(0),
                        )
                        .unwrap_or(0),
                    })
                    .collect(),
            },
            queue: v
                .queue
                .iter()
                .map(|s| QueueSenderStatus {
                    chain_id: s.chain_id.get().to_string(),
                    sender: crate::dto::address_text(s.sender),
                    next_nonce: s.next_nonce,
                    depth: s.depth,
                    waiting_funding: s.waiting_funding,
                    in_flight: s.in_flight,
                    oldest_unsettled_at: s.oldest_unsettled_at,
                    oldest_unsettled_age_seconds: s.oldest_unsettled_at.map(|t| age(now, t)),
                    replacements_last_hour: s.replacements_last_hour,
                })
                .collect(),
            funding_requests: FundingStatus {
                open: v.funding_open,
                data: v
                    .funding
                    .iter()
                    .map(|f| StatusFundingRequest {
                        request_id: f.request_id,
                        chain_id: f.chain_id.get().to_string(),
                        address: crate::dto::address_text(f.address),
                        required_wei: f.required_wei.get().to_string(),
                        deadline: f.deadline,
                    })
                    .collect(),
            },
            index: Vec::new(),
            cluster: ClusterInfo {
                shards: v.cluster.shards,
                replicas: v
                    .cluster
                    .replicas
                    .iter()
                    .map(|r| ReplicaInfo {
                        id: r.id,
                        role: r.role.clone(),
                        host: r.host.clone(),
                        started_at: utc(r.started_at),
                        heartbeat_age_seconds: r.heartbeat_age.as_secs(),
                        shards_owned: r.shards_owned,
                        shards_declined: r.shards_declined,
                    })
                    .collect(),
                singletons: v
                    .cluster
                    .singletons
                    .iter()
                    .map(|s| SingletonInfo {
                        name: s.name.clone(),
                        role: s.role.as_str().to_owned(),
                        shard: s.shard,
                        owner: s.owner,
                    })
                    .collect(),
            },
            jobs: v
                .jobs
                .iter()
                .map(|j| JobInfo {
                    name: j.name.clone(),
                    period_seconds: j.period.as_secs(),
                    last_attempt_at: j.last_attempt_at.map(utc),
                    last_outcome: j.last_outcome.map(|o| {
                        match o {
                            CronOutcome::Succeeded => "succeeded",
                            _ => "failed",
                        }
                        .to_owned()
                    }),
                    last_items: j.last_items,
                    last_duration_ms: j
                        .last_duration
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    last_success_at: j.last_success_at.map(utc),
                    next_due_at: utc(j.next_due_at),
                    state: j.state.to_owned(),
                    verdict: j.verdict.as_str().to_owned(),
                })
                .collect(),
            custody: CustodyInfo {
                configured: v.custody.configured,
                requests: v
                    .custody
                    .requests
                    .iter()
                    .map(|c| CustodyRequestCount {
                        chain_id: c.chain_id.get(),
                        provider: c.provider.clone(),
                        phase: c.phase.clone(),
                        status: c.status.clone(),
                        count: c.live,
                    })
                    .collect(),
                oldest_pending_approval: v.custody.oldest_pending_approval.as_ref().map(|p| {
                    CustodyPendingApproval {
                        request_id: p.request_id,
                        chain_id: p.chain_id.get(),
                        provider: p.provider.clone(),
                        provider_tx_id: p.provider_tx_id.clone(),
                        status: p.status.clone(),
                        since: p.since,
                    }
                }),
            },
            webhooks: WebhooksInfo {
                healthy: v.webhooks.healthy,
                failing: v.webhooks.failing,
                breaker_open: v.webhooks.breaker_open,
                disabled: v.webhooks.disabled,
                undelivered: v.webhooks.undelivered,
                oldest_undelivered_at: v.webhooks.oldest_undelivered_at,
                disabled_endpoints: v
                    .webhooks
                    .disabled_list
                    .iter()
                    .map(|d| DisabledEndpointInfo {
                        id: d.id,
                        organization_id: d.organization_id,
                        reason: d.reason.clone(),
                        since: d.since,
                    })
                    .collect(),
                unhealthy_endpoints: v
                    .webhooks
                    .unhealthy_list
                    .iter()
                    .map(|u| UnhealthyEndpointInfo {
                        id: u.id,
                        organization_id: u.organization_id,
                        breaker_open: u.breaker_open,
                        failing_since: u.failing_since,
                        consecutive_failures: u.consecutive_failures,
                        breaker_open_until: u.breaker_open_until,
                    })
                    .collect(),
            },
        }
    }
}

/// Errors of `GET /v1/status` (for the OpenAPI document; `403` is added by the
/// document's fixups).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum StatusErrors {
    /// `UNAUTHENTICATED`: missing, invalid, revoked or rotated-away API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthenticated(Problem),
    /// `SERVICE_UNAVAILABLE`: the database failed; retry.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

async fn read(state: &ApiState) -> Result<PlatformStatus, OpsError> {
    let view = state.ops().platform_status(state.config().status).await?;
    let cfg = state.config().index_status;
    let heads = read_heads(state, &view, cfg.head_read_timeout).await;
    Ok(PlatformStatus::of(&view, &heads, cfg))
}

/// `GET /v1/status`: the Platform Status ([`PlatformStatus`]) from the database.
#[utoipa::path(get, path = "/v1/status", tag = "status", operation_id = "getPlatformStatus",
    responses((status = 200, description = "The platform's state, read from the database (any api replica answers the same).", body = PlatformStatus), StatusErrors),
    security(("bearer" = [])))]
pub(crate) async fn get_status(
    State(state): State<ApiState>,
    Authed(_): Authed,
) -> Result<Json<PlatformStatus>, Problem> {
    Ok(Json(read(&state).await?))
}

// -------------------------------------------------------------------------------------
// The page
// -------------------------------------------------------------------------------------

/// Why the page refuses a credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    Invalid,
    NotAdmin,
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim().to_owned())
}

fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

async fn check_admin(state: &ApiState, token: Option<String>) -> Result<(), Refusal> {
    let token = token.filter(|t| !t.is_empty()).ok_or(Refusal::Missing)?;
    match state.ops().authenticate_credential(&token).await {
        Ok(c) if c.scopes.contains(Scope::Admin) => Ok(()),
        Ok(_) => Err(Refusal::NotAdmin),
        Err(_) => Err(Refusal::Invalid),
    }
}

fn page_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn login_page(status: StatusCode, refusal: Refusal) -> Response {
    let message = match refusal {
        Refusal::Missing => "Sign in with an API key that holds the admin scope.",
        Refusal::Invalid => "The key is unknown, revoked or rotated away.",
        Refusal::NotAdmin => "The key lacks the admin scope.",
    };
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Keel status: sign in</title>\
<style>{CSS}</style></head><body><h1>Keel Platform Status</h1><p class=\"warn\">{message}</p>\
<form method=\"post\" action=\"/status/login\"><label>API key <input type=\"password\" name=\"key\" \
autocomplete=\"off\" required></label> <button type=\"submit\">Sign in</button></form></body></html>"
    );
    page_headers((status, body).into_response())
}

/// The login form's body.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    key: String,
}

/// `POST /status/login`: checks the key (admin scope) and sets the page's cookie.
pub(crate) async fn login(State(state): State<ApiState>, Form(form): Form<LoginForm>) -> Response {
    let token = form.key.trim().to_owned();
    match check_admin(&state, Some(token.clone())).await {
        Ok(()) => {
            // A token is `keel_<base64url>` (checked by authentication): cookie-safe.
            let cookie = format!(
                "{COOKIE}={token}; HttpOnly; SameSite=Lax; Path=/status; Max-Age={COOKIE_MAX_AGE_SECS}"
            );
            let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/status")]).into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(refusal) => login_page(StatusCode::UNAUTHORIZED, refusal),
    }
}

/// `POST /status/logout`: clears the page's cookie.
pub(crate) async fn logout() -> Response {
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/status")]).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("keel_status=; HttpOnly; SameSite=Lax; Path=/status; Max-Age=0"),
    );
    r
}

/// `GET /status`: the page (bearer header or cookie; else the login form).
pub(crate) async fn page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let token = bearer_token(&headers).or_else(|| cookie_token(&headers));
    if let Err(refusal) = check_admin(&state, token).await {
        let status = if refusal == Refusal::NotAdmin {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::UNAUTHORIZED
        };
        return login_page(status, refusal);
    }
    match read(&state).await {
        Ok(status) => page_headers((StatusCode::OK, render(&status)).into_response()),
        Err(e) => {
            tracing::warn!(target: "keel::api::status", code = e.code(), "platform status read failed");
            page_headers(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Keel status</title>\
<style>{CSS}</style></head><body><h1>Keel Platform Status</h1><p class=\"bad\">The database did not answer ({}). Reload to retry.</p></body></html>",
                        esc(e.code())
                    ),
                )
                    .into_response(),
            )
        }
    }
}

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1f24;background:#fafafa}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;vertical-align:top}\
th{background:#eee}.ok{color:#176f2c}.warn{color:#9a6700;font-weight:600}.bad{color:#b3261e;font-weight:600}\
.muted{color:#666}code{font-size:.95em}";

/// HTML-escapes `s`.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| esc(&v.to_string()))
}

fn ts(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "—".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

fn dur(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

fn instances_table(out: &mut String, list: &[StatusInstance]) {
    out.push_str("<table><tr><th>operation</th><th>instance</th><th>workflow</th><th>state</th><th>age</th><th>unchanged for</th></tr>");
    for i in list {
        let operation = match (&i.operation_id, &i.operation_url) {
            (Some(id), Some(url)) => format!("<a href=\"{}\"><code>{id}</code></a>", esc(url)),
            _ => "—".to_owned(),
        };
        let _ = write!(
            out,
            "<tr><td>{operation}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            i.id,
            esc(&i.workflow),
            esc(&i.state),
            dur(i.age_seconds),
            dur(i.unchanged_seconds)
        );
    }
    out.push_str("</table>");
}

/// Renders the page (every value escaped).
fn render(s: &PlatformStatus) -> String {
    let mut o = String::with_capacity(16 * 1024);
    let _ = write!(
        o,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Keel Platform Status</title>\
<style>{CSS}</style></head><body><h1>Keel Platform Status</h1>\
<p class=\"muted\">Read from the database at {} (database clock). Thresholds: pending {}, no mutation {}. \
Reload for fresh data.</p><form method=\"post\" action=\"/status/logout\"><button type=\"submit\">Sign out</button></form>",
        ts(Some(s.generated_at)),
        dur(s.thresholds.pending_seconds),
        dur(s.thresholds.no_mutation_seconds)
    );

    // Workflows
    let w = &s.workflows;
    o.push_str("<h2 id=\"workflows\">Workflows</h2>");
    let class = |n: u64| if n == 0 { "ok" } else { "bad" };
    let _ = write!(
        o,
        "<p><span class=\"{}\">{} over the pending threshold</span> · <span class=\"{}\">{} over the no-mutation threshold</span> · <span class=\"{}\">{} dead letters</span></p>",
        class(w.over_pending),
        w.over_pending,
        class(w.over_no_mutation),
        w.over_no_mutation,
        class(w.dead_letters),
        w.dead_letters
    );
    o.push_str("<table><tr><th>workflow</th><th>state</th><th>instances</th></tr>");
    for c in &w.counts {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.workflow),
            esc(&c.state),
            c.count
        );
    }
    o.push_str("</table>");
    if !w.over_pending_list.is_empty() {
        o.push_str("<h3>Over the pending threshold (not started)</h3>");
        instances_table(&mut o, &w.over_pending_list);
    }
    if !w.over_no_mutation_list.is_empty() {
        o.push_str("<h3>Over the no-mutation threshold (no progress)</h3>");
        instances_table(&mut o, &w.over_no_mutation_list);
    }
    if !w.oldest.is_empty() {
        o.push_str("<h3>Oldest running / waiting / suspended per workflow</h3>");
        instances_table(&mut o, &w.oldest);
    }
    if !w.awaiting_runner.is_empty() {
        o.push_str("<h3 class=\"bad\">Waiting for a runner that knows their version</h3><table><tr><th>workflow</th><th>version</th><th>instances</th><th>oldest started</th></tr>");
        for a in &w.awaiting_runner {
            let version = a
                .version
                .map_or_else(|| "none (no runner runs it)".to_owned(), |v| v.to_string());
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} ({} s ago)</td></tr>",
                esc(&a.workflow),
                esc(&version),
                a.instances,
                ts(Some(a.oldest_created_at)),
                a.oldest_age_seconds
            );
        }
        o.push_str("</table>");
    }
    if !w.dead_letter_list.is_empty() {
        o.push_str("<h3>Dead letters</h3><table><tr><th>instance</th><th>workflow</th><th>command</th><th>last error</th><th>dead since</th></tr>");
        for d in &w.dead_letter_list {
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                d.instance_id,
                esc(&d.workflow),
                esc(&d.kind),
                opt(d.last_error.as_deref()),
                ts(Some(d.dead_at))
            );
        }
        o.push_str("</table>");
    }

    // Queue
    o.push_str("<h2 id=\"queue\">Transaction queue</h2>");
    if s.queue.is_empty() {
        o.push_str("<p class=\"muted\">No sender has queued a transaction yet.</p>");
    } else {
        o.push_str("<table><tr><th>chain</th><th>sender</th><th>depth</th><th>waiting funding</th><th>in flight</th><th>oldest unsettled</th><th>replacements (1 h)</th><th>next nonce</th></tr>");
        for q in &s.queue {
            let _ = write!(
                o,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&q.chain_id),
                esc(&q.sender),
                q.depth,
                q.waiting_funding,
                q.in_flight,
                q.oldest_unsettled_age_seconds
                    .map_or_else(|| "—".to_owned(), dur),
                q.replacements_last_hour,
                q.next_nonce
            );
        }
        o.push_str("</table>");
    }
    let _ = write!(
        o,
        "<p>Open funding requests: <span class=\"{}\">{}</span></p>",
        class(s.funding_requests.open),
        s.funding_requests.open
    );
    if !s.funding_requests.data.is_empty() {
        o.push_str("<table><tr><th>chain</th><th>address</th><th>required (wei)</th><th>deadline</th></tr>");
        for f in &s.funding_requests.data {
            let _ = write!(
                o,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                esc(&f.chain_id),
                esc(&f.address),
                esc(&f.required_wei),
                ts(Some(f.deadline))
            );
        }
        o.push_str("</table>");
    }

    // Index
    o.push_str("<h2 id=\"index\">Ledger Index</h2>");
    if s.index.is_empty() {
        o.push_str("<p class=\"muted\">No chain is indexed yet.</p>");
    } else {
        o.push_str("<table><tr><th>chain</th><th>state</th><th>indexed tip</th><th>chain head</th><th>lag</th><th>owner's head observed</th><th>history ranges pending / leased / done</th><th>owner epoch</th></tr>");
        for c in &s.index {
            let (class, state) = if c.red {
                ("bad", format!("red: {}", c.red_reasons.join(", ")))
            } else {
                ("ok", "green".to_owned())
            };
            let head = match (c.node_head, c.head) {
                (Some(n), _) => format!("{n} (node)"),
                (None, Some(h)) => format!("{h} (owner's observation)"),
                (None, None) => "—".to_owned(),
            };
            let lag_class = if c.red_reasons.iter().any(|r| r == "lagging") {
                "bad"
            } else {
                "ok"
            };
            let extra = match (&c.degraded_reason, c.rebuilding_since) {
                (Some(r), _) => format!(
                    " <span class=\"bad\">degraded: {}</span> — re-index: <code>keel index reindex --chain NAME</code> or <code>POST {}</code>",
                    esc(r),
                    esc(&c.reindex_url)
                ),
                (None, Some(since)) => format!(
                    " <span class=\"warn\">rebuilding since {}</span>",
                    ts(Some(since))
                ),
                (None, None) => String::new(),
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td class=\"{lag_class}\">{} blocks, {}</td><td>{}</td><td>{} / {} / {}</td><td>{}{}</td></tr>",
                esc(&c.chain_id),
                esc(&state),
                opt(c.tip),
                esc(&head),
                c.lag_blocks,
                dur(c.lag_seconds),
                c.head_observed_age_seconds
                    .map_or_else(|| "never".to_owned(), |a| format!("{} ago", dur(a))),
                c.ranges.pending,
                c.ranges.leased,
                c.ranges.done,
                c.owner_epoch,
                extra
            );
        }
        o.push_str("</table>");
    }

    // Cluster
    o.push_str("<h2 id=\"cluster\">Cluster</h2>");
    let _ = write!(o, "<p>Shards: {}</p>", opt(s.cluster.shards));
    o.push_str("<table><tr><th>role</th><th>host</th><th>replica</th><th>heartbeat</th><th>shards owned</th><th>declined</th></tr>");
    for r in &s.cluster.replicas {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{} ago</td><td>{}</td><td>{}</td></tr>",
            esc(&r.role),
            esc(&r.host),
            r.id,
            dur(r.heartbeat_age_seconds),
            r.shards_owned,
            r.shards_declined
        );
    }
    o.push_str("</table>");
    if !s.cluster.singletons.is_empty() {
        o.push_str("<table><tr><th>singleton</th><th>role</th><th>shard</th><th>owner</th></tr>");
        for g in &s.cluster.singletons {
            let owner = g.owner.map_or_else(
                || "<span class=\"bad\">none</span>".to_owned(),
                |id| format!("<code>{id}</code>"),
            );
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{owner}</td></tr>",
                esc(&g.name),
                esc(&g.role),
                g.shard
            );
        }
        o.push_str("</table>");
    }

    // Jobs
    o.push_str("<h2 id=\"jobs\">Scheduled jobs</h2>");
    if s.jobs.is_empty() {
        o.push_str("<p class=\"muted\">No job is registered.</p>");
    } else {
        o.push_str("<table><tr><th>job</th><th>verdict</th><th>last attempt</th><th>outcome</th><th>duration</th><th>items</th><th>last success</th><th>next due</th></tr>");
        for j in &s.jobs {
            let class = match j.verdict.as_str() {
                "ok" | "quiet" => "ok",
                _ => "bad",
            };
            let verdict = match j.verdict.as_str() {
                "quiet" => "quiet (ran, found nothing)",
                "stopped_reporting" => "stopped reporting",
                v => v,
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&j.name),
                esc(verdict),
                ts(j.last_attempt_at),
                opt(j.last_outcome.as_deref()),
                j.last_duration_ms
                    .map_or_else(|| "—".to_owned(), |ms| format!("{ms} ms")),
                opt(j.last_items),
                ts(j.last_success_at),
                ts(Some(j.next_due_at))
            );
        }
        o.push_str("</table>");
    }

    // Custody
    let c = &s.custody;
    o.push_str("<h2 id=\"custody\">Custody</h2>");
    match &c.oldest_pending_approval {
        Some(p) => {
            let _ = write!(
                o,
                "<p class=\"warn\">Oldest approval pending at a provider: {} transaction <code>{}</code> ({}, chain {}) since {}.</p>",
                esc(&p.provider),
                opt(p.provider_tx_id.as_deref()),
                opt(p.status.as_deref()),
                p.chain_id,
                ts(Some(p.since))
            );
        }
        None => o.push_str("<p>No approval pending at a provider.</p>"),
    }
    if c.requests.is_empty() {
        o.push_str("<p class=\"muted\">No live custody submission.</p>");
    } else {
        o.push_str("<table><tr><th>chain</th><th>provider</th><th>phase</th><th>provider status</th><th>submissions</th></tr>");
        for r in &c.requests {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                r.chain_id,
                esc(&r.provider),
                esc(&r.phase),
                opt(r.status.as_deref()),
                r.count
            );
        }
        o.push_str("</table>");
    }

    // Webhooks
    let h = &s.webhooks;
    let _ = write!(
        o,
        "<h2 id=\"webhooks\">Webhooks</h2><p>Endpoints: {} healthy · <span class=\"{}\">{} failing</span> · <span class=\"{}\">{} breaker open</span> · {} disabled. Undelivered: {} (oldest {}).</p>",
        h.healthy,
        class(h.failing),
        h.failing,
        class(h.breaker_open),
        h.breaker_open,
        h.disabled,
        h.undelivered,
        ts(h.oldest_undelivered_at)
    );
    if !h.unhealthy_endpoints.is_empty() {
        o.push_str(
            "<table><tr><th>failing endpoint</th><th>organization</th><th>state</th><th>failing since</th><th>failures in a row</th></tr>",
        );
        for u in &h.unhealthy_endpoints {
            let state = if u.breaker_open {
                format!("breaker open until {}", ts(u.breaker_open_until))
            } else {
                "failing".to_owned()
            };
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td class=\"bad\">{}</td><td>{}</td><td>{}</td></tr>",
                u.id,
                u.organization_id,
                esc(&state),
                ts(u.failing_since),
                u.consecutive_failures
            );
        }
        o.push_str("</table>");
    }
    if !h.disabled_endpoints.is_empty() {
        o.push_str(
            "<table><tr><th>endpoint</th><th>organization</th><th>reason</th><th>since</th></tr>",
        );
        for d in &h.disabled_endpoints {
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                d.id,
                d.organization_id,
                opt(d.reason.as_deref()),
                ts(Some(d.since))
            );
        }
        o.push_str("</table>");
    }
    o.push_str("</body></html>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn reads_the_cookie_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; keel_status=keel_abc ; b=2"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("keel_abc"));
        h.insert(header::COOKIE, HeaderValue::from_static("keel_statusx=1"));
        assert_eq!(cookie_token(&h), None);
    }
}
