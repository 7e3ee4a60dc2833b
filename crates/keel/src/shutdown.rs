//! Process shutdown: SIGTERM or SIGINT cancel one token that every task watches.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM or SIGINT (Ctrl-C). A second signal
/// is left to the default handler's successor: the process keeps draining, bounded by
/// the caller's termination period.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = ctrl_c.await;
                        trigger.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => tracing::info!(target: "keel::shutdown", "SIGINT received"),
                _ = term.recv() => tracing::info!(target: "keel::shutdown", "SIGTERM received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        trigger.cancel();
    });
    token
}
