//! Platform Status: one read of every part's persisted health, for `GET /v1/status`
//! and the `/status` page ([`Ops::platform_status`]). Each part is read through its
//! owning crate (the engine's [`keel_durable::Engine::workflow_health`],
//! [`keel_txq::queue_health`] and [`keel_txq::funding_requests`],
//! [`keel_index::index_health`], [`keel_cluster::cluster_status`] and
//! [`keel_cluster::jobs_status`], [`keel_webhooks::webhook_health`]); nothing comes
//! from this process's memory, so every api replica answers the same. Value-free: ids,
//! names, states, counts and times; no payload, URL, secret or organization data
//! beyond ids.

use super::Ops;

use crate::error::{OpsError, Result};
use crate::store;
use chrono::{DateTime, Utc};
/// The parts' own health types, re-exported for the API layer.
pub use keel_cluster::{ClusterStatus, CronOutcome, JobStatus, JobVerdict};
use keel_durable::RunStatus;
pub use keel_durable::{DeadLetter, HealthInstance, WorkflowHealth};
use std::collections::BTreeSet;
use std::time::Duration;
use uuid::Uuid;

/// What Platform Status looks for (configuration `api.status.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusQuery {
    /// A `pending` workflow instance older than this is listed as stuck before its
    /// start (default 60 s).
    pub pending_threshold: Duration,
    /// An open instance unchanged for longer than this is listed as making no progress
    /// (default 15 min).
    pub no_mutation_threshold: Duration,
    /// At most this many items per list (default 20; at least 1).
    pub limit: u32,
}

impl Default for StatusQuery {
    fn default() -> Self {
        let d = keel_durable::HealthQuery::default();
        Self {
            pending_threshold: d.pending_threshold,
            no_mutation_threshold: d.no_mutation_threshold,
            limit: d.limit,
        }
    }
}

/// Custody providers' health (issue 19), from the queue's custody submissions
/// ([`keel_txq::custody_health`]). Provider webhook counts are metrics
/// (`keel_api_custody_webhooks_total`), not persisted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CustodyStatus {
    /// Whether any custody submission is live (a custody sender is at work).
    pub configured: bool,
    /// Live submissions by chain, provider, phase and provider status.
    pub requests: Vec<keel_txq::CustodyCount>,
    /// The submission that waits longest for an approval at its provider.
    pub oldest_pending_approval: Option<keel_txq::PendingApproval>,
}

/// A distribution that has not finished (issue 36 §3), as the status page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributionStatus {
    /// The distribution (its operation's id).
    pub id: Uuid,
    /// Its organization.
    pub organization_id: Uuid,
    /// The asset whose holders it pays.
    pub asset_id: Uuid,
    /// The chain.
    pub chain_id: i64,
    /// `paused` (held before its next batch), else its workflow's state: `pending`,
    /// `running`, `waiting` (approval, funds, a transaction) or `suspended`.
    pub state: &'static str,
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
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When its workflow last changed.
    pub updated_at: DateTime<Utc>,
}

/// How many unfinished distributions the status read looks at (newest first).
const DISTRIBUTIONS_SCANNED: i64 = 50;

/// The whole platform's state ([`Ops::platform_status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformStatus {
    /// The database clock when the status was read; every age is relative to it.
    pub generated_at: DateTime<Utc>,
    /// The thresholds and limit used.
    pub query: StatusQuery,
    /// Workflows.
    pub workflows: keel_durable::WorkflowHealth,
    /// Open instances no live runner can run, by workflow and pinned version ("waiting
    /// for a runner that knows version N", [`keel_durable::Engine::version_waits`]).
    pub version_waits: Vec<keel_durable::VersionWait>,
    /// The transaction queue per (chain, sender).
    pub queue: Vec<keel_txq::SenderHealth>,
    /// Open funding requests, oldest first (at most [`StatusQuery::limit`]).
    pub funding: Vec<keel_txq::FundingRequest>,
    /// How many funding requests are open.
    pub funding_open: u64,
    /// The Ledger Index per chain.
    pub index: Vec<keel_index::ChainHealth>,
    /// The cluster (the singletons `txq/<chainId>` and `index-tip/<chainId>` of every
    /// chain the queue or the index knows).
    pub cluster: keel_cluster::ClusterStatus,
    /// Scheduled jobs.
    pub jobs: Vec<keel_cluster::JobStatus>,
    /// Custody submissions at their providers.
    pub custody: CustodyStatus,
    /// Webhooks.
    pub webhooks: keel_webhooks::WebhookHealth,
    /// Distributions not finished yet, newest first (of the
    /// newest 50 without a completion; at most [`StatusQuery::limit`]).
    pub distributions: Vec<DistributionStatus>,
}

fn cluster_err(e: keel_cluster::ClusterError) -> OpsError {
    match e {
        keel_cluster::ClusterError::Store(s) => OpsError::Store(s),
        _ => OpsError::Store(keel_store::StoreError::Decode),
    }
}

