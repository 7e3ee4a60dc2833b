//! [`ShardOwner`]: one replica's ownership of shards through session advisory locks on
//! a reserved connection.

use crate::config::{OwnerConfig, Timing};
use crate::cron::{CronCycle, CronJob};
use crate::hash::{assignment_declining, group_key};
use crate::{ClusterError, Result, lock, registry};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};
use uuid::Uuid;

const TARGET: &str = "keel::cluster::owner";

/// Ownership of one shard by this replica, from the moment its work may start (lock held
/// and handoff delay elapsed) until it is lost.
///
/// The [`token`](ShardLease::token) fires when the shard is lost for any reason:
/// reassigned to another replica, the reserved connection failed or overran a deadline,
/// or the owner shut down. Work running under a lease must stop writing when it fires.
#[derive(Debug, Clone)]
pub struct ShardLease {
    shard: u32,
    generation: u64,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl ShardLease {
    /// The shard, in `0..shards`.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// A number unique among this owner's leases, increasing with each acquisition: a
    /// shard lost and re-acquired has a new generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Fires when the shard is lost.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Spawns `work` as part of this lease: when the shard is released on reassignment,
    /// the owner cancels the token and waits (up to its lock deadline) for such tasks to
    /// finish before unlocking.
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(work)
    }
}

/// The shards this replica currently owns (a snapshot published by the owner whenever
/// it changes).
#[derive(Debug, Clone, Default)]
pub struct OwnedShards {
    leases: Arc<BTreeMap<u32, ShardLease>>,
}

impl OwnedShards {
    /// The owned shards, ascending.
    pub fn shards(&self) -> BTreeSet<u32> {
        self.leases.keys().copied().collect()
    }

    /// The lease of `shard`, if owned.
    pub fn get(&self, shard: u32) -> Option<&ShardLease> {
        self.leases.get(&shard)
    }

    /// Whether `shard` is owned.
    pub fn contains(&self, shard: u32) -> bool {
        self.leases.contains_key(&shard)
    }

    /// All leases, by shard.
    pub fn leases(&self) -> impl Iterator<Item = &ShardLease> {
        self.leases.values()
    }

