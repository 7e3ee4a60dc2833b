//! `txq_sender` (`migrations/0005_txq.sql`): each sender's next nonce, its lock, and the
//! nonces a gap filler must not take.

use super::unreadable;
use crate::Result;
use alloy::primitives::Address;
use keel_units::db::DbAddress;
use sqlx::{PgExecutor, Row};

/// Creates the sender's nonce row at `chain_nonce` when it does not exist.
pub(crate) async fn sender_init(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    chain_nonce: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO txq_sender (chain_id, sender, next_nonce) VALUES ($1, $2, $3)
         ON CONFLICT (chain_id, sender) DO NOTHING",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(chain_nonce)
    .execute(db)
    .await?;
    Ok(())
}

pub(crate) async fn sender_exists(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM txq_sender WHERE chain_id = $1 AND sender = $2")
            .bind(chain_id)
            .bind(sender)
            .fetch_optional(db)
            .await
            .map_err(unreadable("txq_sender"))?
            .is_some(),
    )
}

/// Nonces of a sender in `[from, to)` that a gap filler must never take: those held by
/// live (`signed` or `broadcast`) requests, and those of requests settled `confirmed`
/// or `reverted` (mined there once: when such a nonce is free again a reorg took the
/// transaction back, and its own signed bytes are what may fill it, issue 32 §10).
pub(crate) async fn live_nonces(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    from: i64,
    to: i64,
) -> Result<Vec<i64>> {
    let rows = sqlx::query(
        "SELECT nonce FROM txq_request
          WHERE chain_id = $1 AND sender = $2 AND state IN ('signed', 'broadcast')
            AND nonce >= $3 AND nonce < $4
         UNION
         SELECT nonce FROM txq_request
          WHERE chain_id = $1 AND sender = $2 AND state = 'settled'
            AND verdict_kind IN ('confirmed', 'reverted')
            AND nonce >= $3 AND nonce < $4
         ORDER BY nonce",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(from)
    .bind(to)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_sender"))?;
    rows.iter()
        .map(|r| r.try_get::<i64, _>(0).map_err(Into::into))
        .collect()
}

/// Raises the sender's next nonce to `at_least` (never lowers it); returns the value
/// before.
pub(crate) async fn sender_raise_next(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    at_least: i64,
) -> Result<Option<i64>> {
    let row = sqlx::query(
        "UPDATE txq_sender s SET next_nonce = $3, updated_at = now()
           FROM (SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2 FOR UPDATE) old
          WHERE s.chain_id = $1 AND s.sender = $2 AND old.next_nonce < $3
         RETURNING old.next_nonce",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(at_least)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_sender"))?;
    row.map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
}

/// Of `senders`, those with a nonce row and no `signed` or `broadcast` request (idle:
/// nothing of theirs can be in a node's pool), with their next nonce.
pub(crate) async fn senders_idle(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    senders: &[&[u8]],
) -> Result<Vec<(Address, i64)>> {
    let rows = sqlx::query(
        "SELECT s.sender, s.next_nonce FROM txq_sender s
          WHERE s.chain_id = $1 AND s.sender = ANY($2)
            AND NOT EXISTS (SELECT 1 FROM txq_request r
                             WHERE r.chain_id = $1 AND r.sender = s.sender
                               AND r.state IN ('signed', 'broadcast'))",
    )
    .bind(chain_id)
    .bind(senders)
    .fetch_all(db)
    .await
    .map_err(unreadable("txq_sender"))?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get::<DbAddress, _>(0)
                    .map_err(unreadable("txq_sender"))?
                    .0,
                r.try_get::<i64, _>(1)?,
            ))
        })
        .collect()
}

/// Locks the sender's nonce row (the lock every nonce assignment takes) and returns
/// its next nonce; `None` without a row.
pub(crate) async fn sender_lock(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> Result<Option<i64>> {
    let row = sqlx::query(
        "SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2 FOR UPDATE",
    )
    .bind(chain_id)
    .bind(sender)
    .fetch_optional(db)
    .await
    .map_err(unreadable("txq_sender"))?;
    row.map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
}

/// Hands `nonce` back to `sender` (its next nonce `nonce + 1` becomes `nonce`) when no
/// live (`signed`, `broadcast`) request holds `nonce` or a higher one: the request that
/// held it was refused by a node before any node accepted it (issue 33 §1), so no pool
/// holds a transaction at it and the next request may take it instead of a gap-filling
/// self-transfer. True when it was handed back. Guarded by the counter's value, so a
/// signing round that committed meanwhile (the counter moved on) wins.
pub(crate) async fn sender_release_nonce(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
    nonce: i64,
) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE txq_sender SET next_nonce = $3, updated_at = now() \
         WHERE chain_id = $1 AND sender = $2 AND next_nonce = $3 + 1 \
           AND NOT EXISTS (SELECT 1 FROM txq_request r WHERE r.chain_id = $1 AND r.sender = $2 \
             AND r.state IN ('signed', 'broadcast') AND r.nonce >= $3)",
    )
    .bind(chain_id)
    .bind(sender)
    .bind(nonce)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The sender's next nonce, if its row exists.
pub(crate) async fn sender_next(
    db: impl PgExecutor<'_>,
    chain_id: i64,
    sender: &[u8],
) -> Result<Option<i64>> {
    let row = sqlx::query("SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2")
        .bind(chain_id)
        .bind(sender)
        .fetch_optional(db)
        .await
        .map_err(unreadable("txq_sender"))?;
    row.map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
}
