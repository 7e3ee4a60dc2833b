//! From keel-workflows' status view to the view model, with the index chains judged
//! against their nodes' heads.

use crate::ApiState;
use chrono::{DateTime, Utc};
use keel_workflows::ops::status::{CronOutcome, HealthInstance, PlatformStatus as View};
use std::time::Duration;
use uuid::Uuid;

use super::*;

pub(super) fn instance(now: DateTime<Utc>, i: &HealthInstance) -> StatusInstance {
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
pub(super) fn index_status(
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
pub(super) async fn read_heads(
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
    pub(super) fn of(
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
                    balance_wei: s.balance_wei.map(|w| w.to_string()),
                    balance_checked_at: s.balance_checked_at,
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
            distributions: v
                .distributions
                .iter()
                .map(|d| DistributionInfo {
                    id: d.id,
                    url: format!("/v1/distributions/{}", d.id),
                    organization_id: d.organization_id,
                    asset_id: d.asset_id,
                    chain_id: d.chain_id,
                    state: d.state.to_owned(),
                    paused_at: d.paused_at,
                    holders: d.holders,
                    paid: d.paid,
                    pending: d.pending,
                    refused: d.refused,
                    batches_paid: d.batches_paid,
                    age_seconds: age(v.generated_at, d.created_at),
                    unchanged_seconds: age(v.generated_at, d.updated_at),
                })
                .collect(),
        }
    }
}
