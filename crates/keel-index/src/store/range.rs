//! `index_range`: history ranges (whole scope, or one address) in the states
//! `pending` → `running` (claimed, leased; `attempt` counts claims) → `completed`. A
//! range whose lease expired is claimable again; every update of a claimed range is
//! guarded by its attempt, so a worker whose lease was taken over changes nothing.

use crate::Result;
use sqlx::PgExecutor;

/// A claimed range.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    pub id: i64,
    pub address: Option<Vec<u8>>,
    pub from_block: i64,
    pub to_block: i64,
    pub attempt: i32,
}

/// A whole-scope range above another one, with its state.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RangeSpanRow {
    pub from_block: i64,
    pub to_block: i64,
    pub state: String,
}

/// Where planning continues: after the last planned whole-scope range, or the first
/// time at the lowest `from_block` of the live scope (not below the block a re-index
/// starts at, `index_chain.rebuild_from_block`, migration 0062); `None` with neither.
pub(crate) async fn range_plan_start(db: impl PgExecutor<'_>, chain: i64) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(
            (SELECT max(to_block) + 1 FROM index_range WHERE chain_id = $1 AND address IS NULL),
            (SELECT greatest(
                (SELECT min(from_block) FROM index_scope WHERE chain_id = $1 AND removed_at IS NULL),
                (SELECT rebuild_from_block FROM index_chain WHERE chain_id = $1))))",
    )
    .bind(chain)
    .fetch_one(db)
    .await?)
}

/// Inserts pending whole-scope ranges `froms[i]..=tos[i]`.
pub(crate) async fn ranges_insert_many(
    db: impl PgExecutor<'_>,
    chain: i64,
    froms: &[i64],
    tos: &[i64],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO index_range (chain_id, from_block, to_block)
         SELECT $1, f, t FROM unnest($2::bigint[], $3::bigint[]) AS u(f, t)",
    )
    .bind(chain)
    .bind(froms)
    .bind(tos)
    .execute(db)
    .await?;
    Ok(())
}

/// Inserts a pending address-only range `from..=to` for `address`.
pub(crate) async fn range_insert_address(
    db: impl PgExecutor<'_>,
    chain: i64,
    address: &[u8],
    from: i64,
    to: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO index_range (chain_id, address, from_block, to_block)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(chain)
    .bind(address)
    .bind(from)
    .bind(to)
    .execute(db)
    .await?;
    Ok(())
}

/// The last block of the planned whole-scope history; `None` before any plan.
pub(crate) async fn range_planned_end(db: impl PgExecutor<'_>, chain: i64) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT max(to_block) FROM index_range WHERE chain_id = $1 AND address IS NULL",
    )
    .bind(chain)
    .fetch_one(db)
    .await?)
}

/// Ranges not yet completed.
pub(crate) async fn ranges_open_count(db: impl PgExecutor<'_>, chain: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM index_range WHERE chain_id = $1 AND state <> 'completed'",
    )
    .bind(chain)
    .fetch_one(db)
    .await?)
}

/// Claims the lowest claimable range (pending and not backing off after an unsettled
/// answer, or running with an expired lease) in one statement (`FOR UPDATE SKIP
/// LOCKED`): state `running`, attempt + 1, lease owner and expiry `lease_secs` from
/// now.
pub(crate) async fn range_claim(
    db: impl PgExecutor<'_>,
    chain: i64,
    owner: &str,
    lease_secs: f64,
) -> Result<Option<ClaimedRow>> {
    Ok(sqlx::query_as(
        "WITH next AS (
            SELECT id FROM index_range
            WHERE chain_id = $1
              AND ((state = 'pending' AND (retry_after IS NULL OR retry_after <= now()))
                   OR (state = 'running' AND lease_expires_at < now()))
            ORDER BY from_block, id
            LIMIT 1
            FOR UPDATE SKIP LOCKED)
         UPDATE index_range r
            SET state = 'running', attempt = r.attempt + 1, lease_owner = $2,
                lease_expires_at = now() + make_interval(secs => $3)
           FROM next WHERE r.id = next.id
         RETURNING r.id, r.address, r.from_block, r.to_block, r.attempt",
    )
    .bind(chain)
    .bind(owner)
    .bind(lease_secs)
    .fetch_optional(db)
    .await?)
}

