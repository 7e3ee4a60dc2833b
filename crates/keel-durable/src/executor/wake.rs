//! What keeps an executor in touch with the others: the LISTEN connection that wakes its
//! loop on every notification ([`super::CHANNEL`]), and the heartbeat of its row in
//! `durable_runner_version` (the versions it can run, see [`crate::version`]).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::CHANNEL;
use crate::metrics as m;
use crate::version::ClaimSet;

/// Keeps this executor's row of `durable_runner_version` fresh (see [`crate::version`]).
pub(super) async fn heartbeat(pool: sqlx::PgPool, runner: Uuid, names: ClaimSet) {
    let span = tracing::info_span!(target: "keel::durable::executor", "runner_heartbeat", %runner);
    let mut failures: u32 = 0;
    loop {
        let pause = match crate::version::runner_heartbeat(&pool, runner, &names)
            .instrument(span.clone())
            .await
        {
            Ok(()) => {
                failures = 0;
                crate::version::RUNNER_HEARTBEAT
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                m::runner_heartbeat_failed();
                tracing::warn!(target: "keel::durable::executor", parent: &span,
                    error = %keel_store::StoreError::from(e), "runner heartbeat failed");
                crate::config::Backoff {
                    base: Duration::from_millis(250),
                    cap: crate::version::RUNNER_HEARTBEAT,
                }
                .delay(failures)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// Keeps a LISTEN connection; wakes the loop on every notification and after every
/// (re)connection (notifications sent while disconnected are lost).
pub(super) async fn listen(pool: sqlx::PgPool, wake: Arc<Notify>, cancel: CancellationToken) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(target: "keel::durable::listener", error = %keel_store::StoreError::from(e), "listen connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                    () = cancel.cancelled() => return,
                }
            }
        };
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!(target: "keel::durable::listener", error = %keel_store::StoreError::from(e), "LISTEN failed");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                () = cancel.cancelled() => return,
            }
        }
        wake.notify_one();
        loop {
            tokio::select! {
                r = listener.try_recv() => match r {
                    Ok(Some(_)) => wake.notify_one(),
                    Ok(None) | Err(_) => {
                        tracing::info!(target: "keel::durable::listener", "listen connection lost; reconnecting");
                        wake.notify_one();
                        break;
                    }
                },
                () = cancel.cancelled() => return,
            }
        }
    }
}
