//! Integration tests of keel-txq against real PostgreSQL and real Anvil, one binary
//! (one module per area; `common` holds what several share).

mod broadcast;
mod commit_signed;
mod common;
mod crash;
mod faults;
mod funding;
mod profiles;
mod progress;
mod queue;
mod requests;
mod settlement;
