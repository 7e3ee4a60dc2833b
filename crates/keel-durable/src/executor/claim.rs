//! The claim: one statement, used by the executor loop (for its free slots) and by a
//! segment settle that claims its slot's next command in the same transaction
//! (settle-and-claim-next); the claimed row; and the dead letters a claim reports.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{FromRow, PgExecutor, Row};
use uuid::Uuid;

use crate::engine::Engine;
use crate::metrics as m;
use crate::status::{CommandKind, RunStatus};
use crate::version::ClaimSet;

/// A command the claim set running, with its instance leased to this executor.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) command_id: i64,
    pub(crate) kind: CommandKind,
    pub(crate) attempt: i32,
    pub(crate) exhausted: bool,
    pub(crate) latency: f64,
    pub(crate) instance_id: Uuid,
    pub(crate) workflow: String,
    /// The instance's status before the claim (decoded at the row).
    pub(crate) status: RunStatus,
    pub(crate) input: Value,
    pub(crate) lease_token: Option<Uuid>,
    pub(crate) cancel: bool,
    pub(crate) recovery_attempts: i32,
    pub(crate) db_now: DateTime<Utc>,
    /// The version the instance is pinned to (the claim pins an unpinned one).
    pub(crate) version: Option<i32>,
}

/// Up to `$5` of the oldest available queued commands of registered workflows (`$1`,
/// each with its version range `$2..=$3`: only instances pinned to a version in the
/// range, or not pinned yet, migration 0058) whose
/// instance holds no live lease, that no earlier runnable command of their instance
/// precedes, and (for a START) that no earlier unfinished instance with the same
/// serialization key precedes: each is set running with attempt + 1 and its instance
/// leased (for `$4` seconds) with a new token — or dead-lettered when its attempts are
/// spent. The per-instance check means at most one command per instance (and one START
/// per serialization key) qualifies, so a batch never holds two commands of one instance.
/// `durable_claim_versions` (migrations 0012, 0058, 0069) walks the queue in claim order
/// and stops after `$5` claims, checking and locking (`FOR UPDATE ... SKIP LOCKED`) each
/// candidate by primary key, so its cost does not grow with the backlog and no plan can
/// make it scan the queue.
///
/// The first column is the database time the claim compared `available_at` with
/// (`now()`, the same inside the claim function), on one row even when nothing was
/// claimed: the loop's next-due query counts every command that was not yet due for
/// this claim, so one that fell due since is not skipped.
const CLAIM: &str = "\
SELECT t.claim_now, c.command_id, c.kind, c.attempt, c.exhausted, c.latency, c.instance_id,
       c.workflow, c.status, c.input, c.lease_token, c.cancel, c.recovery_attempts, c.db_now,
       c.version
  FROM (SELECT now() AS claim_now) t
  LEFT JOIN LATERAL durable_claim_versions($1, $2, $3, $4, $5::int4) c ON true";

/// A row of [`CLAIM`]: the claim's time, and a claimed command unless none was.
#[derive(Debug, sqlx::FromRow)]
struct ClaimRow {
    claim_now: DateTime<Utc>,
    command_id: Option<i64>,
    kind: Option<CommandKind>,
    attempt: Option<i32>,
    exhausted: Option<bool>,
    latency: Option<f64>,
    instance_id: Option<Uuid>,
    workflow: Option<String>,
    status: Option<RunStatus>,
    input: Option<Value>,
    lease_token: Option<Uuid>,
    cancel: Option<bool>,
    recovery_attempts: Option<i32>,
    db_now: Option<DateTime<Utc>>,
    version: Option<i32>,
}

impl ClaimRow {
    /// The claimed command; `None` on the row of an empty claim.
    fn claimed(self) -> Option<Claimed> {
        Some(Claimed {
            command_id: self.command_id?,
            kind: self.kind?,
            attempt: self.attempt?,
            exhausted: self.exhausted?,
            latency: self.latency?,
            instance_id: self.instance_id?,
            workflow: self.workflow?,
            status: self.status?,
            input: self.input?,
            lease_token: self.lease_token,
            cancel: self.cancel?,
            recovery_attempts: self.recovery_attempts?,
            db_now: self.db_now?,
            version: self.version,
        })
    }
}

