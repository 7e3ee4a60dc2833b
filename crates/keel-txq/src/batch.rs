//! Group commit of enqueues: requests recorded concurrently in one process share one
//! multi-row `INSERT` (one commit) instead of one autocommit statement each.
//!
//! Leader/follower: the first caller finding no flush in flight spawns a flusher task;
//! callers arriving while a statement is in flight queue up, and when it returns the
//! flusher takes everything queued as the next statement. A lone caller therefore
//! waits for exactly one statement, as before; under concurrency the batch grows with
//! the load. Each caller still awaits its own row's commit before `enqueue` returns,
//! so an id handed out is always durable.

use crate::store::{self, OwnedNewRequest};
use keel_store::PgPool;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use uuid::Uuid;

/// Rows per `INSERT` statement at most.
const MAX_BATCH: usize = 1000;

/// What a waiting caller learns from the flusher: `Some(inserted)` when its row's
/// statement committed (`false`: the key existed, nothing inserted), `None` when the
/// batch statement failed — the caller then inserts its row alone, so it gets its own
/// typed error (or success, when the failure was another row's).
type Reply = Option<bool>;

#[derive(Default)]
struct State {
    pending: Vec<(OwnedNewRequest, oneshot::Sender<Reply>)>,
    flushing: bool,
}

/// The combiner of one [`crate::TxQueue`].
pub(crate) struct EnqueueBatcher {
    db: PgPool,
    state: Arc<Mutex<State>>,
}

impl EnqueueBatcher {
    pub(crate) fn new(db: PgPool) -> Self {
        Self {
            db,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// Inserts `row` unless its idempotency key exists; returns whether it inserted.
    ///
    /// # Errors
    /// Store errors of the row's own statement.
    pub(crate) async fn insert(&self, row: &OwnedNewRequest) -> crate::Result<bool> {
        let (tx, rx) = oneshot::channel();
        let spawn = {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.pending.push((row.clone(), tx));
            !std::mem::replace(&mut state.flushing, true)
        };
        if spawn {
            // A task of its own: a caller that stops waiting (its future dropped) never
            // strands the others queued behind its statement.
            tokio::spawn(flush(self.db.clone(), self.state.clone()));
        }
        match rx.await {
            Ok(Some(inserted)) => Ok(inserted),
            // The batch failed (or the flusher is gone): this row alone.
            Ok(None) | Err(_) => store::request_insert(&self.db, &row.borrowed()).await,
        }
    }
}

/// Clears the in-flight flag if the flusher ends abnormally (a panic), dropping the
/// queued replies so their callers insert alone; a later caller spawns a new flusher.
struct Guard {
    state: Arc<Mutex<State>>,
    done: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.done {
            let mut s = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            s.flushing = false;
            s.pending.clear();
        }
    }
}

async fn flush(db: PgPool, state: Arc<Mutex<State>>) {
    let mut guard = Guard {
        state: state.clone(),
        done: false,
    };
    // One connection for the whole burst (no pool hand-off and liveness ping between
    // consecutive batches); on failure, the next batch takes a fresh one.
    let mut conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>> = None;
    loop {
        let batch = {
            let mut s = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if s.pending.is_empty() {
                s.flushing = false;
                guard.done = true;
                return;
            }
            let take = s.pending.len().min(MAX_BATCH);
            s.pending.drain(..take).collect::<Vec<_>>()
        };
        let rows: Vec<&OwnedNewRequest> = batch.iter().map(|(r, _)| r).collect();
        metrics::histogram!("keel_txq_enqueue_batch_rows").record(rows.len() as f64);
        if conn.is_none() {
            conn = db.acquire().await.ok();
        }
        let result = match conn.as_mut() {
            Some(c) => store::requests_insert_many(&mut **c, &rows).await.ok(),
            None => None,
        };
        if result.is_none() {
            conn = None;
        }
        match result {
            Some(inserted) => {
                let inserted: std::collections::HashSet<Uuid> = inserted.into_iter().collect();
                for (row, reply) in batch {
                    let _ = reply.send(Some(inserted.contains(&row.id)));
                }
            }
            None => {
                tracing::debug!(target: "keel::txq", rows = rows.len(), "batched enqueue failed; each request is inserted alone");
                for (_, reply) in batch {
                    let _ = reply.send(None);
                }
            }
        }
    }
}
