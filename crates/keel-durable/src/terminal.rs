//! The terminal-state notification behind [`crate::Engine::await_terminal`]: one
//! shared `LISTEN` connection per engine, started by the first waiter, fanned out to
//! every waiter through a broadcast channel.
//!
//! The notification is sent by the trigger `durable_instance_terminal_notify`
//! (migration `0021_durable_terminal_notify.sql`) when the status of an instance that a
//! waiter marked `terminal_watched` becomes `completed`, `failed` or `cancelled`,
//! whichever path changed it (a segment settle, an immediate cancel). The payload is the
//! instance id.

use std::sync::OnceLock;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

/// The channel of the terminal-state notification: `pg_notify('keel_durable_terminal',
/// <instance id>)`, sent at the commit that made an instance `completed`, `failed` or
/// `cancelled`, for instances that [`crate::Engine::await_terminal`] has waited on
/// (migration 0021).
pub const TERMINAL_CHANNEL: &str = "keel_durable_terminal";

/// How often a waiter looks at the status while the listener is disconnected.
const POLL_DISCONNECTED: Duration = Duration::from_secs(1);
/// How often a waiter looks anyway while the listener is connected (a connection that
/// fails silently).
const POLL_CONNECTED: Duration = Duration::from_secs(10);
/// Pause before reconnecting a listener that failed.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);
/// Events buffered per waiter; one that falls further behind looks at the status.
const EVENTS: usize = 1024;

/// What the listener tells the waiters.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// This instance became terminal.
    Terminal(Uuid),
    /// The listener (re)connected: notifications may have been missed before.
    Listening,
}

/// The engine's shared listener, started on first use; aborted when the last clone of
/// the engine is dropped.
#[derive(Debug, Default)]
pub(crate) struct TerminalWatch {
    started: OnceLock<Listener>,
}

#[derive(Debug)]
struct Listener {
    events: broadcast::Sender<Event>,
    connected: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Drop for TerminalWatch {
    fn drop(&mut self) {
        if let Some(l) = self.started.get() {
            l.task.abort();
        }
    }
}

impl TerminalWatch {
    /// A subscription to the events, starting the listener when none runs yet. Must be
    /// called inside a Tokio runtime.
    pub(crate) fn subscribe(&self, pool: &PgPool) -> Subscription {
        let l = self.started.get_or_init(|| {
            let (events, _) = broadcast::channel(EVENTS);
            let (connected_tx, connected) = watch::channel(false);
            let task = tokio::spawn(listen(pool.clone(), events.clone(), connected_tx));
            Listener {
                events,
                connected,
                task,
            }
        });
        Subscription {
            events: Some(l.events.subscribe()),
            connected: l.connected.clone(),
        }
    }
}

/// One waiter's view of the listener.
pub(crate) struct Subscription {
    /// `None` once the listener's task has ended (then only polling is left).
    events: Option<broadcast::Receiver<Event>>,
    connected: watch::Receiver<bool>,
}

impl Subscription {
    /// Waits until the status of `instance_id` is worth reading again (its notification,
    /// a listener reconnection, missed events, or the poll interval); false when
    /// `deadline` came first.
    pub(crate) async fn next_look(&mut self, instance_id: Uuid, deadline: Instant) -> bool {
        let poll = if *self.connected.borrow() {
            POLL_CONNECTED
        } else {
            POLL_DISCONNECTED
        };
        let wake = Instant::now() + poll;
        loop {
            if deadline <= Instant::now() {
                return false;
            }
            let Some(events) = self.events.as_mut() else {
                tokio::time::sleep_until(wake.min(deadline)).await;
                return wake < deadline;
            };
            tokio::select! {
                r = events.recv() => match r {
                    Ok(Event::Terminal(id)) if id == instance_id => return true,
                    Ok(Event::Terminal(_)) => {}
                    Ok(Event::Listening) | Err(broadcast::error::RecvError::Lagged(_)) => return true,
                    Err(broadcast::error::RecvError::Closed) => {
                        self.events = None;
                        return true;
                    }
                },
                () = tokio::time::sleep_until(wake) => return true,
                () = tokio::time::sleep_until(deadline) => return false,
            }
        }
    }
}

/// Keeps the `LISTEN` connection; forwards every notification and tells the waiters
/// after every (re)connection.
async fn listen(pool: PgPool, events: broadcast::Sender<Event>, connected: watch::Sender<bool>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(target: "keel::durable::listener", error = %keel_store::StoreError::from(e), "terminal listen connection failed");
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(TERMINAL_CHANNEL).await {
            tracing::warn!(target: "keel::durable::listener", error = %keel_store::StoreError::from(e), "LISTEN failed");
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        }
        connected.send_replace(true);
        // Sent with no waiter subscribed is fine: later waiters read the status first.
        let _ = events.send(Event::Listening);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    if let Ok(id) = n.payload().parse::<Uuid>() {
                        let _ = events.send(Event::Terminal(id));
                    }
                }
                Ok(None) | Err(_) => {
                    tracing::info!(target: "keel::durable::listener", "terminal listen connection lost; reconnecting");
                    connected.send_replace(false);
                    break;
                }
            }
        }
    }
}
