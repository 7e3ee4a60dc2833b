//! Group commit: a [`Combiner`] collects the single-row writes that concurrent callers of
//! one process make (the durable engine's journal appends, settlements and starts; the
//! transaction queue's enqueues) and sends them to PostgreSQL as **one** multi-row
//! statement per batch.
//!
//! Leader/follower without a long-lived task: the first caller that finds no batch in
//! flight spawns a flusher; while its statement runs, new requests queue; when it
//! returns, the flusher answers every caller of the batch and sends the queued requests
//! as the next batch, until the queue is empty (then it exits). Each caller awaits the
//! answer for its own row, which arrives only after the statement (an autocommit
//! transaction) has committed, so "journal before continue" holds per caller exactly as
//! with a statement of its own.
//!
//! A batch statement that fails with a database error was rolled back as a whole;
//! [`BatchOp::run`] implementations then retry each row on its own, so one bad row (or
//! a deadlock) never fails its neighbours and every caller gets its own outcome. Any
//! other failure (connection lost, pool timeout) reaches every caller of the batch as a
//! transient store error ([`lost`]).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{StoreError, TransientKind};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::oneshot;

/// One kind of batched write: how a batch of callers' rows becomes one statement.
pub trait BatchOp: Send + Sync + 'static {
    /// One caller's row.
    type Req: Send + 'static;
    /// One caller's answer.
    type Resp: Send + 'static;

    /// Bytes the row adds to the statement (payloads), to bound a batch's size.
    fn weight(req: &Self::Req) -> usize;

    /// Writes the batch on `conn` and returns one answer per row, in order. When the
    /// batch statement fails with a database error ([`rolled_back`]) it wrote nothing;
    /// implementations then retry each row on its own so every caller gets its own
    /// outcome. A shorter answer leaves the remaining callers with a lost answer.
    fn run(
        &self,
        conn: &mut Held,
        batch: Vec<Self::Req>,
    ) -> impl Future<Output = Vec<Self::Resp>> + Send;
}

/// The connection a flusher keeps while it has batches to send (taken from the pool at
/// the first batch, returned when the queue is empty): no pool round trip (sqlx's
/// `test_before_acquire` ping) per batch.
pub struct Held {
    pool: PgPool,
    conn: Option<PoolConnection<Postgres>>,
}

impl Held {
    /// Holds nothing yet; connections come from `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self { pool, conn: None }
    }

    /// The held connection, acquired from the pool if none is held.
    pub async fn conn(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        if self.conn.is_none() {
            self.conn = Some(self.pool.acquire().await?);
        }
        match &mut self.conn {
            Some(c) => Ok(&mut **c),
            None => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Discards the connection when `r` failed other than by a database error.
    pub fn check<T>(&mut self, r: &Result<T, sqlx::Error>) {
        if let Err(e) = r
            && !rolled_back(e)
        {
            self.discard();
        }
    }

    /// Closes the held connection instead of returning it to the pool (after an error
    /// that was not the server's answer: the connection may be broken or mid-protocol).
    pub fn discard(&mut self) {
        if let Some(mut c) = self.conn.take() {
            c.close_on_drop();
        }
    }
}

type Slot<O> = (<O as BatchOp>::Req, oneshot::Sender<<O as BatchOp>::Resp>);

struct Queue<O: BatchOp> {
    pending: VecDeque<Slot<O>>,
    /// Flushers running (each has at most one statement in flight).
    flushers: usize,
}

/// The combiner of one [`BatchOp`].
pub struct Combiner<O: BatchOp> {
    op: O,
    pool: PgPool,
    queue: Mutex<Queue<O>>,
    max_rows: usize,
    max_bytes: usize,
    max_flushers: usize,
}

impl<O: BatchOp> std::fmt::Debug for Combiner<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner")
            .field("max_rows", &self.max_rows)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// Resets the flusher flag if the flusher ends abnormally (panic, runtime shutdown): the
/// queued callers are dropped (they see a lost answer) and the next caller starts a new
/// flusher.
struct FlushGuard<O: BatchOp> {
    combiner: Arc<Combiner<O>>,
    armed: bool,
}

impl<O: BatchOp> Drop for FlushGuard<O> {
    fn drop(&mut self) {
        if self.armed {
            let mut q = self.combiner.lock();
            q.flushers = q.flushers.saturating_sub(1);
            if q.flushers == 0 {
                q.pending.clear();
            }
        }
    }
}

impl<O: BatchOp> Combiner<O> {
    /// A combiner sending at most `max_rows` rows and (beyond its first row) about
    /// `max_bytes` of payload per statement, with at most `max_flushers` statements in
    /// flight at a time.
    pub fn new(
        op: O,
        pool: PgPool,
        max_rows: usize,
        max_bytes: usize,
        max_flushers: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            op,
            pool,
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                flushers: 0,
            }),
            max_rows: max_rows.max(1),
            max_bytes,
            max_flushers: max_flushers.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue<O>> {
        // The critical sections only move items; a poisoned lock holds a valid queue.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `req` and waits for its answer (spawns the flusher on the current tokio
    /// runtime when none runs). `None` when the answer was lost (the
    /// flusher panicked or the runtime is shutting down): the row may or may not have
    /// been written.
    pub async fn submit(self: &Arc<Self>, req: O::Req) -> Option<O::Resp> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.lock();
            q.pending.push_back((req, tx));
            if q.flushers < self.max_flushers {
                q.flushers += 1;
                true
            } else {
                false
            }
        };
        if start {
            tokio::spawn(self.clone().flush());
        }
        rx.await.ok()
    }

    /// The next batch, or `None` (and this flusher unregistered) when the queue is
    /// empty.
    fn take(&self) -> Option<Vec<Slot<O>>> {
        let mut q = self.lock();
        if q.pending.is_empty() {
            q.flushers = q.flushers.saturating_sub(1);
            return None;
        }
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while batch.len() < self.max_rows {
            let Some(front) = q.pending.front() else {
                break;
            };
            let w = O::weight(&front.0);
            if !batch.is_empty() && bytes.saturating_add(w) > self.max_bytes {
                break;
            }
            bytes = bytes.saturating_add(w);
            if let Some(slot) = q.pending.pop_front() {
                batch.push(slot);
            }
        }
        Some(batch)
    }

    async fn flush(self: Arc<Self>) {
        let mut guard = FlushGuard {
            combiner: self.clone(),
            armed: true,
        };
        let mut held = Held::new(self.pool.clone());
        while let Some(batch) = self.take() {
            let (reqs, senders): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let answers = self.op.run(&mut held, reqs).await;
            // `run` answers every row; a shorter answer drops the remaining senders
            // (those callers see a lost answer).
            for (tx, answer) in senders.into_iter().zip(answers) {
                let _ = tx.send(answer);
            }
        }
        guard.armed = false;
    }
}

