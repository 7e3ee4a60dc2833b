//! `keel migrate`: applies pending database migrations (run before a release serves),
//! with a progress bar on a terminal's stderr.

use anyhow::Context;
use keel::config::Config;

/// Applies every pending migration; one line on stdout.
pub(super) async fn run(config: &Config) -> anyhow::Result<()> {
    let pool = keel_store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    // A bar on a terminal's stderr (hidden otherwise: stdout stays one line).
    let pending = keel_store::pending_migrations(&pool)
        .await
        .context("reading the applied migrations")?;
    let bar = indicatif::ProgressBar::new(pending.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("migrating {bar:30} {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut started = false;
    keel_store::migrate_each(&pool, |version, description| {
        if started {
            bar.inc(1);
        }
        started = true;
        bar.set_message(format!("{version:04} {description}"));
    })
    .await
    .context("applying migrations")?;
    if started {
        bar.inc(1);
    }
    bar.finish_with_message(format!("{} applied", pending.len()));
    let count = keel_store::MIGRATOR.iter().count();
    tracing::info!(target: "keel::migrate", migrations = count, "database is up to date");
    println!("migrations applied: {count} known, database up to date");
    Ok(())
}
