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
use chrono::{DateTime, Utc};
/// The parts' own health types, re-exported for the API layer.
pub use keel_cluster::{ClusterStatus, CronOutcome, JobStatus, JobVerdict};
pub use keel_durable::{DeadLetter, HealthInstance, WorkflowHealth};
use std::collections::BTreeSet;
use std::time::Duration;

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
        })
    }
}
