//! `distribution` and `distribution_payment` (migration `0089`): the distributions of
//! the `distribution.pay` workflow and what each holder of the snapshot is owed and
//! was paid. Amounts are `NUMERIC(78,0)` base units of the paying token, passed as
//! decimal text.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::*;

/// A `distribution` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DistributionRow {
    /// The distribution's (and its operation's) id.
    pub id: Uuid,
    /// The organization.
    pub organization_id: Uuid,
    /// The asset whose holders are paid.
    pub asset_id: Uuid,
    /// The final snapshot.
    pub snapshot_id: Uuid,
    /// The chain.
    pub chain_id: i64,
    /// `asset`, `erc20` or `native`.
    pub pay_kind: String,
    /// The paying token (20 bytes), `None` for native.
    pub pay_token: Option<Vec<u8>>,
    /// `proRata` or `perUnit`.
    pub basis: String,
    /// The total (pro rata) or the amount per whole unit (per unit), decimal text.
    pub amount: String,
    /// `floor` or `largestRemainder`.
    pub rounding: String,
    /// Excluded holders (20 bytes each).
    pub exclusions: Vec<Vec<u8>>,
    /// Set by the plan: holders of the snapshot.
    pub holder_count: Option<i32>,
    /// Set by the plan: the sum owed, decimal text.
    pub total_due: Option<String>,
    /// Set by the plan: what the rounding left unpaid, decimal text.
    pub remainder: Option<String>,
    /// When the plan was written.
    pub planned_at: Option<DateTime<Utc>>,
    /// When its workflow paid the last batch.
    pub completed_at: Option<DateTime<Utc>>,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// Since when it is paused (`None`: not paused).
    pub paused_at: Option<DateTime<Utc>>,
}

const DISTRIBUTION_COLUMNS: &str = "id, organization_id, asset_id, snapshot_id, chain_id, pay_kind, pay_token, \
     basis, amount::text AS amount, rounding, exclusions, holder_count, total_due::text AS total_due, \
     remainder::text AS remainder, planned_at, completed_at, created_at, paused_at";

/// A new `distribution` row (its operation row exists, in the same transaction).
#[derive(Debug, Clone, Copy)]
pub struct NewDistributionRow<'a> {
    /// The operation's id.
    pub id: Uuid,
    /// The organization.
    pub organization_id: Uuid,
    /// The asset.
    pub asset_id: Uuid,
    /// The final snapshot.
    pub snapshot_id: Uuid,
    /// The chain.
    pub chain_id: i64,
    /// `asset`, `erc20` or `native`.
    pub pay_kind: &'a str,
    /// The paying token (20 bytes), `None` for native.
    pub pay_token: Option<&'a [u8]>,
    /// `proRata` or `perUnit`.
    pub basis: &'a str,
    /// Decimal text, base units of the paying token.
    pub amount: &'a str,
    /// `floor` or `largestRemainder`.
    pub rounding: &'a str,
    /// Excluded holders (20 bytes each).
    pub exclusions: &'a [Vec<u8>],
}

/// Inserts a distribution.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_insert(
    db: impl PgExecutor<'_>,
    d: &NewDistributionRow<'_>,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO distribution (id, organization_id, asset_id, snapshot_id, chain_id, pay_kind,
                                   pay_token, basis, amount, rounding, exclusions)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::numeric, $10, $11)",
    )
    .bind(d.id)
    .bind(d.organization_id)
    .bind(d.asset_id)
    .bind(d.snapshot_id)
    .bind(d.chain_id)
    .bind(d.pay_kind)
    .bind(d.pay_token)
    .bind(d.basis)
    .bind(d.amount)
    .bind(d.rounding)
    .bind(d.exclusions)
    .execute(db)
    .await?;
    Ok(())
}

/// The distribution `id` of `organization_id` (`None`: no such distribution there).
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_get(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<DistributionRow>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {DISTRIBUTION_COLUMNS} FROM distribution WHERE id = $1 AND organization_id = $2"
    )))
    .bind(id)
    .bind(organization_id)
    .fetch_optional(db)
    .await?)
}

/// A page of the distributions of `asset_id` (newest first), strictly after the
/// position `after` (`created_at`, `id`), at most `limit`.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_list(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    asset_id: Uuid,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> StoreResult<Vec<DistributionRow>> {
    let (at, id) = after.unzip();
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {DISTRIBUTION_COLUMNS} FROM distribution
         WHERE asset_id = $1 AND organization_id = $2
           AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4))
         ORDER BY created_at DESC, id DESC LIMIT $5"
    )))
    .bind(asset_id)
    .bind(organization_id)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// One planned payment: holder (20 bytes), balance and amount (decimal text), state
/// (`pending`, `excluded` or `zero`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPaymentRow {
    /// The holder.
    pub holder: Vec<u8>,
    /// Its record-date balance, decimal text.
    pub balance: String,
    /// What it is owed, decimal text.
    pub amount: String,
    /// `pending`, `excluded` or `zero`.
    pub state: &'static str,
}

