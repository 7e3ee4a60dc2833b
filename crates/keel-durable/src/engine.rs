//! [`Engine`]: start, signal, cancel, retry, status, the idle probe and retention.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::batch::{BatchOp, Combiner, Held, lost, rolled_back};
use crate::config::{EngineConfig, ExecutorConfig};
use crate::context::JournalOp;
use crate::error::{DurableError, Result};
use crate::executor::{self, ExecutorHandle, SettleOp};
use crate::payload::{validate_name, validate_payload_str, validate_value};
use crate::status::{
    CommandSummary, ErrorInfo, IdleReport, InstanceStatus, RunStatus, WaitDescription,
};
use crate::workflow::{Registry, Workflow};

/// Options of [`Engine::start`].
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Instances with the same serialization key run one at a time, in start order: a
    /// later instance's START is not claimed while an earlier one with the key is not
    /// `completed` or `cancelled` (a `failed` instance keeps the key, since a retry can
    /// resume it; cancel it to release the key). 1 to 255 characters.
    pub serialization_key: Option<String>,
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
    /// Group commit of the plain settlements of those segments.
    pub(crate) settlements: Arc<Combiner<SettleOp>>,
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

/// Starts of concurrent callers in one statement (see [`crate::batch`]): one instance
/// and its START command per row, idempotently by `(workflow, idempotency_key)`; a row
/// whose key exists inserts nothing (also a second row of the same key in the batch),
/// and only the ids of the inserted instances are returned. Rows are inserted in
/// their submission order, so `start_order` follows it.
const INSERT_INSTANCES: &str = "\
WITH req AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
           WITH ORDINALITY AS t(id, workflow, idempotency_key, input, serialization_key, idx)
), ins AS (
    INSERT INTO durable_instance (id, workflow, idempotency_key, input, serialization_key)
    SELECT id, workflow, idempotency_key, input::jsonb, serialization_key FROM req ORDER BY idx
    ON CONFLICT (workflow, idempotency_key) DO NOTHING
 RETURNING id
), cmd AS (
    INSERT INTO durable_command (instance_id, kind, max_attempts)
    SELECT id, 'start', $6 FROM ins
 RETURNING id
)
SELECT id FROM ins";

/// One start (a row of [`INSERT_INSTANCES`]).
#[derive(Debug)]
struct StartRow {
    id: Uuid,
    workflow: String,
    key: String,
    /// JSON text.
    input: String,
    serialization_key: Option<String>,
}

/// The starts of one engine, combined into [`INSERT_INSTANCES`] statements. The answer
/// is whether the row's instance was created.
#[derive(Debug)]
struct StartOp {
    max_attempts: i32,
}

impl StartOp {
    async fn exec(
        &self,
        held: &mut Held,
        rows: &[StartRow],
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
        rows: &[StartRow],
    ) -> std::result::Result<Vec<bool>, sqlx::Error> {
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let created: Vec<Uuid> = sqlx::query_scalar(INSERT_INSTANCES)
            .bind(&ids)
            .bind(rows.iter().map(|r| r.workflow.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.input.as_str()).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.serialization_key.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(self.max_attempts)
            .fetch_all(conn)
            .await?;
        let created: std::collections::HashSet<Uuid> = created.into_iter().collect();
        Ok(ids.iter().map(|id| created.contains(id)).collect())
    }
}

impl BatchOp for StartOp {
    type Req = StartRow;
    type Resp = Result<bool>;

    fn weight(req: &StartRow) -> usize {
        64 + req.workflow.len() + req.key.len() + req.input.len()
    }

