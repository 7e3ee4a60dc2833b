//! keel-kms-sim as a process: the AWS SDK's KMS client against it (protocol, SigV4,
//! key states, restarts), and Keel's AWS KMS signer signing through the transaction
//! queue on a real Anvil with a real PostgreSQL (faults: throttled, KMS-side errors,
//! unreachable, key disabled).

mod protocol;
mod queue;
mod sim;