/// Writes distribution `id`'s plan once: its payment rows (a repeat inserts nothing)
/// and its totals (set only while unset). Run in one transaction by the caller.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_plan_write(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    rows: &[PlannedPaymentRow],
    total_due: &str,
    remainder: &str,
) -> StoreResult<()> {
    for chunk in rows.chunks(5_000) {
        let holders: Vec<&[u8]> = chunk.iter().map(|r| r.holder.as_slice()).collect();
        let balances: Vec<&str> = chunk.iter().map(|r| r.balance.as_str()).collect();
        let amounts: Vec<&str> = chunk.iter().map(|r| r.amount.as_str()).collect();
        let states: Vec<&str> = chunk.iter().map(|r| r.state).collect();
        sqlx::query(
            "INSERT INTO distribution_payment (distribution_id, holder, balance, amount, state)
             SELECT $1, h, b::numeric, a::numeric, s
             FROM unnest($2::bytea[], $3::text[], $4::text[], $5::text[]) AS t(h, b, a, s)
             ON CONFLICT (distribution_id, holder) DO NOTHING",
        )
        .bind(id)
        .bind(&holders)
        .bind(&balances)
        .bind(&amounts)
        .bind(&states)
        .execute(&mut *conn)
        .await?;
    }
    let count = i32::try_from(rows.len()).unwrap_or(i32::MAX);
    sqlx::query(
        "UPDATE distribution SET holder_count = $2, total_due = $3::numeric,
                                 remainder = $4::numeric, planned_at = now()
         WHERE id = $1 AND planned_at IS NULL",
    )
    .bind(id)
    .bind(count)
    .bind(total_due)
    .bind(remainder)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A payment placed in a batch: holder (20 bytes) and amount (decimal text).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BatchPaymentRow {
    /// The holder.
    pub holder: Vec<u8>,
    /// What it is owed, decimal text.
    pub amount: String,
}

/// The pending payments of batch `batch`, in holder order; when it has none yet, first
/// places the next `limit` unplaced pending payments (holder order) in it. A repeat
/// returns the same rows less any refused since.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_batch_place(
    db: &PgPool,
    id: Uuid,
    batch: i32,
    limit: i64,
) -> StoreResult<Vec<BatchPaymentRow>> {
    let mut tx = db.begin().await?;
    // One placer per distribution at a time (the workflow runs one instance, but a
    // stale lease holder may still be finishing a step).
    sqlx::query("SELECT 1 FROM distribution WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let placed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM distribution_payment WHERE distribution_id = $1 AND batch = $2)",
    )
    .bind(id)
    .bind(batch)
    .fetch_one(&mut *tx)
    .await?;
    if !placed {
        sqlx::query(
            "UPDATE distribution_payment SET batch = $2
             WHERE distribution_id = $1 AND holder IN (
                 SELECT holder FROM distribution_payment
                 WHERE distribution_id = $1 AND state = 'pending' AND batch IS NULL
                 ORDER BY holder LIMIT $3)",
        )
        .bind(id)
        .bind(batch)
        .bind(limit)
        .execute(&mut *tx)
        .await?;
    }
    let rows = sqlx::query_as(
        "SELECT holder, amount::text AS amount FROM distribution_payment
         WHERE distribution_id = $1 AND batch = $2 AND state = 'pending' ORDER BY holder",
    )
    .bind(id)
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

/// Marks the pending payment of `holder` refused with `reason` (the token's error
/// name, or `TransferRefused`); a repeat changes nothing.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_payment_refuse(
    db: impl PgExecutor<'_>,
    id: Uuid,
    holder: &[u8],
    reason: &str,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE distribution_payment SET state = 'refused', reason = $3
         WHERE distribution_id = $1 AND holder = $2 AND state = 'pending'",
    )
    .bind(id)
    .bind(holder)
    .bind(reason)
    .execute(db)
    .await?;
    Ok(())
}

/// Marks the pending payments of batch `batch` paid by `tx_hash` in `block`: the rows
/// changed (0 on a repeat).
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_batch_settle(
    db: impl PgExecutor<'_>,
    id: Uuid,
    batch: i32,
    tx_hash: &[u8],
    block: i64,
) -> StoreResult<u64> {
    Ok(sqlx::query(
        "UPDATE distribution_payment SET state = 'paid', tx_hash = $3, block_number = $4
         WHERE distribution_id = $1 AND batch = $2 AND state = 'pending'",
    )
    .bind(id)
    .bind(batch)
    .bind(tx_hash)
    .bind(block)
    .execute(db)
    .await?
    .rows_affected())
}