    async fn run(&self, held: &mut Held, batch: Vec<StartRow>) -> Vec<Result<bool>> {
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
        let settlements = Combiner::new(
            SettleOp {
                lease_secs: config.lease.as_secs_f64(),
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
            settlements,
        })
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
        self.start_value(W::NAME, idempotency_key, value, options)
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
        self.start_value(workflow, idempotency_key, value, options)
            .await
    }

    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(workflow))]
    async fn start_value(
        &self,
        workflow: &str,
        key: &str,
        input: Value,
        options: StartOptions,
    ) -> Result<Started> {
        validate_name("workflow name", workflow)?;
        validate_name("idempotency key", key)?;
        if let Some(s) = &options.serialization_key {
            validate_name("serialization key", s)?;
        }
        validate_value("input", &input, self.config.max_payload_bytes)?;
        let input_text =
            serde_json::to_string(&input).map_err(|_| DurableError::Json { what: "input" })?;
        for _ in 0..3 {
            let id = Uuid::new_v4();
            let row = StartRow {
                id,
                workflow: workflow.to_owned(),
                key: key.to_owned(),
                input: input_text.clone(),
                serialization_key: options.serialization_key.clone(),
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
            let existing: Option<(Uuid, bool, String)> = sqlx::query_as(
                "SELECT id, input = $3, status FROM durable_instance WHERE workflow = $1 AND idempotency_key = $2",
            )
            .bind(workflow)
            .bind(key)
            .bind(&input)
            .fetch_optional(&self.pool)
            .await?;
            // None: deleted by retention between the two statements; insert again.
            if let Some((instance_id, same, status)) = existing {
                if !same {
                    return Err(DurableError::IdempotencyConflict {
                        workflow: workflow.to_owned(),
                        instance_id,
                    });
                }
                return Ok(Started {
                    instance_id,
                    created: false,
                    status: parse_status(&status)?,
                });
            }
        }
        Err(DurableError::Store(keel_store::StoreError::NotFound))
    }

    /// Records a signal for `instance_id` and a SIGNAL command. Deduplicated by
    /// `dedupe_key` (a repeat returns [`SignalReceipt::Duplicate`] and writes nothing).
    /// Accepted while the instance has not ended (a `failed` instance keeps it for a
    /// retry). The signal is consumed by the first `wait_signal(name, ..)` that reaches
    /// it, in recording order.
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
        let value = serde_json::to_value(payload).map_err(|_| DurableError::Json {
            what: "signal payload",
        })?;
        self.signal_value(instance_id, name, dedupe_key, value)
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
        self.signal_value(instance_id, name, dedupe_key, value)
            .await
    }

    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    async fn signal_value(
        &self,
        instance_id: Uuid,
        name: &str,
        dedupe_key: &str,
        payload: Value,
    ) -> Result<SignalReceipt> {
        validate_name("signal name", name)?;
        validate_name("dedupe key", dedupe_key)?;
        validate_value("signal payload", &payload, self.config.max_payload_bytes)?;
        let mut tx = self.pool.begin().await?;
        let dup: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM durable_signal WHERE instance_id = $1 AND dedupe_key = $2",
        )
        .bind(instance_id)
        .bind(dedupe_key)
        .fetch_optional(&mut *tx)
        .await?;
        if dup.is_some() {
            return Ok(SignalReceipt::Duplicate);
        }
        // Takes the instance row lock: signals of one instance serialize here, and the
        // count bound holds under any isolation level.
        let counted: Option<Uuid> = sqlx::query_scalar(
            "UPDATE durable_instance SET open_signals = open_signals + 1, updated_at = now()
              WHERE id = $1 AND status NOT IN ('completed', 'cancelled') AND open_signals < $2
          RETURNING id",
        )
        .bind(instance_id)
        .bind(i32::try_from(self.config.max_open_signals).unwrap_or(i32::MAX))
        .fetch_optional(&mut *tx)
        .await?;
        if counted.is_none() {
            let row: Option<(String,)> =
                sqlx::query_as("SELECT status FROM durable_instance WHERE id = $1")
                    .bind(instance_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            return Err(match row {
                None => DurableError::InstanceNotFound(instance_id),
                Some((s,)) => {
                    let status = parse_status(&s)?;
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
        // recorded_at is read after the lock (clock_timestamp), so a wait that decided
        // "expired" under the lock never sees a signal recorded before its deadline later.
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO durable_signal (instance_id, name, payload, dedupe_key, recorded_at)
             VALUES ($1, $2, $3, $4, clock_timestamp())
             ON CONFLICT (instance_id, dedupe_key) DO NOTHING
          RETURNING id",
        )
        .bind(instance_id)
        .bind(name)
        .bind(&payload)
        .bind(dedupe_key)
        .fetch_optional(&mut *tx)
        .await?;
        if inserted.is_none() {
            tx.rollback().await?;
            return Ok(SignalReceipt::Duplicate);
        }
        sqlx::query(
            "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, 'signal', $2)",
        )
        .bind(instance_id)
        .bind(self.max_attempts())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(SignalReceipt::Recorded)
    }

    /// Cancels an instance: at once when no segment runs (its open commands settle as
    /// `cancelled`); otherwise requests it, and the running segment stops at its next
    /// step boundary. `failed` and `suspended` instances can be cancelled.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::InstanceEnded`],
    /// [`DurableError::Store`].
    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    pub async fn cancel(&self, instance_id: Uuid) -> Result<CancelOutcome> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(String, bool)> = sqlx::query_as(
            "SELECT status, coalesce(lease_expires_at > now(), false)
               FROM durable_instance WHERE id = $1 FOR UPDATE",
        )
        .bind(instance_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((status, live)) = row else {
            return Err(DurableError::InstanceNotFound(instance_id));
        };
        let status = parse_status(&status)?;
        if status.is_ended() {
            return Err(DurableError::InstanceEnded {
                instance_id,
                status,
            });
        }
        if live {
            sqlx::query(
                "UPDATE durable_instance
                    SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
                  WHERE id = $1",
            )
            .bind(instance_id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, 'cancel', $2)",
            )
            .bind(instance_id)
            .bind(self.max_attempts())
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(CancelOutcome::Requested);
        }
        // No live lease: clearing the token also fences out an executor whose lease
        // lapsed and that has not noticed yet.
        sqlx::query(
            "UPDATE durable_instance
                SET status = 'cancelled', ended_at = now(), wait = NULL,
                    cancel_requested_at = coalesce(cancel_requested_at, now()),
                    lease_token = NULL, lease_expires_at = NULL, updated_at = now()
              WHERE id = $1",
        )
        .bind(instance_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE durable_command SET state = 'done', outcome = 'cancelled', completed_at = now()
              WHERE instance_id = $1 AND state IN ('queued', 'running')",
        )
        .bind(instance_id)
        .execute(&mut *tx)
        .await?;
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
    #[tracing::instrument(target = "keel::durable::api", skip_all, fields(%instance_id))]
    pub async fn retry(&self, instance_id: Uuid) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(String,)> =
            sqlx::query_as("SELECT status FROM durable_instance WHERE id = $1 FOR UPDATE")
                .bind(instance_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((status,)) = row else {
            return Err(DurableError::InstanceNotFound(instance_id));
        };
        let status = parse_status(&status)?;
        match status {
            s if s.is_ended() => {
                return Err(DurableError::InstanceEnded {
                    instance_id,
                    status,
                });
            }
            RunStatus::Failed => {
                sqlx::query(
                    "UPDATE durable_instance
                        SET status = 'pending', ended_at = NULL, error_code = NULL,
                            error_retryable = NULL, error_message = NULL, error_detail = NULL,
                            updated_at = now()
                      WHERE id = $1",
                )
                .bind(instance_id)
                .execute(&mut *tx)
                .await?;
            }
            RunStatus::Suspended => {}
            _ => {
                return Err(DurableError::NotRetryable {
                    instance_id,
                    status,
                });
            }
        }
        sqlx::query(
            "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, 'retry', $2)",
        )
        .bind(instance_id)
        .bind(self.max_attempts())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The status projection of an instance.
    ///
    /// # Errors
    /// [`DurableError::InstanceNotFound`], [`DurableError::Store`].
    pub async fn status(&self, instance_id: Uuid) -> Result<InstanceStatus> {
        #[derive(sqlx::FromRow)]
        struct Row {
            workflow: String,
            status: String,
            progress: Option<Value>,
            wait: Option<Value>,
            output: Option<Value>,
            error_code: Option<String>,
            error_retryable: Option<bool>,
            error_message: Option<String>,
            error_detail: Option<Value>,
            created_at: DateTime<Utc>,
            ended_at: Option<DateTime<Utc>>,
            cancel_requested_at: Option<DateTime<Utc>>,
            queued_behind: Option<Uuid>,
        }
        // The blocker is looked up for keyed `pending` instances only (the rule of
        // `durable_claim`, migration 0016: pending, running, suspended and timer-waiting
        // instances hold their key).
        let row: Option<Row> = sqlx::query_as(
            "SELECT i.workflow, i.status, i.progress, i.wait, i.output, i.error_code,
                    i.error_retryable, i.error_message, i.error_detail, i.created_at, i.ended_at,
                    i.cancel_requested_at,
                    CASE WHEN i.status = 'pending' AND i.serialization_key IS NOT NULL THEN
                        (SELECT p.id FROM durable_instance p
                          WHERE p.serialization_key = i.serialization_key
                            AND p.start_order < i.start_order
                            AND (p.status IN ('pending', 'running', 'suspended')
                                 OR (p.status = 'waiting' AND p.wait->>'kind' = 'timer'))
                          ORDER BY p.status = 'pending', p.start_order LIMIT 1)
                    END AS queued_behind
               FROM durable_instance i WHERE i.id = $1",
        )
        .bind(instance_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else {
            return Err(DurableError::InstanceNotFound(instance_id));
        };
        let wait = match r.wait {
            Some(w) => Some(
                serde_json::from_value::<WaitDescription>(w)
                    .map_err(|_| DurableError::Json { what: "wait" })?,
            ),
            None => None,
        };
        Ok(InstanceStatus {
            id: instance_id,
            workflow: r.workflow,
            status: parse_status(&r.status)?,
            progress: r.progress,
            wait,
            output: r.output,
            error: r.error_code.map(|code| ErrorInfo {
                code,
                retryable: r.error_retryable.unwrap_or(false),
                message: r.error_message.unwrap_or_default(),
                detail: r.error_detail,
            }),
            created_at: r.created_at,
            ended_at: r.ended_at,
            cancel_requested_at: r.cancel_requested_at,
            queued_behind: r.queued_behind,
        })
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
        let runnable: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM durable_command
              WHERE state = 'running' OR (state = 'queued' AND available_at <= now())",
        )
        .fetch_one(&self.pool)
        .await?;
        #[derive(sqlx::FromRow)]
        struct Row {
            id: i64,
            instance_id: Uuid,
            kind: String,
            state: String,
            attempt: i32,
            available_at: DateTime<Utc>,
            last_error: Option<String>,
            future: bool,
        }
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, instance_id, kind, state, attempt, available_at, last_error,
                    available_at > now() AS future
               FROM durable_command
              WHERE state = 'dead'
                 OR (state = 'queued' AND available_at > now())
                 OR (state IN ('queued', 'running') AND available_at <= now() - make_interval(secs => $1))
              ORDER BY id LIMIT 1000",
        )
        .bind(self.config.stuck_after.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        let mut report = IdleReport {
            runnable,
            ..IdleReport::default()
        };
        for r in rows {
            let summary = CommandSummary {
                id: r.id,
                instance_id: r.instance_id,
                kind: r.kind,
                state: r.state.clone(),
                attempt: r.attempt,
                available_at: r.available_at,
                last_error: r.last_error,
            };
            if r.state == "dead" {
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
        let commands = sqlx::query(
            "WITH c AS (
                SELECT id FROM durable_command
                 WHERE state = 'done' AND completed_at < now() - make_interval(secs => $1)
                 ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED)
             DELETE FROM durable_command d USING c WHERE d.id = c.id",
        )
        .bind(secs)
        .bind(batch)
        .execute(&self.pool)
        .await?
        .rows_affected();
        let instances = sqlx::query(
            "WITH i AS (
                SELECT id FROM durable_instance x
                 WHERE status IN ('completed', 'cancelled') AND ended_at < now() - make_interval(secs => $1)
                   AND NOT EXISTS (SELECT 1 FROM durable_command c
                                    WHERE c.instance_id = x.id AND c.state IN ('queued', 'running'))
                 ORDER BY ended_at LIMIT $2 FOR UPDATE SKIP LOCKED)
             DELETE FROM durable_instance d USING i WHERE d.id = i.id",
        )
        .bind(secs)
        .bind(batch)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(PurgeCounts {
            commands,
            instances,
        })
    }
}

pub(crate) fn parse_status(s: &str) -> Result<RunStatus> {
    RunStatus::parse(s).ok_or(DurableError::Store(keel_store::StoreError::Decode))
}
