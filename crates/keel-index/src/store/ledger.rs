//! Reads of the Ledger read API (migrations `0025`, `0088`): holders ranked by balance
//! from `index_holder_balance` (kept by triggers on `index_transfer`), snapshots at a
//! block (current balances minus the balance changes above it, `index_holder_change`,
//! kept by the same triggers), transfer pages and
//! supply at a block. Keyset pagination only: every page query starts its index scan
//! at the cursor; none uses `OFFSET`.

use crate::Result;
use sqlx::PgExecutor;
use sqlx::types::chrono::{DateTime, Utc};

/// 2^256: above every balance, the keyset start of a first holders page.
pub(crate) const ABOVE_ANY_BALANCE: &str =
    "115792089237316195423570985008687907853269984665640564039457584007913129639936";

/// A holder with its balance (decimal text).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct HolderRecord {
    pub holder: Vec<u8>,
    pub balance: String,
}

/// An `index_transfer` row of a page, with its block time.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct TransferEntryRecord {
    pub block_number: i64,
    pub log_index: i64,
    pub block_hash: Vec<u8>,
    pub tx_hash: Vec<u8>,
    pub from_address: Vec<u8>,
    pub to_address: Vec<u8>,
    pub value: String,
    pub block_time: Option<DateTime<Utc>>,
}

/// Holders of `token` as of block `at` (every indexed transfer at or below it), ranked
/// by `(balance DESC, holder ASC)`, after the keyset `(after_balance, after_holder)`
/// (exclusive), at most `limit` rows. Positive balances only; the zero address never.
///
/// The holders with a balance change above `at` are recomputed (`moved`, from
/// `index_holder_change`: one row per holder and block); every other
/// holder's balance at `at` is its current one, so the current ranking is read from
/// `index_holder_balance_rank` starting at the cursor, over-fetched by `|moved|` rows so
/// that excluding the moved holders still leaves `limit` of them.
pub(crate) async fn holders_at(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    at: i64,
    after_balance: &str,
    after_holder: &[u8],
    limit: i64,
) -> Result<Vec<HolderRecord>> {
    Ok(sqlx::query_as(
        "WITH moved AS (
             SELECT holder, sum(delta) AS delta FROM index_holder_change
              WHERE chain_id = $1 AND token = $2 AND block_number > $3
              GROUP BY holder
         ), ranked AS (
             SELECT m.holder, COALESCE(b.balance, 0) - m.delta AS balance
               FROM moved m
               LEFT JOIN index_holder_balance b
                 ON b.chain_id = $1 AND b.token = $2 AND b.holder = m.holder
             UNION ALL
             SELECT top.holder, top.balance FROM (
                 SELECT b.holder, b.balance FROM index_holder_balance b
                  WHERE b.chain_id = $1 AND b.token = $2 AND b.balance > 0
                    AND b.balance <= $4::numeric
                    AND (b.balance < $4::numeric OR b.holder > $5)
                  ORDER BY b.balance DESC, b.holder
                  LIMIT $6 + (SELECT count(*) FROM moved)) top
              WHERE NOT EXISTS (SELECT 1 FROM moved m WHERE m.holder = top.holder)
         )
         -- (ORDER BY names the numeric column of `ranked`, not the text output.)
         SELECT holder, balance::text AS balance FROM ranked
          WHERE balance > 0 AND holder <> '\\x0000000000000000000000000000000000000000'::bytea
            AND balance <= $4::numeric AND (balance < $4::numeric OR holder > $5)
          ORDER BY ranked.balance DESC, ranked.holder
          LIMIT $6",
    )
    .bind(chain)
    .bind(token)
    .bind(at)
    .bind(after_balance)
    .bind(after_holder)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// The balance of `holder` in `token` as of block `at` (decimal text): its kept balance
/// (`index_holder_balance`) minus what it received and plus what it sent in the
/// transfers above `at` (a transfer to itself cancels out). Two index range scans of
/// the holder's transfers above `at` (`…_to_position`, `…_from_position`).
pub(crate) async fn balance_at(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    holder: &[u8],
    at: i64,
) -> Result<String> {
    Ok(sqlx::query_scalar(
        "SELECT (COALESCE((SELECT balance FROM index_holder_balance
                            WHERE chain_id = $1 AND token = $2 AND holder = $3), 0)
                 - COALESCE((SELECT sum(value) FROM index_transfer
                              WHERE chain_id = $1 AND token = $2 AND to_address = $3
                                AND block_number > $4), 0)
                 + COALESCE((SELECT sum(value) FROM index_transfer
                              WHERE chain_id = $1 AND token = $2 AND from_address = $3
                                AND block_number > $4), 0))::text",
    )
    .bind(chain)
    .bind(token)
    .bind(holder)
    .bind(at)
    .fetch_one(db)
    .await?)
}

