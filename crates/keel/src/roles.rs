//! What a role process runs besides its metrics: shard ownership (keel-cluster) for
//! `runner` and `indexer`, the runner's scheduled jobs, and an orderly stop.
//!
//! | role | shard group | scheduled jobs |
//! |---|---|---|
//! | `runner` | `workflow` | [`RETENTION_JOB`] (daily), job-health reporting |
//! | `indexer` | `indexer` | — |
//! | `api` | none (owns nothing) | — |
//!
//! Every task runs under the role's [`Supervisor`] ([`crate::supervise`]):
//! [`RoleRuntime::failed`] resolves when one ended for good (the binary then exits
//! non-zero). Runner and indexer serve a chain only while they can ([`crate::chains`]).
//!
//! Stopping ([`RoleRuntime::stop`]) aborts the job supervisors, then shuts the
//! [`ShardOwner`] down: every lease's token fires, work under leases gets the owner's
//! lock deadline to stop, every advisory lock is released and the replica's registry
//! row deleted, so peers take its shards at their next refresh.

use crate::chains::{ChainReport, ChainSet};
use crate::config::{Config, RetentionSettings, Role};
use crate::supervise::Supervisor;
use anyhow::Context;
use keel_cluster::{CronCycle, CronJob, OwnerConfig, Schedule, ShardOwner};
use keel_durable::{Retention, RetentionConfig, RetentionReport};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TARGET: &str = "keel::roles";

/// Name of the daily retention cron job (a cycle key prefix and a metric label).
pub const RETENTION_JOB: &str = "retention/daily";

/// Name of the daily webhook audit retention cron job (issue 21).
pub const WEBHOOK_RETENTION_JOB: &str = "webhooks-retention/daily";

/// Name of the organization systems' abandonment sweep cron job (issue 37 §1).
pub const ORG_SYSTEM_SWEEP_JOB: &str = "org-systems/sweep";

/// The runner's scheduled jobs: a fixed set, so job names are bounded metric labels.
pub const RUNNER_JOBS: [&str; 3] = [RETENTION_JOB, WEBHOOK_RETENTION_JOB, ORG_SYSTEM_SWEEP_JOB];

/// The abandonment sweep: every `organizations.sweepIntervalSeconds`.
pub fn org_system_sweep_job(settings: &crate::config::OrganizationSettings) -> CronJob {
    CronJob::new(
        ORG_SYSTEM_SWEEP_JOB,
        Schedule::every(Duration::from_secs(settings.sweep_interval_seconds)),
    )
}

/// The daily webhook audit retention job: every 24 h, half an hour after the
/// retention job.
pub fn webhook_retention_job(settings: &RetentionSettings) -> CronJob {
    CronJob::new(
        WEBHOOK_RETENTION_JOB,
        Schedule::every(Duration::from_secs(86_400)).offset(Duration::from_secs(
            u64::from(settings.hour_utc) * 3600 + 1800,
        )),
    )
}

/// One webhook audit retention cycle ([`keel_webhooks::retention_pass`], batches of
/// `retention.batchSize` events, at most `retention.maxBatchesPerPass`).
///
/// # Errors
/// A value-free message when the pass could not run or had failed batches (the cycle
/// is recorded `failed`; the rows are retried next cycle).
pub async fn webhook_retention_cycle(
    pool: &PgPool,
    config: &Config,
) -> Result<keel_webhooks::WebhookRetentionReport, String> {
    let report = keel_webhooks::retention_pass(
        pool,
        config.webhooks.to_config().retention,
        i64::from(config.retention.batch_size),
        config.retention.max_batches_per_pass,
    )
    .await
    .map_err(|e| e.to_string())?;
    if report.failures > 0 {
        return Err(format!(
            "webhook retention pass had {} failed batches (retried next cycle)",
            report.failures
        ));
    }
    Ok(report)
}

/// How often a runner evaluates and exports the health of [`RUNNER_JOBS`].
pub const JOB_HEALTH_INTERVAL: Duration = Duration::from_secs(30);

/// How often the executor's task is checked for an early end.
pub const EXECUTOR_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The cluster role of a process role; `None` for `api`, which owns nothing.
pub fn cluster_role(role: Role) -> Option<keel_cluster::Role> {
    match role {
        Role::Api => None,
        Role::Runner => Some(keel_cluster::Role::Runner),
        Role::Indexer => Some(keel_cluster::Role::Indexer),
    }
}

