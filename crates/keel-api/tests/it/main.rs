//! Platform API tests against a real PostgreSQL (one database per test), driving the
//! router in-process. No chain: operations stay `running` (the Ledger read tests
//! build their index from a real Anvil chain with the tip ingest). Every response is checked
//! against the OpenAPI document (`doc_check`).

mod bodies;
mod common;
mod contract;
mod doc_check;
mod fuzz_regressions;
mod http_rules;
// Issue 32 §2, §7: re-index route, independent index lag, unhealthy webhook endpoints.
mod index_admin;
mod keys;
mod ledger;
mod lists;
mod openapi_health;
mod proptest_json;
// Per-key and per-organization request rate limits.
mod rate_limits;
mod scopes;
// Platform Status (issue 22).
mod status;
// Webhooks (issue 21).
mod webhooks;
// ERC-4337 user operations (issue 20).
mod user_ops;
