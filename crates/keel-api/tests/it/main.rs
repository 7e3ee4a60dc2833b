//! Platform API tests against a real PostgreSQL (one database per test), driving the
//! router in-process. No chain: operations stay `running`.

mod common;
mod http_rules;
mod openapi_health;
mod proptest_json;
