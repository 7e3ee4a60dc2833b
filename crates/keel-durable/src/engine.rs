//! [`Engine`]: start, signal, cancel, retry, status, the terminal-state wait, the idle
//! probe and retention. Their SQL is in [`crate::store`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::actor::{Actor, Attribution, RecordedCommand, RecordedSignal};
use crate::batch::{BatchOp, Combiner, Held, lost, rolled_back};
use crate::config::{EngineConfig, ExecutorConfig};
use crate::context::JournalOp;
use crate::error::{DurableError, Result};
use crate::executor::{self, ExecutorHandle, SettleOp};
use crate::payload::{validate_name, validate_payload_str, validate_value};
use crate::status::{CommandKind, CommandState};
use crate::status::{CommandSummary, IdleReport, InstanceStatus, RunStatus};
use crate::store::{self, NewInstance};
use crate::terminal::TerminalWatch;
use crate::workflow::{Registry, Workflow};

/// The most commands, and the most signals, [`Engine::attribution`] returns.
pub const ATTRIBUTION_LIMIT: i64 = 1000;

/// Options of [`Engine::start`].
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Instances with the same serialization key run one at a time, in start order: a
    /// later instance's START is not claimed while an earlier one with the key is not
    /// `completed` or `cancelled` (a `failed` instance keeps the key, since a retry can
    /// resume it; cancel it to release the key). 1 to 255 characters.
    pub serialization_key: Option<String>,
    /// Who asks for the start, from the caller's authenticated context (never from the
    /// input); stored on the START command. Default [`Actor::none`].
    pub actor: Actor,
}

/// The result of [`Engine::start`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The instance (the existing one when the key was used before with the same input).
    pub instance_id: Uuid,
    /// False when the idempotency key named an existing instance.
    pub created: bool,
    /// Its status at the time of the call (a reused key whose instance failed returns
    /// [`RunStatus::Failed`]: no fresh attempt is made).
    pub status: RunStatus,
}

/// The result of [`Engine::signal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalReceipt {
    /// Recorded with a SIGNAL command.
    Recorded,
    /// A signal with this dedupe key was recorded before; nothing was written.
    Duplicate,
}

/// The result of [`Engine::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The instance was not running a segment and is now `cancelled`.
    Cancelled,
    /// A segment is running: cancellation was requested and takes effect at its next
    /// step boundary (or by the CANCEL command recorded now, whichever comes first).
    Requested,
}

/// Rows deleted by [`Engine::purge`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeCounts {
    /// Settled (`done`) commands deleted.
    pub commands: u64,
    /// Ended instances deleted, with their journal, signals and commands.
    pub instances: u64,
}

/// The engine: API calls on instances and a factory of executors. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) pool: PgPool,
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) registry: Arc<Registry>,
    /// Group commit of concurrent starts (see [`crate::batch`]).
    starts: Arc<Combiner<StartOp>>,
    /// Group commit of the journal writes of every segment of this engine's executors.
    pub(crate) journal: Arc<Combiner<JournalOp>>,
    /// Group commit of the plain segment settles of those segments.
    pub(crate) segment_settles: Arc<Combiner<SettleOp>>,
    /// The shared listener of [`Engine::await_terminal`] (started by its first call).
    terminal: Arc<TerminalWatch>,
    /// The transition hook (see [`crate::hook`]).
    pub(crate) hook: crate::hook::HookSlot,
    /// The decision log's settings (see [`crate::history`]).
    pub(crate) history: Arc<crate::history::HistoryConfig>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("workflows", &self.registry.names())
            .finish()
    }
}

/// Rows per batch statement, and the payload bytes beyond which a batch is cut (a
/// batch always takes at least one row).
pub(crate) const BATCH_ROWS: usize = 64;
pub(crate) const BATCH_BYTES: usize = 1 << 20;
/// Statements in flight per combiner. One: a write that arrives while a batch is in
/// flight goes with the next batch, which leaves as soon as the previous one has
/// committed. (Two flushers measured about the same throughput for ~25% more
/// PostgreSQL CPU per workflow: smaller batches.)
pub(crate) const BATCH_FLUSHERS: usize = 1;

/// The starts of one engine, combined into [`store::instances_insert_many`] statements.
/// The answer is whether the row's instance was created.
#[derive(Debug)]
struct StartOp {
    max_attempts: i32,
}

impl StartOp {
    async fn exec(
        &self,
        held: &mut Held,
        rows: &[NewInstance],
    ) -> std::result::Result<Vec<bool>, sqlx::Error> {
        let r = match held.conn().await {
            Ok(conn) => self.exec_on(conn, rows).await,
            Err(e) => Err(e),
        };
        held.check(&r);
        r
    }