    /// Number of owned shards.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// True when nothing is owned.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

/// A replica's shard ownership.
///
/// [`ShardOwner::start`] reserves one dedicated connection (not pooled) for the life of
/// the owner, registers the replica in `cluster_replica` and spawns the ownership loop.
/// Every refresh interval the loop, on that connection:
///
/// 1. heartbeats (`cluster_replica.heartbeat_at = now()`);
/// 2. reads the live replicas of its shard group (heartbeat within the liveness window);
/// 3. re-asserts its locks from `pg_locks` — a lock it believed held and is missing is a
///    fault;
/// 4. computes its assignment by rendezvous hashing over the live set;
/// 5. releases shards no longer assigned: cancels their tokens, waits (bounded) for their
///    work, then `pg_advisory_unlock`;
/// 6. tries to lock newly assigned shards (`pg_try_advisory_lock`, never waits). A shard
///    whose lock is taken is retried at the next refresh.
///
/// A newly locked shard becomes owned (published in [`ShardOwner::owned`], with a fresh
/// [`ShardLease`]) after the handoff delay, so a previous owner whose connection was cut
/// has noticed and stopped before work starts here.
///
/// Each operation runs under the lock deadline (client timeout and server
/// `statement_timeout`). An overrun or an error cancels every lease, drops the connection
/// and rejoins with a new one after a backoff; the new connection first terminates the
/// old session if it still exists, so locks held by a hung session are freed.
///
/// Hazard: a process stalled as a whole (e.g. `SIGSTOP`) for longer than the handoff
/// delay can resume and write under a lease that another replica has since taken; writes
/// that must never interleave need their own fencing (an owner epoch checked in the same
/// transaction).
#[derive(Debug)]
pub struct ShardOwner {
    id: Uuid,
    shards: u32,
    timing: Timing,
    owned: watch::Receiver<OwnedShards>,
    pid: watch::Receiver<Option<i32>>,
    declines: Arc<Declines>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// The singletons this replica cannot serve right now, and the shards they make it
/// decline (published to the ownership loop, recorded with every heartbeat).
#[derive(Debug)]
struct Declines {
    by_name: Mutex<BTreeMap<String, u32>>,
    shards: watch::Sender<BTreeSet<u32>>,
}

impl Declines {
    fn set(&self, name: &str, shard: u32, declined: bool) {
        let mut names = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = if declined {
            names.insert(name.to_owned(), shard).is_none()
        } else {
            names.remove(name).is_some()
        };
        if changed {
            let shards: BTreeSet<u32> = names.values().copied().collect();
            debug!(target: TARGET, name, shard, declined, "singleton availability changed");
            self.shards.send_replace(shards);
        }
    }
}

impl ShardOwner {
    /// Validates `config`, connects the reserved connection with `connect` (its
    /// `application_name` is set to `keel-cluster/<group>/<replica id>`), checks the
    /// shard count, registers the replica and starts the ownership loop.
    ///
    /// # Errors
    /// [`ClusterError::Config`] for an invalid configuration;
    /// [`ClusterError::ShardCountMismatch`] when the database records another shard count
    /// (the process must not start); [`ClusterError::Deadline`] or
    /// [`ClusterError::Store`] when the connection or registration still fails after
    /// a few attempts (retryable failures are retried, a refresh interval times the
    /// attempt apart).
    pub async fn start(connect: PgConnectOptions, config: OwnerConfig) -> Result<Self> {
        let timing = config.timing()?;
        let id = Uuid::new_v4();
        let group = config.role.shard_group();
        let application_name = format!("keel-cluster/{group}/{id}");
        let deadline_ms = u64::try_from(timing.lock_deadline.as_millis()).unwrap_or(u64::MAX);
        let options = connect
            .application_name(&application_name)
            .options([("statement_timeout", format!("{deadline_ms}ms"))]);

        // A deadline overrun (a loaded machine) or a transient database error is retried
        // a few times before the process gives up; a shard count mismatch is not.
        let mut attempt: u32 = 0;
        let (conn, pid) = loop {
            attempt += 1;
            match register(&options, &config, id, group, timing).await {
                Ok(done) => break done,
                Err(err) if err.is_retryable() && attempt < START_ATTEMPTS => {
                    warn!(target: TARGET, replica = %id, error = %err, attempt,
                        "registration failed; retrying");
                    tokio::time::sleep(timing.refresh_interval * attempt).await;
                }
                Err(err) => return Err(err),
            }
        };
        info!(target: TARGET, replica = %id, group, pid, shards = config.shards, "replica registered");

        let (owned_tx, owned) = watch::channel(OwnedShards::default());
        let (pid_tx, pid_rx) = watch::channel(Some(pid));
        let (declined_tx, declined) = watch::channel(BTreeSet::new());
        let declines = Arc::new(Declines {
            by_name: Mutex::new(BTreeMap::new()),
            shards: declined_tx,
        });
        let stop = CancellationToken::new();
        let root = stop.child_token();
        let worker = Worker {
            id,
            group,
            group_key: group_key(group),
            role: config.role.as_str(),
            host: config.host.clone(),
            shards: config.shards,
            timing,
            options,
            application_name,
            conn: Some(Reserved { conn, pid }),
            stale_pid: None,
            held: BTreeMap::new(),
            generation: 0,
            failures: 0,
            _cancel_on_drop: root.clone().drop_guard(),
            root,
            owned_tx,
            pid_tx,
            declined,
        };
        let task = tokio::spawn(worker.run(stop.clone()));
        Ok(Self {
            id,
            shards: config.shards,
            timing,
            owned,
            pid: pid_rx,
            declines,
            stop,
            task: Some(task),
        })
    }

    /// This replica's id (its `cluster_replica` row).
    pub fn replica_id(&self) -> Uuid {
        self.id
    }

    /// The shard count.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The validated timings.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// A receiver of the owned shards; it sees every change.
    pub fn owned(&self) -> watch::Receiver<OwnedShards> {
        self.owned.clone()
    }

    /// The shards owned right now.
    pub fn snapshot(&self) -> OwnedShards {
        self.owned.borrow().clone()
    }

    /// The backend pid of the reserved connection, `None` while it is being rebuilt (for
    /// operators and tests, e.g. `pg_terminate_backend`).
    pub fn lock_backend_pid(&self) -> Option<i32> {
        *self.pid.borrow()
    }

    /// Runs `work` for every shard this replica owns, each under its shard's lease: a
    /// task per owned shard, started when the shard becomes owned, whose
    /// [`ShardLease::token`] fires when the shard is lost. A task that returns while its
    /// shard is still owned is started again after one refresh interval.
    ///
    /// The returned handle supervises; aborting it stops starting new tasks (running ones
    /// stop with their leases).
    pub fn run_per_shard<F, Fut>(&self, work: F) -> JoinHandle<()>
    where
        F: Fn(ShardLease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        supervise(self.owned(), self.timing.refresh_interval, |_| true, work)
    }

