//! Integration tests of keel-txq against real PostgreSQL and real Anvil, one binary
//! (one module per area).

mod broadcast;
mod commit_signed;
mod crash;
mod faults;
mod funding;
mod progress;
mod queue;
mod requests;
mod settlement;