    async fn exec_on(
        &self,
        conn: &mut sqlx::PgConnection,
        rows: &[NewInstance],
    ) -> std::result::Result<Vec<bool>, sqlx::Error> {
        let created = store::instances_insert_many(conn, rows, self.max_attempts).await?;
        let created: std::collections::HashSet<Uuid> = created.into_iter().collect();
        Ok(rows.iter().map(|r| created.contains(&r.id)).collect())
    }
}

impl BatchOp for StartOp {
    type Req = NewInstance;
    type Resp = Result<bool>;

    fn weight(req: &NewInstance) -> usize {
        64 + req.workflow.len() + req.idempotency_key.len() + req.input.len()
    }

    async fn run(&self, held: &mut Held, batch: Vec<NewInstance>) -> Vec<Result<bool>> {
        match self.exec(held, &batch).await {
            Ok(created) => created.into_iter().map(Ok).collect(),
            Err(e) if batch.len() > 1 && rolled_back(&e) => {
                let mut answers = Vec::with_capacity(batch.len());
                for row in &batch {
                    answers.push(match self.exec(held, std::slice::from_ref(row)).await {
                        Ok(created) => Ok(created.first().copied().unwrap_or(false)),
                        Err(e) => Err(DurableError::from(e)),
                    });
                }
                answers
            }
            Err(e) if batch.len() == 1 => vec![Err(DurableError::from(e))],
            Err(e) => batch.iter().map(|_| Err(lost(&e))).collect(),
        }
    }
}

impl Engine {
    /// An engine on `pool` (migrated with [`keel_store::migrate`]).
    ///
    /// # Errors
    /// [`DurableError::Config`] when the configuration is out of bounds.
    pub fn new(pool: PgPool, config: EngineConfig) -> Result<Self> {
        config.validate()?;
        let max_attempts = i32::try_from(config.command_max_attempts).unwrap_or(i32::MAX);
        let starts = Combiner::new(
            StartOp { max_attempts },
            pool.clone(),
            BATCH_ROWS,
            BATCH_BYTES,
            BATCH_FLUSHERS,
        );
        let journal = Combiner::new(
            JournalOp {
                lease_secs: config.lease.as_secs_f64(),
            },
            pool.clone(),
            BATCH_ROWS,
            BATCH_BYTES,
            BATCH_FLUSHERS,
        );
        let hook = crate::hook::HookSlot::default();
        let segment_settles = Combiner::new(
            SettleOp {
                lease_secs: config.lease.as_secs_f64(),
                hook: hook.clone(),
            },
            pool.clone(),
            BATCH_ROWS,
            BATCH_BYTES,
            BATCH_FLUSHERS,
        );
        Ok(Self {
            pool,
            config: Arc::new(config),
            registry: Arc::new(Registry::default()),
            starts,
            journal,
            segment_settles,
            terminal: Arc::new(TerminalWatch::default()),
            hook,
            history: Arc::new(crate::history::HistoryConfig::default()),
        })
    }

    /// The engine with these decision-log settings (see [`crate::history`]; default
    /// [`crate::HistoryConfig::default`]). Set before spawning executors.
    pub fn with_history_config(mut self, config: crate::HistoryConfig) -> Self {
        self.history = Arc::new(config);
        self
    }

    /// Sets the transition hook (see [`crate::hook`]): from now on it runs inside every
    /// transaction of this engine (and its clones) that writes an instance's status.
    /// Set it before spawning executors. Returns false (and changes nothing) when a
    /// hook was set already.
    pub fn set_transition_hook(&self, hook: Arc<dyn crate::TransitionHook>) -> bool {
        self.hook.set(hook).is_ok()
    }

