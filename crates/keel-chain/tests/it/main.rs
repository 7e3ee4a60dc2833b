//! Integration tests of keel-chain against real Anvil, one binary (one module per area).

mod heads;
mod upstream;
