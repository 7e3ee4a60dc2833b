//! Integration tests of keel-index against real PostgreSQL and Anvil.

mod common;
mod converge;
mod deep_reorg;
mod fencing;
mod follow;
mod heads;
mod history;
mod ledger;
mod measure;
mod projections;
mod reindex;
mod reorg;
mod service;
mod supply;
mod unsettled;
