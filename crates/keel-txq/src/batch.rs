//! Group commit of enqueues: requests recorded concurrently in one process share one
//! multi-row `INSERT` (one commit) instead of one autocommit statement each, through
//! the shared combiner of [`keel_store::group_commit`]. Each caller still awaits its own
//! row's commit before `enqueue` returns, so an id handed out is always durable.

use crate::TxqError;
use crate::queue::metrics;
use crate::store::{self, OwnedNewRequest};
use keel_store::PgPool;
use keel_store::group_commit::{BatchOp, Combiner, Held, lost, rolled_back};
use std::collections::HashSet;
use std::sync::Arc;
use uuid::Uuid;

/// Rows per `INSERT` statement at most.
const MAX_BATCH: usize = 1000;

/// Calldata bytes per statement at most (beyond its first row).
const MAX_BATCH_BYTES: usize = 4 << 20;

/// The enqueue write: rows in, "inserted (`false`: the key existed)" out.
pub(crate) struct EnqueueOp;

impl BatchOp for EnqueueOp {
    type Req = OwnedNewRequest;
    type Resp = crate::Result<bool>;

    fn weight(req: &OwnedNewRequest) -> usize {
        req.calldata.len()
    }

    async fn run(&self, held: &mut Held, batch: Vec<OwnedNewRequest>) -> Vec<Self::Resp> {
        metrics::enqueue_batch_rows(batch.len());
        let rows: Vec<&OwnedNewRequest> = batch.iter().collect();
        let r = match held.conn().await {
            Ok(conn) => store::requests_insert_many(conn, &rows).await,
            Err(e) => Err(e),
        };
        held.check(&r);
        match r {
            Ok(inserted) => {
                let inserted: HashSet<Uuid> = inserted.into_iter().collect();
                batch.iter().map(|r| Ok(inserted.contains(&r.id))).collect()
            }
            // Rejected as a whole (nothing written): each row alone, so one bad row
            // fails only its own caller.
            Err(e) if rolled_back(&e) => {
                let mut out = Vec::with_capacity(batch.len());
                for row in &batch {
                    out.push(match held.conn().await {
                        Ok(conn) => store::request_insert(conn, &row.borrowed()).await,
                        Err(e) => Err(TxqError::Store(lost(&e))),
                    });
                }
                out
            }
            Err(e) => batch
                .iter()
                .map(|_| Err(TxqError::Store(lost(&e))))
                .collect(),
        }
    }
}

/// The combiner of one [`crate::TxQueue`].
pub(crate) type EnqueueBatcher = Arc<Combiner<EnqueueOp>>;

/// A combiner for `db`: up to [`MAX_BATCH`] rows per statement, one statement in flight.
pub(crate) fn enqueue_batcher(db: PgPool) -> EnqueueBatcher {
    Combiner::new(EnqueueOp, db, MAX_BATCH, MAX_BATCH_BYTES, 1)
}
