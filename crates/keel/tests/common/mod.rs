//! Helpers shared by the binary's process tests.

use std::process::Command;

/// The `keel` binary, with every `KEEL*` variable of the test's environment removed.
pub(crate) fn keel() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KEEL") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