    /// [`Engine::input`] on `conn` (inside the caller's transaction).
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::Store`].
    pub async fn input_in(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
    ) -> Result<Value> {
        store::instance_input(&mut *conn, instance_id)
            .await?
            .ok_or(DurableError::InstanceNotFound(instance_id))
    }

    /// [`Engine::status`] on `conn` (inside the caller's transaction: it sees the
    /// transaction's own writes, as a transition hook needs).
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::Store`].
    pub async fn status_in(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
    ) -> Result<InstanceStatus> {
        match store::instance_status(&mut *conn, instance_id).await? {
            Some(row) => row.try_into(),
            None => Err(DurableError::InstanceNotFound(instance_id)),
        }
    }

    /// Registers a workflow that this engine's executors run (builder style). Starting
    /// does not need registration; executing does.
    #[must_use]
    pub fn register<W: Workflow>(mut self, workflow: W) -> Self {
        Arc::make_mut(&mut self.registry).insert(workflow);
        self
    }

    /// Names of the registered workflows (what this engine's executors claim; commands
    /// of other workflows are left to executors that registered them).
    pub fn registered(&self) -> Vec<String> {
        self.registry.names()
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Starts an executor on this engine's pool, running the registered workflows.
    ///
    /// # Errors
    /// [`DurableError::Config`] when `config` is out of bounds.
    pub fn spawn_executor(&self, config: ExecutorConfig) -> Result<ExecutorHandle> {
        config.validate(&self.config)?;
        Ok(executor::spawn(self.clone(), config))
    }

    fn max_attempts(&self) -> i32 {
        i32::try_from(self.config.command_max_attempts).unwrap_or(i32::MAX)
    }

    /// Starts an instance of `W`, idempotently by `(W::NAME, idempotency_key)`: the same
    /// key with the same input returns the same instance (also when it has failed: no
    /// fresh attempt); the same key with a different input is
    /// [`DurableError::IdempotencyConflict`]. Input equality is JSON equality (key order
    /// and number formatting do not matter).
    ///
    /// The bounds are checked before any write: key and serialization key 1 to 255
    /// characters, input within `max_payload_bytes` and 64 levels.
    ///
    /// # Errors
    /// [`DurableError::InvalidInput`], [`DurableError::Json`],
    /// [`DurableError::IdempotencyConflict`], [`DurableError::Store`].
    pub async fn start<W: Workflow>(
        &self,
        idempotency_key: &str,
        input: &W::Input,
        options: StartOptions,
    ) -> Result<Started> {
        let value =
            serde_json::to_value(input).map_err(|_| DurableError::Json { what: "input" })?;
        let version = i32::try_from(W::VERSION.max(1)).unwrap_or(i32::MAX);
        self.start_value(W::NAME, idempotency_key, value, options, Some(version))
            .await
    }

    /// [`Engine::start`] for an input given as JSON text (the API's path): the text is
    /// bounded and its depth scanned before it is parsed.
    ///
    /// # Errors
    /// As [`Engine::start`], plus [`crate::payload::BoundError::NotJson`].
    pub async fn start_json(
        &self,
        workflow: &str,
        idempotency_key: &str,
        input: &str,
        options: StartOptions,
    ) -> Result<Started> {
        validate_name("workflow name", workflow)?;
        let value = validate_payload_str("input", input, self.config.max_payload_bytes)?;
        // The registered code's version; unregistered here: pinned by its first claim.
        let version = self
            .registry
            .range(workflow)
            .map(|r| i32::try_from(r.max).unwrap_or(i32::MAX));
        self.start_value(workflow, idempotency_key, value, options, version)
            .await
    }

    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(workflow))]
    async fn start_value(
        &self,
        workflow: &str,
        key: &str,
        input: Value,
        options: StartOptions,
        version: Option<i32>,
    ) -> Result<Started> {
        validate_name("workflow name", workflow)?;
        validate_name("idempotency key", key)?;
        if let Some(s) = &options.serialization_key {
            validate_name("serialization key", s)?;
        }
        validate_value("input", &input, self.config.max_payload_bytes)?;
        let input_text =
            serde_json::to_string(&input).map_err(|_| DurableError::Json { what: "input" })?;
        let history_detail = self.history_input(workflow, &input).to_string();
        for _ in 0..3 {
            let id = Uuid::new_v4();
            let row = NewInstance {
                id,
                workflow: workflow.to_owned(),
                idempotency_key: key.to_owned(),
                input: input_text.clone(),
                serialization_key: options.serialization_key.clone(),
                actor: options.actor.clone(),
                history_detail: history_detail.clone(),
                version,
                // The caller's span (the API request): the instance's segments join its
                // trace (`None` without trace export).
                trace_context: keel_service::trace::current_traceparent(),
            };
            let created = match self.starts.submit(row).await {
                Some(answer) => answer?.then_some(id),
                // The answer was lost: whether the row was written is unknown, so look.
                None => None,
            };
            if let Some(instance_id) = created {
                return Ok(Started {
                    instance_id,
                    created: true,
                    status: RunStatus::Pending,
                });
            }
            let existing = store::instance_by_key(&self.pool, workflow, key, &input).await?;
            // None: deleted by retention between the two statements; insert again.
            if let Some(found) = existing {
                if !found.same_input {
                    return Err(DurableError::IdempotencyConflict {
                        workflow: workflow.to_owned(),
                        instance_id: found.id,
                    });
                }
                return Ok(Started {
                    instance_id: found.id,
                    created: false,
                    status: found.status,
                });
            }
        }
        Err(DurableError::Store(keel_store::StoreError::NotFound))
    }

    /// Records a signal for `instance_id` and a SIGNAL command. Deduplicated by
    /// `dedupe_key` (a repeat returns [`SignalReceipt::Duplicate`] and writes nothing).
    /// Accepted while the instance has not ended (a `failed` instance keeps it for a
    /// retry). The signal is consumed by the first `wait_signal(name, ..)` that reaches
    /// it, in recording order. One short transaction of its own; to record a signal
    /// atomically with other writes, use [`Engine::signal_in`].
    ///
    /// # Errors
    /// [`DurableError::InvalidInput`] (name/key/payload bounds, checked before any write
    /// or lock), [`DurableError::InstanceNotFound`], [`DurableError::InstanceEnded`],
    /// [`DurableError::SignalLimit`], [`DurableError::Store`].
    pub async fn signal<T: Serialize>(
        &self,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: &T,
    ) -> Result<SignalReceipt> {
        self.signal_as(instance_id, name, dedupe_key, payload, &Actor::none())
            .await
    }

    /// [`Engine::signal`] recorded by `actor` (from the caller's authenticated context,
    /// never from the payload): stored on the signal and its SIGNAL command.
    ///
    /// # Errors
    /// As [`Engine::signal`].
    pub async fn signal_as<T: Serialize>(
        &self,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: &T,
        actor: &Actor,
    ) -> Result<SignalReceipt> {
        let value = serde_json::to_value(payload).map_err(|_| DurableError::Json {
            what: "signal payload",
        })?;
        self.signal_value(instance_id, name, dedupe_key, value, actor)
            .await
    }

    /// [`Engine::signal`] with the payload as JSON text, bounded before it is parsed.
    ///
    /// # Errors
    /// As [`Engine::signal`].
    pub async fn signal_json(
        &self,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: &str,
    ) -> Result<SignalReceipt> {
        let value = validate_payload_str("signal payload", payload, self.config.max_payload_bytes)?;
        self.signal_value(instance_id, name, dedupe_key, value, &Actor::none())
            .await
    }

    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    async fn signal_value(
        &self,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: Value,
        actor: &Actor,
    ) -> Result<SignalReceipt> {
        self.check_signal(name, dedupe_key, &payload)?;
        let mut tx = self.pool.begin().await?;
        let receipt = self
            .record_signal(&mut tx, instance_id, name, dedupe_key, &payload, actor)
            .await?;
        match receipt {
            SignalReceipt::Recorded => tx.commit().await?,
            // Nothing of it is kept (a duplicate found after the count was taken has
            // been taken back, but the rollback is the short way).
            SignalReceipt::Duplicate => tx.rollback().await?,
        }
        Ok(receipt)
    }

    /// [`Engine::signal`] inside the caller's transaction: records the signal and its
    /// SIGNAL command on `conn`, and commits nothing — they become visible (and the
    /// executors are notified) when the caller commits, and vanish with it on a
    /// rollback. For a caller that must record a signal atomically with its own writes
    /// (the transaction queue recording a request's verdict as a signal in the
    /// transaction that stores the verdict).
    ///
    /// The ordinary refusals leave the caller's transaction usable: a duplicate
    /// `dedupe_key` returns [`SignalReceipt::Duplicate`] (nothing written), and
    /// [`DurableError::InstanceNotFound`], [`DurableError::InstanceEnded`] and
    /// [`DurableError::SignalLimit`] are decided by plain reads and a guarded update
    /// that matched no row, so no statement fails and nothing stays written. Bounds are
    /// checked before any statement ([`DurableError::InvalidInput`]). Only a database
    /// failure ([`DurableError::Store`]) comes from a failed statement, which aborts the
    /// caller's transaction as any failed statement does.
    ///
    /// **Locking.** When it records (or meets a duplicate after counting), it takes the
    /// instance's row lock (`durable_instance`, the lock of an `UPDATE`) and holds it
    /// until the caller's transaction ends. Meanwhile the instance's segment cannot
    /// journal, run its segment settle or renew its lease (those statements lock the same row, and
    /// wait), and other signals, cancels and retries of that instance wait too. So keep
    /// the transaction short after this call, and in a transaction that records signals
    /// for several instances, record them in a consistent order (for example by
    /// instance id) to avoid deadlocks between two such transactions. Works at the
    /// default isolation (`READ COMMITTED`); under `REPEATABLE READ` or `SERIALIZABLE`
    /// a concurrent change of the instance's row fails the statement with a
    /// serialization failure (transient). A not-found, ended or full instance is not
    /// locked.
    ///
    /// # Errors
    /// As [`Engine::signal`].
    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    pub async fn signal_in(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: &Value,
    ) -> Result<SignalReceipt> {
        self.signal_in_as(conn, instance_id, name, dedupe_key, payload, &Actor::none())
            .await
    }

    /// [`Engine::signal_in`] recorded by `actor` (the caller's authenticated context, or
    /// the platform: e.g. `Actor::system("settlement")`), stored on the signal and
    /// its SIGNAL command.
    ///
    /// # Errors
    /// As [`Engine::signal_in`].
    pub async fn signal_in_as(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: &Value,
        actor: &Actor,
    ) -> Result<SignalReceipt> {
        self.check_signal(name, dedupe_key, payload)?;
        self.record_signal(conn, instance_id, name, dedupe_key, payload, actor)
            .await
    }

    fn check_signal(&self, name: &str, dedupe_key: &str, payload: &Value) -> Result<()> {
        validate_name("signal name", name)?;
        validate_name("dedupe key", dedupe_key)?;
        validate_value("signal payload", payload, self.config.max_payload_bytes)?;
        Ok(())
    }

    /// The statements of a signal, on `conn` (the caller's transaction); see
    /// [`Engine::signal_in`].
    async fn record_signal(
        &self,
        conn: &mut sqlx::PgConnection,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: &Value,
        actor: &Actor,
    ) -> Result<SignalReceipt> {
        if store::signal_exists(&mut *conn, instance_id, dedupe_key).await? {
            return Ok(SignalReceipt::Duplicate);
        }
        let limit = i32::try_from(self.config.max_open_signals).unwrap_or(i32::MAX);
        if !store::instance_open_signal(&mut *conn, instance_id, limit).await? {
            let status = store::instance_run_status(&mut *conn, instance_id).await?;
            return Err(match status {
                None => DurableError::InstanceNotFound(instance_id),
                Some(status) => {
                    if status.is_ended() {
                        DurableError::InstanceEnded {
                            instance_id,
                            status,
                        }
                    } else {
                        DurableError::SignalLimit {
                            instance_id,
                            limit: self.config.max_open_signals,
                        }
                    }
                }
            });
        }
        // Under the row lock just taken: see `store::signal_insert` on recorded_at.
        if !store::signal_insert(&mut *conn, instance_id, name, payload, dedupe_key, actor).await? {
            // Recorded by a transaction that committed between the check above and the
            // lock: take the count back, so the caller's transaction stays as it was.
            store::instance_unopen_signal(&mut *conn, instance_id).await?;
            return Ok(SignalReceipt::Duplicate);
        }
        let command_id = store::command_insert(
            &mut *conn,
            instance_id,
            CommandKind::Signal,
            self.max_attempts(),
            actor,
        )
        .await?;
        let entry = crate::history::NewEntry::unchanged(
            "command_received",
            serde_json::json!({ "command": "signal", "name": name }),
        );
        crate::history::append_recorded(
            &mut *conn,
            instance_id,
            Some(command_id),
            actor,
            &entry,
            None,
        )
        .await?;
        Ok(SignalReceipt::Recorded)
    }

    /// Cancels an instance: at once when no segment runs (its open commands settle as
    /// `cancelled`); otherwise requests it, and the running segment stops at its next
    /// step boundary. `failed` and `suspended` instances can be cancelled.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::InstanceEnded`],
    /// [`DurableError::Store`].
    pub async fn cancel(&self, instance_id: Uuid) -> Result<CancelOutcome> {
        self.cancel_as(instance_id, &Actor::none()).await
    }

    /// [`Engine::cancel`] recorded by `actor` (the caller's authenticated context): the
    /// CANCEL command carries it, also for an immediate cancel (then recorded already
    /// settled `cancelled`).
    ///
    /// # Errors
    /// As [`Engine::cancel`].
    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    pub async fn cancel_as(&self, instance_id: Uuid, actor: &Actor) -> Result<CancelOutcome> {
        let mut tx = self.pool.begin().await?;
        let Some(locked) = store::instance_lock(&mut *tx, instance_id).await? else {
            return Err(DurableError::InstanceNotFound(instance_id));
        };
        let status = locked.status;
        if status.is_ended() {
            return Err(DurableError::InstanceEnded {
                instance_id,
                status,
            });
        }
        // Under the row lock: the guarded updates below match (the status was read
        // under the same lock).
        if locked.leased {
            store::instance_request_cancel(&mut *tx, instance_id).await?;
            let command_id = store::command_insert(
                &mut *tx,
                instance_id,
                CommandKind::Cancel,
                self.max_attempts(),
                actor,
            )
            .await?;
            let entry = crate::history::NewEntry::unchanged(
                "cancel_requested",
                serde_json::json!({ "command": "cancel" }),
            );
            crate::history::append_recorded(
                &mut *tx,
                instance_id,
                Some(command_id),
                actor,
                &entry,
                None,
            )
            .await?;
            tx.commit().await?;
            return Ok(CancelOutcome::Requested);
        }
        store::instance_cancel(&mut *tx, instance_id).await?;
        store::commands_cancel_open(&mut *tx, instance_id).await?;
        let command_id =
            store::command_insert_settled_cancel(&mut *tx, instance_id, self.max_attempts(), actor)
                .await?;
        self.log_state_change(
            &mut tx,
            instance_id,
            Some(command_id),
            actor,
            "cancelled",
            serde_json::json!({ "command": "cancel" }),
        )
        .await?;
        let t = [crate::hook::Transition {
            instance_id,
            workflow: locked.workflow,
            status: RunStatus::Cancelled,
        }];
        crate::hook::run(&self.hook, &mut tx, &t).await?;
        tx.commit().await?;
        Ok(CancelOutcome::Cancelled)
    }

    /// Retries a `failed` or `suspended` instance: records a RETRY command that replays
    /// the body against its journal (journaled steps are not run again). A failed
    /// instance is `pending` again until the command runs.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::InstanceEnded`],
    /// [`DurableError::NotRetryable`], [`DurableError::Store`].
    pub async fn retry(&self, instance_id: Uuid) -> Result<()> {
        self.retry_as(instance_id, &Actor::none()).await
    }

    /// [`Engine::retry`] recorded by `actor` (the caller's authenticated context),
    /// stored on the RETRY command.
    ///
    /// # Errors
    /// As [`Engine::retry`].
    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    pub async fn retry_as(&self, instance_id: Uuid, actor: &Actor) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let Some(locked) = store::instance_lock(&mut *tx, instance_id).await? else {
            return Err(DurableError::InstanceNotFound(instance_id));
        };
        let status = locked.status;
        match status {
            s if s.is_ended() => {
                return Err(DurableError::InstanceEnded {
                    instance_id,
                    status,
                });
            }
            RunStatus::Failed => {
                // Under the row lock: the guard (`status = 'failed'`) matches.
                store::instance_reset_failed(&mut *tx, instance_id).await?;
                let t = [crate::hook::Transition {
                    instance_id,
                    workflow: locked.workflow.clone(),
                    status: RunStatus::Pending,
                }];
                crate::hook::run(&self.hook, &mut tx, &t).await?;
            }
            RunStatus::Suspended => {}
            _ => {
                return Err(DurableError::NotRetryable {
                    instance_id,
                    status,
                });
            }
        }
        let command_id = store::command_insert(
            &mut *tx,
            instance_id,
            CommandKind::Retry,
            self.max_attempts(),
            actor,
        )
        .await?;
        self.log_state_change(
            &mut tx,
            instance_id,
            Some(command_id),
            actor,
            "retry",
            serde_json::json!({ "command": "retry" }),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Wakes the `suspended` instances whose step failed with
    /// [`crate::StepError::Unavailable`] carrying the wake tag `tag` (e.g.
    /// `chain:31337`): each gets a RETRY due now, recorded as
    /// [`Actor::system`]`(reason)`, which replaces its pending recovery RETRY. Call it
    /// when the event the tag names happens (the runner: when it starts serving the
    /// chain), so that the work resumes at once rather than after its recovery backoff
    /// (up to 5 minutes). Idempotent; instances whose recovery is already due, running
    /// or locked by a concurrent segment are left to it. Returns the instances woken.
    ///
    /// # Errors
    /// [`DurableError::InvalidInput`] for a tag or reason outside 1 to 255 characters;
    /// [`DurableError::Store`].
    pub async fn wake_suspended(&self, tag: &str, reason: &str) -> Result<u64> {
        crate::payload::validate_name("wake tag", tag)?;
        crate::payload::validate_name("wake reason", reason)?;
        let n = store::instances_wake(&self.pool, tag, reason, self.max_attempts()).await?;
        if n > 0 {
            tracing::info!(target: "keel::durable", tag, reason, woken = n,
                "suspended instances woken");
        }
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Who recorded what for an instance: its commands (START, SIGNAL, TIMER, RETRY,
    /// CANCEL) in recording order and its signals in recording order, each with its
    /// [`Actor`], at most [`ATTRIBUTION_LIMIT`] of each (two statements, no payloads).
    /// Retention deletes settled commands after its window, except START and CANCEL
    /// commands, which stay as long as their instance.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::Store`] (also for a stored
    /// command kind the engine does not know).
    pub async fn attribution(&self, instance_id: Uuid) -> Result<Attribution> {
        let mut conn = self.pool.acquire().await?;
        if store::instance_run_status(&mut *conn, instance_id)
            .await?
            .is_none()
        {
            return Err(DurableError::InstanceNotFound(instance_id));
        }
        let commands = store::commands_with_actors(&mut *conn, instance_id, ATTRIBUTION_LIMIT)
            .await?
            .into_iter()
            .map(|r| RecordedCommand {
                id: r.id,
                kind: r.kind.as_str().to_owned(),
                state: r.state.as_str().to_owned(),
                outcome: r.outcome,
                recorded_at: r.created_at,
                actor: Actor::from_columns(
                    &r.actor_kind,
                    r.actor_id,
                    r.actor_reason,
                    r.on_behalf_of,
                    &r.attribution_status,
                ),
            })
            .collect();
        let signals = store::signals_with_actors(&mut *conn, instance_id, ATTRIBUTION_LIMIT)
            .await?
            .into_iter()
            .map(|r| RecordedSignal {
                id: r.id,
                name: r.name,
                dedupe_key: r.dedupe_key,
                recorded_at: r.recorded_at,
                consumed: r.consumed_seq.is_some(),
                actor: Actor::from_columns(
                    &r.actor_kind,
                    r.actor_id,
                    r.actor_reason,
                    r.on_behalf_of,
                    &r.attribution_status,
                ),
            })
            .collect();
        Ok(Attribution { commands, signals })
    }

    /// The open-instance census: instances not yet ended, counted by workflow and
    /// status, ordered by workflow then status; pairs with no instance are absent.
    /// Read from the database (one index-only scan), so every replica sees the same.
    ///
    /// # Errors
    /// [`DurableError::Store`] (also for a stored status the engine does not know).
    pub async fn open_census(&self) -> Result<Vec<crate::OpenCount>> {
        store::instances_open_census(&self.pool)
            .await?
            .into_iter()
            .map(|r| {
                Ok(crate::OpenCount {
                    workflow: r.workflow,
                    status: r.status,
                    count: u64::try_from(r.count).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Workflow health for Platform Status ([`crate::WorkflowHealth`]): counts by
    /// workflow and status, the oldest running / waiting / suspended instance per
    /// workflow, the instances over the pending and no-mutation thresholds of `query`,
    /// and the dead letters. Five statements on the pool (not one snapshot); value-free.
    ///
    /// # Errors
    /// [`DurableError::Store`].
    pub async fn workflow_health(
        &self,
        query: crate::HealthQuery,
    ) -> Result<crate::WorkflowHealth> {
        crate::health::read(&self.pool, query).await
    }

    /// Open instances that no live runner can run, by workflow and version ("waiting for
    /// a runner that knows version N"): instances not yet `completed`, `failed` or
    /// `cancelled` whose version no executor seen within
    /// [`crate::version::RUNNER_LIVENESS`] covers (see [`crate::version`]). Their
    /// commands are deferred, never failed. One statement; value-free.
    ///
    /// # Errors
    /// [`DurableError::Store`].
    pub async fn version_waits(&self) -> Result<Vec<crate::VersionWait>> {
        Ok(crate::version::instances_awaiting_runner(&self.pool)
            .await?
            .into_iter()
            .map(|r| crate::VersionWait {
                workflow: r.workflow,
                version: r.version.and_then(|v| u32::try_from(v).ok()),
                instances: u64::try_from(r.instances).unwrap_or(0),
                oldest_created_at: r.oldest_created_at,
            })
            .collect())
    }

    /// The version ranges of the registered workflows
    /// ([`crate::Workflow::MIN_VERSION`]`..=`[`crate::Workflow::VERSION`]), by name.
    pub fn versions(&self) -> Vec<(String, crate::VersionRange)> {
        let mut v: Vec<(String, crate::VersionRange)> = self
            .registry
            .versions
            .iter()
            .map(|(k, r)| ((*k).to_owned(), *r))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The retirement check: refuses when a registered workflow's code has retired a
    /// version (raised [`crate::Workflow::MIN_VERSION`] above it) while an instance that
    /// is not `completed` or `cancelled` is still pinned to it (a `failed` one counts: a
    /// retry replays it). Run it before spawning executors of a release that raises a
    /// `MIN_VERSION`; such instances would otherwise wait for a runner that knows their
    /// version. One statement.
    ///
    /// # Errors
    /// [`DurableError::VersionPinned`] naming every retired version still pinned and its
    /// instance count; [`DurableError::Store`].
    pub async fn check_versions(&self) -> Result<()> {
        let rows =
            crate::version::instances_pinned_below(&self.pool, &self.registry.claim_set()).await?;
        if rows.is_empty() {
            return Ok(());
        }
        Err(DurableError::VersionPinned(
            rows.into_iter()
                .map(|r| crate::PinnedVersion {
                    workflow: r.workflow,
                    version: u32::try_from(r.version).unwrap_or(0),
                    instances: u64::try_from(r.instances).unwrap_or(0),
                })
                .collect(),
        ))
    }

    /// The status projection of an instance.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::Store`].
    pub async fn status(&self, instance_id: Uuid) -> Result<InstanceStatus> {
        match store::instance_status(&self.pool, instance_id).await? {
            Some(row) => row.try_into(),
            None => Err(DurableError::InstanceNotFound(instance_id)),
        }
    }

    /// The status projections of `instance_ids`, in one statement: one
    /// [`InstanceStatus`] per id found, in the order of `instance_ids` (an id given twice
    /// comes twice); ids of no instance (never started, or deleted by retention) are
    /// left out, so compare [`InstanceStatus::id`] rather than positions when that can
    /// happen. An empty slice returns an empty vector.
    ///
    /// # Errors
    /// [`DurableError::Store`].
    pub async fn statuses(&self, instance_ids: &[Uuid]) -> Result<Vec<InstanceStatus>> {
        if instance_ids.is_empty() {
            return Ok(Vec::new());
        }
        store::instance_statuses(&self.pool, instance_ids)
            .await?
            .into_iter()
            .map(InstanceStatus::try_from)
            .collect()
    }

    /// The start input of an instance, as JSON (the value given to [`Engine::start`] or
    /// [`Engine::start_json`]; object key order is PostgreSQL's `jsonb` order). It never
    /// changes after the start.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::Store`].
    pub async fn input(&self, instance_id: Uuid) -> Result<Value> {
        store::instance_input(&self.pool, instance_id)
            .await?
            .ok_or(DurableError::InstanceNotFound(instance_id))
    }

    /// Waits up to `timeout` for an instance to reach a terminal state
    /// ([`RunStatus::is_terminal`]: `completed`, `failed` or `cancelled`) and returns
    /// its status then; `None` when `timeout` passed first (a zero timeout is one look).
    /// Returns at once, without a write, when the instance is terminal already.
    ///
    /// It wakes on a PostgreSQL notification (channel [`crate::TERMINAL_CHANNEL`], migration
    /// 0021), on one `LISTEN` connection per engine shared by every waiter of the engine
    /// and its clones (opened by the first call, kept while the engine lives, reconnected
    /// when dropped). Only watched instances notify (so a workload nobody waits on pays
    /// nothing): the first wait on an instance marks it (`terminal_watched`, one
    /// `UPDATE` of its row, which waits for a running journal write or segment settle of
    /// that instance to commit); the mark stays. The status is read after subscribing
    /// and after marking (no lost wake-up), and again after every (re)connection of the
    /// listener; while the listener is disconnected the status is polled every second
    /// (and every 10 seconds while it is connected, in case a connection fails silently).
    ///
    /// A `failed` instance counts as terminal here although it can still be retried
    /// (so it is not [`RunStatus::is_ended`]).
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`] (also when the instance is deleted while
    /// waited for), [`DurableError::Store`].
    pub async fn await_terminal(
        &self,
        instance_id: Uuid,
        timeout: Duration,
    ) -> Result<Option<InstanceStatus>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut sub = self.terminal.subscribe(&self.pool);
        let mut watched = false;
        loop {
            let status = self.status(instance_id).await?;
            if status.status.is_terminal() {
                return Ok(Some(status));
            }
            if !watched {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(None);
                }
                // Then look again: the mark serialized with any segment settle that ended it.
                store::instance_watch_terminal(&self.pool, instance_id).await?;
                watched = true;
                continue;
            }
            if !sub.next_look(instance_id, deadline).await {
                return Ok(None);
            }
        }
    }

    /// The probe: waits until no runnable command is left (none queued and available,
    /// none running) and returns the report (deferred and dead commands are listed).
    /// Polls the database every 20 ms; tests use it instead of sleeps.
    ///
    /// # Errors
    /// [`DurableError::NotIdle`] with the report when `timeout` passes first;
    /// [`DurableError::Store`].
    pub async fn await_idle(&self, timeout: Duration) -> Result<IdleReport> {
        let started = Instant::now();
        loop {
            let report = self.idle_report().await?;
            if report.runnable == 0 {
                return Ok(report);
            }
            if started.elapsed() >= timeout {
                return Err(DurableError::NotIdle(Box::new(report)));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One look at the queue: runnable count, deferred, dead and stuck commands (at
    /// most 1,000 listed).
    ///
    /// # Errors
    /// [`DurableError::Store`].
    pub async fn idle_report(&self) -> Result<IdleReport> {
        let runnable = store::commands_runnable(&self.pool).await?;
        let rows =
            store::commands_listed(&self.pool, self.config.stuck_after.as_secs_f64()).await?;
        let mut report = IdleReport {
            runnable,
            ..IdleReport::default()
        };
        for r in rows {
            let summary = CommandSummary {
                id: r.id,
                instance_id: r.instance_id,
                kind: r.kind.as_str().to_owned(),
                state: r.state.as_str().to_owned(),
                attempt: r.attempt,
                available_at: r.available_at,
                last_error: r.last_error,
            };
            if r.state == CommandState::Dead {
                report.dead.push(summary);
            } else if r.future {
                report.deferred.push(summary);
            } else {
                report.stuck.push(summary);
            }
        }
        Ok(report)
    }

    /// Retention hook: deletes up to `batch` settled commands and up to `batch` ended
    /// (`completed`/`cancelled`) instances older than `older_than` (with their journal,
    /// signals and commands, by `ON DELETE CASCADE`). Rows locked by others are skipped
    /// (`SKIP LOCKED`) and left for a later call. A deleted instance's idempotency key
    /// can start a new instance. One batch, no transaction of its own; the scheduled
    /// retention pass is [`crate::Retention`] (batches in short transactions, per-pass
    /// cap, lock timeout, report), which the runner's daily cron runs.
    ///
    /// # Errors
    /// [`DurableError::Store`].
    pub async fn purge(&self, older_than: Duration, batch: i64) -> Result<PurgeCounts> {
        let secs = older_than.as_secs_f64();
        let commands = store::commands_purge(&self.pool, secs, batch).await?;
        let instances = store::instances_purge(&self.pool, secs, batch).await?;
        Ok(PurgeCounts {
            commands,
            instances,
        })
    }
}