/// A claimed command whose row does not decode (a stored status or kind this build does
/// not know, see [`crate::stored`]): its lease is held and it is released by the caller
/// ([`release_unreadable`]), so one unreadable row never fails its neighbours' claim.
#[derive(Debug)]
pub(crate) struct Unreadable {
    command_id: i64,
    instance_id: Uuid,
    lease_token: Option<Uuid>,
}

/// What a claim returned.
#[derive(Debug, Default)]
pub(crate) struct Claim {
    /// The claimed commands (dead letters included, see [`dead_lettered`]).
    pub(crate) claimed: Vec<Claimed>,
    /// The claimed commands whose row did not decode.
    pub(crate) unreadable: Vec<Unreadable>,
    /// The claim's database time.
    pub(crate) at: Option<DateTime<Utc>>,
}

/// Claims up to `limit` commands of `names`, leasing their instances for `lease_secs`.
/// Each row is decoded on its own: a row that does not decode is logged, counted (by
/// its column's decoder) and returned in [`Claim::unreadable`].
///
/// Returns sqlx's error unclassified (the settle combiner tells a rolled-back statement
/// from a lost connection).
pub(super) async fn claim(
    db: impl PgExecutor<'_>,
    names: &ClaimSet,
    lease_secs: f64,
    limit: usize,
) -> Result<Claim, sqlx::Error> {
    let rows = sqlx::query(CLAIM)
        .bind(&names.names)
        .bind(&names.min)
        .bind(&names.max)
        .bind(lease_secs)
        .bind(i32::try_from(limit).unwrap_or(i32::MAX))
        .fetch_all(db)
        .await?;
    let mut out = Claim::default();
    for row in &rows {
        match ClaimRow::from_row(row) {
            Ok(r) => {
                out.at.get_or_insert(r.claim_now);
                out.claimed.extend(r.claimed());
            }
            Err(e) => {
                let unreadable = Unreadable {
                    command_id: row.try_get("command_id")?,
                    instance_id: row.try_get("instance_id")?,
                    lease_token: row.try_get("lease_token")?,
                };
                out.at = out.at.or(row.try_get("claim_now").ok());
                tracing::error!(target: "keel::durable::executor",
                    command_id = unreadable.command_id, instance_id = %unreadable.instance_id,
                    error = %keel_store::StoreError::from(e),
                    "a claimed command's row does not decode; it is released");
                out.unreadable.push(unreadable);
            }
        }
    }
    Ok(out)
}

/// The release code of a command whose claimed row did not decode.
const UNREADABLE_ROW: &str = "UNREADABLE_ROW";

/// Releases the [`Unreadable`] commands of a claim after `delay_secs` (their attempt
/// stays spent: a build that cannot read them dead-letters them in the end, and a
/// newer one that can runs them). A failure is logged; the lease then lapses.
pub(super) async fn release_unreadable(
    conn: &mut sqlx::PgConnection,
    unreadable: &[Unreadable],
    delay_secs: f64,
) {
    for u in unreadable {
        let Some(token) = u.lease_token else { continue };
        if let Err(e) = crate::store::command_release(
            &mut *conn,
            u.instance_id,
            token,
            u.command_id,
            delay_secs,
            UNREADABLE_ROW,
            false,
        )
        .await
        {
            tracing::warn!(target: "keel::durable::executor", command_id = u.command_id,
                error = %e, "release of an unreadable command failed; its lease lapses");
        }
    }
}