    /// Runs `work` only while this replica owns `shard` (see [`ShardOwner::run_per_shard`]).
    pub fn run_on_shard<F, Fut>(&self, shard: u32, work: F) -> JoinHandle<()>
    where
        F: Fn(ShardLease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        supervise(
            self.owned(),
            self.timing.refresh_interval,
            move |s| s == shard,
            work,
        )
    }

    /// Runs the long-lived task `work` on exactly one live replica of the shard group:
    /// the owner of [`crate::shard_of`]`(name, shards)`. It runs only while this replica
    /// owns that shard, stops when its lease's token fires, and starts on whichever
    /// replica owns the shard next. Every replica calls `singleton` with the same name.
    ///
    /// `name` identifies the task and its key, e.g. `tip-ingest/1`.
    pub fn singleton<F, Fut>(&self, name: &str, work: F) -> JoinHandle<()>
    where
        F: Fn(ShardLease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let shard = crate::shard_of(name.as_bytes(), self.shards);
        debug!(target: TARGET, name, shard, "singleton registered");
        self.run_on_shard(shard, work)
    }

    /// Like [`ShardOwner::singleton`], but `work` runs here only while `serving` is
    /// true: the replica can serve the task (e.g. reach the chain a queue loop sends
    /// to). While `serving` is false this replica *declines* the name's shard (recorded
    /// with its heartbeat), so rendezvous hashing gives the shard to a live replica
    /// that does not decline it ([`crate::assignment_declining`]; when every live
    /// replica declines it, its plain owner keeps it, with the task not running). When
    /// `serving` turns false while `work` runs, the lease handed to `work` fires (the
    /// shard's lease itself is unaffected); `work` is started again once `serving` is
    /// true and the shard still owned. A dropped `serving` sender counts as false.
    pub fn singleton_while<F, Fut>(
        &self,
        name: &str,
        serving: watch::Receiver<bool>,
        work: F,
    ) -> JoinHandle<()>
    where
        F: Fn(ShardLease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let shard = crate::shard_of(name.as_bytes(), self.shards);
        debug!(target: TARGET, name, shard, "conditional singleton registered");
        let declines = Arc::clone(&self.declines);
        let key = name.to_owned();
        let mut availability = serving.clone();
        let decliner = async move {
            loop {
                let now = *availability.borrow_and_update();
                declines.set(&key, shard, !now);
                if availability.changed().await.is_err() {
                    declines.set(&key, shard, true);
                    break;
                }
            }
        };
        let work = Arc::new(work);
        let runner = self.run_on_shard(shard, move |lease| {
            let work = Arc::clone(&work);
            let mut serving = serving.clone();
            async move {
                loop {
                    if *serving.borrow_and_update() {
                        break;
                    }
                    tokio::select! {
                        () = lease.token.cancelled() => return,
                        changed = serving.changed() => if changed.is_err() { return },
                    }
                }
                let token = lease.token.child_token();
                let narrowed = ShardLease {
                    token: token.clone(),
                    ..lease.clone()
                };
                let run = work(narrowed);
                tokio::pin!(run);
                let mut watching = true;
                loop {
                    tokio::select! {
                        () = &mut run => break,
                        changed = serving.changed(), if watching => {
                            if changed.is_err() || !*serving.borrow_and_update() {
                                token.cancel();
                                watching = false;
                            }
                        }
                    }
                }
            }
        });
        tokio::spawn(async move {
            // Aborting the returned handle drops this future, and with it the shard
            // supervisor (as aborting a plain singleton's handle does).
            let mut runner = AbortOnDrop(runner);
            tokio::pin!(decliner);
            tokio::select! {
                () = &mut decliner => {
                    let _ = (&mut runner.0).await;
                }
                _ = &mut runner.0 => {}
            }
        })
    }

