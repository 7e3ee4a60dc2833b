//! Platform API tests against a real PostgreSQL (one database per test), driving the
//! router in-process. No chain: operations stay `running`. Every response is checked
//! against the OpenAPI document (`doc_check`).

mod common;
mod doc_check;
mod fuzz_regressions;
mod http_rules;
mod openapi_health;
mod proptest_json;
// Webhooks (issue 21).
mod webhooks;