fn webhook_err(e: keel_webhooks::WebhookError) -> OpsError {
    match e {
        keel_webhooks::WebhookError::Store(s) => OpsError::Store(s),
        _ => OpsError::Store(keel_store::StoreError::Decode),
    }
}

impl Ops {
    /// Reads the [`PlatformStatus`] with the thresholds of `query`: a dozen statements
    /// on the pool, not one snapshot (each section is consistent in itself). For
    /// operators only: the caller checks the credential (the API requires the `admin`
    /// scope).
    ///
    /// # Errors
    /// [`OpsError::Store`] (and [`OpsError::Engine`], [`OpsError::Index`]) when the
    /// database fails.
    pub async fn platform_status(&self, query: StatusQuery) -> Result<PlatformStatus> {
        let generated_at: DateTime<Utc> = crate::store::database_now(&self.db).await?;
        let workflows = self
            .engine
            .workflow_health(keel_durable::HealthQuery {
                pending_threshold: query.pending_threshold,
                no_mutation_threshold: query.no_mutation_threshold,
                limit: query.limit,
            })
            .await?;
        let version_waits = self.engine.version_waits().await?;
        let queue = keel_txq::queue_health(&self.db)
            .await
            .map_err(super::read::txq_err)?;
        let mut funding = keel_txq::funding_requests(&self.db, None)
            .await
            .map_err(super::read::txq_err)?;
        let funding_open = u64::try_from(funding.len()).unwrap_or(u64::MAX);
        funding.truncate(usize::try_from(query.limit.max(1)).unwrap_or(usize::MAX));
        let index = keel_index::index_health(&self.db).await?;
        let chains: BTreeSet<u64> = queue
            .iter()
            .map(|s| s.chain_id.get())
            .chain(index.iter().map(|c| c.chain_id.get()))
            .collect();
        let singletons: Vec<(keel_cluster::Role, String)> = chains
            .iter()
            .flat_map(|c| {
                [
                    (keel_cluster::Role::Runner, format!("txq/{c}")),
                    (keel_cluster::Role::Indexer, format!("index-tip/{c}")),
                ]
            })
            .collect();
        let cluster = keel_cluster::cluster_status(&self.db, &singletons)
            .await
            .map_err(cluster_err)?;
        let jobs = keel_cluster::jobs_status(&self.db)
            .await
            .map_err(cluster_err)?;
        let (requests, oldest_pending_approval) = keel_txq::custody_health(&self.db)
            .await
            .map_err(super::read::txq_err)?;
        let custody = CustodyStatus {
            configured: !requests.is_empty(),
            requests,
            oldest_pending_approval,
        };
        let webhooks = keel_webhooks::webhook_health(&self.db, query.limit)
            .await
            .map_err(webhook_err)?;
        Ok(PlatformStatus {
            generated_at,
            query,
            workflows,
            version_waits,
            queue,
            funding,
            funding_open,
            index,
            cluster,
            jobs,
            custody,
            webhooks,
            distributions: self.distributions_status(query.limit).await?,
        })
    }

    /// The unfinished distributions ([`PlatformStatus::distributions`]).
    async fn distributions_status(&self, limit: u32) -> Result<Vec<DistributionStatus>> {
        let rows = store::distributions_unfinished(&self.db, DISTRIBUTIONS_SCANNED).await?;
        let mut out = Vec::new();
        for (d, instance) in rows {
            if out.len() >= usize::try_from(limit.max(1)).unwrap_or(usize::MAX) {
                break;
            }
            let status = match instance {
                Some(i) => match self.engine.status(i).await {
                    Ok(s) => Some(s),
                    Err(keel_durable::DurableError::InstanceNotFound(_)) => continue,
                    Err(e) => return Err(e.into()),
                },
                None => None,
            };
            let run = status.as_ref().map(|s| s.status);
            let state = match run {
                Some(RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled) => continue,
                _ if d.paused_at.is_some() => "paused",
                None | Some(RunStatus::Pending) => "pending",
                Some(RunStatus::Running) => "running",
                Some(RunStatus::Waiting) => "waiting",
                Some(RunStatus::Suspended) => "suspended",
                Some(_) => "running",
            };
            let tally = store::distribution_tally(&self.db, d.id).await?;
            let progress = super::distributions::progress_of(&tally);
            out.push(DistributionStatus {
                id: d.id,
                organization_id: d.organization_id,
                asset_id: d.asset_id,
                chain_id: d.chain_id,
                state,
                paused_at: d.paused_at,
                holders: d.holder_count.and_then(|n| u64::try_from(n).ok()),
                paid: progress.paid.holders,
                pending: progress.pending.holders,
                refused: progress.refused.holders,
                batches_paid: progress.batches_paid,
                created_at: d.created_at,
                updated_at: status.map_or(d.created_at, |s| s.updated_at),
            });
        }
        Ok(out)
    }
}