    /// Runs `work` once per cycle of `job` on exactly one replica: the owner of
    /// [`crate::shard_of`]`("cron/" + name)`, as a [`ShardOwner::singleton`].
    ///
    /// Each cycle is keyed by (name, scheduled time) and recorded in `cron_cycle`
    /// *before* `work` starts; a recorded cycle is never started again, by this replica
    /// or the next owner after a handoff (at most once per key; a cycle interrupted by a
    /// handoff stays unfinished). A cycle's `Ok` value reports its work items
    /// ([`crate::CronReport`]: `()` or a count), recorded for [`crate::job_health`].
    /// Missed cycles are caught up, at most
    /// [`CronJob::max_catch_up_per_pass`] per pass. `work` must stop writing when
    /// [`CronCycle::token`] fires. The clock is the database's.
    ///
    /// # Errors
    /// [`ClusterError::Config`] for an invalid job.
    pub fn cron<F, Fut, T, E>(&self, pool: PgPool, job: CronJob, work: F) -> Result<JoinHandle<()>>
    where
        F: Fn(CronCycle) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        T: crate::CronReport + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        job.validate()?;
        let replica = self.id;
        let work = Arc::new(work);
        let name = format!("cron/{}", job.name);
        Ok(self.singleton(&name, move |lease| {
            let pool = pool.clone();
            let job = job.clone();
            let work = Arc::clone(&work);
            async move { crate::cron::run(pool, replica, job, lease, work.as_ref()).await }
        }))
    }

    /// Stops gracefully: cancels every lease, waits (bounded) for work spawned under
    /// leases, unlocks everything, deletes the replica's registry row and closes the
    /// reserved connection. Peers take over at their next refresh.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Attempts of [`ShardOwner::start`]'s connection and registration when they fail
/// retryably (a deadline overrun, a transient database error).
const START_ATTEMPTS: u32 = 5;

/// Connects the reserved connection, checks the shard count and registers the replica,
/// each under its deadline. Returns the connection and its backend pid.
async fn register(
    options: &PgConnectOptions,
    config: &OwnerConfig,
    id: Uuid,
    group: &'static str,
    timing: Timing,
) -> Result<(PgConnection, i32)> {
    let deadline_ms = millis(timing.lock_deadline);
    let connect_deadline = timing.refresh_interval.max(timing.lock_deadline);
    let mut conn = timeout(connect_deadline, options.connect())
        .await
        .map_err(|_| ClusterError::Deadline {
            op: "connect",
            deadline_ms: millis(connect_deadline),
        })??;
    let checked = async {
        registry::check_shard_count(&mut conn, config.shards).await?;
        registry::heartbeat(
            &mut conn,
            id,
            group,
            config.role.as_str(),
            &config.host,
            &BTreeSet::new(),
        )
        .await?;
        lock::backend_pid(&mut conn).await
    };
    let pid =
        timeout(timing.lock_deadline, checked)
            .await
            .map_err(|_| ClusterError::Deadline {
                op: "register",
                deadline_ms,
            })??;
    Ok((conn, pid))
}

impl Drop for ShardOwner {
    fn drop(&mut self) {
        // Without `shutdown`, the loop still releases and deregisters in the background.
        self.stop.cancel();
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn supervise<P, F, Fut>(
    mut owned: watch::Receiver<OwnedShards>,
    restart_delay: Duration,
    pick: P,
    work: F,
) -> JoinHandle<()>
where
    P: Fn(u32) -> bool + Send + 'static,
    F: Fn(ShardLease) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let work = Arc::new(work);
    tokio::spawn(async move {
        let mut started: BTreeMap<u32, u64> = BTreeMap::new();
        loop {
            let snapshot = owned.borrow_and_update().clone();
            started.retain(|shard, generation| {
                snapshot.get(*shard).map(ShardLease::generation) == Some(*generation)
            });
            for lease in snapshot.leases() {
                if !pick(lease.shard)
                    || started.contains_key(&lease.shard)
                    || lease.token.is_cancelled()
                {
                    continue;
                }
                started.insert(lease.shard, lease.generation);
                let work = Arc::clone(&work);
                let run = lease.clone();
                lease.spawn(async move {
                    while !run.token.is_cancelled() {
                        work(run.clone()).await;
                        tokio::select! {
                            () = run.token.cancelled() => break,
                            () = tokio::time::sleep(restart_delay) => {}
                        }
                    }
                });
            }
            if owned.changed().await.is_err() {
                break;
            }
        }
    })
}

struct Reserved {
    conn: PgConnection,
    pid: i32,
}

struct Held {
    lease: ShardLease,
    /// When the lock was acquired; `None` once the lease is published.
    pending_since: Option<Instant>,
}

struct Worker {
    id: Uuid,
    group: &'static str,
    group_key: i32,
    role: &'static str,
    host: String,
    shards: u32,
    timing: Timing,
    options: PgConnectOptions,
    application_name: String,
    conn: Option<Reserved>,
    /// The pid of a reserved session dropped after a fault, terminated by the next one.
    stale_pid: Option<i32>,
    held: BTreeMap<u32, Held>,
    generation: u64,
    failures: u32,
    root: CancellationToken,
    /// Cancels every lease if the loop's future is dropped (e.g. runtime shutdown).
    _cancel_on_drop: DropGuard,
    owned_tx: watch::Sender<OwnedShards>,
    pid_tx: watch::Sender<Option<i32>>,
    /// Shards this replica declines ([`ShardOwner::singleton_while`]).
    declined: watch::Receiver<BTreeSet<u32>>,
}

impl Worker {
    async fn run(mut self, stop: CancellationToken) {
        let mut next_pass = Instant::now();
        loop {
            let activation = self.next_activation();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = sleep_until(next_pass) => {
                    match self.pass().await {
                        Ok(()) => {
                            self.failures = 0;
                            next_pass = Instant::now() + self.timing.refresh_interval;
                        }
                        Err(err) => {
                            self.failures = self.failures.saturating_add(1);
                            warn!(target: TARGET, replica = %self.id, error = %err,
                                failures = self.failures, "shard ownership fault: releasing every shard and rejoining");
                            crate::metrics::fault(self.group, &err);
                            self.fail().await;
                            next_pass = Instant::now() + self.backoff();
                        }
                    }
                }
                () = sleep_until(activation.unwrap_or(next_pass)), if activation.is_some() => {
                    self.activate();
                }
            }
        }
        self.shutdown().await;
    }