/// Completes the range if `attempt` still holds it (guarded). Returns false when it
/// does not: the lease was lost.
pub(crate) async fn range_complete(
    db: impl PgExecutor<'_>,
    id: i64,
    attempt: i32,
    logs: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE index_range
            SET state = 'completed', completed_at = now(), lease_expires_at = NULL, logs = $3
          WHERE id = $1 AND attempt = $2 AND state = 'running'",
    )
    .bind(id)
    .bind(attempt)
    .bind(logs)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Extends the lease if `attempt` still holds the range (guarded). False when not.
pub(crate) async fn range_renew(
    db: impl PgExecutor<'_>,
    id: i64,
    attempt: i32,
    lease_secs: f64,
) -> Result<bool> {
    let renewed = sqlx::query(
        "UPDATE index_range SET lease_expires_at = now() + make_interval(secs => $3)
          WHERE id = $1 AND attempt = $2 AND state = 'running'",
    )
    .bind(id)
    .bind(attempt)
    .bind(lease_secs)
    .execute(db)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Puts a range whose answer was unsettled back to pending (guarded by `attempt`),
/// counts the refusal and holds the range back for `base_secs × 2^(refusals so far)`,
/// at most `cap_secs` (migration 0063). Returns the hold, seconds (`None` when the
/// attempt no longer held the range).
pub(crate) async fn range_release_unsettled(
    db: impl PgExecutor<'_>,
    id: i64,
    attempt: i32,
    base_secs: f64,
    cap_secs: f64,
) -> Result<Option<f64>> {
    Ok(sqlx::query_scalar(
        "UPDATE index_range
            SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL,
                unsettled_count = unsettled_count + 1,
                retry_after = now() + make_interval(
                    secs => least($3 * power(2, least(unsettled_count, 30)), $4))
          WHERE id = $1 AND attempt = $2 AND state = 'running'
          RETURNING least($3 * power(2, least(unsettled_count - 1, 30)), $4)::float8",
    )
    .bind(id)
    .bind(attempt)
    .bind(base_secs)
    .bind(cap_secs)
    .fetch_optional(db)
    .await?)
}

/// The whole-scope ranges starting above `block`, locked (`FOR UPDATE`), by first
/// block.
pub(crate) async fn ranges_whole_above_for_update(
    db: impl PgExecutor<'_>,
    chain: i64,
    block: i64,
) -> Result<Vec<RangeSpanRow>> {
    Ok(sqlx::query_as(
        "SELECT from_block, to_block, state FROM index_range
         WHERE chain_id = $1 AND address IS NULL AND from_block > $2
         ORDER BY from_block FOR UPDATE",
    )
    .bind(chain)
    .bind(block)
    .fetch_all(db)
    .await?)
}

/// History ranges counted by chain and state (`pending`, `running`, `completed`).
pub(crate) async fn range_state_counts(db: impl PgExecutor<'_>) -> Result<Vec<(i64, String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT chain_id, state, count(*) FROM index_range GROUP BY chain_id, state
          ORDER BY chain_id, state",
    )
    .fetch_all(db)
    .await?)
}

/// Locks every range row of the chain (`FOR UPDATE`): a re-index takes these locks
/// before the chain row's, in the order a history completion takes them (its range
/// row, then the chain row), so the two cannot deadlock.
pub(crate) async fn ranges_lock_all(db: impl PgExecutor<'_>, chain: i64) -> Result<()> {
    sqlx::query("SELECT 1 FROM index_range WHERE chain_id = $1 ORDER BY id FOR UPDATE")
        .bind(chain)
        .execute(db)
        .await?;
    Ok(())
}

/// A re-index from block `from`: deletes every range (whole-scope or address-only)
/// reaching `from` or above (a worker holding one of them then completes nothing:
/// [`range_complete`] finds no row) and plans again, pending, the part below `from` of
/// those that started below it. Returns the ranges deleted.
pub(crate) async fn ranges_cut_at(db: impl PgExecutor<'_>, chain: i64, from: i64) -> Result<u64> {
    let cut: i64 = sqlx::query_scalar(
        "WITH gone AS (
           DELETE FROM index_range WHERE chain_id = $1 AND to_block >= $2
           RETURNING address, from_block),
         kept AS (
           INSERT INTO index_range (chain_id, address, from_block, to_block)
           SELECT $1, address, from_block, $2 - 1 FROM gone WHERE from_block < $2)
         SELECT count(*) FROM gone",
    )
    .bind(chain)
    .bind(from)
    .fetch_one(db)
    .await?;
    Ok(u64::try_from(cut).unwrap_or(0))
}
