//! The bundler watchdog: operations left in a non-terminal state too long, counted and
//! logged.

use super::*;

/// Operations older than a threshold in a non-terminal state, per chain and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleCount {
    /// The chain.
    pub chain_id: u64,
    /// `accepted`, `ready` or `bundled`.
    pub state: String,
    /// How many.
    pub count: u64,
}

/// The bundler watchdog (service `aa-watchdog`, one per deployment, e.g. a cluster
/// cron): every `interval` it counts the operations of every chain still `accepted`,
/// `ready` or `bundled` after `older_than`, sets
/// `keel_aa_stale_user_operations{chain_id, state}` and logs a WARN when there are any.
#[derive(Debug)]
pub struct Watchdog {
    db: sqlx::PgPool,
    older_than: std::time::Duration,
    interval: std::time::Duration,
    reported: HashSet<(u64, String)>,
}

impl Watchdog {
    /// A watchdog over `db` reporting operations older than `older_than`, every
    /// `interval`.
    pub fn new(
        db: sqlx::PgPool,
        older_than: std::time::Duration,
        interval: std::time::Duration,
    ) -> Self {
        Self {
            db,
            older_than,
            interval,
            reported: HashSet::new(),
        }
    }

    /// One check: the stale counts (and the gauge set for them; a (chain, state) seen
    /// before and now clear is set to 0).
    ///
    /// # Errors
    /// [`BundlerError::Store`].
    pub async fn check(&mut self) -> Result<Vec<StaleCount>, BundlerError> {
        let secs = i64::try_from(self.older_than.as_secs()).unwrap_or(i64::MAX);
        let rows = store::user_operations_stale(&self.db, secs).await?;
        let counts: Vec<StaleCount> = rows
            .into_iter()
            .map(|(chain, state, count)| StaleCount {
                chain_id: chain.0,
                state: state.as_str().to_owned(),
                count: u64::try_from(count).unwrap_or(0),
            })
            .collect();
        let now: HashSet<(u64, String)> = counts
            .iter()
            .map(|c| (c.chain_id, c.state.clone()))
            .collect();
        for (chain, state) in self.reported.difference(&now) {
            metrics::gauge!("keel_aa_stale_user_operations", "chain_id" => chain.to_string(), "state" => state.clone())
                .set(0.0);
        }
        for c in &counts {
            metrics::gauge!("keel_aa_stale_user_operations", "chain_id" => c.chain_id.to_string(), "state" => c.state.clone())
                .set(c.count as f64);
            tracing::warn!(target: "keel::aa::watchdog", chain_id = c.chain_id, state = %c.state,
                count = c.count, older_than_s = self.older_than.as_secs(),
                "user operations pending longer than the threshold");
        }
        self.reported = now;
        Ok(counts)
    }
}

impl BackgroundService for Watchdog {
    type Error = BundlerError;

    fn name(&self) -> &'static str {
        "aa-watchdog"
    }

    async fn run_once(&mut self) -> Result<Report, BundlerError> {
        let n = self.check().await?.len() as u64;
        Ok(Report::after(n, self.interval))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}