/// Transfers of `token` (of `holder` as sender or receiver when given), newest first
/// by `(block_number, log_index)`, strictly before the keyset `(before_block,
/// before_log)`, at most `limit` rows. One index range scan per branch
/// (`index_transfer_token_position`, or the holder's `…_to_position` and
/// `…_from_position`).
pub(crate) async fn transfers_page(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    holder: Option<&[u8]>,
    before_block: i64,
    before_log: i64,
    limit: i64,
) -> Result<Vec<TransferEntryRecord>> {
    const COLUMNS: &str = "block_number, log_index, block_hash, tx_hash, from_address, \
                           to_address, value::text AS value, block_time";
    let q = match holder {
        None => sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM index_transfer
              WHERE chain_id = $1 AND token = $2 AND (block_number, log_index) < ($3, $4)
              ORDER BY block_number DESC, log_index DESC LIMIT $5"
        ))),
        Some(_) => sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT * FROM (
                 (SELECT {COLUMNS} FROM index_transfer
                   WHERE chain_id = $1 AND token = $2 AND to_address = $6
                     AND (block_number, log_index) < ($3, $4)
                   ORDER BY block_number DESC, log_index DESC LIMIT $5)
                 UNION ALL
                 (SELECT {COLUMNS} FROM index_transfer
                   WHERE chain_id = $1 AND token = $2 AND from_address = $6
                     AND to_address <> $6
                     AND (block_number, log_index) < ($3, $4)
                   ORDER BY block_number DESC, log_index DESC LIMIT $5)) t
              ORDER BY block_number DESC, log_index DESC LIMIT $5"
        ))),
    };
    let q = q
        .bind(chain)
        .bind(token)
        .bind(before_block)
        .bind(before_log)
        .bind(limit);
    let q = match holder {
        Some(h) => q.bind(h),
        None => q,
    };
    Ok(q.fetch_all(db).await?)
}

/// The supply of `token` as of block `at` (decimal text): −(the zero address's balance
/// at `at`), i.e. mints minus burns at or below it (as [`balance_at`]).
pub(crate) async fn supply_at(
    db: impl PgExecutor<'_>,
    chain: i64,
    token: &[u8],
    at: i64,
) -> Result<String> {
    Ok(sqlx::query_scalar(
        "SELECT (COALESCE((SELECT sum(delta) FROM index_holder_change
                            WHERE chain_id = $1 AND token = $2 AND holder = z
                              AND block_number > $3), 0)
                 - COALESCE((SELECT balance FROM index_holder_balance
                              WHERE chain_id = $1 AND token = $2 AND holder = z), 0))::text
           FROM (SELECT '\\x0000000000000000000000000000000000000000'::bytea AS z) zero",
    )
    .bind(chain)
    .bind(token)
    .bind(at)
    .fetch_one(db)
    .await?)
}

/// Recomputes every holder balance and balance change of the chain from its transfers
/// (a re-index: the kept balances and the history equal the sums again even if the table was damaged, e.g. by a
/// `TRUNCATE index_transfer`, which fires no trigger). The caller holds the chain row
/// locked, so no transfer of the chain is written meanwhile.
pub(crate) async fn balances_recompute(db: &mut sqlx::PgConnection, chain: i64) -> Result<()> {
    sqlx::query("DELETE FROM index_holder_balance WHERE chain_id = $1")
        .bind(chain)
        .execute(&mut *db)
        .await?;
    sqlx::query("DELETE FROM index_holder_change WHERE chain_id = $1")
        .bind(chain)
        .execute(&mut *db)
        .await?;
    sqlx::query(
        "INSERT INTO index_holder_balance (chain_id, token, holder, balance)
         SELECT $1, token, holder, sum(delta)
         FROM (SELECT token, to_address AS holder, value AS delta FROM index_transfer
                WHERE chain_id = $1
               UNION ALL
               SELECT token, from_address, -value FROM index_transfer WHERE chain_id = $1) d
         GROUP BY token, holder
         ORDER BY token, holder",
    )
    .bind(chain)
    .execute(&mut *db)
    .await?;
    sqlx::query(
        "INSERT INTO index_holder_change (chain_id, token, holder, block_number, delta)
         SELECT $1, token, holder, block_number, sum(delta)
         FROM (SELECT token, to_address AS holder, block_number, value AS delta
                 FROM index_transfer WHERE chain_id = $1
               UNION ALL
               SELECT token, from_address, block_number, -value
                 FROM index_transfer WHERE chain_id = $1) d
         GROUP BY token, block_number, holder
         HAVING sum(delta) <> 0
         ORDER BY token, block_number, holder",
    )
    .bind(chain)
    .execute(&mut *db)
    .await?;
    Ok(())
}
