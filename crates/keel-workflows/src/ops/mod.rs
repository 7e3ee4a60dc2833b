//! The operations service the Platform API calls: accept an operation idempotently,
//! start its workflow, project its status (state, wait, milestones, result, error),
//! decide approvals, retries and cancels, and read assets, balances and funding
//! requests.
//!
//! - [`accept`]: `create_asset`, `token_operation` and their idempotency;
//! - [`view`]: the operation view and its projection from the stored rows, and the
//!   operation list (keyset `(created_at, id)`, filters by state, kind, asset and
//!   acceptance time; batched reads of statuses, links and queue requests);
//! - [`decide`]: approve / reject, retry, cancel;
//! - [`history`]: an operation's history (the decision log of its workflow instance);
//! - [`read`]: assets (paginated), templates (paginated), balances, funding requests;
//! - [`keys`]: the API key lifecycle (list, create, revoke, rotate) of the caller's
//!   organization;
//! - [`ledger`]: an asset's holders (at a record date), transfers and supply at a block;
//! - [`amount`]: amounts and prices from decimal strings;
//! - [`custody`]: wake-ups of the queue's custody submissions (verified provider webhooks);
//! - [`status`]: Platform Status, every part's persisted health in one read.
//!
//! ## Idempotency
//! Operations are unique by (organization, `Idempotency-Key`). The request is hashed
//! (kind, asset and the normalized body: amounts in base units, addresses checksummed
//! away), so the same key with the same request returns the same operation — in
//! whatever state it is, a failure included — and the same key with another request
//! is [`OpsError::IdempotencyConflict`]. The workflow instance is started with the
//! operation id as its idempotency key after the operation row commits; a repeated
//! request re-issues that start, so a crash between the two loses nothing.

pub mod accept;
pub mod amount;
pub mod custody;
pub mod decide;
pub mod distributions;
pub mod history;
pub mod keys;
pub mod ledger;
pub mod org_systems;
pub mod read;
pub mod reindex;
pub mod snapshots;
pub mod status;
pub mod view;

use crate::error::{OpsError, Result};
use crate::store;
use crate::tenancy::Caller;
use keel_durable::Engine;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Longest `Prefer: wait` / `minBlock` wait the service honours.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The deepest JSON nesting an accepted request may have: every request becomes a
/// workflow input, and the durable engine refuses inputs nested deeper
/// (`keel_durable::payload::MAX_DEPTH`; objects and arrays each count one level).
pub const MAX_INPUT_DEPTH: usize = keel_durable::payload::MAX_DEPTH;

/// Whether `bytes`, read as JSON, nest deeper than `max` levels (objects and arrays
/// each count one; brackets inside strings do not). A byte scan without recursion, so
/// a caller can refuse a deep document before any parser sees it; malformed input is
/// left to the parser. The engine's own check (`keel_durable::payload`).
pub fn input_too_deep(bytes: &[u8], max: usize) -> bool {
    keel_durable::payload::json_depth_exceeds(bytes, max)
}

/// The operations service (no chain access: everything goes through the database and
/// the durable engine; the runner does the work).
#[derive(Debug, Clone)]
pub struct Ops {
    db: PgPool,
    engine: Engine,
    events: Option<crate::events::OperationEvents>,
    /// The chains' nodes (by chain id) the compliance pre-check reads from.
    nodes: std::sync::Arc<std::collections::HashMap<u64, std::sync::Arc<keel_chain::UpstreamPool>>>,
}

/// Why the service is not ready to serve ([`Ops::check_ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// The database does not answer.
    #[error("the database is unreachable")]
    DatabaseUnreachable,
    /// The migrations table cannot be read.
    #[error("migrations are not applied")]
    MigrationsNotApplied,
    /// An embedded migration is not applied (or applied with another checksum).
    #[error("migrations are pending")]
    MigrationsPending,
}

/// A row that does not decode into its typed value (a column out of range).
pub(crate) fn decode_err<E>(_: E) -> OpsError {
    OpsError::Store(keel_store::StoreError::Decode)
}

impl Ops {
    /// A service over `db` that starts workflows through `engine` (which needs no
    /// registered workflows: the runner executes them).
    pub fn new(db: PgPool, engine: Engine) -> Self {
        Self {
            db,
            engine,
            events: None,
            nodes: std::sync::Arc::default(),
        }
    }

    /// The service, reading chain state from `nodes` (one per chain) for the compliance
    /// pre-check of mints and transfers of regulated assets (issue 37 §2). Without a
    /// node for a chain the pre-check is skipped there; the token's on-chain check
    /// stays authoritative either way.
    #[must_use]
    pub fn with_nodes(
        mut self,
        nodes: impl IntoIterator<Item = std::sync::Arc<keel_chain::UpstreamPool>>,
    ) -> Self {
        self.nodes = std::sync::Arc::new(nodes.into_iter().map(|n| (n.chain().get(), n)).collect());
        self
    }

    /// The service, writing `operation.accepted` webhook events with each accepted
    /// operation (in its transaction) and passing `events` to the verdict sinks it
    /// builds (see [`crate::events`]).
    #[must_use]
    pub fn with_events(mut self, events: crate::events::OperationEvents) -> Self {
        self.events = Some(events);
        self
    }

    /// The verdict sink for this service's withdrawals.
    pub(crate) fn verdict_sink(&self) -> crate::VerdictSink {
        let sink = crate::VerdictSink::new(self.engine.clone());
        match &self.events {
            Some(e) => sink.with_events(e.clone()),
            None => sink,
        }
    }

    /// Writes the acceptance events of operation `id` on `conn` (its inserting
    /// transaction), when events are configured.
    pub(crate) async fn emit_accepted(
        &self,
        conn: &mut sqlx::PgConnection,
        organization_id: uuid::Uuid,
        id: uuid::Uuid,
    ) -> Result<()> {
        if let Some(events) = &self.events {
            let ctx = crate::store::OperationEventContext {
                id,
                organization_id,
                webhook_mark: None,
            };
            events.emit(conn, &ctx, None, false).await?;
        }
        Ok(())
    }

    /// Resolves a bearer token ([`crate::tenancy::authenticate`]).
    ///
    /// # Errors
    /// [`OpsError::Unauthenticated`]; [`OpsError::Store`].
    pub async fn authenticate(&self, token: &str) -> Result<Caller> {
        crate::tenancy::authenticate(&self.db, token).await
    }

    /// The operator's view of operation `id`, whatever its organization (for `keel ops`,
    /// which authenticates by database access, not by an API key): the caller context
    /// of the operation's own request.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`].
    pub async fn operator_caller(&self, id: Uuid) -> Result<Caller> {
        store::operation_caller(&self.db, id)
            .await?
            .map(Caller::from)
            .ok_or(OpsError::NotFound { what: "operation" })
    }

    /// Whether the service can serve: the database answers and every embedded
    /// migration is applied (same version and checksum). Unbounded in time: the caller
    /// sets a timeout.
    ///
    /// # Errors
    /// The [`NotReady`] reason.
    pub async fn check_ready(&self) -> std::result::Result<(), NotReady> {
        store::database_ping(&self.db)
            .await
            .map_err(|_| NotReady::DatabaseUnreachable)?;
        let all_applied = keel_store::migrations_applied(&self.db)
            .await
            .map_err(|_| NotReady::MigrationsNotApplied)?;
        if all_applied {
            Ok(())
        } else {
            Err(NotReady::MigrationsPending)
        }
    }
}