/// The host name recorded in the registry: `cluster.host`, else the kernel's host name,
/// else `$HOSTNAME`, else `unknown`.
pub fn host_name(config: &Config) -> String {
    if !config.cluster.host.is_empty() {
        return config.cluster.host.clone();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .map(|mut h| {
            h.truncate(255);
            h
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The [`OwnerConfig`] of a replica of `role` from the configuration.
pub fn owner_config(config: &Config, role: keel_cluster::Role) -> OwnerConfig {
    let mut owner = OwnerConfig::new(role, config.durable.sharding.shards, host_name(config));
    owner.refresh_interval = config.cluster.refresh_interval();
    owner.liveness_window = config.cluster.liveness_window();
    owner
}

/// The retention pass's settings from `[retention]`.
pub fn retention_config(settings: &RetentionSettings) -> RetentionConfig {
    RetentionConfig {
        window: Duration::from_secs(u64::from(settings.window_days) * 86_400),
        batch_size: settings.batch_size,
        max_batches_per_pass: settings.max_batches_per_pass,
        lock_timeout: Duration::from_millis(settings.lock_timeout_ms),
    }
}

/// The daily retention cron job: every 24 h at `hourUtc`:00 UTC.
pub fn retention_job(settings: &RetentionSettings) -> CronJob {
    CronJob::new(
        RETENTION_JOB,
        Schedule::every(Duration::from_secs(86_400))
            .offset(Duration::from_secs(u64::from(settings.hour_utc) * 3600)),
    )
}

/// What one retention cycle deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionCycle {
    /// The durable tables' pass.
    pub durable: RetentionReport,
    /// `cluster_replica` rows of crashed replicas deleted.
    pub stale_replicas: u64,
    /// `cron_cycle` records older than the window deleted (each job's latest is kept).
    pub cron_cycles: u64,
}

impl RetentionCycle {
    /// Rows deleted in all (the cycle's reported work items).
    pub fn deleted(&self) -> u64 {
        self.durable.deleted() + self.stale_replicas + self.cron_cycles
    }
}

/// One retention cycle: the durable tables' pass ([`Retention::run_once`]), then the
/// registry rows of crashed replicas (silent for `stale_after`, at least one liveness
/// window) and the cycle records older than the retention window.
///
/// # Errors
/// A value-free message when a part of the cycle could not run, or when the durable pass had
/// failed batches (the cycle is recorded `failed`; its rows are retried next cycle).
pub async fn retention_cycle(
    retention: &Retention,
    pool: &PgPool,
    stale_after: Duration,
    liveness_window: Duration,
    stop: &CancellationToken,
) -> Result<RetentionCycle, String> {
    let durable = retention.run_once(stop).await.map_err(|e| e.to_string())?;
    let stale_replicas = keel_cluster::prune_stale_replicas(pool, stale_after, liveness_window)
        .await
        .map_err(|e| e.to_string())?;
    let config = retention.config();
    let cron_cycles = keel_cluster::prune_cron_cycles(
        pool,
        config.window,
        config.batch_size,
        config.max_batches_per_pass,
    )
    .await
    .map_err(|e| e.to_string())?;
    tracing::info!(target: TARGET, stale_replicas, cron_cycles, "cluster records pruned");
    if durable.failures > 0 {
        return Err(format!(
            "retention pass had {} failed batches (retried next cycle)",
            durable.failures
        ));
    }
    Ok(RetentionCycle {
        durable,
        stale_replicas,
        cron_cycles,
    })
}

/// The runner's job-health reporting as a background service (`job-health`): each run
/// evaluates and exports the health of [`RUNNER_JOBS`] (`keel_cluster_cron_job_state`)
/// and idles [`JOB_HEALTH_INTERVAL`]; a failed read is logged at WARN and retried after
/// the same interval.
struct JobHealthReport {
    pool: PgPool,
}

impl keel_service::BackgroundService for JobHealthReport {
    type Error = keel_cluster::ClusterError;

    fn name(&self) -> &'static str {
        "job-health"
    }

    async fn run_once(&mut self) -> Result<keel_service::Report, Self::Error> {
        let jobs = keel_cluster::report_job_health(&self.pool, &RUNNER_JOBS).await?;
        Ok(keel_service::Report::idle(jobs.len() as u64))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}

/// The running parts of a role: its shard owner and named supervised tasks.
#[derive(Debug)]
pub struct RoleRuntime {
    owner: Option<ShardOwner>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    executor: Option<keel_durable::ExecutorHandle>,
    stop: CancellationToken,
    supervisor: Supervisor,
    chains: Option<ChainSet>,
}

impl RoleRuntime {
    /// Starts what `role` runs. `api` starts nothing (its server is supervised by the
    /// binary with [`RoleRuntime::supervisor`]).
    ///
    /// # Errors
    /// When the shard owner cannot start — notably when the database records another
    /// shard count than `durable.sharding.shards` (the process must not start) — or a
    /// job or setting is invalid. `signers` are the process's keys, built once at start
    /// ([`crate::signer::Signers::load`]).
    pub async fn start(
        role: Role,
        config: &Config,
        pool: &PgPool,
        signers: &crate::signer::Signers,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let supervisor = Supervisor::new(&config.supervision, stop.clone());
        let Some(cluster_role) = cluster_role(role) else {
            return Ok(Self {
                owner: None,
                tasks: Vec::new(),
                executor: None,
                stop,
                supervisor,
                chains: None,
            });
        };
        let connect = PgConnectOptions::from_str(&config.database.url)
            .context("configuration key `database.url`: not a valid postgres:// URL")?;
        let owner = ShardOwner::start(connect, owner_config(config, cluster_role))
            .await
            .with_context(|| format!("starting the {} replica's shard ownership", role.as_str()))?;
        tracing::info!(target: TARGET, replica = %owner.replica_id(),
            group = cluster_role.shard_group(), shards = owner.shards(), "shard owner started");
        let chains = ChainSet::new(config, role.as_str());
        let mut runtime = Self {
            owner: None,
            tasks: Vec::new(),
            executor: None,
            stop,
            supervisor,
            chains: Some(chains.clone()),
        };
        if role == Role::Runner {
            runtime.start_runner_jobs(&owner, config, pool).await?;
            let services = crate::services::start_runner(
                config,
                pool,
                &owner,
                &chains,
                &runtime.supervisor,
                signers,
            )
            .await?;
            runtime.executor = Some(services.executor);
            runtime.tasks.extend(services.tasks);
        }
        if role == Role::Indexer {
            let tasks =
                crate::services::start_indexer(config, pool, &owner, &chains, &runtime.supervisor)
                    .await?;
            runtime.tasks.extend(tasks);
        }
        runtime.owner = Some(owner);
        Ok(runtime)
    }

    /// The role's supervisor (for tasks the binary starts itself, e.g. the API server).
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// The chains this process serves and does not serve; `None` for `api`, which
    /// serves no chain.
    pub fn chains(&self) -> Option<ChainReport> {
        self.chains.as_ref().map(ChainSet::report)
    }

    /// The chain set (runner and indexer).
    pub fn chain_set(&self) -> Option<&ChainSet> {
        self.chains.as_ref()
    }

    /// Resolves when a critical task ended for good (its restart budget spent, or a
    /// task that is not restarted: a singleton supervisor, the executor, the API
    /// server), with a message naming it. Pending forever while everything runs.
    pub async fn failed(&self) -> String {
        let Some(executor) = self.executor.as_ref() else {
            return self.supervisor.failed().await;
        };
        let mut tick = tokio::time::interval(EXECUTOR_CHECK_INTERVAL);
        loop {
            tokio::select! {
                reason = self.supervisor.failed() => return reason,
                _ = tick.tick() => {
                    if executor.is_finished() {
                        self.supervisor.fail("executor", "its task ended");
                    }
                }
            }
        }
    }

    async fn start_runner_jobs(
        &mut self,
        owner: &ShardOwner,
        config: &Config,
        pool: &PgPool,
    ) -> anyhow::Result<()> {
        let retention = Retention::new(pool.clone(), retention_config(&config.retention))
            .context("configuration section `retention`")?;
        let job = retention_job(&config.retention);
        keel_cluster::register_job(pool, &job)
            .await
            .context("registering the retention job")?;
        let liveness = config.cluster.liveness_window();
        let stale_after = liveness * config.retention.stale_replica_windows;
        let work_pool = pool.clone();
        let cron = owner
            .cron(pool.clone(), job, move |cycle: CronCycle| {
                let retention = retention.clone();
                let pool = work_pool.clone();
                async move {
                    // Spawned, so a panic fails this cycle (recorded `failed`) instead of
                    // ending the job's loop on this replica.
                    let token = cycle.token.clone();
                    let run = tokio::spawn(async move {
                        retention_cycle(&retention, &pool, stale_after, liveness, &token).await
                    });
                    match run.await {
                        Ok(done) => Ok::<u64, String>(done?.deleted()),
                        Err(_) => Err("the retention cycle panicked".to_owned()),
                    }
                }
            })
            .context("starting the retention job")?;
        self.tasks.push((
            "retention-cron",
            self.supervisor.watch("retention-cron", cron),
        ));

        let webhook_job = webhook_retention_job(&config.retention);
        keel_cluster::register_job(pool, &webhook_job)
            .await
            .context("registering the webhook retention job")?;
        let (work_pool, work_config) = (pool.clone(), config.clone());
        let webhook_cron = owner
            .cron(pool.clone(), webhook_job, move |_cycle: CronCycle| {
                let (pool, config) = (work_pool.clone(), work_config.clone());
                async move {
                    let run =
                        tokio::spawn(async move { webhook_retention_cycle(&pool, &config).await });
                    match run.await {
                        Ok(done) => Ok::<u64, String>(done?.deleted()),
                        Err(_) => Err("the webhook retention cycle panicked".to_owned()),
                    }
                }
            })
            .context("starting the webhook retention job")?;
        self.tasks.push((
            "webhooks-retention-cron",
            self.supervisor
                .watch("webhooks-retention-cron", webhook_cron),
        ));

        let sweep_job = org_system_sweep_job(&config.organizations);
        keel_cluster::register_job(pool, &sweep_job)
            .await
            .context("registering the organization systems sweep")?;
        let ops = keel_workflows::ops::Ops::new(
            pool.clone(),
            keel_durable::Engine::new(pool.clone(), crate::services::engine_config(config))
                .map_err(|e| anyhow::anyhow!("durable engine: {e}"))?,
        );
        let abandon_after = Duration::from_secs(config.organizations.abandon_after_seconds);
        let sweep_cron = owner
            .cron(pool.clone(), sweep_job, move |_cycle: CronCycle| {
                let ops = ops.clone();
                async move {
                    let run =
                        tokio::spawn(
                            async move { ops.sweep_abandoned_systems(abandon_after).await },
                        );
                    match run.await {
                        Ok(Ok(report)) => Ok::<u64, String>(report.failed),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("the organization systems sweep panicked".to_owned()),
                    }
                }
            })
            .context("starting the organization systems sweep")?;
        self.tasks.push((
            "org-systems-sweep-cron",
            self.supervisor.watch("org-systems-sweep-cron", sweep_cron),
        ));

        let (health_pool, health_stop) = (pool.clone(), self.stop.clone());
        let health = self.supervisor.spawn("job-health", move || {
            let service = JobHealthReport {
                pool: health_pool.clone(),
            };
            let pacing = keel_service::ServiceConfig::new(JOB_HEALTH_INTERVAL)
                .with_backoff(JOB_HEALTH_INTERVAL, JOB_HEALTH_INTERVAL);
            let stop = health_stop.clone();
            async move {
                keel_service::run(service, pacing, stop).await;
            }
        });
        self.tasks.push(("job-health", health));
        Ok(())
    }

    /// This replica's registry id, when it owns shards.
    pub fn replica_id(&self) -> Option<sqlx::types::Uuid> {
        self.owner.as_ref().map(ShardOwner::replica_id)
    }

    /// Stops the tasks and releases every shard within `grace`. Returns false when the
    /// grace ran out (the process exits anyway; its session's end frees the locks).
    pub async fn stop(self, grace: Duration) -> bool {
        let started = std::time::Instant::now();
        self.stop.cancel();
        if let Some(executor) = self.executor
            && !executor.shutdown_within(grace).await
        {
            tracing::warn!(target: TARGET, "segments still running at the end of the grace were abandoned; their leases lapse");
        }
        let grace = grace.saturating_sub(started.elapsed());
        for (name, task) in &self.tasks {
            task.abort();
            tracing::debug!(target: TARGET, task = name, "task stopped");
        }
        let Some(owner) = self.owner else {
            return true;
        };
        let released = tokio::time::timeout(grace, owner.shutdown()).await.is_ok();
        if released {
            tracing::info!(target: TARGET, "shards released");
        } else {
            tracing::warn!(target: TARGET, grace_seconds = grace.as_secs(),
                "shard release did not finish within the termination grace");
        }
        released
    }
}