    fn backoff(&self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(4);
        (self.timing.refresh_interval * (1 << exp)).min(self.timing.liveness_window)
    }

    fn deadline_ms(&self) -> u64 {
        millis(self.timing.lock_deadline)
    }

    /// Runs one lock operation under the lock deadline.
    async fn op<T>(
        deadline: Duration,
        name: &'static str,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        timeout(deadline, fut)
            .await
            .map_err(|_| ClusterError::Deadline {
                op: name,
                deadline_ms: millis(deadline),
            })?
    }

    async fn connect(&mut self) -> Result<()> {
        let deadline = self.timing.lock_deadline;
        let connect_deadline = self.timing.refresh_interval.max(deadline);
        let mut conn = timeout(connect_deadline, self.options.connect())
            .await
            .map_err(|_| ClusterError::Deadline {
                op: "connect",
                deadline_ms: millis(connect_deadline),
            })??;
        let pid = Self::op(deadline, "connect", lock::backend_pid(&mut conn)).await?;
        if let Some(stale) = self.stale_pid {
            let wait_ms = i64::try_from(self.deadline_ms() / 2).unwrap_or(0);
            Self::op(
                deadline,
                "reap",
                lock::reap(&mut conn, stale, &self.application_name, wait_ms),
            )
            .await?;
            self.stale_pid = None;
        }
        info!(target: TARGET, replica = %self.id, pid, "reserved connection (re)built");
        self.conn = Some(Reserved { conn, pid });
        self.pid_tx.send_replace(Some(pid));
        Ok(())
    }