/// Logs and counts a command that its claim dead-lettered. The claim also failed its
/// instance (`ATTEMPTS_EXHAUSTED`, retryable) unless it had ended or failed already
/// (migration 0069), so no instance is left without a command that runs it.
pub(super) fn dead_lettered(c: &Claimed) {
    tracing::error!(target: "keel::durable::executor", command_id = c.command_id,
        instance_id = %c.instance_id, kind = %c.kind, attempts = c.attempt, status = %c.status,
        "command dead-lettered (attempts exhausted); its instance is failed ATTEMPTS_EXHAUSTED: retry it to resume");
    m::dead_letter(&c.workflow);
    m::settled(&c.workflow, "dead_letter");
}

/// The transitions to `failed` of the instances whose command a claim dead-lettered.
pub(super) fn dead_letter_transitions(claimed: &[Claimed]) -> Vec<crate::hook::Transition> {
    claimed
        .iter()
        .filter(|c| c.exhausted && c.status == RunStatus::Failed)
        .map(|c| crate::hook::Transition {
            instance_id: c.instance_id,
            workflow: c.workflow.clone(),
            status: RunStatus::Failed,
        })
        .collect()
}

/// Runs the transition hook for the instances the executor loop's claim failed by a
/// dead letter, in a transaction of its own (the loop's claim is one statement; a
/// crash in between reports the change with the instance's next one).
pub(super) async fn report_dead_letters(engine: &Engine, claimed: &[Claimed]) {
    let failed = dead_letter_transitions(claimed);
    if failed.is_empty() {
        return;
    }
    let result = async {
        let mut tx = engine.pool.begin().await?;
        crate::hook::run(&engine.hook, &mut tx, &failed).await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(target: "keel::durable::executor", error = %keel_store::StoreError::from(e),
            "the transition hook of a dead-lettered instance failed");
    }
}

#[cfg(test)]
mod tests {
    use keel_store::testing::TestDatabase;
    use uuid::Uuid;

    use crate::version::ClaimSet;

    /// A claimed command whose instance's stored status this build does not know is
    /// returned as unreadable (not failing its neighbour's claim) and released with its
    /// code; the readable one is claimed.
    #[tokio::test]
    async fn an_unreadable_claimed_row_is_released_and_does_not_fail_the_claim() {
        let db = TestDatabase::create().await.unwrap();
        let pool = db.pool();
        // A newer schema's status (the CHECK of this one refuses it).
        sqlx::query("ALTER TABLE durable_instance DROP CONSTRAINT durable_instance_status_check")
            .execute(pool)
            .await
            .unwrap();
        let mut ids = Vec::new();
        for status in ["pending", "paused"] {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO durable_instance (id, workflow, idempotency_key, input, status)
                 VALUES ($1, 'w', $1::text, '{}', $2)",
            )
            .bind(id)
            .bind(status)
            .execute(pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO durable_command (instance_id, kind, max_attempts) VALUES ($1, 'start', 5)",
            )
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
            ids.push(id);
        }
        let names = ClaimSet {
            names: vec!["w".to_owned()],
            min: vec![1],
            max: vec![1],
        };
        let claim = super::claim(pool, &names, 30.0, 10).await.unwrap();
        assert_eq!(claim.claimed.len(), 1);
        assert_eq!(claim.claimed[0].instance_id, ids[0]);
        assert_eq!(claim.unreadable.len(), 1);
        assert_eq!(claim.unreadable[0].instance_id, ids[1]);
        assert!(claim.at.is_some());
        let mut conn = pool.acquire().await.unwrap();
        super::release_unreadable(&mut conn, &claim.unreadable, 60.0).await;
        let (state, last_error, leased): (String, Option<String>, bool) = sqlx::query_as(
            "SELECT c.state, c.last_error, i.lease_token IS NOT NULL
               FROM durable_command c JOIN durable_instance i ON i.id = c.instance_id
              WHERE c.instance_id = $1",
        )
        .bind(ids[1])
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert_eq!(
            (state.as_str(), last_error.as_deref(), leased),
            ("queued", Some(super::UNREADABLE_ROW), false)
        );
    }
}
