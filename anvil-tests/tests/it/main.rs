//! Integration tests of the harness and of Keel's contracts on a fresh Anvil, one binary
//! (one module per contract or harness part).

mod asset_factory;
mod asset_token;
mod directory;
mod entry_point;
mod harness;
mod platform;
mod proxy;