    async fn pass(&mut self) -> Result<()> {
        if self.conn.is_none() {
            self.connect().await?;
        }
        let deadline = self.timing.lock_deadline;
        let Some(reserved) = self.conn.as_mut() else {
            return Ok(());
        };
        let conn = &mut reserved.conn;
        let mine = self.declined.borrow().clone();
        Self::op(
            deadline,
            "heartbeat",
            registry::heartbeat(conn, self.id, self.group, self.role, &self.host, &mine),
        )
        .await?;
        let live = Self::op(
            deadline,
            "live_set",
            registry::live_replicas(conn, self.group, self.timing.liveness_window),
        )
        .await?;
        let locked = Self::op(deadline, "check", lock::held(conn, self.group_key)).await?;
        if let Some(lost) = self.held.keys().find(|s| !locked.contains(s)) {
            return Err(ClusterError::LockLost { shard: *lost });
        }
        let live: Vec<(Uuid, BTreeSet<u32>)> =
            live.into_iter().map(|r| (r.id, r.declined)).collect();
        let desired = assignment_declining(self.id, &mine, &live, self.shards);

        let to_release: BTreeSet<u32> = self
            .held
            .keys()
            .filter(|s| !desired.contains(s))
            .copied()
            .collect();
        if !to_release.is_empty() {
            let leases: Vec<ShardLease> = to_release
                .iter()
                .filter_map(|s| self.held.remove(s))
                .map(|h| h.lease)
                .collect();
            self.publish();
            drain(&leases, deadline).await;
            let Some(reserved) = self.conn.as_mut() else {
                return Ok(());
            };
            Self::op(
                deadline,
                "release",
                lock::release(&mut reserved.conn, self.group_key, &to_release),
            )
            .await?;
            info!(target: TARGET, replica = %self.id, released = ?to_release, "shards released");
        }

        let to_acquire: BTreeSet<u32> = desired
            .iter()
            .filter(|s| !self.held.contains_key(s))
            .copied()
            .collect();
        if !to_acquire.is_empty() {
            let Some(reserved) = self.conn.as_mut() else {
                return Ok(());
            };
            let got = Self::op(
                deadline,
                "acquire",
                lock::try_acquire(&mut reserved.conn, self.group_key, &to_acquire),
            )
            .await?;
            let now = Instant::now();
            for shard in &got {
                self.generation += 1;
                self.held.insert(
                    *shard,
                    Held {
                        lease: ShardLease {
                            shard: *shard,
                            generation: self.generation,
                            token: self.root.child_token(),
                            tracker: TaskTracker::new(),
                        },
                        pending_since: Some(now),
                    },
                );
            }
            if !got.is_empty() {
                info!(target: TARGET, replica = %self.id, acquired = ?got,
                    busy = to_acquire.len() - got.len(), "shards locked; owned after the handoff delay");
            }
        }
        self.activate();
        Ok(())
    }

    fn next_activation(&self) -> Option<Instant> {
        self.held
            .values()
            .filter_map(|h| h.pending_since)
            .min()
            .map(|t| t + self.timing.handoff_delay)
    }

    /// Publishes shards whose handoff delay has elapsed.
    fn activate(&mut self) {
        let now = Instant::now();
        let mut changed = false;
        for held in self.held.values_mut() {
            if let Some(since) = held.pending_since
                && since + self.timing.handoff_delay <= now
            {
                held.pending_since = None;
                changed = true;
            }
        }
        if changed {
            self.publish();
        }
    }

    fn publish(&self) {
        let leases = self
            .held
            .iter()
            .filter(|(_, h)| h.pending_since.is_none())
            .map(|(s, h)| (*s, h.lease.clone()))
            .collect();
        let owned = OwnedShards {
            leases: Arc::new(leases),
        };
        crate::metrics::owned_shards(self.group, owned.len());
        self.owned_tx.send_replace(owned);
    }

    /// After a fault: cancel every lease, wait (bounded) for its work, drop the
    /// connection (its session, if still alive, is terminated by the next connection).
    async fn fail(&mut self) {
        let leases: Vec<ShardLease> = std::mem::take(&mut self.held)
            .into_values()
            .map(|h| h.lease)
            .collect();
        self.publish();
        drain(&leases, self.timing.lock_deadline).await;
        if let Some(reserved) = self.conn.take() {
            self.stale_pid = Some(reserved.pid);
            drop(reserved.conn);
        }
        self.pid_tx.send_replace(None);
    }

    async fn shutdown(&mut self) {
        let leases: Vec<ShardLease> = std::mem::take(&mut self.held)
            .into_values()
            .map(|h| h.lease)
            .collect();
        self.publish();
        drain(&leases, self.timing.lock_deadline).await;
        if let Some(mut reserved) = self.conn.take() {
            let deadline = self.timing.lock_deadline;
            let id = self.id;
            let done = Self::op(deadline, "release", async {
                sqlx::query("SELECT pg_advisory_unlock_all()")
                    .execute(&mut reserved.conn)
                    .await?;
                registry::deregister(&mut reserved.conn, id).await
            })
            .await;
            if let Err(err) = done {
                warn!(target: TARGET, replica = %id, error = %err, "graceful release failed; the session's end frees the locks");
            }
            let _ = timeout(deadline, reserved.conn.close()).await;
        }
        self.pid_tx.send_replace(None);
        info!(target: TARGET, replica = %self.id, "replica stopped");
    }
}

/// Cancels the leases and waits up to `bound` for their tracked work to finish.
async fn drain(leases: &[ShardLease], bound: Duration) {
    for lease in leases {
        lease.token.cancel();
        lease.tracker.close();
    }
    let all = async {
        for lease in leases {
            lease.tracker.wait().await;
        }
    };
    if timeout(bound, all).await.is_err() {
        warn!(target: TARGET, "work under released shards did not stop within the lock deadline");
    }
}
