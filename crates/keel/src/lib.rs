//! # keel (library half of the binary)
//!
//! What the `keel` binary is made of, as a library so its pieces have tests:
//!
//! - [`config`]: `config/default.toml` + a file + `KEEL__SECTION__KEY` overrides into
//!   typed, validated structs; redacted printing.
//! - [`telemetry`]: tracing-subscriber (human on a TTY, JSON otherwise) and the
//!   Prometheus endpoint, both stamped with the deployment id.
//! - [`ops`]: `keel ops list|show|watch|retry|approve|reject`, through the Platform
//!   API (HTTP, an API key), never the database.
//! - [`traces`]: OpenTelemetry trace export (OTLP/HTTP, off by default) with the
//!   deployment identity on the resource, and W3C trace context on API requests.
//! - [`shutdown`]: SIGTERM/SIGINT into a cancellation token.
//! - [`roles`]: what `keel run --role` runs: shard ownership for runner and indexer,
//!   the runner's daily retention job and job-health reporting, and the orderly stop.
//! - [`aa`]: ERC-4337 (`[aa]`, keel-aa) in the roles.
//! - [`signer`]: the signing keys (`[operator.signer]`, `[aa.sponsorSigner]`), one
//!   configuration type for every kind, built once at start into shared handles.
//! - [`services`]: the work of each role; [`chains`]: which chains a process serves
//!   (retried with backoff while unreachable); [`supervise`]: restarts of critical
//!   tasks, or a non-zero exit naming the task.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod aa;
pub mod chains;
pub mod config;
#[cfg(test)]
mod crate_map;
pub mod ops;
pub mod roles;
pub mod services;
pub mod shutdown;
pub mod signer;
pub mod supervise;
pub mod telemetry;
pub mod traces;
