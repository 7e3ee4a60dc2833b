//! SQL of the queue's tables, one module per table (or per concern of `txq_request`,
//! the widest table). Every function takes an executor (`impl PgExecutor<'_>`;
//! `&mut PgConnection` where it needs one connection for several statements) so callers
//! compose them in one transaction; moves are guarded by the state they leave, and rows
//! come back as `FromRow` structs. Functions and rows are re-exported here, so callers
//! write `store::request_get`.
//!
//! | module | table(s) |
//! |---|---|
//! | [`request`] | `txq_request` (`migrations/0005_txq.sql`): enqueue, queued/in-flight reads, lifecycle moves, re-signing, gap fills, withdrawal, broadcast failures (`0018`) |
//! | [`funding`] | `txq_request`'s funding pause (`0008_txq_funding.sql`) |
//! | [`attempt`] | `txq_attempt`: signed transactions, the signing group's commit (`0013`, `0015`) |
//! | [`sender`] | `txq_sender`: next nonce, its lock, nonces a gap filler must not take |
//! | [`custody`] | `txq_custody_attempt` (`0040_txq_custody.sql`, `0070`): custody submissions |
//! | [`watch`] | `txq_request`'s finality watch of settled writes (`0065`) |
//! | [`view`] | reads of [`crate::requests`] (request, last attempt, latest custody submission) |
//! | [`health`] | reads of Platform Status and queue depth (`0051_txq_status.sql`) |

pub(crate) mod attempt;
pub(crate) mod custody;
pub(crate) mod funding;
pub(crate) mod health;
pub(crate) mod request;
pub(crate) mod sender;
pub(crate) mod view;
pub(crate) mod watch;

pub(crate) use attempt::*;
pub(crate) use custody::*;
pub(crate) use funding::*;
pub(crate) use health::*;
pub(crate) use request::*;
pub(crate) use sender::*;
pub(crate) use view::*;
pub(crate) use watch::*;

/// Maps a failed read of `table`: a stored value that does not decode (a hash or
/// address of the wrong length, an unknown phase, a negative chain id) becomes
/// [`crate::TxqError::UnreadableRow`] naming the table (never the value); any other
/// failure is the store's error as usual.
pub(crate) fn unreadable(table: &'static str) -> impl Fn(sqlx::Error) -> crate::TxqError {
    move |e| match e {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            crate::TxqError::UnreadableRow { table }
        }
        other => other.into(),
    }
}
