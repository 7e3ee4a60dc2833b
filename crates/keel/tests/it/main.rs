//! The `keel` binary's tests, one test binary (issue 34 §7: one link instead of one
//! per file). Most run the binary as processes against a real PostgreSQL and real Anvil
//! nodes; `common` holds what they share (the `keel` command, the stack environment,
//! the full stack of processes, the OpenAPI answer check, the OTLP receiver).
//!
//! Run one module's tests: `cargo nextest run -p keel --test it -E 'test(/^e2e::/)'`.

mod aa;
mod api_keys_cli;
mod chains;
mod common;
mod config;
mod custody;
mod deploy_chart;
mod dev;
mod distributions;
mod e2e;
mod index_cli;
mod kms;
mod ops_cli;
mod org_systems;
mod process;
// Per-API-key and per-organization request rate limits of the api role.
mod rate_limits;
mod retention;
mod traces;
mod webhooks;
