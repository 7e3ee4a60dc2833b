//! End to end: keel-custody's `FireblocksProvider` against `keel-custody-sim` running
//! as a process on a real Anvil. Every outcome is checked on chain as well.

mod auth;
mod harness;
mod help;
mod queue;
mod queue_webhooks;
mod submit;
mod webhooks;
