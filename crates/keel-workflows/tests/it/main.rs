//! keel-workflows against a real PostgreSQL (one database per test) and, where a
//! transaction must really settle, a real Anvil. No executors run: operations are
//! accepted and their instances stay pending unless a test moves them.

mod accept;
mod amount;
mod attribution;
mod common;
mod events;
mod lists;
mod store;
mod verdicts;
mod view;