/// Payments of one state: how many, their sum (decimal text) and the batches they are in.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PaymentTallyRow {
    /// `pending`, `paid`, `refused`, `excluded` or `zero`.
    pub state: String,
    /// Rows in the state.
    pub holders: i64,
    /// Sum of their amounts, decimal text.
    pub amount: String,
    /// Distinct batches among them.
    pub batches: i64,
}

/// The payments of distribution `id` tallied by state.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_tally(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> StoreResult<Vec<PaymentTallyRow>> {
    Ok(sqlx::query_as(
        "SELECT state, count(*) AS holders, coalesce(sum(amount), 0)::text AS amount,
                count(DISTINCT batch) AS batches
         FROM distribution_payment WHERE distribution_id = $1 GROUP BY state ORDER BY state",
    )
    .bind(id)
    .fetch_all(db)
    .await?)
}

/// A `distribution_payment` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PaymentRow {
    /// The holder (20 bytes).
    pub holder: Vec<u8>,
    /// Its record-date balance, decimal text.
    pub balance: String,
    /// What it is owed, decimal text.
    pub amount: String,
    /// The state.
    pub state: String,
    /// Its batch, once placed.
    pub batch: Option<i32>,
    /// The paying transaction (32 bytes), once paid.
    pub tx_hash: Option<Vec<u8>>,
    /// The paying transaction's block, once paid.
    pub block_number: Option<i64>,
    /// Why it was refused.
    pub reason: Option<String>,
}

/// A page of distribution `id`'s payments in holder order, strictly after `after`
/// (20 bytes; empty: from the first), at most `limit`.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_payments(
    db: impl PgExecutor<'_>,
    id: Uuid,
    after: &[u8],
    limit: i64,
) -> StoreResult<Vec<PaymentRow>> {
    Ok(sqlx::query_as(
        "SELECT holder, balance::text AS balance, amount::text AS amount, state, batch, tx_hash,
                block_number, reason
         FROM distribution_payment WHERE distribution_id = $1 AND holder > $2
         ORDER BY holder LIMIT $3",
    )
    .bind(id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Marks distribution `id` completed: true the first time, false on a repeat.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_complete(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<bool> {
    Ok(sqlx::query(
        "UPDATE distribution SET completed_at = now() WHERE id = $1 AND completed_at IS NULL",
    )
    .bind(id)
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// The first `limit` unplaced pending payments of distribution `id` in holder order
/// (the batch-size probe).
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_payments_unplaced(
    db: impl PgExecutor<'_>,
    id: Uuid,
    limit: i64,
) -> StoreResult<Vec<BatchPaymentRow>> {
    Ok(sqlx::query_as(
        "SELECT holder, amount::text AS amount FROM distribution_payment
         WHERE distribution_id = $1 AND state = 'pending' AND batch IS NULL
         ORDER BY holder LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Pauses distribution `id` of `organization_id` unless it is paused or completed
/// already: `Some(n)` (its `n`-th pause) when this call paused it.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_pause(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<i32>> {
    Ok(sqlx::query_scalar(
        "UPDATE distribution SET paused_at = now(), pause_count = pause_count + 1
          WHERE id = $1 AND organization_id = $2 AND paused_at IS NULL AND completed_at IS NULL
         RETURNING pause_count",
    )
    .bind(id)
    .bind(organization_id)
    .fetch_optional(db)
    .await?)
}

/// Clears the pause of distribution `id` of `organization_id`: `Some(n)` (the pause
/// it ended, counted from 1) when it was paused.
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_unpause(
    db: impl PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> StoreResult<Option<i32>> {
    Ok(sqlx::query_scalar(
        "UPDATE distribution SET paused_at = NULL
          WHERE id = $1 AND organization_id = $2 AND paused_at IS NOT NULL
         RETURNING pause_count",
    )
    .bind(id)
    .bind(organization_id)
    .fetch_optional(db)
    .await?)
}

/// Whether distribution `id` is paused (false for an unknown id).
///
/// # Errors
/// [`StoreError`].
pub async fn distribution_paused(db: impl PgExecutor<'_>, id: Uuid) -> StoreResult<bool> {
    Ok(sqlx::query_scalar::<_, bool>(
        "SELECT paused_at IS NOT NULL FROM distribution WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?
    .unwrap_or(false))
}

/// The `limit` newest distributions without `completed_at` (running, paused, waiting,
/// or ended without completing), platform-wide, each with its operation's instance.
///
/// # Errors
/// [`StoreError`].
pub async fn distributions_unfinished(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> StoreResult<Vec<(DistributionRow, Option<Uuid>)>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        d: DistributionRow,
        instance_id: Option<Uuid>,
    }
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {DISTRIBUTION_COLUMNS},
                (SELECT o.instance_id FROM operation o WHERE o.id = distribution.id) AS instance_id
           FROM distribution WHERE completed_at IS NULL
          ORDER BY created_at DESC, id DESC LIMIT $1"
    )))
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.d, r.instance_id)).collect())
}