/// True when a failed batch statement was rejected by the server (so it was rolled back
/// as a whole and its rows can be retried one by one).
pub fn rolled_back(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
}

/// The error every caller of a batch gets when the statement failed other than by a
/// database error (the outcome is unknown to the caller: the connection was lost, the
/// pool timed out): the classification of the original error, as a transient failure
/// when it was one.
pub fn lost(e: &sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    let kind = match e {
        E::PoolTimedOut => TransientKind::PoolTimeout,
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolClosed | E::WorkerCrashed => {
            TransientKind::ConnectionLost
        }
        E::ColumnDecode { .. } | E::Decode(_) | E::ColumnNotFound(_) | E::TypeNotFound { .. } => {
            return StoreError::Decode;
        }
        _ => {
            return StoreError::Permanent {
                sqlstate: "XX000".to_owned(),
            };
        }
    };
    StoreError::Transient {
        kind,
        sqlstate: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Doubles each number; records batch sizes.
    struct Double {
        batches: Arc<Mutex<Vec<usize>>>,
        calls: AtomicUsize,
    }

    impl BatchOp for Double {
        type Req = u32;
        type Resp = u32;
        fn weight(_: &u32) -> usize {
            10
        }
        async fn run(&self, _: &mut Held, batch: Vec<u32>) -> Vec<u32> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.batches.lock().unwrap().push(batch.len());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            batch.into_iter().map(|n| n * 2).collect()
        }
    }

    /// A pool that never connects (the test op does not use its connection).
    fn lazy_pool() -> PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_caller_gets_its_own_answer_and_batches_form() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let c = Combiner::new(
            Double {
                batches: batches.clone(),
                calls: AtomicUsize::new(0),
            },
            lazy_pool(),
            8,
            1_000,
            1,
        );
        let mut set = tokio::task::JoinSet::new();
        for i in 0..100u32 {
            let c = c.clone();
            set.spawn(async move { (i, c.submit(i).await) });
        }
        let mut seen = 0;
        while let Some(r) = set.join_next().await {
            let (i, answer) = r.unwrap();
            assert_eq!(answer, Some(i * 2));
            seen += 1;
        }
        assert_eq!(seen, 100);
        let b = batches.lock().unwrap().clone();
        assert_eq!(b.iter().sum::<usize>(), 100, "no row lost or duplicated");
        assert!(b.iter().all(|n| *n <= 8), "max_rows holds: {b:?}");
        assert!(b.len() < 100, "rows were combined: {b:?}");
        assert_eq!(c.lock().flushers, 0, "the flushers exited");
    }

    #[tokio::test]
    async fn the_byte_bound_splits_batches_but_always_takes_one_row() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let c = Combiner::new(
            Double {
                batches: batches.clone(),
                calls: AtomicUsize::new(0),
            },
            lazy_pool(),
            100,
            5,
            2,
        );
        let mut set = tokio::task::JoinSet::new();
        for i in 0..10u32 {
            let c = c.clone();
            set.spawn(async move { c.submit(i).await });
        }
        while let Some(r) = set.join_next().await {
            assert!(r.unwrap().is_some());
        }
        assert!(batches.lock().unwrap().iter().all(|n| *n == 1));
    }
}
