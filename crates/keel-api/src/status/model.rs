//! The JSON view model of `GET /v1/status` (the types of the OpenAPI document).

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::time::{Duration, SystemTime};
use utoipa::ToSchema;
use uuid::Uuid;

pub(super) fn secs(d: Duration) -> u64 {
    d.as_secs()
}

pub(super) fn age(now: DateTime<Utc>, at: DateTime<Utc>) -> u64 {
    u64::try_from((now - at).num_seconds()).unwrap_or(0)
}

pub(super) fn utc(t: SystemTime) -> DateTime<Utc> {
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
    /// The sender's balance at the node's `pending` block, wei (decimal string), as a
    /// runner last read it (every 15 s for each sender it has a key for); `null` until
    /// a runner registered the sender.
    pub balance_wei: Option<String>,
    /// When that balance was read.
    pub balance_checked_at: Option<DateTime<Utc>>,
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

/// A distribution that has not finished (issue 36 §3).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributionInfo {
    /// The distribution (its operation's id).
    pub id: Uuid,
    /// `GET /v1/distributions/{id}` (with a key of its organization).
    pub url: String,
    /// Its organization.
    pub organization_id: Uuid,
    /// The asset whose holders it pays.
    pub asset_id: Uuid,
    /// The chain id.
    pub chain_id: i64,
    /// `paused`, `pending`, `running`, `waiting` (approval, funds, a transaction) or
    /// `suspended`.
    pub state: String,
    /// Since when it is paused.
    pub paused_at: Option<DateTime<Utc>>,
    /// Holders of its snapshot, once planned.
    pub holders: Option<u64>,
    /// Holders paid.
    pub paid: u64,
    /// Holders still owed.
    pub pending: u64,
    /// Holders the paying token refused.
    pub refused: u64,
    /// Batches paid.
    pub batches_paid: u64,
    /// Seconds since it was accepted.
    pub age_seconds: u64,
    /// Seconds since its workflow last changed.
    pub unchanged_seconds: u64,
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
    /// Distributions not finished yet, newest first (of the newest 50 without a
    /// completion, at most the list limit).
    pub distributions: Vec<DistributionInfo>,
}
